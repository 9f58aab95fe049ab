// Device helpers shared by the backend's kernel files (internal to src/ops/cuda).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "ops/cuda/cuda_check.h"

namespace qt::cuda::dev {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }
__device__ __forceinline__ float silu_gradf_(float x) {
  const float s = sigmoidf_(x);
  return s * (1.0f + x * (1.0f - s));
}

// Fast-math SiLU and its derivative (ex2 + reciprocal on the SFU, a few ulp off the exact ones;
// far below bf16 rounding) for the bandwidth-bound kernels whose issue rate matters (conv1d, the
// gated RMSNorm).
// The .ftz forms are one SFU instruction each; without .ftz ptxas wraps both in denormal range
// fixes. Flushing is harmless here: 1 + 2^y >= 1, and a flushed 2^y only drops a term below 2^-126.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;  // e^x = 2^(x kLog2e)
__device__ __forceinline__ float sigmoid_fast(float x) { return rcp_ftz(1.0f + ex2_ftz(x * -kLog2e)); }
__device__ __forceinline__ float silu_fast(float x) { return x * sigmoid_fast(x); }
__device__ __forceinline__ float silu_grad_fast(float x) {
  const float s = sigmoid_fast(x);
  return s * (1.0f + x * (1.0f - s));
}

// VEC consecutive bf16 elements starting at element i*VEC: VEC == 8 is one 16-byte access, VEC == 4
// one 8-byte access (the caller guarantees alignment), VEC == 1 a scalar one.
template <int VEC>
__device__ __forceinline__ void load_vec(float (&out)[VEC], const bf16* p, int64_t i) {
  if constexpr (VEC == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + i * 8);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  } else if constexpr (VEC == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p + i * 4);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  } else {
    static_assert(VEC == 1, "VEC must be 1, 4 or 8");
    out[0] = to_f(p[i]);
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(bf16* p, int64_t i, const float (&v)[VEC]) {
  if constexpr (VEC == 8) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4*>(p + i * 8) = raw;
  } else if constexpr (VEC == 4) {
    uint2 raw;
    *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v[0], v[1]);
    *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p + i * 4) = raw;
  } else {
    p[i] = to_bf(v[0]);
  }
}

// 4 floats to 4 bf16 at p (8-byte aligned) in one st.global.v2. store_vec<4> above compiles to two
// 4-byte stores in the conv1d kernels (NVVM splits the uint2 there), each warp store then
// half-masking its 256 bytes; __stwb (st.global.wb = the default policy) keeps it one.
__device__ __forceinline__ void store4_v2(bf16* p, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  __stwb(reinterpret_cast<uint2*>(p),
         make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)));
}

// 8 bf16 packed in 16 bytes <-> 8 floats.
__device__ __forceinline__ void unpack8(float (&out)[8], const uint4& raw) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  return raw;
}

// FP8 amax taps (docs/fp8.md): the magnitude of v rounded to bf16, as the bits of a float, so the
// unsigned order is the magnitude order (NaN above inf) and the word reads as max|x| in f32.
__device__ __forceinline__ unsigned bf16_mag_bits(float v) {
  return (unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(v))) & 0x7FFFu) << 16;
}
__device__ __forceinline__ unsigned bf16x8_mag_bits(const uint4& raw) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned m = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) m = max(m, max((w[k] & 0x7FFFu) << 16, (w[k] >> 16 & 0x7FFFu) << 16));
  return m;
}
// Folds every thread's m into *amax with one atomicMax per block (none for an all-zero block).
// Every thread of the block calls it; blockDim.x a multiple of 32.
__device__ __forceinline__ void fold_amax_block(unsigned* amax, unsigned m) {
  __shared__ unsigned warp_m[32];
  m = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) m = max(m, warp_m[w]);
    if (m != 0) atomicMax(amax, m);
  }
  __syncthreads();  // warp_m is shared by every call in the kernel
}

// The same for kernels whose warps work alone (a warp per row): one atomicMax per warp, skipped
// when the word already holds as much. All 32 lanes call it.
__device__ __forceinline__ void fold_amax_warp(unsigned* amax, unsigned m) {
  m = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0 && m > *reinterpret_cast<volatile unsigned*>(amax)) atomicMax(amax, m);
}

// Adds v into an accumulator element stored as bf16 or f32.
__device__ __forceinline__ void acc_store(void* out, bool out_f32, int64_t i, float v) {
  if (out_f32) {
    float* o = static_cast<float*>(out) + i;
    *o = *o + v;
  } else {
    bf16* o = static_cast<bf16*>(out) + i;
    *o = to_bf(to_f(*o) + v);
  }
}

// Sum over each group of WIDTH consecutive lanes (a power of 2; the whole warp by default), every
// lane of the group getting it; all 32 lanes must take part.
template <int WIDTH = 32>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The largest v over the warp, every lane getting it; all 32 lanes must take part.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// In-place inclusive prefix sum of s[0, blockDim.x) by the whole block (blockDim.x a multiple of 32,
// at most 1024: the one-block work-list kernels). Every thread must call it; it starts and ends with
// a barrier. Shuffle scans within the warps, then over the warps' totals: 4 barriers, where the
// Hillis-Steele form it replaced took 2 per doubling (21 at 1024 threads) on the chain ahead of the
// GDN and attention kernels.
__device__ __forceinline__ void block_inclusive_scan(int* s) {
  __shared__ int warp_tot[32];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = static_cast<int>(blockDim.x) >> 5;
  __syncthreads();
  int v = s[tid];
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) warp_tot[wid] = v;
  __syncthreads();
  if (wid == 0) {
    int w = lane < nw ? warp_tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    if (lane < nw) warp_tot[lane] = w;
  }
  __syncthreads();
  if (wid > 0) v += warp_tot[wid - 1];
  s[tid] = v;
  __syncthreads();
}

// ---- shared-memory barriers (mbarrier) and the async proxy -------------------------------------
// An mbarrier phase completes when `count` arrivals (mbar_init) and every transaction byte
// announced by arrive_expect_tx have landed; waiters poll the parity of the phase they expect
// (0 for the first use, then alternating). Used by the TMA / bulk-copy kernels (wgmma.cuh's users,
// the RMSNorm ring).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// One thread; fenced so the async proxy (TMA) sees the initialised barrier; a CTA barrier must
// follow before other threads use it.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Generic-proxy writes to smem ordered before the async proxy's (TMA, bulk copies, wgmma) accesses.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace qt::cuda::dev

namespace qt::cuda {
// True when every pointer is 16-byte aligned (vectorized 8 x bf16 access is legal).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Grid size for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t g = ceil_div(n, threads);
  return static_cast<unsigned>(g < 1 ? 1 : (g > 65536 ? 65536 : g));
}
// Lets `kernel` take `bytes` of dynamic shared memory (the opt-in above 48 KB; cheap, and repeated
// per call so every device has it).
template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}
// Launches `kernel` on `stream` with `smem` bytes of dynamic shared memory (set_smem first), then
// checks the launch under the kernel's name `what`.
template <class... P, class... A>
void launch_smem(void (*kernel)(P...), const char* what, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 A&&... args) {
  set_smem(kernel, smem);
  kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
  QT_LAUNCH_CHECK(what);
}
// launch_smem, with programmatic dependent launch where `beside`: the kernel may then start once
// every CTA of the previous kernel in the stream has run griddepcontrol.launch_dependents (or
// exited), so it must wait for what it reads of that kernel's results by itself.
template <class... P, class... A>
void launch_smem_beside(bool beside, void (*kernel)(P...), const char* what, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, A&&... args) {
  if (!beside) {
    launch_smem(kernel, what, grid, block, smem, stream, std::forward<A>(args)...);
    return;
  }
  set_smem(kernel, smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  QT_LAUNCH_CHECK(what);
}
}  // namespace qt::cuda
