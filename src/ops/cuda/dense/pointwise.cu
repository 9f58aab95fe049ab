// CudaBackend kernels: elementwise add (bf16, f32), SwiGLU and the attention output gate
// (forward / backward), 16-byte vectors where the pointers allow.
#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {
namespace {

template <int VEC>
__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, int64_t nvec) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float x[VEC], y[VEC];
    load_vec<VEC>(x, a, i);
    load_vec<VEC>(y, b, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] += y[k];
    store_vec<VEC>(out, i, x);
  }
}

// fp32 (ZeRO-3 adds a later micro-batch's gradient sums to a shard): four floats a thread where
// aligned, in place allowed.
template <int VEC>
__global__ void add_f32_kernel(float* out, const float* a, const float* b, int64_t nvec) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (VEC == 4) {
      const float4 x = reinterpret_cast<const float4*>(a)[i], y = reinterpret_cast<const float4*>(b)[i];
      reinterpret_cast<float4*>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else {
      out[i] = a[i] + b[i];
    }
  }
}

// amax_* (optional): max|out| folded in (ops_device.cuh), from the bf16-rounded stored values.
template <int VEC>
__global__ void swiglu_fwd_kernel(bf16* h, unsigned* amax_h, const bf16* gate, const bf16* up, int64_t nvec) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float g[VEC], u[VEC];
    load_vec<VEC>(g, gate, i);
    load_vec<VEC>(u, up, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = dev::siluf_(g[k]) * u[k];
    store_vec<VEC>(h, i, g);
    if (amax_h != nullptr)
#pragma unroll
      for (int k = 0; k < VEC; ++k) m = max(m, dev::bf16_mag_bits(g[k]));
  }
  if (amax_h != nullptr) dev::fold_amax_block(amax_h, m);
}

template <int VEC>
__global__ void swiglu_bwd_kernel(bf16* dgate, bf16* dup, unsigned* amax_dgate, unsigned* amax_dup, const bf16* dh,
                                  const bf16* gate, const bf16* up, int64_t nvec) {
  unsigned mg = 0, mu = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float d[VEC], g[VEC], u[VEC], dg[VEC], du[VEC];
    load_vec<VEC>(d, dh, i);
    load_vec<VEC>(g, gate, i);
    load_vec<VEC>(u, up, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dg[k] = d[k] * u[k] * dev::silu_gradf_(g[k]);
      du[k] = d[k] * dev::siluf_(g[k]);
    }
    store_vec<VEC>(dgate, i, dg);
    store_vec<VEC>(dup, i, du);
    if (amax_dgate != nullptr)
#pragma unroll
      for (int k = 0; k < VEC; ++k) mg = max(mg, dev::bf16_mag_bits(dg[k]));
    if (amax_dup != nullptr)
#pragma unroll
      for (int k = 0; k < VEC; ++k) mu = max(mu, dev::bf16_mag_bits(du[k]));
  }
  if (amax_dgate != nullptr) dev::fold_amax_block(amax_dgate, mg);
  if (amax_dup != nullptr) dev::fold_amax_block(amax_dup, mu);
}

template <int VEC>
__global__ void attn_gate_fwd_kernel(bf16* y, const bf16* o, const bf16* gate, int64_t nvec) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float a[VEC], g[VEC];
    load_vec<VEC>(a, o, i);
    load_vec<VEC>(g, gate, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] = a[k] * dev::sigmoidf_(g[k]);
    store_vec<VEC>(y, i, a);
  }
}

// d_o may alias dy: every element is read before it is written, by the same thread.
template <int VEC>
__global__ void attn_gate_bwd_kernel(bf16* d_o, bf16* dgate, const bf16* dy, const bf16* o, const bf16* gate,
                                     int64_t nvec) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float d[VEC], a[VEC], g[VEC], r_o[VEC], r_g[VEC];
    load_vec<VEC>(d, dy, i);
    load_vec<VEC>(a, o, i);
    load_vec<VEC>(g, gate, i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float sg = dev::sigmoidf_(g[k]);
      r_o[k] = d[k] * sg;
      r_g[k] = d[k] * a[k] * sg * (1.0f - sg);
    }
    store_vec<VEC>(d_o, i, r_o);
    store_vec<VEC>(dgate, i, r_g);
  }
}

}  // namespace

#define QT_POINTWISE_LAUNCH(kernel, name, n, ptrs, ...)                                        \
  do {                                                                                         \
    if ((n) <= 0) return;                                                                      \
    if ((n) % 8 == 0 && (ptrs)) {                                                   \
      kernel<8><<<grid_for((n) / 8, kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n) / 8);        \
    } else {                                                                                   \
      kernel<1><<<grid_for((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n));                \
    }                                                                                          \
    QT_LAUNCH_CHECK(name);                                                                     \
  } while (0)

void launch_add(void* out, const void* a, const void* b, int64_t n, cudaStream_t s) {
  QT_POINTWISE_LAUNCH(add_kernel, "add", n, (aligned16(out) && aligned16(a) && aligned16(b)), static_cast<bf16*>(out), static_cast<const bf16*>(a),
                      static_cast<const bf16*>(b));
}

void launch_add_f32(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (n % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(b))
    add_f32_kernel<4><<<grid_for(n / 4, kThreads), kThreads, 0, s>>>(out, a, b, n / 4);
  else
    add_f32_kernel<1><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
  QT_LAUNCH_CHECK("add (f32)");
}

// With an amax output the grid is capped (8 blocks an SM, grid-stride): one atomic per block.
#define QT_POINTWISE_LAUNCH_TAPPED(kernel, name, n, ptrs, tapped, ...)                                      \
  do {                                                                                                    \
    if ((n) <= 0) return;                                                                                 \
    const int64_t nv_ = (n) % 8 == 0 && (ptrs) ? (n) / 8 : (n);                                           \
    const unsigned grid_ = (tapped) ? std::min(grid_for(nv_, kThreads), 1056u) : grid_for(nv_, kThreads); \
    if (nv_ != (n)) kernel<8><<<grid_, kThreads, 0, s>>>(__VA_ARGS__, nv_);                               \
    else kernel<1><<<grid_, kThreads, 0, s>>>(__VA_ARGS__, nv_);                                          \
    QT_LAUNCH_CHECK(name);                                                                                \
  } while (0)

void launch_swiglu_forward(void* h, float* amax_h, const void* gate, const void* up, int64_t n, cudaStream_t s) {
  QT_POINTWISE_LAUNCH_TAPPED(swiglu_fwd_kernel, "swiglu_forward", n, (aligned16(h) && aligned16(gate) && aligned16(up)),
                             amax_h != nullptr, static_cast<bf16*>(h), reinterpret_cast<unsigned*>(amax_h),
                             static_cast<const bf16*>(gate), static_cast<const bf16*>(up));
}

void launch_swiglu_backward(void* dgate, void* dup, float* amax_dgate, float* amax_dup, const void* dh,
                            const void* gate, const void* up, int64_t n, cudaStream_t s) {
  QT_POINTWISE_LAUNCH_TAPPED(
      swiglu_bwd_kernel, "swiglu_backward", n,
      (aligned16(dgate) && aligned16(dup) && aligned16(dh) && aligned16(gate) && aligned16(up)),
      amax_dgate != nullptr || amax_dup != nullptr, static_cast<bf16*>(dgate), static_cast<bf16*>(dup),
      reinterpret_cast<unsigned*>(amax_dgate), reinterpret_cast<unsigned*>(amax_dup), static_cast<const bf16*>(dh),
      static_cast<const bf16*>(gate), static_cast<const bf16*>(up));
}
#undef QT_POINTWISE_LAUNCH_TAPPED

void launch_attn_gate_forward(void* y, const void* o, const void* gate, int64_t n, cudaStream_t s) {
  QT_POINTWISE_LAUNCH(attn_gate_fwd_kernel, "attn_gate_forward", n, (aligned16(y) && aligned16(o) && aligned16(gate)), static_cast<bf16*>(y),
                      static_cast<const bf16*>(o), static_cast<const bf16*>(gate));
}

void launch_attn_gate_backward(void* d_o, void* dgate, const void* dy, const void* o, const void* gate, int64_t n,
                               cudaStream_t s) {
  QT_POINTWISE_LAUNCH(attn_gate_bwd_kernel, "attn_gate_backward", n, (aligned16(d_o) && aligned16(dgate) && aligned16(dy) && aligned16(o) && aligned16(gate)),
                      static_cast<bf16*>(d_o), static_cast<bf16*>(dgate), static_cast<const bf16*>(dy),
                      static_cast<const bf16*>(o), static_cast<const bf16*>(gate));
}
#undef QT_POINTWISE_LAUNCH

}  // namespace qt::cuda
