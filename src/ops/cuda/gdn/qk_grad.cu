// The backward's last step where bwd_chunk leaves dq^, dk^ per value head: their sum over each key
// head's value heads, then the L2-norm backward into dqkv.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_common.cuh"

namespace qt::cuda::gdn {
namespace {

// Rows (token, key head, q or k), kQkRows per warp: dx = s (r dy - r^3 (x . dy) x), s = K^-1/2 for
// q. Lane l owns the 4 elements 4l.. (K <= 128) of each row. The x loads and every load of a batch
// of kQkHeads value heads are issued before any is used, for all the warp's rows; the value heads
// are summed in head order. Two instances, both 64 registers and 4 CTAs per SM: 2 rows x 2 heads
// (several value heads per key head) and 4 rows x 1 head (one: 2B). One row per warp reached ~2 TB/s
// (2B 0.102 ms; now 0.069); 4 rows x 2 heads at 87 registers (2 CTAs per SM) were slower than one.
// This kernel takes the mma.sync bwd_chunk's fp32 dq^, dk^ (any K <= 128); the wgmma bwd_chunk's
// bf16 ones go to gdn_qk_grad16_kernel.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <int kQkRows, int kQkHeads, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gdn_qk_grad_kernel(bf16* dqkv, const float* dqn, const float* dkn,
                                                                           const bf16* qkv, int T, int Hk, int Hv,
                                                                           int K, int conv_dim) {
  const int warp = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31, rows = T * Hk * 2, ratio = Hv / Hk, d = 4 * lane;
  // Row r of the warp: token t, key head kh, q (which = 0) or k; x's offset in qkv.
  auto row_of = [&](int r, int& which, int& t, int& kh) {
    const int row = warp * kQkRows + r, th = row >> 1;
    which = row & 1;
    t = th / Hk;
    kh = th - t * Hk;
    return row < rows && d < K;
  };
  uint2 xr[kQkRows];
  float dy[kQkRows][4] = {};
#pragma unroll
  for (int r = 0; r < kQkRows; ++r) {
    int which, t, kh;
    xr[r] = make_uint2(0u, 0u);
    if (row_of(r, which, t, kh))
      xr[r] = *reinterpret_cast<const uint2*>(qkv + static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d);
  }
  // kQkHeads == 1: launched only for one value head per key head (ratio 1), a single batch.
  const int batches_end = kQkHeads == 1 ? 1 : ratio;
  for (int j0 = 0; j0 < batches_end; j0 += kQkHeads) {
    float4 acc[kQkRows][kQkHeads];
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      int which, t, kh;
      const bool live = row_of(r, which, t, kh);
      const float* p = (which == 0 ? dqn : dkn) + (static_cast<size_t>(t) * Hv + kh * ratio + j0) * K + d;
#pragma unroll
      for (int u = 0; u < kQkHeads; ++u)
        if (live && j0 + u < ratio) acc[r][u] = load4(p + static_cast<size_t>(u) * K);
    }
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      int which, t, kh;
      const bool live = row_of(r, which, t, kh);
#pragma unroll
      for (int u = 0; u < kQkHeads; ++u)
        if (live && j0 + u < ratio) {
          dy[r][0] += acc[r][u].x;
          dy[r][1] += acc[r][u].y;
          dy[r][2] += acc[r][u].z;
          dy[r][3] += acc[r][u].w;
        }
    }
  }
#pragma unroll
  for (int r = 0; r < kQkRows; ++r) {
    int which, t, kh;
    const bool live = row_of(r, which, t, kh);
    const float x[4] = {__uint_as_float(xr[r].x << 16), __uint_as_float(xr[r].x & 0xffff0000u),
                        __uint_as_float(xr[r].y << 16), __uint_as_float(xr[r].y & 0xffff0000u)};
    float ss = 0.f, xdy = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ss += x[e] * x[e];
      xdy += x[e] * dy[r][e];
    }
    ss = warp_sum(ss);
    xdy = warp_sum(xdy);
    const float rs = 1.f / sqrtf(ss + kL2Eps);
    const float s = which == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f;
    if (live) {
      const float r3 = rs * rs * rs * xdy;
      const __nv_bfloat162 lo = __floats2bfloat162_rn(s * (rs * dy[r][0] - r3 * x[0]), s * (rs * dy[r][1] - r3 * x[1]));
      const __nv_bfloat162 hi = __floats2bfloat162_rn(s * (rs * dy[r][2] - r3 * x[2]), s * (rs * dy[r][3] - r3 * x[3]));
      *reinterpret_cast<uint2*>(dqkv + static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d) =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
  }
}

// The same at K = 128 from the wgmma bwd_chunk's bf16 partials, with 16-byte accesses: a half-warp
// per row (lane l % 16 owns elements 8 (l % 16) .. + 7), the row's x and a batch of kQkHeads value
// heads issued before any is used, the heads summed in head order. Twice the bytes per load
// instruction of the 4-byte kernel's bf16 form, which moved ~2.9 TB/s at 27B (qk_grad 0.117 ms;
// 0.086 with this one, 38 registers; two row pairs per warp at 64 registers were even, and the
// batch loop where one batch holds every head cost 9 registers and 1 % at 4B).
template <int kQkHeads, bool kOneBatch>
__global__ void __launch_bounds__(kThreads, 4) gdn_qk_grad16_kernel(bf16* dqkv, const bf16* dqn, const bf16* dkn,
                                                                   const bf16* qkv, int T, int Hk, int Hv,
                                                                   int conv_dim) {
  constexpr int K = kWgmmaDim;
  const int lane = threadIdx.x & 31, d = 8 * (lane & 15), ratio = Hv / Hk;
  const int row = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 4);
  const bool live = row < T * Hk * 2;  // warp-uniform but for the last warp: the shuffles stay full-warp
  const int which = row & 1, t = (row >> 1) / Hk, kh = (row >> 1) - t * Hk;
  const size_t xo = static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d;
  const uint4 xr = live ? *reinterpret_cast<const uint4*>(qkv + xo) : make_uint4(0u, 0u, 0u, 0u);
  const bf16* p = (which == 0 ? dqn : dkn) + (static_cast<size_t>(t) * Hv + kh * ratio) * K + d;
  float dy[8] = {};
  const int batches_end = kOneBatch ? 1 : ratio;  // kOneBatch: ratio <= kQkHeads
  for (int j0 = 0; j0 < batches_end; j0 += kQkHeads) {
    uint4 acc[kQkHeads];
#pragma unroll
    for (int u = 0; u < kQkHeads; ++u)
      acc[u] = live && j0 + u < ratio ? *reinterpret_cast<const uint4*>(p + static_cast<size_t>(j0 + u) * K)
                                      : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < kQkHeads; ++u) {
      float a[8];
      dev::unpack8(a, acc[u]);
#pragma unroll
      for (int e = 0; e < 8; ++e) dy[e] += a[e];
    }
  }
  float x[8], ss = 0.f, xdy = 0.f;
  dev::unpack8(x, xr);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    ss += x[e] * x[e];
    xdy += x[e] * dy[e];
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) {  // over the half-warp's 16 lanes
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
    xdy += __shfl_xor_sync(0xffffffffu, xdy, o);
  }
  if (!live) return;
  const float rs = 1.f / sqrtf(ss + kL2Eps), sc = which == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f;
  const float r3 = rs * rs * rs * xdy;
  float dx[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) dx[e] = sc * (rs * dy[e] - r3 * x[e]);
  *reinterpret_cast<uint4*>(dqkv + xo) = dev::pack8(dx);
}

}  // namespace

bool qk_grad(const Call& c, cudaStream_t stream) {
  // one value head per key head on the wgmma bwd_chunk: it applied the L2-norm backward itself
  if (!c.backward || c.l2_in_bwd_chunk) return false;
  const int T = c.a.total_tokens, Hk = c.Hk, Hv = c.Hv;
  bf16* dqkv = c.dqkv;
  if (!c.wg) {
    // the mma.sync bwd_chunk's fp32 partials; one value head per key head (2B): no head batches, so
    // four rows per warp fit in 64 registers
    const int rows_per_warp = Hv == Hk ? 4 : 2, warps = (T * Hk * 2 + rows_per_warp - 1) / rows_per_warp;
    auto kernel = Hv == Hk ? gdn_qk_grad_kernel<4, 1, 4> : gdn_qk_grad_kernel<2, 2, 4>;
    kernel<<<(warps + 7) / 8, kThreads, 0, stream>>>(dqkv, static_cast<const float*>(c.w.dqn),
                                                     static_cast<const float*>(c.w.dkn), c.qkv, T, Hk, Hv, c.K,
                                                     c.conv_dim);
  } else {  // the wgmma bwd_chunk's bf16 partials
    const int64_t threads = static_cast<int64_t>(T) * Hk * 2 * 16;  // a half-warp per row
    auto kernel = Hv / Hk <= 4 ? gdn_qk_grad16_kernel<4, true> : gdn_qk_grad16_kernel<4, false>;
    kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        dqkv, static_cast<const bf16*>(c.w.dqn), static_cast<const bf16*>(c.w.dkn), c.qkv, T, Hk, Hv, c.conv_dim);
  }
  QT_LAUNCH_CHECK("gdn_qk_grad_kernel");
  return true;
}

}  // namespace qt::cuda::gdn
