#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/bf16.h"

namespace qt {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(void* ptr, DType t, const Shape& s, Device dev) : data(ptr), dtype(t), device(dev) {
  QT_CHECK(s.size() <= static_cast<size_t>(kMaxDims), "tensor rank ", s.size(), " exceeds ", kMaxDims);
  ndim = static_cast<int>(s.size());
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    QT_CHECK(s[static_cast<size_t>(d)] >= 0, "negative dimension in shape ", shape_str(s));
    shape[static_cast<size_t>(d)] = s[static_cast<size_t>(d)];
    strides[static_cast<size_t>(d)] = stride;
    stride *= s[static_cast<size_t>(d)];
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[static_cast<size_t>(d)];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[static_cast<size_t>(d)] != 1 && strides[static_cast<size_t>(d)] != stride) return false;
    stride *= shape[static_cast<size_t>(d)];
  }
  return true;
}

std::string Tensor::describe() const {
  std::string name = dtype_name(dtype);
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name + shape_str(shape_vec());
}

Tensor Tensor::view(const Shape& s) const {
  QT_CHECK(is_contiguous(), "view of a non-contiguous tensor ", describe());
  QT_CHECK(shape_numel(s) == numel(), "cannot view ", describe(), " as ", shape_str(s));
  return Tensor(data, dtype, s, device);
}

void HostBuffer::Free::operator()(void* p) const { std::free(p); }

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  QT_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  ptr_.reset(p);
}

HostTensor::HostTensor(DType dtype, const Shape& s)
    : buffer(static_cast<size_t>(shape_numel(s)) * dtype_size(dtype)), t(buffer.data(), dtype, s) {}

float tensor_get_f32(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16*>(t.data)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F64: return static_cast<float>(static_cast<const double*>(t.data)[i]);
    default: QT_FAIL("tensor ", t.describe(), " is not a floating-point tensor");
  }
}

std::vector<float> tensor_to_f32(const Tensor& t) {
  QT_CHECK(t.device.kind == DeviceKind::CPU && t.is_contiguous(), "tensor_to_f32 needs a contiguous CPU tensor");
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = tensor_get_f32(t, i);
  }
  return out;
}

void tensor_from_f32(const Tensor& t, const float* src) {
  QT_CHECK(t.device.kind == DeviceKind::CPU && t.is_contiguous(), "tensor_from_f32 needs a contiguous CPU tensor");
  int64_t n = t.numel();
  switch (t.dtype) {
    case DType::F32: std::memcpy(t.data, src, static_cast<size_t>(n) * 4); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) static_cast<bf16*>(t.data)[i] = float_to_bf16(src[i]); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(t.data)[i] = float_to_f16(src[i]); break;
    case DType::F64: for (int64_t i = 0; i < n; ++i) static_cast<double*>(t.data)[i] = src[i]; break;
    default: QT_FAIL("tensor ", t.describe(), " is not a floating-point tensor");
  }
}

}  // namespace qt
