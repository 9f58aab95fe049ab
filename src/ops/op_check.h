// API-boundary validation shared by every Backend: each failure names the op and the tensor, e.g.
// "gdn_forward: qkv is f32[10, 96], expected f32[10, 128]". Backends pass the device they own.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/tensor.h"
#include "ops/backend.h"

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


// ---- per-op checks shared by the backends ------------------------------------------------------
// LoRA (lora_forward / lora_backward): A [r, K], B [N, r], x [T, K], t [T, r], y or dy [T, N], all
// of dtype `act` on `dev`, a finite scale. Returns {T, N, K, r}.
struct LoraShape {
  int64_t T, N, K, r;
};
LoraShape check_lora(const char* op, const Tensor& y_or_dy, const Tensor& t, const Tensor& x, const LoraArgs& lora,
                     DType act, DeviceKind dev);
// dropout: out and x alike (dtype act), seed i32 [2] on dev, p in [0, 1). Returns the element count.
int64_t check_dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, DType act, DeviceKind dev);
// What an op's entry point checks in every backend: `act` is the backend's activation dtype (f32 on
// the CPU, bf16 on CUDA), `dev` its device. A backend's own rules (kernel limits, weight-gradient
// dtypes, cu_seqlens) stay with it. The token-major ones return T.
struct NormDims {
  int64_t rows, cols;
};
// A row norm: w [cols] and x [..., cols] of `act`, every tensor of `like_x` shaped like x, then
// rstd f32 [rows].
NormDims check_norm(const char* op, const Tensor& w, const Tensor& x,
                    std::initializer_list<std::pair<const char*, const Tensor*>> like_x, const Tensor& rstd, DType act,
                    DeviceKind dev);
struct LinearDims {
  int64_t T, N, K;
};
// y = x w^T: w [N, K], x [T, K] and `out` [T, N] (y in the forward, dy in the backward).
LinearDims check_linear(const char* op, const Tensor& w, const Tensor& x, const char* out_name, const Tensor& out,
                        DType act, DeviceKind dev);
// quantize_fp8: q F8E4M3 shaped like x (of `act`), q_t F8E4M3 [C, R] for a 2-D x [R, C] (each
// optional, not both), scale_inv f32 [1], amax optional f32 [1]. Returns numel(x).
int64_t check_quantize_fp8(const char* op, const Tensor& q, const Tensor& q_t, const Tensor& scale_inv,
                           const Tensor& x, const Tensor& amax, DType act, DeviceKind dev);
// An optional amax output (f32 [1]) named `name`; whether it is given.
bool check_amax(const char* op, const char* name, const Tensor& amax, DeviceKind dev);
// linear_fp8: wq [N, K], xq [T, K] F8E4M3, the scales f32 [1], y [T, N] (its dtype is the
// backend's to check); K a multiple of 16 and N of 8 (the FP8 GEMM's operand layouts).
LinearDims check_linear_fp8(const char* op, const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv,
                            const Tensor& wq, const Tensor& w_scale_inv, DeviceKind dev);
struct HeadDims {
  int64_t T, V, H;
};
// linear_cross_entropy_fp8: the codes' shapes and dtypes (F8E4M3), the scales f32 [1] and 16-byte
// aligned, targets i32 [T] in [0, V) or -100 (checked where the backend can read them), V and H
// multiples of 16, loss_sum f64 [1].
HeadDims check_fp8_head(const char* op, const Tensor& loss_sum, const Fp8HeadCodes& head, const Tensor& targets,
                        DeviceKind dev);
void check_attn_dims(const char* op, const AttnDims& d);
void check_gdn_dims(const char* op, const GdnDims& d);
// Elementwise ops: every tensor shaped like the first, all of `dtype`.
void check_same_shape(const char* op, DType dtype, DeviceKind dev,
                      std::initializer_list<std::pair<const char*, const Tensor*>> tensors);
int64_t check_attn_prep_forward(const char* op, const AttnDims& d, const Tensor& q, const Tensor& k,
                                const Tensor& gate, const Tensor& q_rstd, const Tensor& k_rstd, const Tensor& qg,
                                const Tensor& kr, const Tensor& q_norm_w, const Tensor& k_norm_w,
                                const Tensor& positions, DType act, DeviceKind dev);
// The norm weights' gradients are not checked here (their dtype is the backend's choice).
int64_t check_attn_prep_backward(const char* op, const AttnDims& d, const Tensor& dqg, const Tensor& dkr,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dgate, const Tensor& qg,
                                 const Tensor& kr, const Tensor& q_norm_w, const Tensor& k_norm_w,
                                 const Tensor& q_rstd, const Tensor& k_rstd, const Tensor& positions, DType act,
                                 DeviceKind dev);
int64_t check_attention_forward(const char* op, const AttnDims& d, const Tensor& o, const Tensor& lse,
                                const Tensor& q, const Tensor& k, const Tensor& v, DType act, DeviceKind dev);
int64_t check_attention_backward(const char* op, const AttnDims& d, const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv, const Tensor& d_o, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& o, const Tensor& lse, DType act, DeviceKind dev);
int64_t check_gdn_forward(const char* op, const GdnDims& d, const Tensor& o, const Tensor& qkv, const Tensor& g,
                          const Tensor& beta, DType act, DeviceKind dev);
int64_t check_gdn_backward(const char* op, const GdnDims& d, const Tensor& dqkv, const Tensor& dg,
                           const Tensor& dbeta, const Tensor& d_o, const Tensor& qkv, const Tensor& g,
                           const Tensor& beta, DType act, DeviceKind dev);
// The gates' [T, H] inputs and outputs and the [H] parameters (a_log, dt_bias: act dtype); the
// parameters' gradients are not checked here. Returns {T, H}.
std::pair<int64_t, int64_t> check_gdn_gates_forward(const char* op, const Tensor& beta, const Tensor& g,
                                                    const Tensor& b, const Tensor& a, const Tensor& a_log,
                                                    const Tensor& dt_bias, DType act, DeviceKind dev);
std::pair<int64_t, int64_t> check_gdn_gates_backward(const char* op, const Tensor& db, const Tensor& da,
                                                     const Tensor& dbeta, const Tensor& dg, const Tensor& b,
                                                     const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                                                     DType act, DeviceKind dev);

}  // namespace qt::ops
