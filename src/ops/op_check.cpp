#include "ops/op_check.h"

#include <cctype>
#include <cstdint>
#include <cmath>
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

// ---- per-op checks ----------------------------------------------------------------------------

NormDims check_norm(const char* op, const Tensor& w, const Tensor& x,
                    std::initializer_list<std::pair<const char*, const Tensor*>> like_x, const Tensor& rstd, DType act,
                    DeviceKind dev) {
  const int64_t cols = dim_of(op, "w", w, 0);
  check_tensor(op, "w", w, act, {cols}, dev);
  check_storage(op, "x", x, act, dev);
  QT_CHECK(cols > 0 && x.ndim >= 1 && x.shape[static_cast<size_t>(x.ndim - 1)] == cols, op, ": x is ", x.describe(),
           ", expected last dim ", cols, " (from w)");
  const Shape s = x.shape_vec();
  for (const auto& [name, t] : like_x) check_tensor(op, name, *t, act, s, dev);
  const int64_t rows = x.numel() / cols;
  check_tensor(op, "rstd", rstd, DType::F32, {rows}, dev);
  return {rows, cols};
}

LinearDims check_linear(const char* op, const Tensor& w, const Tensor& x, const char* out_name, const Tensor& out,
                        DType act, DeviceKind dev) {
  QT_CHECK(w.ndim == 2, op, ": w is ", w.describe(), ", expected 2 dims [N, K]");
  const int64_t N = w.size(0), K = w.size(1), T = dim_of(op, "x", x, 0);
  check_tensor(op, "w", w, act, {N, K}, dev);
  check_tensor(op, "x", x, act, {T, K}, dev);
  check_tensor(op, out_name, out, act, {T, N}, dev);
  return {T, N, K};
}

bool check_amax(const char* op, const char* name, const Tensor& amax, DeviceKind dev) {
  if (amax.data == nullptr) return false;
  check_tensor(op, name, amax, DType::F32, {1}, dev);
  return true;
}

int64_t check_quantize_fp8(const char* op, const Tensor& q, const Tensor& q_t, const Tensor& scale_inv,
                           const Tensor& x, const Tensor& amax, DType act, DeviceKind dev) {
  check_amax(op, "amax", amax, dev);
  check_storage(op, "x", x, act, dev);
  QT_CHECK(q.data != nullptr || q_t.data != nullptr || x.numel() == 0, op, ": neither q nor q_t given");
  if (q.data != nullptr) check_tensor(op, "q", q, DType::F8E4M3, x.shape_vec(), dev);
  if (q_t.data != nullptr) {
    QT_CHECK(x.ndim == 2, op, ": q_t needs a 2-D x, got ", x.describe());
    // q_t's rows may be padded up to the next multiple of 16 (zero codes: the wgrad GEMM's inner dim).
    const int64_t R = x.size(0), Rp = q_t.ndim == 2 ? q_t.size(1) : -1;
    check_tensor(op, "q_t", q_t, DType::F8E4M3, {x.size(1), Rp >= R && Rp <= (R + 15) / 16 * 16 ? Rp : R}, dev);
  }
  check_tensor(op, "scale_inv", scale_inv, DType::F32, {1}, dev);
  return x.numel();
}

LinearDims check_linear_fp8(const char* op, const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv,
                            const Tensor& wq, const Tensor& w_scale_inv, DeviceKind dev) {
  QT_CHECK(wq.ndim == 2, op, ": wq is ", wq.describe(), ", expected 2 dims [N, K]");
  const int64_t N = wq.size(0), K = wq.size(1), T = dim_of(op, "xq", xq, 0);
  check_tensor(op, "wq", wq, DType::F8E4M3, {N, K}, dev);
  check_tensor(op, "xq", xq, DType::F8E4M3, {T, K}, dev);
  check_tensor(op, "x_scale_inv", x_scale_inv, DType::F32, {1}, dev);
  check_tensor(op, "w_scale_inv", w_scale_inv, DType::F32, {1}, dev);
  // cuBLASLt answers NOT_SUPPORTED for scale pointers that are only 4-byte aligned.
  for (const Tensor* s : {&x_scale_inv, &w_scale_inv})
    QT_CHECK(reinterpret_cast<uintptr_t>(s->data) % 16 == 0, op, ": ", s == &x_scale_inv ? "x" : "w",
             "_scale_inv must be 16-byte aligned (an FP8 GEMM scale pointer)");
  check_storage(op, "y", y, y.dtype, dev);
  QT_CHECK(y.ndim == 2 && y.size(0) == T && y.size(1) == N, op, ": y is ", y.describe(), ", expected [", T, ", ", N,
           "]");
  QT_CHECK(K % 16 == 0 && N % 8 == 0, op, ": wq is ", wq.describe(),
           ": the FP8 GEMM needs K (in features) a multiple of 16 and N (out features) a multiple of 8");
  return {T, N, K};
}

HeadDims check_fp8_head(const char* op, const Tensor& loss_sum, const Fp8HeadCodes& head, const Tensor& targets,
                        DeviceKind dev) {
  QT_CHECK(head.wq.ndim == 2, op, ": wq is ", head.wq.describe(), ", expected 2 dims [V, H]");
  const int64_t V = head.wq.size(0), H = head.wq.size(1), T = dim_of(op, "hq", head.hq, 0);
  QT_CHECK(V % 16 == 0 && H % 16 == 0, op, ": wq is ", head.wq.describe(),
           ": the FP8 GEMMs need V and H multiples of 16");
  constexpr DType F8 = DType::F8E4M3;
  check_tensor(op, "wq", head.wq, F8, {V, H}, dev);
  check_tensor(op, "wq_t", head.wq_t, F8, {H, V}, dev);
  check_tensor(op, "hq", head.hq, F8, {T, H}, dev);
  check_tensor(op, "hq_t", head.hq_t, F8, {H, (T + 15) / 16 * 16}, dev);
  for (const auto& [name, s] : {std::pair<const char*, const Tensor*>{"h_scale_inv", &head.h_scale_inv},
                                {"w_scale_inv", &head.w_scale_inv}}) {
    check_tensor(op, name, *s, DType::F32, {1}, dev);
    QT_CHECK(reinterpret_cast<uintptr_t>(s->data) % 16 == 0, op, ": ", name,
             " must be 16-byte aligned (an FP8 GEMM scale pointer)");
  }
  check_tensor(op, "targets", targets, DType::I32, {T}, dev);
  check_tensor(op, "loss_sum", loss_sum, DType::F64, {1}, dev);
  return {T, V, H};
}

void check_attn_dims(const char* op, const AttnDims& d) {
  QT_CHECK(d.num_q_heads > 0 && d.num_kv_heads > 0 && d.head_dim > 0, op, ": dims must be positive (Hq ",
           d.num_q_heads, ", Hkv ", d.num_kv_heads, ", D ", d.head_dim, ")");
  QT_CHECK(d.num_q_heads % d.num_kv_heads == 0, op, ": num_q_heads ", d.num_q_heads,
           " is not a multiple of num_kv_heads ", d.num_kv_heads);
  QT_CHECK(d.rotary_dim >= 0 && d.rotary_dim <= d.head_dim && d.rotary_dim % 2 == 0, op, ": rotary_dim ",
           d.rotary_dim, " must be even and in [0, head_dim = ", d.head_dim, "]");
}

void check_gdn_dims(const char* op, const GdnDims& d) {
  QT_CHECK(d.num_k_heads > 0 && d.num_v_heads > 0 && d.k_head_dim > 0 && d.v_head_dim > 0, op,
           ": dims must be positive (Hk ", d.num_k_heads, ", Hv ", d.num_v_heads, ", dk ", d.k_head_dim, ", dv ",
           d.v_head_dim, ")");
  QT_CHECK(d.num_v_heads % d.num_k_heads == 0, op, ": num_v_heads ", d.num_v_heads,
           " is not a multiple of num_k_heads ", d.num_k_heads);
}

void check_same_shape(const char* op, DType dtype, DeviceKind dev,
                      std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  const auto& first = *tensors.begin();
  check_storage(op, first.first, *first.second, dtype, dev);
  const Shape s = first.second->shape_vec();
  for (auto it = tensors.begin() + 1; it != tensors.end(); ++it)
    check_tensor(op, it->first, *it->second, dtype, s, dev);
}

namespace {
// attn_prep's inputs common to both directions. Returns T.
int64_t check_attn_prep_inputs(const char* op, const AttnDims& d, const Tensor& qg, const Tensor& kr,
                               const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& q_rstd,
                               const Tensor& k_rstd, const Tensor& positions, DType act, DeviceKind dev) {
  check_attn_dims(op, d);
  const int64_t Hq = d.num_q_heads, Hkv = d.num_kv_heads, D = d.head_dim;
  const int64_t T = dim_of(op, "qg", qg, 0);
  check_tensor(op, "qg", qg, act, {T, Hq * 2 * D}, dev);
  check_tensor(op, "kr", kr, act, {T, Hkv * D}, dev);
  check_tensor(op, "q_norm_w", q_norm_w, act, {D}, dev);
  check_tensor(op, "k_norm_w", k_norm_w, act, {D}, dev);
  check_tensor(op, "q_rstd", q_rstd, DType::F32, {T * Hq}, dev);
  check_tensor(op, "k_rstd", k_rstd, DType::F32, {T * Hkv}, dev);
  check_tensor(op, "positions", positions, DType::I32, {T}, dev);
  return T;
}
// q [T, Hq, D], k [T, Hkv, D], gate [T, Hq * D] (or their gradients, under the given names).
void check_attn_prep_heads(const char* op, const AttnDims& d, int64_t T, const char* qn, const Tensor& q,
                           const char* kn, const Tensor& k, const char* gn, const Tensor& gate, DType act,
                           DeviceKind dev) {
  const int64_t Hq = d.num_q_heads, Hkv = d.num_kv_heads, D = d.head_dim;
  check_tensor(op, qn, q, act, {T, Hq, D}, dev);
  check_tensor(op, kn, k, act, {T, Hkv, D}, dev);
  check_tensor(op, gn, gate, act, {T, Hq * D}, dev);
}
}  // namespace

int64_t check_attn_prep_forward(const char* op, const AttnDims& d, const Tensor& q, const Tensor& k,
                                const Tensor& gate, const Tensor& q_rstd, const Tensor& k_rstd, const Tensor& qg,
                                const Tensor& kr, const Tensor& q_norm_w, const Tensor& k_norm_w,
                                const Tensor& positions, DType act, DeviceKind dev) {
  const int64_t T = check_attn_prep_inputs(op, d, qg, kr, q_norm_w, k_norm_w, q_rstd, k_rstd, positions, act, dev);
  check_attn_prep_heads(op, d, T, "q", q, "k", k, "gate", gate, act, dev);
  return T;
}

int64_t check_attn_prep_backward(const char* op, const AttnDims& d, const Tensor& dqg, const Tensor& dkr,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dgate, const Tensor& qg,
                                 const Tensor& kr, const Tensor& q_norm_w, const Tensor& k_norm_w,
                                 const Tensor& q_rstd, const Tensor& k_rstd, const Tensor& positions, DType act,
                                 DeviceKind dev) {
  const int64_t T = check_attn_prep_inputs(op, d, qg, kr, q_norm_w, k_norm_w, q_rstd, k_rstd, positions, act, dev);
  check_attn_prep_heads(op, d, T, "dq", dq, "dk", dk, "dgate", dgate, act, dev);
  check_tensor(op, "dqg", dqg, act, qg.shape_vec(), dev);
  check_tensor(op, "dkr", dkr, act, kr.shape_vec(), dev);
  return T;
}

int64_t check_attention_forward(const char* op, const AttnDims& d, const Tensor& o, const Tensor& lse,
                                const Tensor& q, const Tensor& k, const Tensor& v, DType act, DeviceKind dev) {
  check_attn_dims(op, d);
  const int64_t Hq = d.num_q_heads, Hkv = d.num_kv_heads, D = d.head_dim;
  const int64_t T = dim_of(op, "q", q, 0);
  check_tensor(op, "q", q, act, {T, Hq, D}, dev);
  check_tensor(op, "k", k, act, {T, Hkv, D}, dev);
  check_tensor(op, "v", v, act, {T, Hkv, D}, dev);
  check_tensor(op, "o", o, act, {T, Hq, D}, dev);
  check_tensor(op, "lse", lse, DType::F32, {Hq, T}, dev);
  return T;
}

int64_t check_attention_backward(const char* op, const AttnDims& d, const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv, const Tensor& d_o, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& o, const Tensor& lse, DType act, DeviceKind dev) {
  const int64_t T = check_attention_forward(op, d, o, lse, q, k, v, act, dev);
  check_tensor(op, "d_o", d_o, act, o.shape_vec(), dev);
  check_tensor(op, "dq", dq, act, q.shape_vec(), dev);
  check_tensor(op, "dk", dk, act, k.shape_vec(), dev);
  check_tensor(op, "dv", dv, act, v.shape_vec(), dev);
  return T;
}

namespace {
// The gated delta rule's inputs. Returns T.
int64_t check_gdn_inputs(const char* op, const GdnDims& d, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                         DType act, DeviceKind dev) {
  check_gdn_dims(op, d);
  const int64_t T = dim_of(op, "qkv", qkv, 0);
  check_tensor(op, "qkv", qkv, act, {T, d.conv_dim()}, dev);
  check_tensor(op, "g", g, DType::F32, {T, d.num_v_heads}, dev);
  check_tensor(op, "beta", beta, DType::F32, {T, d.num_v_heads}, dev);
  return T;
}
}  // namespace

int64_t check_gdn_forward(const char* op, const GdnDims& d, const Tensor& o, const Tensor& qkv, const Tensor& g,
                          const Tensor& beta, DType act, DeviceKind dev) {
  const int64_t T = check_gdn_inputs(op, d, qkv, g, beta, act, dev);
  check_tensor(op, "o", o, act, {T, d.num_v_heads, d.v_head_dim}, dev);
  return T;
}

int64_t check_gdn_backward(const char* op, const GdnDims& d, const Tensor& dqkv, const Tensor& dg,
                           const Tensor& dbeta, const Tensor& d_o, const Tensor& qkv, const Tensor& g,
                           const Tensor& beta, DType act, DeviceKind dev) {
  const int64_t T = check_gdn_inputs(op, d, qkv, g, beta, act, dev);
  check_tensor(op, "d_o", d_o, act, {T, d.num_v_heads, d.v_head_dim}, dev);
  check_tensor(op, "dqkv", dqkv, act, qkv.shape_vec(), dev);
  check_tensor(op, "dg", dg, DType::F32, g.shape_vec(), dev);
  check_tensor(op, "dbeta", dbeta, DType::F32, beta.shape_vec(), dev);
  return T;
}

namespace {
// The gates' [T, H] projections and [H] parameters. Returns {T, H}.
std::pair<int64_t, int64_t> check_gates_inputs(const char* op, const Tensor& b, const Tensor& a, const Tensor& a_log,
                                               const Tensor& dt_bias, DType act, DeviceKind dev) {
  const int64_t H = dim_of(op, "a_log", a_log, 0), T = dim_of(op, "b", b, 0);
  check_tensor(op, "a_log", a_log, act, {H}, dev);
  check_tensor(op, "dt_bias", dt_bias, act, {H}, dev);
  check_tensor(op, "b", b, act, {T, H}, dev);
  check_tensor(op, "a", a, act, {T, H}, dev);
  return {T, H};
}
}  // namespace

std::pair<int64_t, int64_t> check_gdn_gates_forward(const char* op, const Tensor& beta, const Tensor& g,
                                                    const Tensor& b, const Tensor& a, const Tensor& a_log,
                                                    const Tensor& dt_bias, DType act, DeviceKind dev) {
  const auto th = check_gates_inputs(op, b, a, a_log, dt_bias, act, dev);
  check_tensor(op, "beta", beta, DType::F32, b.shape_vec(), dev);
  check_tensor(op, "g", g, DType::F32, b.shape_vec(), dev);
  return th;
}

std::pair<int64_t, int64_t> check_gdn_gates_backward(const char* op, const Tensor& db, const Tensor& da,
                                                     const Tensor& dbeta, const Tensor& dg, const Tensor& b,
                                                     const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                                                     DType act, DeviceKind dev) {
  const auto th = check_gates_inputs(op, b, a, a_log, dt_bias, act, dev);
  check_tensor(op, "dbeta", dbeta, DType::F32, b.shape_vec(), dev);
  check_tensor(op, "dg", dg, DType::F32, b.shape_vec(), dev);
  check_tensor(op, "db", db, act, b.shape_vec(), dev);
  check_tensor(op, "da", da, act, b.shape_vec(), dev);
  return th;
}

LoraShape check_lora(const char* op, const Tensor& y_or_dy, const Tensor& t, const Tensor& x, const LoraArgs& lora,
                     DType act, DeviceKind dev) {
  QT_CHECK(lora.a.ndim == 2 && lora.b.ndim == 2, op, ": A is ", lora.a.describe(), ", B ", lora.b.describe(),
           ", expected 2-D");
  const int64_t r = lora.a.size(0), K = lora.a.size(1), N = lora.b.size(0), T = dim_of(op, "x", x, 0);
  check_tensor(op, "A", lora.a, act, {r, K}, dev);
  check_tensor(op, "B", lora.b, act, {N, r}, dev);
  check_tensor(op, "x", x, act, {T, K}, dev);
  check_tensor(op, "t", t, act, {T, r}, dev);
  check_tensor(op, "y/dy", y_or_dy, act, {T, N}, dev);
  QT_CHECK(std::isfinite(lora.scale), op, ": scale ", lora.scale, " is not finite");
  return {T, N, K, r};
}

int64_t check_dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, DType act, DeviceKind dev) {
  const char* op = "dropout";
  check_storage(op, "x", x, act, dev);
  check_tensor(op, "out", out, act, x.shape_vec(), dev);
  check_tensor(op, "seed", d.seed, DType::I32, {2}, dev);
  QT_CHECK(d.p >= 0 && d.p < 1, op, ": p ", d.p, " is not in [0, 1)");
  return x.numel();
}

}  // namespace qt::ops
