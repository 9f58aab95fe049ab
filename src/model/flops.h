// FLOP counts for MFU: the dense 6 * parameters * tokens rule, and the token-mixing FLOPs it
// leaves out (causal attention per sample, the chunked gated delta rule: docs/attention_kernels.md section 6,
// docs/gdn_kernels.md section 2.4).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "model/config.h"

namespace qt {

// Forward + backward FLOPs of one training step over samples of the given lengths.
struct StepFlops {
  double dense = 0;     // 6 * params * tokens
  double attention = 0; // causal attention, fwd (2 L^2 D Hq per layer) + bwd (2.5x fwd)
  double gdn = 0;       // chunked gated delta rule fwd + bwd (C = 64)
  double total() const { return dense + attention + gdn; }
};

// The bf16 dense matmul rate MFU is measured against: the H200's, as measured (cuBLASLt
// 8192^3 on random data, ~790 TFLOP/s); the one place this number lives.
inline constexpr double kPeakBf16FlopsPerSecond = 790e12;
// Model FLOPs utilization of a dense 6 * params * tokens/s rate.
inline double dense_mfu(int64_t params, double tokens_per_second) {
  return 6.0 * double(params) * tokens_per_second / kPeakBf16FlopsPerSecond;
}

// Chat-like sample lengths (log-normal around ~700 tokens, 32..3000) filling `total` exactly: the
// mix `qwentune bench` trains on and `qwentune plan` estimates with.
std::vector<int64_t> chat_like_lengths(int64_t total, std::mt19937_64& rng);

StepFlops step_flops(const ModelConfig& cfg, const std::vector<int64_t>& sample_lengths);

}  // namespace qt
