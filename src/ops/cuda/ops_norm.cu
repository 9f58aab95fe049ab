// CudaBackend kernels: (1+w) RMSNorm and gated RMSNorm (forward/backward), q/k RMSNorm + partial
// rotate-half RoPE (attn_prep forward/backward). One warp per row (rows of at most 128 columns:
// several rows per warp); weight gradients are reduced deterministically: per-warp fp32 partials,
// summed in warp order into one partial row per block, then the partial rows are summed in block
// order (launch_column_reduce).
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

using dev::bf16;
using dev::load_vec;
using dev::store_vec;
using dev::to_bf;
using dev::to_f;

constexpr int kFwdWarps = 8;
constexpr int kBwdWarps = 4;
constexpr int64_t kMaxPartialBlocks = 1024;
constexpr int64_t kRowsPerBwdBlock = 16;

int64_t bwd_blocks(int64_t rows) { return std::min<int64_t>(kMaxPartialBlocks, ceil_div(rows, kRowsPerBwdBlock)); }

template <int VEC, NormKind KIND>
__global__ void rmsnorm_fwd_kernel(bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w, int64_t rows,
                                   int64_t cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kFwdWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t cvec = cols / VEC;
  const bf16* xr = x + row * cols;
  float ss = 0.0f;
  for (int64_t i = lane; i < cvec; i += 32) {
    float v[VEC];
    load_vec<VEC>(v, xr, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) ss += v[k] * v[k];
  }
  ss = dev::warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / float(cols) + eps);
  if (lane == 0) rstd[row] = rs;
  for (int64_t i = lane; i < cvec; i += 32) {
    float v[VEC], wv[VEC], out[VEC];
    load_vec<VEC>(v, xr, i);
    load_vec<VEC>(wv, w, i);
    if constexpr (KIND == NormKind::OnePlusW) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = v[k] * rs * (1.0f + wv[k]);
    } else {
      float zv[VEC];
      load_vec<VEC>(zv, z + row * cols, i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = wv[k] * (v[k] * rs) * dev::silu_fast(zv[k]);
    }
    store_vec<VEC>(y + row * cols, i, out);
  }
}

// Block b handles rows [b*R, (b+1)*R); warp w of the block takes rows w, w + kBwdWarps, ...
// smem: kBwdWarps rows of `cols` floats (the per-warp dw partials), only when partials != null.
template <int VEC, NormKind KIND>
__global__ void rmsnorm_bwd_kernel(bf16* dx, bool accumulate_dx, bf16* dz, float* partials, const bf16* dy,
                                   const bf16* x, const bf16* z, const bf16* w, const float* rstd, int64_t rows,
                                   int64_t cols, int64_t rows_per_block) {
  extern __shared__ float sm_dw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cvec = cols / VEC;
  float* my_dw = sm_dw + int64_t(warp) * cols;
  if (partials != nullptr)
    for (int64_t c = lane; c < cols; c += 32) my_dw[c] = 0.0f;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block, r1 = min(rows, r0 + rows_per_block);
  for (int64_t row = r0 + warp; row < r1; row += kBwdWarps) {
    const bf16* xr = x + row * cols;
    const bf16* dyr = dy + row * cols;
    const float rs = rstd[row];
    float dot = 0.0f;
    for (int64_t i = lane; i < cvec; i += 32) {
      float xv[VEC], dv[VEC], wv[VEC];
      load_vec<VEC>(xv, xr, i);
      load_vec<VEC>(dv, dyr, i);
      load_vec<VEC>(wv, w, i);
      if constexpr (KIND == NormKind::OnePlusW) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) dot += (xv[k] * rs) * (dv[k] * (1.0f + wv[k]));
      } else {
        float zv[VEC];
        load_vec<VEC>(zv, z + row * cols, i);
#pragma unroll
        for (int k = 0; k < VEC; ++k) dot += (xv[k] * rs) * (dv[k] * wv[k] * dev::silu_fast(zv[k]));
      }
    }
    const float mean = dev::warp_sum(dot) / float(cols);
    for (int64_t i = lane; i < cvec; i += 32) {
      float xv[VEC], dv[VEC], wv[VEC], dxv[VEC];
      load_vec<VEC>(xv, xr, i);
      load_vec<VEC>(dv, dyr, i);
      load_vec<VEC>(wv, w, i);
      if constexpr (KIND == NormKind::OnePlusW) {
        float old[VEC];
        if (dx != nullptr && accumulate_dx) load_vec<VEC>(old, dx + row * cols, i);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float n = xv[k] * rs;
          dxv[k] = rs * (dv[k] * (1.0f + wv[k]) - n * mean);
          if (dx != nullptr && accumulate_dx) dxv[k] += old[k];
          if (partials != nullptr) my_dw[i * VEC + k] += dv[k] * n;
        }
      } else {
        float zv[VEC], dzv[VEC];
        load_vec<VEC>(zv, z + row * cols, i);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float n = xv[k] * rs;
          const float sz = dev::silu_fast(zv[k]);
          dxv[k] = rs * (dv[k] * wv[k] * sz - n * mean);
          dzv[k] = dv[k] * wv[k] * n * dev::silu_grad_fast(zv[k]);
          if (partials != nullptr) my_dw[i * VEC + k] += dv[k] * n * sz;
        }
        store_vec<VEC>(dz + row * cols, i, dzv);
      }
      if (dx != nullptr) store_vec<VEC>(dx + row * cols, i, dxv);
    }
  }
  if (partials == nullptr) return;
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kBwdWarps; ++k) acc += sm_dw[int64_t(k) * cols + c];
    partials[int64_t(blockIdx.x) * cols + c] = acc;
  }
}

template <int VEC, NormKind KIND>
void rmsnorm_bwd_launch(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                        const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols, int64_t blocks,
                        cudaStream_t s) {
  const size_t smem = partials != nullptr ? sizeof(float) * size_t(kBwdWarps) * size_t(cols) : 0;
  auto kernel = rmsnorm_bwd_kernel<VEC, KIND>;
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), kBwdWarps * 32, smem, s>>>(
      static_cast<bf16*>(dx), accumulate_dx, static_cast<bf16*>(dz), partials, static_cast<const bf16*>(dy),
      static_cast<const bf16*>(x), static_cast<const bf16*>(z), static_cast<const bf16*>(w), rstd, rows, cols,
      ceil_div(rows, blocks));
}


// ---- fast path: cols % 8 == 0 and cols <= 2048 -------------------------------------------------
// Warp per row with the row held in registers: lane owns the 16-byte vectors lane + 32 j (j < NV),
// so x is read once in the forward and x, dy once in the backward. The backward keeps the warp's
// dw partials in shared memory over all rows it handles (rows w, w + kFastWarps, ... of the
// block's row range), then the block's warps are summed in warp order into one partial row.
constexpr int kFastWarps = 4;

// y for the 16-byte vector i of a row: x rstd (1 + w) or w x rstd silu(z) (zrow: the row of z).
template <NormKind KIND>
__device__ __forceinline__ uint4 norm_vec8(const float (&v)[8], float rs, const bf16* w, const bf16* zrow, int64_t i) {
  float wv[8], out[8];
  dev::unpack8(wv, reinterpret_cast<const uint4*>(w)[i]);
  if constexpr (KIND == NormKind::OnePlusW) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = v[k] * rs * (1.0f + wv[k]);
  } else {
    float zv[8];
    dev::unpack8(zv, reinterpret_cast<const uint4*>(zrow)[i]);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = wv[k] * (v[k] * rs) * dev::silu_fast(zv[k]);
  }
  return dev::pack8(out);
}

// The norm of one row held in registers (lane owns the 16-byte vectors lane + 32 j, zero past the
// row): rstd and y = x rstd (1 + w) or w x rstd silu(z).
template <int NV, NormKind KIND>
__device__ __forceinline__ void norm_row_from_regs(const uint4 (&xr)[NV], bf16* y, float* rstd, const bf16* z,
                                                   const bf16* w, int64_t row, int64_t cols, float eps, int lane) {
  const int64_t cvec = cols / 8;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    float v[8];
    dev::unpack8(v, xr[j]);
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += v[k] * v[k];
  }
  ss = dev::warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / float(cols) + eps);
  if (lane == 0) rstd[row] = rs;
  uint4* yp = reinterpret_cast<uint4*>(y + row * cols);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    if (i >= cvec) break;
    float v[8];
    dev::unpack8(v, xr[j]);
    yp[i] = norm_vec8<KIND>(v, rs, w, z + row * cols, i);
  }
}

template <int NV, NormKind KIND>
__global__ void __launch_bounds__(kFastWarps * 32) rmsnorm_fwd_fast(bf16* __restrict__ y, float* __restrict__ rstd,
                                                                     const bf16* __restrict__ x,
                                                                     const bf16* __restrict__ z,
                                                                     const bf16* __restrict__ w, int64_t rows,
                                                                     int64_t cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kFastWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t cvec = cols / 8;
  const uint4* xp = reinterpret_cast<const uint4*>(x + row * cols);
  uint4 xr[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    xr[j] = i < cvec ? xp[i] : make_uint4(0u, 0u, 0u, 0u);
  }
  norm_row_from_regs<NV, KIND>(xr, y, rstd, z, w, row, cols, eps, lane);
}

// Residual add + (1+w) RMSNorm, fast-path layout: h = bf16(x + r) is formed in registers, stored,
// and normalized from its rounded values in rmsnorm_fwd_fast's summation order, so y and rstd
// equal the unfused add + rmsnorm bit for bit. No __restrict__: h may alias x or r (each lane
// reads its x/r vectors before it writes the same h vectors).
template <int NV>
__global__ void __launch_bounds__(kFastWarps * 32) add_rmsnorm_fwd_fast(bf16* h, bf16* y, float* rstd, const bf16* x,
                                                                         const bf16* r, const bf16* w, int64_t rows,
                                                                         int64_t cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kFastWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t cvec = cols / 8;
  const uint4* xp = reinterpret_cast<const uint4*>(x + row * cols);
  const uint4* rp = reinterpret_cast<const uint4*>(r + row * cols);
  uint4* hp = reinterpret_cast<uint4*>(h + row * cols);
  uint4 hr[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    hr[j] = make_uint4(0u, 0u, 0u, 0u);
    if (i < cvec) {
      float a[8], b[8];
      dev::unpack8(a, xp[i]);
      dev::unpack8(b, rp[i]);
#pragma unroll
      for (int k = 0; k < 8; ++k) a[k] += b[k];
      hr[j] = dev::pack8(a);
      hp[i] = hr[j];
    }
  }
  norm_row_from_regs<NV, NormKind::OnePlusW>(hr, y, rstd, nullptr, w, row, cols, eps, lane);
}

// smem (only with partials): kFastWarps x NV x 256 floats, each warp's dw partials (layout below).
template <int NV, NormKind KIND>
__global__ void __launch_bounds__(kFastWarps * 32) rmsnorm_bwd_fast(
    bf16* __restrict__ dx, bool accumulate_dx, bf16* __restrict__ dz, float* __restrict__ partials,
    const bf16* __restrict__ dy, const bf16* __restrict__ x, const bf16* __restrict__ z, const bf16* __restrict__ w,
    const float* __restrict__ rstd, int64_t rows, int64_t cols, int64_t rows_per_block) {
  extern __shared__ float sm_dw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cvec = cols / 8;
  const uint4* wp = reinterpret_cast<const uint4*>(w);
  // The warp's dw partials live in shared memory (keeping registers for the row): float4 slot
  // (2 j + h) * 32 + lane holds columns (lane + 32 j) * 8 + 4 h .. + 3, so a warp's 16-byte
  // accesses are consecutive (no bank conflicts).
  float4* my = reinterpret_cast<float4*>(sm_dw) + warp * (NV * 64);
  if (partials != nullptr)
#pragma unroll
    for (int q = 0; q < 2 * NV; ++q) my[q * 32 + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block, r1 = min(rows, r0 + rows_per_block);
  for (int64_t row = r0 + warp; row < r1; row += kFastWarps) {
    const uint4* xp = reinterpret_cast<const uint4*>(x + row * cols);
    const uint4* dyp = reinterpret_cast<const uint4*>(dy + row * cols);
    const uint4* zp = reinterpret_cast<const uint4*>(z + row * cols);
    uint4 xr[NV], dr[NV], zr[KIND == NormKind::Gated ? NV : 1];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = lane + 32 * j;
      const bool ok = i < cvec;
      xr[j] = ok ? xp[i] : make_uint4(0u, 0u, 0u, 0u);
      dr[j] = ok ? dyp[i] : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (KIND == NormKind::Gated) zr[j] = ok ? zp[i] : make_uint4(0u, 0u, 0u, 0u);
    }
    const float rs = rstd[row];
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= cvec) break;
      float xv[8], dv[8], wv[8];
      dev::unpack8(xv, xr[j]);
      dev::unpack8(dv, dr[j]);
      dev::unpack8(wv, wp[i]);
      if constexpr (KIND == NormKind::OnePlusW) {
#pragma unroll
        for (int k = 0; k < 8; ++k) dot += (xv[k] * rs) * (dv[k] * (1.0f + wv[k]));
      } else {
        float zv[8];
        dev::unpack8(zv, zr[j]);
#pragma unroll
        for (int k = 0; k < 8; ++k) dot += (xv[k] * rs) * (dv[k] * wv[k] * dev::silu_fast(zv[k]));
      }
    }
    const float mean = dev::warp_sum(dot) / float(cols);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= cvec) break;
      float xv[8], dv[8], wv[8], dxv[8], dwv[8];
      dev::unpack8(xv, xr[j]);
      dev::unpack8(dv, dr[j]);
      dev::unpack8(wv, wp[i]);
      if constexpr (KIND == NormKind::OnePlusW) {
        float old[8];
        if (dx != nullptr && accumulate_dx) dev::unpack8(old, reinterpret_cast<const uint4*>(dx + row * cols)[i]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float n = xv[k] * rs;
          dxv[k] = rs * (dv[k] * (1.0f + wv[k]) - n * mean);
          if (dx != nullptr && accumulate_dx) dxv[k] += old[k];
          dwv[k] = dv[k] * n;
        }
      } else {
        float zv[8], dzv[8];
        dev::unpack8(zv, zr[j]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float n = xv[k] * rs;
          const float sz = dev::silu_fast(zv[k]);
          dxv[k] = rs * (dv[k] * wv[k] * sz - n * mean);
          dzv[k] = dv[k] * wv[k] * n * dev::silu_grad_fast(zv[k]);
          dwv[k] = dv[k] * n * sz;
        }
        reinterpret_cast<uint4*>(dz + row * cols)[i] = dev::pack8(dzv);
      }
      if (dx != nullptr) reinterpret_cast<uint4*>(dx + row * cols)[i] = dev::pack8(dxv);
      if (partials != nullptr) {
        float4& a = my[(2 * j) * 32 + lane];
        float4& b = my[(2 * j + 1) * 32 + lane];
        float4 av = a, bv = b;
        av.x += dwv[0]; av.y += dwv[1]; av.z += dwv[2]; av.w += dwv[3];
        bv.x += dwv[4]; bv.y += dwv[5]; bv.z += dwv[6]; bv.w += dwv[7];
        a = av;
        b = bv;
      }
    }
  }
  if (partials == nullptr) return;
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const int64_t i = c / 8, k = c % 8, slot = ((i / 32) * 2 + k / 4) * 32 + (i % 32);
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < kFastWarps; ++q) acc += sm_dw[(int64_t(q) * NV * 64 + slot) * 4 + k % 4];
    partials[int64_t(blockIdx.x) * cols + c] = acc;
  }
}

// 16-byte vectors per lane of the one-warp-per-row kernels: the smallest instantiated count that
// covers the row (10: the 4B hidden size 2560; 16: 4096), 0 when the row is wider or cols % 8 != 0.
int fast_nv(int64_t cols) {
  const int64_t cvec = cols / 8;
  if (cols % 8 != 0) return 0;
  for (int nv : {1, 2, 4, 8, 10, 12, 16})
    if (32 * nv >= cvec) return nv;
  return 0;
}
// Calls f(std::integral_constant<int, nv>) for a count fast_nv returned.
template <typename F>
void dispatch_fast(int nv, F&& f) {
  switch (nv) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 10: return f(std::integral_constant<int, 10>{});
    case 12: return f(std::integral_constant<int, 12>{});
    default: return f(std::integral_constant<int, 16>{});
  }
}

template <int NV, NormKind KIND>
void rmsnorm_fwd_fast_launch(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                             int64_t cols, float eps, cudaStream_t s) {
  rmsnorm_fwd_fast<NV, KIND><<<static_cast<unsigned>(ceil_div(rows, kFastWarps)), kFastWarps * 32, 0, s>>>(
      static_cast<bf16*>(y), rstd, static_cast<const bf16*>(x), static_cast<const bf16*>(z),
      static_cast<const bf16*>(w), rows, cols, eps);
}

template <int NV, NormKind KIND>
int64_t rmsnorm_bwd_fast_launch(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                             const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols,
                             cudaStream_t s) {
  auto kernel = rmsnorm_bwd_fast<NV, KIND>;
  const size_t smem = partials != nullptr ? sizeof(float) * kFastWarps * NV * 256 : 0;
  // Enough blocks for the resident capacity of the device (one wave), at most bwd_blocks(rows)
  // (the workspace's row count); fewer blocks mean fewer partial rows to reduce.
  static int capacity = 0;
  if (capacity == 0) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kFastWarps * 32,
                                                             sizeof(float) * kFastWarps * NV * 256));
    capacity = sm_count() * std::max(1, per_sm);
  }
  const int64_t blocks = std::min<int64_t>(bwd_blocks(rows), capacity);
  kernel<<<static_cast<unsigned>(blocks), kFastWarps * 32, smem, s>>>(
      static_cast<bf16*>(dx), accumulate_dx, static_cast<bf16*>(dz), partials, static_cast<const bf16*>(dy),
      static_cast<const bf16*>(x), static_cast<const bf16*>(z), static_cast<const bf16*>(w), rstd, rows, cols,
      ceil_div(rows, blocks));
  QT_LAUNCH_CHECK(KIND == NormKind::OnePlusW ? "rmsnorm_backward" : "gated_rmsnorm_backward");
  return blocks;
}

// ---- narrow rows: cols % 8 == 0, cols <= 128 (the gated norm runs per head over dv = 128) -----
// The fast path above gives a row a whole warp; at 128 columns half of its lanes idle and each warp
// has one row in flight. Here a row gets LPR lanes (one 16-byte vector each), a warp handles
// 32 / LPR rows at once and the backward keeps two such passes of loads in flight. Row sums are
// xor trees inside the lane group. The backward keeps dw in registers (the lane's 8 columns) over
// all its rows, then sums the warp's groups (xor tree) and the block's warps in warp order: a fixed
// order, so dw stays deterministic.
constexpr int kNarrowWarps = 8;
constexpr int kNarrowUnroll = 2;

int narrow_lanes(int64_t cols) {
  if (cols % 8 != 0 || cols > 128) return 0;
  int lpr = 1;
  while (lpr * 8 < cols) lpr *= 2;
  return lpr;
}

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

// ---- backward, ring variant: cols % 8 == 0, cols <= 2560, (1+w) only ---------------------------
// The register kernel above keeps one row per warp in flight and loads it only when the previous
// one is done, so the warps' loads come in bursts (44.3 us for [8192, 2048] on the H200).
// Here a persistent grid (one wave) gives each warp a ring of D stages, each one row of x and dy
// filled by cp.async.bulk on an mbarrier: the warp's rows gw, gw + GW, ... (GW warps in the grid)
// are requested D ahead, the stage is handed back as soon as the row sits in registers, and dw is
// summed in registers over the warp's rows, then over the block's warps in warp order into one
// partial row per block. (1+w) is kept once per block in shared memory as fp32. Used with 8 warps
// x 2 stages (34-35 us; 3 stages 36.5 us, 6 warps x 4 stages 37.5 us: docs/dense_kernels.md section 4).
// Lane 0: x and dy of one row (bytes each) into dst, dst + bytes, completing on bar.
__device__ __forceinline__ void rg_issue_row(char* dst, const bf16* xr, const bf16* dyr, unsigned bytes,
                                             uint64_t* bar) {
  const unsigned b = dev::smem_addr(bar), d = dev::smem_addr(dst);
  dev::fence_proxy_async();
  dev::mbar_arrive_expect_tx(bar, 2u * bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(d),
               "l"(xr), "r"(bytes), "r"(b)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   d + bytes),
               "l"(dyr), "r"(bytes), "r"(b)
               : "memory");
}

template <int NV>
constexpr int rg_w_bytes() { return NV * 64 * 16; }
// Widest ring row in 16-byte vectors per lane: the row (2 NV uint4) and the dw sums (8 NV floats)
// live in registers; 10 covers 2560 columns.
constexpr int kRingMaxNv = 10;

// smem: (1+w) as NV x 64 float4 (slot (2 j + h) * 32 + lane: columns (lane + 32 j) * 8 + 4 h ..),
// then NW x D stages of 2 * cols bf16, then NW x D mbarriers.
template <int NV, int NW, int D>
__global__ void __launch_bounds__(NW * 32, 1) rmsnorm_bwd_ring(bf16* __restrict__ dx, bool accumulate_dx,
                                                               float* __restrict__ partials,
                                                               const bf16* __restrict__ dy,
                                                               const bf16* __restrict__ x,
                                                               const bf16* __restrict__ w,
                                                               const float* __restrict__ rstd, int64_t rows,
                                                               int64_t cols) {
  extern __shared__ __align__(128) char rg_sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cvec = cols / 8;
  const unsigned rbytes = unsigned(cols) * 2u, stage = 2u * rbytes;
  float4* wp1 = reinterpret_cast<float4*>(rg_sm);
  char* ring = rg_sm + rg_w_bytes<NV>() + size_t(warp) * D * stage;
  uint64_t* bars = reinterpret_cast<uint64_t*>(rg_sm + rg_w_bytes<NV>() + size_t(NW) * D * stage) + warp * D;
  for (int idx = threadIdx.x; idx < NV * 32; idx += blockDim.x) {
    const int j = idx / 32, l = idx % 32;
    const int64_t i = l + 32 * j;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    if (i < cvec) dev::unpack8(v, reinterpret_cast<const uint4*>(w)[i]);
    wp1[(2 * j) * 32 + l] = make_float4(1.0f + v[0], 1.0f + v[1], 1.0f + v[2], 1.0f + v[3]);
    wp1[(2 * j + 1) * 32 + l] = make_float4(1.0f + v[4], 1.0f + v[5], 1.0f + v[6], 1.0f + v[7]);
  }
  if (lane == 0) {
    for (int s = 0; s < D; ++s) dev::mbar_init(bars + s, 1);
  }
  __syncthreads();
  const int64_t gw = int64_t(blockIdx.x) * NW + warp, GW = int64_t(gridDim.x) * NW;
  if (lane == 0)
    for (int k = 0; k < D; ++k) {
      const int64_t row = gw + k * GW;
      if (row < rows) rg_issue_row(ring + k * stage, x + row * cols, dy + row * cols, rbytes, bars + k);
    }
  float dwr[NV][8];
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int k = 0; k < 8; ++k) dwr[j][k] = 0.0f;
  for (int64_t k = 0;; ++k) {
    const int64_t row = gw + k * GW;
    if (row >= rows) break;
    const float rs = rstd[row];
    const int s = int(k % D);
    dev::mbar_wait(bars + s, unsigned(k / D) & 1u);
    const uint4* xs = reinterpret_cast<const uint4*>(ring + s * stage);
    const uint4* ds = reinterpret_cast<const uint4*>(ring + s * stage + rbytes);
    uint4 xr[NV], dr[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = lane + 32 * j;
      const bool ok = i < cvec;
      xr[j] = ok ? xs[i] : make_uint4(0u, 0u, 0u, 0u);
      dr[j] = ok ? ds[i] : make_uint4(0u, 0u, 0u, 0u);
    }
    float dot = 0.0f;  // sum x dy (1 + w); times rs below
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      float xv[8], dv[8];
      dev::unpack8(xv, xr[j]);
      dev::unpack8(dv, dr[j]);
      const float4 a = wp1[(2 * j) * 32 + lane], b = wp1[(2 * j + 1) * 32 + lane];
      const float wv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += xv[e] * (dv[e] * wv[e]);
    }
    __syncwarp();  // every lane holds its part of the row: the stage can be refilled
    if (lane == 0 && row + D * GW < rows)
      rg_issue_row(ring + s * stage, x + (row + D * GW) * cols, dy + (row + D * GW) * cols, rbytes, bars + s);
    const float mean = dev::warp_sum(dot) * rs / float(cols);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= cvec) break;
      float xv[8], dv[8], dxv[8];
      dev::unpack8(xv, xr[j]);
      dev::unpack8(dv, dr[j]);
      const float4 a = wp1[(2 * j) * 32 + lane], b = wp1[(2 * j + 1) * 32 + lane];
      const float wv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      float old[8];
      if (dx != nullptr && accumulate_dx) dev::unpack8(old, reinterpret_cast<const uint4*>(dx + row * cols)[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float n = xv[e] * rs;
        dxv[e] = rs * (dv[e] * wv[e] - n * mean);
        if (dx != nullptr && accumulate_dx) dxv[e] += old[e];
        dwr[j][e] += dv[e] * n;
      }
      if (dx != nullptr) reinterpret_cast<uint4*>(dx + row * cols)[i] = dev::pack8(dxv);
    }
  }
  if (partials == nullptr) return;
  // The warp's dw row into its own (drained) ring: column c at float c.
  float4* mine = reinterpret_cast<float4*>(rg_sm + rg_w_bytes<NV>() + size_t(warp) * D * stage);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    if (i >= cvec) break;
    mine[2 * i] = make_float4(dwr[j][0], dwr[j][1], dwr[j][2], dwr[j][3]);
    mine[2 * i + 1] = make_float4(dwr[j][4], dwr[j][5], dwr[j][6], dwr[j][7]);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < NW; ++q)
      acc += reinterpret_cast<const float*>(rg_sm + rg_w_bytes<NV>() + size_t(q) * D * stage)[c];
    partials[int64_t(blockIdx.x) * cols + c] = acc;
  }
}

template <int NV, int NW, int D>
int64_t rmsnorm_bwd_ring_launch(void* dx, bool accumulate_dx, float* partials, const void* dy, const void* x,
                                const void* w, const float* rstd, int64_t rows, int64_t cols, cudaStream_t s) {
  auto kernel = rmsnorm_bwd_ring<NV, NW, D>;
  const size_t smem = size_t(rg_w_bytes<NV>()) + size_t(NW) * D * (4 * size_t(cols) + 8);
  // One wave: blocks resident per SM at this shared-memory size (cached per size), at most
  // bwd_blocks(rows) (the workspace's row count).
  static size_t cached_smem = 0;
  static int capacity = 0;
  if (cached_smem != smem) {
    int per_sm = 0;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NW * 32, smem));
    capacity = sm_count() * std::max(1, per_sm);
    cached_smem = smem;
  }
  const int64_t blocks = std::min<int64_t>(bwd_blocks(rows), capacity);
  kernel<<<static_cast<unsigned>(blocks), NW * 32, smem, s>>>(
      static_cast<bf16*>(dx), accumulate_dx, partials, static_cast<const bf16*>(dy), static_cast<const bf16*>(x),
      static_cast<const bf16*>(w), rstd, rows, cols);
  QT_LAUNCH_CHECK("rmsnorm_backward");
  return blocks;
}

}  // namespace

void launch_rmsnorm_forward(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                            int64_t cols, float eps, NormKind kind, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const bool vec = cols % 8 == 0 && aligned16(y) && aligned16(x) && aligned16(w) && (z == nullptr || aligned16(z));
  const unsigned grid = static_cast<unsigned>(ceil_div(rows, kFwdWarps));
  const auto* xb = static_cast<const bf16*>(x);
  const auto* zb = static_cast<const bf16*>(z);
  const auto* wb = static_cast<const bf16*>(w);
  auto* yb = static_cast<bf16*>(y);
  if (vec && narrow_lanes(cols) > 0) {
    dispatch_narrow(cols, [&](auto lpr) {
      rmsnorm_fwd_narrow_launch<decltype(lpr)::value>(y, rstd, x, z, w, rows, cols, eps, kind, s);
    });
  } else if (const int nv = vec ? fast_nv(cols) : 0; nv > 0) {
    dispatch_fast(nv, [&](auto c) {
      constexpr int NV = decltype(c)::value;
      if (kind == NormKind::OnePlusW)
        rmsnorm_fwd_fast_launch<NV, NormKind::OnePlusW>(y, rstd, x, z, w, rows, cols, eps, s);
      else
        rmsnorm_fwd_fast_launch<NV, NormKind::Gated>(y, rstd, x, z, w, rows, cols, eps, s);
    });
  } else if (kind == NormKind::OnePlusW) {
    if (vec) rmsnorm_fwd_kernel<8, NormKind::OnePlusW><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
    else rmsnorm_fwd_kernel<1, NormKind::OnePlusW><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
  } else {
    if (vec) rmsnorm_fwd_kernel<8, NormKind::Gated><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
    else rmsnorm_fwd_kernel<1, NormKind::Gated><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
  }
  QT_LAUNCH_CHECK(kind == NormKind::OnePlusW ? "rmsnorm_forward" : "gated_rmsnorm_forward");
}

bool launch_add_rmsnorm_forward(void* h, void* y, float* rstd, const void* x, const void* r, const void* w,
                                int64_t rows, int64_t cols, float eps, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return true;
  const bool vec = cols % 8 == 0 && aligned16(h) && aligned16(y) && aligned16(x) && aligned16(r) && aligned16(w);
  const int nv = vec ? fast_nv(cols) : 0;
  if (nv == 0) return false;
  const unsigned grid = static_cast<unsigned>(ceil_div(rows, kFastWarps));
  auto* hb = static_cast<bf16*>(h);
  auto* yb = static_cast<bf16*>(y);
  const auto* xb = static_cast<const bf16*>(x);
  const auto* rb = static_cast<const bf16*>(r);
  const auto* wb = static_cast<const bf16*>(w);
  dispatch_fast(nv, [&](auto c) {
    add_rmsnorm_fwd_fast<decltype(c)::value>
        <<<grid, kFastWarps * 32, 0, s>>>(hb, yb, rstd, xb, rb, wb, rows, cols, eps);
  });
  QT_LAUNCH_CHECK("add_rmsnorm_forward");
  return true;
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  return sizeof(float) * size_t(bwd_blocks(std::max<int64_t>(rows, 1))) * size_t(cols);
}

void launch_rmsnorm_backward(void* dx, bool accumulate_dx, void* dz, void* dw, bool dw_f32, const void* dy,
                             const void* x, const void* z, const void* w, const float* rstd, int64_t rows,
                             int64_t cols, NormKind kind, void* ws, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  QT_CHECK(dw == nullptr || cols <= 12288, "rmsnorm_backward: cols ", cols, " exceeds the CUDA kernel's 12288");
  const bool vec = cols % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(w) &&
                   (dx == nullptr || aligned16(dx)) && (z == nullptr || aligned16(z)) && (dz == nullptr || aligned16(dz));
  int64_t blocks = bwd_blocks(rows);
  float* partials = dw != nullptr ? static_cast<float*>(ws) : nullptr;
  // Gated keeps z in registers too: its fast path stops at NV 4 (1024 columns).
  const int nv = vec ? fast_nv(cols) : 0;
  if (vec && narrow_lanes(cols) > 0) {
    dispatch_narrow(cols, [&](auto lpr) {
      rmsnorm_bwd_narrow_launch<decltype(lpr)::value>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols,
                                                      blocks, kind, s);
    });
  } else if (nv > 0 && (kind == NormKind::OnePlusW ? nv <= kRingMaxNv : nv <= 4)) {
    if (kind == NormKind::OnePlusW) {
      // The ring kernel, 8 warps x 2 row stages per block (3 stages, or 6 warps x 4, measured slower).
      dispatch_fast(nv, [&](auto c) {
        constexpr int NV = decltype(c)::value;
        if constexpr (NV <= kRingMaxNv)
          blocks = rmsnorm_bwd_ring_launch<NV, 8, 2>(dx, accumulate_dx, partials, dy, x, w, rstd, rows, cols, s);
      });
    } else {
      dispatch_fast(nv, [&](auto c) {
        constexpr int NV = decltype(c)::value;
        if constexpr (NV <= 4)
          blocks = rmsnorm_bwd_fast_launch<NV, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd,
                                                                rows, cols, s);
      });
    }
  } else if (kind == NormKind::OnePlusW) {
    if (vec) rmsnorm_bwd_launch<8, NormKind::OnePlusW>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
    else rmsnorm_bwd_launch<1, NormKind::OnePlusW>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
  } else {
    if (vec) rmsnorm_bwd_launch<8, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
    else rmsnorm_bwd_launch<1, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
  }
  QT_LAUNCH_CHECK(kind == NormKind::OnePlusW ? "rmsnorm_backward" : "gated_rmsnorm_backward");
  if (dw != nullptr) launch_column_reduce(dw, dw_f32, partials, blocks, cols, cols, s);
}

// ---- attn_prep: q/k (1+w) RMSNorm + partial rotate-half RoPE -----------------------------------

namespace {

constexpr int kMaxHeadDim = 256;

// cos/sin of position * theta^(-2j/rot), computed in double like the CPU reference.
__device__ __forceinline__ void rope_cs(float& c, float& s, int32_t pos, int j, int rot, double theta) {
  const double inv_freq = pow(theta, -2.0 * double(j) / double(rot));
  double sd, cd;
  sincos(double(pos) * inv_freq, &sd, &cd);
  c = float(cd);
  s = float(sd);
}

// The cos/sin pairs of `ntok` consecutive tokens' rotary frequencies into cs[token][j], j < rot/2:
// each is computed once per token (in double, like the CPU reference), not once per head and
// rotated element.
__device__ __forceinline__ void rope_table(float2 (*cs)[kMaxHeadDim / 2], const int32_t* positions, int64_t t0,
                                           int ntok, int rot, double theta, int tid, int nthreads) {
  const int half = rot / 2;
  for (int i = tid; i < ntok * half; i += nthreads) {
    float c, sn;
    rope_cs(c, sn, positions[t0 + i / half], i % half, rot, theta);
    cs[i / half][i % half] = make_float2(c, sn);
  }
}

// Rotate-half RoPE of element d of a head row r held in shared memory (r[d] is also passed as v):
// dir +1 applies the rotation (forward), -1 its inverse (backward: rotating dy back).
__device__ __forceinline__ float rope_elem(const float* r, float v, const float2* cs, int d, int rot, float dir) {
  const int half = rot / 2;
  if (d < half) return v * cs[d].x - dir * r[d + half] * cs[d].y;
  if (d < rot) return v * cs[d - half].x + dir * r[d - half] * cs[d - half].y;
  return v;
}

// Lane l holds elements [8 l, 8 l + 8) of a head row (l < D / 8): 16-byte loads and stores, the
// row also parked in the warp's shared row so lanes can read their rotation partners.
__device__ __forceinline__ void park8(float* row, int lane, const float (&v)[8]) {
  reinterpret_cast<float4*>(row)[2 * lane] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(row)[2 * lane + 1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Block = kPrepTokens tokens: their cos/sin rows first, then warps take (token, head) items; heads
// [0, Hq) are query heads (from qg, also copying the gate half), [Hq, Hq + Hkv) key heads (from kr).
constexpr int kPrepTokens = 8;
__global__ void __launch_bounds__(kFwdWarps * 32) attn_prep_fwd_kernel(
    bf16* q, bf16* k, bf16* gate, float* q_rstd, float* k_rstd, const bf16* qg, const bf16* kr, const bf16* qw,
    const bf16* kw, const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rot, double theta, float eps) {
  __shared__ __align__(16) float sm[kFwdWarps][kMaxHeadDim];
  __shared__ float2 cs[kPrepTokens][kMaxHeadDim / 2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * kPrepTokens;
  const int ntok = T - t0 < kPrepTokens ? int(T - t0) : kPrepTokens;
  rope_table(cs, positions, t0, ntok, rot, theta, threadIdx.x, blockDim.x);
  __syncthreads();
  const int H = Hq + Hkv;
  const bool on = lane < D / 8;
  float* n = sm[warp];
  for (int item = warp; item < ntok * H; item += kFwdWarps) {
    const int64_t t = t0 + item / H;
    const int hh = item % H;
    const bool is_q = hh < Hq;
    const bf16* src = is_q ? qg + (t * Hq + hh) * 2 * D : kr + (t * Hkv + (hh - Hq)) * D;
    float v[8];
    dev::unpack8(v, on ? reinterpret_cast<const uint4*>(src)[lane] : make_uint4(0u, 0u, 0u, 0u));
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    ss = dev::warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / float(D) + eps);
    if (lane == 0) {
      if (is_q) q_rstd[t * Hq + hh] = rs;
      else k_rstd[t * Hkv + (hh - Hq)] = rs;
    }
    if (on) {
      float wv[8];
      dev::unpack8(wv, reinterpret_cast<const uint4*>(is_q ? qw : kw)[lane]);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * rs * (1.0f + wv[j]);
      park8(n, lane, v);
    }
    __syncwarp();
    if (on) {
      float out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = rope_elem(n, v[j], cs[item / H], 8 * lane + j, rot, 1.0f);
      bf16* dst = is_q ? q + (t * Hq + hh) * D : k + (t * Hkv + (hh - Hq)) * D;
      reinterpret_cast<uint4*>(dst)[lane] = dev::pack8(out);
      if (is_q) reinterpret_cast<uint4*>(gate + (t * Hq + hh) * D)[lane] = reinterpret_cast<const uint4*>(src + D)[lane];
    }
    __syncwarp();  // the partners are read before the next item overwrites the row
  }
}

// Block = kPrepBwdWarps warps over a range of tokens; a warp handles whole tokens (all heads), with
// the token's cos/sin row computed once into its shared row. Per lane: 8 elements of a head row,
// the (1 + w) factors of both norms and the dw sums in registers; smem per warp: the cos/sin row,
// dy parked for the rotation partners, the final dw row [2D] (query weight, then key weight).
constexpr int kPrepBwdWarps = 8;
__global__ void __launch_bounds__(kPrepBwdWarps * 32) attn_prep_bwd_kernel(
    bf16* dqg, bf16* dkr, float* partials, const bf16* dq, const bf16* dk, const bf16* dgate, const bf16* qg,
    const bf16* kr, const bf16* qw, const bf16* kw, const float* q_rstd, const float* k_rstd,
    const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rot, double theta, int64_t tokens_per_block) {
  __shared__ __align__(16) float sm_dy[kPrepBwdWarps][kMaxHeadDim];
  __shared__ float sm_dw[kPrepBwdWarps][2 * kMaxHeadDim];
  __shared__ float2 sm_cs[kPrepBwdWarps][kMaxHeadDim / 2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool on = lane < D / 8;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float* dyrow = sm_dy[warp];
  const float2* cs = sm_cs[warp];
  float wq[8], wk[8], dwq[8], dwk[8];
  dev::unpack8(wq, on ? reinterpret_cast<const uint4*>(qw)[lane] : zero);
  dev::unpack8(wk, on ? reinterpret_cast<const uint4*>(kw)[lane] : zero);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    wq[j] += 1.0f;
    wk[j] += 1.0f;
    dwq[j] = dwk[j] = 0.0f;
  }
  const int64_t t0 = int64_t(blockIdx.x) * tokens_per_block, t1 = min(T, t0 + tokens_per_block);
  for (int64_t t = t0 + warp; t < t1; t += kPrepBwdWarps) {
    __syncwarp();  // the previous token's reads of the cos/sin row are done
    rope_table(&sm_cs[warp], positions, t, 1, rot, theta, lane, 32);
    for (int hh = 0; hh < Hq + Hkv; ++hh) {
      const bool is_q = hh < Hq;
      const bf16* dy = is_q ? dq + (t * Hq + hh) * D : dk + (t * Hkv + (hh - Hq)) * D;
      const bf16* x = is_q ? qg + (t * Hq + hh) * 2 * D : kr + (t * Hkv + (hh - Hq)) * D;
      const float rs = is_q ? q_rstd[t * Hq + hh] : k_rstd[t * Hkv + (hh - Hq)];
      float dv[8], xv[8];
      dev::unpack8(dv, on ? reinterpret_cast<const uint4*>(dy)[lane] : zero);
      dev::unpack8(xv, on ? reinterpret_cast<const uint4*>(x)[lane] : zero);
      __syncwarp();  // the previous head's partner reads are done (and the cos/sin row is written)
      if (on) park8(dyrow, lane, dv);
      __syncwarp();
      float r[8], dot = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // r = dy rotated back by the angle
        r[j] = on ? rope_elem(dyrow, dv[j], cs, 8 * lane + j, rot, -1.0f) : 0.0f;
        dot += (xv[j] * rs) * (r[j] * (is_q ? wq[j] : wk[j]));
      }
      const float mean = dev::warp_sum(dot) / float(D);
      if (!on) continue;
      float dx[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float n = xv[j] * rs;
        dx[j] = rs * (r[j] * (is_q ? wq[j] : wk[j]) - n * mean);
        if (is_q) dwq[j] += r[j] * n;
        else dwk[j] += r[j] * n;
      }
      bf16* dxp = is_q ? dqg + (t * Hq + hh) * 2 * D : dkr + (t * Hkv + (hh - Hq)) * D;
      reinterpret_cast<uint4*>(dxp)[lane] = dev::pack8(dx);
      if (is_q) reinterpret_cast<uint4*>(dxp + D)[lane] = reinterpret_cast<const uint4*>(dgate + (t * Hq + hh) * D)[lane];
    }
  }
  if (on)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sm_dw[warp][8 * lane + j] = dwq[j];
      sm_dw[warp][D + 8 * lane + j] = dwk[j];
    }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kPrepBwdWarps; ++k) acc += sm_dw[k][c];
    partials[int64_t(blockIdx.x) * 2 * D + c] = acc;
  }
}

int64_t prep_bwd_blocks(int64_t T) { return std::min<int64_t>(kMaxPartialBlocks, ceil_div(T, 8)); }

}  // namespace

void launch_attn_prep_forward(void* q, void* k, void* gate, float* q_rstd, float* k_rstd, const void* qg,
                              const void* kr, const void* q_norm_w, const void* k_norm_w, const int32_t* positions,
                              int64_t T, int Hq, int Hkv, int D, int rotary_dim, double theta, float eps,
                              cudaStream_t s) {
  if (T <= 0) return;
  QT_CHECK(D <= kMaxHeadDim, "attn_prep_forward: head_dim ", D, " exceeds the CUDA kernel's ", kMaxHeadDim);
  QT_CHECK(D % 8 == 0 && aligned16(qg) && aligned16(kr), "attn_prep_forward: head_dim ", D,
           " must be a multiple of 8 with 16-byte aligned rows (the CUDA kernel's vectors)");
  attn_prep_fwd_kernel<<<static_cast<unsigned>(ceil_div(T, kPrepTokens)), kFwdWarps * 32, 0, s>>>(
      static_cast<bf16*>(q), static_cast<bf16*>(k), static_cast<bf16*>(gate), q_rstd, k_rstd,
      static_cast<const bf16*>(qg), static_cast<const bf16*>(kr), static_cast<const bf16*>(q_norm_w),
      static_cast<const bf16*>(k_norm_w), positions, T, Hq, Hkv, D, rotary_dim, theta, eps);
  QT_LAUNCH_CHECK("attn_prep_forward");
}

size_t attn_prep_backward_workspace_bytes(int64_t T, int D) {
  return sizeof(float) * size_t(prep_bwd_blocks(std::max<int64_t>(T, 1))) * size_t(2 * D);
}

void launch_attn_prep_backward(void* dqg, void* dkr, void* dq_norm_w, bool dqw_f32, void* dk_norm_w, bool dkw_f32,
                               const void* dq, const void* dk, const void* dgate, const void* qg, const void* kr,
                               const void* q_norm_w, const void* k_norm_w, const float* q_rstd, const float* k_rstd,
                               const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rotary_dim,
                               double theta, void* ws, cudaStream_t s) {
  if (T <= 0) return;
  QT_CHECK(D <= kMaxHeadDim, "attn_prep_backward: head_dim ", D, " exceeds the CUDA kernel's ", kMaxHeadDim);
  QT_CHECK(D % 8 == 0 && aligned16(qg) && aligned16(kr), "attn_prep_backward: head_dim ", D,
           " must be a multiple of 8 with 16-byte aligned rows (the CUDA kernel's vectors)");
  const int64_t blocks = prep_bwd_blocks(T);
  float* partials = static_cast<float*>(ws);
  attn_prep_bwd_kernel<<<static_cast<unsigned>(blocks), kPrepBwdWarps * 32, 0, s>>>(
      static_cast<bf16*>(dqg), static_cast<bf16*>(dkr), partials, static_cast<const bf16*>(dq),
      static_cast<const bf16*>(dk), static_cast<const bf16*>(dgate), static_cast<const bf16*>(qg),
      static_cast<const bf16*>(kr), static_cast<const bf16*>(q_norm_w), static_cast<const bf16*>(k_norm_w), q_rstd,
      k_rstd, positions, T, Hq, Hkv, D, rotary_dim, theta, ceil_div(T, blocks));
  QT_LAUNCH_CHECK("attn_prep_backward");
  launch_column_reduce(dq_norm_w, dqw_f32, partials, blocks, 2 * D, D, s);
  launch_column_reduce(dk_norm_w, dkw_f32, partials + D, blocks, 2 * D, D, s);
}

}  // namespace qt::cuda
