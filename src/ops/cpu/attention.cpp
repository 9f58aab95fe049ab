// CPU reference: gated full attention (docs/model_spec.md 3.3-3.4): q/k (1+w) RMSNorm + partial
// rotate-half RoPE, causal varlen GQA softmax attention with saved log-sum-exp, and the sigmoid
// output gate.
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_check.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/reference_ops.h"

namespace qt {
namespace ref {

using detail::rows_with_column_sums;
using detail::sigmoid;

namespace {

// cos/sin of position * inv_freq[i], i < rotary_dim / 2, computed in double.
template <typename S>
void rope_table(S* cos_out, S* sin_out, int32_t position, int64_t rotary_dim, double theta) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
    const double angle = static_cast<double>(position) * inv_freq;
    cos_out[i] = static_cast<S>(std::cos(angle));
    sin_out[i] = static_cast<S>(std::sin(angle));
  }
}

// y = RoPE(x * rstd * (1 + w)) for one head of D dims; returns rstd.
template <typename S>
S norm_rope_head(S* y, const S* x, const S* w, const S* cs, const S* sn, int64_t D, int64_t rotary_dim, double eps) {
  S ss = 0;
  for (int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
  const S rs = S(1) / std::sqrt(ss / S(D) + S(eps));
  const int64_t half = rotary_dim / 2;
  for (int64_t d = 0; d < D; ++d) y[d] = x[d] * rs * (S(1) + w[d]);
  for (int64_t j = 0; j < half; ++j) {
    const S a = y[j], b = y[j + half];
    y[j] = a * cs[j] - b * sn[j];
    y[j + half] = b * cs[j] + a * sn[j];
  }
  return rs;
}

// Backward of norm_rope_head: dx (overwritten) and dw_part += from dy, the saved rstd.
template <typename S>
void norm_rope_head_backward(S* dx, S* dw_part, S* du, const S* dy, const S* x, const S* w, S rs, const S* cs,
                             const S* sn, int64_t D, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  for (int64_t d = 0; d < D; ++d) du[d] = dy[d];
  for (int64_t j = 0; j < half; ++j) {  // rotate by -angle (the transpose of the rotation)
    du[j] = dy[j] * cs[j] + dy[j + half] * sn[j];
    du[j + half] = dy[j + half] * cs[j] - dy[j] * sn[j];
  }
  S dot = 0;
  for (int64_t d = 0; d < D; ++d) dot += (x[d] * rs) * (du[d] * (S(1) + w[d]));
  const S mean = dot / S(D);
  for (int64_t d = 0; d < D; ++d) {
    const S n = x[d] * rs;
    dx[d] = rs * (du[d] * (S(1) + w[d]) - n * mean);
    dw_part[d] += du[d] * n;
  }
}

}  // namespace

template <typename S>
void attn_prep_forward(S* q, S* k, S* gate, S* q_rstd, S* k_rstd, const S* qg, const S* kr, const S* q_norm_w,
                       const S* k_norm_w, const int32_t* positions, const AttnDims& dims, int64_t T, double eps) {
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim, rot = dims.rotary_dim;
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<S> cs(static_cast<size_t>(rot / 2 + 1)), sn(static_cast<size_t>(rot / 2 + 1));
    for (int64_t t = t0; t < t1; ++t) {
      rope_table(cs.data(), sn.data(), positions[t], rot, dims.rope_theta);
      for (int64_t h = 0; h < Hq; ++h) {
        const S* src = qg + (t * Hq + h) * 2 * D;
        q_rstd[t * Hq + h] = norm_rope_head(q + (t * Hq + h) * D, src, q_norm_w, cs.data(), sn.data(), D, rot, eps);
        for (int64_t d = 0; d < D; ++d) gate[(t * Hq + h) * D + d] = src[D + d];
      }
      for (int64_t h = 0; h < Hkv; ++h)
        k_rstd[t * Hkv + h] = norm_rope_head(k + (t * Hkv + h) * D, kr + (t * Hkv + h) * D, k_norm_w, cs.data(),
                                             sn.data(), D, rot, eps);
    }
  });
}

template <typename S>
void attn_prep_backward(S* dqg, S* dkr, S* dq_norm_w, S* dk_norm_w, const S* dq, const S* dk, const S* dgate,
                        const S* qg, const S* kr, const S* q_norm_w, const S* k_norm_w, const S* q_rstd,
                        const S* k_rstd, const int32_t* positions, const AttnDims& dims, int64_t T) {
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim, rot = dims.rotary_dim;
  // Column sums: [0, D) = dq_norm_w, [D, 2D) = dk_norm_w.
  std::vector<S> sums(static_cast<size_t>(2 * D), S(0));
  rows_with_column_sums<S>(T, 2 * D, sums.data(), [&](int64_t t, S* part) {
    std::vector<S> cs(static_cast<size_t>(rot / 2 + 1)), sn(static_cast<size_t>(rot / 2 + 1)),
        du(static_cast<size_t>(D));
    rope_table(cs.data(), sn.data(), positions[t], rot, dims.rope_theta);
    for (int64_t h = 0; h < Hq; ++h) {
      S* dst = dqg + (t * Hq + h) * 2 * D;
      norm_rope_head_backward(dst, part, du.data(), dq + (t * Hq + h) * D, qg + (t * Hq + h) * 2 * D, q_norm_w,
                              q_rstd[t * Hq + h], cs.data(), sn.data(), D, rot);
      for (int64_t d = 0; d < D; ++d) dst[D + d] = dgate[(t * Hq + h) * D + d];
    }
    for (int64_t h = 0; h < Hkv; ++h)
      norm_rope_head_backward(dkr + (t * Hkv + h) * D, part + D, du.data(), dk + (t * Hkv + h) * D,
                              kr + (t * Hkv + h) * D, k_norm_w, k_rstd[t * Hkv + h], cs.data(), sn.data(), D, rot);
  });
  for (int64_t d = 0; d < D; ++d) {
    if (dq_norm_w != nullptr) dq_norm_w[d] += sums[static_cast<size_t>(d)];
    if (dk_norm_w != nullptr) dk_norm_w[d] += sums[static_cast<size_t>(D + d)];
  }
}

// ---- causal GQA attention ------------------------------------------------------------------------

template <typename S>
void attention_forward(S* o, S* lse, const S* q, const S* k, const S* v, const AttnDims& dims, int64_t T,
                       const int32_t* cu, int num_seqs) {
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim, group = Hq / Hkv;
  const S scale = S(1) / std::sqrt(S(D));
  const std::vector<int64_t> start = detail::sequence_starts(cu, num_seqs, T);
  parallel_for(T * Hq, [&](int64_t i0, int64_t i1) {
    std::vector<S> s;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, kvh = h / group, t_start = start[static_cast<size_t>(t)];
      const S* qt = q + (t * Hq + h) * D;
      s.assign(static_cast<size_t>(t - t_start + 1), S(0));
      S mx = -std::numeric_limits<S>::infinity();
      for (int64_t j = t_start; j <= t; ++j) {
        const S* kj = k + (j * Hkv + kvh) * D;
        S dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qt[d] * kj[d];
        s[static_cast<size_t>(j - t_start)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      S sum = 0;
      for (auto& e : s) {
        e = std::exp(e - mx);
        sum += e;
      }
      S* ot = o + (t * Hq + h) * D;
      for (int64_t d = 0; d < D; ++d) ot[d] = 0;
      for (int64_t j = t_start; j <= t; ++j) {
        const S p = s[static_cast<size_t>(j - t_start)] / sum;
        const S* vj = v + (j * Hkv + kvh) * D;
        for (int64_t d = 0; d < D; ++d) ot[d] += p * vj[d];
      }
      lse[h * T + t] = mx + std::log(sum);
    }
  });
}

template <typename S>
void attention_backward(S* dq, S* dk, S* dv, const S* d_o, const S* q, const S* k, const S* v, const S* o,
                        const S* lse, const AttnDims& dims, int64_t T, const int32_t* cu, int num_seqs) {
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim, group = Hq / Hkv;
  const S scale = S(1) / std::sqrt(S(D));
  // One task per (sample, kv head): it owns dk/dv of that head and dq of its query heads, over
  // the sample's tokens, so no two tasks write the same element.
  parallel_for(num_seqs * Hkv, [&](int64_t task0, int64_t task1) {
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t s = task / Hkv, kvh = task % Hkv, t0 = cu[s], t1 = cu[s + 1];
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t d = 0; d < D; ++d) dk[(t * Hkv + kvh) * D + d] = dv[(t * Hkv + kvh) * D + d] = 0;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int64_t d = 0; d < D; ++d) dq[(t * Hq + h) * D + d] = 0;
      }
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i = t0; i < t1; ++i) {
          const S* qi = q + (i * Hq + h) * D;
          const S* doi = d_o + (i * Hq + h) * D;
          const S* oi = o + (i * Hq + h) * D;
          S* dqi = dq + (i * Hq + h) * D;
          S di = 0;  // D_i = dO_i . O_i
          for (int64_t d = 0; d < D; ++d) di += doi[d] * oi[d];
          for (int64_t j = t0; j <= i; ++j) {
            const S* kj = k + (j * Hkv + kvh) * D;
            const S* vj = v + (j * Hkv + kvh) * D;
            S dot = 0, dp = 0;
            for (int64_t d = 0; d < D; ++d) {
              dot += qi[d] * kj[d];
              dp += doi[d] * vj[d];
            }
            const S p = std::exp(dot * scale - lse[h * T + i]);
            const S ds = p * (dp - di);
            S* dkj = dk + (j * Hkv + kvh) * D;
            S* dvj = dv + (j * Hkv + kvh) * D;
            for (int64_t d = 0; d < D; ++d) {
              dvj[d] += p * doi[d];
              dqi[d] += scale * ds * kj[d];
              dkj[d] += scale * ds * qi[d];
            }
          }
        }
      }
    }
  });
}

// ---- output gate ---------------------------------------------------------------------------------

template <typename S>
void attn_gate_forward(S* y, const S* o, const S* gate, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = o[i] * sigmoid(gate[i]);
  }, 4096);
}

template <typename S>
void attn_gate_backward(S* d_o, S* dgate, const S* dy, const S* o, const S* gate, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const S sg = sigmoid(gate[i]);
      const S g = dy[i];  // read before writing: d_o may alias dy
      d_o[i] = g * sg;
      dgate[i] = g * o[i] * sg * (S(1) - sg);
    }
  }, 4096);
}

QT_REF_INSTANTIATE(attn_prep_forward);
QT_REF_INSTANTIATE(attn_prep_backward);
QT_REF_INSTANTIATE(attention_forward);
QT_REF_INSTANTIATE(attention_backward);
QT_REF_INSTANTIATE(attn_gate_forward);
QT_REF_INSTANTIATE(attn_gate_backward);

}  // namespace ref

// ---- CpuBackend: attention -----------------------------------------------------------------------

using cpu::check_optional;
using cpu::check_seqs;
using cpu::check_storage;
using cpu::check_tensor;
using cpu::dim_of;

namespace {
constexpr DType F32 = DType::F32;

}  // namespace

void CpuBackend::attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                                   const Tensor& k_rstd, const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                                   const Tensor& k_norm_w, const Tensor& positions, const AttnDims& dims, double eps) {
  const int64_t T = ops::check_attn_prep_forward("attn_prep_forward", dims, q, k, gate, q_rstd, k_rstd, qg, kr,
                                                 q_norm_w, k_norm_w, positions, F32, DeviceKind::CPU);
  ref::attn_prep_forward(q.ptr<float>(), k.ptr<float>(), gate.ptr<float>(), q_rstd.ptr<float>(), k_rstd.ptr<float>(),
                         qg.ptr<float>(), kr.ptr<float>(), q_norm_w.ptr<float>(), k_norm_w.ptr<float>(),
                         positions.ptr<int32_t>(), dims, T, eps);
}

void CpuBackend::attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w,
                                    const Tensor& dk_norm_w, const Tensor& dq, const Tensor& dk, const Tensor& dgate,
                                    const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                                    const Tensor& k_norm_w, const Tensor& q_rstd, const Tensor& k_rstd,
                                    const Tensor& positions, const AttnDims& dims) {
  const char* op = "attn_prep_backward";
  const int64_t T = ops::check_attn_prep_backward(op, dims, dqg, dkr, dq, dk, dgate, qg, kr, q_norm_w, k_norm_w, q_rstd,
                                                  k_rstd, positions, F32, DeviceKind::CPU);
  const int64_t D = dims.head_dim;
  const bool want_dqw = check_optional(op, "dq_norm_w", dq_norm_w, F32, {D});
  const bool want_dkw = check_optional(op, "dk_norm_w", dk_norm_w, F32, {D});
  ref::attn_prep_backward(dqg.ptr<float>(), dkr.ptr<float>(), want_dqw ? dq_norm_w.ptr<float>() : nullptr,
                          want_dkw ? dk_norm_w.ptr<float>() : nullptr, dq.ptr<float>(), dk.ptr<float>(),
                          dgate.ptr<float>(), qg.ptr<float>(), kr.ptr<float>(), q_norm_w.ptr<float>(),
                          k_norm_w.ptr<float>(), q_rstd.ptr<float>(), k_rstd.ptr<float>(), positions.ptr<int32_t>(),
                          dims, T);
}

void CpuBackend::attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const AttnDims& dims, const SeqInfo& seqs) {
  const char* op = "attention_forward";
  const int64_t T = ops::check_attention_forward(op, dims, o, lse, q, k, v, F32, DeviceKind::CPU);
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::attention_forward(o.ptr<float>(), lse.ptr<float>(), q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), dims, T,
                         cu, seqs.num_seqs);
}

void CpuBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o,
                                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                    const Tensor& lse, const AttnDims& dims, const SeqInfo& seqs) {
  const char* op = "attention_backward";
  const int64_t T = ops::check_attention_backward(op, dims, dq, dk, dv, d_o, q, k, v, o, lse, F32, DeviceKind::CPU);
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::attention_backward(dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), d_o.ptr<float>(), q.ptr<float>(),
                          k.ptr<float>(), v.ptr<float>(), o.ptr<float>(), lse.ptr<float>(), dims, T, cu,
                          seqs.num_seqs);
}

void CpuBackend::attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) {
  ops::check_same_shape("attn_gate_forward", F32, DeviceKind::CPU, {{"o", &o}, {"gate", &gate}, {"y", &y}});
  ref::attn_gate_forward(y.ptr<float>(), o.ptr<float>(), gate.ptr<float>(), o.numel());
}

void CpuBackend::attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                                    const Tensor& gate) {
  ops::check_same_shape("attn_gate_backward", F32, DeviceKind::CPU,
                        {{"o", &o}, {"gate", &gate}, {"dy", &dy}, {"d_o", &d_o}, {"dgate", &dgate}});
  ref::attn_gate_backward(d_o.ptr<float>(), dgate.ptr<float>(), dy.ptr<float>(), o.ptr<float>(), gate.ptr<float>(),
                          o.numel());
}

}  // namespace qt
