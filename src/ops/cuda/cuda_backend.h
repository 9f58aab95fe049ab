// CudaBackend: qt::Backend on one CUDA device. Activations, weights and their gradients are bf16
// (fp32 accumulation inside every kernel); the statistics tensors backend.h marks f32 (rstd, lse,
// beta, g, dbeta, dg, token_loss) are f32; ids, targets, positions and cu_seqlens are i32 device
// tensors. Weight-gradient ("acc") outputs may be bf16 or f32.
//
// Memory: alloc() takes zero-filled tensors from a DeviceArena (cuda_arena.h; blocks of
// BackendOptions::arena_mib, train.cuda.arena_mib: 1024 MiB by default); reset_arena() frees every
// tensor at once. GEMMs run through a GemmRunner (cuda_gemm.h, its own 32 MiB cuBLASLt workspace).
// Scratch for the cross-entropy chunks, weight-gradient partial sums and the GDN / attention kernels
// comes from one backend-owned workspace, grown only outside CUDA-graph capture. Every op is enqueued on the
// backend's stream; copy_to_host and linear_cross_entropy synchronize it (linear_cross_entropy_to
// does not, so a whole training step can be captured in a CUDA graph).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "ops/backend.h"
#include "ops/cuda/cuda_arena.h"
#include "ops/cuda/cuda_gemm.h"

namespace qt {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda(device_); }
  const char* name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }

  // The ops of ops/backend_ops.def, the defaulted ones fused.
#define QT_OP(ret, name, params, args, launches) ret name params override;
#include "ops/backend_ops.def"
  void* alloc_host(size_t bytes) override;  // cudaHostAlloc (page-locked)
  void copy_to_host_async(void* dst, const Tensor& src) override;
  int64_t free_memory_bytes() const override;  // cudaMemGetInfo (the arena's unused tail not counted)
  void set_loss_chunk_budget(int64_t bytes) override { ce_budget_bytes_ = bytes; }

  int64_t gdn_state_bytes(const GdnDims& dims, int64_t tokens, int num_seqs, GdnKeep keep) const override;
  int gdn_split_seqlen(const GdnDims& dims, int64_t tokens, int num_seqs) const override;
  bool gdn_prefers_prep(const GdnDims& dims) const override;

  // Tokens per logits chunk in linear_cross_entropy; 0 (default) picks the largest multiple of
  // 128 rows whose fp32 logits fit in the loss chunk budget (default 1000 MiB: 1024 rows at
  // V = 248320).
  void set_cross_entropy_chunk_rows(int64_t rows) { ce_chunk_rows_ = rows; }
  // GEMM tuning (BackendOptions::gemm_tune, train.cuda.gemm_tune; default on): a new plan's first
  // beta = 0 call times cuBLASLt's heuristic candidates and keeps the fastest that writes the same
  // bits as the first candidate. Affects plans made after the call.
  void set_gemm_tuning(bool on) { gemm_.set_tuning(on); }
  // The attention backward's dQ from its own kernel instead of fp32 atomics: bitwise reproducible
  // steps (and so exactly resumable runs) at ~1.4x the backward's MMA work, which measured within
  // noise end to end (docs/attention_kernels.md section 5). On by default; set_deterministic(false)
  // (train.deterministic: false) turns it off.
  void set_deterministic(bool on) override { deterministic_attention_ = on; }
  int64_t cross_entropy_chunk_rows(int64_t V, int64_t T) const;
  // Scratch bytes linear_cross_entropy needs for V and T tokens (its peak extra device memory).
  size_t cross_entropy_workspace_bytes(int64_t V, int64_t T) const;

  cudaStream_t stream() const { return stream_; }
  void synchronize() override;
  // Frees every tensor alloc() handed out (the blocks are kept for reuse).
  void reset_arena();
  size_t arena_bytes_reserved() const;
  int64_t workspace_bytes() const override { return static_cast<int64_t>(ws_bytes_); }
  int64_t device_memory_used_bytes() const override;  // cudaMemGetInfo: total - free
  std::unique_ptr<CapturedStep> make_captured_step() override;  // a CUDA graph of the stream's work
  std::unique_ptr<FusedAdamW> make_fused_adamw(const std::vector<FusedAdamWTensor>& tensors) override;
  // Bumped whenever the workspace is reallocated: a CUDA graph captured before holds the old
  // address and must be captured again.
  uint64_t workspace_generation() const override { return ws_generation_; }

  // Row-major C[M,N] (=, or += when beta == 1) alpha op(A) op(B) with bf16 A, B, fp32 accumulation and a
  // bf16 or f32 C. op(A) is [M,K] (A stored [K,M] when trans_a), op(B) is [K,N] (B stored [N,K]
  // when trans_b); ld* are the stored row strides in elements. cuBLASLt algorithm cached per shape.
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
            int64_t ldb, void* C, int64_t ldc, bool c_f32, float beta, float alpha = 1.0f);

 private:
  void* workspace(size_t bytes);  // the shared scratch, grown (outside graph capture) to >= bytes
  // Enqueues the chunked cross-entropy; its loss sum goes to sum_dst (a device double).
  void enqueue_cross_entropy(double* sum_dst, const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss,
                             const Tensor& hidden, const Tensor& w, const Tensor& targets, double grad_scale,
                             bool accumulate_dw);

  bool capturing() const;  // the stream is being captured into a CUDA graph
  void alloc_scalars();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena arena_;
  cuda::GemmRunner gemm_;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  uint64_t ws_generation_ = 0;
  double* d_scalar_ = nullptr;  // device double for the loss sum
  unsigned* fp8_words_ = nullptr;  // quantize_fp8's amax word and block counter
  float* fp8_one_ = nullptr;       // 1.0f: the scale word of linear_cross_entropy_fp8's e5m2 codes
  bool deterministic_attention_ = true;
  int64_t ce_chunk_rows_ = 0;
  int64_t ce_budget_bytes_ = 0;
};

}  // namespace qt
