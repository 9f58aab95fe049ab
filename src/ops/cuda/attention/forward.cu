// The attention forward at head dim 256 (Qwen3.5's) on Hopper wgmma, warp-specialized and
// persistent: attn_fwd_tma_wgmma_kernel (docs/attention_kernels.md section 3.2). Tile: 128 query
// rows x 64 keys on the forward's work list (work_list.cu); consumer warpgroup c owns query rows
// 64 c .. 64 c + 63. S = Q K^T is 16 m64n64k16 steps with Q and K from smem (K-major), O += P V is
// 4 m64n256k16 steps with P from registers and V N-major. Software pipeline (FA3's intra-warpgroup
// overlap): iteration j issues S_j and then P_{j-1} V_{j-1} without waiting in between, so the
// tensor cores run P V while the warpgroup does S_j's softmax; O is rescaled by S_j's alpha only
// once P_{j-1} V_{j-1} has landed. K and V have two stages each (Q one), so the producer runs ahead
// by up to two tiles and neither consumer waits for the other.
// TMA reads the packed rows as they are: keys past the sample end belong to the next sample (or are
// zeros past T). Their scores are masked as anywhere else; their V rows are zeroed in smem before
// the last P V, so that a non-finite value there cannot turn P = 0 into NaN.
// Persistent: one CTA per SM (its smem allows no second) takes its (slot, head) items in snake
// order (fwd_item), and its load rings run on across items, so the next item's Q and first key
// tiles load under the current item's last P V and epilogue (+7.6 % at the 27B shape; the same for
// the backward kernels measured -2 % with this static deal, +0.6 / -0.5 % with items claimed from a
// counter: docs/attention_kernels.md section 3.2).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/attention/common.cuh"
#include "ops/cuda/attention/wgmma_pipeline.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda::attn {
namespace {

constexpr size_t kWgSmem = size_t(kWgBM) * kWgD * 2 + 4 * kWgTileBytes + 1024;  // Q, 2 K, 2 V, alignment pad
// The persistent forward's producer walks the work list itself: 56 registers (48 spill), and
// the consumers fit in 224 without spills.
constexpr int kFwdProducerRegs = 56, kFwdConsumerRegs = 224;
static_assert(128 * kFwdProducerRegs + 256 * kFwdConsumerRegs <= 65536, "register file of one SM");
struct WsBarriers {
  uint64_t q_full, q_empty, k_full[2], v_full[2], k_empty[2], v_empty[2];
};
constexpr size_t kWsSmem = kWgSmem + sizeof(WsBarriers);

// S (this warpgroup's 64 rows x 64 keys) = Q K^T.
__device__ __forceinline__ void wg_issue_s(float (&s_flat)[kWgBN / 2], const char* sQ, const char* sK, int row0) {
  wg_issue_abt(s_flat, sQ + row0 * 128, kWgBM * 128, sK);
}

// Epilogue of a warp's fragment rows of a wgmma forward: normalise, lse, bf16 pairs straight to
// global (rows past the sample end skipped).
__device__ __forceinline__ void store_fwd_rows(const FwdParams& p, const QueryTile& t, const float (&acc_o)[kWgD / 8][4],
                                               const float (&row_sum)[2], const float (&row_max)[2], int wrow0,
                                               int g, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = wrow0 + g + 8 * r;
    if (row >= t.L) continue;
    if (t4 == 0)
      p.lse[static_cast<int64_t>(t.h) * p.total + t.start + row] = l > 0.f ? row_max[r] * p.scale + logf(l) : -INFINITY;
    store_row_pairs(p.o + (t.start + row) * t.ldq + t.h * kWgD, acc_o, r, inv, t4);
  }
}

// The scores of key tile n0 (this warp's rows from wrow0) masked where the tile crosses the diagonal
// or the sample end, then the online softmax step.
__device__ __forceinline__ void fwd_softmax_tile(float (&s)[kWgBN / 8][4], int n0, int wrow0, int g, int t4, int L,
                                                 float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                                                 float scale_log2) {
  if (n0 + kWgBN - 1 > wrow0 || n0 + kWgBN > L) mask_tile<kWgBN>(s, n0, wrow0, g, t4, L);
  softmax_scores<kWgBN>(s, row_max, row_sum, alpha, scale_log2);
}

// Waits for the CTA's key tile number g (stage g & 1), which has `valid` rows in its sample; on a
// tile that reaches past the sample end, the two consumer warpgroups zero its rows from there on
// before either reads it.
__device__ __forceinline__ void ws_wait_v(WsBarriers* bar, char* sV, uint32_t g, int valid, int ct) {
  ring_wait<2>(&bar->v_full[g & 1], g);
  if (valid >= kWgBN) return;  // uniform over the CTA
  zero_tile_rows(sV + (g & 1) * kWgTileBytes, valid, ct);
  consumers_sync_stores();
}

// The persistent forward's r-th work item of this CTA: the (slot, head) items, slot-major and so
// heaviest first, dealt to the CTAs in snake order (even rounds CTA c takes the c-th item of the
// round, odd rounds the c-th from the end), which balances the rounds' cost differences. False
// once the CTA's items run past the work list (later rounds only go further).
__device__ __forceinline__ bool fwd_item(const FwdParams& p, int slots, int r, int2& work, int& h) {
  const int G = gridDim.x, c = blockIdx.x;
  const int idx = r * G + ((r & 1) ? G - 1 - c : c);
  if (idx >= slots * p.hq) return false;
  work = p.tiles[idx / p.hq];
  h = idx % p.hq;
  return work.x >= 0;
}

__global__ void __launch_bounds__(kWsThreads, 1) attn_fwd_tma_wgmma_kernel(const FwdParams p, const __grid_constant__ FwdMaps maps,
                                                                            int slots) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sQ = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sK = sQ + kWgBM * kWgD * 2;  // two K stages, then two V stages, then the barriers
  char* sV = sK + 2 * kWgTileBytes;
  WsBarriers* bar = reinterpret_cast<WsBarriers*>(sV + 2 * kWgTileBytes);

  const int tid = threadIdx.x;
  const int wg_i = ws_warpgroup();
  if (tid == 0) {
    ring_stage_init(&bar->q_full, &bar->q_empty);
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      ring_stage_init(&bar->k_full[st], &bar->k_empty[st]);
      ring_stage_init(&bar->v_full[st], &bar->v_empty[st]);
    }
  }
  __syncthreads();
  // Persistent: one CTA per SM walks its items (fwd_item); the K / V rings run on over the items'
  // key tiles (g counts the CTA's tiles: stage g & 1, phase (g >> 1) & 1), so the producer loads
  // the next item's Q (once the consumers' last S of the current item is done) and first key tiles
  // while the consumers finish the current item's P V and write its rows.
  int2 work;
  int h;

  if (wg_i == 0) {  // producer
    wg::regs_dec<kFwdProducerRegs>();
    if (tid == 0) {
      uint32_t g = 0;
      for (int r = 0; fwd_item(p, slots, r, work, h); ++r) {
        const QueryTile t = query_tile(p, work, kWgBM, kWgD, h);
        const int n_tiles = (min(t.m0 + kWgBM, t.L) + kWgBN - 1) / kWgBN;
        const int kcol = t.kvh * kWgD;
        ring_acquire<1>(&bar->q_full, &bar->q_empty, r, kWgBM * kWgD * 2);
        tma_load_tile(sQ, kWgBM, maps.q, h * kWgD, t.start + t.m0, &bar->q_full);
        for (int j = 0; j < n_tiles; ++j, ++g) {
          const uint32_t st = g & 1;
          const int row = t.start + j * kWgBN;
          ring_acquire<2>(&bar->k_full[st], &bar->k_empty[st], g, kWgTileBytes);
          tma_load_tile(sK + st * kWgTileBytes, kWgBN, maps.k, kcol, row, &bar->k_full[st]);
          ring_acquire<2>(&bar->v_full[st], &bar->v_empty[st], g, kWgTileBytes);
          tma_load_tile(sV + st * kWgTileBytes, kWgBN, maps.v, kcol, row, &bar->v_full[st]);
        }
      }
    }
    return;
  }

  wg::regs_inc<kFwdConsumerRegs>();
  const int cw = wg_i - 1, ct = tid - 128;  // consumer warpgroup (query rows 64 cw ..), thread index
  const int wq = (tid >> 5) & 3, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const float scale_log2 = p.scale * kLog2e;
  uint32_t g = 0;
  for (int r = 0; fwd_item(p, slots, r, work, h); ++r) {
    const QueryTile t = query_tile(p, work, kWgBM, kWgD, h);
    const int L = t.L;
    const int n_tiles = (min(t.m0 + kWgBM, L) + kWgBN - 1) / kWgBN;
    const int wrow0 = t.m0 + 64 * cw + 16 * wq;  // sample-local first row of this warp

    float acc_o[kWgD / 8][4];
#pragma unroll
    for (int i = 0; i < kWgD / 8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
    float(&acc_flat)[kWgD / 2] = reinterpret_cast<float(&)[kWgD / 2]>(acc_o);
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
    float s[kWgBN / 8][4];
    float(&s_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(s);
    uint32_t pa[kWgBN / 16][4];

    ring_wait<1>(&bar->q_full, r);
    ring_wait<2>(&bar->k_full[g & 1], g);
    wg_issue_s(s_flat, sQ, sK + (g & 1) * kWgTileBytes, 64 * cw);
    wg::wait<0>();
    wg::fence_operands(s_flat);
    ws_release(&bar->k_empty[g & 1], lane);
    fwd_softmax_tile(s, 0, wrow0, g4, t4, L, row_max, row_sum, alpha, scale_log2);
    pack_p<kWgBN>(pa, s);

    for (int j = 1; j < n_tiles; ++j) {
      const uint32_t gj = g + j, st = gj & 1;
      ring_wait<2>(&bar->k_full[st], gj);
      wg_issue_s(s_flat, sQ, sK + st * kWgTileBytes, 64 * cw);
      ws_wait_v(bar, sV, gj - 1, L - (j - 1) * kWgBN, ct);
      wg_issue_pv(acc_flat, pa, sV + (st ^ 1) * kWgTileBytes);
      wg::wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
      wg::fence_operands(s_flat);
      ws_release(&bar->k_empty[st], lane);
      fwd_softmax_tile(s, j * kWgBN, wrow0, g4, t4, L, row_max, row_sum, alpha, scale_log2);
      wg::wait<0>();
      wg::fence_operands(acc_flat);
      ws_release(&bar->v_empty[st ^ 1], lane);
      rescale_rows<kWgD>(acc_o, alpha);
      pack_p<kWgBN>(pa, s);
    }
    ws_release(&bar->q_empty, lane);  // every S of the item is done: Q may be reloaded
    const uint32_t gl = g + n_tiles - 1;
    ws_wait_v(bar, sV, gl, L - (n_tiles - 1) * kWgBN, ct);
    wg_issue_pv(acc_flat, pa, sV + (gl & 1) * kWgTileBytes);
    wg::wait<0>();
    wg::fence_operands(acc_flat);
    ws_release(&bar->v_empty[gl & 1], lane);
    g += n_tiles;

    store_fwd_rows(p, t, acc_o, row_sum, row_max, wrow0, g4, t4);
  }
}

}  // namespace

void launch_fwd_wgmma(const FwdParams& p, const FwdMaps& maps, int slots, cudaStream_t stream) {
  // Persistent: one CTA per SM (the smem allows no second), each walking its share of the
  // (slot, head) items; the grid still depends only on T and the sample bound.
  const int ctas = static_cast<int>(std::min<int64_t>(sm_count(), int64_t(slots) * p.hq));
  launch_smem(attn_fwd_tma_wgmma_kernel, "attn_fwd_tma_wgmma_kernel", ctas, kWsThreads, kWsSmem, stream, p, maps,
              slots);
}

}  // namespace qt::cuda::attn
