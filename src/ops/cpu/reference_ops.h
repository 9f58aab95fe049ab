// The reference math of every Backend op, as scalar-templated free functions on raw contiguous
// pointers (S = float or double). CpuBackend validates its Tensors and calls the float
// instantiation; the tests call the double instantiation for finite-difference gradient checks.
// Only float and double are instantiated (in the .cpp of each op family).
//
// Conventions match ops/backend.h: token-major contiguous buffers, "acc" gradients are added into
// (+=), everything else is overwritten, nullptr marks an optional output that is not wanted.
// Sequences: cu[num_seqs + 1] host i32 offsets, cu[0] = 0, cu[num_seqs] = T; every op that mixes
// tokens restarts at cu[s]. Inputs are trusted here (CpuBackend checks them at the API boundary).
// Everything that accumulates across tokens does so in a fixed order, so results do not depend
// on the thread count.
#pragma once
#include <cstdint>

#include "ops/backend.h"

namespace qt::ref {

// ---- GEMM ----------------------------------------------------------------------------------------
// Row-major C[M,N] = alpha * op(A) op(B) + beta * C, op(A) [M,K] (A stored [K,M] when trans_a),
// op(B) [K,N] (B stored [N,K] when trans_b). beta == 0 ignores C's old contents (even NaN).
// float calls OpenBLAS cblas_sgemm; double is a plain loop (parallel over rows of C).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
          float beta, float* C);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          const double* B, double beta, double* C);

// ---- dense ---------------------------------------------------------------------------------------
// y[T,N] = x[T,K] w[N,K]^T.
template <typename S>
void linear_forward(S* y, const S* x, const S* w, int64_t T, int64_t N, int64_t K);
// dx[T,K] (= or +=) dy w; dw[N,K] (= or +=) dy^T x. Either may be nullptr.
template <typename S>
void linear_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, int64_t T, int64_t N, int64_t K,
                     bool accumulate_dx, bool accumulate_dw);

// LoRA on a projection y[T,N] = x[T,K] W^T: t[T,r] = scale x A^T (A [r,K]); y += t B^T (B [N,r]).
template <typename S>
void lora_forward(S* y, S* t, const S* x, const S* a, const S* b, int64_t T, int64_t N, int64_t K, int64_t r, S scale);
// dB (= or +=) dy^T t; dt = scale dy B; dA (= or +=) dt^T x; dx += dt A (dx may be nullptr).
template <typename S>
void lora_backward(S* dx, S* da, S* db, S* dt, const S* dy, const S* x, const S* t, const S* a, const S* b, int64_t T,
                   int64_t N, int64_t K, int64_t r, S scale, bool accumulate_dw);

// out[T,H] = table[ids[t]]; ids must be in [0, V).
template <typename S>
void embedding_forward(S* out, const S* table, const int32_t* ids, int64_t T, int64_t H);
// dtable[V,H] += scatter of dout[T,H] by ids.
template <typename S>
void embedding_backward(S* dtable, const S* dout, const int32_t* ids, int64_t T, int64_t H);

// (1+w) RMSNorm over rows of x[rows,cols]: rstd[r] = (mean(x_r^2) + eps)^-1/2, y = x rstd (1 + w).
template <typename S>
void rmsnorm_forward(S* y, S* rstd, const S* x, const S* w, int64_t rows, int64_t cols, double eps);
// dx (= or +=, may be nullptr) and dw[cols] += (may be nullptr), from the saved rstd.
template <typename S>
void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const S* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx);

// h = silu(gate) * up over n elements.
template <typename S>
void swiglu_forward(S* h, const S* gate, const S* up, int64_t n);
template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dh, const S* gate, const S* up, int64_t n);

// ---- Gated DeltaNet ------------------------------------------------------------------------------
// y[t,c] = silu(sum_j w[c,j] x[t-(K-1)+j, c]) over x[T,C], w[C,K]; taps before the sample start
// read 0.
template <typename S>
void conv1d_silu_forward(S* y, const S* x, const S* w, int64_t T, int64_t C, int64_t K, const int32_t* cu,
                         int num_seqs);
// dx[T,C] overwritten; dw[C,K] += (may be nullptr).
template <typename S>
void conv1d_silu_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, int64_t T, int64_t C, int64_t K,
                          const int32_t* cu, int num_seqs);

// beta = sigmoid(b); g = -exp(a_log[h]) * softplus(a + dt_bias[h]) over [T,H]; softplus(x) = x for
// x > 20 (torch's threshold), log1p(exp(x)) otherwise.
template <typename S>
void gdn_gates_forward(S* beta, S* g, const S* b, const S* a, const S* a_log, const S* dt_bias, int64_t T,
                       int64_t H);
// db, da overwritten; da_log[H], ddt_bias[H] += (either may be nullptr).
template <typename S>
void gdn_gates_backward(S* db, S* da, S* da_log, S* ddt_bias, const S* dbeta, const S* dg, const S* b, const S* a,
                        const S* a_log, const S* dt_bias, int64_t T, int64_t H);

// The gated delta rule (docs/model_spec.md 3.5 steps 7-9), per sample and value head j (key head
// j / (Hv/Hk)), state S[dk,dv] = 0 at every sample start:
//   q^ = q (|q|^2 + 1e-6)^-1/2 dk^-1/2,  k^ = k (|k|^2 + 1e-6)^-1/2
//   S' = e^g S;  d = beta (v - S'^T k^);  S = S' + k^ d^T;  o = S^T q^
// qkv[T, 2 Hk dk + Hv dv] = [q | k | v]; g, beta [T,Hv]; o [T,Hv,dv].
template <typename S>
void gdn_forward(S* o, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t T, const int32_t* cu,
                 int num_seqs);
// The intra-sample split of the scans (docs/gdn_kernels.md section 4) in exact form, the reference for split
// kernels. Tokens [t0, t1) of value head j map the state entering them to S_end = M S_0 + E: M [dk, dk]
// is the product of the per-token maps A_t = e^{g_t} (I - beta_t k^_t k^_t^T) (later tokens on the
// left), E [dk, dv] the scan of those tokens from S_0 = 0. A sample cut into segments s = 0, 1, ..
// then runs: the maps of every segment (in parallel), S_{s+1} = M_s S_s + E_s from S_0 = 0 (short and
// serial), and each segment's forward from its S_s (in parallel; gdn_forward_segment). The backward
// runs the transposed maps in reverse: each A_t is symmetric, so dL/dS_{s} = M_s^T dL/dS_{s+1} + F_s,
// with F_s the segment's reverse scan from dL/dS_{s+1} = 0.
template <typename S>
void gdn_segment_map(S* M, S* E, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j,
                     int64_t t0, int64_t t1);
// gdn_forward of tokens [t0, t1) of value head j from the entering state `state` [dk, dv], which it
// updates to the leaving state; writes o rows t0 .. t1 - 1 of head j.
template <typename S>
void gdn_forward_segment(S* o, S* state, const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j,
                         int64_t t0, int64_t t1);
// The backward of gdn_forward_segment: tokens [t0, t1) of value head j entered with `state` (nullptr:
// 0); dstate in: dL/dS leaving the range, out: dL/dS entering it. dqn, dkn [T, Hv, dk]: the gradients
// w.r.t. q^, k^ of the range's rows (gdn_backward then sums them over a key head's value heads and
// applies the L2-norm backward); head j's v columns of dqkv, and dg, dbeta: the range's rows. All
// overwritten. gdn_backward runs it per (sample, head) from state 0 with dstate 0.
template <typename S>
void gdn_backward_segment(S* dqn, S* dkn, S* dqkv, S* dg, S* dbeta, S* dstate, const S* state, const S* d_o,
                          const S* qkv, const S* g, const S* beta, const GdnDims& dims, int64_t j, int64_t t0,
                          int64_t t1);
// dqkv[T, conv_dim], dg, dbeta [T,Hv]: all overwritten. Memory is O(T + chunk) states per
// (sample, head) task: states are checkpointed every 64 tokens and recomputed chunk by chunk.
template <typename S>
void gdn_backward(S* dqkv, S* dg, S* dbeta, const S* d_o, const S* qkv, const S* g, const S* beta,
                  const GdnDims& dims, int64_t T, const int32_t* cu, int num_seqs);

// Gated RMSNorm per row of cols (= per head over dv): y = w * x * rstd * silu(z), w [cols].
template <typename S>
void gated_rmsnorm_forward(S* y, S* rstd, const S* x, const S* z, const S* w, int64_t rows, int64_t cols,
                           double eps);
// dx, dz overwritten; dw[cols] += (may be nullptr).
template <typename S>
void gated_rmsnorm_backward(S* dx, S* dz, S* dw, const S* dy, const S* x, const S* z, const S* w, const S* rstd,
                            int64_t rows, int64_t cols);

// ---- gated full attention ------------------------------------------------------------------------
// qg[T, Hq*2D] (per head: D query dims, then D gate dims), kr[T, Hkv*D] -> q[T,Hq,D], k[T,Hkv,D]
// ((1+w) RMSNorm per head, then rotate-half RoPE of the first rotary_dim dims at positions[t]),
// gate[T, Hq*D], q_rstd[T*Hq], k_rstd[T*Hkv]. RoPE: inv_freq[i] = theta^(-2i/rotary_dim), angle =
// position * inv_freq[i], computed in double, for every S.
template <typename S>
void attn_prep_forward(S* q, S* k, S* gate, S* q_rstd, S* k_rstd, const S* qg, const S* kr, const S* q_norm_w,
                       const S* k_norm_w, const int32_t* positions, const AttnDims& dims, int64_t T, double eps);
// dqg, dkr overwritten; dq_norm_w, dk_norm_w [D] += (either may be nullptr).
template <typename S>
void attn_prep_backward(S* dqg, S* dkr, S* dq_norm_w, S* dk_norm_w, const S* dq, const S* dk, const S* dgate,
                        const S* qg, const S* kr, const S* q_norm_w, const S* k_norm_w, const S* q_rstd,
                        const S* k_rstd, const int32_t* positions, const AttnDims& dims, int64_t T);

// Causal GQA softmax attention per sample, scale D^-1/2; q,o [T,Hq,D]; k,v [T,Hkv,D]; lse [Hq,T].
template <typename S>
void attention_forward(S* o, S* lse, const S* q, const S* k, const S* v, const AttnDims& dims, int64_t T,
                       const int32_t* cu, int num_seqs);
// dq, dk, dv overwritten.
template <typename S>
void attention_backward(S* dq, S* dk, S* dv, const S* d_o, const S* q, const S* k, const S* v, const S* o,
                        const S* lse, const AttnDims& dims, int64_t T, const int32_t* cu, int num_seqs);

// y = o * sigmoid(gate) over n elements.
template <typename S>
void attn_gate_forward(S* y, const S* o, const S* gate, int64_t n);
template <typename S>
void attn_gate_backward(S* d_o, S* dgate, const S* dy, const S* o, const S* gate, int64_t n);

// ---- loss ----------------------------------------------------------------------------------------
// logits = hidden[T,H] w[V,H]^T, processed chunk_rows tokens at a time (never [T,V] at once);
// returns sum over targets != -100 of (logsumexp(logits_t) - logits_t[target_t]), accumulated in
// double. token_loss[T] (optional) gets each token's loss (0 when ignored). When dhidden (overwritten)
// or dw (+=) is given, they receive the gradient of grad_scale * loss. targets in [0,V) or -100.
template <typename S>
double linear_cross_entropy(S* dhidden, S* dw, S* token_loss, const S* hidden, const S* w, const int32_t* targets,
                            int64_t T, int64_t V, int64_t H, double grad_scale, int64_t chunk_rows);
// The chunk size linear_cross_entropy uses by default: about 8M logits per chunk.
int64_t cross_entropy_chunk_rows(int64_t V);

}  // namespace qt::ref
