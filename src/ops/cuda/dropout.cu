// Dropout (LoRA's adapter input): out (= or +=) x * keep / (1 - p), the mask from
// ops/dropout_hash.h, the seed read from device memory so a captured step draws a new mask at
// every replay. Memory-bound: 8 bf16 (16 bytes) a thread per access.
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/ops_launch.h"
#include "ops/dropout_hash.h"

namespace qt::cuda {
namespace {

using dev::bf16;

struct DropoutParams {
  bf16* out;
  const bf16* x;
  const int32_t* seed;  // [2]: low, high words
  int64_t n;
  uint32_t stream, threshold;
  float scale;
  bool accumulate;
};

template <int VEC>
__global__ void dropout_kernel(DropoutParams p) {
  const uint64_t seed = (uint64_t(uint32_t(p.seed[1])) << 32) | uint32_t(p.seed[0]);
  const int64_t nvec = p.n / VEC;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < nvec; v += int64_t(gridDim.x) * blockDim.x) {
    float x[VEC], o[VEC];
    dev::load_vec<VEC>(x, p.x, v);
    if (p.accumulate) dev::load_vec<VEC>(o, p.out, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = dropout_keep(seed, p.stream, uint64_t(v * VEC + k), p.threshold) ? x[k] * p.scale : 0.0f;
      o[k] = p.accumulate ? o[k] + d : d;
    }
    dev::store_vec<VEC>(p.out, v, o);
  }
}

}  // namespace

void launch_dropout(void* out, const void* x, const int32_t* seed, int64_t n, uint32_t stream, double p_drop,
                    bool accumulate, cudaStream_t s) {
  if (n <= 0) return;
  const DropoutParams p{static_cast<bf16*>(out), static_cast<const bf16*>(x), seed, n, stream,
                        dropout_threshold(p_drop), float(1.0 / (1.0 - p_drop)), accumulate};
  constexpr int kThreads = 256;
  if (n % 8 == 0 && aligned16(out) && aligned16(x))
    dropout_kernel<8><<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(p);
  else
    dropout_kernel<1><<<grid_for(n, kThreads), kThreads, 0, s>>>(p);
  QT_LAUNCH_CHECK("dropout");
}

}  // namespace qt::cuda
