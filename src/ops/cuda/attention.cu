// Varlen causal flash attention with GQA for the gated full-attention layers (docs/model_spec.md 3.3;
// docs/attention_kernels.md). bf16 in and out, fp32 accumulation, tensor cores through mma.sync
// m16n8k16 (bf16 -> fp32) fed by ldmatrix from XOR-swizzled shared memory, cp.async loads.
//
// Forward (attn_fwd_kernel): one CTA per (query tile, sample, query head); 8 warps, 16 query rows
//   each; online softmax in base 2 over key tiles [0, diagonal]; K and V tiles use separate
//   buffers so V_j loads while S = Q K_j^T runs and K_{j+1} loads while P V_j runs (FA2 scheme).
//   Saves lse = m + log(l) (natural log, f32 [Hq, T]).
// Backward: three kernels (a fourth sums the split CTAs' dK / dV).
//   attn_bwd_pre_kernel:  Dsum = rowsum(dO * O), lse in log2 units, dQ accumulator zeroed.
//   attn_bwd_kernel:      one CTA per (key tile, sample, kv head), or 2 splitting the query-head
//                         group when the grid is small (bwd_splits); K, V tile resident in smem; it
//                         loops over its query heads and the query tiles from the diagonal to the
//                         sample's end, accumulating dK and dV in registers (the GQA reduction is
//                         inside the CTA, or over the 2 CTAs' f32 slices in split order: deterministic,
//                         no dK/dV atomics). dQ: with AttnArgs::deterministic (the backend's
//                         default) attn_bwd_dq_kernel computes it per query tile over the key
//                         tiles in order (7 GEMMs per tile pair instead of 5, bitwise
//                         reproducible); otherwise the dS K partials go to an fp32 accumulator
//                         with atomics (faster at 2B, not bitwise reproducible).
//   attn_bwd_post_kernel: dq = bf16(scale * dQaccum) (and attn_bwd_dkv_sum_kernel for split CTAs).
// Head dim 256 (Qwen3.5's) on Hopper wgmma (wgmma.cuh; AttnArgs::mma_sync selects the kernels
// above instead): the forward and, for the backward, a dK / dV and a dQ kernel, on the same work
// lists, splits and pre / sum kernels; 128-byte-swizzled smem panels. By default all three run
// warp-specialized (attn_fwd_tma_wgmma_kernel, attn_bwd_dkv_tma_wgmma_kernel,
// attn_bwd_dq_tma_wgmma_kernel: a producer warpgroup loading by TMA, two consumer warpgroups
// synchronized by mbarriers); AttnArgs::cp_async (or QT_ATTN_TMA=0; QT_ATTN_DKV_TMA=0 for dK / dV
// alone) selects their two-warpgroup cp.async versions (attn_fwd_wgmma_kernel,
// attn_bwd_dkv_wgmma_kernel, attn_bwd_dq_wgmma_kernel), as does a driver without TMA map encoding.
// Scheduling: attn_tile_table_kernel lists every (sample, tile) of the packed row, heaviest first
// across all samples (a forward query tile i costs i + 1 key tiles; a backward key tile j of an
// n-tile sample costs n - j query tiles), and the grid is (heads, slots) with slots the bound
// T / tile + num_seqs, so one launch serves every sample, the grid depends only on T and the
// sample bound (static for CUDA graphs: padded zero-length samples add no work), and long
// samples' heavy tiles start first instead of trailing. The TMA forward is persistent over the
// same items: one CTA per SM (its smem allows no second) takes its (slot, head) items in snake
// order (fwd_item), and its load rings run on across items, so the next item's Q and first key
// tiles load under the current item's last P V and epilogue (+7.6 % at the 27B shape; the same
// for the backward kernels measured -2 % with this static deal, +0.6 / -0.5 % with items claimed
// from a counter: docs/attention_kernels.md section 3.2). Causal masking happens only in tiles that cross
// the diagonal or the sample end.
#include <cuda.h>  // CUtensorMap (the encoder comes from the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/warp_mma.cuh"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda {
namespace {

using bf16 = __nv_bfloat16;

// ---- tile configuration -----------------------------------------------------------------------
// One constexpr function, as FA3's hopper/tile_size.h. All tiles use 8 warps (256 threads) and
// 16-row warp slices (the m16n8k16 M extent).
struct AttnTile {
  int fwd_m, fwd_n;  // forward: query rows x key rows per iteration
  int bwd_m, bwd_n;  // backward: query rows per iteration x key rows per CTA
};
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

constexpr AttnTile attn_tile(int head_dim) {
  // Forward, every head dim: 128 x 64. 8 warps x 16 rows = 128 query rows. Per thread the O
  // accumulator is head_dim / 2 floats (128 at D = 256) plus 32 for S = Q K^T (16 x 64 per warp),
  // which keeps D = 256 under the 255-register cap with one CTA per SM. smem: Q 128 x D + K 64 x D
  // + V 64 x D bf16 = 128 KB at D = 256 (needs the opt-in above 48 KB; H200 allows 227 KB), 64 KB at
  // D = 128 (3 CTAs / SM), 32 KB at D = 64. A 64-row key tile keeps S and P in registers at D = 256;
  // 128 would double S and push the O + S + P working set past the register file.
  //
  // Backward, every head dim: 64 x 64 (FA2 sm80 hdim256 uses 64 x 64 with 8 warps, FA3 sm90 64 x 80).
  // dK and dV accumulators live in registers: 2 x 64 x D fp32 over 256 threads = D / 2 floats per
  // thread (128 at D = 256); S and dP take 16 + 16 more (16 x 32 warp tiles), and the dQ partial is
  // produced 32 columns at a time (16 floats) so the peak stays below 255. smem: K, V (64 x D each),
  // Q, dO (64 x D each), P and dS (64 x 64 bf16 each), lse and Dsum: 136.5 KB at D = 256.
  //
  // The same shape serves D = 64 and 128 (tests, other models): they are not the target, and one
  // shape keeps one code path. Bigger forward key tiles for small D are an obvious next step.
  return head_dim > 0 ? AttnTile{128, 64, 64, 64} : AttnTile{0, 0, 0, 0};
}

template <int D>
struct FwdTraits {
  static constexpr int kBlockM = attn_tile(D).fwd_m;
  static constexpr int kBlockN = attn_tile(D).fwd_n;
  static constexpr size_t kSmemBytes = sizeof(bf16) * static_cast<size_t>((kBlockM + 2 * kBlockN) * D);
  static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
  static_assert(kBlockN % 16 == 0 && D % 64 == 0, "tiles must be multiples of the mma / swizzle shape");
  static_assert(kSmemBytes <= 227 * 1024, "forward smem over the sm_90 per-block limit");
};

template <int D>
struct BwdTraits {
  static constexpr int kBlockM = attn_tile(D).bwd_m;
  static constexpr int kBlockN = attn_tile(D).bwd_n;
  static constexpr size_t kSmemBytes = sizeof(bf16) * static_cast<size_t>(2 * kBlockN * D + 2 * kBlockM * D +
                                                                         2 * kBlockM * kBlockN) +
                                       sizeof(float) * 2 * kBlockM;
  static_assert(kBlockM == 64 && kBlockN == 64, "warp layouts below assume 64 x 64 backward tiles");
  static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
  static_assert(kSmemBytes <= 227 * 1024, "backward smem over the sm_90 per-block limit");
};

// ---- PTX helpers ----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; zero-fills the destination when pred is false (src must still be valid).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  const int bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred) {
  const int bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

using warp_mma::mma_bf16;   // c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col)
using warp_mma::pack_bf16;  // two floats -> bf16x2, the first in the low half

// ---- swizzled shared-memory tiles ---------------------------------------------------------------
// A [rows][W] bf16 tile (W a multiple of 64) stored with 16-byte chunk c of row r at chunk
// c ^ (r & 7): the 8 rows an ldmatrix phase reads hit 8 different bank groups.
template <int W>
__device__ __forceinline__ int swz(int row, int col) {
  return row * W + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// Async copy of a [ROWS][W] tile from global rows of stride ld (elements); rows >= valid are
// zero-filled (valid >= 1, and row 0 serves as the in-bounds dummy source). Thread tid copies
// chunk tid % (W / 8) of rows tid / (W / 8) + i * kRowStep: one pointer and one smem address plus
// constant strides (kRowStep is a multiple of 8, so the swizzle of a thread's chunk never changes).
template <int ROWS, int W>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t ld, int valid, int tid) {
  constexpr int kChunksPerRow = W / 8, kRowStep = kThreads / kChunksPerRow;
  static_assert(ROWS % kRowStep == 0 && kRowStep % 8 == 0, "every thread copies whole, equally swizzled rows");
  const int row0 = tid / kChunksPerRow, ch = tid % kChunksPerRow;
  const uint32_t dst = smem_u32(s + row0 * W + ((ch ^ (row0 & 7)) << 3));
  const bf16* src = g + row0 * ld + ch * 8;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const bool ok = row0 + i * kRowStep < valid;
    cp_async16(dst + 2 * i * kRowStep * W, ok ? src + i * kRowStep * ld : g + ch * 8, ok);
  }
}

// Byte offset of 16-column block cb (runtime) within a lane's row, for lane pattern colbit.
__device__ __forceinline__ uint32_t col_off(int cb, int colbit, int lane) {
  return static_cast<uint32_t>(128 * (cb >> 2) + 16 * ((2 * (cb & 3) + colbit) ^ (lane & 7)));
}

// ldmatrix lane addresses. Every ldmatrix.x4 here reads a 16 x 16 block whose four 8 x 8 matrices
// sit at row offsets {0, 8} and column offsets {0, 8}; lane l supplies row (l & 7) of matrix l >> 3.
// Two lane patterns cover all operands:
//   kRowBit3: row += 8 * bit3(l), col += 8 * bit4(l)  -> A operand (row-major [m][k]) without .trans,
//             and B operand from a [k][n] tile with .trans (regs {0,1} = n-block 0, {2,3} = n-block 1);
//   kRowBit4: row += 8 * bit4(l), col += 8 * bit3(l)  -> B operand from an [n][k] tile without .trans
//             (regs {0,1} = n-block 0, {2,3} = n-block 1), and A = X^T from X stored [k][m] with .trans.
// With the 16-byte-chunk XOR swizzle, the byte offset of 16-column block cb in a lane's row is
// 128 * (cb >> 2) + xo[cb & 3] with xo[i] = 16 * ((2i + colbit) ^ (l & 7)) (block rows are multiples
// of 8, so row & 7 == l & 7): four per-lane registers instead of one address per unrolled block.
struct LaneSwz {
  uint32_t xo[4];
};
enum LanePattern { kRowBit3, kRowBit4 };
template <LanePattern P>
__device__ __forceinline__ LaneSwz lane_swz(int lane) {
  const int colbit = P == kRowBit3 ? (lane >> 4) & 1 : (lane >> 3) & 1;
  LaneSwz x;
#pragma unroll
  for (int i = 0; i < 4; ++i) x.xo[i] = static_cast<uint32_t>(16 * ((2 * i + colbit) ^ (lane & 7)));
  return x;
}
// Byte address of this lane's row 0 of a [.][W] tile (row offsets of the block come later).
template <int W, LanePattern P>
__device__ __forceinline__ uint32_t lane_row(uint32_t smem, int lane) {
  const int rowbit = P == kRowBit3 ? (lane >> 3) & 1 : (lane >> 4) & 1;
  return smem + static_cast<uint32_t>(2 * W * ((lane & 7) + 8 * rowbit));
}
// Address of the lane's piece of the 16 x 16 block at rows [r0, r0 + 16) (r0 % 8 == 0), columns
// [16 cb, 16 cb + 16).
template <int W>
__device__ __forceinline__ uint32_t blk(uint32_t row_base, const LaneSwz& x, int r0, int cb) {
  return row_base + static_cast<uint32_t>(2 * W * r0 + 128 * (cb >> 2)) + x.xo[cb & 3];
}

using dev::kLog2e;

// Epilogue of a warp's 16 rows: acc (the m16 accumulator over D columns) times mul[r] for rows
// g and g + 8, to bf16, staged in the warp's own rows of the swizzled tile s, then 16-byte stores to
// g_rows (row stride ld) for the first `valid` rows.
template <int D>
__device__ __forceinline__ void store_warp_rows(bf16* g_rows, int64_t ld, bf16* s, const float (&acc)[D / 8][4],
                                                const float (&mul)[2], int valid, int warp, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r, col = i * 8 + 2 * t4;
      *reinterpret_cast<uint32_t*>(s + swz<D>(row, col)) =
          pack_bf16(acc[i][2 * r] * mul[r], acc[i][2 * r + 1] * mul[r]);
    }
  __syncwarp();
#pragma unroll
  for (int c = lane; c < 16 * D / 8; c += 32) {
    const int row = c / (D / 8), ch = c % (D / 8);
    if (row < valid)
      *reinterpret_cast<uint4*>(g_rows + row * ld + ch * 8) =
          *reinterpret_cast<const uint4*>(s + (warp * 16 + row) * D + ((ch ^ (row & 7)) << 3));
  }
}

// ---- score-tile pieces of the forward (pack_p also serves the dQ kernel) -------------------------
// s[nb][e]: the warp's S fragment over BN keys (row g + 8 (e >> 1), key 8 nb + 2 t4 + (e & 1)), the
// mma.sync m16n8 C layout (also each warp's slice of a wgmma m64nN accumulator).

// Masks keys past the diagonal (col > row) or the sample end (col >= L); rows / keys sample-local.
template <int BN>
__device__ __forceinline__ void mask_tile(float (&s)[BN / 8][4], int n0, int wrow0, int g, int t4, int L) {
#pragma unroll
  for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n0 + nb * 8 + 2 * t4 + (e & 1);
      const int row = wrow0 + g + (e >> 1) * 8;
      if (col > row || col >= L) s[nb][e] = -INFINITY;
    }
}

// Online softmax over one score tile (base 2, scale folded in): updates the running row max and the
// per-thread partial row sum, turns s into P, and returns each row's rescale factor for O.
template <int BN>
__device__ __forceinline__ void softmax_scores(float (&s)[BN / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                               float (&alpha)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = row_max[r];
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
    alpha[r] = dev::ex2_ftz(row_max[r] * scale_log2 - m_scaled);
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb) {
      s[nb][2 * r] = dev::ex2_ftz(fmaf(s[nb][2 * r], scale_log2, -m_scaled));
      s[nb][2 * r + 1] = dev::ex2_ftz(fmaf(s[nb][2 * r + 1], scale_log2, -m_scaled));
      sum += s[nb][2 * r] + s[nb][2 * r + 1];
    }
    row_sum[r] = row_sum[r] * alpha[r] + sum;  // per-thread partial; reduced across the quad at the end
  }
}

template <int D>
__device__ __forceinline__ void rescale_rows(float (&acc_o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    acc_o[i][0] *= alpha[0];
    acc_o[i][1] *= alpha[0];
    acc_o[i][2] *= alpha[1];
    acc_o[i][3] *= alpha[1];
  }
}

// softmax_scores, then O's rows rescaled (the step of the mma.sync forward).
template <int BN, int D>
__device__ __forceinline__ void softmax_step(float (&s)[BN / 8][4], float (&acc_o)[D / 8][4], float (&row_max)[2],
                                             float (&row_sum)[2], float scale_log2) {
  float alpha[2];
  softmax_scores<BN>(s, row_max, row_sum, alpha, scale_log2);
  rescale_rows<D>(acc_o, alpha);
}

// P as bf16 A fragments (the S accumulator layout of two n-blocks is the A layout of one k-step,
// for mma.sync m16n8k16 and for wgmma m64nNk16 alike).
template <int BN>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[BN / 16][4], const float (&s)[BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// ---- work-list decode (every kernel but the preprocess / sums) ------------------------------------
// A query tile on the forward's work list (forward and dQ kernels): `work` the slot's entry
// (checked live by the caller), h the query head (blockIdx.x, or the persistent forward's item).
struct QueryTile {
  int start, L, m0, h, kvh;  // sample start / length, tile's first row (sample-local), heads
  int64_t ldq, ldk;          // row strides of q / o / dO and of k / v
};
template <class Params>
__device__ __forceinline__ QueryTile query_tile(const Params& p, int2 work, int bm, int d, int h) {
  QueryTile t;
  t.start = p.cu[work.x];
  t.L = p.cu[work.x + 1] - t.start;
  t.m0 = work.y * bm;
  t.h = h;
  t.kvh = t.h / (p.hq / p.hkv);
  t.ldq = static_cast<int64_t>(p.hq) * d;
  t.ldk = static_cast<int64_t>(p.hkv) * d;
  return t;
}

// The CTA's key tile on the backward's work list (dK / dV kernels): blockIdx.x is (kv head, split),
// `work` the slot's entry (checked live by the caller). The CTA runs query heads h_first .. of its split over the query tiles
// m_begin + BM i (i < n_m), n_iter (head, tile) iterations in all.
struct KeyTile {
  int start, L, n0, kvh, split, h_first, m_begin, n_m, n_iter;
  int64_t ldq, ldk;
};
template <class Params>
__device__ __forceinline__ KeyTile key_tile(const Params& p, int2 work, int bm, int bn, int d) {
  KeyTile t;
  t.kvh = blockIdx.x / p.splits;
  t.split = blockIdx.x % p.splits;
  t.start = p.cu[work.x];
  t.L = p.cu[work.x + 1] - t.start;
  t.n0 = work.y * bn;
  const int heads = p.hq / p.hkv / p.splits;  // query heads of this CTA
  t.h_first = t.kvh * (p.hq / p.hkv) + t.split * heads;
  t.ldq = static_cast<int64_t>(p.hq) * d;
  t.ldk = static_cast<int64_t>(p.hkv) * d;
  t.m_begin = (t.n0 / bm) * bm;
  t.n_m = (t.L - t.m_begin + bm - 1) / bm;
  t.n_iter = heads * t.n_m;
  return t;
}

// Where a dK / dV CTA's results go: bf16 pairs into dk / dv, or with several splits its f32 share
// into its slices of dkv_part (dK scaled, then dV; attn_bwd_dkv_sum_kernel adds them in order).
struct DkvOut {
  bf16 *dk, *dv;
  float *pdk, *pdv;  // with splits
  bool split;
  // Elements o, o + 1 (offsets from the tile's first key row) of dK (already scaled) and dV.
  __device__ __forceinline__ void store(int64_t o, float k0, float k1, float v0, float v1) const {
    if (!split) {
      *reinterpret_cast<uint32_t*>(dk + o) = pack_bf16(k0, k1);
      *reinterpret_cast<uint32_t*>(dv + o) = pack_bf16(v0, v1);
    } else {
      *reinterpret_cast<float2*>(pdk + o) = make_float2(k0, k1);
      *reinterpret_cast<float2*>(pdv + o) = make_float2(v0, v1);
    }
  }
};
template <class Params>
__device__ __forceinline__ DkvOut dkv_out(const Params& p, const KeyTile& t, int d) {
  const int64_t slice = static_cast<int64_t>(p.total) * t.ldk;
  const int64_t row0 = (t.start + t.n0) * t.ldk + t.kvh * d;
  float* pdk = p.splits > 1 ? p.dkv_part + 2 * t.split * slice + row0 : nullptr;
  return DkvOut{p.dk + row0, p.dv + row0, pdk, p.splits > 1 ? pdk + slice : nullptr, p.splits > 1};
}

// lse (log2 units) and Dsum of a thread's fragment rows row0 and row0 + 8 (sample-local) of query
// head h of the sample at `start` with L rows; 0 past the sample, where P is masked anyway.
template <class Params>
__device__ __forceinline__ void load_row_stats(const Params& p, int h, int start, int L, int row0, float (&lse2)[2],
                                               float (&dsum)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const int64_t i = static_cast<int64_t>(h) * p.total + start + row;
    lse2[r] = row < L ? p.lse2[i] : 0.f;
    dsum[r] = row < L ? p.dsum[i] : 0.f;
  }
}

// ---- forward ------------------------------------------------------------------------------------

struct FwdParams {
  bf16* o;
  float* lse;
  const bf16 *q, *k, *v;
  const int32_t* cu;
  const int2* tiles;  // slot -> (sample, tile index), sample -1 past the last tile
  int total, hq, hkv;
  float scale;
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1) attn_fwd_kernel(const FwdParams p) {
  using Tr = FwdTraits<D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + BM * D;
  bf16* sV = sK + BN * D;

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const QueryTile t = query_tile(p, work, BM, D, blockIdx.x);
  const int start = t.start, L = t.L, m0 = t.m0, h = t.h, kvh = t.kvh;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const bf16* gQ = p.q + (start + m0) * ldq + h * D;
  const bf16* gK = p.k + start * ldk + kvh * D;
  const bf16* gV = p.v + start * ldk + kvh * D;
  const int n_tiles = (min(m0 + BM, L) + BN - 1) / BN;

  load_tile<BM, D>(sQ, gQ, ldq, min(BM, L - m0), tid);
  load_tile<BN, D>(sK, gK, ldk, min(BN, L), tid);
  cp_async_commit();

  const int wrow0 = m0 + warp * 16;  // sample-local index of this warp's first row
  const float scale_log2 = p.scale * kLog2e;
  float acc_o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  const LaneSwz x3 = lane_swz<kRowBit3>(lane), x4 = lane_swz<kRowBit4>(lane);
  const uint32_t q_a = lane_row<D, kRowBit3>(smem_u32(sQ), lane) + 2 * D * warp * 16;  // A: this warp's rows
  const uint32_t k_b = lane_row<D, kRowBit4>(smem_u32(sK), lane);                      // B of Q K^T
  const uint32_t v_bt = lane_row<D, kRowBit3>(smem_u32(sV), lane);                     // B of P V (.trans)

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * BN;
    load_tile<BN, D>(sV, gV + n0 * ldk, ldk, min(BN, L - n0), tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K_j have landed
    __syncthreads();

    const bool active = n0 <= wrow0 + 15;  // the warp has at least one unmasked column here
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    if (active) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, blk<D>(q_a, x3, 0, kk));
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          uint32_t b[4];
          ldsm_x4(b, blk<D>(k_b, x4, nb * 16, kk));
          mma_bf16(s[2 * nb], a, b[0], b[1]);
          mma_bf16(s[2 * nb + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with sK
    if (j + 1 < n_tiles) load_tile<BN, D>(sK, gK + (n0 + BN) * ldk, ldk, min(BN, L - n0 - BN), tid);
    cp_async_commit();

    if (active) {
      if (n0 + BN - 1 > wrow0 || n0 + BN > L) mask_tile<BN>(s, n0, wrow0, g, t4, L);  // diagonal / sample end
      softmax_step<BN, D>(s, acc_o, row_max, row_sum, scale_log2);
    }
    uint32_t pa[BN / 16][4];
    pack_p<BN>(pa, s);
    cp_async_wait<1>();  // V_j has landed
    __syncthreads();
    if (active) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
          uint32_t b[4];
          ldsm_x4_t(b, blk<D>(v_bt, x3, kk * 16, db));
          mma_bf16(acc_o[2 * db], pa[kk], b[0], b[1]);
          mma_bf16(acc_o[2 * db + 1], pa[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with sV
  }

  // Epilogue: normalise, lse, stage O (bf16) in this warp's own rows of sQ, 16-byte stores.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    const int row = wrow0 + g + 8 * r;
    if (t4 == 0 && row < L)
      p.lse[static_cast<int64_t>(h) * p.total + start + row] = l > 0.f ? row_max[r] * p.scale + logf(l) : -INFINITY;
  }
  store_warp_rows<D>(p.o + (start + wrow0) * ldq + h * D, ldq, sQ, acc_o, inv, L - wrow0, warp, lane);
}

// ---- forward on wgmma (D = 256, the Qwen3.5 head dim; the default there) -----------------------
// Same tile (128 query rows x 64 keys), work list and masking as attn_fwd_kernel, but the products
// run on wgmma: warpgroup w (threads 128 w ..) owns query rows 64 w .. 64 w + 63; S = Q K^T is 16
// m64n64k16 steps with Q and K from smem (K-major), O += P V is 4 m64n256k16 steps with P from
// registers and V N-major. Software pipeline (FA3's intra-warpgroup overlap): iteration j issues
// S_j and then P_{j-1} V_{j-1} without waiting in between, so the tensor cores run P V while the
// warpgroup does S_j's softmax; O is rescaled by S_j's alpha only once P_{j-1} V_{j-1} has landed.
// K and V are double-buffered: tile j + 1's K and tile j's V load under iteration j's products.
// Tiles are stored in wgmma's 128-byte-swizzle panels (wgmma.cuh): column block c / 64 of a
// [ROWS][256] tile at c / 64 * ROWS * 128 bytes, row r at r * 128 inside it, 16-byte chunk x at
// x ^ (r & 7). K and V use the same layout: K is K-major B of S (rows = keys), V the N-major B of
// P V (rows = keys = the K dimension, 64-column blocks 64 * 128 bytes apart = LBO).
constexpr int kWgD = 256, kWgBM = 128, kWgBN = 64;
constexpr size_t kWgTileBytes = size_t(kWgBN) * kWgD * 2;
constexpr size_t kWgSmem = size_t(kWgBM) * kWgD * 2 + 4 * kWgTileBytes + 1024;  // Q, 2 K, 2 V, alignment pad

// One fragment row (r = 0: row g, 1: row g + 8) of a m64n256 accumulator times mul, as bf16 pairs
// straight to global: thread t4 of the quad writes columns 8 j + 2 t4, + 1.
__device__ __forceinline__ void store_row_pairs(bf16* row, const float (&acc)[kWgD / 8][4], int r, float mul,
                                                int t4) {
#pragma unroll
  for (int j = 0; j < kWgD / 8; ++j)
    *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * t4) = pack_bf16(acc[j][2 * r] * mul, acc[j][2 * r + 1] * mul);
}

// Async copy of a [ROWS][256] bf16 tile into panel layout; rows >= valid are zero-filled.
template <int ROWS>
__device__ __forceinline__ void load_panels(char* s, const bf16* g, int64_t ld, int valid, int tid) {
  constexpr int kChunks = ROWS * (kWgD / 8);  // 16-byte chunks
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads, row = c / (kWgD / 8), ch = c % (kWgD / 8);
    const uint32_t dst = smem_u32(s + (ch / 8) * (ROWS * 128) + row * 128 + (((ch % 8) ^ (row & 7)) << 4));
    const bool ok = row < valid;
    cp_async16(dst, ok ? g + row * ld + ch * 8 : g, ok);
  }
}

// acc[64 rows x 64 keys] = A B^T over the head dim: A's 64 rows start at `a` in panels a_panel
// bytes apart, B is a 64-row panel tile (K or V). Issued and committed, not waited for; the first
// k-step overwrites acc.
__device__ __forceinline__ void wg_issue_abt(float (&acc)[kWgBN / 2], const char* a, uint32_t a_panel, const char* b) {
  wg::fence();
  wg::mma_abt<kWgBN, kWgD / 16>(acc, a, a_panel, b, kWgBN * 128);
  wg::commit();
}

// S (this warpgroup's 64 rows x 64 keys) = Q K^T.
__device__ __forceinline__ void wg_issue_s(float (&s_flat)[kWgBN / 2], const char* sQ, const char* sK, int row0) {
  wg_issue_abt(s_flat, sQ + row0 * 128, kWgBM * 128, sK);
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

__global__ void __launch_bounds__(kThreads, 1) attn_fwd_wgmma_kernel(const FwdParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sQ = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sK = sQ + kWgBM * kWgD * 2;  // two K buffers, then two V buffers
  char* sV = sK + 2 * kWgTileBytes;

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const QueryTile t = query_tile(p, work, kWgBM, kWgD, blockIdx.x);
  const int start = t.start, L = t.L, m0 = t.m0, h = t.h, kvh = t.kvh;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, wg_i = tid >> 7, wt = tid & 127, wq = wt >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const bf16* gQ = p.q + (start + m0) * ldq + h * kWgD;
  const bf16* gK = p.k + start * ldk + kvh * kWgD;
  const bf16* gV = p.v + start * ldk + kvh * kWgD;
  const int n_tiles = (min(m0 + kWgBM, L) + kWgBN - 1) / kWgBN;

  const int grow0 = m0 + 64 * wg_i;   // sample-local first row of this warpgroup
  const int wrow0 = grow0 + 16 * wq;  // ... of this warp
  const float scale_log2 = p.scale * kLog2e;

  // Prologue: group 0 = Q, K_0; group 1 = V_0 and K_1.
  load_panels<kWgBM>(sQ, gQ, ldq, min(kWgBM, L - m0), tid);
  load_panels<kWgBN>(sK, gK, ldk, min(kWgBN, L), tid);
  cp_async_commit();
  load_panels<kWgBN>(sV, gV, ldk, min(kWgBN, L), tid);
  if (n_tiles > 1) load_panels<kWgBN>(sK + kWgTileBytes, gK + kWgBN * ldk, ldk, min(kWgBN, L - kWgBN), tid);
  cp_async_commit();

  float acc_o[kWgD / 8][4];  // the m64n256 accumulator, as [8-column block][fragment element]
#pragma unroll
  for (int i = 0; i < kWgD / 8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float(&acc_flat)[kWgD / 2] = reinterpret_cast<float(&)[kWgD / 2]>(acc_o);
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
  float s[kWgBN / 8][4];
  float(&s_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(s);
  uint32_t pa[kWgBN / 16][4];

  cp_async_wait<1>();
  wg::fence_proxy_async();
  __syncthreads();
  wg_issue_s(s_flat, sQ, sK, grow0 % kWgBM);
  wg::wait<0>();
  wg::fence_operands(s_flat);
  fwd_softmax_tile(s, 0, wrow0, g, t4, L, row_max, row_sum, alpha, scale_log2);
  pack_p<kWgBN>(pa, s);

  for (int j = 1; j < n_tiles; ++j) {
    const int n0 = j * kWgBN;
    // K_j and V_{j-1} have landed (the only group in flight), and every warpgroup is past
    // iteration j - 1, so K_{j-1}'s and V_{j-2}'s buffers are free for K_{j+1} and V_j.
    cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
    // Both warpgroups run every tile, even warpgroup 0 on a last tile that is all above its
    // diagonal (masked to P = 0): a wgmma under a warpgroup-dependent branch makes ptxas serialize
    // every wgmma of the kernel (C7518).
    wg_issue_s(s_flat, sQ, sK + (j & 1) * kWgTileBytes, grow0 % kWgBM);
    wg_issue_pv(acc_flat, pa, sV + ((j - 1) & 1) * kWgTileBytes);
    // The loads go out behind the products (their buffers are not the ones being read).
    load_panels<kWgBN>(sV + (j & 1) * kWgTileBytes, gV + n0 * ldk, ldk, min(kWgBN, L - n0), tid);
    if (j + 1 < n_tiles)
      load_panels<kWgBN>(sK + ((j + 1) & 1) * kWgTileBytes, gK + (n0 + kWgBN) * ldk, ldk, min(kWgBN, L - n0 - kWgBN),
                         tid);
    cp_async_commit();
    wg::wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    wg::fence_operands(s_flat);
    fwd_softmax_tile(s, n0, wrow0, g, t4, L, row_max, row_sum, alpha, scale_log2);
    wg::wait<0>();
    wg::fence_operands(acc_flat);
    rescale_rows<kWgD>(acc_o, alpha);
    pack_p<kWgBN>(pa, s);
  }
  cp_async_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();  // V_{n-1} from every thread's copies
  wg_issue_pv(acc_flat, pa, sV + ((n_tiles - 1) & 1) * kWgTileBytes);
  wg::wait<0>();
  wg::fence_operands(acc_flat);

  store_fwd_rows(p, t, acc_o, row_sum, row_max, wrow0, g, t4);
}

// ---- forward on wgmma, warp-specialized (FA3's structure; the default at D = 256) ---------------
// The tile, work list, software pipeline and masking of attn_fwd_wgmma_kernel, in three
// warpgroups. Warpgroup 0 is the producer: one thread issues every tile load by TMA (2-D boxes of
// 64 columns x the tile's rows, written by the hardware into the 128-byte-swizzle panels), and the
// warpgroup gives its registers to the others (setmaxnreg, kFwdProducerRegs / kFwdConsumerRegs).
// Warpgroups 1 and 2 are the consumers (query rows 0-63 and 64-127) and never issue a load or
// meet at a CTA barrier: K and V have two stages each, with a `full` barrier per stage (its TMA
// bytes landed) and an `empty` one (all 8 consumer warps are done reading it), so the producer runs
// ahead by up to two tiles and neither consumer waits for the other. The cp.async kernel spent its issue slots on
// 256 threads' address math and met at a __syncthreads per key tile.
// TMA reads the packed rows as they are: keys past the sample end belong to the next sample (or are
// zeros past T). Their scores are masked as before; their V rows are zeroed in smem before the last
// P V, so that a non-finite value there cannot turn P = 0 into NaN.
constexpr int kWsThreads = 384, kWsConsumerWarps = 8;
// setmaxnreg split of the 64K registers: the producer warpgroup gives its share to the consumers.
constexpr int kWsProducerRegs = 24, kWsConsumerRegs = 240;
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 65536, "register file of one SM");
// The persistent forward's producer walks the work list itself: 56 registers (48 spill), and
// the consumers fit in 224 without spills.
constexpr int kFwdProducerRegs = 56, kFwdConsumerRegs = 224;
static_assert(128 * kFwdProducerRegs + 256 * kFwdConsumerRegs <= 65536, "register file of one SM");
// The warpgroup index as lane 0's value: the compiler then sees the producer / consumer branch as
// warp-uniform, not as a divergent path around the consumers' wgmma (which serializes it, C7518).
__device__ __forceinline__ int ws_warpgroup() { return __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); }
struct WsBarriers {
  uint64_t q_full, q_empty, k_full[2], v_full[2], k_empty[2], v_empty[2];
};
constexpr size_t kWsSmem = kWgSmem + sizeof(WsBarriers);
// The tensor maps of q, k and v (a __grid_constant__ kernel parameter; CUtensorMap is 128-byte aligned).
struct FwdMaps {
  CUtensorMap q, k, v;
};

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

// ---- backward -----------------------------------------------------------------------------------

struct BwdParams {
  bf16 *dk, *dv;
  float* dkv_part;     // splits > 1: per split, dK (scaled) then dV as f32 [T, Hkv, D] slices
  float* dq_acc;       // [T, Hq, D] f32, zeroed by the preprocess
  const float* lse2;   // [Hq, T] lse * log2(e)
  const float* dsum;   // [Hq, T] rowsum(dO * O)
  const bf16 *d_o, *q, *k, *v;
  const int32_t* cu;
  const int2* tiles;   // slot -> (sample, key tile index), sample -1 past the last tile
  int total, hq, hkv;
  int splits;          // CTAs per (kv head, key tile), each taking group / splits query heads
  float scale;
};

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

// kDQ: also dQ (fp32 atomics into dq_acc); false when attn_bwd_dq_kernel computes it.
template <int D, bool kDQ>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_kernel(const BwdParams p) {
  using Tr = BwdTraits<D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + BN * D;
  bf16* sQ = sV + BN * D;
  bf16* sdO = sQ + BM * D;
  bf16* sP = sdO + BM * D;
  bf16* sdS = sP + BM * BN;
  float* sLse = reinterpret_cast<float*>(sdS + BM * BN);
  float* sDs = sLse + BM;

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const KeyTile t = key_tile(p, work, BM, BN, D);
  const int start = t.start, L = t.L, n0 = t.n0, kvh = t.kvh, h_first = t.h_first;
  const int m_begin = t.m_begin, n_m = t.n_m, n_iter = t.n_iter;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  load_tile<BN, D>(sK, p.k + (start + n0) * ldk + kvh * D, ldk, min(BN, L - n0), tid);
  load_tile<BN, D>(sV, p.v + (start + n0) * ldk + kvh * D, ldk, min(BN, L - n0), tid);

  // Issues the loads of iteration it (query head, query tile) into sQ, sdO, sLse, sDs.
  auto load_q = [&](int it) {
    const int h = h_first + it / n_m, m0 = m_begin + (it % n_m) * BM;
    const int valid = min(BM, L - m0);
    load_tile<BM, D>(sQ, p.q + (start + m0) * ldq + h * D, ldq, valid, tid);
    load_tile<BM, D>(sdO, p.d_o + (start + m0) * ldq + h * D, ldq, valid, tid);
    if (tid < 2 * BM) {
      const int r = tid % BM;
      const float* src = (tid < BM ? p.lse2 : p.dsum) + static_cast<int64_t>(h) * p.total + start + m0 + min(r, valid - 1);
      cp_async4(smem_u32((tid < BM ? sLse : sDs) + r), src, r < valid);
    }
  };
  load_q(0);
  cp_async_commit();

  // Warp layouts. S, dP (BM x BN): 4 x 2 warps of 16 x 32. dV, dK (BN x D): 2 x 4 warps of
  // 32 x D/4. dQ (BM x D): 4 x 2 warps of 16 x D/2, in 32-column chunks.
  const int wm = warp & 3, wn = warp >> 2;
  const int wkv_n = warp & 1, wkv_d = warp >> 1;
  constexpr int kDW = D / 4;  // dK/dV columns per warp
  float acc_dv[2][kDW / 8][4], acc_dk[2][kDW / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < kDW / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[mt][i][e] = acc_dk[mt][i][e] = 0.f;

  const float scale_log2 = p.scale * kLog2e;
  // Lane addresses. Warp-dependent column offsets are folded into the bases (per 16-column block
  // when they are not a multiple of 4 blocks), so every index into x3 / x4 is a compile-time one.
  const LaneSwz x3 = lane_swz<kRowBit3>(lane), x4 = lane_swz<kRowBit4>(lane);
  const int bit3 = (lane >> 3) & 1, bit4 = (lane >> 4) & 1;
  const uint32_t q_3 = lane_row<D, kRowBit3>(smem_u32(sQ), lane), do_3 = lane_row<D, kRowBit3>(smem_u32(sdO), lane),
                 k_3 = lane_row<D, kRowBit3>(smem_u32(sK), lane), k_4 = lane_row<D, kRowBit4>(smem_u32(sK), lane),
                 v_4 = lane_row<D, kRowBit4>(smem_u32(sV), lane), ds_3 = lane_row<BN, kRowBit3>(smem_u32(sdS), lane);
  uint32_t p_at[2], ds_at[2];  // A = P^T / dS^T blocks (key rows wkv_n * 32 + 16 mt)
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    p_at[mt] = lane_row<BN, kRowBit4>(smem_u32(sP), lane) + col_off(wkv_n * 2 + mt, bit3, lane);
    ds_at[mt] = lane_row<BN, kRowBit4>(smem_u32(sdS), lane) + col_off(wkv_n * 2 + mt, bit3, lane);
  }
  // B (.trans) of the dV / dK GEMMs: dO and Q columns wkv_d * kDW + 16 db.
  constexpr int kDB = kDW / 16;
  constexpr bool kFoldKV = kDB % 4 == 0;
  uint32_t do_bt[kFoldKV ? 1 : kDB], q_bt[kFoldKV ? 1 : kDB];
#pragma unroll
  for (int db = 0; db < (kFoldKV ? 1 : kDB); ++db) {
    do_bt[db] = do_3 + (kFoldKV ? 128u * static_cast<uint32_t>(wkv_d * kDB / 4) : col_off(wkv_d * kDB + db, bit4, lane));
    q_bt[db] = q_3 + (kFoldKV ? 128u * static_cast<uint32_t>(wkv_d * kDB / 4) : col_off(wkv_d * kDB + db, bit4, lane));
  }
  // B (.trans) of the dQ GEMM: K columns wn * D / 2 + 32 c + 16 db.
  constexpr bool kFoldQ = (D / 32) % 4 == 0;
  uint32_t k_bt[kFoldQ ? 1 : D / 32];
#pragma unroll
  for (int cb = 0; cb < (kFoldQ ? 1 : D / 32); ++cb)
    k_bt[cb] = k_3 + (kFoldQ ? 128u * static_cast<uint32_t>(wn * (D / 32) / 4) : col_off(wn * (D / 32) + cb, bit4, lane));

  for (int it = 0; it < n_iter; ++it) {
    const int h = h_first + it / n_m, m0 = m_begin + (it % n_m) * BM;
    cp_async_wait<0>();
    __syncthreads();

    // S = Q K^T and dP = dO V^T, 16 x 32 per warp.
    float s[4][4], dp[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4], b[4];
      ldsm_x4(a, blk<D>(q_3, x3, wm * 16, kk));
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        ldsm_x4(b, blk<D>(k_4, x4, wn * 32 + nb * 16, kk));
        mma_bf16(s[2 * nb], a, b[0], b[1]);
        mma_bf16(s[2 * nb + 1], a, b[2], b[3]);
      }
      ldsm_x4(a, blk<D>(do_3, x3, wm * 16, kk));
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        ldsm_x4(b, blk<D>(v_4, x4, wn * 32 + nb * 16, kk));
        mma_bf16(dp[2 * nb], a, b[0], b[1]);
        mma_bf16(dp[2 * nb + 1], a, b[2], b[3]);
      }
    }
    // P = exp(S * scale - lse), dS = P * (dP - Dsum); store both (bf16) for the next GEMMs.
    const bool need_mask = m0 < n0 + BN - 1 || m0 + BM > L;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int rl = wm * 16 + g + 8 * r, cl = wn * 32 + nb * 8 + 2 * t4;
        const float lse2 = sLse[rl], dsum = sDs[rl];
        float pv[2], dsv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float pe = dev::ex2_ftz(fmaf(s[nb][2 * r + e], scale_log2, -lse2));
          if (need_mask && (n0 + cl + e > m0 + rl || m0 + rl >= L)) pe = 0.f;
          pv[e] = pe;
          dsv[e] = pe * (dp[nb][2 * r + e] - dsum);
        }
        *reinterpret_cast<uint32_t*>(sP + swz<BN>(rl, cl)) = pack_bf16(pv[0], pv[1]);
        *reinterpret_cast<uint32_t*>(sdS + swz<BN>(rl, cl)) = pack_bf16(dsv[0], dsv[1]);
      }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q (scale applied at the end): 32 x D/4 per warp, k = BM.
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t ap[2][4], ads[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        ldsm_x4_t(ap[mt], p_at[mt] + 2 * BN * 16 * kk);
        ldsm_x4_t(ads[mt], ds_at[mt] + 2 * BN * 16 * kk);
      }
#pragma unroll
      for (int db = 0; db < kDW / 16; ++db) {
        uint32_t b[4];
        ldsm_x4_t(b, kFoldKV ? blk<D>(do_bt[0], x3, kk * 16, db) : do_bt[kFoldKV ? 0 : db] + 2 * D * 16 * kk);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(acc_dv[mt][2 * db], ap[mt], b[0], b[1]);
          mma_bf16(acc_dv[mt][2 * db + 1], ap[mt], b[2], b[3]);
        }
        ldsm_x4_t(b, kFoldKV ? blk<D>(q_bt[0], x3, kk * 16, db) : q_bt[kFoldKV ? 0 : db] + 2 * D * 16 * kk);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(acc_dk[mt][2 * db], ads[mt], b[0], b[1]);
          mma_bf16(acc_dk[mt][2 * db + 1], ads[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // sQ, sdO, sLse, sDs are free: prefetch the next iteration under the dQ GEMM
    if (it + 1 < n_iter) load_q(it + 1);
    cp_async_commit();

    // dQ_acc += dS K (unscaled), 16 rows x 32 columns at a time, fp32 atomics.
    if constexpr (kDQ) {
      float* gdq = p.dq_acc + (start + m0) * ldq + h * D;
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        const int d0 = wn * (D / 2) + c * 32;
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t a[4], b[4];
          ldsm_x4(a, blk<BN>(ds_3, x3, wm * 16, kk));
#pragma unroll
          for (int db = 0; db < 2; ++db) {
            ldsm_x4_t(b, kFoldQ ? blk<D>(k_bt[0], x3, kk * 16, 2 * c + db)
                                : k_bt[kFoldQ ? 0 : 2 * c + db] + 2 * D * 16 * kk);
            mma_bf16(acc[2 * db], a, b[0], b[1]);
            mma_bf16(acc[2 * db + 1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int rl = wm * 16 + g + 8 * r;
          if (m0 + rl < L) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
              atomicAdd(reinterpret_cast<float2*>(gdq + rl * ldq + d0 + i * 8 + 2 * t4),
                        make_float2(acc[i][2 * r], acc[i][2 * r + 1]));
          }
        }
      }
    }
  }

  // dK (scaled) and dV, rows < L - n0 (DkvOut: bf16, or this split's f32 share).
  const DkvOut out = dkv_out(p, t, D);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rl = wkv_n * 32 + mt * 16 + g + 8 * r;
      if (n0 + rl >= L) continue;
#pragma unroll
      for (int i = 0; i < kDW / 8; ++i) {
        const int64_t o = rl * ldk + wkv_d * kDW + i * 8 + 2 * t4;
        const float k0 = acc_dk[mt][i][2 * r] * p.scale, k1 = acc_dk[mt][i][2 * r + 1] * p.scale;
        out.store(o, k0, k1, acc_dv[mt][i][2 * r], acc_dv[mt][i][2 * r + 1]);
      }
    }
}

// ---- dK / dV on wgmma (D = 256, the deterministic backward: dQ comes from attn_bwd_dq_kernel) ----
// Same CTA (kv head [x split], key tile of 64) and work list as attn_bwd_kernel. Per query tile
// (64 rows) of each query head of the CTA: warpgroup 0 computes S = Q K^T and P = exp(S scale -
// lse) (masked), warpgroup 1 dP = dO V^T (16 m64n64k16 each, both operands K-major from smem). P
// goes to smem twice: f32 in accumulator order (warpgroup 1 reads it in the same order for dS = P
// (dP - Dsum)) and bf16 [query][key]; dS follows as bf16. Each warpgroup then accumulates its half
// of the head dim: dV += P^T dO and dK += dS^T Q, 4 m64n128k16 each with A M-major (P, dS as
// stored) and B N-major (dO, Q tiles), 64 + 64 accumulator floats per thread. Q, dO, lse and Dsum
// are double-buffered: the next query tile loads under this one's products.
constexpr uint32_t kWgPBytes = 64 * 64 * 2;  // a bf16 [64][64] panel (P or dS)
constexpr size_t kWgBwdSmem = 6 * kWgTileBytes + 2 * kWgPBytes + 64 * 64 * 4 + 4 * 64 * 4 + 1024;
static_assert(kWgBwdSmem <= 227 * 1024, "wgmma dK / dV kernel smem over the sm_90 per-block limit");

// Epilogue of the wgmma dK / dV kernels: a warpgroup's m64n128 accumulators (keys rl0 and rl0 + 8 of
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

__global__ void __launch_bounds__(kThreads, 1) attn_bwd_dkv_wgmma_kernel(const BwdParams p) {
  constexpr int BM = 64, BN = 64;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sK = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sV = sK + kWgTileBytes;
  char* sQ = sV + kWgTileBytes;        // 2 buffers
  char* sdO = sQ + 2 * kWgTileBytes;   // 2 buffers
  char* sP = sdO + 2 * kWgTileBytes;   // bf16 [query][key]
  char* sdS = sP + kWgPBytes;          // bf16 [query][key]
  float* sPf = reinterpret_cast<float*>(sdS + kWgPBytes);  // P, f32, [fragment element][thread]
  float* sLse = sPf + BM * BN;         // 2 buffers of BM
  float* sDs = sLse + 2 * BM;          // 2 buffers of BM

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const KeyTile t = key_tile(p, work, BM, BN, kWgD);
  const int start = t.start, L = t.L, n0 = t.n0, kvh = t.kvh, h_first = t.h_first;
  const int m_begin = t.m_begin, n_m = t.n_m, n_iter = t.n_iter;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, wg_i = tid >> 7, wt = tid & 127, wq = wt >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  load_panels<BN>(sK, p.k + (start + n0) * ldk + kvh * kWgD, ldk, min(BN, L - n0), tid);
  load_panels<BN>(sV, p.v + (start + n0) * ldk + kvh * kWgD, ldk, min(BN, L - n0), tid);
  // Issues the loads of iteration it (query head, query tile) into buffer it & 1.
  auto load_q = [&](int it) {
    const int h = h_first + it / n_m, m0 = m_begin + (it % n_m) * BM, valid = min(BM, L - m0), b = it & 1;
    load_panels<BM>(sQ + b * kWgTileBytes, p.q + (start + m0) * ldq + h * kWgD, ldq, valid, tid);
    load_panels<BM>(sdO + b * kWgTileBytes, p.d_o + (start + m0) * ldq + h * kWgD, ldq, valid, tid);
    if (tid < 2 * BM) {
      const int r = tid % BM;
      const float* src = (tid < BM ? p.lse2 : p.dsum) + static_cast<int64_t>(h) * p.total + start + m0 + min(r, valid - 1);
      cp_async4(smem_u32((tid < BM ? sLse : sDs) + b * BM + r), src, r < valid);
    }
  };
  load_q(0);
  cp_async_commit();

  float acc_dv[64], acc_dk[64];  // m64n128: keys 16 wq + g (+ 8), head-dim columns 128 wg_i + 8 j + 2 t4
#pragma unroll
  for (int i = 0; i < 64; ++i) acc_dv[i] = acc_dk[i] = 0.f;
  const float scale_log2 = p.scale * kLog2e;
  const int rl0 = 16 * wq + g;  // tile-local query row of fragment elements 0, 1 (+ 8 for 2, 3)

  for (int it = 0; it < n_iter; ++it) {
    const int m0 = m_begin + (it % n_m) * BM, b = it & 1;
    // Tile it has landed; every warpgroup has finished iteration it - 1's products, so P, dS and
    // buffer b ^ 1 are free.
    cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
    if (it + 1 < n_iter) load_q(it + 1);
    cp_async_commit();
    const char* qb = sQ + b * kWgTileBytes;
    const char* dob = sdO + b * kWgTileBytes;

    float s[BN / 8][4];  // warpgroup 0: S, then P; warpgroup 1: dP
    float(&s_flat)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(s);
    wg_issue_abt(s_flat, wg_i == 0 ? qb : dob, BM * 128, wg_i == 0 ? sK : sV);
    wg::wait<0>();
    wg::fence_operands(s_flat);

    if (wg_i == 0) {  // P = exp2(S scale log2 e - lse2), 0 for keys after the query and queries past the sample
      const bool need_mask = m0 < n0 + BN - 1 || m0 + BM > L;
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int rl = rl0 + 8 * r, cl = 8 * nb + 2 * t4;
          const float lse2 = sLse[b * BM + rl];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float pe = dev::ex2_ftz(fmaf(s[nb][2 * r + e], scale_log2, -lse2));
            if (need_mask && (n0 + cl + e > m0 + rl || m0 + rl >= L)) pe = 0.f;
            s[nb][2 * r + e] = pe;
            sPf[(4 * nb + 2 * r + e) * 128 + wt] = pe;
          }
          *reinterpret_cast<uint32_t*>(sP + wg::sw128(rl, cl)) = pack_bf16(s[nb][2 * r], s[nb][2 * r + 1]);
        }
      wg::fence_proxy_async();
    }
    __syncthreads();  // P in smem (f32 for warpgroup 1, bf16 for the products)

    // dV[:, half] += P^T dO[:, half]: A = P [query][key] M-major, B = dO N-major (64-column blocks
    // BM * 128 bytes apart); k16 steps of 16 queries.
    wg_issue_dkv(acc_dv, sP, dob + 2 * wg_i * (BM * 128));
    if (wg_i == 1) {  // dS = P (dP - Dsum), under the dV product
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int rl = rl0 + 8 * r, cl = 8 * nb + 2 * t4;
          const float dsum = sDs[b * BM + rl];
          float ds[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) ds[e] = sPf[(4 * nb + 2 * r + e) * 128 + wt] * (s[nb][2 * r + e] - dsum);
          *reinterpret_cast<uint32_t*>(sdS + wg::sw128(rl, cl)) = pack_bf16(ds[0], ds[1]);
        }
      wg::fence_proxy_async();
    }
    __syncthreads();  // dS in smem

    // dK[:, half] += dS^T Q[:, half] (scale applied at the end).
    wg_issue_dkv(acc_dk, sdS, qb + 2 * wg_i * (BM * 128));
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      wg::fence_operand(acc_dv[i]);
      wg::fence_operand(acc_dk[i]);
    }
  }

  store_dkv_rows(p, t, acc_dk, acc_dv, rl0, wg_i, t4);
}

// ---- dK / dV on wgmma, warp-specialized (the default at D = 256) ---------------------------------
// The same CTA, work list and products as attn_bwd_dkv_wgmma_kernel, rearranged so the two consumer
// warpgroups are symmetric and meet once per query tile instead of three times: warpgroup c takes
// keys 32 c .. 32 c + 31 of the tile for S = Q K^T and dP = dO V^T (m64n32k16 x 16 each, all 64
// query rows) and turns them into P and dS in registers (lse2 / Dsum read per row from global, one
// tile ahead), writes both as bf16 into its half of the [query][key] panels, and after one named
// barrier accumulates its head-dim half of dV += P^T dO and dK += dS^T Q over all 64 keys (P / dS
// double-buffered, so the next tile's writes need no second barrier). S and dP of the next tile are
// issued behind this tile's dV / dK products. The producer warpgroup loads K and V once and Q / dO
// per tile (two stages) by TMA. Query rows past the sample end hold the next sample's: P and dS are
// selected to exactly 0 there, and those Q / dO rows are zeroed in smem (they meet P = 0 and dS = 0
// in the products, where 0 * NaN would leak).
// The tensor maps of the backward's TMA kernels (q and dO in boxes of the kernel's query tile).
struct BwdMaps {
  CUtensorMap q, d_o, k, v;
};
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

// ---- deterministic dQ ---------------------------------------------------------------------------
// AttnArgs::deterministic: dQ without atomics. One CTA per (query tile of 128 rows, q head) on the
// forward's work list walks the key tiles up to the diagonal as the forward does, recomputing
// S = Q K^T and dP = dO V^T (P from the saved lse: no online softmax), dS = P (dP - Dsum), and
// accumulates dQ = dS K in registers over the key tiles in order: the same bits on every run. Two
// GEMMs per tile pair more than the atomic path (which attn_bwd_kernel<D, false> then skips).
// 8 warps x 16 query rows; key tiles of 32 at D = 256 (the dQ accumulator is D / 2 floats per
// thread, S and dP 2 x BN / 2 more), 64 below. K and V double buffered.
template <int D>
struct DqTraits {
  static constexpr int kBlockM = attn_tile(D).fwd_m;  // the forward's tile: its work list serves
  static constexpr int kBlockN = D > 128 ? 32 : 64;
  static constexpr size_t kSmemBytes = sizeof(bf16) * static_cast<size_t>((2 * kBlockM + 4 * kBlockN) * D);
  static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
  static_assert(kBlockN % 16 == 0 && D % 64 == 0, "tiles must be multiples of the mma / swizzle shape");
  static_assert(kSmemBytes <= 227 * 1024, "dQ kernel smem over the sm_90 per-block limit");
};

struct DqParams {
  bf16* dq;            // [T, Hq, D], scale applied
  float* lse2;         // [Hq, T] lse * log2(e): read, or written by the TMA kernel (its own preprocess)
  float* dsum;         // [Hq, T] rowsum(dO * O): the same
  const float* lse;    // [Hq, T] the forward's (the TMA kernel's preprocess)
  const bf16* o;       // [T, Hq, D] the forward's (the same)
  const bf16 *d_o, *q, *k, *v;
  const int32_t* cu;
  const int2* tiles;   // the forward's work list: slot -> (sample, query tile), sample -1 past the last
  int total, hq, hkv;
  float scale;
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_dq_kernel(const DqParams p) {
  using Tr = DqTraits<D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  constexpr uint32_t kKvBytes = 2u * BN * D;  // one K or V buffer
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdO = sQ + BM * D;
  bf16* sK = sdO + BM * D;  // 2 buffers
  bf16* sV = sK + 2 * BN * D;  // 2 buffers

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const QueryTile t = query_tile(p, work, BM, D, blockIdx.x);
  const int start = t.start, L = t.L, m0 = t.m0, h = t.h, kvh = t.kvh;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const bf16* gK = p.k + start * ldk + kvh * D;
  const bf16* gV = p.v + start * ldk + kvh * D;
  const int n_tiles = (min(m0 + BM, L) + BN - 1) / BN;

  load_tile<BM, D>(sQ, p.q + (start + m0) * ldq + h * D, ldq, min(BM, L - m0), tid);
  load_tile<BM, D>(sdO, p.d_o + (start + m0) * ldq + h * D, ldq, min(BM, L - m0), tid);
  load_tile<BN, D>(sK, gK, ldk, min(BN, L), tid);
  load_tile<BN, D>(sV, gV, ldk, min(BN, L), tid);
  cp_async_commit();

  const int wrow0 = m0 + warp * 16;  // sample-local index of this warp's first row
  float lse2[2], dsum[2];            // of rows wrow0 + g and + 8
  load_row_stats(p, t.h, t.start, t.L, wrow0 + g, lse2, dsum);
  const float scale_log2 = p.scale * kLog2e;
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  const LaneSwz x3 = lane_swz<kRowBit3>(lane), x4 = lane_swz<kRowBit4>(lane);
  const uint32_t q_a = lane_row<D, kRowBit3>(smem_u32(sQ), lane) + 2 * D * warp * 16;    // A: this warp's rows
  const uint32_t do_a = lane_row<D, kRowBit3>(smem_u32(sdO), lane) + 2 * D * warp * 16;  // A of dO V^T
  const uint32_t k_b = lane_row<D, kRowBit4>(smem_u32(sK), lane);   // B of Q K^T
  const uint32_t v_b = lane_row<D, kRowBit4>(smem_u32(sV), lane);   // B of dO V^T
  const uint32_t k_bt = lane_row<D, kRowBit3>(smem_u32(sK), lane);  // B of dS K (.trans)

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * BN;
    const uint32_t buf = static_cast<uint32_t>(j & 1) * kKvBytes;
    if (j + 1 < n_tiles) {  // the other buffers were released by the barrier ending tile j - 1
      const int nb0 = n0 + BN, nbuf = ((j + 1) & 1) * BN * D;
      load_tile<BN, D>(sK + nbuf, gK + nb0 * ldk, ldk, min(BN, L - nb0), tid);
      load_tile<BN, D>(sV + nbuf, gV + nb0 * ldk, ldk, min(BN, L - nb0), tid);
    }
    cp_async_commit();
    cp_async_wait<1>();  // tile j (and Q, dO) have landed
    __syncthreads();

    if (n0 <= wrow0 + 15) {  // the warp has at least one unmasked column here
      float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4], b[4];
        ldsm_x4(a, blk<D>(q_a, x3, 0, kk));
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          ldsm_x4(b, blk<D>(k_b + buf, x4, nb * 16, kk));
          mma_bf16(s[2 * nb], a, b[0], b[1]);
          mma_bf16(s[2 * nb + 1], a, b[2], b[3]);
        }
        ldsm_x4(a, blk<D>(do_a, x3, 0, kk));
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          ldsm_x4(b, blk<D>(v_b + buf, x4, nb * 16, kk));
          mma_bf16(dp[2 * nb], a, b[0], b[1]);
          mma_bf16(dp[2 * nb + 1], a, b[2], b[3]);
        }
      }
      // dS = P (dP - Dsum) in place of S; P = 0 above the diagonal and past the sample.
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, col = n0 + nb * 8 + 2 * t4 + (e & 1), row = wrow0 + g + 8 * r;
          float pe = dev::ex2_ftz(fmaf(s[nb][e], scale_log2, -lse2[r]));
          if (col > row || col >= L) pe = 0.f;
          s[nb][e] = pe * (dp[nb][e] - dsum[r]);
        }
      uint32_t da[BN / 16][4];  // dS as bf16 A fragments
      pack_p<BN>(da, s);
      // dQ += dS K_j: B = K_j stored [key][d], read with .trans.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
          uint32_t b[4];
          ldsm_x4_t(b, blk<D>(k_bt + buf, x3, kk * 16, db));
          mma_bf16(acc[2 * db], da[kk], b[0], b[1]);
          mma_bf16(acc[2 * db + 1], da[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with tile j's buffers before tile j + 2 refills them
  }

  // Epilogue: dq = bf16(scale dQ).
  const float scale2[2] = {p.scale, p.scale};
  store_warp_rows<D>(p.dq + (start + wrow0) * ldq + h * D, ldq, sQ, acc, scale2, L - wrow0, warp, lane);
}

// ---- deterministic dQ on wgmma (D = 256) ---------------------------------------------------------
// The forward's structure with S, dP and dQ for P V: one CTA per (query tile of 128 rows, q head)
// on the forward's work list walks the key tiles (64) up to the diagonal in order, so dQ is the
// same on every run. Warpgroup w owns query rows 64 w .. 64 w + 63 and, per key tile, runs S = Q K^T
// and dP = dO V^T (16 m64n64k16 each, operands K-major from smem), forms dS = P (dP - Dsum) in
// registers (P from the saved lse) and accumulates dQ += dS K as 4 m64n256k16 with dS as the
// register A operand and K N-major, like the forward's P V. No warpgroup-dependent branch around a
// wgmma (C7518), so warpgroup 0 also runs the last key tile of a diagonal CTA, fully masked. K is
// double-buffered; V has one buffer (the smem limit), refilled once both warpgroups' dP is done.
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

// Epilogue of the wgmma dQ kernels: dq = bf16(scale dQ), rows past the sample end skipped.
__device__ __forceinline__ void store_dq_rows(const DqParams& p, const QueryTile& t, const float (&acc)[kWgD / 8][4],
                                              int wrow0, int g, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow0 + g + 8 * r;
    if (row >= t.L) continue;
    store_row_pairs(p.dq + (t.start + row) * t.ldq + t.h * kWgD, acc, r, p.scale, t4);
  }
}

__global__ void __launch_bounds__(kThreads, 1) attn_bwd_dq_wgmma_kernel(const DqParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = smem_u32(smem_raw);
  char* sQ = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sdO = sQ + kWgBM * kWgD * 2;
  char* sK = sdO + kWgBM * kWgD * 2;  // 2 buffers
  char* sV = sK + 2 * kWgTileBytes;

  const int2 work = p.tiles[blockIdx.y];
  if (work.x < 0) return;
  const QueryTile t = query_tile(p, work, kWgBM, kWgD, blockIdx.x);
  const int start = t.start, L = t.L, m0 = t.m0, h = t.h, kvh = t.kvh;
  const int64_t ldq = t.ldq, ldk = t.ldk;
  const int tid = threadIdx.x, wg_i = tid >> 7, wt = tid & 127, wq = wt >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const bf16* gK = p.k + start * ldk + kvh * kWgD;
  const bf16* gV = p.v + start * ldk + kvh * kWgD;
  const int n_tiles = (min(m0 + kWgBM, L) + kWgBN - 1) / kWgBN;

  load_panels<kWgBM>(sQ, p.q + (start + m0) * ldq + h * kWgD, ldq, min(kWgBM, L - m0), tid);
  load_panels<kWgBM>(sdO, p.d_o + (start + m0) * ldq + h * kWgD, ldq, min(kWgBM, L - m0), tid);
  load_panels<kWgBN>(sK, gK, ldk, min(kWgBN, L), tid);
  load_panels<kWgBN>(sV, gV, ldk, min(kWgBN, L), tid);
  cp_async_commit();

  const int wrow0 = m0 + 64 * wg_i + 16 * wq;  // sample-local first row of this warp
  float lse2[2], dsum[2];                      // of rows wrow0 + g and + 8
  load_row_stats(p, t.h, t.start, t.L, wrow0 + g, lse2, dsum);
  const float scale_log2 = p.scale * kLog2e;
  float acc[kWgD / 8][4];  // the m64n256 dQ accumulator, as [8-column block][fragment element]
#pragma unroll
  for (int i = 0; i < kWgD / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float(&acc_flat)[kWgD / 2] = reinterpret_cast<float(&)[kWgD / 2]>(acc);

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kWgBN;
    const char* kb = sK + (j & 1) * kWgTileBytes;
    // K_j and V_j have landed; every warpgroup is past iteration j - 1, so K's other buffer is free.
    cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
    if (j + 1 < n_tiles)
      load_panels<kWgBN>(sK + ((j + 1) & 1) * kWgTileBytes, gK + (n0 + kWgBN) * ldk, ldk, min(kWgBN, L - n0 - kWgBN),
                         tid);
    cp_async_commit();

    float s[kWgBN / 8][4], dp[kWgBN / 8][4];
    float(&s_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(s);
    float(&dp_flat)[kWgBN / 2] = reinterpret_cast<float(&)[kWgBN / 2]>(dp);
    wg_issue_abt(s_flat, sQ + 64 * wg_i * 128, kWgBM * 128, kb);
    wg_issue_abt(dp_flat, sdO + 64 * wg_i * 128, kWgBM * 128, sV);
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < kWgBN / 2; ++i) {
      wg::fence_operand(s_flat[i]);
      wg::fence_operand(dp_flat[i]);
    }
    __syncthreads();  // both warpgroups are done with V_j
    if (j + 1 < n_tiles) load_panels<kWgBN>(sV, gV + (n0 + kWgBN) * ldk, ldk, min(kWgBN, L - n0 - kWgBN), tid);
    cp_async_commit();

    uint32_t da[kWgBN / 16][4];
    dq_ds_tile(da, s, dp, n0, wrow0, g, t4, L, lse2, dsum, scale_log2);
    wg_issue_pv(acc_flat, da, kb);  // dQ += dS K_j
    wg::wait<0>();
    wg::fence_operands(acc_flat);
  }

  store_dq_rows(p, t, acc, wrow0, g, t4);
}

// ---- deterministic dQ on wgmma, warp-specialized (the default at D = 256) ------------------------
// attn_bwd_dq_wgmma_kernel's products in the same order (bit-identical dQ), in the TMA forward's
// roles: a producer warpgroup loads Q and dO once and the key tiles by TMA (K on a two-stage ring,
// V in one stage: the smem holds no more), the consumer warpgroups (rows 0-63 / 64-127) wait on
// full barriers and release each tile on its empty barrier, V once dP is done, K once dQ += dS K is.
// A key tile reaching past the sample end holds the next sample's rows: both warpgroups zero its K
// and V rows from L on (K feeds dQ, where 0 * NaN would leak) and dS is set to exactly 0 there.
// It does the preprocess of its rows itself (Dsum, lse2) under its first key tile's products, so
// it runs before the dK / dV kernel and the backward has no attn_bwd_pre_kernel launch.
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

// ---- work list ---------------------------------------------------------------------------------
// table[slot] = (sample, tile) for every tile of every sample, sorted by cost, heaviest first
// (counting sort over a clamped cost key; order within a key is arbitrary and harmless, since
// every tile's result is independent of when it runs); slots past the tile count get sample -1.
// One block: each thread owns a run of samples.
constexpr int kTableThreads = 1024, kCostKeys = 2048;
__global__ void __launch_bounds__(kTableThreads) attn_tile_table_kernel(int2* table, const int32_t* cu, int num_seqs,
                                                                        int tile, int slots, int backward) {
  __shared__ int count[kCostKeys];
  __shared__ int scan[kTableThreads];
  const int tid = threadIdx.x;
  for (int k = tid; k < kCostKeys; k += kTableThreads) count[k] = 0;
  __syncthreads();
  const int per = (num_seqs + kTableThreads - 1) / kTableThreads;
  const int s0 = min(num_seqs, tid * per), s1 = min(num_seqs, s0 + per);
  auto key_of = [&](int i, int n) { return min(kCostKeys - 1, backward ? n - i : i + 1); };
  for (int s = s0; s < s1; ++s) {
    const int n = (cu[s + 1] - cu[s] + tile - 1) / tile;
    for (int i = 0; i < n; ++i) atomicAdd(&count[key_of(i, n)], 1);
  }
  __syncthreads();
  // Exclusive offsets in descending key order: thread t sums keys [hi_t - 1 .. lo_t] (its band).
  constexpr int kPer = kCostKeys / kTableThreads;
  int band = 0;
  for (int j = 0; j < kPer; ++j) band += count[kCostKeys - 1 - (tid * kPer + j)];
  scan[tid] = band;
  dev::block_inclusive_scan(scan);
  const int total = scan[kTableThreads - 1];
  int run = scan[tid] - band;
  __syncthreads();  // every thread has read its band's counts: turn them into offsets
  for (int j = 0; j < kPer; ++j) {
    const int k = kCostKeys - 1 - (tid * kPer + j);
    const int c = count[k];
    count[k] = run;
    run += c;
  }
  __syncthreads();
  for (int s = s0; s < s1; ++s) {
    const int n = (cu[s + 1] - cu[s] + tile - 1) / tile;
    for (int i = 0; i < n; ++i) table[atomicAdd(&count[key_of(i, n)], 1)] = make_int2(s, i);
  }
  for (int i = total + tid; i < slots; i += kTableThreads) table[i] = make_int2(-1, 0);
}

// ---- launch helpers -----------------------------------------------------------------------------

// Workspace layout (bytes, 256-aligned pieces): tile table | dsum [Hq*T] f32 | lse2 [Hq*T] f32 |
// dq_acc [T*Hq*D] f32 | (splits > 1) splits x (dK, dV) f32 [T*Hkv*D] slices. The forward uses only
// the table.
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// CTAs per (kv head, key tile) in the backward. One CTA runs all group query heads over its key
// tile, so with few kv heads the grid is about one wave and the long samples' first key tiles
// (each group x n query tiles) set the time. Halving the group per CTA halves that critical path;
// the price is the f32 dK / dV slices and their sum. Only when the grid would otherwise fill at most
// two waves (2B: 2 kv heads x 128 key tiles on 132 SMs), never for 27B-like head counts.
int bwd_splits(const AttnArgs& a) {
  const int sms = sm_count();
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t ctas = static_cast<int64_t>(a.num_kv_heads) * ((a.total_tokens + 63) / 64);
  return group >= 4 && group % 2 == 0 && ctas <= 2 * sms ? 2 : 1;
}
size_t ws_dkv_bytes(const AttnArgs& a) {
  const int s = bwd_splits(a);
  return s == 1 ? 0
                : align256(sizeof(float) * 2 * s * static_cast<size_t>(a.total_tokens) *
                           static_cast<size_t>(a.num_kv_heads) * static_cast<size_t>(a.head_dim));
}
size_t ws_rows_bytes(const AttnArgs& a) {
  return align256(sizeof(float) * static_cast<size_t>(a.num_q_heads) * static_cast<size_t>(a.total_tokens));
}
size_t ws_dq_bytes(const AttnArgs& a) {
  return align256(sizeof(float) * static_cast<size_t>(a.total_tokens) * static_cast<size_t>(a.num_q_heads) *
                  static_cast<size_t>(a.head_dim));
}
// Work slots for a tile size: sum ceil(len / tile) <= T / tile + num_seqs.
int tile_slots(const AttnArgs& a, int tile) { return a.total_tokens / tile + a.num_seqs; }
size_t ws_table_bytes(const AttnArgs& a) { return align256(sizeof(int2) * static_cast<size_t>(tile_slots(a, 64) + 1)); }

const int2* build_tile_table(void* workspace, const AttnArgs& a, int tile, bool backward, cudaStream_t stream) {
  int2* table = static_cast<int2*>(workspace);
  attn_tile_table_kernel<<<1, kTableThreads, 0, stream>>>(table, a.cu_seqlens, a.num_seqs, tile, tile_slots(a, tile),
                                                          backward ? 1 : 0);
  QT_LAUNCH_CHECK("attn_tile_table_kernel");
  return table;
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), or null when
// the driver lacks it: the forward then keeps the cp.async kernel.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();  // a failed lookup must not surface at the next launch check
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// TMA map of a row-major bf16 [rows, cols] tensor read in boxes of 64 columns x box_rows rows into
// 128-byte-swizzle panels (wgmma's layout); reads past `rows` return zeros.
CUtensorMap panel_map(const void* base, int64_t rows, int64_t cols, int box_rows, const char* name) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                          strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QT_CHECK(r == CUDA_SUCCESS, "attention forward: cuTensorMapEncodeTiled failed for ", name, " (", rows, " x ", cols,
           " bf16 at ", base, "; error ", static_cast<int>(r), ")");
  return m;
}

// The backward TMA kernels' maps at head dim 256: q and dO in boxes of q_rows rows, k and v of
// kWgBN.
BwdMaps bwd_maps(const void* q, const void* d_o, const void* k, const void* v, const AttnArgs& a, int q_rows) {
  const int64_t T = a.total_tokens, qcols = int64_t(a.num_q_heads) * kWgD, kcols = int64_t(a.num_kv_heads) * kWgD;
  return BwdMaps{panel_map(q, T, qcols, q_rows, "q"), panel_map(d_o, T, qcols, q_rows, "d_o"),
                 panel_map(k, T, kcols, kWgBN, "k"), panel_map(v, T, kcols, kWgBN, "v")};
}

// True unless the environment variable is "0" (the A/B switches below; each read once).
bool env_not_zero(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}
// QT_ATTN_TMA=0 keeps the cp.async wgmma kernels (A/B runs).
bool tma_enabled() {
  static const bool on = env_not_zero("QT_ATTN_TMA");
  return on && tensor_map_encoder() != nullptr;
}
// QT_ATTN_DKV_TMA=0 keeps only the dK / dV kernel on cp.async (A/B of that kernel alone).
bool dkv_tma_enabled() {
  static const bool on = env_not_zero("QT_ATTN_DKV_TMA");
  return on && tma_enabled();
}

template <int D>
void launch_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                    void* workspace, cudaStream_t stream) {
  using Tr = FwdTraits<D>;
  static_assert(Tr::kBlockM >= 64, "the work-list workspace is sized for tiles of at least 64 rows");
  const int2* tiles = build_tile_table(workspace, a, Tr::kBlockM, false, stream);
  FwdParams p{static_cast<bf16*>(o), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
              static_cast<const bf16*>(v), a.cu_seqlens, tiles, a.total_tokens, a.num_q_heads, a.num_kv_heads,
              a.scale};
  const dim3 grid(a.num_q_heads, tile_slots(a, Tr::kBlockM));
  if constexpr (D == kWgD) {
    if (!a.mma_sync) {
      static_assert(Tr::kBlockM == kWgBM, "the wgmma forward uses the same work list tile");
      if (!a.cp_async && tma_enabled()) {
        const int64_t T = a.total_tokens;
        const FwdMaps maps{panel_map(q, T, int64_t(a.num_q_heads) * D, kWgBM, "q"),
                           panel_map(k, T, int64_t(a.num_kv_heads) * D, kWgBN, "k"),
                           panel_map(v, T, int64_t(a.num_kv_heads) * D, kWgBN, "v")};
        // Persistent: one CTA per SM (the smem allows no second), each walking its share of the
        // (slot, head) items; the grid still depends only on T and the sample bound.
        const int slots = tile_slots(a, kWgBM);
        const int ctas = static_cast<int>(std::min<int64_t>(sm_count(), int64_t(slots) * a.num_q_heads));
        launch_smem(attn_fwd_tma_wgmma_kernel, "attn_fwd_tma_wgmma_kernel", ctas, kWsThreads, kWsSmem, stream, p, maps,
                    slots);
        return;
      }
      launch_smem(attn_fwd_wgmma_kernel, "attn_fwd_wgmma_kernel", grid, kThreads, kWgSmem, stream, p);
      return;
    }
  }
  launch_smem(attn_fwd_kernel<D>, "attn_fwd_kernel", grid, kThreads, Tr::kSmemBytes, stream, p);
}

template <int D>
void launch_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                     const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream) {
  using Tr = BwdTraits<D>;
  char* ws = static_cast<char*>(workspace) + ws_table_bytes(a);
  float* dsum = reinterpret_cast<float*>(ws);
  float* lse2 = reinterpret_cast<float*>(ws + ws_rows_bytes(a));
  float* dq_acc = reinterpret_cast<float*>(ws + 2 * ws_rows_bytes(a));
  float* dkv_part = reinterpret_cast<float*>(ws + 2 * ws_rows_bytes(a) + ws_dq_bytes(a));
  const int splits = bwd_splits(a);
  const int64_t rows = static_cast<int64_t>(a.total_tokens) * a.num_q_heads;
  if (rows == 0) return;
  // At head dim 256 the wgmma kernels serve both modes: their dQ has no atomics and is faster than
  // the atomic mma.sync path, so `deterministic` only matters with mma_sync or other head dims.
  bool wgmma_bwd = false;
  if constexpr (D == kWgD) wgmma_bwd = !a.mma_sync;
  const bool dq_kernel = a.deterministic || wgmma_bwd;
  const bool dq_tma = wgmma_bwd && !a.cp_async && tma_enabled();
  // dK / dV over the backward's work list (key tiles), then the split CTAs' sum.
  auto run_dkv = [&] {
    static_assert(Tr::kBlockN >= 64, "the work-list workspace is sized for tiles of at least 64 rows");
    const int2* tiles = build_tile_table(workspace, a, Tr::kBlockN, true, stream);
    BwdParams p{static_cast<bf16*>(dk), static_cast<bf16*>(dv), dkv_part, dq_acc, lse2, dsum,
                static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                static_cast<const bf16*>(v), a.cu_seqlens, tiles, a.total_tokens, a.num_q_heads, a.num_kv_heads,
                splits, a.scale};
    const dim3 grid(a.num_kv_heads * splits, tile_slots(a, Tr::kBlockN));
    if (wgmma_bwd && !a.cp_async && dkv_tma_enabled()) {
      static_assert(Tr::kBlockN == 64, "the wgmma dK / dV kernels use the same key tiles");
      const BwdMaps maps = bwd_maps(q, d_o, k, v, a, 64);
      launch_smem(attn_bwd_dkv_tma_wgmma_kernel, "attn_bwd_dkv_tma_wgmma_kernel", grid, kWsThreads, kDkvTmaSmem,
                  stream, p, maps);
    } else if (wgmma_bwd) {
      launch_smem(attn_bwd_dkv_wgmma_kernel, "attn_bwd_dkv_wgmma_kernel", grid, kThreads, kWgBwdSmem, stream, p);
    } else {
      auto bwd_kernel = a.deterministic ? attn_bwd_kernel<D, false> : attn_bwd_kernel<D, true>;
      launch_smem(bwd_kernel, "attn_bwd_kernel", grid, kThreads, Tr::kSmemBytes, stream, p);
    }
    if (splits > 1) {
      const int64_t n4 = static_cast<int64_t>(a.total_tokens) * a.num_kv_heads * D / 4;
      attn_bwd_dkv_sum_kernel<<<static_cast<unsigned>((2 * n4 + 255) / 256), 256, 0, stream>>>(
          static_cast<bf16*>(dk), static_cast<bf16*>(dv), dkv_part, n4, splits);
      QT_LAUNCH_CHECK("attn_bwd_dkv_sum_kernel");
    }
  };
  // dQ by its own kernel over the forward's work list (query tiles of DqTraits::kBlockM); the
  // tables share the workspace, each built once the kernel before has read its own (same stream).
  auto run_dq = [&] {
    using Dq = DqTraits<D>;
    static_assert(Dq::kBlockM == kWgBM, "both dQ kernels use the forward's work list");
    const int2* qtiles = build_tile_table(workspace, a, Dq::kBlockM, false, stream);
    const DqParams dp{static_cast<bf16*>(dq), lse2, dsum, lse, static_cast<const bf16*>(o),
                      static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                      static_cast<const bf16*>(v), a.cu_seqlens, qtiles, a.total_tokens, a.num_q_heads,
                      a.num_kv_heads, a.scale};
    const dim3 dq_grid(a.num_q_heads, tile_slots(a, Dq::kBlockM));
    if (dq_tma) {
      const BwdMaps maps = bwd_maps(q, d_o, k, v, a, kWgBM);
      launch_smem(attn_bwd_dq_tma_wgmma_kernel, "attn_bwd_dq_tma_wgmma_kernel", dq_grid, kWsThreads, kDqTmaSmem,
                  stream, dp, maps);
    } else if (wgmma_bwd) {
      launch_smem(attn_bwd_dq_wgmma_kernel, "attn_bwd_dq_wgmma_kernel", dq_grid, kThreads, kWgDqSmem, stream, dp);
    } else {
      launch_smem(attn_bwd_dq_kernel<D>, "attn_bwd_dq_kernel", dq_grid, kThreads, Dq::kSmemBytes, stream, dp);
    }
  };
  if (dq_tma) {  // the TMA dQ kernel writes Dsum and lse2 for the dK / dV kernel: no preprocess
    run_dq();
    run_dkv();
    return;
  }
  attn_bwd_pre_kernel<D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
      dsum, lse2, dq_kernel ? nullptr : dq_acc, static_cast<const bf16*>(d_o), static_cast<const bf16*>(o), lse,
      a.total_tokens, a.num_q_heads);
  QT_LAUNCH_CHECK("attn_bwd_pre_kernel");
  run_dkv();
  if (dq_kernel) {
    run_dq();
    return;
  }
  const int64_t n8 = rows * D / 8;
  attn_bwd_post_kernel<<<static_cast<unsigned>((n8 + 255) / 256), 256, 0, stream>>>(static_cast<bf16*>(dq), dq_acc,
                                                                                    n8, a.scale);
  QT_LAUNCH_CHECK("attn_bwd_post_kernel");
}

[[noreturn]] void bad_head_dim(int d) { QT_FAIL("attention: head_dim ", d, " is not supported (64, 128 or 256)"); }

}  // namespace

size_t attention_workspace_bytes(const AttnArgs& a) {
  return ws_table_bytes(a) + 2 * ws_rows_bytes(a) + ws_dq_bytes(a) + ws_dkv_bytes(a);
}

void attention_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                       void* workspace, cudaStream_t stream) {
  if (a.total_tokens == 0 || a.num_seqs == 0 || a.max_seqlen == 0) return;
  switch (a.head_dim) {
    case 64: return launch_forward<64>(o, lse, q, k, v, a, workspace, stream);
    case 128: return launch_forward<128>(o, lse, q, k, v, a, workspace, stream);
    case 256: return launch_forward<256>(o, lse, q, k, v, a, workspace, stream);
    default: bad_head_dim(a.head_dim);
  }
}

void attention_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                        const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream) {
  if (a.total_tokens == 0 || a.num_seqs == 0 || a.max_seqlen == 0) return;
  switch (a.head_dim) {
    case 64: return launch_backward<64>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    case 128: return launch_backward<128>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    case 256: return launch_backward<256>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    default: bad_head_dim(a.head_dim);
  }
}

}  // namespace qt::cuda
