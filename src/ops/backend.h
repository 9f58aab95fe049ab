// The Backend interface: memory plus the op set the Qwen3.5 model is written against (once).
// CpuBackend (ops/cpu) is the fp32 reference; the CUDA backend implements the same calls with bf16
// storage and fused kernels. Every op's math is defined in QWEN35_SPEC.md sections 3-6.
//
// Layout conventions: every tensor is contiguous, token-major ([T, ...], T = tokens in the packed
// row). Activations use activation_dtype(); gate/statistics tensors marked f32 are always f32.
// "acc" gradients are accumulated into (+=); all other outputs are overwritten.
// Optional outputs are passed as a Tensor with data == nullptr.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/tensor.h"
#include "ops/gdn_keep.h"

namespace qt {

// Packed-row sequence boundaries. cu_seqlens: i32 [num_seqs + 1], cu[0] = 0, cu[num_seqs] = T,
// on the backend's device. A sample never sees another's tokens in any op that mixes tokens.
struct SeqInfo {
  Tensor cu_seqlens;
  int num_seqs = 0;
  int max_seqlen = 0;
  int total_tokens = 0;
};

// Gated DeltaNet dimensions (one layer).
struct GdnDims {
  int64_t num_k_heads, num_v_heads, k_head_dim, v_head_dim;
  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Full-attention dimensions (one layer).
struct AttnDims {
  int64_t num_q_heads, num_kv_heads, head_dim, rotary_dim;
  double rope_theta;
};

// One LoRA adapter on a projection of weight W [N, K] (model/lora.h): y = x W^T + scale * (x A^T) B^T.
struct LoraArgs {
  Tensor a;  // [r, K], working-weight dtype
  Tensor b;  // [N, r]
  double scale = 1.0;
};
// The adapter's gradients: written by the first backward of a step, accumulated after (accumulate).
struct LoraGrads {
  Tensor da, db;  // [r, K], [N, r]: f32 (or the working dtype)
  bool accumulate = false;
};

// Dropout (ops/dropout_hash.h): seed is i32 [2] (low, high words) in the backend's memory, so a
// captured step reads each replay's seed; stream separates the masks of one step's call sites.
struct DropoutArgs {
  Tensor seed;
  uint32_t stream = 0;
  double p = 0.0;  // in [0, 1)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  virtual DType activation_dtype() const = 0;  // f32 on the CPU reference, bf16 on CUDA

  // Memory: tensors live until the backend is destroyed (CPU) or its arena is reset.
  virtual Tensor alloc(DType dtype, const Shape& shape) = 0;
  virtual void zero(const Tensor& t) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;             // same dtype and numel
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;     // nbytes of dst
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b (out may alias a or b)
  // Zero-filled host memory the device copies from and to asynchronously (page-locked on CUDA),
  // valid until the backend is destroyed. A copy from it may be captured into a CUDA graph: the
  // replay reads whatever the host wrote there before the launch.
  virtual void* alloc_host(size_t bytes) = 0;
  // Device-to-host copy into memory from alloc_host without waiting (capturable): the data is
  // there once synchronize() returns.
  virtual void copy_to_host_async(void* dst, const Tensor& src) = 0;
  virtual void synchronize() = 0;  // waits for everything enqueued so far
  // Free device memory in bytes, or -1 where tensors live in host memory (nothing to plan against).
  virtual int64_t free_memory_bytes() const { return -1; }
  // Device memory the fused cross-entropy may hold for one chunk of logits (bytes; 0 = the
  // backend's default). More rows per chunk mean fewer passes of the dW GEMM over its fp32 output.
  virtual void set_loss_chunk_budget(int64_t /*bytes*/) {}
  // Bitwise reproducible steps where the backend has a faster non-deterministic path (CUDA: the
  // attention backward's dQ without fp32 atomics). The CPU reference is deterministic already.
  virtual void set_deterministic(bool /*on*/) {}

  // ---- dense ---------------------------------------------------------------------------------
  // y[T,N] = x[T,K] W[N,K]^T.
  virtual void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) = 0;
  // dx[T,K] (= or += per accumulate_dx; optional) = dy W ; dw[N,K] (= or += per accumulate_dw;
  // optional) = dy^T x. Writing dw (the first contribution of a step) spares zeroing the gradient
  // and reading it back.
  virtual void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, bool accumulate_dx, bool accumulate_dw) = 0;

  // LoRA on a projection whose output y[T,N] the base GEMM wrote: t[T,r] = scale * x[T,K] A^T (kept
  // for the backward), y += t B^T.
  virtual void lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) = 0;
  // Its backward: dB (= or +=) dy^T t; dt[T,r] = scale * dy B (scratch); dA (= or +=) dt^T x;
  // dx[T,K] += dt A (dx already holds dy W from the frozen base, or is optional).
  virtual void lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy,
                             const Tensor& x, const Tensor& t, const LoraArgs& lora) = 0;

  // out (= or += per accumulate) x * keep / (1 - p), keep from dropout_keep(seed, stream, element).
  virtual void dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) = 0;

  // out[T,H] = table[ids[t]]. ids: i32 [T].
  virtual void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // dtable[V,H] acc += scatter of dout by ids.
  virtual void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) = 0;

  // (1+w) RMSNorm over the last dim: y = x * rstd * (1 + w); rstd f32 [rows].
  virtual void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                               double eps) = 0;
  // Residual add fused with (1+w) RMSNorm: h = x + r (stored in the activation dtype), then y and
  // rstd as rmsnorm_forward(y, rstd, h, w, eps). h may alias x or r. The default runs the two ops.
  virtual void add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x,
                                   const Tensor& r, const Tensor& w, double eps) {
    add(h, x, r);
    rmsnorm_forward(y, rstd, h, w, eps);
  }
  // dx (= or += per accumulate_dx), dw acc.
  virtual void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                const Tensor& w, const Tensor& rstd, bool accumulate_dx) = 0;

  // SwiGLU: h = silu(gate) * up, all [T, I].
  virtual void swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up) = 0;
  virtual void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                               const Tensor& up) = 0;

  // ---- Gated DeltaNet ------------------------------------------------------------------------
  // Causal depthwise conv over time + SiLU, channel-last: y[T,C] from x[T,C], w[C,K]; a sample's
  // first K-1 tokens see zeros, never the previous sample.
  virtual void conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) = 0;
  // dx[T,C] (overwritten), dw[C,K] acc.
  virtual void conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                    const Tensor& w, const SeqInfo& seqs) = 0;

  // beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias). b, a: [T,Hv]; beta, g: f32 [T,Hv].
  virtual void gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                                 const Tensor& a_log, const Tensor& dt_bias) = 0;
  // db, da overwritten; da_log, ddt_bias acc (f32 math, stored in their dtypes).
  virtual void gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log, const Tensor& ddt_bias,
                                  const Tensor& dbeta, const Tensor& dg, const Tensor& b, const Tensor& a,
                                  const Tensor& a_log, const Tensor& dt_bias) = 0;

  // The gated delta rule over qkv[T, conv_dim] = [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)] (the conv
  // output): q, k L2-normalized inside (eps 1e-6), q scaled by dk^-1/2, value head j reads key
  // head j / (Hv/Hk); state reset at every sample start. o: [T, Hv, dv].
  // `state` (optional; an empty Tensor for none) keeps the forward's internal state for the backward
  // instead of recomputing it there, as much as `keep` names (ops/gdn_keep.h: States, everything;
  // Prep, prep's results only, a seventh of that): gdn_state_bytes is its size for a row of `tokens`
  // tokens and at most `num_seqs` samples (0: the backend recomputes that part and ignores `state`,
  // as the CPU reference does); the forward writes it (u8, at least that size), the backward reads
  // it (same inputs and `keep` as that forward).
  virtual int64_t gdn_state_bytes(const GdnDims& /*dims*/, int64_t /*tokens*/, int /*num_seqs*/,
                                  GdnKeep /*keep*/) const {
    return 0;
  }
  // The shortest sample (tokens) that gdn_forward may split across parallel scan pieces in a row of
  // `tokens` tokens and at most `num_seqs` samples: a call whose SeqInfo::max_seqlen is below it
  // runs the unsplit kernels (the split's ticket walk costs a row of short samples a few %), so a
  // caller with static shapes can pass that smaller bound for rows of short samples. INT_MAX: never.
  // Whether the backward from prep's results alone (GdnKeep::Prep: it recomputes the chunk states) is
  // as fast here as the one from kept chunk states (GdnKeep::States), so that a policy able to keep
  // either keeps the seventh (gdn_keep_for). false: keep the states where that pays.
  virtual bool gdn_prefers_prep(const GdnDims& /*dims*/) const { return false; }
  virtual int gdn_split_seqlen(const GdnDims& /*dims*/, int64_t /*tokens*/, int /*num_seqs*/) const {
    return std::numeric_limits<int>::max();
  }
  virtual void gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                           const GdnDims& dims, const SeqInfo& seqs, const Tensor& state, GdnKeep keep) = 0;
  // dqkv [T, conv_dim], dg, dbeta f32 [T,Hv]: all overwritten.
  virtual void gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o,
                            const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                            const SeqInfo& seqs, const Tensor& state, GdnKeep keep) = 0;

  // Gated RMSNorm per head: y = (w * x * rstd) * silu(z); x, z, y: [T, Hv, dv]; w: [dv]; rstd f32 [T*Hv].
  virtual void gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z,
                                     const Tensor& w, double eps) = 0;
  // dx, dz overwritten; dw acc.
  virtual void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                      const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& rstd) = 0;

  // ---- gated full attention ------------------------------------------------------------------
  // From q_proj output qg[T, Hq*2D] (per head: D query dims then D gate dims) and k_proj output
  // kr[T, Hkv*D]: q = RoPE(RMSNorm_{1+qw}(query)), k = RoPE(RMSNorm_{1+kw}(kr)), gate = the gate
  // half as [T, Hq*D]. RoPE rotates the first rotary_dim dims (rotate-half) at positions[t] (i32 [T]).
  // q_rstd f32 [T*Hq], k_rstd f32 [T*Hkv].
  virtual void attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                                 const Tensor& k_rstd, const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                                 const Tensor& k_norm_w, const Tensor& positions, const AttnDims& dims,
                                 double eps) = 0;
  // dqg [T, Hq*2D] (query and gate halves), dkr overwritten; dq_norm_w, dk_norm_w acc.
  virtual void attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w,
                                  const Tensor& dk_norm_w, const Tensor& dq, const Tensor& dk, const Tensor& dgate,
                                  const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w, const Tensor& k_norm_w,
                                  const Tensor& q_rstd, const Tensor& k_rstd, const Tensor& positions,
                                  const AttnDims& dims) = 0;

  // Causal softmax attention per sample, GQA (query head h reads kv head h / (Hq/Hkv)), scale
  // D^-1/2. q, o: [T, Hq, D]; k, v: [T, Hkv, D]; lse f32 [Hq, T] (log-sum-exp, saved for backward).
  virtual void attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const AttnDims& dims, const SeqInfo& seqs) = 0;
  // dq, dk, dv overwritten.
  virtual void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o,
                                  const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                  const Tensor& lse, const AttnDims& dims, const SeqInfo& seqs) = 0;

  // y = o * sigmoid(gate), all [T, Hq*D].
  virtual void attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) = 0;
  virtual void attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                                  const Tensor& gate) = 0;

  // ---- loss ----------------------------------------------------------------------------------
  // Fused lm_head + cross-entropy (fp32 softmax over all V logits, never materializing [T, V] at
  // once where the backend can avoid it). targets: i32 [T], -100 = ignored. Returns the SUM of
  // per-token losses over non-ignored targets. When dhidden / dw are given (optional), writes
  // dhidden[T,H] (overwritten) and dw[V,H] (= or += per accumulate_dw) for the loss scaled by
  // grad_scale.
  // token_loss (optional): f32 [T], 0 for ignored targets.
  virtual double linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss,
                                      const Tensor& hidden, const Tensor& w, const Tensor& targets,
                                      double grad_scale, bool accumulate_dw) = 0;
  // The same, writing the loss sum to loss_sum (f64 [1] on the backend's device) instead of
  // returning it. CUDA does not synchronize here, so a step built from it can be captured in a
  // graph; the default (CPU) computes it eagerly.
  virtual void linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                       const Tensor& token_loss, const Tensor& hidden, const Tensor& w,
                                       const Tensor& targets, double grad_scale, bool accumulate_dw) {
    const double sum = linear_cross_entropy(dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
    copy_from_host(loss_sum, &sum);
  }
};

}  // namespace qt
