// Random initialization as transformers does it for Qwen3.5: Normal(0, initializer_range) for
// linear, conv and embedding weights; zeros for (1+w) norms; ones for the gated norm and dt_bias;
// A_log = log U(0.01, 16). Counter-based RNG: the value of element i depends only on
// (seed, tensor name, i), so results do not depend on the thread count.
#pragma once
#include <cstdint>

#include "model/params.h"

namespace qt {

// Fills dst (numel elements of dtype) for parameter p.
void init_param(const ParamSpec& p, double std, uint64_t seed, DType dtype, void* dst);

}  // namespace qt
