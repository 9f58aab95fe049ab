// Device helpers every attention kernel file shares (attention/*.cu): shared-memory addresses, the
// forward's score-tile pieces (masking, online softmax, P as A fragments; also the dQ kernels') and
// the work-list decode of a CTA's query or key tile. Each file's kernels and helpers live in an
// anonymous namespace, as this header's do.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/warp_mma.cuh"

namespace qt::cuda::attn {
namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

using warp_mma::pack_bf16;  // two floats -> bf16x2, the first in the low half
using dev::kLog2e;

// ---- score-tile pieces of the forward (pack_p also serves the dQ kernels) ------------------------
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

}  // namespace
}  // namespace qt::cuda::attn
