// Shared by the mma.sync family's two files (mma_sync_scans.cu, mma_sync_chunks.cu): the chunk's
// P = (q^ k^T) e^{G_i - G_j} built from raw rows, the per-chunk row data, the dv column block of the
// scans and whether the reverse scan forms dD_local itself (which decides whether dlocal runs).
#pragma once

#include "ops/cuda/gdn/gdn_common.cuh"

namespace qt::cuda::gdn::mma_sync {

inline constexpr int kLdP = kC + 4;   // P^T in the fused reverse scan: fills the (raw_ld(128) / 2)-float q buffer


// The chunk's entries from a raw-row dot product (q_i . k_j) and the per-row data: P_ij = rq_i rk_j
// (q_i . k_j) e^{G_i - G_j} for j <= i, 0 elsewhere (the mma.sync output and dlocal kernels). The
// wgmma kernels (scans, bwd_chunk) and prep's A form their gates as ex2 of log2-scaled G
// differences with the row and column data hoisted per thread; e^{G_i - G_j} <= 1 either way.
__device__ __forceinline__ float p_entry(float qk, int i, int j, const float* gs, const float* rq, const float* rk) {
  return j <= i ? rq[i] * rk[j] * qk * expf(gs[i] - gs[j]) : 0.f;
}

// Ps[i][j] = (q^_i . k^_j) exp(G_i - G_j) for j <= i, else 0, from the raw bf16 q, k rows (exact
// products, fp32 sums: 1 mma per k step) and their L2 scales rq, rk. Ps may start at Kb (the output
// kernel writes P over k): each warp keeps its two 16 x 16 tiles in registers until every warp has
// read Kb (a barrier), then writes them. kThreads threads, all of them.
__device__ inline void build_p(float* Ps, const bf16* Qb, const bf16* Kb, int ldr, int K, const float* gs, const float* rq,
                        const float* rk) {
  constexpr int kPerWarp = (kC / 16) * (kC / 16) / (kThreads / 32);
  static_assert(kPerWarp == 2, "two 16 x 16 tiles of P per warp");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float acc[kPerWarp][2][4] = {};
#pragma unroll
  for (int u = 0; u < kPerWarp; ++u) {
    const int tile = warp + (kThreads / 32) * u, m0 = (tile / (kC / 16)) * 16, n0 = (tile % (kC / 16)) * 16;
    if (n0 <= m0 + 15) mma_acc(acc[u], m0, n0, 0, K, Ld<false>{Qb, ldr}, Ld<false>{Kb, ldr});
  }
  __syncthreads();  // Kb read by every warp
#pragma unroll
  for (int u = 0; u < kPerWarp; ++u) {
    const int tile = warp + (kThreads / 32) * u, m0 = (tile / (kC / 16)) * 16, n0 = (tile % (kC / 16)) * 16;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = m0 + g + (r >= 2 ? 8 : 0), j = n0 + nt * 8 + 2 * t + (r & 1);
        Ps[i * kLdC + j] = p_entry(acc[u][nt][r], i, j, gs, rq, rk);
      }
  }
}

// Pt[j * kLdP + i] = P_ij = (q^_i . k^_j) exp(G_i - G_j) for i >= j (0 above the diagonal inside
// the diagonal tiles; the tiles above it are not written, the P^T dO product never reads them), from
// the raw q, k rows and their L2 scales (as build_p, transposed so that the product's A operand
// pairs run along i). kNThreads threads, all of them; Pt overlaps neither Qb nor Kb.
template <int kNThreads>
__device__ inline void build_pt(float* Pt, const bf16* Qb, const bf16* Kb, int ldr, int K, const float* gs, const float* rq,
                         const float* rk) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int tile = warp; tile < (kC / 16) * (kC / 16); tile += kNThreads / 32) {
    const int m0 = (tile / (kC / 16)) * 16, n0 = (tile % (kC / 16)) * 16;  // rows i, columns j of P
    if (n0 > m0) continue;
    float acc[2][4] = {};
    mma_acc(acc, m0, n0, 0, K, Ld<false>{Qb, ldr}, Ld<false>{Kb, ldr});
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = m0 + g + (r >= 2 ? 8 : 0), j = n0 + nt * 8 + 2 * t + (r & 1);
        Pt[j * kLdP + i] = p_entry(acc[nt][r], i, j, gs, rq, rk);
      }
  }
}

// Per-chunk row data of the output / dlocal kernels: gs = G (padded rows: G at the last valid row,
// their q, k, dO, D are zero anyway), rq, rk the L2 scales (0 past len). Threads < kC.
__device__ inline void load_rows_gq(float* gs, float* rq, float* rk, const float* Gc, const float* rs, int bos, int len,
                             int Hk, int Hv, int head, int kh) {
  if (threadIdx.x < kC) {
    const int i = threadIdx.x;
    gs[i] = Gc[static_cast<size_t>(bos + min(i, len - 1)) * Hv + head];
    const float2 r = i < len ? reinterpret_cast<const float2*>(rs)[static_cast<size_t>(bos + i) * Hk + kh]
                             : make_float2(0.f, 0.f);
    rq[i] = r.x;
    rk[i] = r.y;
  }
}

// The fused variant (scan_bwd_fused): q and dO double-buffered, no dD_local tile, three more row
// arrays; P^T (fp32, stride kLdP) lives in the idle q buffer. 227,584 bytes at K = bv = 128.
inline int scan_bwd_fused_smem_floats(int K, int bv) {
  return K * bv_ld(bv) + kC * raw_ld(K) + kC * raw_ld(K) / 2 + kC * raw_ld(K) + kC * bv_ld(bv) + kC * bv_ld(bv) +
         5 * kC;
}
// dD_local = P^T dO is formed inside the reverse scan (no gdn_dlocal_kernel, no dD round trip)
// where the smem allows it: one 16-warp CTA per (sample, head) (bv = 128) at dk = 128, where P^T
// fits the spare q buffer.
inline bool scan_bwd_fused(int K, int bv) {
  return bv == 128 && K == 128 && kC * kLdP <= kC * raw_ld(K) / 2 &&
         scan_bwd_fused_smem_floats(K, bv) * sizeof(float) <= 227 * 1024;
}

// dv columns per scan CTA (16, 32 or 128, dividing V): 128 (one 16-warp CTA per (sample, head), W
// and k read once per chunk) when there are at least 32 value heads and dk <= 128 (the state must fit
// the 16 warps and the smem), else 32. Measured on the H200: 128 is 4-5 % faster on the 4B / 27B
// training path (Hv = 32 / 48) but 5 % slower at Hv = 16, where 8 samples x 16 heads leave SMs idle
// at one CTA per SM.
inline int column_block(int K, int V, int num_v_heads) {
  if (num_v_heads >= 32 && K <= 128 && V % 128 == 0) return 128;
  return V % 32 == 0 ? 32 : 16;
}

}  // namespace qt::cuda::gdn::mma_sync
