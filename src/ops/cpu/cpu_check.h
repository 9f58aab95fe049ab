// API-boundary validation for CpuBackend: the shared checkers of ops/op_check.h bound to the host
// device, plus cu_seqlens checked by content (they live on the host here).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/op_check.h"

namespace qt::cpu {

inline void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  ops::check_tensor(op, name, t, dtype, expected, DeviceKind::CPU);
}
inline bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  return ops::check_optional(op, name, t, dtype, expected, DeviceKind::CPU);
}
inline void check_storage(const char* op, const char* name, const Tensor& t, DType dtype) {
  ops::check_storage(op, name, t, dtype, DeviceKind::CPU);
}
using ops::dim_of;
// cu_seqlens i32 [num_seqs + 1] on the host, 0 = cu[0] <= cu[1] <= ... <= cu[num_seqs] = T, and
// total_tokens == T, max_seqlen >= the longest sequence. Returns the host pointer.
const int32_t* check_seqs(const char* op, const SeqInfo& seqs, int64_t T);

}  // namespace qt::cpu
