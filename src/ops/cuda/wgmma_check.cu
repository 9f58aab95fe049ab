// wgmma_gemm_check (kernels.h): one warpgroup computes C[64, N] = A[64, K] B with B staged in
// 128-byte-swizzled shared memory (wgmma.cuh), either K-major ([N, K]) or N-major ([K, N]), and A
// either staged the same way (K-major) or held in registers as m64nNk16 A fragments. It exists to
// pin the descriptor and fragment conventions of wgmma.cuh against a host reference
// (tests/test_cuda_wgmma.cpp) before kernels build on them; it is not tuned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda {
namespace {

using bf16 = __nv_bfloat16;

template <int N, bool kBKMajor, int kAMode>
__global__ void __launch_bounds__(128) wgmma_check_kernel(float* __restrict__ c, const bf16* __restrict__ a,
                                                          const bf16* __restrict__ b, int K) {
  extern __shared__ __align__(16) char wgc_sm[];
  // Panels must start 1024-byte aligned (the swizzle works on address bits).
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(wgc_sm));
  char* as = wgc_sm + ((1024u - (s0 & 1023u)) & 1023u);
  char* bs = as + 64 * K * 2;
  const int tid = threadIdx.x;
  constexpr bool kARegs = kAMode == kWgmmaARegisters, kAMMajor = kAMode == kWgmmaASmemMMajor;
  for (int i = tid; i < 64 * K; i += 128) {
    const int r = i / K, col = i % K;
    if constexpr (kAMMajor)  // A as [K, 64]: one 64-column block of K rows
      *reinterpret_cast<bf16*>(as + wg::sw128(col, r)) = a[i];
    else  // A [64, K]: panel (col / 64) of 64 rows x 128 bytes
      *reinterpret_cast<bf16*>(as + (col / 64) * 8192 + wg::sw128(r, col % 64)) = a[i];
  }
  for (int i = tid; i < N * K; i += 128) {
    if constexpr (kBKMajor) {  // B as [N, K]: panel (k / 64) of N rows
      const int n = i / K, k = i % K;
      *reinterpret_cast<bf16*>(bs + (k / 64) * (N * 128) + wg::sw128(n, k % 64)) = b[i];
    } else {  // B as [K, N]: block (n / 64) of K rows
      const int k = i / N, n = i % N;
      *reinterpret_cast<bf16*>(bs + (n / 64) * (K * 128) + wg::sw128(k, n % 64)) = b[i];
    }
  }
  wg::fence_proxy_async();
  __syncthreads();
  float d[N / 2];
#pragma unroll
  for (int j = 0; j < N / 2; ++j) d[j] = 0.0f;
  const int warp = tid / 32, lane = tid % 32, r0 = 16 * warp + lane / 4;
  // A fragments of every k16 step, built before the fence (registers written between wgmma
  // instructions would need another fence).
  constexpr int kMaxSteps = 16;
  uint32_t af[kMaxSteps][4];
  if constexpr (kARegs) {
    auto pair = [&](int r, int col) {
      const uint16_t lo = __bfloat16_as_ushort(a[r * K + col]), hi = __bfloat16_as_ushort(a[r * K + col + 1]);
      return uint32_t(lo) | (uint32_t(hi) << 16);
    };
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s) {
      if (s >= K / 16) break;
      const int c0 = 16 * s + 2 * (lane % 4);
      af[s][0] = pair(r0, c0);
      af[s][1] = pair(r0 + 8, c0);
      af[s][2] = pair(r0, c0 + 8);
      af[s][3] = pair(r0 + 8, c0 + 8);
    }
  }
  wg::fence();
#pragma unroll
  for (int s = 0; s < kMaxSteps; ++s) {
    if (s >= K / 16) break;
    const uint64_t db = kBKMajor ? wg::desc_sw128(bs + (s / 4) * (N * 128) + (s % 4) * 32, 16, 1024)
                                 : wg::desc_sw128(bs + s * 2048, K * 128, 1024);
    constexpr int kT = kBKMajor ? 0 : 1;
    if constexpr (kARegs) {
      if constexpr (N == 64) wg::mma_m64n64k16_rs<kT>(d, af[s], db, 1);
      else if constexpr (N == 128) wg::mma_m64n128k16_rs<kT>(d, af[s], db, 1);
      else wg::mma_m64n256k16_rs<kT>(d, af[s], db, 1);
    } else {
      const uint64_t da = kAMMajor ? wg::desc_sw128(as + s * 2048, K * 128, 1024)
                                   : wg::desc_sw128(as + (s / 4) * 8192 + (s % 4) * 32, 16, 1024);
      constexpr int kTA = kAMMajor ? 1 : 0;
      if constexpr (N == 64) wg::mma_m64n64k16<kT, kTA>(d, da, db, 1);
      else if constexpr (N == 128) wg::mma_m64n128k16<kT, kTA>(d, da, db, 1);
      else wg::mma_m64n256k16<kT, kTA>(d, da, db, 1);
    }
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_operands(d);
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int col = 8 * j + 2 * (lane % 4);
    c[r0 * N + col] = d[4 * j];
    c[r0 * N + col + 1] = d[4 * j + 1];
    c[(r0 + 8) * N + col] = d[4 * j + 2];
    c[(r0 + 8) * N + col + 1] = d[4 * j + 3];
  }
}

template <int N, bool kBKMajor, int kAMode>
void launch_wgmma_check(float* c, const void* a, const void* b, int k, cudaStream_t stream) {
  const int smem = 64 * k * 2 + N * k * 2 + 1024;
  auto kernel = wgmma_check_kernel<N, kBKMajor, kAMode>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<1, 128, smem, stream>>>(c, static_cast<const bf16*>(a), static_cast<const bf16*>(b), k);
  QT_LAUNCH_CHECK("wgmma_check_kernel");
}

}  // namespace

void wgmma_gemm_check(float* c, const void* a, const void* b, int n, int k, bool b_k_major, WgmmaA a_form,
                      cudaStream_t stream) {
  QT_CHECK(n == 64 || n == 128 || n == 256, "wgmma_gemm_check: n = ", n, " (64, 128 or 256)");
  QT_CHECK(k > 0 && k % 64 == 0 && k <= 256, "wgmma_gemm_check: k = ", k, " (a multiple of 64, at most 256)");
  QT_CHECK(a_form == kWgmmaASmemKMajor || a_form == kWgmmaASmemMMajor || a_form == kWgmmaARegisters,
           "wgmma_gemm_check: a_form = ", int(a_form), " (0, 1 or 2)");
  // One instantiation per (n, b layout, a form).
  using Launch = void (*)(float*, const void*, const void*, int, cudaStream_t);
  static constexpr Launch kTable[3][2][3] = {
      {{launch_wgmma_check<64, false, 0>, launch_wgmma_check<64, false, 1>, launch_wgmma_check<64, false, 2>},
       {launch_wgmma_check<64, true, 0>, launch_wgmma_check<64, true, 1>, launch_wgmma_check<64, true, 2>}},
      {{launch_wgmma_check<128, false, 0>, launch_wgmma_check<128, false, 1>, launch_wgmma_check<128, false, 2>},
       {launch_wgmma_check<128, true, 0>, launch_wgmma_check<128, true, 1>, launch_wgmma_check<128, true, 2>}},
      {{launch_wgmma_check<256, false, 0>, launch_wgmma_check<256, false, 1>, launch_wgmma_check<256, false, 2>},
       {launch_wgmma_check<256, true, 0>, launch_wgmma_check<256, true, 1>, launch_wgmma_check<256, true, 2>}}};
  kTable[n == 64 ? 0 : n == 128 ? 1 : 2][b_k_major ? 1 : 0][a_form](c, a, b, k, stream);
}

}  // namespace qt::cuda
