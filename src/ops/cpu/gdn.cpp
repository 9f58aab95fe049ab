// CPU reference: the Gated DeltaNet ops (docs/model_spec.md 3.5 and 4): causal conv1d + SiLU, the beta/g
// gates, the gated delta rule (per-token recurrence and its exact backward), gated RMSNorm.
#include <cmath>
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
using detail::silu;
using detail::silu_grad;

// ---- causal depthwise conv1d + SiLU --------------------------------------------------------------

template <typename S>
void conv1d_silu_forward(S* y, const S* x, const S* w, int64_t T, int64_t C, int64_t K, const int32_t* cu,
                         int num_seqs) {
  const std::vector<int64_t> start = detail::sequence_starts(cu, num_seqs, T);
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        S acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;  // tap j = K-1 reads the current token
          if (src >= start[static_cast<size_t>(t)]) acc += w[c * K + j] * x[src * C + c];
        }
        y[t * C + c] = silu(acc);
      }
    }
  });
}

template <typename S>
void conv1d_silu_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, int64_t T, int64_t C, int64_t K,
                          const int32_t* cu, int num_seqs) {
  const std::vector<int64_t> start = detail::sequence_starts(cu, num_seqs, T);
  std::vector<int64_t> end(static_cast<size_t>(T));
  for (int s = 0; s < num_seqs; ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) end[static_cast<size_t>(t)] = cu[s + 1];

  // dc = dy silu'(c), with the pre-activation c recomputed.
  std::vector<S> dc(static_cast<size_t>(T * C));
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        S acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= start[static_cast<size_t>(t)]) acc += w[c * K + j] * x[src * C + c];
        }
        dc[static_cast<size_t>(t * C + c)] = dy[t * C + c] * silu_grad(acc);
      }
    }
  });

  // dx[tau,c] = sum_j dc[tau+K-1-j, c] w[c,j] within the sample; dw[c,j] += sum_t dc[t,c] x[t-K+1+j, c].
  rows_with_column_sums<S>(T, C * K, dw, [&](int64_t t, S* dw_part) {
    for (int64_t c = 0; c < C; ++c) {
      S acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t dst = t + (K - 1) - j;
        if (dst < end[static_cast<size_t>(t)]) acc += dc[static_cast<size_t>(dst * C + c)] * w[c * K + j];
      }
      dx[t * C + c] = acc;
    }
    if (dw == nullptr) return;
    for (int64_t c = 0; c < C; ++c) {
      const S d = dc[static_cast<size_t>(t * C + c)];
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= start[static_cast<size_t>(t)]) dw_part[c * K + j] += d * x[src * C + c];
      }
    }
  });
}

// ---- gates ---------------------------------------------------------------------------------------

namespace {
// torch.nn.functional.softplus(x) with beta 1, threshold 20, and its derivative.
template <typename S>
S softplus(S x) {
  return x > S(20) ? x : std::log1p(std::exp(x));
}
template <typename S>
S softplus_grad(S x) {
  return x > S(20) ? S(1) : sigmoid(x);
}
}  // namespace

template <typename S>
void gdn_gates_forward(S* beta, S* g, const S* b, const S* a, const S* a_log, const S* dt_bias, int64_t T,
                       int64_t H) {
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t i = t * H + h;
        beta[i] = sigmoid(b[i]);
        g[i] = -std::exp(a_log[h]) * softplus(a[i] + dt_bias[h]);
      }
    }
  });
}

template <typename S>
void gdn_gates_backward(S* db, S* da, S* da_log, S* ddt_bias, const S* dbeta, const S* dg, const S* b, const S* a,
                        const S* a_log, const S* dt_bias, int64_t T, int64_t H) {
  // Column sums: [0, H) = dA_log (sum dg g), [H, 2H) = d dt_bias (sum da).
  std::vector<S> sums(static_cast<size_t>(2 * H), S(0));
  rows_with_column_sums<S>(T, 2 * H, sums.data(), [&](int64_t t, S* part) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t i = t * H + h;
      const S bt = sigmoid(b[i]);
      db[i] = dbeta[i] * bt * (S(1) - bt);
      const S u = a[i] + dt_bias[h];
      const S decay_rate = std::exp(a_log[h]);
      const S g = -decay_rate * softplus(u);
      const S d = dg[i] * (-decay_rate) * softplus_grad(u);
      da[i] = d;
      part[h] += dg[i] * g;
      part[H + h] += d;
    }
  });
  for (int64_t h = 0; h < H; ++h) {
    if (da_log != nullptr) da_log[h] += sums[static_cast<size_t>(h)];
    if (ddt_bias != nullptr) ddt_bias[h] += sums[static_cast<size_t>(H + h)];
  }
}

// ---- gated delta rule ----------------------------------------------------------------------------

namespace {

constexpr double kL2Eps = 1e-6;
constexpr int64_t kGdnChunk = 64;  // state checkpoint interval in the backward

// y = x (|x|^2 + 1e-6)^-1/2 * scale.
template <typename S>
void l2norm_scaled(S* y, const S* x, int64_t n, S scale) {
  S ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const S r = S(1) / std::sqrt(ss + S(kL2Eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * scale;
}

// dx = scale (r dy - r^3 (x . dy) x), the backward of l2norm_scaled.
template <typename S>
void l2norm_scaled_backward(S* dx, const S* dy, const S* x, int64_t n, S scale) {
  S ss = 0, xdy = 0;
  for (int64_t i = 0; i < n; ++i) {
    ss += x[i] * x[i];
    xdy += x[i] * dy[i];
  }
  const S r = S(1) / std::sqrt(ss + S(kL2Eps));
  for (int64_t i = 0; i < n; ++i) dx[i] = scale * (r * dy[i] - r * r * r * xdy * x[i]);
}

// One (sample, value head) view of the packed inputs.
template <typename S>
struct GdnHead {
  const S* qkv;
  const S* g;
  const S* beta;
  int64_t dk, dv, Hv, conv_dim, q_off, k_off, v_off;  // q_off/k_off: the key head's columns
  S q_scale;

  // Normalized q^, k^ (dk each) and raw v (dv) of token t.
  void load(int64_t t, S* qn, S* kn, const S** v) const {
    l2norm_scaled(qn, qkv + t * conv_dim + q_off, dk, q_scale);
    l2norm_scaled(kn, qkv + t * conv_dim + k_off, dk, S(1));
    *v = qkv + t * conv_dim + v_off;
  }

  // S <- e^g S; m = S^T k^; delta = beta (v - m); S <- S + k^ delta^T. State is [dk, dv].
  void step(S* state, S* m, S* delta, const S* kn, const S* v, S decay, S b) const {
    for (int64_t i = 0; i < dk * dv; ++i) state[i] *= decay;
    for (int64_t c = 0; c < dv; ++c) m[c] = 0;
    for (int64_t r = 0; r < dk; ++r)
      for (int64_t c = 0; c < dv; ++c) m[c] += state[r * dv + c] * kn[r];
    for (int64_t c = 0; c < dv; ++c) delta[c] = b * (v[c] - m[c]);
    for (int64_t r = 0; r < dk; ++r)
      for (int64_t c = 0; c < dv; ++c) state[r * dv + c] += kn[r] * delta[c];
  }
};

template <typename S>
GdnHead<S> make_head(const S* qkv, const S* g, const S* beta, const GdnDims& d, int64_t j) {
  const int64_t kh = j / (d.num_v_heads / d.num_k_heads);
  GdnHead<S> h{qkv, g, beta, d.k_head_dim, d.v_head_dim, d.num_v_heads, d.conv_dim(), kh * d.k_head_dim,
               d.key_dim() + kh * d.k_head_dim, 2 * d.key_dim() + j * d.v_head_dim,
               S(1) / std::sqrt(S(d.k_head_dim))};
  return h;
}

// Tokens [t0, t1) of value head j from `state` (updated in place); o rows written unless o is nullptr.
// zero_v: every v row taken as 0 (the state's columns need not be dv then: gdn_segment_map's M).
template <typename S>
void forward_tokens(const GdnHead<S>& head, int64_t j, S* state, S* o, int64_t t0, int64_t t1, bool zero_v = false) {
  const int64_t dk = head.dk, dv = head.dv;
  std::vector<S> qn(static_cast<size_t>(dk)), kn(static_cast<size_t>(dk)), m(static_cast<size_t>(dv)),
      delta(static_cast<size_t>(dv)), zeros(zero_v ? static_cast<size_t>(dv) : 0, S(0));
  for (int64_t t = t0; t < t1; ++t) {
    const S* v = nullptr;
    head.load(t, qn.data(), kn.data(), &v);
    head.step(state, m.data(), delta.data(), kn.data(), zero_v ? zeros.data() : v, std::exp(head.g[t * head.Hv + j]),
              head.beta[t * head.Hv + j]);
    if (o == nullptr) continue;
    S* ot = o + (t * head.Hv + j) * dv;
    for (int64_t c = 0; c < dv; ++c) ot[c] = 0;
    for (int64_t r = 0; r < dk; ++r)
      for (int64_t c = 0; c < dv; ++c) ot[c] += state[r * dv + c] * qn[static_cast<size_t>(r)];
  }
}

// backward_tokens' work buffers, sized once per (dk, dv) and reused by a thread's tasks (a chunk's
// entering states alone are 64 dk dv values).
template <typename S>
struct BackwardScratch {
  std::vector<S> ckpt, states, state, shat, st, qn, kn, m, delta, ddelta, dm;
  BackwardScratch(int64_t dk, int64_t dv)
      : states(static_cast<size_t>(kGdnChunk * dk * dv)), state(static_cast<size_t>(dk * dv)),
        shat(state.size()), st(state.size()), qn(static_cast<size_t>(dk)), kn(qn.size()),
        m(static_cast<size_t>(dv)), delta(m.size()), ddelta(m.size()), dm(m.size()) {}
};

// The backward of tokens [t0, t1) of value head j (gdn_backward's per-task work): S0 the state
// entering the range (nullptr: 0); G in: dL/dS leaving the range, out: dL/dS entering it.
// dqn_all, dkn_all [T, Hv, dk] (gradients w.r.t. q^, k^), head j's v columns of dqkv, dg, dbeta: the
// range's rows, overwritten.
template <typename S>
void backward_tokens(BackwardScratch<S>& w, const GdnHead<S>& head, int64_t j, int64_t t0, int64_t t1, const S* S0,
                     S* G, S* dqn_all, S* dkn_all, S* dqkv, S* dg, S* dbeta, const S* d_o) {
  const int64_t Hv = head.Hv, dk = head.dk, dv = head.dv, CD = head.conv_dim, SZ = dk * dv;
  const S* g = head.g;
  const S* beta = head.beta;
  const int64_t nchunks = (t1 - t0 + kGdnChunk - 1) / kGdnChunk;
  auto& [ckpt, states, state, shat, st, qn, kn, m, delta, ddelta, dm] = w;
  // Forward pass keeping the state that enters each chunk.
  ckpt.assign(static_cast<size_t>(nchunks * SZ), S(0));
  if (S0 != nullptr)
    std::copy(S0, S0 + SZ, state.begin());
  else
    std::fill(state.begin(), state.end(), S(0));
  for (int64_t t = t0; t < t1; ++t) {
    if ((t - t0) % kGdnChunk == 0)
      std::copy(state.begin(), state.end(), ckpt.begin() + (t - t0) / kGdnChunk * SZ);
    const S* v = nullptr;
    head.load(t, qn.data(), kn.data(), &v);
    head.step(state.data(), m.data(), delta.data(), kn.data(), v, std::exp(g[t * Hv + j]), beta[t * Hv + j]);
  }

  // Backward, last chunk first; G = dL/dS_t, as given after the range's last token.
  for (int64_t ch = nchunks - 1; ch >= 0; --ch) {
    const int64_t c0 = t0 + ch * kGdnChunk;
    const int64_t L = std::min(kGdnChunk, t1 - c0);
    // states[i] = S_{t-1} for token t = c0 + i.
    std::copy(ckpt.begin() + ch * SZ, ckpt.begin() + (ch + 1) * SZ, st.begin());
    for (int64_t i = 0; i < L; ++i) {
      std::copy(st.begin(), st.end(), states.begin() + i * SZ);
      if (i + 1 == L) break;
      const S* v = nullptr;
      head.load(c0 + i, qn.data(), kn.data(), &v);
      head.step(st.data(), m.data(), delta.data(), kn.data(), v, std::exp(g[(c0 + i) * Hv + j]),
                beta[(c0 + i) * Hv + j]);
    }
    for (int64_t i = L - 1; i >= 0; --i) {
      const int64_t t = c0 + i;
      const S decay = std::exp(g[t * Hv + j]);
      const S b = beta[t * Hv + j];
      const S* v = nullptr;
      head.load(t, qn.data(), kn.data(), &v);
      // Recompute S^ = e^g S_{t-1}, m, delta and S_t.
      const S* prev = states.data() + i * SZ;
      for (int64_t e = 0; e < SZ; ++e) shat[static_cast<size_t>(e)] = decay * prev[e];
      std::copy(prev, prev + SZ, st.begin());
      head.step(st.data(), m.data(), delta.data(), kn.data(), v, decay, b);
      const S* dot = d_o + (t * Hv + j) * dv;
      S* dqn = dqn_all + (t * Hv + j) * dk;
      S* dkn = dkn_all + (t * Hv + j) * dk;

      // o = S_t^T q^: G += q^ do^T, dq^ = S_t do.
      for (int64_t r = 0; r < dk; ++r) {
        S acc = 0;
        for (int64_t c = 0; c < dv; ++c) {
          G[static_cast<size_t>(r * dv + c)] += qn[static_cast<size_t>(r)] * dot[c];
          acc += st[static_cast<size_t>(r * dv + c)] * dot[c];
        }
        dqn[r] = acc;
      }
      // S_t = S^ + k^ delta^T: d delta = G^T k^, dk^ = G delta.
      for (int64_t c = 0; c < dv; ++c) ddelta[static_cast<size_t>(c)] = 0;
      for (int64_t r = 0; r < dk; ++r) {
        S acc = 0;
        for (int64_t c = 0; c < dv; ++c) {
          ddelta[static_cast<size_t>(c)] += G[static_cast<size_t>(r * dv + c)] * kn[static_cast<size_t>(r)];
          acc += G[static_cast<size_t>(r * dv + c)] * delta[static_cast<size_t>(c)];
        }
        dkn[r] = acc;
      }
      // delta = beta (v - m).
      S db = 0;
      S* dvt = dqkv + t * CD + head.v_off;
      for (int64_t c = 0; c < dv; ++c) {
        db += ddelta[static_cast<size_t>(c)] * (v[c] - m[static_cast<size_t>(c)]);
        dvt[c] = b * ddelta[static_cast<size_t>(c)];
        dm[static_cast<size_t>(c)] = -b * ddelta[static_cast<size_t>(c)];
      }
      dbeta[t * Hv + j] = db;
      // m = S^^T k^: dS^ = G + k^ dm^T (built in G), dk^ += S^ dm.
      S dgt = 0;
      for (int64_t r = 0; r < dk; ++r) {
        S acc = 0;
        for (int64_t c = 0; c < dv; ++c) {
          const size_t e = static_cast<size_t>(r * dv + c);
          acc += shat[e] * dm[static_cast<size_t>(c)];
          G[e] += kn[static_cast<size_t>(r)] * dm[static_cast<size_t>(c)];
          dgt += shat[e] * G[e];
        }
        dkn[r] += acc;
      }
      // S^ = e^g S_{t-1}: dg = <S^, dS^>, dL/dS_{t-1} = e^g dS^.
      dg[t * Hv + j] = dgt;
      for (int64_t e = 0; e < SZ; ++e) G[e] *= decay;
    }
  }
}

}  // namespace

template <typename S>
void gdn_forward(S* o, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t T, const int32_t* cu,
                 int num_seqs) {
  (void)T;
  const int64_t Hv = dims.num_v_heads, dk = dims.k_head_dim, dv = dims.v_head_dim;
  parallel_for(num_seqs * Hv, [&](int64_t task0, int64_t task1) {
    std::vector<S> state(static_cast<size_t>(dk * dv));
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t s = task / Hv, j = task % Hv;
      std::fill(state.begin(), state.end(), S(0));
      forward_tokens(make_head(qkv, g, beta, dims, j), j, state.data(), o, cu[s], cu[s + 1]);
    }
  });
}

template <typename S>
void gdn_forward_segment(S* o, S* state, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j,
                         int64_t t0, int64_t t1) {
  forward_tokens(make_head(qkv, g, beta, dims, j), j, state, o, t0, t1);
}

template <typename S>
void gdn_backward_segment(S* dqn, S* dkn, S* dqkv, S* dg, S* dbeta, S* dstate, const S* state, const S* d_o,
                          const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j, int64_t t0,
                          int64_t t1) {
  BackwardScratch<S> w(dims.k_head_dim, dims.v_head_dim);
  backward_tokens(w, make_head(qkv, g, beta, dims, j), j, t0, t1, state, dstate, dqn, dkn, dqkv, dg, dbeta, d_o);
}

template <typename S>
void gdn_segment_map(S* M, S* E, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j, int64_t t0,
                     int64_t t1) {
  const GdnHead<S> head = make_head(qkv, g, beta, dims, j);
  const int64_t dk = dims.k_head_dim, dv = dims.v_head_dim;
  // M: the same recurrence over a dk x dk state from I with every v row 0 (the state's dk columns
  // play dv's part; load still reads the real v row, which zero_v ignores).
  GdnHead<S> square = head;
  square.dv = dk;
  std::fill(M, M + dk * dk, S(0));
  for (int64_t r = 0; r < dk; ++r) M[r * dk + r] = S(1);
  forward_tokens(square, j, M, static_cast<S*>(nullptr), t0, t1, true);
  std::fill(E, E + dk * dv, S(0));
  forward_tokens(head, j, E, static_cast<S*>(nullptr), t0, t1);
}

template <typename S>
void gdn_backward(S* dqkv, S* dg, S* dbeta, const S* d_o, const S* qkv, const S* g, const S* beta,
                  const GdnDims& dims, int64_t T, const int32_t* cu, int num_seqs) {
  const int64_t Hk = dims.num_k_heads, Hv = dims.num_v_heads, dk = dims.k_head_dim, dv = dims.v_head_dim;
  const int64_t CD = dims.conv_dim(), key_dim = dims.key_dim(), ratio = Hv / Hk;
  // Gradients w.r.t. the normalized q^, k^, per value head; summed over each key head's group below.
  std::vector<S> dqn_all(static_cast<size_t>(T * Hv * dk)), dkn_all(static_cast<size_t>(T * Hv * dk));

  parallel_for(num_seqs * Hv, [&](int64_t task0, int64_t task1) {
    BackwardScratch<S> w(dk, dv);
    std::vector<S> G(static_cast<size_t>(dk * dv));
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t s = task / Hv, j = task % Hv;
      std::fill(G.begin(), G.end(), S(0));  // nothing flows back from after the sample
      backward_tokens(w, make_head(qkv, g, beta, dims, j), j, cu[s], cu[s + 1], static_cast<const S*>(nullptr),
                      G.data(), dqn_all.data(), dkn_all.data(), dqkv, dg, dbeta, d_o);
    }
  });

  // Sum dq^, dk^ over the value heads of each key head (fixed order), then the L2-norm backward.
  const S q_scale = S(1) / std::sqrt(S(dk));
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<S> sq(static_cast<size_t>(dk)), sk(static_cast<size_t>(dk));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t kh = 0; kh < Hk; ++kh) {
        std::fill(sq.begin(), sq.end(), S(0));
        std::fill(sk.begin(), sk.end(), S(0));
        for (int64_t j = kh * ratio; j < (kh + 1) * ratio; ++j) {
          const S* dqn = dqn_all.data() + (t * Hv + j) * dk;
          const S* dkn = dkn_all.data() + (t * Hv + j) * dk;
          for (int64_t r = 0; r < dk; ++r) {
            sq[static_cast<size_t>(r)] += dqn[r];
            sk[static_cast<size_t>(r)] += dkn[r];
          }
        }
        const int64_t qo = t * CD + kh * dk, ko = t * CD + key_dim + kh * dk;
        l2norm_scaled_backward(dqkv + qo, sq.data(), qkv + qo, dk, q_scale);
        l2norm_scaled_backward(dqkv + ko, sk.data(), qkv + ko, dk, S(1));
      }
    }
  });
}

// ---- gated RMSNorm -------------------------------------------------------------------------------

template <typename S>
void gated_rmsnorm_forward(S* y, S* rstd, const S* x, const S* z, const S* w, int64_t rows, int64_t cols,
                           double eps) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const S* xr = x + r * cols;
      S ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
      const S rs = S(1) / std::sqrt(ss / S(cols) + S(eps));
      rstd[r] = rs;
      for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = w[c] * (xr[c] * rs) * silu(z[r * cols + c]);
    }
  });
}

template <typename S>
void gated_rmsnorm_backward(S* dx, S* dz, S* dw, const S* dy, const S* x, const S* z, const S* w, const S* rstd,
                            int64_t rows, int64_t cols) {
  // n = x rstd, dn = dy w silu(z): dx = rstd (dn - n mean(n dn)); dz = dy w n silu'(z);
  // dw = sum_rows dy n silu(z).
  rows_with_column_sums<S>(rows, cols, dw, [&](int64_t r, S* dw_part) {
    const int64_t o = r * cols;
    const S rs = rstd[r];
    S dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += (x[o + c] * rs) * (dy[o + c] * w[c] * silu(z[o + c]));
    const S mean = dot / S(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const S n = x[o + c] * rs;
      const S sz = silu(z[o + c]);
      dx[o + c] = rs * (dy[o + c] * w[c] * sz - n * mean);
      dz[o + c] = dy[o + c] * w[c] * n * silu_grad(z[o + c]);
      dw_part[c] += dy[o + c] * n * sz;
    }
  });
}

QT_REF_INSTANTIATE(conv1d_silu_forward);
QT_REF_INSTANTIATE(conv1d_silu_backward);
QT_REF_INSTANTIATE(gdn_gates_forward);
QT_REF_INSTANTIATE(gdn_gates_backward);
QT_REF_INSTANTIATE(gdn_forward);
QT_REF_INSTANTIATE(gdn_forward_segment);
QT_REF_INSTANTIATE(gdn_segment_map);
QT_REF_INSTANTIATE(gdn_backward_segment);
QT_REF_INSTANTIATE(gdn_backward);
QT_REF_INSTANTIATE(gated_rmsnorm_forward);
QT_REF_INSTANTIATE(gated_rmsnorm_backward);

}  // namespace ref

// ---- CpuBackend: Gated DeltaNet ------------------------------------------------------------------

using cpu::check_optional;
using cpu::check_seqs;
using cpu::check_storage;
using cpu::check_tensor;
using cpu::dim_of;

namespace {
constexpr DType F32 = DType::F32;

// conv weight: [C, K] (or the checkpoint's [C, 1, K]).
void conv_weight_dims(const char* op, const char* name, const Tensor& w, int64_t* C, int64_t* K) {
  QT_CHECK(w.ndim == 2 || (w.ndim == 3 && w.shape[1] == 1), op, ": ", name, " is ", w.describe(),
           ", expected [C, K]");
  *C = w.shape[0];
  *K = w.shape[static_cast<size_t>(w.ndim - 1)];
  QT_CHECK(*K >= 1, op, ": ", name, " is ", w.describe(), ", expected kernel width >= 1");
}
}  // namespace

void CpuBackend::conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) {
  const char* op = "conv1d_silu_forward";
  int64_t C = 0, K = 0;
  conv_weight_dims(op, "w", w, &C, &K);
  check_storage(op, "w", w, F32);
  const int64_t T = dim_of(op, "x", x, 0);
  check_tensor(op, "x", x, F32, {T, C});
  check_tensor(op, "y", y, F32, {T, C});
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::conv1d_silu_forward(y.ptr<float>(), x.ptr<float>(), w.ptr<float>(), T, C, K, cu, seqs.num_seqs);
}

void CpuBackend::conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, const SeqInfo& seqs) {
  const char* op = "conv1d_silu_backward";
  int64_t C = 0, K = 0;
  conv_weight_dims(op, "w", w, &C, &K);
  check_storage(op, "w", w, F32);
  const int64_t T = dim_of(op, "x", x, 0);
  check_tensor(op, "x", x, F32, {T, C});
  check_tensor(op, "dy", dy, F32, {T, C});
  check_tensor(op, "dx", dx, F32, {T, C});
  const bool want_dw = check_optional(op, "dw", dw, F32, {C, K});
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::conv1d_silu_backward(dx.ptr<float>(), want_dw ? dw.ptr<float>() : nullptr, dy.ptr<float>(), x.ptr<float>(),
                            w.ptr<float>(), T, C, K, cu, seqs.num_seqs);
}

void CpuBackend::gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                                   const Tensor& a_log, const Tensor& dt_bias) {
  const auto [T, H] =
      ops::check_gdn_gates_forward("gdn_gates_forward", beta, g, b, a, a_log, dt_bias, F32, DeviceKind::CPU);
  ref::gdn_gates_forward(beta.ptr<float>(), g.ptr<float>(), b.ptr<float>(), a.ptr<float>(), a_log.ptr<float>(),
                         dt_bias.ptr<float>(), T, H);
}

void CpuBackend::gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log, const Tensor& ddt_bias,
                                    const Tensor& dbeta, const Tensor& dg, const Tensor& b, const Tensor& a,
                                    const Tensor& a_log, const Tensor& dt_bias) {
  const char* op = "gdn_gates_backward";
  const auto [T, H] = ops::check_gdn_gates_backward(op, db, da, dbeta, dg, b, a, a_log, dt_bias, F32, DeviceKind::CPU);
  const bool want_dalog = check_optional(op, "da_log", da_log, F32, {H});
  const bool want_ddt = check_optional(op, "ddt_bias", ddt_bias, F32, {H});
  ref::gdn_gates_backward(db.ptr<float>(), da.ptr<float>(), want_dalog ? da_log.ptr<float>() : nullptr,
                          want_ddt ? ddt_bias.ptr<float>() : nullptr, dbeta.ptr<float>(), dg.ptr<float>(),
                          b.ptr<float>(), a.ptr<float>(), a_log.ptr<float>(), dt_bias.ptr<float>(), T, H);
}

// The reference keeps no state (gdn_state_bytes is 0): `state` is ignored, the backward recomputes.
void CpuBackend::gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                             const GdnDims& dims, const SeqInfo& seqs, const Tensor& /*state*/, GdnKeep /*keep*/) {
  const char* op = "gdn_forward";
  const int64_t T = ops::check_gdn_forward(op, dims, o, qkv, g, beta, F32, DeviceKind::CPU);
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::gdn_forward(o.ptr<float>(), qkv.ptr<float>(), g.ptr<float>(), beta.ptr<float>(), dims, T, cu, seqs.num_seqs);
}

void CpuBackend::gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o,
                              const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                              const SeqInfo& seqs, const Tensor& /*state*/, GdnKeep /*keep*/) {
  const char* op = "gdn_backward";
  const int64_t T = ops::check_gdn_backward(op, dims, dqkv, dg, dbeta, d_o, qkv, g, beta, F32, DeviceKind::CPU);
  const int32_t* cu = check_seqs(op, seqs, T);
  ref::gdn_backward(dqkv.ptr<float>(), dg.ptr<float>(), dbeta.ptr<float>(), d_o.ptr<float>(), qkv.ptr<float>(),
                    g.ptr<float>(), beta.ptr<float>(), dims, T, cu, seqs.num_seqs);
}

void CpuBackend::gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z,
                                       const Tensor& w, double eps) {
  const auto [rows, cols] =
      ops::check_norm("gated_rmsnorm_forward", w, x, {{"z", &z}, {"y", &y}}, rstd, F32, DeviceKind::CPU);
  ref::gated_rmsnorm_forward(y.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), z.ptr<float>(), w.ptr<float>(), rows,
                             cols, eps);
}

void CpuBackend::gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                        const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& rstd) {
  const char* op = "gated_rmsnorm_backward";
  const auto [rows, cols] =
      ops::check_norm(op, w, x, {{"z", &z}, {"dy", &dy}, {"dx", &dx}, {"dz", &dz}}, rstd, F32, DeviceKind::CPU);
  const bool want_dw = check_optional(op, "dw", dw, F32, {cols});
  ref::gated_rmsnorm_backward(dx.ptr<float>(), dz.ptr<float>(), want_dw ? dw.ptr<float>() : nullptr, dy.ptr<float>(),
                              x.ptr<float>(), z.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(), rows, cols);
}

}  // namespace qt
