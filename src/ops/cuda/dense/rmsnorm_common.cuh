// What the RMSNorm files (rmsnorm.cu: generic kernels and the launch_* entry points,
// rmsnorm_wide.cu: warp per row, rmsnorm_narrow.cu: <= 128 columns) share: the backward's block
// count, the 16-byte-vector norm, the shape tests the dispatch runs, and the per-shape launchers.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

constexpr int64_t kRowsPerBwdBlock = 16;

inline int64_t bwd_blocks(int64_t rows) { return std::min<int64_t>(kMaxPartialBlocks, ceil_div(rows, kRowsPerBwdBlock)); }

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

// 16-byte vectors per lane of the one-warp-per-row kernels: the smallest instantiated count that
// covers the row (10: the 4B hidden size 2560; 16: 4096), 0 when the row is wider or cols % 8 != 0.
inline int wide_nv(int64_t cols) {
  const int64_t cvec = cols / 8;
  if (cols % 8 != 0) return 0;
  for (int nv : {1, 2, 4, 8, 10, 12, 16})
    if (32 * nv >= cvec) return nv;
  return 0;
}

// Lanes per row of the narrow kernels (rmsnorm_narrow.cu), 0 outside their shapes.
inline int narrow_lanes(int64_t cols) {
  if (cols % 8 != 0 || cols > 128) return 0;
  int lpr = 1;
  while (lpr * 8 < cols) lpr *= 2;
  return lpr;
}

// Widest ring row in 16-byte vectors per lane: the row (2 NV uint4) and the dw sums (8 NV floats)
// live in registers; 10 covers 2560 columns.
constexpr int kRingMaxNv = 10;

}  // namespace

// rmsnorm_wide.cu: one warp per row, nv = wide_nv(cols) > 0. The backward takes the ring kernel
// for (1+w) (nv <= kRingMaxNv) and the register kernel for the gated norm (nv <= 4); it returns the
// number of partial rows written (blocks when nothing was launched).
// amax (optional): max|y| (forward) or max|dx| (the ring backward, which sets *amax_done) folded in.
void rmsnorm_wide_forward(int nv, void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                          int64_t cols, float eps, NormKind kind, unsigned* amax, cudaStream_t s);
int64_t rmsnorm_wide_backward(int nv, int64_t blocks, void* dx, bool accumulate_dx, void* dz, float* partials,
                              const void* dy, const void* x, const void* z, const void* w, const float* rstd,
                              int64_t rows, int64_t cols, NormKind kind, unsigned* amax, bool* amax_done,
                              cudaStream_t s);
// rmsnorm_narrow.cu: narrow_lanes(cols) > 0.
void rmsnorm_narrow_forward(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                            int64_t cols, float eps, NormKind kind, cudaStream_t s);
void rmsnorm_narrow_backward(void* dx, bool accumulate_dx, void* dz, float* partials, const void* dy, const void* x,
                             const void* z, const void* w, const float* rstd, int64_t rows, int64_t cols,
                             int64_t blocks, NormKind kind, cudaStream_t s);

}  // namespace qt::cuda
