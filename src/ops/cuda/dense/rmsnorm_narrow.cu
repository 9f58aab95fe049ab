// CudaBackend kernels: RMSNorm of narrow rows (cols % 8 == 0, at most 128 columns, 16-byte rows):
// several rows per warp, a row per lane group.
#include "ops/cuda/dense/rmsnorm_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

// ---- narrow rows: cols % 8 == 0, cols <= 128 (the gated norm runs per head over dv = 128) -----
// The wide-row kernels (rmsnorm_wide.cu) give a row a whole warp; at 128 columns half of its lanes
// idle and each warp has one row in flight. Here a row gets LPR lanes (one 16-byte vector each), a
// warp handles 32 / LPR rows at once and the backward keeps two such passes of loads in flight. Row
// sums are xor trees inside the lane group. The backward keeps dw in registers (the lane's 8
// columns) over all its rows, then sums the warp's groups (xor tree) and the block's warps in warp
// order: a fixed order, so dw stays deterministic.
constexpr int kNarrowWarps = 8;
constexpr int kNarrowUnroll = 2;

template <int LPR, NormKind KIND>
__global__ void __launch_bounds__(kNarrowWarps * 32) rmsnorm_fwd_narrow(bf16* __restrict__ y, float* __restrict__ rstd,
                                                                        const bf16* __restrict__ x,
                                                                        const bf16* __restrict__ z,
                                                                        const bf16* __restrict__ w, int64_t rows,
                                                                        int64_t cols, float eps) {
  constexpr int kRows = 32 / LPR;
  const int lane = threadIdx.x & 31, sub = lane % LPR;
  const int64_t row = (int64_t(blockIdx.x) * kNarrowWarps + (threadIdx.x >> 5)) * kRows + lane / LPR;
  const bool ok = row < rows && sub * 8 < cols;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4 xr = ok ? reinterpret_cast<const uint4*>(x + row * cols)[sub] : zero;
  float v[8];
  dev::unpack8(v, xr);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) ss += v[k] * v[k];
  ss = dev::warp_sum<LPR>(ss);  // every lane takes part: no return before the shuffles
  const float rs = 1.0f / sqrtf(ss / float(cols) + eps);
  if (row < rows && sub == 0) rstd[row] = rs;
  if (!ok) return;
  reinterpret_cast<uint4*>(y + row * cols)[sub] = norm_vec8<KIND>(v, rs, w, z + row * cols, sub);
}

template <int LPR, NormKind KIND>
__global__ void __launch_bounds__(kNarrowWarps * 32) rmsnorm_bwd_narrow(
    bf16* __restrict__ dx, bool accumulate_dx, bf16* __restrict__ dz, float* __restrict__ partials,
    const bf16* __restrict__ dy, const bf16* __restrict__ x, const bf16* __restrict__ z, const bf16* __restrict__ w,
    const float* __restrict__ rstd, int64_t rows, int64_t cols, int64_t rows_per_block) {
  constexpr int kRows = 32 / LPR, kStride = kNarrowWarps * kRows;
  constexpr bool kGated = KIND == NormKind::Gated;
  __shared__ float sm_dw[kNarrowWarps][128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % LPR;
  const bool col_ok = sub * 8 < cols;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float wv[8], dw[8];
  dev::unpack8(wv, col_ok ? reinterpret_cast<const uint4*>(w)[sub] : zero);
#pragma unroll
  for (int k = 0; k < 8; ++k) dw[k] = 0.0f;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block, r1 = min(rows, r0 + rows_per_block);
  for (int64_t base = r0 + warp * kRows + lane / LPR; base - lane / LPR < r1; base += kNarrowUnroll * kStride) {
    uint4 xr[kNarrowUnroll], dr[kNarrowUnroll], zr[kNarrowUnroll], oldr[kNarrowUnroll];
    float rs[kNarrowUnroll];
    bool ok[kNarrowUnroll];
#pragma unroll
    for (int u = 0; u < kNarrowUnroll; ++u) {  // all loads of both passes first
      const int64_t row = base + u * kStride;
      ok[u] = row < r1 && col_ok;
      xr[u] = ok[u] ? reinterpret_cast<const uint4*>(x + row * cols)[sub] : zero;
      dr[u] = ok[u] ? reinterpret_cast<const uint4*>(dy + row * cols)[sub] : zero;
      zr[u] = kGated && ok[u] ? reinterpret_cast<const uint4*>(z + row * cols)[sub] : zero;
      oldr[u] = !kGated && accumulate_dx && dx != nullptr && ok[u] ? reinterpret_cast<const uint4*>(dx + row * cols)[sub]
                                                                   : zero;
      rs[u] = row < r1 ? rstd[row] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kNarrowUnroll; ++u) {
      const int64_t row = base + u * kStride;
      float xv[8], dv[8], zv[8], sz[8];
      dev::unpack8(xv, xr[u]);
      dev::unpack8(dv, dr[u]);
      dev::unpack8(zv, zr[u]);
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        sz[k] = kGated ? dev::silu_fast(zv[k]) : 1.0f + wv[k];  // the factor y carries besides n
        dot += (xv[k] * rs[u]) * (dv[k] * (kGated ? wv[k] * sz[k] : sz[k]));
      }
      const float mean = dev::warp_sum<LPR>(dot) / float(cols);
      if (!ok[u]) continue;
      float dxv[8], dzv[8], old[8];
      dev::unpack8(old, oldr[u]);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float n = xv[k] * rs[u];
        if constexpr (kGated) {
          dxv[k] = rs[u] * (dv[k] * wv[k] * sz[k] - n * mean);
          dzv[k] = dv[k] * wv[k] * n * dev::silu_grad_fast(zv[k]);
          dw[k] += dv[k] * n * sz[k];
        } else {
          dxv[k] = rs[u] * (dv[k] * sz[k] - n * mean) + old[k];
          dw[k] += dv[k] * n;
        }
      }
      if constexpr (kGated) reinterpret_cast<uint4*>(dz + row * cols)[sub] = dev::pack8(dzv);
      if (dx != nullptr) reinterpret_cast<uint4*>(dx + row * cols)[sub] = dev::pack8(dxv);
    }
  }
  if (partials == nullptr) return;
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int o = LPR; o < 32; o <<= 1) dw[k] += __shfl_xor_sync(0xffffffffu, dw[k], o);
  if (lane < LPR && col_ok)
#pragma unroll
    for (int k = 0; k < 8; ++k) sm_dw[warp][sub * 8 + k] = dw[k];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < kNarrowWarps; ++q) acc += sm_dw[q][c];
    partials[int64_t(blockIdx.x) * cols + c] = acc;
  }
}

template <int LPR>
void rmsnorm_fwd_narrow_launch(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                               int64_t cols, float eps, NormKind kind, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, int64_t(kNarrowWarps) * (32 / LPR)));
  auto kernel = kind == NormKind::OnePlusW ? rmsnorm_fwd_narrow<LPR, NormKind::OnePlusW>
                                           : rmsnorm_fwd_narrow<LPR, NormKind::Gated>;
  kernel<<<blocks, kNarrowWarps * 32, 0, s>>>(static_cast<bf16*>(y), rstd, static_cast<const bf16*>(x),
                                              static_cast<const bf16*>(z), static_cast<const bf16*>(w), rows, cols, eps);
}

template <int LPR>
void rmsnorm_bwd_narrow_launch(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                               const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols,
                               int64_t blocks, NormKind kind, cudaStream_t s) {
  auto kernel = kind == NormKind::OnePlusW ? rmsnorm_bwd_narrow<LPR, NormKind::OnePlusW>
                                           : rmsnorm_bwd_narrow<LPR, NormKind::Gated>;
  kernel<<<static_cast<unsigned>(blocks), kNarrowWarps * 32, 0, s>>>(
      static_cast<bf16*>(dx), accumulate_dx, static_cast<bf16*>(dz), partials, static_cast<const bf16*>(dy),
      static_cast<const bf16*>(x), static_cast<const bf16*>(z), static_cast<const bf16*>(w), rstd, rows, cols,
      ceil_div(rows, blocks));
}

// Calls f with narrow_lanes(cols) (> 0) as a compile-time constant.
template <typename F>
void dispatch_narrow(int64_t cols, F&& f) {
  switch (narrow_lanes(cols)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, 16>{});
  }
}

}  // namespace

void rmsnorm_narrow_forward(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                            int64_t cols, float eps, NormKind kind, cudaStream_t s) {
  dispatch_narrow(cols, [&](auto lpr) {
    rmsnorm_fwd_narrow_launch<decltype(lpr)::value>(y, rstd, x, z, w, rows, cols, eps, kind, s);
  });
}

void rmsnorm_narrow_backward(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                             const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols,
                             int64_t blocks, NormKind kind, cudaStream_t s) {
  dispatch_narrow(cols, [&](auto lpr) {
    rmsnorm_bwd_narrow_launch<decltype(lpr)::value>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols,
                                                    blocks, kind, s);
  });
}

}  // namespace qt::cuda
