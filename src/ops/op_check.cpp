#include "ops/op_check.h"

#include <cctype>
#include <string>

namespace qt::ops {
namespace {

std::string lower_name(DType dtype) {
  std::string s = dtype_name(dtype);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool shape_matches(const Tensor& t, const Shape& expected) {
  if (t.shape_vec() == expected) return true;
  if (t.numel() != shape_numel(expected)) return false;
  if (expected.size() <= 1) return true;
  return t.ndim >= 1 && t.shape[0] == expected[0];
}

}  // namespace

void check_storage(const char* op, const char* name, const Tensor& t, DType dtype, DeviceKind kind) {
  QT_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " is missing (data is null)");
  QT_CHECK(t.device.kind == kind, op, ": ", name, " ", t.describe(), " is not on the ",
           kind == DeviceKind::CPU ? "CPU" : "CUDA device");
  QT_CHECK(t.dtype == dtype, op, ": ", name, " is ", t.describe(), ", expected dtype ", lower_name(dtype));
  QT_CHECK(t.is_contiguous(), op, ": ", name, " ", t.describe(), " is not contiguous");
}

void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected,
                  DeviceKind kind) {
  check_storage(op, name, t, dtype, kind);
  QT_CHECK(shape_matches(t, expected), op, ": ", name, " is ", t.describe(), ", expected ",
           Tensor(nullptr, dtype, expected).describe());
}

bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected,
                    DeviceKind kind) {
  if (t.data == nullptr) return false;
  check_tensor(op, name, t, dtype, expected, kind);
  return true;
}

int64_t dim_of(const char* op, const char* name, const Tensor& t, int d) {
  QT_CHECK(t.ndim > d, op, ": ", name, " is ", t.describe(), ", expected at least ", d + 1, " dims");
  return t.shape[static_cast<size_t>(d)];
}

}  // namespace qt::ops
