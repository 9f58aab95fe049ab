// CudaBackend kernels: RMSNorm with one warp per row and the row in registers (cols % 8 == 0, up to
// 4096 columns, 16-byte rows): forward, residual add + RMSNorm, the gated backward, and the (1+w)
// backward's ring variant (rows streamed by cp.async.bulk, up to 2560 columns).
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/rmsnorm_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

// ---- wide rows: cols % 8 == 0 and cols <= 4096 -------------------------------------------------
// Warp per row with the row held in registers: lane owns the 16-byte vectors lane + 32 j (j < NV),
// so x is read once in the forward and x, dy once in the backward. The backward keeps the warp's
// dw partials in shared memory over all rows it handles (rows w, w + kWideWarps, ... of the
// block's row range), then the block's warps are summed in warp order into one partial row.
constexpr int kWideWarps = 4;

// The norm of one row held in registers (lane owns the 16-byte vectors lane + 32 j, zero past the
// row): rstd and y = x rstd (1 + w) or w x rstd silu(z).
template <int NV, NormKind KIND>
__device__ __forceinline__ void norm_row_from_regs(const uint4 (&xr)[NV], bf16* y, float* rstd, const bf16* z,
                                                   const bf16* w, int64_t row, int64_t cols, float eps, int lane,
                                                   unsigned* amax) {
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
  unsigned m = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    if (i >= cvec) break;
    float v[8];
    dev::unpack8(v, xr[j]);
    const uint4 out = norm_vec8<KIND>(v, rs, w, z + row * cols, i);
    yp[i] = out;
    m = max(m, dev::bf16x8_mag_bits(out));
  }
  if (amax != nullptr) dev::fold_amax_warp(amax, m);
}

template <int NV, NormKind KIND>
__global__ void __launch_bounds__(kWideWarps * 32) rmsnorm_fwd_wide(bf16* __restrict__ y, float* __restrict__ rstd,
                                                                     const bf16* __restrict__ x,
                                                                     const bf16* __restrict__ z,
                                                                     const bf16* __restrict__ w, int64_t rows,
                                                                     int64_t cols, float eps, unsigned* amax) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWideWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t cvec = cols / 8;
  const uint4* xp = reinterpret_cast<const uint4*>(x + row * cols);
  uint4 xr[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = lane + 32 * j;
    xr[j] = i < cvec ? xp[i] : make_uint4(0u, 0u, 0u, 0u);
  }
  norm_row_from_regs<NV, KIND>(xr, y, rstd, z, w, row, cols, eps, lane, amax);
}

// Residual add + (1+w) RMSNorm, wide-row layout: h = bf16(x + r) is formed in registers, stored,
// and normalized from its rounded values in rmsnorm_fwd_wide's summation order, so y and rstd
// equal the unfused add + rmsnorm bit for bit. No __restrict__: h may alias x or r (each lane
// reads its x/r vectors before it writes the same h vectors).
template <int NV>
__global__ void __launch_bounds__(kWideWarps * 32) add_rmsnorm_fwd_wide(bf16* h, bf16* y, float* rstd, const bf16* x,
                                                                         const bf16* r, const bf16* w, int64_t rows,
                                                                         int64_t cols, float eps, unsigned* amax) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWideWarps + (threadIdx.x >> 5);
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
  norm_row_from_regs<NV, NormKind::OnePlusW>(hr, y, rstd, nullptr, w, row, cols, eps, lane, amax);
}

// smem (only with partials): kWideWarps x NV x 256 floats, each warp's dw partials (layout below).
template <int NV, NormKind KIND>
__global__ void __launch_bounds__(kWideWarps * 32) rmsnorm_bwd_wide(
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
  for (int64_t row = r0 + warp; row < r1; row += kWideWarps) {
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
    for (int q = 0; q < kWideWarps; ++q) acc += sm_dw[(int64_t(q) * NV * 64 + slot) * 4 + k % 4];
    partials[int64_t(blockIdx.x) * cols + c] = acc;
  }
}

// Calls f(std::integral_constant<int, nv>) for a count wide_nv returned.
template <typename F>
void dispatch_wide(int nv, F&& f) {
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
void rmsnorm_fwd_wide_launch(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                             int64_t cols, float eps, unsigned* amax, cudaStream_t s) {
  rmsnorm_fwd_wide<NV, KIND><<<static_cast<unsigned>(ceil_div(rows, kWideWarps)), kWideWarps * 32, 0, s>>>(
      static_cast<bf16*>(y), rstd, static_cast<const bf16*>(x), static_cast<const bf16*>(z),
      static_cast<const bf16*>(w), rows, cols, eps, amax);
}

template <int NV, NormKind KIND>
int64_t rmsnorm_bwd_wide_launch(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                             const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols,
                             cudaStream_t s) {
  auto kernel = rmsnorm_bwd_wide<NV, KIND>;
  const size_t smem = partials != nullptr ? sizeof(float) * kWideWarps * NV * 256 : 0;
  // Enough blocks for the resident capacity of the device (one wave), at most bwd_blocks(rows)
  // (the workspace's row count); fewer blocks mean fewer partial rows to reduce.
  static int capacity = 0;
  if (capacity == 0) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWideWarps * 32,
                                                             sizeof(float) * kWideWarps * NV * 256));
    capacity = sm_count() * std::max(1, per_sm);
  }
  const int64_t blocks = std::min<int64_t>(bwd_blocks(rows), capacity);
  kernel<<<static_cast<unsigned>(blocks), kWideWarps * 32, smem, s>>>(
      static_cast<bf16*>(dx), accumulate_dx, static_cast<bf16*>(dz), partials, static_cast<const bf16*>(dy),
      static_cast<const bf16*>(x), static_cast<const bf16*>(z), static_cast<const bf16*>(w), rstd, rows, cols,
      ceil_div(rows, blocks));
  QT_LAUNCH_CHECK(KIND == NormKind::OnePlusW ? "rmsnorm_backward" : "gated_rmsnorm_backward");
  return blocks;
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

// smem: (1+w) as NV x 64 float4 (slot (2 j + h) * 32 + lane: columns (lane + 32 j) * 8 + 4 h ..),
// then NW x D stages of 2 * cols bf16, then NW x D mbarriers.
template <int NV, int NW, int D>
__global__ void __launch_bounds__(NW * 32, 1) rmsnorm_bwd_ring(bf16* __restrict__ dx, bool accumulate_dx,
                                                               float* __restrict__ partials,
                                                               const bf16* __restrict__ dy,
                                                               const bf16* __restrict__ x,
                                                               const bf16* __restrict__ w,
                                                               const float* __restrict__ rstd, int64_t rows,
                                                               int64_t cols, unsigned* amax) {
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
  unsigned m = 0;  // max |dx| over the warp's rows (the amax output)
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
      if (dx != nullptr) {
        const uint4 out = dev::pack8(dxv);
        reinterpret_cast<uint4*>(dx + row * cols)[i] = out;
        m = max(m, dev::bf16x8_mag_bits(out));
      }
    }
  }
  if (amax != nullptr) dev::fold_amax_warp(amax, m);
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
                                const void* w, const float* rstd, int64_t rows, int64_t cols, unsigned* amax,
                                cudaStream_t s) {
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
      static_cast<const bf16*>(w), rstd, rows, cols, amax);
  QT_LAUNCH_CHECK("rmsnorm_backward");
  return blocks;
}

}  // namespace

bool launch_add_rmsnorm_forward(void* h, void* y, float* rstd, const void* x, const void* r, const void* w,
                                int64_t rows, int64_t cols, float eps, float* amax_y, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return true;
  const bool vec = cols % 8 == 0 && aligned16(h) && aligned16(y) && aligned16(x) && aligned16(r) && aligned16(w);
  const int nv = vec ? wide_nv(cols) : 0;
  if (nv == 0) return false;
  const unsigned grid = static_cast<unsigned>(ceil_div(rows, kWideWarps));
  auto* hb = static_cast<bf16*>(h);
  auto* yb = static_cast<bf16*>(y);
  const auto* xb = static_cast<const bf16*>(x);
  const auto* rb = static_cast<const bf16*>(r);
  const auto* wb = static_cast<const bf16*>(w);
  dispatch_wide(nv, [&](auto c) {
    add_rmsnorm_fwd_wide<decltype(c)::value>
        <<<grid, kWideWarps * 32, 0, s>>>(hb, yb, rstd, xb, rb, wb, rows, cols, eps,
                                          reinterpret_cast<unsigned*>(amax_y));
  });
  QT_LAUNCH_CHECK("add_rmsnorm_forward");
  return true;
}

void rmsnorm_wide_forward(int nv, void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                          int64_t cols, float eps, NormKind kind, unsigned* amax, cudaStream_t s) {
  dispatch_wide(nv, [&](auto c) {
    constexpr int NV = decltype(c)::value;
    if (kind == NormKind::OnePlusW)
      rmsnorm_fwd_wide_launch<NV, NormKind::OnePlusW>(y, rstd, x, z, w, rows, cols, eps, amax, s);
    else
      rmsnorm_fwd_wide_launch<NV, NormKind::Gated>(y, rstd, x, z, w, rows, cols, eps, amax, s);
  });
}

int64_t rmsnorm_wide_backward(int nv, int64_t blocks, void* dx, bool accumulate_dx, void* dz, float* partials,
                              const void* dy, const void* x, const void* z, const void* w, const float* rstd,
                              int64_t rows, int64_t cols, NormKind kind, unsigned* amax, bool* amax_done,
                              cudaStream_t s) {
  if (kind == NormKind::OnePlusW) {
    // The ring kernel, 8 warps x 2 row stages per block (3 stages, or 6 warps x 4, measured slower).
    dispatch_wide(nv, [&](auto c) {
      constexpr int NV = decltype(c)::value;
      if constexpr (NV <= kRingMaxNv)
        blocks = rmsnorm_bwd_ring_launch<NV, 8, 2>(dx, accumulate_dx, partials, dy, x, w, rstd, rows, cols, amax, s);
      *amax_done = true;
    });
  } else {
    dispatch_wide(nv, [&](auto c) {
      constexpr int NV = decltype(c)::value;
      if constexpr (NV <= 4)
        blocks = rmsnorm_bwd_wide_launch<NV, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd,
                                                              rows, cols, s);
    });
  }
  return blocks;
}

}  // namespace qt::cuda
