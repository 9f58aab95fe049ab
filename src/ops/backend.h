// The Backend interface: memory plus the op set the Qwen3.5 model is written against (once).
// CpuBackend (ops/cpu) is the fp32 reference; the CUDA backend implements the same calls with bf16
// storage and fused kernels. The ops are listed once in ops/backend_ops.def; their math is
// docs/model_spec.md sections 3-6.
//
// Layout conventions: every tensor is contiguous, token-major ([T, ...], T = tokens in the packed
// row). Activations use activation_dtype(); gate/statistics tensors marked f32 are always f32.
// "acc" gradients are accumulated into (+=); all other outputs are overwritten.
// Optional outputs are passed as a Tensor with data == nullptr.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/gdn_keep.h"
#include "ops/step_runtime.h"

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
// The FP8 LM head's operands (linear_cross_entropy_fp8): e4m3 codes of the final hidden states and
// of the head weight, each in both K-major layouts its three products read, one scale word each
// (f32 [1] = 1 / s, 16-byte aligned: quantize_fp8's outputs).
struct Fp8HeadCodes {
  Tensor hq, hq_t, h_scale_inv;  // [T, H]; [H, Tp], Tp = T rounded up to 16, zero codes past T
  Tensor wq, wq_t, w_scale_inv;  // [V, H]; [H, V]
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

// How a backend is set up (the train.cuda config keys and train.deterministic); the CPU reference
// needs none of it.
struct BackendOptions {
  int device = 0;               // CUDA device ordinal
  bool share_devices = false;   // device modulo the device count (ranks on the MPI communicator may share a GPU)
  bool gemm_tune = true;        // time cuBLASLt's candidates per GEMM shape, keep the fastest bit-identical one
  int gemm_candidates = 32;     // candidates timed per shape, 1..64
  int64_t arena_mib = 1024;     // device arena block (MiB, >= 16)
  bool deterministic = true;    // bitwise reproducible steps (Backend::set_deterministic)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  virtual DType activation_dtype() const = 0;  // f32 on the CPU reference, bf16 on CUDA

  // The ops (ops/backend_ops.def: every op once, with its semantics).
#define QT_OP(ret, name, params, args, launches) virtual ret name params = 0;
#define QT_OP_DEFAULTED(ret, name, params, args, launches) virtual ret name params;
#include "ops/backend_ops.def"

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

  // ---- Gated DeltaNet queries (the model plans its buffers and policies by them) ---------------
  // Bytes of gdn_forward's kept `state` for a row of `tokens` tokens and at most `num_seqs` samples,
  // keeping what `keep` names; 0: the backend always recomputes (the CPU reference).
  virtual int64_t gdn_state_bytes(const GdnDims& /*dims*/, int64_t /*tokens*/, int /*num_seqs*/,
                                  GdnKeep /*keep*/) const {
    return 0;
  }
  // Whether the backward from prep's results alone (GdnKeep::Prep: it recomputes the chunk states) is
  // as fast here as the one from kept chunk states (GdnKeep::States), so that a policy able to keep
  // either keeps the seventh (gdn_keep_for). false: keep the states where that pays.
  virtual bool gdn_prefers_prep(const GdnDims& /*dims*/) const { return false; }
  // The shortest sample (tokens) that gdn_forward may split across parallel scan pieces in a row of
  // `tokens` tokens and at most `num_seqs` samples: a call whose SeqInfo::max_seqlen is below it
  // runs the unsplit kernels (the split's ticket walk costs a row of short samples a few %), so a
  // caller with static shapes can pass that smaller bound for rows of short samples. INT_MAX: never.
  virtual int gdn_split_seqlen(const GdnDims& /*dims*/, int64_t /*tokens*/, int /*num_seqs*/) const {
    return std::numeric_limits<int>::max();
  }

  // ---- the step's runtime (ops/step_runtime.h); nullptr / 0 where the backend has none ---------
  virtual std::unique_ptr<CapturedStep> make_captured_step() { return nullptr; }
  virtual std::unique_ptr<FusedAdamW> make_fused_adamw(const std::vector<FusedAdamWTensor>& /*tensors*/) {
    return nullptr;
  }
  // Bumped whenever the backend's scratch memory moves: a step captured before holds the old
  // address and must be captured again.
  virtual uint64_t workspace_generation() const { return 0; }
  virtual int64_t workspace_bytes() const { return 0; }
  // Device memory in use (bytes, the whole device as the driver sees it); -1 off a device.
  virtual int64_t device_memory_used_bytes() const { return -1; }
};

}  // namespace qt
