// The attention backward's small element-wise kernels around the mma.sync and wgmma ones:
// attn_bwd_pre_kernel (Dsum = rowsum(dO * O), lse in log2 units, the atomic mode's dQ accumulator
// zeroed; the mma.sync backward's first launch; at head dim 256 the wgmma dQ kernel does this
// itself), attn_bwd_dkv_sum_kernel (the split CTAs' f32 dK / dV slices summed in split order, both
// backward paths) and attn_bwd_post_kernel (dq = bf16(scale dQaccum) after the atomic mma.sync
// backward).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/attention/common.cuh"
#include "ops/cuda/cuda_check.h"

namespace qt::cuda::attn {
namespace {

// One warp per (token, q head): Dsum, lse2, and zeroes that row of the dQ accumulator.
template <int D>
__global__ void __launch_bounds__(256) attn_bwd_pre_kernel(float* dsum, float* lse2, float* dq_acc,
                                                           const bf16* d_o, const bf16* o, const float* lse,
                                                           int total, int hq) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= static_cast<int64_t>(total) * hq) return;
  const int64_t t = row / hq, h = row % hq;
  float acc = 0.f;
  for (int c = lane; c < D / 8; c += 32) {
    const uint4 a = *reinterpret_cast<const uint4*>(d_o + row * D + c * 8);
    const uint4 b = *reinterpret_cast<const uint4*>(o + row * D + c * 8);
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(a2[i]), y = __bfloat1622float2(b2[i]);
      acc = fmaf(x.x, y.x, acc);
      acc = fmaf(x.y, y.y, acc);
    }
  }
  if (dq_acc != nullptr)  // null when dQ comes from the deterministic kernel
    for (int c = lane; c < D / 4; c += 32)
      reinterpret_cast<float4*>(dq_acc + row * D)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    dsum[h * total + t] = acc;
    lse2[h * total + t] = lse[h * total + t] * kLog2e;
  }
}

// dk, dv = bf16(sum over the splits' f32 slices, in split order), 4 elements per thread.
__global__ void __launch_bounds__(256) attn_bwd_dkv_sum_kernel(bf16* dk, bf16* dv, const float* parts, int64_t n4,
                                                                int splits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= 2 * n4) return;
  const bool is_v = i >= n4;
  const int64_t j = is_v ? i - n4 : i;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < splits; ++s) {
    const float4 v = reinterpret_cast<const float4*>(parts)[(2 * s + (is_v ? 1 : 0)) * n4 + j];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  uint2 out;
  out.x = pack_bf16(acc.x, acc.y);
  out.y = pack_bf16(acc.z, acc.w);
  reinterpret_cast<uint2*>(is_v ? dv : dk)[j] = out;
}

// dq = bf16(scale * dq_acc), 8 elements per thread.
__global__ void __launch_bounds__(256) attn_bwd_post_kernel(bf16* dq, const float* dq_acc, int64_t n8, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 a = reinterpret_cast<const float4*>(dq_acc)[2 * i];
  const float4 b = reinterpret_cast<const float4*>(dq_acc)[2 * i + 1];
  uint4 out;
  out.x = pack_bf16(a.x * scale, a.y * scale);
  out.y = pack_bf16(a.z * scale, a.w * scale);
  out.z = pack_bf16(b.x * scale, b.y * scale);
  out.w = pack_bf16(b.z * scale, b.w * scale);
  reinterpret_cast<uint4*>(dq)[i] = out;
}

}  // namespace

template <int D>
void launch_bwd_pre(float* dsum, float* lse2, float* dq_acc, const bf16* d_o, const bf16* o, const float* lse,
                    int total, int hq, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(total) * hq;
  attn_bwd_pre_kernel<D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(dsum, lse2, dq_acc, d_o, o, lse,
                                                                                    total, hq);
  QT_LAUNCH_CHECK("attn_bwd_pre_kernel");
}
// The head dims attention.cu dispatches to.
template void launch_bwd_pre<64>(float*, float*, float*, const bf16*, const bf16*, const float*, int, int,
                                 cudaStream_t);
template void launch_bwd_pre<128>(float*, float*, float*, const bf16*, const bf16*, const float*, int, int,
                                  cudaStream_t);
template void launch_bwd_pre<256>(float*, float*, float*, const bf16*, const bf16*, const float*, int, int,
                                  cudaStream_t);

void launch_bwd_dkv_sum(bf16* dk, bf16* dv, const float* parts, int64_t n4, int splits, cudaStream_t stream) {
  attn_bwd_dkv_sum_kernel<<<static_cast<unsigned>((2 * n4 + 255) / 256), 256, 0, stream>>>(dk, dv, parts, n4, splits);
  QT_LAUNCH_CHECK("attn_bwd_dkv_sum_kernel");
}

void launch_bwd_post(bf16* dq, const float* dq_acc, int64_t n8, float scale, cudaStream_t stream) {
  attn_bwd_post_kernel<<<static_cast<unsigned>((n8 + 255) / 256), 256, 0, stream>>>(dq, dq_acc, n8, scale);
  QT_LAUNCH_CHECK("attn_bwd_post_kernel");
}

}  // namespace qt::cuda::attn
