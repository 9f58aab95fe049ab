// dQ of the attention backward at head dim 256 (Qwen3.5's) on Hopper wgmma, warp-specialized:
// attn_bwd_dq_tma_wgmma_kernel (docs/attention_kernels.md section 3.3). The forward's structure with
// S, dP and dQ for P V: one CTA per (query tile of 128 rows, q head) on the forward's work list
// (work_list.cu) walks the key tiles (64) up to the diagonal in order, so dQ is the same on every run
// (no atomics). Consumer warpgroup c owns query rows 64 c .. 64 c + 63 and, per key tile, runs
// S = Q K^T and dP = dO V^T (16 m64n64k16 each, operands K-major from smem), forms dS = P (dP - Dsum)
// in registers (P from the saved lse) and accumulates dQ += dS K as 4 m64n256k16 with dS as the
// register A operand and K N-major, like the forward's P V. No warpgroup-dependent branch around a
// wgmma (C7518), so warpgroup 0 also runs the last key tile of a diagonal CTA, fully masked.
// The producer warpgroup loads Q and dO once and the key tiles by TMA (K on a two-stage ring, V in
// one stage: the smem holds no more); the consumers wait on full barriers and release each tile on
// its empty barrier, V once dP is done, K once dQ += dS K is. A key tile reaching past the sample
// end holds the next sample's rows: both warpgroups zero its K and V rows from L on (K feeds dQ,
// where 0 * NaN would leak) and dS is set to exactly 0 there.
// It does the backward's preprocess of its rows itself (Dsum, lse2) under its first key tile's
// products, so it runs before the dK / dV kernel (bwd_dkv.cu) and the backward at head dim 256 has
// no attn_bwd_pre_kernel launch.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/attention/common.cuh"
#include "ops/cuda/attention/wgmma_pipeline.cuh"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda::attn {
namespace {

// Q, dO, 2 K stages, one V stage, alignment pad.
constexpr size_t kWgDqSmem = 2 * size_t(kWgBM) * kWgD * 2 + 3 * kWgTileBytes + 1024;
static_assert(kWgDqSmem <= 227 * 1024, "wgmma dQ kernel smem over the sm_90 per-block limit");

// dS = P (dP - Dsum) of key tile n0 for this warp's rows from wrow0 (P from the saved lse2), as
// the bf16 A fragments of dQ += dS K. dS is exactly 0 above the diagonal and past the sample, even
// where dP is not finite (the TMA kernel's key rows past the sample end hold the next sample's).
__device__ __forceinline__ void dq_ds_tile(uint32_t (&da)[kWgBN / 16][4], float (&s)[kWgBN / 8][4],
                                           const float (&dp)[kWgBN / 8][4], int n0, int wrow0, int g, int t4, int L,
                                           const float (&lse2)[2], const float (&dsum)[2], float scale_log2) {
  const bool need_mask = n0 + kWgBN - 1 > wrow0 || n0 + kWgBN > L;
#pragma unroll
  for (int nb = 0; nb < kWgBN / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, col = n0 + nb * 8 + 2 * t4 + (e & 1), row = wrow0 + g + 8 * r;
      const float pe = dev::ex2_ftz(fmaf(s[nb][e], scale_log2, -lse2[r]));
      s[nb][e] = need_mask && (col > row || row >= L) ? 0.f : pe * (dp[nb][e] - dsum[r]);
    }
  pack_p<kWgBN>(da, s);
}

// Epilogue of the dQ kernel: dq = bf16(scale dQ), rows past the sample end skipped.
__device__ __forceinline__ void store_dq_rows(const DqParams& p, const QueryTile& t, const float (&acc)[kWgD / 8][4],
                                              int wrow0, int g, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow0 + g + 8 * r;
    if (row >= t.L) continue;
    store_row_pairs(p.dq + (t.start + row) * t.ldq + t.h * kWgD, acc, r, p.scale, t4);
  }
}

struct DqBarriers {
  uint64_t qdo_full, k_full[2], k_empty[2], v_full, v_empty;
};
constexpr size_t kDqTmaSmem = kWgDqSmem + sizeof(DqBarriers);
static_assert(kDqTmaSmem <= 227 * 1024, "TMA dQ kernel smem over the sm_90 per-block limit");

__global__ void __launch_bounds__(kWsThreads, 1) attn_bwd_dq_tma_wgmma_kernel(const DqParams p,
                                                                               const __grid_constant__ BwdMaps maps) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sQ = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sdO = sQ + kWgBM * kWgD * 2;
  char* sK = sdO + kWgBM * kWgD * 2;  // two stages, then V's one
  char* sV = sK + 2 * kWgTileBytes;
  DqBarriers* bar = reinterpret_cast<DqBarriers*>(sV + kWgTileBytes);

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const QueryTile t = query_tile(p, work, kWgBM, kWgD, blockIdx.x);
  const int L = t.L, m0 = t.m0;
  const int n_tiles = (min(m0 + kWgBM, L) + kWgBN - 1) / kWgBN;
  const int tid = threadIdx.x;
  const int wg_i = ws_warpgroup();
  if (tid == 0) {
    wg::mbar_init(&bar->qdo_full, 1);
    ring_stage_init(&bar->v_full, &bar->v_empty);
#pragma unroll
    for (int st = 0; st < 2; ++st) ring_stage_init(&bar->k_full[st], &bar->k_empty[st]);
  }
  __syncthreads();

  if (wg_i == 0) {  // producer
    wg::regs_dec<kWsProducerRegs>();
    if (tid == 0) {
      const int qcol = t.h * kWgD, kcol = t.kvh * kWgD, qrow = t.start + m0;
      wg::mbar_arrive_expect_tx(&bar->qdo_full, 2 * kWgBM * kWgD * 2);
      tma_load_tile(sQ, kWgBM, maps.q, qcol, qrow, &bar->qdo_full);
      tma_load_tile(sdO, kWgBM, maps.d_o, qcol, qrow, &bar->qdo_full);
      for (int j = 0; j < n_tiles; ++j) {
        const int st = j & 1, row = t.start + j * kWgBN;
        ring_acquire<2>(&bar->k_full[st], &bar->k_empty[st], j, kWgTileBytes);
        tma_load_tile(sK + st * kWgTileBytes, kWgBN, maps.k, kcol, row, &bar->k_full[st]);
        ring_acquire<1>(&bar->v_full, &bar->v_empty, j, kWgTileBytes);
        tma_load_tile(sV, kWgBN, maps.v, kcol, row, &bar->v_full);
      }
    }
    return;
  }

  wg::regs_inc<kWsConsumerRegs>();
  const int cw = wg_i - 1, ct = tid - 128;  // consumer warpgroup (query rows 64 cw ..), thread index
  const int wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int wrow0 = m0 + 64 * cw + 16 * wq;  // sample-local first row of this warp
  const int64_t stat0 = static_cast<int64_t>(t.h) * p.total + t.start + wrow0;  // [Hq, T] index of row wrow0
  const float scale_log2 = p.scale * kLog2e;

  // The preprocess, hidden under the first key tile's products: O's 16-byte chunk `lane` of the
  // warp's 16 rows and lse of row wrow0 + lane (lanes < 16) are requested now, before any wait.
  uint4 o_rows[16];
#pragma unroll
  for (int i = 0; i < 16; ++i)
    o_rows[i] = wrow0 + i < L ? *reinterpret_cast<const uint4*>(p.o + (t.start + wrow0 + i) * t.ldq + t.h * kWgD + lane * 8)
                              : make_uint4(0u, 0u, 0u, 0u);
  const float lse_lane = lane < 16 && wrow0 + lane < L ? p.lse[stat0 + lane] : 0.f;
  float lse2[2] = {0.f, 0.f}, dsum[2] = {0.f, 0.f};  // of rows wrow0 + g and + 8 (0 past the sample)
  // Dsum = rowsum(dO * O) in attn_bwd_pre_kernel's arithmetic (lane l: columns 8 l .. 8 l + 7 in
  // order, then the xor tree; dO from the landed smem tile), lse2 = lse log2(e); written for the
  // dK / dV kernel that runs next (every (query tile, head) has one dQ CTA) and kept for g, g + 8.
  auto row_stats = [&] {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int rr = 64 * cw + 16 * wq + i;  // row in the 128-row Q / dO tile
      const uint4 d = *reinterpret_cast<const uint4*>(sdO + (lane >> 3) * (kWgBM * 128) + rr * 128 +
                                                       (((lane & 7) ^ (rr & 7)) << 4));
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&d);
      const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&o_rows[i]);
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(b2[e]);
        sum = fmaf(x.x, y.x, sum);
        sum = fmaf(x.y, y.y, sum);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const float l2 = __shfl_sync(0xffffffffu, lse_lane, i) * kLog2e;
      if (wrow0 + i >= L) continue;  // warp-uniform; after the shuffles
      if (lane == 0) {
        p.dsum[stat0 + i] = sum;
        p.lse2[stat0 + i] = l2;
      }
      if (i == g) {
        dsum[0] = sum;
        lse2[0] = l2;
      }
      if (i == g + 8) {
        dsum[1] = sum;
        lse2[1] = l2;
      }
    }
  };

  float acc[kWgD / 8][4];  // the m64n256 dQ accumulator, zeroed once the first tile's S / dP landed
  float(&acc_flat)[kWgD / 2] = reinterpret_cast<float(&)[kWgD / 2]>(acc);
  wg::mbar_wait(&bar->qdo_full, 0);
  auto tile = [&](int j, bool first) {
    const int n0 = j * kWgBN, st = j & 1;
    char* kb = sK + st * kWgTileBytes;
    ring_wait<2>(&bar->k_full[st], j);
    ring_wait<1>(&bar->v_full, j);
    if (L - n0 < kWgBN) {  // uniform over the CTA
      zero_tile_rows(kb, L - n0, ct);
      zero_tile_rows(sV, L - n0, ct);
      consumers_sync_stores();
    }
    float s[kWgBN / 8][4], dp[kWgBN / 8][4];
    float(&s_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(s);
    float(&dp_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(dp);
    wg_issue_abt(s_flat, sQ + 64 * cw * 128, kWgBM * 128, kb);
    wg_issue_abt(dp_flat, sdO + 64 * cw * 128, kWgBM * 128, sV);
    if (first) row_stats();  // under the products (no wgmma accumulator touched)
    wg::wait<0>();
    wg::fence_operands(s_flat);
    wg::fence_operands(dp_flat);
    if (first) {  // after the stage closed: zeroing inside it would serialize the wgmma (C7515)
#pragma unroll
      for (int i = 0; i < kWgD / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      wg::fence_operands(acc_flat);
    }
    ws_release(&bar->v_empty, lane);
    uint32_t da[kWgBN / 16][4];
    dq_ds_tile(da, s, dp, n0, wrow0, g, t4, L, lse2, dsum, scale_log2);
    wg_issue_pv(acc_flat, da, kb);  // dQ += dS K_j
    wg::wait<0>();
    wg::fence_operands(acc_flat);
    ws_release(&bar->k_empty[st], lane);
  };
  tile(0, true);
  for (int j = 1; j < n_tiles; ++j) tile(j, false);
  store_dq_rows(p, t, acc, wrow0, g, t4);
}

}  // namespace

void launch_bwd_dq_wgmma(dim3 grid, const DqParams& p, const BwdMaps& maps, cudaStream_t stream) {
  launch_smem(attn_bwd_dq_tma_wgmma_kernel, "attn_bwd_dq_tma_wgmma_kernel", grid, kWsThreads, kDqTmaSmem, stream, p,
              maps);
}

}  // namespace qt::cuda::attn
