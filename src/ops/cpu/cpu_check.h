// API-boundary validation for CpuBackend: every failure names the op and the tensor, e.g.
// "gdn_forward: qkv is f32[10, 96], expected f32[10, 128]".
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/backend.h"

namespace qt::cpu {

// t must be a contiguous CPU tensor with data, of dtype, shaped like `expected`. Token-major
// tensors may split or merge their trailing dims: [T, H, D] matches an expected [T, H*D] (the
// first dim and the element count must agree); a 1-D expected shape only needs the count.
void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected);
// Same for an optional tensor: returns false (and checks nothing) when t.data == nullptr.
bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected);
// A contiguous CPU tensor with data (any shape), of dtype.
void check_storage(const char* op, const char* name, const Tensor& t, DType dtype);
// The size of dim d of t, with a message naming op/name if t has fewer dims (d >= 0).
int64_t dim_of(const char* op, const char* name, const Tensor& t, int d);
// cu_seqlens i32 [num_seqs + 1] on the host, 0 = cu[0] <= cu[1] <= ... <= cu[num_seqs] = T, and
// total_tokens == T, max_seqlen >= the longest sequence. Returns the host pointer.
const int32_t* check_seqs(const char* op, const SeqInfo& seqs, int64_t T);

}  // namespace qt::cpu
