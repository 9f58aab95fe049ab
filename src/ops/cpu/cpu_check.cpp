#include "ops/cpu/cpu_check.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace qt::cpu {
namespace {

std::string expected_str(DType dtype, const Shape& s) {
  Tensor probe(nullptr, dtype, s);
  return probe.describe();
}

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

void check_storage(const char* op, const char* name, const Tensor& t, DType dtype) {
  QT_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " is missing (data is null)");
  QT_CHECK(t.device.kind == DeviceKind::CPU, op, ": ", name, " is not on the CPU");
  QT_CHECK(t.dtype == dtype, op, ": ", name, " is ", t.describe(), ", expected dtype ", lower_name(dtype));
  QT_CHECK(t.is_contiguous(), op, ": ", name, " ", t.describe(), " is not contiguous");
}

void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  check_storage(op, name, t, dtype);
  QT_CHECK(shape_matches(t, expected), op, ": ", name, " is ", t.describe(), ", expected ",
           expected_str(dtype, expected));
}

bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  if (t.data == nullptr) return false;
  check_tensor(op, name, t, dtype, expected);
  return true;
}

int64_t dim_of(const char* op, const char* name, const Tensor& t, int d) {
  QT_CHECK(t.ndim > d, op, ": ", name, " is ", t.describe(), ", expected at least ", d + 1, " dims");
  return t.shape[static_cast<size_t>(d)];
}

const int32_t* check_seqs(const char* op, const SeqInfo& seqs, int64_t T) {
  QT_CHECK(seqs.num_seqs >= 1, op, ": seqs.num_seqs is ", seqs.num_seqs, ", expected >= 1");
  check_tensor(op, "seqs.cu_seqlens", seqs.cu_seqlens, DType::I32, {seqs.num_seqs + 1});
  const int32_t* cu = seqs.cu_seqlens.ptr<int32_t>();
  QT_CHECK(cu[0] == 0, op, ": seqs.cu_seqlens[0] is ", cu[0], ", expected 0");
  int64_t longest = 0;
  for (int s = 0; s < seqs.num_seqs; ++s) {
    QT_CHECK(cu[s + 1] >= cu[s], op, ": seqs.cu_seqlens decreases at index ", s + 1, " (", cu[s], " -> ",
             cu[s + 1], ")");
    longest = std::max<int64_t>(longest, cu[s + 1] - cu[s]);
  }
  QT_CHECK(cu[seqs.num_seqs] == T, op, ": seqs.cu_seqlens ends at ", cu[seqs.num_seqs], ", expected T = ", T);
  QT_CHECK(seqs.total_tokens == T, op, ": seqs.total_tokens is ", seqs.total_tokens, ", expected T = ", T);
  QT_CHECK(seqs.max_seqlen >= longest, op, ": seqs.max_seqlen is ", seqs.max_seqlen,
           ", less than the longest sequence (", longest, ")");
  return cu;
}

}  // namespace qt::cpu
