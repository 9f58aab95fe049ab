// The attention kernels on mma.sync m16n8k16 (bf16 -> fp32) for every head dim: the path of D = 64
// and 128, and of D = 256 with AttnArgs::mma_sync or a driver without TMA map encoding
// (docs/attention_kernels.md section 4). Tensor cores fed by ldmatrix from XOR-swizzled shared
// memory, cp.async loads by every thread with zero-fill past a sample's end; 8 warps.
//
// Forward (attn_fwd_kernel): one CTA per (query tile, sample, query head); 8 warps, 16 query rows
//   each; online softmax in base 2 over key tiles [0, diagonal]; K and V tiles use separate
//   buffers so V_j loads while S = Q K_j^T runs and K_{j+1} loads while P V_j runs (FA2 scheme).
//   Saves lse = m + log(l) (natural log, f32 [Hq, T]).
// Backward, after attn_bwd_pre_kernel (bwd_prepost.cu: Dsum, lse2, the dQ accumulator zeroed):
//   attn_bwd_kernel:      one CTA per (key tile, sample, kv head), or 2 splitting the query-head
//                         group when the grid is small (bwd_splits); K, V tile resident in smem; it
//                         loops over its query heads and the query tiles from the diagonal to the
//                         sample's end, accumulating dK and dV in registers (the GQA reduction is
//                         inside the CTA, or over the 2 CTAs' f32 slices in split order: deterministic,
//                         no dK/dV atomics). dQ: with AttnArgs::deterministic (the backend's
//                         default) attn_bwd_dq_kernel computes it per query tile over the key
//                         tiles in order (7 GEMMs per tile pair instead of 5, bitwise
//                         reproducible); otherwise the dS K partials go to an fp32 accumulator
//                         with atomics (faster at 2B, not bitwise reproducible) that
//                         attn_bwd_post_kernel turns into dq.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/attention/common.cuh"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/warp_mma.cuh"

namespace qt::cuda::attn {
namespace {

// ---- PTX helpers ----------------------------------------------------------------------------------

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

using warp_mma::mma_bf16;  // c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col)

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

// softmax_scores, then O's rows rescaled (the step of the mma.sync forward).
template <int BN, int D>
__device__ __forceinline__ void softmax_step(float (&s)[BN / 8][4], float (&acc_o)[D / 8][4], float (&row_max)[2],
                                             float (&row_sum)[2], float scale_log2) {
  float alpha[2];
  softmax_scores<BN>(s, row_max, row_sum, alpha, scale_log2);
  rescale_rows<D>(acc_o, alpha);
}

// ---- forward ------------------------------------------------------------------------------------

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

// ---- backward -----------------------------------------------------------------------------------

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

// ---- deterministic dQ ---------------------------------------------------------------------------
// AttnArgs::deterministic: dQ without atomics. One CTA per (query tile of 128 rows, q head) on the
// forward's work list walks the key tiles up to the diagonal as the forward does, recomputing
// S = Q K^T and dP = dO V^T (P from the saved lse: no online softmax), dS = P (dP - Dsum), and
// accumulates dQ = dS K in registers over the key tiles in order: the same bits on every run. Two
// GEMMs per tile pair more than the atomic path (which attn_bwd_kernel<D, false> then skips).
// Tiles: DqTraits (attention_internal.h).
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

}  // namespace

template <int D>
void launch_fwd_mma_sync(dim3 grid, const FwdParams& p, cudaStream_t stream) {
  launch_smem(attn_fwd_kernel<D>, "attn_fwd_kernel", grid, kThreads, FwdTraits<D>::kSmemBytes, stream, p);
}

template <int D>
void launch_bwd_dkv_mma_sync(dim3 grid, bool dq_atomic, const BwdParams& p, cudaStream_t stream) {
  auto bwd_kernel = dq_atomic ? attn_bwd_kernel<D, true> : attn_bwd_kernel<D, false>;
  launch_smem(bwd_kernel, "attn_bwd_kernel", grid, kThreads, BwdTraits<D>::kSmemBytes, stream, p);
}

template <int D>
void launch_bwd_dq_mma_sync(dim3 grid, const DqParams& p, cudaStream_t stream) {
  launch_smem(attn_bwd_dq_kernel<D>, "attn_bwd_dq_kernel", grid, kThreads, DqTraits<D>::kSmemBytes, stream, p);
}

// The head dims attention.cu dispatches to.
template void launch_fwd_mma_sync<64>(dim3, const FwdParams&, cudaStream_t);
template void launch_fwd_mma_sync<128>(dim3, const FwdParams&, cudaStream_t);
template void launch_fwd_mma_sync<256>(dim3, const FwdParams&, cudaStream_t);
template void launch_bwd_dkv_mma_sync<64>(dim3, bool, const BwdParams&, cudaStream_t);
template void launch_bwd_dkv_mma_sync<128>(dim3, bool, const BwdParams&, cudaStream_t);
template void launch_bwd_dkv_mma_sync<256>(dim3, bool, const BwdParams&, cudaStream_t);
template void launch_bwd_dq_mma_sync<64>(dim3, const DqParams&, cudaStream_t);
template void launch_bwd_dq_mma_sync<128>(dim3, const DqParams&, cudaStream_t);
template void launch_bwd_dq_mma_sync<256>(dim3, const DqParams&, cudaStream_t);

}  // namespace qt::cuda::attn
