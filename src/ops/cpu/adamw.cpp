#include "ops/cpu/adamw.h"

#include <cmath>

namespace qt {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr, double weight_decay,
                  const AdamWConfig& cfg, int64_t step) {
  const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
  const float lr_f = static_cast<float>(lr), wd = static_cast<float>(weight_decay), eps = static_cast<float>(cfg.eps);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= lr_f * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

double global_grad_norm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes) {
  double sq = 0;
  for (size_t t = 0; t < grads.size(); ++t)
    for (int64_t i = 0; i < sizes[t]; ++i) sq += static_cast<double>(grads[t][i]) * grads[t][i];
  return std::sqrt(sq);
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace qt
