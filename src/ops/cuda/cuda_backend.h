// CudaBackend: qt::Backend on one CUDA device. Activations, weights and their gradients are bf16
// (fp32 accumulation inside every kernel); the statistics tensors backend.h marks f32 (rstd, lse,
// beta, g, dbeta, dg, token_loss) are f32; ids, targets, positions and cu_seqlens are i32 device
// tensors. Weight-gradient ("acc") outputs may be bf16 or f32.
//
// Memory: alloc() bump-allocates zero-filled tensors from a device arena grown in large blocks
// (QT_CUDA_ARENA_MB, default 1024 MiB per block; one cudaMalloc per tensor only for tensors above a
// quarter block, which would otherwise strand block tails); reset_arena() frees every tensor at once. Scratch for GEMMs (a fixed 32 MiB cuBLASLt workspace), the
// cross-entropy chunks, weight-gradient partial sums and the GDN / attention kernels comes from
// one backend-owned workspace, grown only outside CUDA-graph capture. Every op is enqueued on the
// backend's stream; copy_to_host and linear_cross_entropy synchronize it (linear_cross_entropy_to
// does not, so a whole training step can be captured in a CUDA graph).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

#include "ops/backend.h"

namespace qt {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda(device_); }
  const char* name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }

  Tensor alloc(DType dtype, const Shape& shape) override;
  void* alloc_host(size_t bytes) override;  // cudaHostAlloc (page-locked)
  void copy_to_host_async(void* dst, const Tensor& src) override;
  int64_t free_memory_bytes() const override;  // cudaMemGetInfo (the arena's unused tail not counted)
  void set_loss_chunk_budget(int64_t bytes) override { ce_budget_bytes_ = bytes; }
  void zero(const Tensor& t) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;

  void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) override;
  void lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) override;
  void dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) override;
  void lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy, const Tensor& x,
                     const Tensor& t, const LoraArgs& lora) override;
  void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       bool accumulate_dx, bool accumulate_dw) override;
  void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override;
  void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) override;
  void add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& r,
                           const Tensor& w, double eps) override;
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& rstd, bool accumulate_dx) override;
  void swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                       const Tensor& up) override;

  void conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) override;
  void conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const SeqInfo& seqs) override;
  void gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a, const Tensor& a_log,
                         const Tensor& dt_bias) override;
  void gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log, const Tensor& ddt_bias,
                          const Tensor& dbeta, const Tensor& dg, const Tensor& b, const Tensor& a, const Tensor& a_log,
                          const Tensor& dt_bias) override;
  void gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                   const SeqInfo& seqs, const Tensor& state, GdnKeep keep) override;
  void gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o, const Tensor& qkv,
                    const Tensor& g, const Tensor& beta, const GdnDims& dims, const SeqInfo& seqs,
                    const Tensor& state, GdnKeep keep) override;
  int64_t gdn_state_bytes(const GdnDims& dims, int64_t tokens, int num_seqs, GdnKeep keep) const override;
  int gdn_split_seqlen(const GdnDims& dims, int64_t tokens, int num_seqs) const override;
  bool gdn_prefers_prep(const GdnDims& dims) const override;
  void gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w,
                             double eps) override;
  void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& z, const Tensor& w, const Tensor& rstd) override;

  void attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                         const Tensor& k_rstd, const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                         const Tensor& k_norm_w, const Tensor& positions, const AttnDims& dims, double eps) override;
  void attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w, const Tensor& dk_norm_w,
                          const Tensor& dq, const Tensor& dk, const Tensor& dgate, const Tensor& qg, const Tensor& kr,
                          const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& q_rstd, const Tensor& k_rstd,
                          const Tensor& positions, const AttnDims& dims) override;
  void attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttnDims& dims, const SeqInfo& seqs) override;
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const AttnDims& dims,
                          const SeqInfo& seqs) override;
  void attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) override;
  void attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                          const Tensor& gate) override;

  double linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss, const Tensor& hidden,
                              const Tensor& w, const Tensor& targets, double grad_scale, bool accumulate_dw) override;
  void linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                               const Tensor& token_loss, const Tensor& hidden, const Tensor& w, const Tensor& targets,
                               double grad_scale, bool accumulate_dw) override;

  // Tokens per logits chunk in linear_cross_entropy; 0 (default) picks the largest multiple of
  // 128 rows whose fp32 logits fit in the loss chunk budget (default 1000 MiB: 1024 rows at
  // V = 248320).
  void set_cross_entropy_chunk_rows(int64_t rows) { ce_chunk_rows_ = rows; }
  // GEMM tuning (default on; QT_GEMM_TUNE=0 in the environment turns it off): a new plan's first
  // beta = 0 call times cuBLASLt's heuristic candidates and keeps the fastest that writes the same
  // bits as the first candidate. Affects plans made after the call.
  void set_gemm_tuning(bool on) { gemm_tune_ = on; }
  // The attention backward's dQ from its own kernel instead of fp32 atomics: bitwise reproducible
  // steps (and so exactly resumable runs) at ~1.4x the backward's MMA work, which measured within
  // noise end to end (notes/attention_kernels.md). On by default; QT_ATTN_DETERMINISTIC=0 in the
  // environment or set_deterministic(false) (train.deterministic: false) turns it off.
  void set_deterministic(bool on) override { deterministic_attention_ = on; }
  int64_t cross_entropy_chunk_rows(int64_t V, int64_t T) const;
  // Scratch bytes linear_cross_entropy needs for V and T tokens (its peak extra device memory).
  size_t cross_entropy_workspace_bytes(int64_t V, int64_t T) const;

  cudaStream_t stream() const { return stream_; }
  void synchronize() override;
  // Frees every tensor alloc() handed out (the blocks are kept for reuse).
  void reset_arena();
  size_t arena_bytes_reserved() const;
  size_t workspace_bytes() const { return ws_bytes_; }
  // Bumped whenever the workspace is reallocated: a CUDA graph captured before holds the old
  // address and must be captured again.
  uint64_t workspace_generation() const { return ws_generation_; }

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

  struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // Heuristic candidates (best first) while the plan waits to be timed; empty once settled.
    std::vector<cublasLtMatmulAlgo_t> candidates;
  };
  static constexpr int kGemmMaxCandidates = 64;
  // Heuristic candidates a new plan's tuning times (QT_GEMM_CANDIDATES, 1..64): 32 found faster
  // bit-identical algorithms than 8 (4b +0.8 %, notes/train_step.md).
  int gemm_candidates_ = 32;
  bool capturing() const;  // the stream is being captured into a CUDA graph
  void alloc_scalars();
  void tune_gemm(GemmPlan& p, const void* A, const void* B, void* C, size_t c_bytes);
  using GemmKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int, int, int>;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::map<GemmKey, GemmPlan> gemm_plans_;
  void* gemm_ws_ = nullptr;
  size_t gemm_ws_bytes_ = 0;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  uint64_t ws_generation_ = 0;
  struct Block {
    char* base;
    size_t size;
  };
  std::vector<Block> blocks_;
  std::vector<void*> host_blocks_;  // alloc_host
  std::vector<void*> dedicated_;    // tensors larger than a quarter block, one cudaMalloc each
  size_t dedicated_bytes_ = 0;
  size_t block_index_ = 0, block_used_ = 0;
  size_t block_bytes_ = 0;
  double* d_scalar_ = nullptr;  // device double for the loss sum
  unsigned long long* d_hash_ = nullptr;  // tune_gemm's output hash
  bool gemm_tune_ = true;
  bool deterministic_attention_ = true;
  bool mma_sync_attention_ = false;  // QT_ATTN_WGMMA=0: head_dim 256 attention on the mma.sync kernels
  int64_t ce_chunk_rows_ = 0;
  int64_t ce_budget_bytes_ = 0;
};

}  // namespace qt
