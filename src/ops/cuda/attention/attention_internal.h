// Internal to src/ops/cuda/attention/: the tile shapes, the kernels' POD parameter structs and the
// host launchers each kernel file defines (attention.cu dispatches to them). Host-visible: no device
// code here (the kernels' shared device helpers are in common.cuh and wgmma_pipeline.cuh).
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/kernels.h"

namespace qt::cuda::attn {

using bf16 = __nv_bfloat16;

// ---- tile configuration -----------------------------------------------------------------------
// The mma.sync kernels' tiles (mma_sync.cu), whose row counts are also the work lists' tiles: one
// constexpr function, as FA3's hopper/tile_size.h. All tiles use 8 warps (256 threads) and 16-row
// warp slices (the m16n8k16 M extent).
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
  static_assert(kBlockM == 64 && kBlockN == 64, "attn_bwd_kernel's warp layouts assume 64 x 64 backward tiles");
  static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
  static_assert(kSmemBytes <= 227 * 1024, "backward smem over the sm_90 per-block limit");
};

// dQ kernel of the mma.sync backward (attn_bwd_dq_kernel, mma_sync.cu): 8 warps x 16 query rows;
// key tiles of 32 at D = 256 (the dQ accumulator is D / 2 floats per thread, S and dP 2 x BN / 2
// more), 64 below. K and V double buffered.
template <int D>
struct DqTraits {
  static constexpr int kBlockM = attn_tile(D).fwd_m;  // the forward's tile: its work list serves
  static constexpr int kBlockN = D > 128 ? 32 : 64;
  static constexpr size_t kSmemBytes = sizeof(bf16) * static_cast<size_t>((2 * kBlockM + 4 * kBlockN) * D);
  static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
  static_assert(kBlockN % 16 == 0 && D % 64 == 0, "tiles must be multiples of the mma / swizzle shape");
  static_assert(kSmemBytes <= 227 * 1024, "dQ kernel smem over the sm_90 per-block limit");
};

// The wgmma kernels' tile at head dim 256 (Qwen3.5's): 128 query rows x 64 keys, the forward's and
// dQ's work-list tile; the dK / dV kernel's key tile is kWgBN as well.
constexpr int kWgD = 256, kWgBM = 128, kWgBN = 64;

// ---- kernel parameters ---------------------------------------------------------------------------

struct FwdParams {
  bf16* o;
  float* lse;
  const bf16 *q, *k, *v;
  const int32_t* cu;
  const int2* tiles;  // slot -> (sample, tile index), sample -1 past the last tile
  int total, hq, hkv;
  float scale;
};

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

// The tensor maps of q, k and v (a __grid_constant__ kernel parameter; CUtensorMap is 128-byte aligned).
struct FwdMaps {
  CUtensorMap q, k, v;
};
// The tensor maps of the backward's TMA kernels (q and dO in boxes of the kernel's query tile).
struct BwdMaps {
  CUtensorMap q, d_o, k, v;
};

// Work slots for a tile size: sum ceil(len / tile) <= T / tile + num_seqs.
inline int tile_slots(const AttnArgs& a, int tile) { return a.total_tokens / tile + a.num_seqs; }

// ---- launchers (each kernel file's; attention.cu picks the kernels and their grids) --------------

// work_list.cu: the (sample, tile) work list of `tile`-row tiles, heaviest first, at the start of
// the workspace.
const int2* build_tile_table(void* workspace, const AttnArgs& a, int tile, bool backward, cudaStream_t stream);

// forward.cu: the persistent warp-specialized forward at head dim 256 over `slots` work slots.
void launch_fwd_wgmma(const FwdParams& p, const FwdMaps& maps, int slots, cudaStream_t stream);
// bwd_dq.cu: the warp-specialized dQ (and the backward's preprocess) at head dim 256.
void launch_bwd_dq_wgmma(dim3 grid, const DqParams& p, const BwdMaps& maps, cudaStream_t stream);
// bwd_dkv.cu: the warp-specialized dK / dV at head dim 256.
void launch_bwd_dkv_wgmma(dim3 grid, const BwdParams& p, const BwdMaps& maps, cudaStream_t stream);

// mma_sync.cu, instantiated for D = 64, 128, 256. dq_atomic: attn_bwd_kernel also adds dQ into
// p.dq_acc by fp32 atomics (the non-deterministic backward).
template <int D>
void launch_fwd_mma_sync(dim3 grid, const FwdParams& p, cudaStream_t stream);
template <int D>
void launch_bwd_dkv_mma_sync(dim3 grid, bool dq_atomic, const BwdParams& p, cudaStream_t stream);
template <int D>
void launch_bwd_dq_mma_sync(dim3 grid, const DqParams& p, cudaStream_t stream);

// bwd_prepost.cu. pre: Dsum, lse2 and (dq_acc non-null) the zeroed dQ accumulator of every
// (token, query head) row; dkv_sum: the split CTAs' f32 dK / dV slices summed to bf16; post:
// dq = bf16(scale dq_acc).
template <int D>
void launch_bwd_pre(float* dsum, float* lse2, float* dq_acc, const bf16* d_o, const bf16* o, const float* lse,
                    int total, int hq, cudaStream_t stream);
void launch_bwd_dkv_sum(bf16* dk, bf16* dv, const float* parts, int64_t n4, int splits, cudaStream_t stream);
void launch_bwd_post(bf16* dq, const float* dq_acc, int64_t n8, float scale, cudaStream_t stream);

}  // namespace qt::cuda::attn
