// CudaBackend kernels: (1+w) RMSNorm and gated RMSNorm (forward / backward): the generic kernels
// (any cols, unaligned rows) and the entry points, which pick the kernels by row width
// (rmsnorm_narrow.cu: <= 128 columns, rmsnorm_wide.cu: warp per row up to 4096 columns). Weight
// gradients are reduced deterministically: per-warp fp32 partials, summed in warp order into one
// partial row per block, then the partial rows are summed in block order (launch_column_reduce).
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/rmsnorm_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

constexpr int kBwdWarps = 4;

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

}  // namespace

void launch_rmsnorm_forward(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                            int64_t cols, float eps, NormKind kind, float* amax, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const bool vec = cols % 8 == 0 && aligned16(y) && aligned16(x) && aligned16(w) && (z == nullptr || aligned16(z));
  const unsigned grid = static_cast<unsigned>(ceil_div(rows, kFwdWarps));
  const auto* xb = static_cast<const bf16*>(x);
  const auto* zb = static_cast<const bf16*>(z);
  const auto* wb = static_cast<const bf16*>(w);
  auto* yb = static_cast<bf16*>(y);
  bool fused = false;  // the amax folded in by the kernel (the wide rows), else by a pass after it
  if (vec && narrow_lanes(cols) > 0) {
    rmsnorm_narrow_forward(y, rstd, x, z, w, rows, cols, eps, kind, s);
  } else if (const int nv = vec ? wide_nv(cols) : 0; nv > 0) {
    rmsnorm_wide_forward(nv, y, rstd, x, z, w, rows, cols, eps, kind, reinterpret_cast<unsigned*>(amax), s);
    fused = true;
  } else if (kind == NormKind::OnePlusW) {
    if (vec) rmsnorm_fwd_kernel<8, NormKind::OnePlusW><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
    else rmsnorm_fwd_kernel<1, NormKind::OnePlusW><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
  } else {
    if (vec) rmsnorm_fwd_kernel<8, NormKind::Gated><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
    else rmsnorm_fwd_kernel<1, NormKind::Gated><<<grid, kFwdWarps * 32, 0, s>>>(yb, rstd, xb, zb, wb, rows, cols, eps);
  }
  QT_LAUNCH_CHECK(kind == NormKind::OnePlusW ? "rmsnorm_forward" : "gated_rmsnorm_forward");
  if (amax != nullptr && !fused) launch_amax_fold(reinterpret_cast<unsigned*>(amax), y, rows * cols, s);
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  return sizeof(float) * size_t(bwd_blocks(std::max<int64_t>(rows, 1))) * size_t(cols);
}

void launch_rmsnorm_backward(void* dx, bool accumulate_dx, void* dz, void* dw, bool dw_f32, const void* dy,
                             const void* x, const void* z, const void* w, const float* rstd, int64_t rows,
                             int64_t cols, NormKind kind, void* ws, float* amax_dx, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  QT_CHECK(dw == nullptr || cols <= 12288, "rmsnorm_backward: cols ", cols, " exceeds the CUDA kernel's 12288");
  const bool vec = cols % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(w) &&
                   (dx == nullptr || aligned16(dx)) && (z == nullptr || aligned16(z)) && (dz == nullptr || aligned16(dz));
  QT_CHECK(amax_dx == nullptr || dx != nullptr, "rmsnorm_backward: an amax of dx without dx");
  bool fused = false;  // the amax folded in by the kernel (the ring), else by a pass after it
  int64_t blocks = bwd_blocks(rows);
  float* partials = dw != nullptr ? static_cast<float*>(ws) : nullptr;
  // Gated keeps z in registers too: its wide-row path stops at NV 4 (1024 columns).
  const int nv = vec ? wide_nv(cols) : 0;
  if (vec && narrow_lanes(cols) > 0) {
    rmsnorm_narrow_backward(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, kind, s);
  } else if (nv > 0 && (kind == NormKind::OnePlusW ? nv <= kRingMaxNv : nv <= 4)) {
    blocks = rmsnorm_wide_backward(nv, blocks, dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols,
                                   kind, reinterpret_cast<unsigned*>(amax_dx), &fused, s);
  } else if (kind == NormKind::OnePlusW) {
    if (vec) rmsnorm_bwd_launch<8, NormKind::OnePlusW>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
    else rmsnorm_bwd_launch<1, NormKind::OnePlusW>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
  } else {
    if (vec) rmsnorm_bwd_launch<8, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
    else rmsnorm_bwd_launch<1, NormKind::Gated>(dx, accumulate_dx, dz, partials, dy, x, z, w, rstd, rows, cols, blocks, s);
  }
  QT_LAUNCH_CHECK(kind == NormKind::OnePlusW ? "rmsnorm_backward" : "gated_rmsnorm_backward");
  if (dw != nullptr) launch_column_reduce(dw, dw_f32, partials, blocks, cols, cols, s);
  if (amax_dx != nullptr && !fused) launch_amax_fold(reinterpret_cast<unsigned*>(amax_dx), dx, rows * cols, s);
}

}  // namespace qt::cuda
