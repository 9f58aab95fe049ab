// CudaBackend kernels: the deterministic column reduction of fp32 partial rows (every weight
// gradient's last step) and the order-free hash of 16-bit words (GEMM tuning compares outputs by it).
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {
// Block = 32 columns x kRedGroups row groups: group g sums partial rows g, g + kRedGroups, ... in
// order, then the groups are added in group order (a fixed order: deterministic).
constexpr int kRedGroups = 16;
__global__ void __launch_bounds__(32 * kRedGroups) column_reduce_kernel(void* out, bool out_f32,
                                                                        const float* __restrict__ partials, int64_t P,
                                                                        int64_t ld, int64_t ncols) {
  __shared__ float sm[kRedGroups][32];
  const int cx = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  float acc = 0.0f;
  if (c < ncols) {
    constexpr int kU = 8;  // loads in flight per thread; the adds stay in row order
    int64_t p = g;
    for (; p + (kU - 1) * kRedGroups < P; p += kU * kRedGroups) {
      float a[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) a[u] = partials[(p + u * kRedGroups) * ld + c];
#pragma unroll
      for (int u = 0; u < kU; ++u) acc += a[u];
    }
    for (; p < P; p += kRedGroups) acc += partials[p * ld + c];
  }
  sm[g][cx] = acc;
  __syncthreads();
  if (g == 0 && c < ncols) {
    float tot = 0.0f;
#pragma unroll
    for (int k = 0; k < kRedGroups; ++k) tot += sm[k][cx];
    dev::acc_store(out, out_f32, c, tot);
  }
}
}  // namespace

void launch_column_reduce(void* out, bool out_f32, const float* partials, int64_t P, int64_t ld, int64_t ncols,
                          cudaStream_t s) {
  if (ncols <= 0 || out == nullptr) return;
  column_reduce_kernel<<<static_cast<unsigned>(ceil_div(ncols, 32)), 32 * kRedGroups, 0, s>>>(out, out_f32, partials,
                                                                                              P, ld, ncols);
  QT_LAUNCH_CHECK("column_reduce");
}

namespace {
// splitmix64's finalizer: every input bit moves every output bit.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__global__ void hash_words_kernel(unsigned long long* out, const uint16_t* w, int64_t n) {
  unsigned long long acc = 0;  // a sum of per-position hashes: the same whatever the order
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc += mix64((static_cast<unsigned long long>(i) << 16) ^ w[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
}  // namespace

void launch_hash_words(unsigned long long* out, const void* p, size_t bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(*out), s));
  const int64_t n = static_cast<int64_t>(bytes / 2);
  if (n == 0) return;
  hash_words_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, static_cast<const uint16_t*>(p), n);
  QT_LAUNCH_CHECK("hash_words");
}

}  // namespace qt::cuda
