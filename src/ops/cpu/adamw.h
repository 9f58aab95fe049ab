// AdamW with decoupled weight decay and bias correction, on fp32 host arrays: the CPU backend's
// optimizer and the reference the fused CUDA one (ops/cuda/adamw.h) must match bit-for-bit: one
// fixed order of float operations per element, no reductions.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/adamw_config.h"

namespace qt {

// One parameter tensor's optimizer state.
struct AdamWState {
  std::vector<float> m, v;
  bool decay = true;  // matrices decay; norms, A_log, dt_bias (1-D) do not
};

// p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p), with m, v updated from g first.
// step is 1-based. g is read only.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr, double weight_decay,
                  const AdamWConfig& cfg, int64_t step);

// Global L2 norm over several gradient arrays (double accumulation, fixed order).
double global_grad_norm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes);

// Clip factor for max_norm (1 when the norm is within it or max_norm <= 0).
double clip_factor(double norm, double max_norm);

}  // namespace qt
