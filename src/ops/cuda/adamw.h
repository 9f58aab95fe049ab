// Multi-tensor AdamW on the device: fp32 master weights, m and v; bf16 working weights written
// from the updated master; bf16 gradients. The update is bit-exact with ops/cpu/adamw.cpp's
// adamw_update applied to the clipped gradient float(g * clip) (same float operations in the same
// order, every one an explicitly rounded intrinsic, so nvcc cannot contract to FMA; the CPU side
// is compiled without FMA: x86-64 baseline, no -march, so g++'s default -ffp-contract=fast has no
// FMA instruction to contract into — verified: no vfmadd in its -O3 assembly).
// The global gradient norm is a deterministic two-pass reduction in double (per-chunk partials,
// then one block in a fixed order); the clip factor is computed on the device from it, so a step
// needs no host synchronization.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <cuda_runtime_api.h>

#include "ops/cpu/adamw.h"

namespace qt::cuda {

struct AdamWTensor {
  float* master;       // fp32 [n]
  float* m;            // fp32 [n]
  float* v;            // fp32 [n]
  const void* grad;    // bf16 [n], or f32 [n] with grad_f32
  void* param;         // bf16 [n], written (may be null: master only)
  int64_t n;
  bool decay;          // weight decay applies (matrices) or not (norms, A_log, dt_bias)
  bool grad_f32 = false;  // fp32 gradients (the model keeps them in fp32 so accumulation does not round)
  bool in_norm = true;    // counted in the gradient norm (a sharded job counts a replicated tensor on one rank)
};

class AdamWMultiTensor {
 public:
  // Uploads the tensor table and the block -> (tensor, chunk) map once (setup-time cudaMalloc).
  explicit AdamWMultiTensor(const std::vector<AdamWTensor>& tensors);
  ~AdamWMultiTensor();
  AdamWMultiTensor(const AdamWMultiTensor&) = delete;
  AdamWMultiTensor& operator=(const AdamWMultiTensor&) = delete;

  // Pass 1 + 2: d_norm_clip[0] = ||g||_2 over every tensor (double), d_norm_clip[1] = clip factor
  // (clip_factor(norm, max_norm) of optimizer.h). Enqueued on stream; nothing is synchronized.
  void grad_norm(double max_norm, cudaStream_t stream);
  // The update with the clip factor read from the device (after grad_norm) or, with
  // use_device_clip = false, the given host factor.
  void update(double lr, double weight_decay, const AdamWConfig& cfg, int64_t step, cudaStream_t stream,
              bool use_device_clip = true, double host_clip = 1.0);
  // Graph-ready form. set_step writes the step's hyper-parameters to page-locked host staging
  // (host only; the previous enqueue must have run); enqueue copies them to the device and
  // enqueues norm, clip and update, so a captured enqueue reads each replay's values. The
  // gradients are taken as grad_mult * g (norm, clipping and update); a non-finite norm skips the
  // update, leaving weights and moments untouched.
  void set_step(double lr, double weight_decay, const AdamWConfig& cfg, int64_t step, double grad_mult);
  void enqueue(double max_norm, cudaStream_t stream);
  // Sharded jobs: called on the stream between the local sum of squares (one double on the device)
  // and the norm taken from it, to sum it over the ranks (e.g. a captured NCCL all-reduce).
  void set_sumsq_reducer(std::function<void(double* sumsq, cudaStream_t stream)> reducer) {
    reducer_ = std::move(reducer);
  }
  // Device pointer to {norm, clip} (2 doubles).
  const double* norm_clip() const { return norm_clip_; }
  int64_t num_chunks() const { return num_chunks_; }
  int64_t total_elements() const { return total_; }

 private:
  void norm_pass(double max_norm, const void* hyper, cudaStream_t stream);
  void update_pass(const void* hyper, cudaStream_t stream);

  void* table_ = nullptr;      // device: tensors then chunk map
  void* hyper_dev_ = nullptr;  // device: 2 hyper-parameter records (eager calls, staged steps)
  void* hyper_host_ = nullptr; // page-locked: the staged record
  double* partials_ = nullptr;  // device [num_chunks]
  double* norm_clip_ = nullptr; // device [2]
  int64_t num_tensors_ = 0, num_chunks_ = 0, total_ = 0;
  std::function<void(double*, cudaStream_t)> reducer_;
};

}  // namespace qt::cuda
