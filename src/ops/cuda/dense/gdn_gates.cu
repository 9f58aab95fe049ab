// CudaBackend kernels: the GDN gates beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
// (forward / backward, the A_log and dt_bias sums through per-tile partial rows).
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {
// The backward's tile: rows per partial-sum row, so that the tile's two fp32 terms per element
// fit the kernel's shared memory (64 rows up to 32 heads).
constexpr int kGateTileElems = 2048;
int64_t gate_rows(int64_t H) { return std::max<int64_t>(1, std::min<int64_t>(64, kGateTileElems / H)); }

__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void gdn_gates_fwd_kernel(float* beta, float* g, const bf16* b, const bf16* a, const bf16* a_log,
                                     const bf16* dt_bias, int64_t T, int64_t H) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % H;
    beta[i] = dev::sigmoidf_(to_f(b[i]));
    g[i] = -expf(to_f(a_log[h])) * softplusf_(to_f(a[i]) + to_f(dt_bias[h]));
  }
}

// Block = one tile of `rows` rows: the threads run over the tile's elements in memory order (all of
// them busy, coalesced), parking each element's two sum terms in shared memory; then thread h sums
// column h over the tile in row order. partials[tile][h] = sum dg * g (-> dA_log),
// partials[tile][H + h] = sum da (-> d dt_bias).
__global__ void __launch_bounds__(256) gdn_gates_bwd_kernel(bf16* db, bf16* da, float* partials, const float* dbeta,
                                                            const float* dg, const bf16* b, const bf16* a,
                                                            const bf16* a_log, const bf16* dt_bias, int64_t T,
                                                            int64_t H, int64_t rows) {
  __shared__ float sm_g[kGateTileElems], sm_d[kGateTileElems];
  const int64_t r0 = int64_t(blockIdx.x) * rows, n = (min(T, r0 + rows) - r0) * H;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t i = r0 * H + e, h = e % H;
    const float bt = dev::sigmoidf_(to_f(b[i]));
    db[i] = to_bf(dbeta[i] * bt * (1.0f - bt));
    const float decay_rate = expf(to_f(a_log[h]));
    const float u = to_f(a[i]) + to_f(dt_bias[h]);
    const float d = dg[i] * (-decay_rate) * (u > 20.0f ? 1.0f : dev::sigmoidf_(u));
    da[i] = to_bf(d);
    sm_g[e] = dg[i] * (-decay_rate * softplusf_(u));
    sm_d[e] = d;
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float sum_g = 0.0f, sum_d = 0.0f;
    for (int64_t e = h; e < n; e += H) {
      sum_g += sm_g[e];
      sum_d += sm_d[e];
    }
    partials[int64_t(blockIdx.x) * 2 * H + h] = sum_g;
    partials[int64_t(blockIdx.x) * 2 * H + H + h] = sum_d;
  }
}
}  // namespace

void launch_gdn_gates_forward(float* beta, float* g, const void* b, const void* a, const void* a_log,
                              const void* dt_bias, int64_t T, int64_t H, cudaStream_t s) {
  if (T * H <= 0) return;
  gdn_gates_fwd_kernel<<<grid_for(T * H, kThreads), kThreads, 0, s>>>(
      beta, g, static_cast<const bf16*>(b), static_cast<const bf16*>(a), static_cast<const bf16*>(a_log),
      static_cast<const bf16*>(dt_bias), T, H);
  QT_LAUNCH_CHECK("gdn_gates_forward");
}

size_t gdn_gates_backward_workspace_bytes(int64_t T, int64_t H) {
  H = std::max<int64_t>(H, 1);
  return sizeof(float) * size_t(ceil_div(std::max<int64_t>(T, 1), gate_rows(H))) * size_t(2 * H);
}

void launch_gdn_gates_backward(void* db, void* da, void* da_log, bool da_log_f32, void* ddt_bias, bool ddt_bias_f32,
                               const float* dbeta, const float* dg, const void* b, const void* a, const void* a_log,
                               const void* dt_bias, int64_t T, int64_t H, void* ws, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  QT_CHECK(H <= kGateTileElems, "gdn_gates_backward: ", H, " heads exceed the CUDA kernel's ", kGateTileElems);
  const int64_t rows = gate_rows(H), tiles = ceil_div(T, rows);
  float* partials = static_cast<float*>(ws);
  gdn_gates_bwd_kernel<<<static_cast<unsigned>(tiles), 256, 0, s>>>(
      static_cast<bf16*>(db), static_cast<bf16*>(da), partials, dbeta, dg, static_cast<const bf16*>(b),
      static_cast<const bf16*>(a), static_cast<const bf16*>(a_log), static_cast<const bf16*>(dt_bias), T, H, rows);
  QT_LAUNCH_CHECK("gdn_gates_backward");
  launch_column_reduce(da_log, da_log_f32, partials, tiles, 2 * H, H, s);
  launch_column_reduce(ddt_bias, ddt_bias_f32, partials + H, tiles, 2 * H, H, s);
}

}  // namespace qt::cuda
