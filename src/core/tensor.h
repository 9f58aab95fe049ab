// Tensor: a non-owning view (pointer, dtype, shape, strides in elements, device). Ownership lives
// in arenas or HostBuffer; ops take views. Shapes are small, so a fixed array avoids allocation.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace qt {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

constexpr int kMaxDims = 6;
using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements
  Device device;

  Tensor() = default;
  // Contiguous (row-major) view.
  Tensor(void* ptr, DType t, const Shape& s, Device dev = Device::cpu());

  int64_t size(int d) const { return shape[static_cast<size_t>(d < 0 ? d + ndim : d)]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  Shape shape_vec() const { return Shape(shape.begin(), shape.begin() + ndim); }
  std::string describe() const;  // "bf16[1024, 2048]"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // Same storage, new contiguous shape with the same element count.
  Tensor view(const Shape& s) const;
};

// Owning, 64-byte aligned host memory for tensors that are not in an arena (tests, CPU tools).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  void* data() const { return ptr_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t size_ = 0;
};

// A tensor that owns its host storage.
struct HostTensor {
  HostBuffer buffer;
  Tensor t;
  HostTensor() = default;
  HostTensor(DType dtype, const Shape& s);
};

// Element access for CPU tensors of any float dtype, as float.
float tensor_get_f32(const Tensor& t, int64_t flat_index);
// Copy any float tensor (F32/BF16/F16/F64) into a contiguous float vector.
std::vector<float> tensor_to_f32(const Tensor& t);
// Fill a contiguous CPU tensor of a float dtype from floats (rounded to its dtype).
void tensor_from_f32(const Tensor& t, const float* src);

}  // namespace qt
