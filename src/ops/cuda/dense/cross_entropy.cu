// CudaBackend kernels: the cross-entropy chunk kernel (row loss and the in-place bf16 gradient of
// fp32 logits, or the FP8 head's e5m2 codes of p - onehot) and the loss sum in double.
#include <cuda_fp8.h>

#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {
constexpr int kCeThreads = 512;
constexpr int kCeUnroll = 8;  // elements per thread per in-place rewrite step

__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// One block per row, two passes over the fp32 row: online max / sum of exp, then the bf16
// gradient in place. VEC = 4 (V % 4 == 0: 16-byte rows) moves float4s, so each thread keeps 16
// bytes per load in flight: the scalar form left the kernel latency-bound (4 bytes per thread).
// E5M2 (VEC 4 only): the gradient is written as e5m2 codes of (p - onehot) 2^15 over the first
// quarter of the row instead (grad_scale then rides on the GEMMs that read them).
template <int VEC, bool E5M2>
__global__ void __launch_bounds__(kCeThreads) cross_entropy_kernel(float* logits, float* row_loss,
                                                                   const int32_t* targets, int64_t V,
                                                                   float grad_scale, bool want_grad) {
  static_assert(!E5M2 || VEC == 4, "the e5m2 codes are written four at a time");
  __shared__ float sm_m[kCeThreads / 32], sm_s[kCeThreads / 32];
  __shared__ float sh_lse;
  const int64_t r = blockIdx.x;
  float* row = logits + r * V;
  const int32_t tgt = targets[r];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t nv = V / VEC;  // vectors per row (V % VEC == 0)
  bf16* out = reinterpret_cast<bf16*>(row);
  using Vec = std::conditional_t<VEC == 4, float4, float>;
  const Vec* rv = reinterpret_cast<const Vec*>(row);
  auto lanes = [](const Vec& z, float (&f)[VEC]) {
    if constexpr (VEC == 4) {
      f[0] = z.x;
      f[1] = z.y;
      f[2] = z.z;
      f[3] = z.w;
    } else {
      f[0] = z;
    }
  };
  if (tgt < 0 || tgt >= V) {  // ignored (-100) row: no loss, zero gradient
    if (tid == 0) row_loss[r] = 0.0f;
    if (want_grad) {
      const float zero[VEC] = {};
      for (int64_t i = tid; i < nv; i += kCeThreads) {
        if constexpr (E5M2) reinterpret_cast<uint32_t*>(row)[i] = 0u;
        else store_vec<VEC>(out, i, zero);
      }
    }
    return;
  }
  // Pass 1: online max / sum of exp (one rescale per vector).
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = tid; i < nv; i += kCeThreads) {
    float f[VEC];
    lanes(rv[i], f);
    float mx = f[0];
#pragma unroll
    for (int k = 1; k < VEC; ++k) mx = fmaxf(mx, f[k]);
    const float m2 = fmaxf(m, mx);
    s *= expf(m - m2);
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += expf(f[k] - m2);
    m = m2;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, m2, s2);
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  if (tid == 0) {
    float M = sm_m[0], S = sm_s[0];
    for (int w = 1; w < kCeThreads / 32; ++w) merge_max_sum(M, S, sm_m[w], sm_s[w]);
    const float lse = M + logf(S);
    sh_lse = lse;
    row_loss[r] = lse - row[tgt];
  }
  __syncthreads();
  if (!want_grad) return;
  const float lse = sh_lse;
  // Pass 2: bf16 gradient written over the first half of the fp32 row. Step k reads vectors
  // [k*N, (k+1)*N) (N = threads * unroll) before a barrier and then writes their bf16 values,
  // whose bytes lie inside fp32 elements < (k+1)*N*VEC/2: all already read.
  constexpr int kUnroll = kCeUnroll / VEC > 0 ? kCeUnroll / VEC : 1;
  constexpr int64_t kStep = int64_t(kCeThreads) * kUnroll;
  for (int64_t base = 0; base < nv; base += kStep) {
    Vec p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * kCeThreads + tid;
      if (i < nv) p[u] = rv[i];
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * kCeThreads + tid;
      if (i < nv) {
        float f[VEC], d[VEC];
        lanes(p[u], f);
        if constexpr (E5M2) {
          constexpr float kCodeScale = 32768.0f;  // 2^15: |p - onehot| <= 1 stays under e5m2's 57344
#pragma unroll
          for (int k = 0; k < VEC; ++k) d[k] = (expf(f[k] - lse) - (i * VEC + k == tgt ? 1.0f : 0.0f)) * kCodeScale;
          const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(d[0], d[1]), __NV_SATFINITE, __NV_E5M2);
          const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(d[2], d[3]), __NV_SATFINITE, __NV_E5M2);
          reinterpret_cast<uint32_t*>(row)[i] = lo | (hi << 16);  // bytes 4i..4i+3: inside fp32 element i, read
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            d[k] = grad_scale * expf(f[k] - lse);
            if (i * VEC + k == tgt) d[k] -= grad_scale;
          }
          store_vec<VEC>(out, i, d);
        }
      }
    }
    __syncthreads();
  }
}

__global__ void sum_to_double_kernel(double* out, const float* x, int64_t n) {
  __shared__ double sm[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(x[i]);
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sm[threadIdx.x] += sm[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sm[0];
}
}  // namespace

void launch_cross_entropy_chunk(float* logits, float* row_loss, const int32_t* targets, int64_t n, int64_t V,
                                float grad_scale, bool want_grad, cudaStream_t s) {
  if (n <= 0) return;
  if (V % 4 == 0)
    cross_entropy_kernel<4, false><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(logits, row_loss, targets, V,
                                                                                  grad_scale, want_grad);
  else
    cross_entropy_kernel<1, false><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(logits, row_loss, targets, V,
                                                                                  grad_scale, want_grad);
  QT_LAUNCH_CHECK("linear_cross_entropy (softmax chunk)");
}

void launch_cross_entropy_chunk_e5m2(float* logits, float* row_loss, const int32_t* targets, int64_t n, int64_t V,
                                     bool want_grad, cudaStream_t s) {
  if (n <= 0) return;
  QT_CHECK(V % 4 == 0, "linear_cross_entropy_fp8: V = ", V, " is not a multiple of 4");
  cross_entropy_kernel<4, true><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(logits, row_loss, targets, V, 1.0f,
                                                                               want_grad);
  QT_LAUNCH_CHECK("linear_cross_entropy_fp8 (softmax chunk)");
}

void launch_sum_to_double(double* out, const float* x, int64_t n, cudaStream_t s) {
  sum_to_double_kernel<<<1, 1024, 0, s>>>(out, x, n);
  QT_LAUNCH_CHECK("linear_cross_entropy (loss sum)");
}

}  // namespace qt::cuda
