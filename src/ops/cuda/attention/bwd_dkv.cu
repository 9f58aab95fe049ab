// dK / dV of the attention backward at head dim 256 (Qwen3.5's) on Hopper wgmma, warp-specialized:
// attn_bwd_dkv_tma_wgmma_kernel (docs/attention_kernels.md section 3.3). One CTA per (kv head
// [x split], key tile of 64) on the backward's work list (work_list.cu), looping over the query
// heads of its split and over the query tiles (64 rows) from the diagonal to the sample's end. The
// two consumer warpgroups are symmetric and meet once per query tile: warpgroup c takes keys
// 32 c .. 32 c + 31 of the tile for S = Q K^T and dP = dO V^T (m64n32k16 x 16 each, all 64 query
// rows) and turns them into P and dS in registers (lse2 / Dsum read per row from global, one tile
// ahead), writes both as bf16 into its half of the [query][key] panels, and after one named barrier
// accumulates its head-dim half of dV += P^T dO and dK += dS^T Q over all 64 keys (m64n128k16, A
// M-major: P, dS as stored; B N-major: the dO, Q tiles; 64 + 64 accumulator floats per thread).
// P / dS are double-buffered, so the next tile's writes need no second barrier. S and dP of the
// next tile are issued behind this tile's dV / dK products. The producer warpgroup loads K and V
// once and Q / dO per tile (two stages) by TMA. Query rows past the sample end hold the next
// sample's: P and dS are selected to exactly 0 there, and those Q / dO rows are zeroed in smem
// (they meet P = 0 and dS = 0 in the products, where 0 * NaN would leak). The GQA reduction is
// inside the CTA, or over the split CTAs' f32 slices in split order (attn_bwd_dkv_sum_kernel):
// deterministic, no dK / dV atomics. dQ comes from bwd_dq.cu's kernel, which runs first and writes
// the Dsum / lse2 rows read here.
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

constexpr uint32_t kWgPBytes = 64 * 64 * 2;  // a bf16 [64][64] panel (P or dS)

// Epilogue of the dK / dV kernel: a warpgroup's m64n128 accumulators (keys rl0 and rl0 + 8 of
// the tile, head-dim columns 128 half + 8 j + 2 t4) as dK (scaled) and dV, keys < L - n0 only
// (DkvOut: bf16, or this split's f32 share).
__device__ __forceinline__ void store_dkv_rows(const BwdParams& p, const KeyTile& t, const float (&acc_dk)[64],
                                               const float (&acc_dv)[64], int rl0, int half, int t4) {
  const DkvOut out = dkv_out(p, t, kWgD);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rl = rl0 + 8 * r;
    if (t.n0 + rl >= t.L) continue;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int64_t o = rl * t.ldk + 128 * half + 8 * j + 2 * t4;
      const float k0 = acc_dk[4 * j + 2 * r] * p.scale, k1 = acc_dk[4 * j + 2 * r + 1] * p.scale;
      out.store(o, k0, k1, acc_dv[4 * j + 2 * r], acc_dv[4 * j + 2 * r + 1]);
    }
  }
}

// acc (64 rows x 128 head-dim columns of dK or dV) += A^T B over 64 query rows: A (P or dS) a
// bf16 [query][key] panel read M-major, B (dO or Q) the N-major 64-column blocks from `b` on.
// Issued and committed, not waited for.
__device__ __forceinline__ void wg_issue_dkv(float (&acc)[64], const char* a, const char* b) {
  const uint64_t da0 = wg::desc_opaque(wg::desc_sw128(a, kWgPBytes, 1024));
  const uint64_t db0 = wg::desc_opaque(wg::desc_sw128(b, 64 * 128, 1024));
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 64 / 16; ++kk)
    wg::mma_m64n128k16<1, 1>(acc, wg::desc_advance(da0, kk * 2048), wg::desc_advance(db0, kk * 2048), 1);
  wg::commit();
}

struct DkvBarriers {
  uint64_t kv_full, q_full[2], q_empty[2];  // q_*: the Q and dO tiles of a stage
};
constexpr size_t kDkvTmaSmem = 6 * kWgTileBytes + 4 * kWgPBytes + 1024 + sizeof(DkvBarriers);
static_assert(kDkvTmaSmem <= 227 * 1024, "TMA dK / dV kernel smem over the sm_90 per-block limit");

__global__ void __launch_bounds__(kWsThreads, 1) attn_bwd_dkv_tma_wgmma_kernel(const BwdParams p,
                                                                                const __grid_constant__ BwdMaps maps) {
  constexpr int BM = 64, BN = 64, HN = BN / 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sK = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sV = sK + kWgTileBytes;
  char* sQ = sV + kWgTileBytes;       // 2 stages
  char* sdO = sQ + 2 * kWgTileBytes;  // 2 stages
  char* sP = sdO + 2 * kWgTileBytes;  // 2 buffers of bf16 [query][key]
  char* sdS = sP + 2 * kWgPBytes;     // 2 buffers
  DkvBarriers* bar = reinterpret_cast<DkvBarriers*>(sdS + 2 * kWgPBytes);

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const KeyTile t = key_tile(p, work, BM, BN, kWgD);
  const int L = t.L, n0 = t.n0, n_iter = t.n_iter;
  const int tid = threadIdx.x;
  const int wg_i = ws_warpgroup();
  if (tid == 0) {
    wg::mbar_init(&bar->kv_full, 1);
#pragma unroll
    for (int st = 0; st < 2; ++st) ring_stage_init(&bar->q_full[st], &bar->q_empty[st]);
  }
  __syncthreads();

  if (wg_i == 0) {  // producer
    wg::regs_dec<kWsProducerRegs>();
    if (tid == 0) {
      const int kcol = t.kvh * kWgD;
      wg::mbar_arrive_expect_tx(&bar->kv_full, 2 * kWgTileBytes);
      tma_load_tile(sK, BN, maps.k, kcol, t.start + n0, &bar->kv_full);
      tma_load_tile(sV, BN, maps.v, kcol, t.start + n0, &bar->kv_full);
      for (int it = 0; it < n_iter; ++it) {
        const int st = it & 1, qcol = (t.h_first + it / t.n_m) * kWgD;
        const int row = t.start + t.m_begin + (it % t.n_m) * BM;
        ring_acquire<2>(&bar->q_full[st], &bar->q_empty[st], it, 2 * kWgTileBytes);
        tma_load_tile(sQ + st * kWgTileBytes, BM, maps.q, qcol, row, &bar->q_full[st]);
        tma_load_tile(sdO + st * kWgTileBytes, BM, maps.d_o, qcol, row, &bar->q_full[st]);
      }
    }
    return;
  }

  wg::regs_inc<kWsConsumerRegs>();
  const int cw = wg_i - 1, ct = tid - 128;  // consumer warpgroup (keys 32 cw .. in S / dP; head-dim half cw)
  const int wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int rl0 = 16 * wq + g;  // S / dP: query row of fragment elements 0, 1 (+ 8: 2, 3); dK / dV: key row
  const float scale_log2 = p.scale * kLog2e;
  float acc_dv[64], acc_dk[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc_dv[i] = acc_dk[i] = 0.f;
  // Pinned before the first wgmma stage: zeroing sunk into it would serialize every wgmma (C7515).
  wg::fence_operands(acc_dv);
  wg::fence_operands(acc_dk);
  float s[HN / 8][4], dp[HN / 8][4];
  float(&s_flat)[HN / 2] = reinterpret_cast<float(&)[HN / 2]>(s);
  float(&dp_flat)[HN / 2] = reinterpret_cast<float(&)[HN / 2]>(dp);
  auto tile_m0 = [&](int it) { return t.m_begin + (it % t.n_m) * BM; };
  auto tile_h = [&](int it) { return t.h_first + it / t.n_m; };

  // Waits for the Q / dO tiles of iteration it; rows past the sample end zeroed (uniform branch).
  auto wait_q = [&](int it) {
    const int st = it & 1, valid = L - tile_m0(it);
    ring_wait<2>(&bar->q_full[st], it);
    if (valid < BM) {
      zero_tile_rows(sQ + st * kWgTileBytes, valid, ct);
      zero_tile_rows(sdO + st * kWgTileBytes, valid, ct);
      consumers_sync_stores();
    }
  };
  // S and dP of iteration it for this warpgroup's 32 keys: A = Q / dO (K-major), B = K / V rows 32 cw ..
  auto issue_sdp = [&](int it) {
    const int st = it & 1;
    wg::fence();
    wg::mma_abt<HN, kWgD / 16>(s_flat, sQ + st * kWgTileBytes, BM * 128, sK + HN * cw * 128, BN * 128);
    wg::mma_abt<HN, kWgD / 16>(dp_flat, sdO + st * kWgTileBytes, BM * 128, sV + HN * cw * 128, BN * 128);
    wg::commit();
  };

  float lse2[2], dsum[2];
  load_row_stats(p, tile_h(0), t.start, L, tile_m0(0) + rl0, lse2, dsum);
  wg::mbar_wait(&bar->kv_full, 0);
  wait_q(0);
  issue_sdp(0);
  for (int it = 0; it < n_iter; ++it) {
    const int st = it & 1, m0 = tile_m0(it);
    float lse2_next[2] = {0.f, 0.f}, dsum_next[2] = {0.f, 0.f};
    if (it + 1 < n_iter) load_row_stats(p, tile_h(it + 1), t.start, L, tile_m0(it + 1) + rl0, lse2_next, dsum_next);
    wg::wait<0>();  // S_it, dP_it (the products of it - 1 were waited for behind their issue)
    wg::fence_operands(s_flat);
    wg::fence_operands(dp_flat);

    // P = exp2(S scale log2 e - lse2) and dS = P (dP - Dsum), exactly 0 for keys after the query
    // and queries past the sample; bf16 into this warpgroup's key half of the P / dS panels.
    const bool need_mask = m0 < n0 + BN - 1 || m0 + BM > L;
    char* pb = sP + st * kWgPBytes;
    char* db = sdS + st * kWgPBytes;
#pragma unroll
    for (int nb = 0; nb < HN / 8; ++nb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int rl = rl0 + 8 * r, cl = HN * cw + 8 * nb + 2 * t4;
        float pv[2], dv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool masked = need_mask && (n0 + cl + e > m0 + rl || m0 + rl >= L);
          const float pe = dev::ex2_ftz(fmaf(s[nb][2 * r + e], scale_log2, -lse2[r]));
          pv[e] = masked ? 0.f : pe;
          dv[e] = masked ? 0.f : pe * (dp[nb][2 * r + e] - dsum[r]);
        }
        *reinterpret_cast<uint32_t*>(pb + wg::sw128(rl, cl)) = pack_bf16(pv[0], pv[1]);
        *reinterpret_cast<uint32_t*>(db + wg::sw128(rl, cl)) = pack_bf16(dv[0], dv[1]);
      }
    consumers_sync_stores();  // both key halves of P and dS are in smem

    wg_issue_dkv(acc_dv, pb, sdO + st * kWgTileBytes + 2 * cw * (BM * 128));  // dV[:, half] += P^T dO[:, half]
    wg_issue_dkv(acc_dk, db, sQ + st * kWgTileBytes + 2 * cw * (BM * 128));   // dK[:, half] += dS^T Q[:, half]
    if (it + 1 < n_iter) {
      wait_q(it + 1);
      issue_sdp(it + 1);
      // This tile's dV / dK products are done once only S / dP of the next are pending: its Q / dO
      // stage goes back to the producer a whole S / dP earlier than at the next iteration's wait.
      wg::wait<1>();
      wg::fence_operands(acc_dv);
      wg::fence_operands(acc_dk);
      ws_release(&bar->q_empty[st], lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse2[r] = lse2_next[r];
      dsum[r] = dsum_next[r];
    }
  }
  wg::wait<0>();
  wg::fence_operands(acc_dv);
  wg::fence_operands(acc_dk);
  store_dkv_rows(p, t, acc_dk, acc_dv, rl0, cw, t4);
}

}  // namespace

void launch_bwd_dkv_wgmma(dim3 grid, const BwdParams& p, const BwdMaps& maps, cudaStream_t stream) {
  launch_smem(attn_bwd_dkv_tma_wgmma_kernel, "attn_bwd_dkv_tma_wgmma_kernel", grid, kWsThreads, kDkvTmaSmem, stream,
              p, maps);
}

}  // namespace qt::cuda::attn
