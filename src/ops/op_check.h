// API-boundary validation shared by every Backend: each failure names the op and the tensor, e.g.
// "gdn_forward: qkv is f32[10, 96], expected f32[10, 128]". Backends pass the device they own.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace qt::ops {

// A contiguous tensor with data (any shape), of dtype, on a device of `kind`.
void check_storage(const char* op, const char* name, const Tensor& t, DType dtype, DeviceKind kind);
// Also shaped like `expected`. Token-major tensors may split or merge their trailing dims:
// [T, H, D] matches an expected [T, H*D] (first dim and element count agree); a 1-D expected
// shape only needs the element count.
void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected,
                  DeviceKind kind);
// Same for an optional tensor: returns false (and checks nothing) when t.data == nullptr.
bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected,
                    DeviceKind kind);
// The size of dim d of t, with a message naming op/name if t has fewer dims (d >= 0).
int64_t dim_of(const char* op, const char* name, const Tensor& t, int d);

}  // namespace qt::ops
