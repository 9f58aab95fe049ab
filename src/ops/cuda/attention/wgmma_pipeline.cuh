// Device helpers of the head-dim-256 wgmma kernels (forward.cu, bwd_dq.cu, bwd_dkv.cu): the panel
// tiles, the products they share, and the warp-specialized structure's pieces (roles, TMA tile
// loads, the mbarrier load rings).
//
// Tiles are stored in wgmma's 128-byte-swizzle panels (wgmma.cuh): column block c / 64 of a
// [ROWS][256] tile at c / 64 * ROWS * 128 bytes, row r at r * 128 inside it, 16-byte chunk x at
// x ^ (r & 7). K and V use the same layout: K is K-major B of S (rows = keys), V the N-major B of
// P V (rows = keys = the K dimension, 64-column blocks 64 * 128 bytes apart = LBO).
//
// Every kernel here is warp-specialized (FA3's structure), 384 threads: warpgroup 0 is the
// producer, one thread of it issuing every tile load by TMA (2-D boxes of 64 columns x the tile's
// rows, written by the hardware into the panels), and it gives its registers to the others
// (setmaxnreg); warpgroups 1 and 2 are the consumers and never issue a load. Each load ring stage
// has a `full` barrier (its TMA bytes landed) and an `empty` one (all 8 consumer warps are done
// reading it), so the producer runs ahead by the ring's depth and there is no CTA barrier after the
// setup.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/common.cuh"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda::attn {
namespace {

constexpr size_t kWgTileBytes = size_t(kWgBN) * kWgD * 2;

// One fragment row (r = 0: row g, 1: row g + 8) of a m64n256 accumulator times mul, as bf16 pairs
// straight to global: thread t4 of the quad writes columns 8 j + 2 t4, + 1.
__device__ __forceinline__ void store_row_pairs(bf16* row, const float (&acc)[kWgD / 8][4], int r, float mul,
                                                int t4) {
#pragma unroll
  for (int j = 0; j < kWgD / 8; ++j)
    *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * t4) = pack_bf16(acc[j][2 * r] * mul, acc[j][2 * r + 1] * mul);
}

// acc[64 rows x 64 keys] = A B^T over the head dim: A's 64 rows start at `a` in panels a_panel
// bytes apart, B is a 64-row panel tile (K or V). Issued and committed, not waited for; the first
// k-step overwrites acc.
__device__ __forceinline__ void wg_issue_abt(float (&acc)[kWgBN / 2], const char* a, uint32_t a_panel, const char* b) {
  wg::fence();
  wg::mma_abt<kWgBN, kWgD / 16>(acc, a, a_panel, b, kWgBN * 128);
  wg::commit();
}

// acc += A B with A (this warpgroup's 64 rows x kWgBN keys: P in the forward, dS in dQ) packed in
// registers and B a [key][d] tile (V, K) as the N-major operand (64-column panels 64 keys x 128
// bytes apart); issued and committed, not waited for.
__device__ __forceinline__ void wg_issue_pv(float (&acc_flat)[kWgD / 2], const uint32_t (&pa)[kWgBN / 16][4],
                                            const char* sV) {
  const uint64_t dv0 = wg::desc_opaque(wg::desc_sw128(sV, kWgBN * 128, 1024));
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kWgBN / 16; ++kk) wg::mma_m64n256k16_rs<1>(acc_flat, pa[kk], wg::desc_advance(dv0, kk * 2048), 1);
  wg::commit();
}

constexpr int kWsThreads = 384, kWsConsumerWarps = 8;
// setmaxnreg split of the 64K registers: the producer warpgroup gives its share to the consumers
// (the dQ and dK / dV kernels; the persistent forward has its own, forward.cu).
constexpr int kWsProducerRegs = 24, kWsConsumerRegs = 240;
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 65536, "register file of one SM");
// The warpgroup index as lane 0's value: the compiler then sees the producer / consumer branch as
// warp-uniform, not as a divergent path around the consumers' wgmma (which serializes it, C7518).
__device__ __forceinline__ int ws_warpgroup() { return __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); }

// One thread: the kWgD / 64 panels of a [rows][256] tile (rows at `row`, columns from col0 of the
// map) by TMA into the panel layout at dst (panels rows * 128 bytes apart), completing on bar.
__device__ __forceinline__ void tma_load_tile(char* dst, int rows, const CUtensorMap& map, int col0, int row,
                                              uint64_t* bar) {
#pragma unroll
  for (int c = 0; c < kWgD / 64; ++c) wg::tma_load_2d(dst + c * (rows * 128), &map, col0 + 64 * c, row, bar);
}

// Arrival of this warp on an `empty` barrier once its part of the reads is done.
__device__ __forceinline__ void ws_release(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) wg::mbar_arrive(bar);
}

// The load rings of the warp-specialized kernels: a ring's n-th tile (counted from 0) goes into
// stage n % kStages, whose barriers then complete their (n / kStages)-th phase. A stage has a
// `full` barrier (the producer's one arrival plus the TMA bytes) and an `empty` one (one arrival
// per consumer warp, ws_release). Init by one thread; a CTA barrier must follow.
__device__ __forceinline__ void ring_stage_init(uint64_t* full, uint64_t* empty) {
  wg::mbar_init(full, 1);
  wg::mbar_init(empty, kWsConsumerWarps);
}
// Producer thread, before loading tile n into its stage: waits for the consumers' release of the
// stage's previous tile (n - kStages), then announces the stage's bytes on `full`.
template <int kStages>
__device__ __forceinline__ void ring_acquire(uint64_t* full, uint64_t* empty, uint32_t n, uint32_t bytes) {
  if (n >= kStages) wg::mbar_wait(empty, (n / kStages - 1) & 1);
  wg::mbar_arrive_expect_tx(full, bytes);
}
// Consumers: waits until tile n has landed in its stage.
template <int kStages>
__device__ __forceinline__ void ring_wait(uint64_t* full, uint32_t n) {
  wg::mbar_wait(full, (n / kStages) & 1);
}

// Rows [valid, kWgBN) of a landed 64-row key tile (4 panels) set to zero by the two consumer
// warpgroups (ct = thread index among them): 16-byte chunk c is row c / 32, panel (c / 8) % 4,
// chunk c % 8 (whole rows, so the swizzle is moot). The caller fences and meets at named barrier 1.
__device__ __forceinline__ void zero_tile_rows(char* tile, int valid, int ct) {
  for (int c = ct; c < kWgBN * 32; c += 256)
    if ((c >> 5) >= valid)
      *reinterpret_cast<uint4*>(tile + ((c >> 3) & 3) * (kWgBN * 128) + (c >> 5) * 128 + (c & 7) * 16) =
          make_uint4(0u, 0u, 0u, 0u);
}
// Generic-proxy stores to smem ordered before the async proxy's (wgmma) reads, and both consumer
// warpgroups past them.
__device__ __forceinline__ void consumers_sync_stores() {
  wg::fence_proxy_async();
  wg::named_sync(1, 256);
}

}  // namespace
}  // namespace qt::cuda::attn
