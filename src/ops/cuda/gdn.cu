// Gated DeltaNet (docs/model_spec.md 3.5 / 4), chunked WY/UT form with C = 64 (docs/gdn_kernels.md).
// Products on bf16 tensor cores (mma m16n8k16, fp32 accumulation; gdn_mma.cuh): q, k, v, dO are
// staged as their raw bf16 rows (exact operands, L2 scales applied per row), every fp32 operand is
// split into bf16 hi + lo (~fp32 products, relative error <= ~3 2^-18), except those that feed only
// a bf16 output, whose own rounding is 2^-9: the plain forward's output products and bwd_chunk's
// Y, Pa, Pb (dq^, dk^ only; the dG / dbeta sums read the fp32 values). The state, gates, cumsums
// and the triangular solve stay fp32; W, D, dD and the scans' smem states are kept as hi / lo planes
// (the values the split makes) so they are read by ldmatrix; the chunk states h, dh are fp32 in the
// mma fragment order (gdn_mma::frag_index), so their writers and readers move whole 512-byte runs.
// The backward at dk = dv = 128 from a recompute (gdn_backward's f16: not from kept chunk states;
// QT_GDN_HILO=1 keeps the above) is fp16 instead: h, D, dh, dD stored as fp16 tiles, each (chunk,
// head) tile times a power of two from its largest magnitude (so gradients far from 1 keep 11 bits),
// and bwd_chunk's products f16 x f16, one per operand pair where hi / lo took two or three (dq, dk,
// dv as before; dg, dbeta ~3e-4 rel RMS against ~5e-5; docs/gdn_kernels.md section 5).
//
// Per chunk of C rows (padded rows: q = k = v = dO = 0, beta = 0, g = 0, which makes them inert and
// keeps G[C-1] equal to G at the last valid row):
//   G_i = cumsum g, Gam_ij = exp(G_i - G_j) (only j <= i is ever exponentiated, so exp <= 1)
//   A = strict_lower(diag(b) K K^T . Gam), T = (I + A)^-1
//   W = T diag(b e^G) K, U = T diag(b) V
//   D = U - W S0                 ("v_new", the per-token delta vectors)
//   O = diag(e^G) Q S0 + (Q K^T . Gam . M_incl) D
//   S_end = e^{G_L} S0 + (diag(e^{G_L - G}) K)^T D
// At dk = dv = 128 (Qwen3.5's; wgmma_scans) D = T Y with Y = diag(b) V - diag(b e^G) K S0: W and U
// are never formed, and the scans run on wgmma with the state in their accumulators.
// Forward:  chunk table -> prep (G, T by a register-tiled block solve, the q / k L2 row scales; one
//           CTA per (chunk, key head)) -> state scan on wgmma (h, D when kept; the output formed
//           in the scan) [-> output kernel beside the scan when h, D are kept and the scan is one
//           wave]. A forward that keeps no state splits a long sample across CTAs (intra-sample
//           split: segments' maps S_end = M S_0 + E in parallel, then each segment from its
//           entering state; planned on the device by the chunk table kernel).
// Backward: the same up to the scan, then the reverse scan on wgmma (dh, full dD, dD_local formed
//           inside) -> per-chunk gradients on wgmma, one persistent kernel (dq^, dk^ per value head,
//           dv, dg, dbeta; T from prep) -> group sum + L2-norm bwd (at one value head per key head
//           the per-chunk kernel applies the L2-norm bwd itself). The wgmma kernels after the
//           forward scan start beside their predecessors (programmatic dependent launch) and wait
//           per (sample, head) for the flags of what they read (signal_done / wait_done). In the
//           scans warpgroup 0 issues each product batch before warpgroup 1 (named barriers).
// Gates: e^{G_i - G_j} (j <= i, so <= 1) by ex2 of log2-scaled G wherever a kernel forms many of
// them (P in the scans, prep's A, bwd_chunk), with the row and column values read once per thread.
// Other head dims: prep also forms W, U; mma.sync scans (h, D), then the output kernel; in the
// backward dD_local = P^T dO by its own kernel unless the mma.sync reverse scan can form it, and
// the mma.sync per-chunk gradient kernel.
// Per-(chunk, head) kernels: 256 threads; row reductions go through fixed-order per-tile partials
// (gdn_mma.cuh's for_tiles*), so every result is deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/gdn_mma.cuh"
#include "ops/cuda/gdn_plan.h"
#include "ops/cuda/gdn_solve.h"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda {
namespace {

using bf16 = __nv_bfloat16;
using gdn_mma::for_tiles;
using gdn_mma::Gk;
using gdn_mma::ld_f2;
using gdn_mma::Ld;
using gdn_mma::Ld2;
using gdn_mma::LdKs;
using gdn_mma::NtT;
using gdn_mma::NtDot;
using gdn_mma::Pair;
using gdn_mma::for_tiles_m2;
using gdn_mma::for_tiles_rc;
using gdn_mma::mma_acc;
using gdn_mma::mma_acc_m;
using gdn_mma::Nt;

constexpr int kC = 64;         // chunk rows
constexpr int kLdC = kC + 8;   // padded stride of C x C tiles: 8 mod 32 words, so the mma gathers' 64-bit
                               // pair loads (rows g, column pairs t) are conflict-free; scalar ones 2-way at worst
constexpr int kLdP = kC + 4;   // P^T in the fused reverse scan: fills the (raw_ld(128) / 2)-float q buffer
constexpr int kThreads = 256;  // per block, every kernel but the chunk table
constexpr float kL2Eps = 1e-6f;

using dev::to_f;
using dev::ex2_ftz;
using dev::kLog2e;
using dev::warp_max;
using dev::warp_sum;

// Bump allocator over dynamic shared memory (floats); the host mirrors each kernel's sequence.
struct Carve {
  float* p;
  __device__ float* take(int n) {
    float* r = p;
    p += n;
    return r;
  }
};

// A warp's lane holding g of rows 2 lane, 2 lane + 1 (0 past the chunk): gs[i] = the inclusive cumsum
// of g over the chunk.
__device__ __forceinline__ void gate_cumsum(float* gs, int lane, float g0, float g1) {
  float incl = g0 + g1;
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  gs[2 * lane] = incl - g1;
  gs[2 * lane + 1] = incl;
}
// gs[i] = inclusive cumsum of g over the chunk (g = 0 past len), bs[i] = beta (0 past len).
// Warp 0 scans, two rows per lane. Caller syncs.
__device__ void load_gates(float* gs, float* bs, const float* g, const float* beta, int bos, int len, int Hv,
                           int head) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, i0 = 2 * lane, i1 = i0 + 1;
    gate_cumsum(gs, lane, i0 < len ? g[static_cast<size_t>(bos + i0) * Hv + head] : 0.f,
                i1 < len ? g[static_cast<size_t>(bos + i1) * Hv + head] : 0.f);
    bs[i0] = i0 < len ? beta[static_cast<size_t>(bos + i0) * Hv + head] : 0.f;
    bs[i1] = i1 < len ? beta[static_cast<size_t>(bos + i1) * Hv + head] : 0.f;
  }
}

// threadIdx.x read by a volatile asm: the persistent kernel's per-item code would otherwise have
// every thread-dependent offset hoisted out of its item loop and kept live (spilled) across it.
__device__ __forceinline__ int tid_x() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
static_assert(kThreads == 256 && kC == 64, "gdn_solve maps 16 x 16 blocks onto 256 threads");
// A 16 x 16 x 16 block product of the solve (gdn_solve::level_product) by one warp on the tensor
// cores: two k steps x two n tiles of mma m16n8k8 tf32, each as lo hi + hi lo + hi hi (~fp32).
__device__ __forceinline__ void block_product_mma(const gdn_solve::BlockProduct& p, int lane) {
  constexpr int ld = kLdC;
  const int g = lane >> 2, t = lane & 3;
  float acc[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) gdn_mma::split_tf32(p.l[(g + 8 * (r & 1)) * ld + 8 * ks + t + 4 * (r >> 1)], ah[r], al[r]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t bh[2], bl[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) gdn_mma::split_tf32(p.r[(8 * ks + t + 4 * r) * ld + 8 * nt + g], bh[r], bl[r]);
      gdn_mma::mma_tf32(acc[nt], al, bh[0], bh[1]);
      gdn_mma::mma_tf32(acc[nt], ah, bl[0], bl[1]);
      gdn_mma::mma_tf32(acc[nt], ah, bh[0], bh[1]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int o = (g + 8 * hh) * ld + 8 * nt + 2 * t;
      float2 v = make_float2(p.sign * acc[nt][2 * hh], p.sign * acc[nt][2 * hh + 1]);
      if (p.s != nullptr) {
        const float2 s = ld_f2(p.s + o);
        v.x += s.x;
        v.y += s.y;
      }
      *reinterpret_cast<float2*>(p.o + o) = v;
    }
}

// Ts = (I + As)^-1 (gdn_solve.h), all kThreads threads; the caller syncs before, ends with a barrier.
// As is clobbered: its strict upper blocks hold B_IK = T_II A_IK between phases, A's blocks (3, 0),
// (3, 1), (2, 0) C_30, C_31, C_20, and (1, 0) T_30's second part. kCombine: that part is added (Ts
// complete on return); else the caller adds it (gdn_solve::t30_part).
template <bool kCombine>
__device__ void solve_unit_lower(float* Ts, float* As, int tid) {
  gdn_solve::diag_phase(tid, Ts, As, kLdC);
  __syncthreads();
#pragma unroll
  for (int p = 1; p < gdn_solve::kPhases; ++p) {
    gdn_solve::BlockProduct bp;
    if (gdn_solve::level_product(p, __shfl_sync(0xffffffffu, tid >> 5, 0), Ts, As, kLdC, bp))
      block_product_mma(bp, tid & 31);
    __syncthreads();
  }
  if constexpr (kCombine) {
    gdn_solve::combine_t30(tid, Ts, As, kLdC);
    __syncthreads();
  }
}

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
__device__ void build_p(float* Ps, const bf16* Qb, const bf16* Kb, int ldr, int K, const float* gs, const float* rq,
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
__device__ void build_pt(float* Pt, const bf16* Qb, const bf16* Kb, int ldr, int K, const float* gs, const float* rq,
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
__device__ void load_rows_gq(float* gs, float* rq, float* rk, const float* Gc, const float* rs, int bos, int len,
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

// Stores the split of (x0, x1) (adjacent columns) into the hi / lo planes at offset o (even): one
// 32-bit word per plane (smem or global).
__device__ __forceinline__ void store_split(bf16* hi, bf16* lo, size_t o, float x0, float x1) {
  uint32_t h, l;
  gdn_mma::split_bf16(x0, x1, h, l);
  *reinterpret_cast<uint32_t*>(hi + o) = h;
  *reinterpret_cast<uint32_t*>(lo + o) = l;
}
// Elementwise product of two pairs (a Gk functor's scaled gather: the products of the scalar form).
__device__ __forceinline__ float2 mul2(float2 a, float2 b) { return make_float2(a.x * b.x, a.y * b.y); }
// (x0, x1) as a bf16 pair at p (4-byte aligned).
__device__ __forceinline__ void store_bf16x2(bf16* p, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(p) = gdn_mma::pack_bf16(x0, x1);
}

// ---- chunk table and the intra-sample split plan ----------------------------------------------
// The scans are serial over a sample's chunks, so one long sample with few heads leaves most SMs
// idle (docs/gdn_kernels.md section 4). The plan splits the longest samples into chunk-aligned segments (virtual
// samples: every table below is over segments) and the forward wgmma scan runs them as items:
//   kItemOut: a sample's first segment from state 0 (every unsplit sample is one); when the sample
//             is split, its leaving state is S_1;
//   kItemE, kItemM: a middle segment's map S_end = M S_0 + E (E from 0, M from I with v = 0);
//   kItemOutFromState: a later segment s from S_s = M_{s-1} S_{s-1} + E_{s-1} (the item forms it
//             first, from its predecessor's S, and publishes it for the next).
// Items are taken by ticket (gdn_scan_fwd_wgmma_kernel), the later segments after every map in
// segment order, so an item waits only on items taken before it: no deadlock at any grid size.
static_assert(gdn_plan::kChunkRows == kC, "the plan counts chunks of the scans' rows");
using gdn_plan::kMinSegChunks;
using gdn_plan::kSplitCand;
using gdn_plan::kSplitTop;
using gdn_plan::seg_chunks;
using gdn_plan::seg_first;
enum ScanItem : int { kItemOut = 0, kItemE = 1, kItemM = 2, kItemOutFromState = 3 };
// The split's states per slot: S entering the segment, its map's M and E; the reverse scan's G (the
// gradient entering the segment) and F (that from a zero leaving gradient) (SplitStates).
enum SplitState : int { kStateS = 0, kStateM = 1, kStateE = 2, kStateG = 3, kStateF = 4, kSplitStateCount = 5 };
enum RevItem : int { kRevOut = 0, kRevF = 1, kRevOutFromGrad = 3 };  // the reverse scan's (gdn_scan_bwd_wgmma_kernel)
struct SplitArgs {
  int* vcu;           // [P + 1] segment boundaries (rows); P = num_seqs + max_slots
  int4* seginfo;      // [P] {sample, index in sample, segments of the sample, state slot (-1: unsplit)}
  int* items;         // [num_seqs + 3 max_slots] item = segment * 4 + ScanItem, in ticket order
  int* items_rev;     // [num_seqs + 2 max_slots] the reverse scan's items (RevItem), in ticket order
  int* counts;        // [0] items, [1] segments, [2], [3] the forward, reverse scans' ticket counters
                      // (zeroed here), [4] items_rev
  int* flags;         // [SplitState][max_slots][Hv] ready flags of the slots (zeroed here)
  gdn_plan::SplitShape shape;  // max_slots: state slots, one per segment of a split sample; 0: never split
};

// table[c] = {bos, len, segment, index in segment} for every chunk, seq_off[p] = first chunk of
// segment p, seq_off[P] = *nchunks; seq_order[r] = the segment of rank r, longest first; rtable =
// the table's entries ordered shortest segment first, with .w = the chunk's index in table
// (nullptr: not built). That is the order in which a single wave of reverse-scan CTAs finishes:
// bwd_chunk's order when it starts beside that scan. Without a split, segment p is sample p.
// One block of 1024 threads, each owning a run of samples (of segments, of ranks).
// The scans are serial over a segment's chunks, so a long one whose CTAs start in the last wave
// sets the tail; they run segments in seq_order (LPT). The order is a counting sort over the
// clamped chunk count; within a count it is arbitrary and harmless, since every CTA's result is
// independent of when it runs.
constexpr int kTableThreads = 1024, kOrderKeys = 1024;
// rtable's .z: the segment, with kRtFirst where the chunk is its sample's first (it enters with state
// 0) and kRtLast where it is its sample's last (it leaves with gradient 0). A split sample's inner
// segment ends carry states: no flag there. The wgmma scans store neither zero state (a sample's
// first h and last dh, ~6 % each of the bench mix's state stores at 27B; more where samples are
// short); every reader of h and dh walks rtable and takes them from chunk_state.
constexpr int kRtFirst = 1 << 30, kRtLast = 1 << 29, kRtSeg = kRtLast - 1;
constexpr int kZeroStateFloats = 128 * 128;  // a dk = dv = 128 state
__device__ float g_zero_state[kZeroStateFloats];  // zero-initialized at module load, never written
// The K x V state of rtable entry ch's chunk for `head` in a chunk-major [chunks, Hv, K, V] buffer
// (h, dh): g_zero_state where ch carries `zero_flag` (kRtFirst for h, kRtLast for dh). Only the wgmma
// scans (dk = dv = 128, which fits the zero block) leave those states unstored; the mma.sync ones
// store them at every size.
// The fp16 backward (gdn_backward's f16 at dk = dv = 128): h, D, dh, dD stored as fp16, each
// (chunk, head) tile times a power of two (scale_of its largest magnitude, kept in [chunk][head]
// [kSclFloats]), and bwd_chunk's products f16 x f16, each result times the inverse scales.
// The power of two s with m s in [0.5, 1); 1 for 0 or a value that is not finite (NaN propagates).
__device__ __forceinline__ float scale_of(float m) {
  if (!(m > 0.f) || !(m < INFINITY)) return 1.f;
  int e;
  frexpf(m, &e);
  return ldexpf(1.f, -max(-100, min(100, e)));
}
// The wgmma scans' tile maxima ride on the step-top __syncthreads instead of a barrier of their own
// (a mid-step CTA barrier broke the two warpgroups' offset: 27B recompute 0.213 -> 0.263 ms with two):
// each warp's largest m goes to slot[warp] before it, and every thread reads the 8 slots after it.
// A quantity's slots are written again only after a later CTA barrier.
__device__ __forceinline__ void publish_max(float m, float* slot) {
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = m;
}
__device__ __forceinline__ float published_scale(const float* slot) {
  float mx = slot[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) mx = fmaxf(mx, slot[i]);
  return scale_of(mx);
}
// The fp16 form's tile scales [chunk][head][kSclFloats]: h, D (the recompute's), dh, dD, dO (the reverse
// scan's), v (the recompute's); bwd_chunk's copy adds dT's (its own). T is converted unscaled (its
// entries are O(1): the diagonal is 1, the rest products of gates <= 1 and beta < 1).
enum : int { kSclH = 0, kSclD, kSclDh, kSclDd, kSclDo, kSclV, kSclDt = 7, kSclFloats = 8 };
__device__ __forceinline__ float absmax_bf16x2(uint32_t x) {
  return fmaxf(fabsf(__uint_as_float(x << 16)), fabsf(__uint_as_float(x & 0xffff0000u)));
}
// E: the stored element (float, or __half in the fp16 backward).
template <class E = float>
__device__ __forceinline__ const E* chunk_state(const float* base, int4 ch, int zero_flag, int Hv, int head, int K,
                                                int V) {
  return (ch.z & zero_flag) && K * V <= kZeroStateFloats
             ? reinterpret_cast<const E*>(g_zero_state)
             : reinterpret_cast<const E*>(base) + (static_cast<size_t>(ch.w) * Hv + head) * K * V;
}
// Programmatic dependent launch (launch_smem_beside): the kernel beside this grid may start once
// every CTA of it has run launch_dependents (or exited). wait_previous_grid: the previous kernel in
// the stream complete and its writes visible (a no-op without programmatic dependence).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__global__ void __launch_bounds__(kTableThreads, 1) gdn_chunk_table_kernel(int4* table, int4* rtable, int* nchunks,
                                                                        int* seq_off, int* seq_order,
                                                                        const int32_t* cu, int num_seqs,
                                                                        SplitArgs sp, int* prep_done,
                                                                        int prep_flags) {
  launch_dependents();  // prep, beside this grid, waits for it to complete before reading anything
  __shared__ int sums[kTableThreads];
  __shared__ int count[kOrderKeys];
  __shared__ int top_n[kSplitTop], top_s[kSplitTop], top_k[kSplitTop], top_seg[kSplitTop];
  __shared__ float cand[kSplitCand + 1];
  __shared__ int plan[3];  // n_top, the other samples' chunks, the longest of them
  const int tid = threadIdx.x, nt = kTableThreads;
  for (int i = tid; i < kSplitStateCount * sp.shape.max_slots * sp.shape.hv; i += nt) sp.flags[i] = 0;
  if (tid >= 2 && tid < 4) sp.counts[tid] = 0;
  if (prep_done != nullptr)
    for (int i = tid; i < prep_flags; i += nt) prep_done[i] = 0;
  if (tid == 0) plan[2] = 0;
  const int per = (num_seqs + nt - 1) / nt;
  const int s0 = min(num_seqs, tid * per), s1 = min(num_seqs, s0 + per);
  static_assert(kOrderKeys == kTableThreads, "one order key per thread");
  auto nchunks_of = [&](int s) { return (cu[s + 1] - cu[s] + kC - 1) / kC; };
  // Key k = kOrderKeys - 1 - min(chunks, kOrderKeys - 1): ascending keys are descending lengths.
  auto key_of = [](int n) { return kOrderKeys - 1 - min(n, kOrderKeys - 1); };
  // Counting sort: count[key] holds counts on entry, each key's first rank on return.
  auto ranks_from_counts = [&]() {
    __syncthreads();  // counts complete, every thread done reading sums[]
    const int mine = count[tid];
    sums[tid] = mine;
    dev::block_inclusive_scan(sums);
    count[tid] = sums[tid] - mine;
    __syncthreads();
  };

  // 1. Chunks per sample, their prefix, the samples longest first.
  count[tid] = 0;
  int local = 0;
  for (int s = s0; s < s1; ++s) local += nchunks_of(s);
  sums[tid] = local;
  dev::block_inclusive_scan(sums);  // starts with a barrier: count[] is zeroed
  const int chunk_base = sums[tid] - local, total = sums[nt - 1];
  for (int s = s0; s < s1; ++s) atomicAdd(&count[key_of(nchunks_of(s))], 1);
  ranks_from_counts();
  // Without a possible split (segment s is sample s) the samples' order is the scans' order;
  // else the samples of the first ranks (longest first) and the chunks of the next one.
  const bool may_split = sp.shape.max_slots >= 3;
  for (int s = s0; s < s1; ++s) {
    const int n = nchunks_of(s), r = atomicAdd(&count[key_of(n)], 1);
    if (!may_split) {
      seq_order[r] = s;
    } else if (r < kSplitTop) {
      top_s[r] = s;
      top_n[r] = n;
    } else if (r == kSplitTop) {
      plan[2] = n;
    }
  }
  __syncthreads();

  // 2. The plan: the cheapest candidate, taken only where it saves a tenth.
  if (tid == 0) {
    const int n_top = may_split ? min(num_seqs, kSplitTop) : 0;
    int top_work = 0;
    for (int r = 0; r < n_top; ++r) {
      top_k[r] = 1;
      top_work += top_n[r];
    }
    plan[0] = n_top;
    plan[1] = total - top_work;
  }
  __syncthreads();
  const int n_top = plan[0];
  if (n_top > 0 && tid <= kSplitCand)
    cand[tid] = gdn_plan::split_cost(tid, top_n, n_top, plan[1], plan[2], sp.shape, nullptr);
  __syncthreads();
  if (tid == 0 && n_top > 0) {
    const int best = gdn_plan::split_pick(cand);
    if (best > 0) gdn_plan::split_cost(best, top_n, n_top, plan[1], plan[2], sp.shape, top_k);
  }
  __syncthreads();
  auto k_of = [&](int s) {
    for (int r = 0; r < n_top; ++r)
      if (top_s[r] == s) return top_k[r];
    return 1;
  };

  // 3. Segments: boundaries, info, the chunk table.
  int nseg = 0, seg_base = s0, num_segs = num_seqs;
  if (may_split) {
    for (int s = s0; s < s1; ++s) nseg += k_of(s);
    sums[tid] = nseg;
    dev::block_inclusive_scan(sums);
    seg_base = sums[tid] - nseg;
    num_segs = sums[nt - 1];
  }
  {
    int p = seg_base, cb = chunk_base;
    for (int s = s0; s < s1; ++s) {
      const int bos = cu[s], len = cu[s + 1] - bos, n = nchunks_of(s), k = k_of(s);
      int slot = -1;
      if (k > 1) {  // slots of the split samples in top order
        slot = 0;
        for (int r = 0; r < n_top && top_s[r] != s; ++r) slot += top_k[r] > 1 ? top_k[r] : 0;
        for (int r = 0; r < n_top; ++r)
          if (top_s[r] == s) top_seg[r] = p;
      }
      for (int i = 0; i < k; ++i, ++p) {
        const int f = seg_first(n, k, i), m = seg_chunks(n, k, i);
        sp.vcu[p] = bos + f * kC;
        seq_off[p] = cb + f;
        if (may_split) sp.seginfo[p] = make_int4(s, i, k, slot < 0 ? -1 : slot + i);
        for (int c = f; c < f + m; ++c) table[cb + c] = make_int4(bos + c * kC, min(kC, len - c * kC), p, c - f);
      }
      cb += n;
    }
  }
  if (tid == nt - 1) {
    *nchunks = total;
    seq_off[num_segs] = total;
    sp.vcu[num_segs] = num_seqs > 0 ? cu[num_seqs] : 0;
    sp.counts[1] = num_segs;
  }
  __syncthreads();  // vcu, seq_off, seginfo, top_seg complete

  // 4. Segments longest first (the scans' LPT order; without a possible split, done in 1).
  const int pper = (num_segs + nt - 1) / nt;
  const int p0 = min(num_segs, tid * pper), p1 = min(num_segs, p0 + pper);
  auto seg_n = [&](int p) { return seq_off[p + 1] - seq_off[p]; };
  if (!may_split) {
    if (tid == 0) sp.counts[0] = sp.counts[4] = 0;  // no items: the ticket scans run only where a split may happen
  } else {
    count[tid] = 0;
    __syncthreads();
    for (int p = p0; p < p1; ++p) atomicAdd(&count[key_of(seg_n(p))], 1);
    ranks_from_counts();
    for (int p = p0; p < p1; ++p) seq_order[atomicAdd(&count[key_of(seg_n(p))], 1)] = p;
    __syncthreads();  // seq_order complete

    // An item list: per_seg(p) items of each segment p in LPT order, placed by a block scan and written
    // by emit(p, q) from slot q on; then tail(q) on thread 0 from the first free slot (the items that
    // wait for others, in the order they may run).
    auto item_list = [&](auto per_seg, auto emit, auto tail) {
      __syncthreads();  // every thread is done reading sums[]
      local = 0;
      for (int r = p0; r < p1; ++r) local += per_seg(seq_order[r]);
      sums[tid] = local;
      dev::block_inclusive_scan(sums);
      int q = sums[tid] - local;
      for (int r = p0; r < p1; ++r) emit(seq_order[r], q);
      if (tid == 0) tail(sums[nt - 1]);
    };
    int kmax = 1;
    for (int r = 0; r < n_top; ++r) kmax = max(kmax, top_k[r]);
    // 5. The forward scan's items: every sample's first segment and every middle segment's two maps
    // in LPT order, then the later segments by index (each after its predecessor).
    auto first_items = [&](int p) {
      const int4 si = sp.seginfo[p];
      return si.y == 0 ? 1 : si.y < si.z - 1 ? 2 : 0;
    };
    item_list(
        first_items,
        [&](int p, int& q) {
          const int e = first_items(p);
          if (e == 1) sp.items[q++] = 4 * p + kItemOut;
          if (e == 2) {
            sp.items[q++] = 4 * p + kItemE;
            sp.items[q++] = 4 * p + kItemM;
          }
        },
        [&](int q) {
          for (int i = 1; i < kmax; ++i)
            for (int r = 0; r < n_top; ++r)
              if (top_k[r] > i) sp.items[q++] = 4 * (top_seg[r] + i) + kItemOutFromState;
          sp.counts[0] = q;
        });

    // 6. The reverse scan's items: every sample's last segment and every middle segment's F in LPT
    // order, then the earlier segments from the last but one down (each after its successor).
    auto rev_items = [&](int p) {
      const int4 si = sp.seginfo[p];
      return si.y == si.z - 1 || (si.y > 0 && si.y < si.z - 1) ? 1 : 0;
    };
    item_list(
        rev_items,
        [&](int p, int& q) {
          if (rev_items(p) == 0) return;
          const int4 si = sp.seginfo[p];
          sp.items_rev[q++] = 4 * p + (si.y == si.z - 1 ? kRevOut : kRevF);
        },
        [&](int q) {
          for (int j = 0; j + 2 <= kmax; ++j)  // segment index k - 2 - j of each split sample
            for (int r = 0; r < n_top; ++r)
              if (top_k[r] > 1 && top_k[r] - 2 - j >= 0)
                sp.items_rev[q++] = 4 * (top_seg[r] + top_k[r] - 2 - j) + kRevOutFromGrad;
          sp.counts[4] = q;
        });
  }
  if (rtable == nullptr) return;  // a forward that keeps nothing for the backward
  __syncthreads();  // thread 0 is done reading sums[]
  // rtable: this thread's ranks p0..p1 - 1 counted from the shortest segment.
  local = 0;
  for (int r = p0; r < p1; ++r) local += seg_n(seq_order[num_segs - 1 - r]);
  sums[tid] = local;
  dev::block_inclusive_scan(sums);
  int base = sums[tid] - local;
  for (int r = p0; r < p1; ++r) {
    const int p = seq_order[num_segs - 1 - r], bos = sp.vcu[p], len = sp.vcu[p + 1] - bos, n = seg_n(p);
    const int4 si = may_split ? sp.seginfo[p] : make_int4(p, 0, 1, -1);
    const int first = si.y == 0 ? kRtFirst : 0, last = si.y == si.z - 1 ? kRtLast : 0;
    for (int c = 0; c < n; ++c)
      rtable[base + c] = make_int4(bos + c * kC, min(kC, len - c * kC),
                                   p | (c == 0 ? first : 0) | (c == n - 1 ? last : 0), seq_off[p] + c);
    base += n;
  }
}

// The scans' 1-D grid: block b runs column block b % cbs of head (b / cbs) % Hv of the sample of
// rank b / (cbs Hv), so every CTA of the longest sample is dispatched first.
struct ScanBlock {
  int s, head, e0;
};
__device__ __forceinline__ ScanBlock scan_block(const int* seq_order, int Hv, int V, int bv) {
  const int cbs = V / bv, b = static_cast<int>(blockIdx.x);
  const int col = b % cbs, rest = b / cbs;
  return {seq_order[rest / Hv], rest % Hv, col * bv};
}

// ---- L2 norm (formed in prep) -------------------------------------------------------------------
// rs [T, Hk, 2]: the L2 scales of q (times K^-1/2) and k (q^ = q rs[., 0], k^ = k rs[., 1]), part
// of the kept state: every kernel stages the raw bf16 rows (exact bf16 mma operands) and applies
// the scale per row. The scale of a row with squared norm ss: (ss + eps)^-1/2, times K^-1/2 for q
// (row even).
__device__ __forceinline__ float l2_scale(float ss, int row, int K) {
  return (1.f / sqrtf(ss + kL2Eps)) * ((row & 1) == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f);
}

// Row stride (bf16 elements) of raw q / k / v tiles: 16-byte rows, and the fragment reads of both
// orientations ([row on the group index][d], [row on the thread-in-group index][d]) hit distinct banks.
__host__ __device__ constexpr int raw_ld(int K) { return K + 8; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }

// ---- cp.async tile loads ----------------------------------------------------------------------
// Row stride of the bv-wide tiles (S, D, dO): bv + 8 keeps the B-fragment reads ([k][n], k on the
// thread-in-group index) free of bank conflicts.
__host__ __device__ constexpr int bv_ld(int bv) { return bv + 8; }

// Asynchronous copy (cp.async, 16-byte pieces) of a chunk tile, kC rows x ncols elements, into
// dst (row stride ld elements, ld * sizeof(T) a multiple of 16); rows >= len are zero-filled.
// The caller commits the group and waits (cp.async.wait_group) plus __syncthreads before use.
template <typename T>
__device__ __forceinline__ void async_rows(T* dst, int ld, const T* src, size_t src_ld, int len, int ncols) {
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  const int per_row = ncols / n, total = kC * per_row;
  // Rows of a power-of-two piece count (every tile at dk = dv = 128 and bv = 16..128) by a shift:
  // an integer division per piece costs ~20 instructions, and the scans issue ~10 pieces per thread
  // per chunk step (-2.5 % on the 4B training path, eighth round).
  const bool pow2 = (per_row & (per_row - 1)) == 0;
  const int lg = __ffs(per_row) - 1;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int i = pow2 ? idx >> lg : idx / per_row, c = (idx - i * per_row) * n;
    const T* gp = src + static_cast<size_t>(i < len ? i : 0) * src_ld + c;
    const uint32_t sp = static_cast<uint32_t>(__cvta_generic_to_shared(dst + i * ld + c));
    const int bytes = i < len ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sp), "l"(gp), "r"(bytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- flags between kernels launched beside one another ------------------------------------------
// Kernels beside a scan (programmatic dependent launch: gdn_forward, gdn_backward) read a (sample,
// head)'s results once its flag is set. The scan CTA's end: the flag after every thread's stores,
// which the barrier and thread 0's fence make visible to the GPU first (the fence is cumulative).
__device__ __forceinline__ void signal_done(int* done, int s, int Hv, int head) {
  if (done == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(done + static_cast<size_t>(s) * Hv + head), "r"(1)
                 : "memory");
  }
}
// The scans' per-(segment, head) flags (gdn_backward's kernels beside one another): also counted in
// done[-1], which bwd_chunk reads to stop waiting flag by flag once both scans are done
// (release: the count follows the flag and the CTA's stores).
__device__ __forceinline__ void signal_done_counted(int* done, int s, int Hv, int head) {
  if (done == nullptr) return;
  signal_done(done, s, Hv, head);
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(done - 1) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Every thread that reads the results waits (acquire) for itself, so its own later reads, cp.async
// included, see them. Flag s * Hv + head; polls sleep_ns apart.
__device__ __forceinline__ void wait_done(const int* done, int s, int Hv, int head, unsigned sleep_ns = 200) {
  if (done == nullptr) return;
  const int* f = done + static_cast<size_t>(s) * Hv + head;
  while (ld_acquire(f) == 0) __nanosleep(sleep_ns);
}
// prep -> the forward scan's output instances (launched beside prep, gdn_forward): prep flags each
// (chunk, key head) it finished, [chunk][Hk], zeroed by the chunk table kernel. Threads 0 .. n - 1
// each wait (acquire) for one of chunks first .. first + n - 1, then a barrier: what any thread reads
// of them afterwards, cp.async included, was written first (acquire, then bar.sync).
__device__ __forceinline__ void wait_prep_chunks(const int* prep_done, int first, int n, int Hk, int kh) {
  if (prep_done != nullptr)
    for (int i = threadIdx.x; i < n; i += blockDim.x) wait_done(prep_done, first + i, Hk, kh, 100);
  __syncthreads();
}

// ---- prep: G, T (W, U) per (chunk, value head) ------------------------------------------------
// Gc [T, Hv] = chunk-local cumsum of g; T = (I + A)^-1 (solve_unit_lower, gdn_solve.h) as hi / lo
// planes; with kWU (the mma.sync scans) also W [T, Hv, K] = T diag(b e^G) K^ and U [T, Hv, V] =
// T diag(b) V; and the row scales rs (formed here, below). From the raw bf16 k (and v) rows
// (cp.async, 16-byte pieces): A's k k^T products are exact (1 mma per k step), W's and U's B
// operands too (the k-index scales b e^G rs_k and b go into T's columns), so the split costs 2 mma
// there; W is stored as its hi / lo planes for the scans. The raw v rows load into A's region once
// the solve has consumed A (under the W product): 57,344 bytes of smem at K = V = 128, 4 CTAs per SM.
// Without W and U (the wgmma scans) T goes over k's rows: 39,936 bytes, 5 CTAs per SM; there one CTA
// serves a key head and forms its value heads in turn (kGroup, 4 CTAs per SM where there are several).
__host__ __device__ constexpr int prep_v_floats(int V) { return kC * raw_ld(V) / 2; }
// kWU = false: T over k's rows (dead once k k^T is formed), 39,936 bytes at K = 128.
// kx: two 16 x 16 tiles of k k^T in the mma fragment order (warps 0, 1's second tiles).
constexpr int kPrepKx = 2 * 8 * 32;
int prep_smem_floats(int K, int V, bool kWU) {
  if (!kWU) return imax(kC * raw_ld(K) / 2, kC * kLdC) + kC * kLdC + 4 * kC + kPrepKx;
  return kC * raw_ld(K) / 2 + 2 * kC * kLdC + (prep_v_floats(V) > kC * kLdC ? prep_v_floats(V) : 0) + 4 * kC +
         kPrepKx;
}
// The idx-th 16 x 16 tile on or below the diagonal of a C x C matrix, row by row: its first row
// and column.
__device__ __forceinline__ void lower_tile(int idx, int& m0, int& n0) {
  const int mb = idx < 1 ? 0 : idx < 3 ? 1 : idx < 6 ? 2 : 3;
  m0 = 16 * mb;
  n0 = 16 * (idx - mb * (mb + 1) / 2);
}

// kWU = false (the wgmma scans, which form W S and U from T themselves): G and T only.
// kGroup (the wgmma scans' prep at more than one value head per key head): the CTA loops over the
// group's value heads, holding k k^T through the loop: 59 registers, 4 CTAs per SM; otherwise 48, 5.
template <bool kWU, bool kGroup = false>
__global__ void __launch_bounds__(kThreads, kGroup ? 4 : 5) gdn_prep_kernel(float* Gc, bf16* Wh, bf16* Wl, float* U, bf16* Th, bf16* Tl,
                                                            const int4* table,
                                                            const int* nchunks, float* rs, const bf16* qkv,
                                                            const float* g, const float* beta, int Hk, int Hv,
                                                            int K, int V, int conv_dim, int* prep_done) {
  // In the plain forward, launched beside the chunk table kernel: its table first. The scan beside
  // this grid starts once every CTA of it has passed here (so no CTA of it waits for an SM behind
  // them). Elsewhere both are no-ops.
  wait_previous_grid();
  launch_dependents();
  const int c = blockIdx.x, ratio = Hv / Hk;
  // Both loads at once (the table has nc_max entries; past *nchunks they are not used): one global
  // round trip less at every CTA's start, where a wave's CTAs all wait together.
  const int4 ch = table[c];
  if (c >= *nchunks) return;
  const int bos = ch.x, len = ch.y;
  // kWU: one value head per CTA (blockIdx.y); else one key head per CTA (blockIdx.y), its value
  // heads in turn: k's load, L2 scales and k k^T are shared by the group (2x at 4B, 3x at 27B).
  const int kh = kWU ? static_cast<int>(blockIdx.y) / ratio : static_cast<int>(blockIdx.y);
  const int head0 = kWU ? static_cast<int>(blockIdx.y) : kh * ratio, nheads = kGroup ? ratio : 1;
  extern __shared__ float smem[];
  Carve cv{smem};
  const int ldk = raw_ld(K), ldv = raw_ld(V);
  bf16* Kb = reinterpret_cast<bf16*>(cv.take(kWU ? kC * ldk / 2 : imax(kC * ldk / 2, kC * kLdC)));
  float* As = cv.take(kC * kLdC);
  // v over A (dead after the solve) when it fits (V <= 2 kLdC - 8), else a region of its own.
  bf16* Vb = !kWU || prep_v_floats(V) <= kC * kLdC ? reinterpret_cast<bf16*>(As)
                                                    : reinterpret_cast<bf16*>(cv.take(prep_v_floats(V)));
  // G and T only (kWU = false): T over k's rows, which nothing reads once k k^T is formed.
  float* Ts = kWU ? cv.take(kC * kLdC) : reinterpret_cast<float*>(Kb);
  float* gs = cv.take(kC);
  float* bs = cv.take(kC);
  float* kbs = cv.take(kC);
  float* rk = cv.take(kC);
  float* kx = cv.take(kPrepKx);
  const size_t x_ld = static_cast<size_t>(conv_dim);
  // The L2 row scales rs are formed here (no separate pass over q and k): every CTA forms its k rows'
  // for A; the CTA of each key head's first value head also loads the q rows (into A's region,
  // before A exists) and stores both scales for every later kernel.
  const bool lead = head0 % ratio == 0;
  bf16* Qb = reinterpret_cast<bf16*>(As);
  async_rows(Kb, ldk, qkv + static_cast<size_t>(bos) * x_ld + static_cast<size_t>(Hk + kh) * K, x_ld, len, K);
  if (lead) async_rows(Qb, ldk, qkv + static_cast<size_t>(bos) * x_ld + static_cast<size_t>(kh) * K, x_ld, len, K);
  cp_async_commit();
  load_gates(gs, bs, g, beta, bos, len, Hv, head0);
  cp_async_wait<0>();
  __syncthreads();
  {
    // 4 threads per row, 16-byte pieces p, p + 4, .. of it, then the xor tree: a fixed order.
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    auto sumsq = [&](const bf16* X) {
      float ss = 0.f;
      for (int pc = part; pc < K / 8; pc += 4) {
        const uint4 u = *reinterpret_cast<const uint4*>(X + row * ldk + 8 * pc);
        const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += to_f(e[j]) * to_f(e[j]);
      }
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      return ss + __shfl_xor_sync(0xffffffffu, ss, 2);
    };
    // sumsq's shuffles need every lane: evaluated unconditionally (rows >= len are zero-filled).
    const float ssk = sumsq(Kb), r_k = row < len ? l2_scale(ssk, 1, K) : 0.f;
    if (part == 0) rk[row] = r_k;
    if (lead) {
      const float r_q = l2_scale(sumsq(Qb), 0, K);
      if (part == 0 && row < len)
        reinterpret_cast<float2*>(rs)[static_cast<size_t>(bos + row) * Hk + kh] = make_float2(r_q, r_k);
    }
  }
  __syncthreads();  // rk complete; q's rows dead (A is written over them below)
  // The raw k_i . k_j of the ten 16 x 16 tiles on and below the diagonal (bf16 x bf16 products are
  // exact, fp32 sums), kept for every value head of the group: warp w's tile w in registers, the
  // last two (warps 0, 1) in kx. (Two tiles per warp in registers spilled.)
  float kk[2][4];
  {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && warp >= 2) break;
      int m0, n0;
      lower_tile(warp + 8 * u, m0, n0);
      float acc[2][4] = {};
      mma_acc(acc, m0, n0, 0, K, Ld<false>{Kb, ldk}, Ld<false>{Kb, ldk});
      if (u == 0) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) kk[nt][r] = acc[nt][r];
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) kx[(warp * 8 + q) * 32 + lane] = acc[q >> 2][q & 3];
      }
    }
  }
  for (int v = 0; v < nheads; ++v) {
    // Thread-dependent offsets from a volatile %tid.x read per head (tid_x), so that they are not
    // hoisted out of the loop and held (spilled) through it.
    const int x = tid_x(), xw = x >> 5, xg = (x & 31) >> 2, xt = x & 3;
    const int head = head0 + v;
    if (v > 0) {
      // gs, bs are free: the last head read them before its solve's barriers.
      load_gates(gs, bs, g, beta, bos, len, Hv, head);
      __syncthreads();
    }
    if (x < kC) {
      if constexpr (kWU) kbs[x] = bs[x] * expf(gs[x]) * rk[x];  // W's scales
      if (x < len) Gc[static_cast<size_t>(bos + x) * Hv + head] = gs[x];
    }
    // A_ij = b_i rs_i rs_j (k_i . k_j) e^{G_i - G_j} (0 on and above the diagonal).
    // Only these tiles are written: the solve reads no other entry of A.
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && xw >= 2) break;
      int m0, n0;
      lower_tile(xw + 8 * u, m0, n0);
      // The tile's 2 rows and 4 columns of this thread read once; the gates by ex2 of log2-scaled
      // differences (a_entry's expf and per-entry loads: ~17 % of prep's stall samples at 27B).
      float g2i[2], bri[2], g2j[4], rkj[4];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + xg + 8 * hh;
        g2i[hh] = gs[i] * kLog2e;
        bri[hh] = bs[i] * rk[i];
      }
#pragma unroll
      for (int col = 0; col < 4; ++col) {
        const int j = n0 + (col >> 1) * 8 + 2 * xt + (col & 1);
        g2j[col] = gs[j] * kLog2e;
        rkj[col] = rk[j];
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int hh = (q & 3) >> 1, col = ((q >> 2) << 1) | (q & 1);
        const int i = m0 + xg + 8 * hh, j = n0 + (q >> 2) * 8 + 2 * xt + (q & 1);
        const float v = u == 0 ? kk[q >> 2][q & 3] : kx[(xw * 8 + q) * 32 + (x & 31)];
        As[i * kLdC + j] = j < i ? bri[hh] * rkj[col] * v * ex2_ftz(g2i[hh] - g2j[col]) : 0.f;
      }
    }
    __syncthreads();  // A complete; every warp is done reading k's rows (T goes over them)
    // Ends with a barrier. kWU: T complete, A dead (v goes over it). Else T_30's second part is
    // still in A's block (1, 0), added below as T is stored; A is written again only after the next
    // head's barrier.
    solve_unit_lower<kWU>(Ts, As, tid_x());
    // T itself, as hi / lo planes [chunk, Hv, C x C] for bwd_chunk (which reads it by ldmatrix instead
    // of rebuilding A and solving again) and the wgmma scans (Th == nullptr: neither will): warp w
    // stores rows w, w + 8, .., one 128-byte run per plane. (16-byte pieces of 8 columns were slower:
    // their 16-byte smem reads conflict two-way; 8-byte pieces of 4 columns were no faster.)
    if (Th != nullptr) {
      const size_t tb = (static_cast<size_t>(c) * Hv + head) * kC * kC;
      const int lane = x & 31;
      for (int l = xw; l < kC; l += kThreads / 32) {
        float2 t = ld_f2(Ts + l * kLdC + 2 * lane);
        if (!kWU && l >= 48 && lane < 8) {  // T_30 += its second part
          const float2 u = ld_f2(gdn_solve::t30_part(As, kLdC) + (l - 48) * kLdC + 2 * lane);
          t.x += u.x;
          t.y += u.y;
        }
        store_split(Th, Tl, tb + l * kC + 2 * lane, t.x, t.y);
      }
    }
    if constexpr (kWU) {
      async_rows(Vb, ldv, qkv + static_cast<size_t>(bos) * x_ld + 2 * Hk * K + static_cast<size_t>(head) * V, x_ld, len,
                 V);
      cp_async_commit();
      auto wbody = [&](auto& acc, int m0, int n0) {
        mma_acc<2, 4, false, true>(acc, m0, n0, 0, m0 + 16,
                                   Gk{[&](int i, int j) { return mul2(ld_f2(Ts + i * kLdC + j), ld_f2(kbs + j)); }},
                                   Ld<true>{Kb, ldk});
      };
      auto ubody = [&](auto& acc, int m0, int n0) {
        mma_acc<2, 4, false, true>(acc, m0, n0, 0, m0 + 16,
                                   Gk{[&](int i, int j) { return mul2(ld_f2(Ts + i * kLdC + j), ld_f2(bs + j)); }},
                                   Ld<true>{Vb, ldv});
      };
      for_tiles<2>(kC, K, wbody, Pair{[&](int i, int d, float v0, float v1) {
                     if (i < len) store_split(Wh, Wl, (static_cast<size_t>(bos + i) * Hv + head) * K + d, v0, v1);
                   }});
      cp_async_wait<0>();
      __syncthreads();  // v landed
      for_tiles<2>(kC, V, ubody, Pair{[&](int i, int e, float v0, float v1) {
                     if (i < len)
                       *reinterpret_cast<float2*>(U + (static_cast<size_t>(bos + i) * Hv + head) * V + e) =
                           make_float2(v0, v1);
                   }});
    }
  }
  // this chunk's G, T and row scales of key head kh are stored (prep_done: the plain forward's scan
  // waits for them; the mma.sync scans' prep, kWU, has nothing beside it)
  if constexpr (!kWU) signal_done(prep_done, c, Hk, kh);
}

// ---- forward state scan: per (sample, value head, dv column block) ---------------------------------
// Every operand is a bf16 tile read by ldmatrix: W as its hi / lo planes (written so by prep), the raw
// k rows (two buffers: chunk c+1's k streams in with its W and U during chunk c's update), the state S
// and diag(e^{G_L - G} rs_k) D as hi / lo planes. S itself stays fp32 in the registers of the warp
// tiles of the update (kScanTiles 16 x 16 tiles per warp at most), which write its planes.
constexpr int kScanTiles = 4;  // (K / 16) (bv / 16) / 8 warps at K <= 128, bv <= 64
int scan_fwd_smem_floats(int K, int bv) {
  return K * bv_ld(bv) + kC * raw_ld(K) + kC * raw_ld(K) + kC * bv_ld(bv) + kC * bv_ld(bv) + kC;
}

// The scans' state (S or dS, K x bv) in registers: warp w owns the 16 x 16 tiles w + 8 u (u <
// kScanTiles) of K x bv, in the mma C fragment layout (rows g, g + 8, columns 2t, 2t + 1 of each
// 8-column half). f(u, m0, n0) for each owned tile.
struct ScanState {
  float v[kScanTiles][2][4];
};
template <class F>
__device__ __forceinline__ void state_tiles(int K, int bv, F f) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, tn = bv / 16, tiles = (K / 16) * tn;
#pragma unroll
  for (int u = 0; u < kScanTiles; ++u) {
    const int tile = warp + nw * u;
    if (tile < tiles) f(u, (tile / tn) * 16, (tile % tn) * 16);
  }
}
// As state_tiles, for the 512-thread scans (16 warps, bv = 128): f2(u, m0, n0) for the tile pairs
// (u, u + 1) of a warp, which share their columns (rows m0 and m0 + 16 nw / tn), f1 for a last
// unpaired tile: the update's B fragments then serve two accumulator chains.
template <class F2, class F1>
__device__ __forceinline__ void state_tile_pairs(int K, int bv, F2 f2, F1 f1) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, tn = bv / 16, tiles = (K / 16) * tn;
#pragma unroll
  for (int u = 0; u < kScanTiles; u += 2) {
    const int tile = warp + nw * u;
    if (tile >= tiles) break;
    if (tile + nw < tiles)
      f2(u, (tile / tn) * 16, (tile % tn) * 16);
    else
      f1(u, (tile / tn) * 16, (tile % tn) * 16);
  }
}
// The state's columns e0.. into the fragment-native K x V matrix at dst (gdn_mma::frag_index): one
// 16-byte store per tile row (columns 2t, 2t + 1 of both 8-column halves).
__device__ __forceinline__ void store_state(float* dst, int V, int e0, const ScanState& st, int K, int bv) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  state_tiles(K, bv, [&](int u, int m0, int n0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float4*>(dst + gdn_mma::frag_index(m0 + g + 8 * hh, e0 + n0 + 2 * t, V)) =
          make_float4(st.v[u][0][2 * hh], st.v[u][0][2 * hh + 1], st.v[u][1][2 * hh], st.v[u][1][2 * hh + 1]);
  });
}
// state = decay state + acc (tile u at m0, n0), and its hi / lo planes (stride lds).
__device__ __forceinline__ void update_state(ScanState& st, int u, int m0, int n0, float decay, const float (&acc)[2][4],
                                             bf16* Sh, bf16* Sl, int lds) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float& s0 = st.v[u][nt][2 * hh];
      float& s1 = st.v[u][nt][2 * hh + 1];
      s0 = decay * s0 + acc[nt][2 * hh];
      s1 = decay * s1 + acc[nt][2 * hh + 1];
      store_split(Sh, Sl, (m0 + g + 8 * hh) * lds + n0 + nt * 8 + 2 * t, s0, s1);
    }
}

// The scans' state update over this thread's state tiles: S(tile) = decay S(tile) + the tile's
// product, with its hi / lo planes. one(acc[2][4], m0, n0) forms one tile's product; with 512
// threads two(acc[2][2][4], m0, n0, ms) forms a column-sharing pair's (rows m0 and m0 + ms).
template <int kMaxThreads, class One, class Two>
__device__ __forceinline__ void scan_update_state(ScanState& st, int K, int bv, float decay, bf16* Sh, bf16* Sl,
                                                  int lds, One one, Two two) {
  auto update1 = [&](int u, int m0, int n0) {
    float acc[2][4] = {};
    one(acc, m0, n0);
    update_state(st, u, m0, n0, decay, acc, Sh, Sl, lds);
  };
  if constexpr (kMaxThreads == 512) {
    const int ms = 16 * (static_cast<int>(blockDim.x >> 5) / (bv / 16));  // state_tile_pairs' row step
    state_tile_pairs(
        K, bv,
        [&](int u, int m0, int n0) {
          float acc[2][2][4] = {};
          two(acc, m0, n0, ms);
          update_state(st, u, m0, n0, decay, acc[0], Sh, Sl, lds);
          update_state(st, u + 1, m0 + ms, n0, decay, acc[1], Sh, Sl, lds);
        },
        update1);
  } else {
    state_tiles(K, bv, update1);
  }
}

// h[chunk, Hv, K x V] = state entering each chunk (fp32, fragment-native); D = U - W S out as its
// planes Dgh, Dgl [T, Hv, V]; W as its planes Wh, Wl [T, Hv, K]. k^ = k rs[., 1] (rs from
// gdn_prep_kernel): the update takes the raw k rows as its A operand and folds e^{G_L - G_i} rs_i
// into D's rows. Two barriers per chunk: W, U and k of chunk c+1 load (cp.async, one group) during
// chunk c's update and are waited on at the top of chunk c+1; the gates and row scales of chunk c+1
// are read into registers during chunk c.
// kMaxThreads: 256, or 512 for bv = 128 (16 warps, kScanTiles state tiles each; see scan_threads).
template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads) gdn_scan_fwd_kernel(float* h, bf16* Dgh, bf16* Dgl, const float* U,
                                                                const bf16* Wh,
                                                                const bf16* Wl, const bf16* qkv, const float* rs,
                                                                const float* Gc, const int32_t* cu,
                                                                const int* seq_off, const int* seq_order, int Hk,
                                                                int Hv, int K, int V, int conv_dim, int bv) {
  const ScanBlock sb = scan_block(seq_order, Hv, V, bv);
  const int s = sb.s, head = sb.head, e0 = sb.e0, kh = head / (Hv / Hk);
  const int bos = cu[s], len = cu[s + 1] - bos, n = (len + kC - 1) / kC, first = seq_off[s];
  extern __shared__ float smem[];
  Carve cv{smem};
  const int lds = bv_ld(bv), ldr = raw_ld(K);
  bf16* Sh = reinterpret_cast<bf16*>(cv.take(K * lds / 2));
  bf16* Sl = reinterpret_cast<bf16*>(cv.take(K * lds / 2));
  bf16* Whs = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Wls = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Kb = reinterpret_cast<bf16*>(cv.take(kC * ldr));  // two raw k buffers (chunk parity)
  bf16* Dh = reinterpret_cast<bf16*>(cv.take(kC * lds / 2));
  bf16* Dl = reinterpret_cast<bf16*>(cv.take(kC * lds / 2));
  float* Us = cv.take(kC * lds);  // U columns e0.. of the chunk (cp.async with its W)
  float* ks = cv.take(kC);        // e^{G_L - G_i} rs_k(i)
  const size_t w_ld = static_cast<size_t>(Hv) * K, x_ld = static_cast<size_t>(conv_dim);
  const size_t u_ld = static_cast<size_t>(Hv) * V;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * K;
  const float* rk = rs + static_cast<size_t>(kh) * 2 + 1;  // rs[(t * Hk + kh) * 2 + 1]
  const size_t r_ld = static_cast<size_t>(Hk) * 2;
  for (int idx = threadIdx.x; idx < K * lds; idx += blockDim.x) Sh[idx] = Sl[idx] = __float2bfloat16(0.f);
  ScanState S = {};  // fp32 state; its planes Sh, Sl are what the D product reads
  // Next chunk: gl_next = G at its last valid row; gi_next, ri_next = G and rs_k at row threadIdx.x.
  float gl_next = 0.f, gi_next = 0.f, ri_next = 0.f;
  if (n > 0) {
    const int L0 = min(kC, len);
    const size_t wo = (static_cast<size_t>(bos) * Hv + head) * K;
    async_rows(Whs, ldr, Wh + wo, w_ld, L0, K);
    async_rows(Wls, ldr, Wl + wo, w_ld, L0, K);
    async_rows(Us, lds, U + static_cast<size_t>(bos) * u_ld + static_cast<size_t>(head) * V + e0, u_ld, L0, bv);
    async_rows(Kb, ldr, kraw + static_cast<size_t>(bos) * x_ld, x_ld, L0, K);
    gl_next = Gc[static_cast<size_t>(bos + L0 - 1) * Hv + head];
    if (threadIdx.x < L0) {
      gi_next = Gc[static_cast<size_t>(bos + threadIdx.x) * Hv + head];
      ri_next = rk[static_cast<size_t>(bos + threadIdx.x) * r_ld];
    }
  }
  cp_async_commit();
  for (int ci = 0; ci < n; ++ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = gl_next;
    // Rows >= L: rs 0, so ks 0. ks was last read by the previous chunk's D epilogue (before its (B)).
    if (threadIdx.x < kC) ks[threadIdx.x] = expf(gl - gi_next) * ri_next;
    if (ci + 1 < n) {  // consumed next iteration: the loads overlap this chunk's work
      const int c1 = c0 + kC, L1 = min(kC, len - (ci + 1) * kC);
      gl_next = Gc[static_cast<size_t>(c1 + L1 - 1) * Hv + head];
      gi_next = 0.f;
      ri_next = 0.f;
      if (threadIdx.x < L1) {
        gi_next = Gc[static_cast<size_t>(c1 + threadIdx.x) * Hv + head];
        ri_next = rk[static_cast<size_t>(c1 + threadIdx.x) * r_ld];
      }
    }
    cp_async_wait<0>();  // W, U, k of this chunk
    __syncthreads();     // (A) tiles, ks and the S planes visible; the previous update finished (D planes free)
    const bf16* Kc = Kb + (ci & 1) * (kC * ldr);
    store_state(h + (chunk * Hv + head) * static_cast<size_t>(K) * V, V, e0, S, K, bv);
    // D = U - W S (rows >= L: D = 0, so they drop out of the update below); its planes hold ks D.
    auto dbody = [&](auto& acc, int m0, int n0) {
      if (m0 >= L) return;
      mma_acc(acc, m0, n0, 0, K, Ld2<false>{Whs, Wls, ldr}, Ld2<true>{Sh, Sl, lds});
    };
    for_tiles<2>(kC, bv, dbody, Pair{[&](int i, int e, float v0, float v1) {
                   float x0 = 0.f, x1 = 0.f;
                   if (i < L) {
                     const float2 u = *reinterpret_cast<const float2*>(Us + i * lds + e);
                     x0 = u.x - v0;
                     x1 = u.y - v1;
                     store_split(Dgh, Dgl, (static_cast<size_t>(c0 + i) * Hv + head) * V + e0 + e, x0, x1);
                   }
                   store_split(Dh, Dl, i * lds + e, ks[i] * x0, ks[i] * x1);
                 }});
    __syncthreads();  // (B) D planes complete; W, U and the other k buffer free; S planes read
    if (ci + 1 < n) {
      const int c1 = c0 + kC, L1 = min(kC, len - (ci + 1) * kC);
      const size_t wo = (static_cast<size_t>(c1) * Hv + head) * K;
      async_rows(Whs, ldr, Wh + wo, w_ld, L1, K);
      async_rows(Wls, ldr, Wl + wo, w_ld, L1, K);
      async_rows(Us, lds, U + static_cast<size_t>(c1) * u_ld + static_cast<size_t>(head) * V + e0, u_ld, L1, bv);
      async_rows(Kb + ((ci + 1) & 1) * (kC * ldr), ldr, kraw + static_cast<size_t>(c1) * x_ld, x_ld, L1, K);
    }
    cp_async_commit();
    // S = e^{G_L} S + k^T (diag(e^{G_L - G} rs_k) D), in the registers; then its planes.
    scan_update_state<kMaxThreads>(
        S, K, bv, expf(gl), Sh, Sl, lds,
        [&](float (&acc)[2][4], int m0, int n0) {
          mma_acc(acc, m0, n0, 0, kC, Ld<true>{Kc, ldr}, Ld2<true>{Dh, Dl, lds});
        },
        [&](float (&acc)[2][2][4], int m0, int n0, int ms) {
          mma_acc_m<2, 2>(acc, m0, n0, 0, kC, Ld<true>{Kc, ldr}, Ld2<true>{Dh, Dl, lds}, ms);
        });
  }
  cp_async_wait<0>();
}

// ---- forward output ----------------------------------------------------------------------------
// Raw bf16 q, k tiles (cp.async) with the L2 scales rs, D as its planes, P (fp32) over k once q k^T is
// taken: 70.0 KB at K = V = 128, 3 CTAs per SM (87.0 KB and 2 with P in its own region).
int out_smem_floats(int K, int V) {
  return kC * raw_ld(K) / 2 + imax(kC * raw_ld(K) / 2, kC * kLdC) + kC * raw_ld(V) + 4 * kC;
}

// O = diag(e^G rq) (q S0) + P D, per (chunk, value head).
// A 1-D grid, heads fastest, over the entries of rtable (shortest sample first, the order in which a
// single wave of scan CTAs finishes; its flags name the zero states, chunk_state). done != nullptr:
// launched beside the scan, a CTA waits for its (sample, head)'s flag first.
__global__ void __launch_bounds__(kThreads) gdn_output_kernel(bf16* o, const int4* rtable, const int* nchunks,
                                                              const float* rs, const bf16* qkv, const float* Gc,
                                                              const bf16* Dgh, const bf16* Dgl, const float* h,
                                                              int Hk, int Hv,
                                                              int K, int V, int conv_dim, const int* done) {
  const int e = static_cast<int>(blockIdx.x) / Hv, head = static_cast<int>(blockIdx.x) % Hv;
  if (e >= *nchunks) return;
  const int4 ch = rtable[e];
  const int bos = ch.x, len = ch.y, kh = head / (Hv / Hk);
  wait_done(done, ch.z & kRtSeg, Hv, head);
  extern __shared__ float smem[];
  Carve cv{smem};
  const int ldr = raw_ld(K), ldd = raw_ld(V);
  bf16* Qb = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Dh = reinterpret_cast<bf16*>(cv.take(kC * ldd / 2));
  bf16* Dl = reinterpret_cast<bf16*>(cv.take(kC * ldd / 2));
  float* Ps = cv.take(imax(kC * ldr / 2, kC * kLdC));  // P over the raw k rows, once they are read
  bf16* Kb = reinterpret_cast<bf16*>(Ps);
  float* gs = cv.take(kC);
  float* eq = cv.take(kC);
  float* rq = cv.take(kC);
  float* rk = cv.take(kC);
  const size_t x_ld = static_cast<size_t>(conv_dim), vh_ld = static_cast<size_t>(Hv) * V;
  const bf16* xrow = qkv + static_cast<size_t>(bos) * x_ld;
  async_rows(Qb, ldr, xrow + static_cast<size_t>(kh) * K, x_ld, len, K);
  async_rows(Kb, ldr, xrow + static_cast<size_t>(Hk + kh) * K, x_ld, len, K);
  async_rows(Dh, ldd, Dgh + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  async_rows(Dl, ldd, Dgl + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  cp_async_commit();
  load_rows_gq(gs, rq, rk, Gc, rs, bos, len, Hk, Hv, head, kh);
  if (threadIdx.x < kC) eq[threadIdx.x] = expf(gs[threadIdx.x]) * rq[threadIdx.x];
  cp_async_wait<0>();
  __syncthreads();
  build_p(Ps, Qb, Kb, ldr, K, gs, rq, rk);
  __syncthreads();
  // 2 row tiles per warp tile share each S0 fragment (read from global and split once for both:
  // -8 % against 1 in the eighth round); S0's fragments by 16-byte loads and movmatrix (NtT: output
  // 0.317 -> 0.282 ms at 4B against scalar gathers in the ninth round).
  constexpr int kMT = 2;
  const float* S0 = chunk_state(h, ch, kRtFirst, Hv, head, K, V);
  for_tiles_m2<kMT, 2>(
      kC, V,
      [&](auto& a1, auto& a2, int m0, int n0) {
        if (m0 >= len) return;
        mma_acc_m<kMT, 2>(a1, m0, n0, 0, K, Ld<false>{Qb, ldr}, NtT{S0, V});
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const int m = m0 + 16 * mt;
          mma_acc(a2[mt], m, n0, 0, m + 16, Gk{[&](int i, int j) { return ld_f2(Ps + i * kLdC + j); }},
                  Ld2<true>{Dh, Dl, ldd});
        }
      },
      Pair{[&](int i, int e, float qs0, float qs1, float pd0, float pd1) {
        if (i < len)
          store_bf16x2(o + (static_cast<size_t>(bos + i) * Hv + head) * V + e, eq[i] * qs0 + pd0, eq[i] * qs1 + pd1);
      }});
}

// ---- backward: dD_local = P^T dO ---------------------------------------------------------------
// Raw bf16 q, k, dO tiles: 69.8 KB at K = V = 128 (3 CTAs per SM).
int dlocal_smem_floats(int K, int V) { return kC * raw_ld(K) + kC * raw_ld(V) / 2 + kC * kLdC + 3 * kC; }

__global__ void __launch_bounds__(kThreads) gdn_dlocal_kernel(float* dD, const int4* table, const int* nchunks,
                                                              const float* rs, const bf16* qkv, const float* Gc,
                                                              const bf16* d_o, int Hk, int Hv, int K, int V,
                                                              int conv_dim) {
  const int c = blockIdx.x, head = blockIdx.y;
  if (c >= *nchunks) return;
  const int4 ch = table[c];
  const int bos = ch.x, len = ch.y, kh = head / (Hv / Hk);
  extern __shared__ float smem[];
  Carve cv{smem};
  const int ldr = raw_ld(K), ldo = raw_ld(V);
  bf16* Qb = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Kb = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Ob = reinterpret_cast<bf16*>(cv.take(kC * ldo / 2));
  float* Ps = cv.take(kC * kLdC);
  float* gs = cv.take(kC);
  float* rq = cv.take(kC);
  float* rk = cv.take(kC);
  const size_t x_ld = static_cast<size_t>(conv_dim);
  const bf16* xrow = qkv + static_cast<size_t>(bos) * x_ld;
  async_rows(Qb, ldr, xrow + static_cast<size_t>(kh) * K, x_ld, len, K);
  async_rows(Kb, ldr, xrow + static_cast<size_t>(Hk + kh) * K, x_ld, len, K);
  async_rows(Ob, ldo, d_o + (static_cast<size_t>(bos) * Hv + head) * V, static_cast<size_t>(Hv) * V, len, V);
  cp_async_commit();
  load_rows_gq(gs, rq, rk, Gc, rs, bos, len, Hk, Hv, head, kh);
  cp_async_wait<0>();
  __syncthreads();
  build_p(Ps, Qb, Kb, ldr, K, gs, rq, rk);
  __syncthreads();
  // dD_j = sum_{i >= j} P_ij dO_i (P is lower triangular: row tile m0 needs i >= m0).
  for_tiles<2>(
      kC, V,
      [&](auto& acc, int m0, int n0) {
        if (m0 >= len) return;
        mma_acc(acc, m0, n0, m0, kC, [&](int j, int i) { return Ps[i * kLdC + j]; }, Ld<true>{Ob, ldo});
      },
      Pair{[&](int j, int e, float v0, float v1) {
        if (j < len)
          *reinterpret_cast<float2*>(dD + (static_cast<size_t>(bos + j) * Hv + head) * V + e) = make_float2(v0, v1);
      }});
}

// ---- backward: dD_local = P^T dO on wgmma (dk = dv = 128) ------------------------------------------
// One warpgroup per (chunk, value head): S^T = k q^T (A = k, B = q, both K-major 128-byte-swizzled
// panels of 64 columns; 8 m64n64k16), P^T = S^T . (rk_j rq_i e^{G_i - G_j}) for i >= j in the
// accumulator, which is the m64nNk16 A fragment layout with k = i (as P in the attention forward),
// split into bf16 hi / lo fragments, then dD = P^T dO (B = dO N-major, 2 x 4 m64n128k16 from
// registers; dO is exact, so hi dO + lo dO is the same split as gdn_dlocal_kernel's). The operands
// never pass through registers as fragments, so the LSU-bound gathers of the mma.sync kernel go.
// 49 KB of smem: 4 CTAs per SM.
constexpr int kDlD = 128;                      // dk = dv this kernel serves
constexpr uint32_t kDlPanel = kC * 128;        // one 64-row x 64-column bf16 panel
constexpr uint32_t kDlTile = 2 * kDlPanel;     // a 64 x 128 tile
constexpr size_t kDlSmem = 3 * kDlTile + 3 * kC * sizeof(float) + 1024;

// Rows [0, kC) of a 64 x kCols bf16 tile (row r at src + r * ld) into kCols / 64 128-byte-swizzled
// panels (columns 0-63, 64-127, ..); rows >= valid are zero-filled. kThr threads, 16-byte pieces.
// tid: the thread's index (the persistent bwd_chunk passes tid_x(), so that the offsets are not hoisted
// out of its item loop).
template <int kThr = 128, int kCols = kDlD>
__device__ __forceinline__ void async_panels(char* dst, const bf16* src, size_t ld, int valid,
                                             int tid = threadIdx.x) {
#pragma unroll
  for (int u = 0; u < kC * (kCols / 8) / kThr; ++u) {
    const int c = tid + u * kThr, row = c / (kCols / 8), ch = c % (kCols / 8);
    const uint32_t sp = static_cast<uint32_t>(__cvta_generic_to_shared(
        dst + (ch / 8) * kDlPanel + row * 128 + (((ch % 8) ^ (row & 7)) << 4)));
    const bool ok = row < valid;
    const bf16* gp = src + static_cast<size_t>(ok ? row : 0) * ld + ch * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sp), "l"(gp), "r"(ok ? 16 : 0) : "memory");
  }
}

// The largest magnitude of the pieces this thread's async_panels<kThr, kCols> call loaded into dst: its
// own cp.async writes are visible to it once their group has been waited for, before any barrier.
template <int kThr, int kCols = kDlD>
__device__ __forceinline__ float own_panels_absmax(const char* dst, int tid = threadIdx.x) {
  float m = 0.f;
#pragma unroll
  for (int u = 0; u < kC * (kCols / 8) / kThr; ++u) {
    const int c = tid + u * kThr, row = c / (kCols / 8), ch = c % (kCols / 8);
    const uint4 x = *reinterpret_cast<const uint4*>(dst + (ch / 8) * kDlPanel + row * 128 + (((ch % 8) ^ (row & 7)) << 4));
    m = fmaxf(fmaxf(m, fmaxf(absmax_bf16x2(x.x), absmax_bf16x2(x.y))), fmaxf(absmax_bf16x2(x.z), absmax_bf16x2(x.w)));
  }
  return m;
}

__global__ void __launch_bounds__(128) gdn_dlocal_wgmma_kernel(float* dD, const int4* table, const int* nchunks,
                                                               const float* rs, const bf16* qkv, const float* Gc,
                                                               const bf16* d_o, int Hk, int Hv, int conv_dim) {
  const int c = blockIdx.x, head = blockIdx.y;
  if (c >= *nchunks) return;
  const int4 ch = table[c];
  const int bos = ch.x, len = ch.y, kh = head / (Hv / Hk);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  char* sK = reinterpret_cast<char*>(smem_raw) + ((1024u - (s0 & 1023u)) & 1023u);  // panels 1024-aligned
  char* sQ = sK + kDlTile;
  char* sO = sQ + kDlTile;
  float* gs = reinterpret_cast<float*>(sO + kDlTile);
  float* rq = gs + kC;
  float* rk = rq + kC;
  const size_t x_ld = static_cast<size_t>(conv_dim), vh_ld = static_cast<size_t>(Hv) * kDlD;
  const bf16* xrow = qkv + static_cast<size_t>(bos) * x_ld;
  async_panels(sK, xrow + static_cast<size_t>(Hk + kh) * kDlD, x_ld, len);
  async_panels(sQ, xrow + static_cast<size_t>(kh) * kDlD, x_ld, len);
  async_panels(sO, d_o + (static_cast<size_t>(bos) * Hv + head) * kDlD, vh_ld, len);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  load_rows_gq(gs, rq, rk, Gc, rs, bos, len, Hk, Hv, head, kh);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  wg::fence_proxy_async();
  __syncthreads();

  // S^T[j][i] = k_j . q_i (exact bf16 products, fp32 sums).
  float st[kC / 2];
  wg::mma_abt_sync<kC, kDlD / 16>(st, sK, kDlPanel, sQ, kDlPanel);

  // P^T in the accumulator: thread (warp w, lane g, t) holds rows j = 16 w + g (+ 8), columns
  // i = 8 nb + 2 t (+ 1) at st[4 nb + 2 hh + e]; its A fragment for k step kk is nb = 2 kk, 2 kk + 1.
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
  uint32_t ah[kC / 16][4], al[kC / 16][4];
#pragma unroll
  for (int nb = 0; nb < kC / 8; ++nb)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int j = 16 * w + g + 8 * hh;
      float pv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 8 * nb + 2 * t + e;
        pv[e] = p_entry(st[4 * nb + 2 * hh + e], i, j, gs, rq, rk);
      }
      // register q of fragment kk: 0 (row g, cols 0-7 of the k step), 1 (row g + 8), 2 (cols 8-15), 3
      const int kk = nb >> 1, q = hh + 2 * (nb & 1);
      gdn_mma::split_bf16(pv[0], pv[1], ah[kk][q], al[kk][q]);
    }

  // dD[j][e] = sum_i P^T[j][i] dO[i][e]: B = dO N-major (64-column blocks kDlPanel apart).
  float acc[kDlD / 2];
  {
    const uint64_t db0 = wg::desc_opaque(wg::desc_sw128(sO, kDlPanel, 1024));
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      wg::mma_m64n128k16_rs<1>(acc, ah[kk], wg::desc_advance(db0, kk * 2048), kk > 0);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wg::mma_m64n128k16_rs<1>(acc, al[kk], wg::desc_advance(db0, kk * 2048), 1);
    wg::commit();
    wg::wait<0>();
  }
  wg::fence_operands(acc);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int j = 16 * w + g + 8 * hh;
    if (j >= len) continue;
    float* row = dD + (static_cast<size_t>(bos + j) * Hv + head) * kDlD;
#pragma unroll
    for (int nb = 0; nb < kDlD / 8; ++nb)
      *reinterpret_cast<float2*>(row + 8 * nb + 2 * t) = make_float2(acc[4 * nb + 2 * hh], acc[4 * nb + 2 * hh + 1]);
  }
}

// ---- forward state scan on wgmma (dk = dv = 128) -------------------------------------------------
// One CTA of two warpgroups per (sample, value head). Warpgroup wg owns the state columns
// n = 64 wg .. 64 wg + 63 and keeps them transposed, S^T (64 x K), in its m64n128 accumulator, which
// is also the m64nNk16 A-fragment layout of a product over d. Per chunk (D = U - W S = T Y with
// Y = diag(b) V - diag(kbs) k S, so W and U are never formed):
//   acc = S^T k^T                    A = S^T split hi / lo in registers, B = raw k (K-major):
//                                    2 x 8 m64n64k16;
//   D^T = Y^T T^T                    Y^T = V^T diag(b) - acc diag(kbs) split in registers, B = T's
//                                    planes (K-major): 3 x 4 m64n64k16;
//   S^T = e^{G_L} S^T + (ks D)^T k   A = (ks D)^T split from the D^T accumulator, B = raw k
//                                    (N-major): 2 x 4 m64n128k16; ks_i = e^{G_L - G_i} rs_k(i).
// So neither S nor D passes through shared memory (the mma.sync kernel writes and reads both as
// planes every chunk): T's planes, raw k (and q) as 128-byte-swizzled panels and the raw v rows are
// the only tiles (cp.async, two buffers: chunk c+1 loads during chunk c), one barrier per chunk; the
// two warpgroups share nothing else. Every fp32 x fp32 product is split hi / lo as in the mma.sync
// kernels (the sums run in another order). 103 KB of smem, 167 KB with the output.
// The wgmma scans keep transposed tiles in accumulators: register 4 j + 2 hh + e of a thread holds
// row ncol + 8 hh (the thread's state column) and column 8 j + 2 t + e (t = lane % 4).

// x^T of the chunk tile at src (fp32 rows i, row stride ld; rows >= L read as 0) in that layout,
// x[4 j + 2 hh + e] = src[i][ncol + 8 hh] with i = 8 j + 2 t + e.
__device__ __forceinline__ void load_tile_t(float (&x)[kC / 2], const float* src, size_t ld, int L, int ncol, int t) {
#pragma unroll
  for (int j = 0; j < kC / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 8 * j + 2 * t + e;
        x[4 * j + 2 * hh + e] = i < L ? src[static_cast<size_t>(i) * ld + ncol + 8 * hh] : 0.f;
      }
}
// The transposed state sT (rows n, columns d) into the fragment-native K x V matrix dst (S[d][n]).
// A row d's float4 there holds columns n0 + 2u, + 1, + 8, + 9 (u = (n % 8) / 2): this lane has the
// even or odd ones of them (g even or odd) for both d = 8 j + 2 t and d + 1, its partner lane ^ 4
// the others. One xor shuffle per pair swaps what each needs, so the even lane stores row d's float4
// and the odd lane row d + 1's: 16 16-byte stores (a warp writes one whole 512-byte block each)
// instead of 64 scattered 4-byte ones, at the top of every chunk of the serial chain. kPaired =
// false keeps the 4-byte stores (the forward scan with the output: 92 bytes of spills otherwise).
template <bool kPaired = false, class E = float>
__device__ __forceinline__ void store_state_t(E* dst, const float (&sT)[kDlD / 2], int ncol, int t, float sc = 1.f) {
  if constexpr (!kPaired) {
#pragma unroll
    for (int j = 0; j < kDlD / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          dst[gdn_mma::frag_index(8 * j + 2 * t + e, ncol + 8 * hh, kDlD)] = sT[4 * j + 2 * hh + e];
    return;
  }
  const int g = (threadIdx.x & 31) >> 2, odd = g & 1;
  // row 2 t + odd of the first 8-row block, at the float4 of columns n0 = the 16-column block + 2u;
  // row block j is 8 x 128 elements further on
  E* p = dst + gdn_mma::frag_index(2 * t + odd, ncol - g + 2 * (g >> 1), kDlD);
#pragma unroll
  for (int j = 0; j < kDlD / 8; ++j) {
    // send the values of the other row (d + 1 from an even lane, d from an odd one)
    const float s0 = odd ? sT[4 * j] : sT[4 * j + 1], s1 = odd ? sT[4 * j + 2] : sT[4 * j + 3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 4), r1 = __shfl_xor_sync(0xffffffffu, s1, 4);
    const float4 v = odd ? make_float4(r0, sT[4 * j + 1], r1, sT[4 * j + 3]) : make_float4(sT[4 * j], r0, sT[4 * j + 2], r1);
    if constexpr (sizeof(E) == 2)  // fp16 elements (times sc): 8-byte stores
      reinterpret_cast<uint2*>(p)[j * (8 * kDlD / 4)] =
          make_uint2(gdn_mma::pack_f16(sc * v.x, sc * v.y), gdn_mma::pack_f16(sc * v.z, sc * v.w));
    else
      reinterpret_cast<float4*>(p)[j * (8 * kDlD / 4)] = v;
  }
}
// The hi / lo A fragments of a product over the columns of the transposed state: k step kk takes
// its column blocks 2 kk, 2 kk + 1 (the m64nNk16 A layout).
__device__ __forceinline__ void state_frags_t(const float (&sT)[kDlD / 2], uint32_t (&ah)[kDlD / 16][4],
                                              uint32_t (&al)[kDlD / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kDlD / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * kk + (q >> 1), hh = q & 1;
      gdn_mma::split_bf16(sT[4 * nb + 2 * hh], sT[4 * nb + 2 * hh + 1], ah[kk][q], al[kk][q]);
    }
}
// Row n of an 8 x 8 block of a transposed tile, (x0, x1) at columns i, i + 1, out as hi / lo planes
// [rows i][n] (row stride ld): split, then each plane word transposed by movmatrix, so lane (g, t)
// stores the pair at row i0 + g, columns n0 + 2 t, n0 + 2 t + 1 (rows >= L not stored).
// The hi / lo plane words of (x0, x1), each transposed in its 8 x 8 block (movmatrix).
__device__ __forceinline__ void plane_words_t(float x0, float x1, uint32_t& h, uint32_t& l) {
  gdn_mma::split_bf16(x0, x1, h, l);
  h = gdn_mma::movmatrix_trans(h);
  l = gdn_mma::movmatrix_trans(l);
}
__device__ __forceinline__ void store_planes_t(bf16* hi, bf16* lo, size_t ld, int L, int i0, int n0, float x0,
                                               float x1, int g, int t) {
  uint32_t h2, l2;
  plane_words_t(x0, x1, h2, l2);
  if (i0 + g < L) {
    const size_t o = static_cast<size_t>(i0 + g) * ld + n0 + 2 * t;
    *reinterpret_cast<uint32_t*>(hi + o) = h2;
    *reinterpret_cast<uint32_t*>(lo + o) = l2;
  }
}
// Both 8 x 8 blocks of 16 columns n0 .. n0 + 15 (x = the pairs at n0 and n0 + 8): after the
// transposes, lanes t and t ^ 1 swap one word per plane, so an even t stores columns n0 + 2 t .. + 3
// and an odd t columns n0 + 8 + 2 (t - 1) .. + 3 (8 bytes): a warp's store fills each row's whole
// 32-byte sector. (Two 4-byte stores per block filled half a sector each: the recompute scan's
// store segments were half its stall samples.)
template <bool kF16 = false>  // kF16: one fp16 plane (times sc) at hi, no lo
__device__ __forceinline__ void store_planes_pair_t(bf16* hi, bf16* lo, size_t ld, int L, int i0, int n0,
                                                    const float (&x)[4], int g, int t, float sc = 1.f) {
  uint32_t h[2], l[2] = {0u, 0u};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if constexpr (kF16)
      h[hh] = gdn_mma::movmatrix_trans(gdn_mma::pack_f16(sc * x[2 * hh], sc * x[2 * hh + 1]));
    else
      plane_words_t(x[2 * hh], x[2 * hh + 1], h[hh], l[hh]);
  }
  const int odd = t & 1;
  const uint32_t rh = __shfl_xor_sync(0xffffffffu, odd ? h[0] : h[1], 1);
  uint32_t rl = 0u;
  if constexpr (!kF16) rl = __shfl_xor_sync(0xffffffffu, odd ? l[0] : l[1], 1);
  if (i0 + g < L) {
    const size_t o = static_cast<size_t>(i0 + g) * ld + n0 + 2 * t + 6 * odd;  // odd: n0 + 8 + 2 (t - 1)
    *reinterpret_cast<uint2*>(hi + o) = odd ? make_uint2(rh, h[1]) : make_uint2(h[0], rh);
    if constexpr (!kF16) *reinterpret_cast<uint2*>(lo + o) = odd ? make_uint2(rl, l[1]) : make_uint2(l[0], rl);
  }
}

// One item of a wgmma scan: segment p (every unsplit sample is one) of one value head, its first row,
// length, chunk count and first chunk; and, for the split (gdn_chunk_table_kernel's plan), the
// item's kind (ScanItem), the segment's index in its sample, the sample's segment count and the
// segment's state slot.
struct WgScanItem {
  int head, kh, bos, len, n, first, p, kind, idx, nseg, slot;
};
// A plain wgmma scan CTA's item from the 1-D grid (scan_block at bv = dv): an unsplit segment.
__device__ __forceinline__ WgScanItem wg_scan_cta(const int* seq_order, const int32_t* cu, const int* seq_off, int Hk,
                                                  int Hv) {
  const ScanBlock sb = scan_block(seq_order, Hv, kDlD, kDlD);
  const int bos = cu[sb.s], len = cu[sb.s + 1] - bos;
  return {sb.head, sb.head / (Hv / Hk), bos, len, (len + kC - 1) / kC, seq_off[sb.s], sb.s, kItemOut, 0, 1, -1};
}
// The first 1024-byte-aligned address of dynamic smem (the 128-byte swizzle's panels need it).
__device__ __forceinline__ char* align1024(unsigned char* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return reinterpret_cast<char*>(smem) + ((1024u - (a & 1023u)) & 1023u);
}
// A thread of a warpgroup's accumulator: warp w of the warpgroup, lane / 4 = g, lane % 4 = t (from one
// tid_x read).
struct WgLane {
  int w, g, t;
};
__device__ __forceinline__ WgLane wg_lane() {
  const int x = tid_x();
  return {(x >> 5) & 3, (x & 31) >> 2, x & 3};
}
// hi / lo planes (row r at r * 128 bytes, 128-byte swizzle) of f(v, r, c) over the accumulator,
// rows r0 + r, columns c0 + c (r0, c0 multiples of 8; pairs of columns per 32-bit word). kLo = false:
// the bf16 plane hi only (lo unused), for operands that feed only bf16 outputs (dq^, dk^), whose own
// rounding is the same 2^-9. By stmatrix: the accumulator's pairs are the 8 x 8 matrices' fragments,
// so one instruction stores a warp's 4 matrices (rows 16 w .. + 15, two column blocks of 8) per plane
// where 4-byte stores took four.
template <int kN, bool kLo = true, bool kF16 = false, class F>
__device__ __forceinline__ void acc_planes(char* hi, char* lo, const float (&acc)[kN / 2], int r0, int c0, F&& f) {
  const auto [w, g, t] = wg_lane();
  // This lane addresses row rr of matrix m = (column block 2 nb2 + m / 2, row half m % 2).
  const int lane = tid_x() & 31, m = lane >> 3, rr = lane & 7;
  const int row = r0 + 16 * w + 8 * (m & 1) + rr, cb = (c0 >> 3) + (m >> 1);
  const uint32_t hrow = wg::smem_addr(hi) + row * 128u, lrow = kLo ? wg::smem_addr(lo) + row * 128u : 0u;
#pragma unroll
  for (int nb2 = 0; nb2 < kN / 16; ++nb2) {
    uint32_t h[4], l[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * nb2 + (q >> 1), hh = q & 1;
      const int r = 16 * w + g + 8 * hh, c = 8 * nb + 2 * t;
      const float x0 = f(acc[4 * nb + 2 * hh], r, c), x1 = f(acc[4 * nb + 2 * hh + 1], r, c + 1);
      if constexpr (kF16)
        h[q] = gdn_mma::pack_f16(x0, x1);
      else if constexpr (kLo)
        gdn_mma::split_bf16(x0, x1, h[q], l[q]);
      else
        h[q] = gdn_mma::pack_bf16(x0, x1);
    }
    const uint32_t chunk = ((((cb + 2 * nb2) ^ row) & 7) << 4);
    gdn_mma::stmatrix_x4(hrow + chunk, h[0], h[1], h[2], h[3]);
    if constexpr (kLo && !kF16) gdn_mma::stmatrix_x4(lrow + chunk, l[0], l[1], l[2], l[3]);
  }
}
// P = (q k^T) gated (p_entry's values, its gates by ex2) for a chunk whose raw q and k rows sit in
// the 128-byte-swizzled panel tiles qt, kt, shared by both warpgroups: warpgroup wgi forms columns
// j = 32 wgi .. 32 wgi + 31 (exact bf16 products: 8 m64n32k16 with B = k's rows from 32 wgi) and
// splits them into the hi / lo planes [i][j] at planes, planes + kDlPanel (row i, column j: the
// K-major layout of B = P^T and the N-major one of B = P). Ends with a CTA barrier, so either
// warpgroup's wgmma may read all of P.
// (Each warpgroup formed the whole of P for itself before: its epilogue was ~23 % of the forward
// scan's stall samples.) The caller has no product in flight (with one in flight, reading registers
// it wrote makes ptxas wait for it), and both warpgroups are done reading the previous chunk's P.
// kLo = false: the hi plane only (the plain instances' output products read no lo part).
template <bool kLo = true>
__device__ __forceinline__ void wg_p_planes(char* planes, const char* qt, const char* kt, const float* gsc,
                                            const float* rqc, const float* rkc, int wgi) {
  constexpr int kHalf = kC / 2;
  const int w = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  float pacc[kHalf / 2];
  wg::mma_abt_sync<kHalf, kDlD / 16>(pacc, qt, kDlPanel, kt + wgi * kHalf * 128, kDlPanel);
  // The row and column data of this thread's 2 rows and 8 columns read once, and the gates by ex2 of
  // log2-scaled differences (as bwd_chunk's CcThread): p_entry's expf and per-entry loads made this
  // epilogue ~42 instructions per entry, 16 % of the 27B forward scan (ncu, sixteenth round).
  const int i0 = 16 * w + g, j0 = kHalf * wgi + 2 * t;
  float g2i[2], rqi[2], g2j[kHalf / 4], rkj[kHalf / 4];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    g2i[hh] = gsc[i0 + 8 * hh] * kLog2e;
    rqi[hh] = rqc[i0 + 8 * hh];
  }
#pragma unroll
  for (int nb = 0; nb < kHalf / 8; ++nb) {
    const float2 gj = ld_f2(gsc + j0 + 8 * nb), rj = ld_f2(rkc + j0 + 8 * nb);
    g2j[2 * nb] = gj.x * kLog2e;
    g2j[2 * nb + 1] = gj.y * kLog2e;
    rkj[2 * nb] = rj.x;
    rkj[2 * nb + 1] = rj.y;
  }
  // the planes by stmatrix (acc_planes): element (i, 32 wgi + c) with c = 8 nb + 2 t + e
  acc_planes<kHalf, kLo>(planes, planes + kDlPanel, pacc, 0, kHalf * wgi, [&](float v, int i, int c) {
    const int hh = (i >> 3) & 1, q = 2 * (c >> 3) + (c & 1);
    return kHalf * wgi + c <= i ? rqi[hh] * rkj[q] * v * ex2_ftz(g2i[hh] - g2j[q]) : 0.f;
  });
  wg::fence_proxy_async();
  __syncthreads();
}

// Per chunk parity, the row arrays of the wgmma scans: ks = e^{G_L - G_i} rs_k(i), eq = e^{G_i} rs_q(i),
// G (past L: G_L, so e^{G_i - G_j} stays finite), rq, rk for P, beta and kbs = beta e^{G_i} rs_k(i).
// Rows >= L: scales and beta 0.
constexpr int kWgRows = 7 * kC;
// kEx2: the exponentials as ex2 of log2-scaled G (expf's range reduction is ~10 instructions each,
// at the top of every chunk, where the other warps wait at the barrier for these rows). Used by the
// plain forward's scan only: there it gained, in the scans that store their state it cost ~1 %.
template <bool kEx2 = false>
__device__ __forceinline__ void wg_store_rows(float* rows, int L, float gl, float gi, float2 r, float b, float vb) {
  const int i = threadIdx.x;
  if (i < kC) {
    const float egi = kEx2 ? ex2_ftz(gi * kLog2e) : expf(gi);
    rows[i] = (kEx2 ? ex2_ftz((gl - gi) * kLog2e) : expf(gl - gi)) * r.y;
    rows[kC + i] = egi * r.x;
    rows[2 * kC + i] = i < L ? gi : gl;
    rows[3 * kC + i] = r.x;
    rows[4 * kC + i] = r.y;
    rows[5 * kC + i] = vb;  // beta on v's rows: 0 in the split's M map (v = 0)
    rows[6 * kC + i] = b * egi * r.y;
  }
}
// The wgmma scans' next chunk (in either direction): G at its last valid row; G, the row scales and
// beta at row threadIdx.x (0 past the chunk).
struct WgGates {
  float gl = 0.f, gi = 0.f, b = 0.f;
  float2 r = make_float2(0.f, 0.f);
  __device__ void load(const float* Gc, const float* rs, const float* beta, int c0, int L, int Hk, int Hv, int head,
                       int kh) {
    const int i = threadIdx.x;
    gl = Gc[static_cast<size_t>(c0 + L - 1) * Hv + head];
    gi = 0.f;
    b = 0.f;
    r = make_float2(0.f, 0.f);
    if (i < L) {
      gi = Gc[static_cast<size_t>(c0 + i) * Hv + head];
      b = beta[static_cast<size_t>(c0 + i) * Hv + head];
      r = reinterpret_cast<const float2*>(rs)[static_cast<size_t>(c0 + i) * Hk + kh];
    }
  }
};

// The raw v rows of a chunk (plain [i][n] rows, stride kVLd: 16-byte aligned, the 8 rows of an
// ldmatrix hit 8 distinct 16-byte bank groups, and the transposed 2-byte reads 16 distinct banks per
// warp) and the x^T layout of load_tile_t read from them: x[4 j + 2 hh + e] = v[8 j + 2 t + e][n0 +
// g + 8 hh] for the warp's columns n0 = 64 wgi + 16 w. kLdsm: each 8 x 8 block (j, hh) is one
// ldmatrix.trans matrix (its thread l gets rows 2 (l % 4), + 1 of column l / 4), 4 ldmatrix.x4
// instead of 32 2-byte loads. That gained 2-3 % in the forward scan that forms only the output, and
// lost 1-4 % in the two that keep the state (call 11), which keep the 2-byte loads.
constexpr int kVLd = kDlD + 8;
template <bool kLdsm>
__device__ __forceinline__ void v_tile_t(float (&x)[kC / 2], const bf16* vs, int n0) {
  const int lane = threadIdx.x & 31;
  if constexpr (kLdsm) {
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int kb = 0; kb < kC / 16; ++kb) {
      uint32_t r[4];
      gdn_mma::ldmatrix_x4<true>(r, vs + (16 * kb + 8 * (m >> 1) + rr) * kVLd + n0 + 8 * (m & 1));
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
        const int q = 4 * (2 * kb + (mm >> 1)) + 2 * (mm & 1);
        x[q] = __uint_as_float(r[mm] << 16);
        x[q + 1] = __uint_as_float(r[mm] & 0xffff0000u);
      }
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kC / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) x[4 * j + 2 * hh + e] = to_f(vs[(8 * j + 2 * t + e) * kVLd + n0 + g + 8 * hh]);
  }
}

// kOut: the output O = diag(e^G rq) q S + P D of each chunk is formed here too (no output kernel,
// and h is not read back in the forward): O^T = (S^T q^T) diag(eq) + D^T P^T, with A = S^T (the
// fragments of the first product) and B = raw q (K-major), then A = D^T with B = P's planes
// (K-major): 2 x 8 + 3 x 4 more m64n64k16 per chunk, the q tile in each buffer and P per warpgroup.
// h and the D planes are stored only when given (the backward needs them; a forward that keeps no
// state passes nullptr).
template <bool kOut>
constexpr uint32_t scan_fwd_wg_buf() {  // T hi, T lo (one panel each), raw k (, raw q) panels, raw v rows
  return 2 * kDlPanel + (kOut ? 2 : 1) * kDlTile + kC * kVLd * 2;
}
template <bool kOut>
constexpr size_t scan_fwd_wg_smem() {
  return 2 * scan_fwd_wg_buf<kOut>() + (kOut ? 2 * kDlPanel : 0) + (2 * kWgRows + 48) * sizeof(float) + 1024;
}
static_assert(scan_fwd_wg_buf<true>() % 1024 == 0 && scan_fwd_wg_buf<false>() % 1024 == 0, "panels 1024-aligned");

// The split's state buffers (gdn_chunk_table_kernel's plan): per slot and value head a D x D fp32
// matrix, fragment-native [d][n] (store_state_t's layout): S entering the slot's segment, its map's
// M and E, and the reverse scan's G and F; flags [SplitState][slots][Hv] set when each is stored
// (signal_done).
struct SplitStates {
  float *S, *M, *E, *G, *F;
  int* flags;
  int slots;
  __device__ float* at(SplitState which, int slot, int Hv, int head) const {
    float* base = which == kStateS ? S : which == kStateM ? M : which == kStateE ? E : which == kStateG ? G : F;
    return base + (static_cast<size_t>(slot) * Hv + head) * kDlD * kDlD;
  }
  __device__ int* flag(SplitState which, int Hv) const { return flags + static_cast<size_t>(which) * slots * Hv; }
};
// sT (store_state_t's register layout) from a fragment-native D x D state.
__device__ __forceinline__ void load_state_t(float (&sT)[kDlD / 2], const float* src, int ncol, int t) {
#pragma unroll
  for (int j = 0; j < kDlD / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) sT[4 * j + 2 * hh + e] = src[gdn_mma::frag_index(8 * j + 2 * t + e, ncol + 8 * hh, kDlD)];
}
// S_out = M S_in + E (D x D, fragment-native), all 256 threads: the split's combine, ~fp32 products
// (hi / lo split, 3 mma per k step).
__device__ void combine_state(float* S_out, const float* M, const float* S_in, const float* E) {
  constexpr int D = kDlD;
  auto m_pair = [M](int i, int k) { return ld_f2(M + gdn_mma::frag_index(i, k, D)); };
  gdn_mma::for_tiles<4>(
      D, D,
      [&](float (&acc)[4][4], int m0, int n0) { mma_acc<4>(acc, m0, n0, 0, D, Gk<decltype(m_pair)>{m_pair}, NtT{S_in, D}); },
      Pair{[&](int i, int j, float v0, float v1) {
        const int o = gdn_mma::frag_index(i, j, D);
        const float2 e = ld_f2(E + o);
        *reinterpret_cast<float2*>(S_out + o) = make_float2(v0 + e.x, v1 + e.y);
      }});
}

// S_s for a kItemOutFromState item of segment index s (all threads): S_1 is the first segment's
// leaving state (its flag awaited); from s = 2 on S_s = M_{s-1} S_{s-1} + E_{s-1} is formed here once
// the predecessor's S and map are stored, and published for segment s + 1.
__device__ void split_entering_state(const SplitStates& st, int idx, int slot, int Hv, int head) {
  if (idx < 2) {
    wait_done(st.flag(kStateS, Hv), slot, Hv, head);
    return;
  }
  for (SplitState which : {kStateS, kStateM, kStateE}) wait_done(st.flag(which, Hv), slot - 1, Hv, head);
  combine_state(st.at(kStateS, slot, Hv, head), st.at(kStateM, slot - 1, Hv, head),
                st.at(kStateS, slot - 1, Hv, head), st.at(kStateE, slot - 1, Hv, head));
  signal_done(st.flag(kStateS, Hv), slot, Hv, head);  // its barrier makes S visible to this CTA too
}

// The forward scan CTA's current item (a fixed smem address: no register holds a pointer to it).
__shared__ WgScanItem scan_item;
__device__ __forceinline__ WgScanItem wg_scan_item(int ticket, const int* items, const int* vcu, const int* seq_off,
                                                   const int4* seginfo, int Hk, int Hv) {
  const int it = items[ticket / Hv], head = ticket % Hv, p = it >> 2;
  const int4 si = seginfo[p];
  const int bos = vcu[p], len = vcu[p + 1] - bos;
  return {head, head / (Hv / Hk), bos, len, (len + kC - 1) / kC, seq_off[p], p, it & 3, si.y, si.z, si.w};
}

// Each product batch is issued by warpgroup 0 before warpgroup 1's (wg::issue_after_wg0): forward
// +1.5-2 % at every shape in the sixteenth round.
// The next ticket of counts[counter] (of counts[count] x Hv), decoded into scan_item by thread 0; every
// thread returns whether there was one. Starts with a barrier: every thread is done with the last.
__device__ __forceinline__ bool take_scan_item(int* counts, int counter, int count, const int* items, const int* vcu,
                                               const int* seq_off, const int4* seginfo, int Hk, int Hv) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const int b = atomicAdd(counts + counter, 1);
    if (b < counts[count] * Hv) {
      scan_item = wg_scan_item(b, items, vcu, seq_off, seginfo, Hk, Hv);
    } else {
      scan_item.head = -1;
    }
  }
  __syncthreads();
  return scan_item.head >= 0;
}

// kMode: kPlain (no split: the code the scans were tuned with), kSplitOut (an output item of the
// split), kSplitMap (a map: kItemE from 0, kItemM from I with v = 0, i.e. beta 0 on v's rows; it
// stores nothing but its leaving state). kItemOutFromState starts from S_s (split_entering_state
// made it); a split sample's kItemOut stores its leaving state as S_1. The split items read their
// kind and slot again from smem (scan_item) after the chunk loop, so those are not held in registers
// across it.
enum ScanMode : int { kPlain = 0, kSplitOut = 1, kSplitMap = 2 };
// kWaitPrep (the plain forward's scan, beside prep): the item's first k, q, v tiles are issued before
// it waits for prep's flags of its chunks (prep_done), then T's and the gates.
template <bool kOut, bool kLoadsFirst, int kMode, bool kWaitPrep = false, bool kF16 = false>
__device__ __forceinline__ void scan_fwd_item(const WgScanItem& cta, unsigned char* smem_raw, float* h, bf16* Dgh,
                                              bf16* Dgl, bf16* o, const bf16* Th, const bf16* Tl, const bf16* qkv,
                                              const float* rs, const float* Gc, const float* beta,
                                              const SplitStates& st, int Hk, int Hv, int conv_dim, int* done,
                                              const int* prep_done = nullptr, float* scl = nullptr) {
  static_assert(!kF16 || (!kOut && kMode != kSplitMap), "fp16 stores: the backward's recompute only");
  constexpr int D = kDlD;
  constexpr uint32_t kBuf = scan_fwd_wg_buf<kOut>(), kTk = 2 * kDlPanel, kTq = kTk + kDlTile;
  constexpr uint32_t kTv = kTk + (kOut ? 2 : 1) * kDlTile;
  // The output instance without kLoadsFirst is the plain forward's (gdn_forward keeps no h, D there):
  // its state stores are compiled out, as the maps' are.
  constexpr bool kMap = kMode == kSplitMap;
  constexpr bool kStores = (!kOut || kLoadsFirst) && !kMap;
  // D's planes by store_planes_pair_t in the recompute's (and 2B kept forward's) instance: the kept
  // instance that forms the output lost 3-4 % with them, the ticket instance spilled.
  constexpr bool kPairStores = kStores && !kOut && kMode == kPlain;
  // The same instances store h under D's product batch (below), the others at the chunk's top.
  constexpr bool kHUnderBatch = kPairStores;
  // The plain instances form the output (bf16) from the hi parts of S, D and P (one product each,
  // as flash-linear-attention's bf16 h); the state recurrence, h and D keep the hi / lo products.
  // The ticket instance keeps hi / lo there too: with one product its registers spilled.
  constexpr bool kOutHi = kOut && kMode == kPlain;
  const int head = cta.head, kh = cta.kh, bos = cta.bos, len = cta.len, n = cta.n, first = cta.first;
  // A sample's first segment enters with state 0: its first h is not stored (rtable's kRtFirst).
  const bool zero_first = cta.kind == kItemOut;
  char* tiles = align1024(smem_raw);  // panels 1024-aligned
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  char* pplanes = tiles + 2 * kBuf;  // kOut: P hi, lo [i][j] (wg_p_planes)
  float* rows = reinterpret_cast<float*>(tiles + 2 * kBuf + (kOut ? 2 * kDlPanel : 0));  // [parity][kWgRows]
  const int ncol = 64 * wgi + 16 * w + g;  // this thread's state columns: ncol, ncol + 8
  const size_t w_ld = static_cast<size_t>(Hv) * D, x_ld = static_cast<size_t>(conv_dim);
  const bf16* qraw = qkv + static_cast<size_t>(kh) * D;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * D;
  const bf16* vraw = qkv + 2 * static_cast<size_t>(Hk) * D + static_cast<size_t>(head) * D;
  // with_t: T's tiles (prep's results); with_x: k, q, v (the input's)
  auto load_chunk = [&](int ci, int b, bool with_t = true, bool with_x = true) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    char* dst = tiles + b * kBuf;
    const size_t tb = (static_cast<size_t>(first + ci) * Hv + head) * kC * kC;
    if (with_t) {
      async_panels<256, kC>(dst, Th + tb, kC, kC);  // every row: T's padded rows are identity rows
      async_panels<256, kC>(dst + kDlPanel, Tl + tb, kC, kC);
    }
    if (with_x) {
      async_panels<256>(dst + kTk, kraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
      if constexpr (kOut) async_panels<256>(dst + kTq, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
      async_rows(reinterpret_cast<bf16*>(dst + kTv), kVLd, vraw + static_cast<size_t>(c0) * x_ld, x_ld, L, D);
    }
  };
  WgGates nx;
  if (n > 0) {
    if constexpr (kWaitPrep) {
      load_chunk(0, 0, false, true);
      wait_prep_chunks(prep_done, first, n, Hk, kh);
      load_chunk(0, 0, true, false);
    } else {
      load_chunk(0, 0);
    }
    nx.load(Gc, rs, beta, bos, min(kC, len), Hk, Hv, head, kh);
  }
  cp_async_commit();
  // S^T: rows ncol (regs 4 j + 0, 1) and ncol + 8 (4 j + 2, 3), columns d = 8 j + 2 t (+1).
  float sT[2 * D / 4];
  if (kMode == kSplitOut && cta.kind == kItemOutFromState) {
    load_state_t(sT, st.at(kStateS, cta.slot, Hv, head), ncol, t);  // split_entering_state made it
  } else {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          sT[4 * j + 2 * hh + e] = cta.kind == kItemM && 8 * j + 2 * t + e == ncol + 8 * hh ? 1.f : 0.f;
  }
  const float vb_on = kMap && cta.kind == kItemM ? 0.f : 1.f;
  // kF16: D of the last chunk, stored at this chunk's top once the top barrier has published its scale,
  // with the largest |D|, |v| of this thread's part of that chunk (the chunk's tile maxima).
  const size_t dcol = static_cast<size_t>(head) * D;
  auto store_d = [&](const float (&x)[kC / 2], int c0, int L, float s) {
#pragma unroll
    for (int j = 0; j < kC / 8; ++j)
      store_planes_pair_t<kF16>(Dgh + static_cast<size_t>(c0) * w_ld + dcol, Dgl + static_cast<size_t>(c0) * w_ld + dcol,
                                w_ld, L, 8 * j, 64 * wgi + 16 * w, {x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]},
                                g, t, s);
  };
  float dprev[kF16 ? kC / 2 : 1], m_d = 0.f, m_v = 0.f;
  float* red = rows + 2 * kWgRows;  // kF16: [parity][h, D, v][8]
  for (int ci = 0; ci < n; ++ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC), buf = ci & 1;
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = nx.gl;
    const float* rw = rows + buf * kWgRows;  // two copies: the other warpgroup may still read the last chunk's
    wg_store_rows<!kStores && kOut>(rows + buf * kWgRows, L, gl, nx.gi, nx.r, nx.b, kMap ? nx.b * vb_on : nx.b);
    if (ci + 1 < n) nx.load(Gc, rs, beta, c0 + kC, min(kC, len - (ci + 1) * kC), Hk, Hv, head, kh);
    cp_async_wait<0>();  // this chunk's tiles
    wg::fence_proxy_async();
    if constexpr (kF16) {  // h's maximum, and the last chunk's D's and v's
      float m = 0.f;
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) m = fmaxf(m, fabsf(sT[r]));
      publish_max(m, red + 24 * buf);
      publish_max(m_d, red + 24 * buf + 8);
      publish_max(m_v, red + 24 * buf + 16);
    }
    __syncthreads();  // tiles and rows visible; both warpgroups are done with the other buffer
    // The next chunk's tiles into the other buffer: issued under the first product batch (below),
    // unless kLoadsFirst (the instance that forms the output and keeps the state: there that cost
    // the training path 2-3 %, though the forward alone gained 3-5 %).
    if constexpr (kLoadsFirst) {
      if (ci + 1 < n) load_chunk(ci + 1, buf ^ 1);
      cp_async_commit();
    }
    const char* cur = tiles + buf * kBuf;

    // h[chunk] = the state entering the chunk (fragment-native K x V), here or under D's batch.
    float s_h = 1.f;  // kF16: h's tile scale
    if constexpr (kF16) {
      s_h = published_scale(red + 24 * buf);
      if (tid == 0) scl[(chunk * Hv + head) * kSclFloats + kSclH] = s_h;
      if (ci > 0) {
        const float s_d = published_scale(red + 24 * buf + 8);
        if (tid == 0) {
          scl[((chunk - 1) * Hv + head) * kSclFloats + kSclD] = s_d;
          scl[((chunk - 1) * Hv + head) * kSclFloats + kSclV] = published_scale(red + 24 * buf + 16);
        }
        if (Dgh != nullptr) store_d(dprev, c0 - kC, kC, s_d);  // every chunk but a sample's last is full
      }
    }
    auto store_h = [&] {
      if constexpr (kF16)
        store_state_t<true>(reinterpret_cast<__half*>(h) + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t, s_h);
      else
        store_state_t<!kOut>(h + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t);
    };
    const bool h_stored = h != nullptr && (ci > 0 || !zero_first);
    if (kStores && !kHUnderBatch && h_stored) store_h();
    if constexpr (kOut) wg_p_planes<!kOutHi>(pplanes, cur + kTq, cur + kTk, rw + 2 * kC, rw + 3 * kC, rw + 4 * kC, wgi);

    // D = U - W S = T Y with Y = diag(b) V - diag(kbs) k S (W = T diag(kbs) k and U = T diag(b) V are
    // never formed). First acc = S^T k^T (kOut: and oT = S^T q^T, same fragments; k, q exact).
    float acc[kC / 2], oT[kC / 2];
    {
      uint32_t ah[D / 16][4], al[D / 16][4];
      state_frags_t(sT, ah, al);
      const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur + kTk, 16, 1024));
      const uint64_t q0 = wg::desc_opaque(wg::desc_sw128(cur + kTq, 16, 1024));
      wg::issue_after_wg0(wgi, 1);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * kDlPanel + (kk % 4) * 32;
        wg::mma_m64n64k16_rs<0>(acc, ah[kk], wg::desc_advance(k0, off), kk > 0);
        wg::mma_m64n64k16_rs<0>(acc, al[kk], wg::desc_advance(k0, off), 1);
        if constexpr (kOut) {
          wg::mma_m64n64k16_rs<0>(oT, ah[kk], wg::desc_advance(q0, off), kk > 0);
          if constexpr (!kOutHi) wg::mma_m64n64k16_rs<0>(oT, al[kk], wg::desc_advance(q0, off), 1);
        }
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 1);
      if constexpr (!kLoadsFirst) {
        if (ci + 1 < n) load_chunk(ci + 1, buf ^ 1);
        cp_async_commit();
      }
      wg::wait<0>();
    }
    wg::fence_operands(acc);
    if constexpr (kOut) wg::fence_operands(oT);
    // Y^T = V^T diag(b) - acc diag(kbs) as A fragments, then D^T = Y^T T^T (B = T's planes, K-major).
    float dT[kC / 2];
    {
      uint32_t yh[kC / 16][4], yl[kC / 16][4];
      float vT[kC / 2];
      v_tile_t<kOut && !kLoadsFirst>(vT, reinterpret_cast<const bf16*>(cur + kTv), 64 * wgi + 16 * w);
      if constexpr (kF16) {  // the CTA's vT together hold the whole v tile
        m_v = 0.f;
#pragma unroll
        for (int r = 0; r < kC / 2; ++r) m_v = fmaxf(m_v, fabsf(vT[r]));
      }
#pragma unroll
      for (int j = 0; j < kC / 8; ++j) {
        const float2 bv = ld_f2(rw + 5 * kC + 8 * j + 2 * t), kv = ld_f2(rw + 6 * kC + 8 * j + 2 * t);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          gdn_mma::split_bf16(bv.x * vT[4 * j + 2 * hh] - kv.x * acc[4 * j + 2 * hh],
                              bv.y * vT[4 * j + 2 * hh + 1] - kv.y * acc[4 * j + 2 * hh + 1],
                              yh[j >> 1][hh + 2 * (j & 1)], yl[j >> 1][hh + 2 * (j & 1)]);
      }
      const uint64_t th0 = wg::desc_opaque(wg::desc_sw128(cur, 16, 1024));
      const uint64_t tl0 = wg::desc_opaque(wg::desc_sw128(cur + kDlPanel, 16, 1024));
      wg::issue_after_wg0(wgi, 2);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        wg::mma_m64n64k16_rs<0>(dT, yh[kk], wg::desc_advance(th0, kk * 32), kk > 0);
        wg::mma_m64n64k16_rs<0>(dT, yl[kk], wg::desc_advance(th0, kk * 32), 1);
        wg::mma_m64n64k16_rs<0>(dT, yh[kk], wg::desc_advance(tl0, kk * 32), 1);
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 2);
      // h[chunk] under this batch (the recompute's, the 2B kept forward's instance): the warps' wait for
      // the 16 stores to drain overlaps the tensor work (recompute scan 27B -3.5 %; under the first
      // batch it lost 2 %; the kept output instance lost 6-12 % under either and stores at the top).
      if (kHUnderBatch && h_stored) store_h();
      wg::wait<0>();
    }
    wg::fence_operands(dT);
    if constexpr (kF16) {
      m_d = 0.f;
#pragma unroll
      for (int r = 0; r < kC / 2; ++r) {
        m_d = fmaxf(m_d, fabsf(dT[r]));
        dprev[r] = dT[r];
      }
    }

    // D out as planes (each 8 x 8 block of D^T transposed by movmatrix, so a lane stores a pair
    // adjacent in n), (ks D)^T as the update's A fragments, kOut: D^T as the output's, and oT's
    // columns scaled by eq_i.
    const size_t dbase = static_cast<size_t>(c0) * w_ld + static_cast<size_t>(head) * D;
    uint32_t ph[kC / 16][4], pl[kC / 16][4], xh[kC / 16][4], xl[kC / 16][4];
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      const float2 kv = ld_f2(rw + 8 * j + 2 * t);
      const float2 ev = ld_f2(rw + kC + 8 * j + 2 * t);
      if (kPairStores && !kF16 && Dgh != nullptr)
        store_planes_pair_t(Dgh + dbase, Dgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w,
                            {dT[4 * j], dT[4 * j + 1], dT[4 * j + 2], dT[4 * j + 3]}, g, t);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float x0 = dT[4 * j + 2 * hh], x1 = dT[4 * j + 2 * hh + 1];
        if (kStores && !kPairStores && !kF16 && Dgh != nullptr)
          store_planes_t(Dgh + dbase, Dgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w + 8 * hh, x0, x1, g, t);
        const int kk = j >> 1, q = hh + 2 * (j & 1);
        gdn_mma::split_bf16(kv.x * x0, kv.y * x1, ph[kk][q], pl[kk][q]);
        if constexpr (kOut) {
          if constexpr (kOutHi)
            xh[kk][q] = gdn_mma::pack_bf16(x0, x1);
          else
            gdn_mma::split_bf16(x0, x1, xh[kk][q], xl[kk][q]);
          oT[4 * j + 2 * hh] *= ev.x;
          oT[4 * j + 2 * hh + 1] *= ev.y;
        }
      }
    }

    // S^T = e^{G_L} S^T + (ks D)^T k: B = the raw k rows, N-major (64-column blocks kDlPanel apart);
    // kOut: oT += D^T P^T, B = P's planes, K-major. Not in a plain recompute's last chunk: the state
    // leaving the sample is never read there.
    if (kOut || kMode != kPlain || ci + 1 < n) {
      const float egl = expf(gl);
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) sT[r] *= egl;
      {
        const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur + kTk, kDlPanel, 1024));
        const uint64_t p0 = wg::desc_opaque(wg::desc_sw128(pplanes, 16, 1024));
        wg::issue_after_wg0(wgi, 3);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          wg::mma_m64n128k16_rs<1>(sT, ph[kk], wg::desc_advance(k0, kk * 2048), 1);
          wg::mma_m64n128k16_rs<1>(sT, pl[kk], wg::desc_advance(k0, kk * 2048), 1);
        }
        if constexpr (kOut) {
#pragma unroll
          for (int kk = 0; kk < kC / 16; ++kk) {
            wg::mma_m64n64k16_rs<0>(oT, xh[kk], wg::desc_advance(p0, kk * 32), 1);
            if constexpr (!kOutHi) {
              wg::mma_m64n64k16_rs<0>(oT, xl[kk], wg::desc_advance(p0, kk * 32), 1);
              wg::mma_m64n64k16_rs<0>(oT, xh[kk], wg::desc_advance(p0, kDlPanel + kk * 32), 1);
            }
          }
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 3);
        wg::wait<0>();
      }
      wg::fence_operands(sT);
    }
    if constexpr (kOut) {
      wg::fence_operands(oT);
      // O rows i < L as bf16 (8 x 8 blocks of O^T transposed by movmatrix, as the D planes).
#pragma unroll
      for (int j = 0; j < kC / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t v = gdn_mma::movmatrix_trans(gdn_mma::pack_bf16(oT[4 * j + 2 * hh], oT[4 * j + 2 * hh + 1]));
          if (8 * j + g < L)
            *reinterpret_cast<uint32_t*>(o + dbase + static_cast<size_t>(8 * j + g) * w_ld + 64 * wgi + 16 * w + 8 * hh +
                                         2 * t) = v;
        }
    }
  }
  cp_async_wait<0>();
  if constexpr (kF16) {  // the last chunk's D
    if (n > 0) {
      publish_max(m_d, red + 24 * (n & 1) + 8);
      publish_max(m_v, red + 24 * (n & 1) + 16);
      __syncthreads();
      const float s_d = published_scale(red + 24 * (n & 1) + 8);
      const size_t last = static_cast<size_t>(first + n - 1);
      if (tid == 0) {
        scl[(last * Hv + head) * kSclFloats + kSclD] = s_d;
        scl[(last * Hv + head) * kSclFloats + kSclV] = published_scale(red + 24 * (n & 1) + 16);
      }
      if (Dgh != nullptr) store_d(dprev, bos + (n - 1) * kC, len - (n - 1) * kC, s_d);
    }
  }
  if constexpr (kMode == kPlain) {
    if constexpr (!kOut) signal_done_counted(done, cta.p, Hv, head);
    return;
  }
  // The leaving state where the split needs it: a map's M or E, a split sample's S_1.
  const volatile WgScanItem* vit = &scan_item;
  const int kind = vit->kind, slot = vit->slot;
  if (kind != kItemOut || vit->nseg > 1) {
    const SplitState which = kind == kItemE ? kStateE : kind == kItemM ? kStateM : kStateS;
    const int to = which == kStateS ? slot + 1 : slot, hd = vit->head;
    store_state_t(st.at(which, to, Hv, hd), sT, ncol, t);
    signal_done(st.flag(which, Hv), to, Hv, hd);
  }
  if constexpr (!kOut && !kMap) signal_done_counted(done, vit->p, Hv, vit->head);
}

// The forward scan. Plain: CTA b runs (segment of rank b / Hv, head b % Hv) from state 0, as the
// scans were tuned (no split). kTickets (a forward with a long sample, split_possible): the CTAs take
// (item, value head) tickets in the plan's order until none are left (gdn_chunk_table_kernel zeroes
// the counter); an item that waits for another's state waits only for one of a smaller ticket, taken
// by a running CTA. The ticket walk costs the chat mix's forward ~5 % (its per-item code in a loop;
// launched beside the plain one, each returning at once where the plan was the other's, 8-10 %), so
// it runs only where a long sample may be split.
template <bool kOut, bool kLoadsFirst = false, bool kTickets = false, bool kF16 = false>
__global__ void __launch_bounds__(256, 1) gdn_scan_fwd_wgmma_kernel(float* h, bf16* Dgh, bf16* Dgl, bf16* o,
                                                                    const bf16* Th, const bf16* Tl, const bf16* qkv,
                                                                    const float* rs, const float* Gc,
                                                                    const float* beta, const int* vcu,
                                                                    const int* seq_off, const int* seq_order,
                                                                    const int4* seginfo, const int* items,
                                                                    int* counts, SplitStates st, int Hk, int Hv,
                                                                    int conv_dim, int* done, const int* prep_done,
                                                                    float* scl) {
  // The backward's recompute (no output): its reverse scan needs none of this kernel's results. The
  // output instances keep the code they were tuned with (the flag cost the forward 3-4 %).
  if constexpr (!kOut) launch_dependents();
  // The plain forward's instance starts beside prep (gdn_forward, prep_done given): the table
  // kernel's results are visible once one prep CTA's flag is (it waited for that grid), each item's
  // chunks once theirs are. Prep's last wave then overlaps the first items. Not the kept instance:
  // there the changed item start cost 7-9 % (measured with bench_gdn 10).
  constexpr bool kBesidePrep = kOut && !kLoadsFirst && !kTickets;
  if constexpr (kBesidePrep) wait_prep_chunks(prep_done, 0, 1, Hk, 0);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if constexpr (!kTickets) {
    if constexpr (kBesidePrep) {
      scan_fwd_item<kOut, kLoadsFirst, kPlain, true>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, h, Dgh,
                                                     Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv, conv_dim, done,
                                                     prep_done);
    } else {
      scan_fwd_item<kOut, kLoadsFirst, kPlain, false, kF16>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, h,
                                                            Dgh, Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv,
                                                            conv_dim, done, nullptr, scl);
    }
  } else {
    WgScanItem& item = scan_item;
    while (take_scan_item(counts, 2, 0, items, vcu, seq_off, seginfo, Hk, Hv)) {
      // The maps form no output and store no h, D: the output-free code.
      if (item.kind == kItemE || item.kind == kItemM) {
        scan_fwd_item<false, false, kSplitMap>(WgScanItem(item), smem_raw, h, Dgh, Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv,
                                          conv_dim, done);
      } else {
        if (item.kind == kItemOutFromState) split_entering_state(st, item.idx, item.slot, Hv, item.head);
        // (The output items with their loads first: the other order spills here.)
        scan_fwd_item<kOut, true, kSplitOut, false, kF16>(WgScanItem(item), smem_raw, h, Dgh, Dgl, o, Th, Tl, qkv, rs, Gc,
                                                           beta, st, Hk, Hv, conv_dim, done, nullptr, scl);
      }
    }
  }
}

// ---- backward reverse state scan -------------------------------------------------------------------

// As the forward scan: raw q, k, dO tiles, W as its planes, dS fp32 in the update's registers with
// hi / lo planes for the dD product, -dD as planes for the update; 115,200 bytes at K = V = 128,
// bv = 32: 2 CTAs per SM.
int scan_bwd_smem_floats(int K, int bv) {
  return K * bv_ld(bv) + kC * raw_ld(K) + kC * raw_ld(K) + kC * bv_ld(bv) / 2 + kC * bv_ld(bv) + kC * (bv + 4) +
         2 * kC;
}
// The fused variant (scan_bwd_fused): q and dO double-buffered, no dD_local tile, three more row
// arrays; P^T (fp32, stride kLdP) lives in the idle q buffer. 227,584 bytes at K = bv = 128.
int scan_bwd_fused_smem_floats(int K, int bv) {
  return K * bv_ld(bv) + kC * raw_ld(K) + kC * raw_ld(K) / 2 + kC * raw_ld(K) + kC * bv_ld(bv) + kC * bv_ld(bv) +
         5 * kC;
}
// dD_local = P^T dO is formed inside the reverse scan (no gdn_dlocal_kernel, no dD round trip)
// where the smem allows it: one 16-warp CTA per (sample, head) (bv = 128) at dk = 128, where P^T
// fits the spare q buffer.
bool scan_bwd_fused(int K, int bv) {
  return bv == 128 && K == 128 && kC * kLdP <= kC * raw_ld(K) / 2 &&
         scan_bwd_fused_smem_floats(K, bv) * sizeof(float) <= 227 * 1024;
}

// dh[chunk] = dL/d(state leaving the chunk); full dD = dD_local + diag(e^{G_L-G}) K^ dS, as its planes
// dDgh, dDgl [T, Hv, V];
// dS <- e^{G_L} dS + (Q^ . e^G)^T dO - W^T dD. q^ = q rs[., 0], k^ = k rs[., 1] (rs from
// gdn_prep_kernel, kept in the state): the dD product takes the raw k and scales its rows in the
// epilogue, the dS product folds e^{G_i} rs_i into the dO rows.
// Pipelined, two barriers per chunk: q, W, dO of chunk c load (cp.async) during the dD product and
// are waited on before (B), k and dD_local of chunk c-1 during the dS update (waited on before the
// next (A)), the gates and row scales of chunk c-1 into registers during chunk c.
// kMaxThreads as gdn_scan_fwd_kernel's (2 CTAs per SM at 256, 1 at 512: 128 registers either way).
// kFused (scan_bwd_fused): dD_local = P^T dO of each chunk is formed here instead of read: q and dO
// of chunk c - 1 load with its k during chunk c's update (two buffers each), P^T is built at the
// start of the chunk into the q buffer of the chunk after (dead by then), one more barrier, and
// the dD product takes P^T dO as a second accumulator.
template <int kMaxThreads, bool kFused>
__global__ void __launch_bounds__(kMaxThreads, 512 / kMaxThreads)
    gdn_scan_bwd_kernel(float* dh, bf16* dDgh, bf16* dDgl, const float* dD, const bf16* Wh, const bf16* Wl,
                        const bf16* qkv, const float* rs, const float* Gc, const bf16* d_o, const int32_t* cu,
                        const int* seq_off, const int* seq_order, int Hk, int Hv, int K, int V, int conv_dim, int bv) {
  const ScanBlock sb = scan_block(seq_order, Hv, V, bv);
  const int s = sb.s, head = sb.head, e0 = sb.e0, kh = head / (Hv / Hk);
  const int bos = cu[s], len = cu[s + 1] - bos, n = (len + kC - 1) / kC, first = seq_off[s];
  extern __shared__ float smem[];
  Carve cv{smem};
  const int lds = bv_ld(bv), ldr = raw_ld(K), ldl = bv + 4;
  bf16* Sh = reinterpret_cast<bf16*>(cv.take(K * lds / 2));  // planes of dS
  bf16* Sl = reinterpret_cast<bf16*>(cv.take(K * lds / 2));
  bf16* Whs = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Wls = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* Kb = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));  // raw k rows
  // Raw q rows and dO columns e0..; fused: two buffers each, chunk c in buffer c & 1 (selects, not an
  // indexed array, which would live in local memory).
  bf16* const Q0 = reinterpret_cast<bf16*>(cv.take(kC * ldr / 2));
  bf16* const Q1 = kFused ? reinterpret_cast<bf16*>(cv.take(kC * ldr / 2)) : Q0;
  bf16* const dO0 = reinterpret_cast<bf16*>(cv.take(kC * lds / 2));
  bf16* const dO1 = kFused ? reinterpret_cast<bf16*>(cv.take(kC * lds / 2)) : dO0;
  auto qbuf = [&](int c) { return (c & 1) ? Q1 : Q0; };
  auto dobuf = [&](int c) { return (c & 1) ? dO1 : dO0; };
  bf16* Dh = reinterpret_cast<bf16*>(cv.take(kC * lds / 2));  // planes of -dD
  bf16* Dl = reinterpret_cast<bf16*>(cv.take(kC * lds / 2));
  float* dDl = kFused ? nullptr : cv.take(kC * ldl);  // dD_local columns e0.. of the chunk (cp.async with its k)
  float* ks = cv.take(kC);                              // e^{G_L - G_i} rs_k(i)
  float* eq = cv.take(kC);                              // e^{G_i} rs_q(i)
  float* gsc = kFused ? cv.take(kC) : nullptr;          // fused: the chunk's G (rows past L: G_L), rq, rk
  float* rqc = kFused ? cv.take(kC) : nullptr;
  float* rkc = kFused ? cv.take(kC) : nullptr;
  const size_t w_ld = static_cast<size_t>(Hv) * K, x_ld = static_cast<size_t>(conv_dim);
  const size_t d_ld = static_cast<size_t>(Hv) * V;
  const bf16* qraw = qkv + static_cast<size_t>(kh) * K;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * K;
  const float2* rs2 = reinterpret_cast<const float2*>(rs);
  for (int idx = threadIdx.x; idx < K * lds; idx += blockDim.x) Sh[idx] = Sl[idx] = __float2bfloat16(0.f);
  ScanState dS = {};
  // Next chunk (in reverse order): G at its last valid row, G and the row scales at row threadIdx.x.
  float gl_next = 0.f, gi_next = 0.f;
  float2 r_next = make_float2(0.f, 0.f);
  if (n > 0) {
    const int c0 = bos + (n - 1) * kC, L0 = len - (n - 1) * kC;
    async_rows(Kb, ldr, kraw + static_cast<size_t>(c0) * x_ld, x_ld, L0, K);
    if constexpr (kFused) {
      async_rows(qbuf(n - 1), ldr, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L0, K);
      async_rows(dobuf(n - 1), lds, d_o + (static_cast<size_t>(c0) * Hv + head) * V + e0, d_ld, L0, bv);
    } else {
      async_rows(dDl, ldl, dD + static_cast<size_t>(c0) * d_ld + static_cast<size_t>(head) * V + e0, d_ld, L0, bv);
    }
    gl_next = Gc[static_cast<size_t>(c0 + L0 - 1) * Hv + head];
    if (threadIdx.x < L0) {
      gi_next = Gc[static_cast<size_t>(c0 + threadIdx.x) * Hv + head];
      r_next = rs2[static_cast<size_t>(c0 + threadIdx.x) * Hk + kh];
    }
  }
  cp_async_commit();
  for (int ci = n - 1; ci >= 0; --ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = gl_next;
    bf16* const Qb = qbuf(ci);
    bf16* const dOs = dobuf(ci);
    // Rows >= L: scales 0 (their q, k, dO, dD_local are zero too). ks is last read by the previous
    // chunk's dD product (before its barrier (B)), eq by its dS update, so eq waits for (A).
    const float eqi = expf(gi_next) * r_next.x;
    if (threadIdx.x < kC) ks[threadIdx.x] = expf(gl - gi_next) * r_next.y;
    if constexpr (kFused) {  // read by the P build before (B), as ks
      if (threadIdx.x < kC) {
        gsc[threadIdx.x] = threadIdx.x < L ? gi_next : gl;  // past L: G_L, so e^{G_i - G_j} stays finite
        rqc[threadIdx.x] = r_next.x;
        rkc[threadIdx.x] = r_next.y;
      }
    }
    if (ci > 0) {  // chunk ci - 1 is full (only a sample's last chunk is partial)
      const int cp = c0 - kC;
      gl_next = Gc[static_cast<size_t>(cp + kC - 1) * Hv + head];
      if (threadIdx.x < kC) {
        gi_next = Gc[static_cast<size_t>(cp + threadIdx.x) * Hv + head];
        r_next = rs2[static_cast<size_t>(cp + threadIdx.x) * Hk + kh];
      }
    }
    cp_async_wait<0>();  // k and dD_local (fused: k, q and dO) of this chunk
    __syncthreads();     // (A) they, ks and the dS planes visible; the previous update finished (W, q, dO, eq, -dD free)
    if (threadIdx.x < kC) eq[threadIdx.x] = eqi;  // read after (B) only
    const size_t wo = (static_cast<size_t>(c0) * Hv + head) * K;
    async_rows(Whs, ldr, Wh + wo, w_ld, L, K);
    async_rows(Wls, ldr, Wl + wo, w_ld, L, K);
    if constexpr (!kFused) {
      async_rows(Qb, ldr, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L, K);
      async_rows(dOs, lds, d_o + (static_cast<size_t>(c0) * Hv + head) * V + e0, d_ld, L, bv);
    }
    cp_async_commit();
    store_state(dh + (chunk * Hv + head) * static_cast<size_t>(K) * V, V, e0, dS, K, bv);
    // Fused: P^T of this chunk into the other q buffer (its q was the previous chunk's, done).
    float* Pt = reinterpret_cast<float*>(qbuf(ci + 1));
    if constexpr (kFused) {
      build_pt<kMaxThreads>(Pt, Qb, Kb, ldr, K, gsc, rqc, rkc);
      __syncthreads();  // (P) P^T complete
    }
    // dD += diag(e^{G_L - G} rs_k) k dS (rows >= L: 0); the planes get -dD.
    auto dd_epi = [&](int i, int e, float l0, float l1, float v0, float v1) {
      float x0 = 0.f, x1 = 0.f;
      if (i < L) {
        x0 = l0 + ks[i] * v0;
        x1 = l1 + ks[i] * v1;
        store_split(dDgh, dDgl, (static_cast<size_t>(c0 + i) * Hv + head) * V + e0 + e, x0, x1);
      }
      store_split(Dh, Dl, i * lds + e, -x0, -x1);
    };
    if constexpr (kFused) {
      // dD_local_j = sum_{i >= j} P_ij dO_i: A = P^T (rows j, pairs along i), B = the raw dO rows.
      for_tiles_m2<1, 2>(
          kC, bv,
          [&](auto& a1, auto& a2, int m0, int n0) {
            if (m0 >= L) return;
            mma_acc(a1[0], m0, n0, m0, kC, Gk{[&](int j, int i) { return ld_f2(Pt + j * kLdP + i); }},
                    Ld<true>{dOs, lds});
            mma_acc(a2[0], m0, n0, 0, K, Ld<false>{Kb, ldr}, Ld2<true>{Sh, Sl, lds});
          },
          Pair{dd_epi});
    } else {
      for_tiles<2>(
          kC, bv,
          [&](auto& acc, int m0, int n0) {
            if (m0 >= L) return;
            mma_acc(acc, m0, n0, 0, K, Ld<false>{Kb, ldr}, Ld2<true>{Sh, Sl, lds});
          },
          Pair{[&](int i, int e, float v0, float v1) {
            float x0 = 0.f, x1 = 0.f;
            if (i < L) {
              const float2 d = *reinterpret_cast<const float2*>(dDl + i * ldl + e);
              x0 = d.x + ks[i] * v0;
              x1 = d.y + ks[i] * v1;
              store_split(dDgh, dDgl, (static_cast<size_t>(c0 + i) * Hv + head) * V + e0 + e, x0, x1);
            }
            store_split(Dh, Dl, i * lds + e, -x0, -x1);
          }});
    }
    cp_async_wait<0>();  // W (unfused: q, W, dO) of this chunk
    __syncthreads();     // (B) they, the -dD planes and eq are visible; Kb, dDl (P^T) and the dS planes free
    if (ci > 0) {
      async_rows(Kb, ldr, kraw + static_cast<size_t>(c0 - kC) * x_ld, x_ld, kC, K);
      if constexpr (kFused) {
        async_rows(qbuf(ci - 1), ldr, qraw + static_cast<size_t>(c0 - kC) * x_ld, x_ld, kC, K);
        async_rows(dobuf(ci - 1), lds, d_o + (static_cast<size_t>(c0 - kC) * Hv + head) * V + e0, d_ld, kC, bv);
      } else {
        async_rows(dDl, ldl, dD + static_cast<size_t>(c0 - kC) * d_ld + static_cast<size_t>(head) * V + e0, d_ld,
                   kC, bv);
      }
    }
    cp_async_commit();
    scan_update_state<kMaxThreads>(
        dS, K, bv, expf(gl), Sh, Sl, lds,
        [&](float (&acc)[2][4], int m0, int n0) {
          mma_acc<2, 4, true>(acc, m0, n0, 0, kC, Ld<true>{Qb, ldr}, LdKs{dOs, lds, eq});
          mma_acc(acc, m0, n0, 0, kC, Ld2<true>{Whs, Wls, ldr}, Ld2<true>{Dh, Dl, lds});
        },
        [&](float (&acc)[2][2][4], int m0, int n0, int ms) {
          mma_acc_m<2, 2>(acc, m0, n0, 0, kC, Ld<true>{Qb, ldr}, LdKs{dOs, lds, eq}, ms);
          mma_acc_m<2, 2>(acc, m0, n0, 0, kC, Ld2<true>{Whs, Wls, ldr}, Ld2<true>{Dh, Dl, lds}, ms);
        });
  }
  cp_async_wait<0>();
}

// ---- backward reverse state scan on wgmma (dk = dv = 128) ------------------------------------------
// The forward wgmma scan's structure in reverse: warpgroup wg keeps dS^T (its 64 state columns n,
// transposed) in its m64n128 accumulator. Per chunk, last to first:
//   dD^T = dD_local^T + (dS^T k^T) diag(ks)  A = dS^T split from the registers, B = raw k (K-major):
//                                            2 x 8 m64n64k16; the column scales ks after a wait;
//   dS^T = e^{G_L} dS^T + (diag(eq) dO)^T q - dD^T W,  with W^T dD = k^T diag(kbs) T^T dD:
//                                            A = (eq dO)^T (ldmatrix.trans of the raw dO rows, scaled
//                                            and split in registers) with B = raw q (N-major): 2 x 4
//                                            m64n128k16; Z^T = -dD^T T (A = -dD^T split from the
//                                            accumulator, B = T's planes, N-major: 3 x 4 m64n64k16),
//                                            then A = Z^T diag(kbs) with B = raw k: 2 x 4 m64n128k16.
// ks_i = e^{G_L - G_i} rs_k(i), eq_i = e^{G_i} rs_q(i), kbs_i = b_i e^{G_i} rs_k(i). k, q, T, dO
// (128-byte-swizzled panels) of chunk c - 1 load during chunk c (two buffers), one barrier per chunk.
// kFused: dD_local^T = dO^T P is formed here (P = q k^T gated, by each warpgroup for itself: 8
// m64n64k16 issued ahead of the dS^T k^T product, then split into hi / lo planes in the warpgroup's
// smem; A = dO^T M-major: 2 x 4 m64n64k16), so there is no dlocal kernel and no dD_local round trip;
// else dD_local is read from gdn_dlocal_wgmma_kernel's output. 133 / 165 KB of smem.
constexpr uint32_t kScanBwdBuf = 4 * kDlTile;  // raw k, raw q, T hi + lo, dO
template <bool kFused>
constexpr size_t scan_bwd_wg_smem() {
  return 2 * kScanBwdBuf + (kFused ? 2 * kDlPanel : 0) + (2 * kWgRows + 48) * sizeof(float) + 1024;
}

// The reverse scan's split (the forward's transposed, docs/gdn_kernels.md section 4): the gradient
// entering a segment is M_s^T (the gradient leaving it) + F_s. Items (gdn_chunk_table_kernel):
//   kRevOut: a sample's last segment from 0 (every unsplit sample is one); a split sample's stores
//            its entering gradient G_{k-1};
//   kRevF: a middle segment's F_s (from 0, no dh, dD stores), stored;
//   kRevOutFromGrad: an earlier segment s from G_{s+1}, which the item forms first where s + 1 is a
//            middle segment (G_{s+1} = M_{s+1}^T G_{s+2} + F_{s+1}, M from the forward's maps) and
//            publishes for segment s - 1.
// S_out = M^T G + F (D x D, fragment-native), all 256 threads.
__device__ void combine_state_t(float* S_out, const float* M, const float* G, const float* F) {
  constexpr int D = kDlD;
  auto mt = [M](int i, int k) { return M[gdn_mma::frag_index(k, i, D)]; };  // M^T(i, k)
  gdn_mma::for_tiles<4>(
      D, D, [&](float (&acc)[4][4], int m0, int n0) { mma_acc<4>(acc, m0, n0, 0, D, mt, NtT{G, D}); },
      Pair{[&](int i, int j, float v0, float v1) {
        const int o = gdn_mma::frag_index(i, j, D);
        const float2 f = ld_f2(F + o);
        *reinterpret_cast<float2*>(S_out + o) = make_float2(v0 + f.x, v1 + f.y);
      }});
}
// The gradient leaving segment s (index idx of nseg) of a kRevOutFromGrad item, G_{s+1}, at slot + 1
// on return (all threads).
__device__ void split_leaving_gradient(const SplitStates& st, int idx, int nseg, int slot, int Hv, int head) {
  if (idx + 1 == nseg - 1) {  // the last segment's entering gradient
    wait_done(st.flag(kStateG, Hv), slot + 1, Hv, head);
    return;
  }
  wait_done(st.flag(kStateG, Hv), slot + 2, Hv, head);
  wait_done(st.flag(kStateF, Hv), slot + 1, Hv, head);
  wait_done(st.flag(kStateM, Hv), slot + 1, Hv, head);
  combine_state_t(st.at(kStateG, slot + 1, Hv, head), st.at(kStateM, slot + 1, Hv, head),
                  st.at(kStateG, slot + 2, Hv, head), st.at(kStateF, slot + 1, Hv, head));
  signal_done(st.flag(kStateG, Hv), slot + 1, Hv, head);  // its barrier makes G visible to this CTA too
}

// Each product batch is issued by warpgroup 0 before warpgroup 1's (wg::issue_after_wg0).
// kMode: kPlain (no split: the code as tuned) or kSplitOut (every split item, kRevF with its dh, dD
// stores off). The split items read their kind and slot again from smem (scan_item) after the chunk
// loop.
template <bool kFused, int kMode, bool kF16 = false>
__device__ __forceinline__ void scan_bwd_item(const WgScanItem& cta, unsigned char* smem_raw, float* dh, bf16* dDgh,
                                              bf16* dDgl, const float* dD, const bf16* Th, const bf16* Tl,
                                              const bf16* qkv, const float* rs, const float* Gc, const float* beta,
                                              const bf16* d_o, const SplitStates& st, int Hk, int Hv, int conv_dim,
                                              int* done, float* scl = nullptr) {
  static_assert(!kF16 || kFused, "fp16 stores: the fused reverse scan only");
  constexpr uint32_t kTq = kDlTile, kTt = 2 * kDlTile, kTo = 3 * kDlTile;
  constexpr int D = kDlD;
  const bool stores = kMode == kPlain || cta.kind != kRevF;  // a split F item stores only its result
  // A sample's last segment leaves with gradient 0: its last dh is not stored (rtable's kRtLast).
  const bool zero_last = cta.kind == kRevOut;
  constexpr bool kDhUnderBatch = kFused && kMode == kPlain;    // where dh[chunk] is stored (below)
  const int head = cta.head, kh = cta.kh, bos = cta.bos, len = cta.len, n = cta.n, first = cta.first;
  char* tiles = align1024(smem_raw);  // panels 1024-aligned
  float* rows = reinterpret_cast<float*>(tiles + 2 * kScanBwdBuf + (kFused ? 2 * kDlPanel : 0));  // [parity][kWgRows]
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  char* pplanes = tiles + 2 * kScanBwdBuf;  // fused: P hi, lo [i][j] (wg_p_planes)
  const int ncol = 64 * wgi + 16 * w + g;  // this thread's state columns: ncol, ncol + 8
  const size_t w_ld = static_cast<size_t>(Hv) * D, x_ld = static_cast<size_t>(conv_dim);
  const bf16* qraw = qkv + static_cast<size_t>(kh) * D;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * D;
  auto load_chunk = [&](int ci, int b) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    char* dst = tiles + b * kScanBwdBuf;
    const size_t wo = (static_cast<size_t>(c0) * Hv + head) * D;
    const size_t tb = (static_cast<size_t>(first + ci) * Hv + head) * kC * kC;
    async_panels<256>(dst, kraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
    async_panels<256>(dst + kTq, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
    async_panels<256, kC>(dst + kTt, Th + tb, kC, kC);  // every row: T's padded rows are identity rows
    async_panels<256, kC>(dst + kTt + kDlPanel, Tl + tb, kC, kC);
    async_panels<256>(dst + kTo, d_o + wo, w_ld, L);
  };
  // The next chunk in reverse order (every chunk but a sample's last is full).
  WgGates nx;
  auto next_gates = [&](int ci) {
    nx.load(Gc, rs, beta, bos + ci * kC, min(kC, len - ci * kC), Hk, Hv, head, kh);
  };
  if (n > 0) {
    load_chunk(n - 1, (n - 1) & 1);
    next_gates(n - 1);
  }
  cp_async_commit();
  // dS^T: rows ncol (regs 4 j + 0, 1) and ncol + 8 (4 j + 2, 3), columns d = 8 j + 2 t (+1).
  float sT[2 * D / 4];
  if (kMode == kSplitOut && cta.kind == kRevOutFromGrad) {
    load_state_t(sT, st.at(kStateG, cta.slot + 1, Hv, head), ncol, t);  // split_leaving_gradient made it
  } else {
#pragma unroll
    for (int r = 0; r < 2 * D / 4; ++r) sT[r] = 0.f;
  }
  // kF16: dD of the last step's chunk (the next one), stored at this step's top once the top barrier
  // has published its scale, from the update's -dD^T fragments (hi + lo: 16 bits, rounded once more
  // to fp16's 11), and this thread's largest |dD| of it.
  // kDdNow (the ticket instance, where holding them spilled 60 bytes): dD stored as it is formed, its
  // scale from a mid-step CTA max reduction (named barrier 6).
  constexpr bool kDdNow = kF16 && kMode != kPlain;
  const size_t dcol = static_cast<size_t>(head) * D;
  uint32_t ph[kC / 16][4], pl[kC / 16][4];  // the update's -dD^T fragments (every instance's)
  auto store_dd = [&](int c0, int L, float s) {
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      float x[4];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t hi = ph[j >> 1][hh + 2 * (j & 1)], lo = pl[j >> 1][hh + 2 * (j & 1)];
        x[2 * hh] = -(__uint_as_float(hi << 16) + __uint_as_float(lo << 16));
        x[2 * hh + 1] = -(__uint_as_float(hi & 0xffff0000u) + __uint_as_float(lo & 0xffff0000u));
      }
      store_planes_pair_t<true>(dDgh + static_cast<size_t>(c0) * w_ld + dcol, nullptr, w_ld, L, 8 * j, 64 * wgi + 16 * w,
                                x, g, t, s);
    }
  };
  float m_dd = 0.f;
  float* red = rows + 2 * kWgRows;  // kF16: [parity][dh, dD, dO][8]
  for (int ci = n - 1; ci >= 0; --ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC), buf = ci & 1;
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = nx.gl;
    const float* ksc = rows + buf * kWgRows;  // two copies: the other warpgroup may still read the last chunk's
    const float* eqc = ksc + kC;
    wg_store_rows(rows + buf * kWgRows, L, gl, nx.gi, nx.r, nx.b, nx.b);
    if (ci > 0) next_gates(ci - 1);
    cp_async_wait<0>();  // k, q, T, dO of this chunk
    wg::fence_proxy_async();
    if constexpr (kF16) {  // dh's maximum, this chunk's dO's, the last step's dD's
      float m = 0.f;
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) m = fmaxf(m, fabsf(sT[r]));
      publish_max(m, red + 24 * buf);
      if (!kDdNow) publish_max(m_dd, red + 24 * buf + 8);
      publish_max(own_panels_absmax<256>(tiles + buf * kScanBwdBuf + kTo), red + 24 * buf + 16);
    }
    __syncthreads();  // tiles and row scales visible; both warpgroups are done with the other buffer
    if (ci > 0) load_chunk(ci - 1, buf ^ 1);
    cp_async_commit();
    const char* cur = tiles + buf * kScanBwdBuf;

    // Unfused: dD_local^T of the chunk (rows >= L: 0), in flight under the dh stores and the first product.
    float dT[kC / 2];
    if constexpr (!kFused)
      load_tile_t(dT, dD + static_cast<size_t>(c0) * w_ld + static_cast<size_t>(head) * D, w_ld, L, ncol, t);
    // dh[chunk] = dL/d(state leaving the chunk) (fragment-native K x V; fused: 16-byte stores). The
    // plain fused instance stores it under the first batch (below); unfused, ptxas made the batch wait
    // for the stores' registers there, and the ticket instance lost 2-4 % on split rows.
    float s_dh = 1.f;  // kF16: dh's tile scale
    if constexpr (kF16) {  // (a split F item stores nothing: the same chunks' Out item does)
      s_dh = published_scale(red + 24 * buf);
      if (tid == 0 && stores) {
        scl[(chunk * Hv + head) * kSclFloats + kSclDh] = s_dh;
        scl[(chunk * Hv + head) * kSclFloats + kSclDo] = published_scale(red + 24 * buf + 16);
      }
      if (!kDdNow && ci + 1 < n) {
        const float s_dd = published_scale(red + 24 * buf + 8);
        if (stores) {
          if (tid == 0) scl[((chunk + 1) * Hv + head) * kSclFloats + kSclDd] = s_dd;
          store_dd(c0 + kC, min(kC, len - (ci + 1) * kC), s_dd);
        }
      }
    }
    auto store_dh = [&] {
      if constexpr (kF16)
        store_state_t<true>(reinterpret_cast<__half*>(dh) + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t,
                            s_dh);
      else
        store_state_t<kFused>(dh + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t);
    };
    const bool dh_stored = stores && (ci < n - 1 || !zero_last);
    if (dh_stored && !kDhUnderBatch) store_dh();
    // Fused: P's planes (the N-major B of dO^T P) before the dS^T fragments exist. (With them and the
    // dS^T k^T product in flight during P's epilogue, ptxas ran out of registers and waited for the
    // product anyway: 0.36 instead of 0.30 ms at 4B.)
    if constexpr (kFused) wg_p_planes(pplanes, cur + kTq, cur, ksc + 2 * kC, ksc + 3 * kC, ksc + 4 * kC, wgi);

    // acc = dS^T k^T (k exact: 2 products per k step).
    float acc[kC / 2];
    {
      uint32_t ah[D / 16][4], al[D / 16][4];
      state_frags_t(sT, ah, al);
      const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur, 16, 1024));
      wg::issue_after_wg0(wgi, 1);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * kDlPanel + (kk % 4) * 32;
        wg::mma_m64n64k16_rs<0>(acc, ah[kk], wg::desc_advance(k0, off), kk > 0);
        wg::mma_m64n64k16_rs<0>(acc, al[kk], wg::desc_advance(k0, off), 1);
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 1);
      // dh[chunk] under the batch: the warps' wait for the 16 stores to drain (their address and
      // source registers), a quarter of the scan's stall samples at the chunk's top, overlaps the
      // tensor work here (reverse scan 27B -3 %; the forward scans' h stores lost there).
      if (dh_stored && kDhUnderBatch) store_dh();
      wg::wait<0>();
    }
    wg::fence_operands(acc);
    if constexpr (kFused) {
      // acc = (dS^T k^T) diag(ks) + dO^T P: A = dO^T (the warpgroup's dO panel, M-major), P exact in dO.
#pragma unroll
      for (int j = 0; j < kC / 8; ++j) {
        const float2 kv = ld_f2(ksc + 8 * j + 2 * t);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          acc[4 * j + 2 * hh] *= kv.x;
          acc[4 * j + 2 * hh + 1] *= kv.y;
        }
      }
      const uint64_t o0 = wg::desc_opaque(wg::desc_sw128(cur + kTo + wgi * kDlPanel, kDlPanel, 1024));
      const uint64_t p0 = wg::desc_opaque(wg::desc_sw128(pplanes, kDlPanel, 1024));
      wg::issue_after_wg0(wgi, 2);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        wg::mma_m64n64k16<1, 1>(acc, wg::desc_advance(o0, kk * 2048), wg::desc_advance(p0, kk * 2048), 1);
        wg::mma_m64n64k16<1, 1>(acc, wg::desc_advance(o0, kk * 2048), wg::desc_advance(p0, kDlPanel + kk * 2048), 1);
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 2);
      wg::wait<0>();
      wg::fence_operands(acc);
    }

    // dD = dD_local + diag(ks) k dS out as planes (8 x 8 blocks of dD^T transposed by movmatrix, as in
    // the forward scan), and -dD^T as the update's A fragments.
    const size_t dbase = static_cast<size_t>(c0) * w_ld + static_cast<size_t>(head) * D;
    float s_dd_now = 1.f;  // kDdNow: this chunk's dD scale
    if constexpr (kF16) {  // fused: dD is acc
      m_dd = 0.f;
#pragma unroll
      for (int r = 0; r < kC / 2; ++r) m_dd = fmaxf(m_dd, fabsf(acc[r]));
      if constexpr (kDdNow) {
        if (stores) {  // CTA-uniform
          publish_max(m_dd, red + 24 * buf + 8);  // the slot the top leaves free in this form
          wg::named_sync(6, 256);
          s_dd_now = published_scale(red + 24 * buf + 8);
          if (tid == 0) scl[(chunk * Hv + head) * kSclFloats + kSclDd] = s_dd_now;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      const float2 kv = ld_f2(ksc + 8 * j + 2 * t);
      float x[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        x[q] = kFused ? acc[4 * j + q] : dT[4 * j + q] + ((q & 1) ? kv.y : kv.x) * acc[4 * j + q];
      if (stores && !kF16) store_planes_pair_t(dDgh + dbase, dDgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w, x, g, t);
      if (stores && kDdNow) store_planes_pair_t<true>(dDgh + dbase, nullptr, w_ld, L, 8 * j, 64 * wgi + 16 * w, x, g, t, s_dd_now);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        gdn_mma::split_bf16(-x[2 * hh], -x[2 * hh + 1], ph[j >> 1][hh + 2 * (j & 1)], pl[j >> 1][hh + 2 * (j & 1)]);
    }
    // The update below is not run in a plain scan's last step (the sample's first chunk): the gradient
    // entering the sample is never read there.
    if (kMode != kPlain || ci > 0) {
      // (diag(eq) dO)^T fragments: the raw dO rows by ldmatrix.trans from the warpgroup's swizzled panel
      // (lane l addresses row 16 kk + 8 (l / 16) + l % 8, 8-column chunk 2 w + (l / 8) % 2), scaled by eq_i.
      uint32_t oh[kC / 16][4], ol[kC / 16][4];
      {
        const char* dO = cur + kTo + wgi * kDlPanel;
        const int lq = lane >> 3, rr = lane & 7;
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          uint32_t r[4];
          const int row = 16 * kk + (lq >> 1) * 8 + rr, chunk16 = 2 * w + (lq & 1);
          gdn_mma::ldmatrix_x4<true>(r, reinterpret_cast<const bf16*>(dO + row * 128 + ((chunk16 ^ (row & 7)) << 4)));
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 e = ld_f2(eqc + 16 * kk + 8 * (q >> 1) + 2 * t);
            gdn_mma::split_bf16(__uint_as_float(r[q] << 16) * e.x, __uint_as_float(r[q] & 0xffff0000u) * e.y, oh[kk][q],
                                ol[kk][q]);
          }
        }
      }

      // dS^T = e^{G_L} dS^T + (eq dO)^T q (B = raw q, N-major), with Z^T = -dD^T T (B = T's planes,
      // N-major) in the same batch; then dS^T += Z^T diag(kbs) k (B = raw k, N-major).
      const float egl = expf(gl);
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) sT[r] *= egl;
      float zT[kC / 2];
      {
        const uint64_t q0 = wg::desc_opaque(wg::desc_sw128(cur + kTq, kDlPanel, 1024));
        const uint64_t th0 = wg::desc_opaque(wg::desc_sw128(cur + kTt, kDlPanel, 1024));
        const uint64_t tl0 = wg::desc_opaque(wg::desc_sw128(cur + kTt + kDlPanel, kDlPanel, 1024));
        wg::issue_after_wg0(wgi, 3);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          const uint32_t off = kk * 2048;
          wg::mma_m64n64k16_rs<1>(zT, ph[kk], wg::desc_advance(th0, off), kk > 0);
          wg::mma_m64n64k16_rs<1>(zT, pl[kk], wg::desc_advance(th0, off), 1);
          wg::mma_m64n64k16_rs<1>(zT, ph[kk], wg::desc_advance(tl0, off), 1);
          wg::mma_m64n128k16_rs<1>(sT, oh[kk], wg::desc_advance(q0, off), 1);
          wg::mma_m64n128k16_rs<1>(sT, ol[kk], wg::desc_advance(q0, off), 1);
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 3);
        wg::wait<0>();
      }
      wg::fence_operands(zT);
      {
        uint32_t zh[kC / 16][4], zl[kC / 16][4];
#pragma unroll
        for (int j = 0; j < kC / 8; ++j) {
          const float2 kv = ld_f2(ksc + 6 * kC + 8 * j + 2 * t);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            gdn_mma::split_bf16(kv.x * zT[4 * j + 2 * hh], kv.y * zT[4 * j + 2 * hh + 1], zh[j >> 1][hh + 2 * (j & 1)],
                                zl[j >> 1][hh + 2 * (j & 1)]);
        }
        const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur, kDlPanel, 1024));
        wg::issue_after_wg0(wgi, 4);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          wg::mma_m64n128k16_rs<1>(sT, zh[kk], wg::desc_advance(k0, kk * 2048), 1);
          wg::mma_m64n128k16_rs<1>(sT, zl[kk], wg::desc_advance(k0, kk * 2048), 1);
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 4);
        wg::wait<0>();
      }
      wg::fence_operands(sT);
    }
  }
  cp_async_wait<0>();
  if constexpr (kF16) {  // the segment's first chunk's dD
    if (!kDdNow && n > 0 && stores) {
      publish_max(m_dd, red + 24 + 8);  // parity 1: read last before step 0's top barrier
      __syncthreads();
      const float s_dd = published_scale(red + 24 + 8);
      if (tid == 0) scl[(static_cast<size_t>(first) * Hv + head) * kSclFloats + kSclDd] = s_dd;
      store_dd(bos, min(kC, len), s_dd);
    }
  }
  if constexpr (kMode == kPlain) {
    signal_done_counted(done, cta.p, Hv, head);
    return;
  }
  // The entering gradient where the split needs it: F_s, or a split sample's G_{k-1}.
  const volatile WgScanItem* vit = &scan_item;
  const int kind = vit->kind, slot = vit->slot, hd = vit->head;
  if (kind == kRevF || vit->nseg > 1) {
    const SplitState which = kind == kRevF ? kStateF : kStateG;
    store_state_t(st.at(which, slot, Hv, hd), sT, ncol, t);
    signal_done(st.flag(which, Hv), slot, Hv, hd);
  }
  if (kind != kRevF) signal_done_counted(done, vit->p, Hv, hd);
}

// The reverse scan. Plain: CTA b runs (segment of rank b / Hv, head b % Hv), as tuned. kTickets
// (a backward whose recomputed forward may split): the CTAs take (item, value head) tickets in the
// plan's order (items_rev, counts[4] of them, counter counts[3]), as the forward's ticket instance.
// bwd_chunk may be launched beside this grid once every CTA of it is running; it waits for each
// (segment, head)'s `done` flag before reading its dh, dD.
template <bool kFused, bool kTickets = false, bool kF16 = false>
__global__ void __launch_bounds__(256, 1) gdn_scan_bwd_wgmma_kernel(float* dh, bf16* dDgh, bf16* dDgl, const float* dD,
                                                                    const bf16* Th, const bf16* Tl, const bf16* qkv,
                                                                    const float* rs, const float* Gc,
                                                                    const float* beta, const bf16* d_o,
                                                                    const int* vcu, const int* seq_off,
                                                                    const int* seq_order, const int4* seginfo,
                                                                    const int* items_rev, int* counts,
                                                                    SplitStates st, int Hk, int Hv, int conv_dim,
                                                                    int* done, float* scl) {
  launch_dependents();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if constexpr (!kTickets) {
    scan_bwd_item<kFused, kPlain, kF16>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, dh, dDgh, dDgl, dD, Th,
                                        Tl, qkv, rs, Gc, beta, d_o, st, Hk, Hv, conv_dim, done, scl);
  } else {
    WgScanItem& item = scan_item;
    while (take_scan_item(counts, 3, 4, items_rev, vcu, seq_off, seginfo, Hk, Hv)) {
      if (item.kind == kRevOutFromGrad) split_leaving_gradient(st, item.idx, item.nseg, item.slot, Hv, item.head);
      // F items run the same code with their dh, dD stores off (one copy of the chunk loop: with a
      // second, output-free copy for them the kernel spilled).
      scan_bwd_item<kFused, kSplitOut, kF16>(WgScanItem(item), smem_raw, dh, dDgh, dDgl, dD, Th, Tl, qkv, rs, Gc, beta,
                                             d_o, st, Hk, Hv, conv_dim, done, scl);
    }
  }
}

// ---- backward per-chunk gradients ----------------------------------------------------------------
// 256 threads, 2 CTAs per SM: the kernel runs in two phases whose tiles share five smem regions.
//   state phase (P1-P3: dP, Y, dq^, dk^ state part, xi): raw q, k, dO (bf16), D (hi / lo planes), Y;
//   WY phase (P4-P11): raw k, dD (planes), raw v, then a K/2-column piece of dW (fp32), T (prep's
//   hi / lo planes, read by ldmatrix: no second A and solve here, -12 % on this kernel), dT.
// q, k, dO, v are staged as their bf16 values (exact: a product with one of them costs 2 mma under
// the split, q k^T and k k^T 1) with the L2 scales rs applied per row in the epilogues or
// folded into the other operand; dW is produced and consumed in column pieces (P4, P5's k part and
// P10's T^T dW part per piece); the row dot products (dG, dbeta, xi) and the dP . P / F row and
// column sums are reduced in registers (for_tiles / for_tiles_m2 with a float-returning epilogue,
// for_tiles_rc) into per-tile partials, summed in a fixed order, so the result stays deterministic.
// 112.3 KB at K = V = 128.
__host__ __device__ constexpr int bwd_piece(int K) { return (K / 2 + 15) / 16 * 16; }  // dW columns per piece
__host__ __device__ constexpr int bwd_r1(int K) { return imax(kC * raw_ld(K) / 2, kC * kLdC); }   // q; A, dT, Mx
__host__ __device__ constexpr int bwd_r2(int K) { return kC * raw_ld(K) / 2; }                    // k
__host__ __device__ constexpr int bwd_r3(int K, int V) {                                         // dO; v; dW piece
  return imax(kC * raw_ld(V) / 2, kC * (bwd_piece(K) + 4));
}
__host__ __device__ constexpr int bwd_r4(int V) { return imax(kC * raw_ld(V), kC * kLdC); }  // D, dD planes; X1
int bwd_chunk_smem_floats(int K, int V) {
  const int slots = imax(K, V) / 16;
  return bwd_r1(K) + bwd_r2(K) + bwd_r3(K, V) + bwd_r4(V) + kC * kLdC + 6 * kC + 8 * kC + 2 * slots * kC + 3 * kC +
         kThreads / 32;
}

// The end of both bwd_chunk kernels, by warp 0: the G_L terms (sum_i xi_i + e^{G_L} <S0, dS_end>,
// from the per-row xi and the 8 per-warp partials of the state dot) go into row C-1 of dG, then the
// reverse cumsum dg_i = sum_{l >= i} dG_l in place (lane l: rows 63 - 2l, 62 - 2l), fixed order.
__device__ __forceinline__ void dg_reverse_cumsum(float* dGa, const float* xi, const float* sdot8, float egl) {
  const int lane = threadIdx.x & 31;
  float xs = xi[lane] + xi[lane + 32], sd = 0.f;
  for (int q = 0; q < 8; ++q) sd += sdot8[q];
  xs = warp_sum(xs);
  const int r0 = kC - 1 - 2 * lane, r1 = r0 - 1;
  const float a = dGa[r0] + (lane == 0 ? xs + egl * sd : 0.f), b = dGa[r1];
  float incl = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const float excl = incl - (a + b);
  __syncwarp();
  dGa[r0] = excl + a;
  dGa[r1] = incl;
}

// dqn, dkn [T, Hv, K] (grads w.r.t. q^, k^ per value head), dv into dqkv, dg, dbeta. q^ = q rs[., 0],
// k^ = k rs[., 1] (rs [T, Hk, 2] from gdn_prep_kernel); D, dD as their planes [T, Hv, V].
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_chunk_kernel(
    float* dqn, float* dkn, bf16* dqkv, float* dg, float* dbeta, const int4* rtable, const int* nchunks,
    const float* rs, const bf16* qkv, const float* g, const float* beta, const bf16* Dgh, const bf16* Dgl, const bf16* dDgh, const bf16* dDgl,
    const float* h, const float* dh, const bf16* d_o, const bf16* Th, const bf16* Tl, int Hk, int Hv, int K, int V,
    int conv_dim) {
  // The products with S0 / dS_end (read from global): kMT row tiles per warp tile share each B
  // fragment, k loop unrolled by kBU k steps of 8 (MT 1 and unroll 8 were slower or spilled).
  constexpr int kMT = 2, kBU = 4;
  const int head = blockIdx.y;
  if (static_cast<int>(blockIdx.x) >= *nchunks) return;
  const int4 ch = rtable[blockIdx.x];  // rtable, for its flags: the zero states the wgmma scans leave unstored
  const int c = ch.w, bos = ch.x, len = ch.y, kh = head / (Hv / Hk);
  extern __shared__ float smem[];
  Carve cv{smem};
  // dW piece stride 4 mod 32 words: P10's scalar B gathers are conflict-free, P5's pair loads 2-way.
  const int ldr = raw_ld(K), ldo = raw_ld(V), ldx = raw_ld(V), kw = bwd_piece(K), ldw = kw + 4;
  float* R1 = cv.take(bwd_r1(K));
  bf16* Kb = reinterpret_cast<bf16*>(cv.take(bwd_r2(K)));
  float* R3 = cv.take(bwd_r3(K, V));
  float* Xs = cv.take(bwd_r4(V));     // D planes (state phase), dD planes, then X1 = dT T^T (stride kLdC)
  bf16* Xh = reinterpret_cast<bf16*>(Xs);
  bf16* Xl = Xh + kC * ldx;
  float* Ts = cv.take(kC * kLdC);     // Y = dP . Gam (state phase), then T as hi / lo planes (stride kLdC)
  bf16* Qb = reinterpret_cast<bf16*>(R1);  // raw q; then A, dT, Mx as fp32 C x C tiles (Cs)
  float* Cs = R1;
  bf16* Ob = reinterpret_cast<bf16*>(R3);  // dO; then raw v; then a dW piece (dWp, stride ldw)
  float* dWp = R3;
  float* Ys = Ts;
  bf16* Tph = reinterpret_cast<bf16*>(Ts);  // T[l][i] (prep's planes): Ld2<true> reads T^T, Ld2<false> T
  bf16* Tpl = Tph + kC * kLdC;
  float* X1 = Xs;  // stored transposed
  float* gs = cv.take(kC);
  float* bs = cv.take(kC);
  float* eg = cv.take(kC);
  float* ekl = cv.take(kC);
  float* rq = cv.take(kC);
  float* rk = cv.take(kC);
  const int slots = imax(K, V) / 16;
  float* rowA = cv.take(4 * kC);  // C x C row sums per column tile (dP . P, then F)
  float* colA = cv.take(4 * kC);  // C x C column sums per row tile
  float* rowB = cv.take(slots * kC);  // q . (e^G S0 dO), then v . (T^T dD)
  float* rowC = cv.take(slots * kC);  // k . (state part of dk), then k . (T^T dW)
  float* dGa = cv.take(kC);
  float* xia = cv.take(kC);
  float* sva = cv.take(kC);
  float* red = cv.take(kThreads / 32);
  const int tid = threadIdx.x;
  const size_t x_ld = static_cast<size_t>(conv_dim), vh_ld = static_cast<size_t>(Hv) * V;
  const float* S0 = chunk_state(h, ch, kRtFirst, Hv, head, K, V);
  const float* dSe = chunk_state(dh, ch, kRtLast, Hv, head, K, V);
  const bf16* xrow = qkv + static_cast<size_t>(bos) * x_ld;
  float* dkrow = dkn + (static_cast<size_t>(bos) * Hv + head) * K;  // row i at dkrow + i * Hv * K
  const size_t dk_ld = static_cast<size_t>(Hv) * K;

  // Prologue: every tile by cp.async, one wait.
  async_rows(Qb, ldr, xrow + static_cast<size_t>(kh) * K, x_ld, len, K);
  async_rows(Kb, ldr, xrow + static_cast<size_t>(Hk + kh) * K, x_ld, len, K);
  async_rows(Ob, ldo, d_o + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  async_rows(Xh, ldx, Dgh + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  async_rows(Xl, ldx, Dgl + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  cp_async_commit();
  load_gates(gs, bs, g, beta, bos, len, Hv, head);
  if (tid < kC) {
    const float2 r = tid < len ? reinterpret_cast<const float2*>(rs)[static_cast<size_t>(bos + tid) * Hk + kh]
                               : make_float2(0.f, 0.f);
    rq[tid] = r.x;
    rk[tid] = r.y;
  }
  cp_async_wait<0>();
  __syncthreads();
  const float gl = gs[kC - 1], egl = expf(gl);
  if (tid < kC) {
    eg[tid] = expf(gs[tid]);
    ekl[tid] = expf(gl - gs[tid]);
  }
  __syncthreads();

  // P1: Y = dP . Gam (masked j <= i), dP_ij = dO_i . D_j; the row and column sums of
  // dP . P = Y . (q^ k^T) for dG go to rowA / colA (q k^T of the raw rows: exact products, 1 mma).
  // The diagonal is left out of both: it cancels exactly in rowsum - colsum, and summed into two
  // different partials its O(1) value would leave a rounding residue far above dg when the gates
  // are strongly negative (every other term carries a factor e^{G_i - G_j} there).
  for_tiles_rc<2>(
      kC, kC,
      [&](auto& a1, auto& a2, int m0, int n0) {
        if (n0 > m0 + 15) return;
        mma_acc<2, 4, true, true>(a1, m0, n0, 0, K, Ld<false>{Qb, ldr},
                                  Ld<false>{Kb, ldr});
        mma_acc<2, 4, true>(a2, m0, n0, 0, V, Ld<false>{Ob, ldo},
                            Ld2<false>{Xh, Xl, ldx});
      },
      [&](int i, int j, float qk, float dp, float& rc, float& cc) {
        const float y = j <= i ? dp * expf(gs[i] - gs[j]) : 0.f;
        Ys[i * kLdC + j] = y;
        rc = cc = j < i ? y * qk * rq[i] * rk[j] : 0.f;
      },
      rowA, colA);
  __syncthreads();

  // P2: dq^_i = e^{G_i} S0 dO_i + sum_j Y_ij k^_j;  dG_i += q^_i . (e^{G_i} S0 dO_i).
  for_tiles_m2<kMT, 2>(
      kC, K,
      [&](auto& a1, auto& a2, int m0, int n0) {
        mma_acc_m<kMT, 2, kBU, true>(a1, m0, n0, 0, V, Ld<false>{Ob, ldo},
                                     Nt{S0, V});
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const int m = m0 + 16 * mt;
          mma_acc<2, 4, false, true>(a2[mt], m, n0, 0, m + 16,
                                     Gk{[&](int i, int j) { return mul2(ld_f2(Ys + i * kLdC + j), ld_f2(rk + j)); }},
                                     Ld<true>{Kb, ldr});
        }
      },
      Pair{[&](int i, int d, float sd0, float sd1, float yk0, float yk1) {
        const float a0 = eg[i] * sd0, a1 = eg[i] * sd1;
        if (i < len)
          *reinterpret_cast<float2*>(dqn + (static_cast<size_t>(bos + i) * Hv + head) * K + d) =
              make_float2(a0 + yk0, a1 + yk1);
        return make_float2(to_f(Qb[i * ldr + d]) * a0, to_f(Qb[i * ldr + d + 1]) * a1);
      }},
      rowB);
  __syncthreads();
  if (tid < kC) {  // fold P1 and P2 (rowA / colA / rowB are next written after many barriers)
    float s = 0.f, qa = 0.f;
    for (int p = 0; p < 4; ++p) s += rowA[p * kC + tid] - colA[p * kC + tid];
    for (int p = 0; p < K / 16; ++p) qa += rowB[p * kC + tid];
    dGa[tid] = s + rq[tid] * qa;
  }

  // P3: dk^ state part = e^{G_L - G_i} (D dS_end^T)_i + sum_{l >= i} Y_li q^_l; xi_i = k^_i . (first term).
  for_tiles_m2<kMT, 2>(
      kC, K,
      [&](auto& a1, auto& a2, int m0, int n0) {
        mma_acc_m<kMT, 2, kBU>(a1, m0, n0, 0, V, Ld2<false>{Xh, Xl, ldx},
                               Nt{dSe, V});
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const int m = m0 + 16 * mt;
          mma_acc<2, 4, false, true>(a2[mt], m, n0, m, kC, [&](int i, int l) { return Ys[l * kLdC + i] * rq[l]; },
                                     Ld<true>{Qb, ldr});
        }
      },
      Pair{[&](int i, int d, float ds0, float ds1, float yq0, float yq1) {
        const float z0 = ekl[i] * ds0, z1 = ekl[i] * ds1;
        if (i < len)
          *reinterpret_cast<float2*>(dkrow + static_cast<size_t>(i) * dk_ld + d) = make_float2(z0 + yq0, z1 + yq1);
        return make_float2(to_f(Kb[i * ldr + d]) * z0, to_f(Kb[i * ldr + d + 1]) * z1);
      }},
      rowC);
  __syncthreads();

  // WY phase. q, dO, D, Y are dead: dD (into Xs), raw v (into R3) and T (prep's planes, into Ts:
  // no second A and solve) stream in by cp.async while P3 is folded.
  async_rows(Xh, ldx, dDgh + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  async_rows(Xl, ldx, dDgl + (static_cast<size_t>(bos) * Hv + head) * V, vh_ld, len, V);
  async_rows(Ob, ldo, xrow + 2 * static_cast<size_t>(Hk) * K + static_cast<size_t>(head) * V, x_ld, len, V);
  {
    const size_t tb = (static_cast<size_t>(c) * Hv + head) * kC * kC;
    async_rows(Tph, kLdC, Th + tb, kC, kC, kC);  // every row: T's padded rows are identity rows
    async_rows(Tpl, kLdC, Tl + tb, kC, kC, kC);
  }
  cp_async_commit();
  if (tid < kC) {
    float x = 0.f;
    for (int p = 0; p < K / 16; ++p) x += rowC[p * kC + tid];
    xia[tid] = rk[tid] * x;
  }
  cp_async_wait<0>();
  __syncthreads();

  // (T^T X) for the kC x N tile X (B operand fx), epi with row dots into rowp (P11, P10's first term);
  // pre(m0, n0) runs before each warp tile's product.
  auto tt_product = [&](int N, auto fx, auto epi, float* rowp, auto pre) {
    for_tiles<2>(
        kC, N,
        [&](auto& acc, int m0, int n0) {
          pre(m0, n0);
          mma_acc(acc, m0, n0, m0, kC, Ld2<true>{Tph, Tpl, kLdC}, fx);
        },
        epi, rowp);
  };
  // The dk^ read-modify-writes of P10 load the values a warp tile's epilogue will add to before its
  // product runs (dk_pre), so the global latency overlaps the mma instead of stalling the epilogue
  // (the largest stall in the eighth round's source-level profile). The epilogue finds element
  // (i, d) of its 16 x 16 tile in slot 2 ((d / 8) % 2) + (i / 8) % 2.
  float2 dk_pre[4];
  auto load_dk = [&](int m0, int n0, int col0) {
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + g + 8 * hh;
        dk_pre[2 * nt + hh] = i < len ? *reinterpret_cast<const float2*>(dkrow + static_cast<size_t>(i) * dk_ld + col0 +
                                                                          n0 + 8 * nt + 2 * t)
                                      : make_float2(0.f, 0.f);
      }
  };
  auto dk_slot = [&](int i, int d) -> float2& { return dk_pre[2 * ((d >> 3) & 1) + ((i >> 3) & 1)]; };
  // P11: dv_i = b_i (T^T dD)_i; dbeta_i += v_i . (T^T dD)_i (rowB).
  // P5 (v part): dT_ml = b_l dD_m . v_l, strictly lower only (all that dA needs), into R1 (A is dead).
  {
    bf16* dvbase = dqkv + static_cast<size_t>(bos) * conv_dim + 2 * Hk * K + head * V;
    tt_product(
        V, Ld2<true>{Xh, Xl, ldx},
        Pair{[&](int i, int e, float r0, float r1) {
          if (i < len) store_bf16x2(dvbase + static_cast<size_t>(i) * conv_dim + e, bs[i] * r0, bs[i] * r1);
          return make_float2(to_f(Ob[i * ldo + e]) * r0, to_f(Ob[i * ldo + e + 1]) * r1);
        }},
        rowB, [](int, int) {});
  }
  for_tiles<2>(
      kC, kC,
      [&](auto& acc, int m0, int n0) {
        if (n0 > m0 + 15) return;
        mma_acc<2, 4, false, true>(acc, m0, n0, 0, V, Ld2<false>{Xh, Xl, ldx},
                                   Ld<false>{Ob, ldo});
      },
      [&](int m, int l, float v) { Cs[m * kLdC + l] = (l < m && l < len) ? bs[l] * v : 0.f; });
  __syncthreads();
  if (tid < kC) {
    float s = 0.f;
    for (int p = 0; p < V / 16; ++p) s += rowB[p * kC + tid];
    sva[tid] = s;
  }

  // dW = -dD S0^T in column pieces [d0, d0 + w) (into R3: v is dead). Per piece:
  // P4: the piece of dW; P5 (k part): dT_ml += b_l e^{G_l} dW_m . k^_l (l < m, l < len);
  // P10 (first term): dk^_i += b_i e^{G_i} (T^T dW)_i, s2_i = k^_i . (T^T dW)_i (rowC slots of the piece).
  // <S0, dS_end> for the G_L term rides on P4's S0 reads: the warps of the first row group (which
  // together read every element of S0 once over the pieces) load dS_end at the same offsets.
  float sdot = 0.f;
  for (int d0 = 0; d0 < K; d0 += kw) {
    const int w = imin(kw, K - d0);
    for_tiles_m2<kMT, 2>(
        kC, w,
        [&](auto& a1, auto&, int m0, int n0) {
          mma_acc_m<kMT, 2, kBU>(
              a1, m0, n0, 0, V, Ld2<false>{Xh, Xl, ldx},
              NtDot{S0 + static_cast<size_t>(d0) * V, dSe + static_cast<size_t>(d0) * V, V, &sdot, m0 == 0});
        },
        [&](int i, int d, float v, float) { dWp[i * ldw + d] = -v; });
    __syncthreads();
    for_tiles<2>(
        kC, kC,
        [&](auto& acc, int m0, int n0) {
          if (n0 > m0 + 15) return;
          mma_acc<2, 4, false, true>(acc, m0, n0, 0, w, Gk{[&](int m, int d) { return ld_f2(dWp + m * ldw + d); }},
                                     Ld<false>{Kb + d0, ldr});
        },
        [&](int m, int l, float v) {
          if (l < m && l < len) Cs[m * kLdC + l] += bs[l] * eg[l] * rk[l] * v;
        });
    tt_product(
        w, [&](int l, int d) { return dWp[l * ldw + d]; },
        Pair{[&](int i, int d, float r0, float r1) {
          if (i < len) {
            const float2 x = dk_slot(i, d);
            *reinterpret_cast<float2*>(dkrow + static_cast<size_t>(i) * dk_ld + d0 + d) =
                make_float2(x.x + bs[i] * eg[i] * r0, x.y + bs[i] * eg[i] * r1);
          }
          return make_float2(to_f(Kb[i * ldr + d0 + d]) * r0, to_f(Kb[i * ldr + d0 + d + 1]) * r1);
        }},
        rowC + (d0 / 16) * kC, [&](int m0, int n0) { load_dk(m0, n0, d0); });
    __syncthreads();  // dWp free for the next piece; dT complete after the last
  }
  sdot = warp_sum(sdot);
  if ((tid & 31) == 0) red[tid >> 5] = sdot;  // one partial per warp, summed in order at the end

  // P6: X1 = dT T^T (into Xs: dD is dead), stored transposed (X1[j * kLdC + m]).
  for_tiles<2>(
      kC, kC,
      [&](auto& acc, int m0, int n0) {
        // dT is strictly lower (l < m), T^T upper (l <= j): l < min(m0 + 16, n0 + 16).
        mma_acc(acc, m0, n0, 0, imin(m0, n0) + 16, Gk{[&](int m, int l) { return ld_f2(Cs + m * kLdC + l); }},
                Ld2<false>{Tph, Tpl, kLdC});
      },
      [&](int m, int j, float v) { X1[j * kLdC + m] = v; });  // transposed: P7 reads pairs along m
  __syncthreads();
  // P7: Mx_ij = -(T^T X1)_ij Gam_ij for j < i (into R1: dT is dead).
  for_tiles<2>(
      kC, kC,
      [&](auto& acc, int m0, int n0) {
        if (n0 > m0 + 15) return;
        mma_acc(acc, m0, n0, m0, kC, Ld2<true>{Tph, Tpl, kLdC},
                Gk{[&](int m, int j) { return ld_f2(X1 + j * kLdC + m); }});
      },
      [&](int i, int j, float v) { Cs[i * kLdC + j] = j < i ? -v * expf(gs[i] - gs[j]) : 0.f; });
  __syncthreads();
  // P8/P9: F = Mx . (K^ K^T): rowA = row sums (dbeta_i += rowsum_i, dG_i += b_i rowsum_i),
  // colA = sum_l b_l F_lj (dG_j -= it).
  for_tiles_rc<2>(
      kC, kC,
      [&](auto& a1, auto&, int m0, int n0) {
        if (n0 > m0 + 15) return;
        mma_acc<2, 4, true, true>(a1, m0, n0, 0, K, Ld<false>{Kb, ldr},
                                  Ld<false>{Kb, ldr});
      },
      [&](int i, int j, float kk, float, float& rc, float& cc) {
        const float f = Cs[i * kLdC + j] * rk[i] * rk[j] * kk;
        rc = f;
        cc = bs[i] * f;
      },
      rowA, colA);
  // P10 (rest): dk^_i += b_i sum_j Mx_ij k^_j + sum_l Mx_li b_l k^_l.
  for_tiles<2>(
      kC, K,
      [&](auto& acc, int m0, int n0) {
        load_dk(m0, n0, 0);
        mma_acc<2, 4, false, true>(acc, m0, n0, 0, m0 + 16,
                                   Gk{[&](int i, int j) {
                                     const float2 c = ld_f2(Cs + i * kLdC + j), r = ld_f2(rk + j);
                                     return make_float2(bs[i] * c.x * r.x, bs[i] * c.y * r.y);
                                   }},
                                   Ld<true>{Kb, ldr});
        mma_acc<2, 4, false, true>(acc, m0, n0, m0, kC, [&](int i, int l) { return Cs[l * kLdC + i] * bs[l] * rk[l]; },
                                   Ld<true>{Kb, ldr});
      },
      Pair{[&](int i, int d, float m0, float m1) {
        if (i < len) {
          const float2 x = dk_slot(i, d);
          *reinterpret_cast<float2*>(dkrow + static_cast<size_t>(i) * dk_ld + d) = make_float2(x.x + m0, x.y + m1);
        }
      }});
  __syncthreads();
  // Combine (fixed order), add the G_L terms to row C-1, reverse cumsum -> dg.
  if (tid < kC) {
    float rf = 0.f, cf = 0.f, s2 = 0.f;
    for (int p = 0; p < 4; ++p) {
      rf += rowA[p * kC + tid];
      cf += colA[p * kC + tid];
    }
    for (int p = 0; p < K / 16; ++p) s2 += rowC[p * kC + tid];
    s2 *= rk[tid];
    const float b = bs[tid], e = eg[tid];
    dGa[tid] = dGa[tid] - xia[tid] + b * rf - cf + b * e * s2;
    sva[tid] = rf + e * s2 + sva[tid];  // dbeta
  }
  __syncthreads();
  if (tid < 32) dg_reverse_cumsum(dGa, xia, red, egl);
  __syncthreads();
  if (tid < len) {
    dg[static_cast<size_t>(bos + tid) * Hv + head] = dGa[tid];
    dbeta[static_cast<size_t>(bos + tid) * Hv + head] = sva[tid];
  }
}

// ---- backward per-chunk gradients on wgmma (dk = dv = 128) ---------------------------------------
// Persistent: one CTA per SM (221 KB of smem) walks the (chunk, value head) items; two forms. The
// default (kWs) runs rows d in two warpgroups and the C x C chain (P1, dT, X1, Mx) and the item's
// combine in a third, beside them (kBarQkvt ..: the chain's P1 under the rows' epilogues, its dT,
// X1, Mx under their dq^ and dv). The two-warpgroup form (254 registers; QT_GDN_BC_TWO_WARPGROUPS=1)
// runs every phase in both warpgroups in turn, as described here. Every product operand is a
// 128-byte-swizzled smem tile (cp.async panels, or planes this kernel writes) or a register A
// fragment. The C x K results (dq^, dk^) are formed
// transposed, rows d, columns i: warpgroup wgi owns d = 64 wgi .. + 63 of both, so the state
// products take the state rows as register A fragments from the fragment-native h / dh (staged in
// smem: 16-byte loads), and dk^ collects all its terms in one accumulator (written once, no
// read-modify-write). The C x C products split their 64 columns between the warpgroups (m64n32,
// B rows 32 wgi..: a K-major B may start at any row of its panel). Per item, in order:
//   F^T  = dS D^T, E^T = S0 dO^T, dW^T = -S0 dD^T    (<S0, dS> on the way; q, k, v, T land meanwhile)
//   E^T diag(e^G), F^T diag(e^{G_L-G}) with their dG / xi column sums; dW^T -> planes [d][m];
//   dk^T += (dW^T T) diag(b e^G)
//   P1   dP = dO D^T, q k^T                         -> Y = dP . Gam; bf16 planes Yk = Y diag(rk),
//                                                      Yq = diag(rq) Y; dP . P row / column sums (dG)
//   dq^T = E^T + k^T Yk (A = k M-major) -> dqn;  dk^T += q^T Yq
//   dT   = diag . (dD v^T, dW k^T) (l < m)         -> planes [m][l]
//   dv   = diag(b) T^T dD (columns 64 wgi..)        -> dqkv; v . (T^T dD) row dots (dbeta)
//   X1^T = T dT^T                                   -> planes [j][m]
//   Mx   = -(T^T X1) . Gam (j < i), k k^T           -> F row / column sums (dG, dbeta); bf16 planes
//          Pa = diag(b) Mx diag(rk), Pb = diag(b rk) Mx
//   dk^T += k^T Pa + (k^T Pb^T)                      -> dkn
// and the next item's operands are issued as their regions free up (after dT, dv, Mx, and the final
// dk^ product), so an item starts with all of them in flight. The q / k / v values the row dots
// multiply are read at the accumulator positions by ldmatrix. fp32 x fp32 products are split hi / lo
// (3 products; 2 where one side is an exact bf16 tile), as in the mma.sync kernel, but for Y, Pa and
// Pb: they feed only dq^ and dk^, which leave as bf16, so they are one bf16 plane each (1 product;
// dq, dk's rel RMS 2.35e-3 -> 2.9e-3 of 4.3e-3 in the CudaGdn cases, dg and dbeta unchanged); every row /
// column sum reduces per thread, per warp (xor tree), then across warps in a fixed order, so the
// result is deterministic.
// Regions (16 KB tiles): W / S0's second half 0-1, dO 2, D 3-4, dD 5-6, v 7, T 8 (v, T: dS's second
// half first), Y (Yk, Yq: tile 9) / S0's first half 9-10, q, k 11-12 (dS's first half first).
constexpr uint32_t kBcW = 0, kBcO = 2 * kDlTile, kBcD = 3 * kDlTile, kBcDD = 5 * kDlTile, kBcV = 7 * kDlTile,
                   kBcT = 8 * kDlTile, kBcY = 9 * kDlTile, kBcQ = 11 * kDlTile, kBcK = 12 * kDlTile,
                   kBcTiles = 13 * kDlTile;
// Row arrays and reduction partials (floats) after the tiles. The item's row data (kBcRowData arrays
// of C, offsets relative to the block) is double-buffered: an item's are formed during the one before.
constexpr int kBcGs = 0, kBcBs = kC, kBcEg = 2 * kC, kBcEkl = 3 * kC, kBcRq = 4 * kC, kBcRk = 5 * kC,
              kBcG2 = 6 * kC /* G log2(e) */, kBcRowData = 7 * kC /* one block; two at 0 and kBcRowData */,
              kBcRowA = 14 * kC /* [2][C] */, kBcColA = 16 * kC /* [4][C] */, kBcRedE = 20 * kC /* [8][C] */,
              kBcRedXi = 28 * kC, kBcRedS2 = 36 * kC, kBcRowF = 44 * kC /* [2][C] */, kBcColF = 46 * kC /* [4][C] */,
              kBcRowV = 50 * kC /* [2][C] */, kBcDg = 52 * kC, kBcDb = 53 * kC, kBcXi = 54 * kC,
              kBcDiag = 55 * kC, kBcQdot = 56 * kC, kBcKdot = 57 * kC /* L2-norm backward */,
              kBcSdot = 58 * kC /* [2][8]: by the row-data block */, kBcNext = 58 * kC + 16 /* int: the next item */,
              kBcCur = 58 * kC + 17 /* int: the item (-1: none), for the C x C warpgroup */,
              kBcScl = 58 * kC + 20 /* [2][kSclFloats], 16-byte aligned: by the row-data block, the fp16
                                       form's scales (the scans', the chain's dT) */,
              kBcRedC = 58 * kC + 36 /* [4]: the chain's max reduction */, kBcFloats = 58 * kC + 40;
static_assert(kBcScl % 4 == 0, "the scales are stored as a float4");
constexpr size_t kBcSmem = kBcTiles + kBcFloats * sizeof(float) + 1024;
// Warp-specialized form (kWs): warpgroups 0, 1 run rows d as before, warpgroup 2 runs the C x C chain
// beside them (P1 as its two 32-column halves in turn; dT, X1, Mx as m64n64 products, their
// epilogues by halves where they form the m64n32 sums) and then the item's combine. They meet at named barriers, each
// used once per item by one side arriving and the other syncing (a side arrives again only after
// it has synced on something the other side does later, so arrivals never pile up):
//   kBarQkvt  all 384 sync: q, k, v, T landed, S0 / dS read; the item in fl[kBcCur]
//   kBarDw    rows -> chain: dW planes written (and E^T's product, reading dO, done)
//   kBarY     chain -> rows: the Y planes and P1's sums
//   kBarDt    chain -> rows: dT's products done (W's, dD's and v's regions no longer read)
//   kBarQ     rows -> chain: q no longer read (Pb goes into q's region)
//   kBarP     chain -> rows: the Pa, Pb planes (the chain then combines the item's sums: dg, dbeta)
//   kBarV     rows -> chain: dv's row dots (v . (T^T dD), for dbeta) written
//   kBarK     chain -> rows (kL2): the combine's k^ . dk^
// kBarRows joins the 256 rows threads (their __syncthreads), kBarChain the chain's 128.
constexpr int kBcWsThreads = 384, kBarRows = 2, kBarQkvt = 3, kBarDw = 4, kBarY = 5, kBarDt = 6, kBarQ = 7,
              kBarP = 8, kBarChain = 9, kBarK = 10, kBarV = 11;
// setmaxnreg split of the 384 x 168 registers the launch allocates (setmaxnreg.inc waits for
// registers the others released, so a split past that allocation never returns). 104 / 200 spill a
// few scalars on each side (20-40 bytes: loop-invariant values reloaded a few times per item); the
// splits either way spill 100+ bytes.
constexpr int kBcChainRegs = 104, kBcRowsRegs = 200;
constexpr int kBcWsLaunchRegs = 65536 / kBcWsThreads / 8 * 8;  // per thread, by __launch_bounds__: 168
static_assert(128 * kBcChainRegs + 256 * kBcRowsRegs <= kBcWsThreads * kBcWsLaunchRegs, "the launch's registers");

// The start-address step of k16 step kk: K-major operands (panels of 64 K-columns, kDlPanel bytes
// apart) 32 bytes inside a panel; MN-major ones 16 K-rows (2048 bytes).
template <int kMN>
__device__ __forceinline__ uint32_t k_step(int kk) {
  return kMN ? kk * 2048u : (kk >> 2) * kDlPanel + (kk & 3) * 32u;
}
// acc (+)= A B over kSteps k16 steps, both from smem (kTA / kTB: 1 = MN-major); no fence or commit.
template <int kN, int kTB, int kTA, int kSteps, bool kF16 = false>
__device__ __forceinline__ void bc_ss(float (&acc)[kN / 2], const void* a, const void* b, bool accumulate) {
  const uint64_t da = wg::desc_opaque(wg::desc_sw128(a, kTA ? kDlPanel : 16, 1024));
  const uint64_t db = wg::desc_opaque(wg::desc_sw128(b, kTB ? kDlPanel : 16, 1024));
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t ak = wg::desc_advance(da, k_step<kTA>(kk)), bk = wg::desc_advance(db, k_step<kTB>(kk));
    const int sc = (accumulate || kk > 0) ? 1 : 0;
    if constexpr (kN == 32)
      wg::mma_m64n32k16<kTB, kTA, kF16>(acc, ak, bk, sc);
    else
      wg::mma_m64n64k16<kTB, kTA, kF16>(acc, ak, bk, sc);
  }
}
// acc (+)= A B, A from registers (kSteps k16 fragments), B from smem.
template <int kTB, int kSteps, bool kF16 = false>
__device__ __forceinline__ void bc_rs(float (&acc)[kC / 2], const uint32_t (&a)[kSteps][4], const void* b,
                                      bool accumulate) {
  const uint64_t db = wg::desc_opaque(wg::desc_sw128(b, kTB ? kDlPanel : 16, 1024));
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    wg::mma_m64n64k16_rs<kTB, kF16>(acc, a[kk], wg::desc_advance(db, k_step<kTB>(kk)), (accumulate || kk > 0) ? 1 : 0);
}
// The fp16 A fragments of an m64n64 accumulator as the A operand over its columns.
__device__ __forceinline__ void acc_frags16(const float (&x)[kC / 2], uint32_t (&a)[kC / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * kk + (q >> 1), hh = q & 1;
      a[kk][q] = gdn_mma::pack_f16(x[4 * nb + 2 * hh], x[4 * nb + 2 * hh + 1]);
    }
}
// In place, each 16-byte chunk c = tid + kThr u < bytes / 16 of a smem tile: bf16 -> fp16 times sc.
template <int kThr>
__device__ __forceinline__ void tile_bf16_to_f16(char* tile, int bytes, float sc, int tid) {
  for (int c = tid; c < bytes / 16; c += kThr) {
    uint4 w = *reinterpret_cast<const uint4*>(tile + 16 * c);
    uint32_t* x = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      x[e] = gdn_mma::pack_f16(sc * __uint_as_float(x[e] << 16), sc * __uint_as_float(x[e] & 0xffff0000u));
    *reinterpret_cast<uint4*>(tile + 16 * c) = w;
  }
}
// In place: the hi / lo bf16 panels (hi at hi, lo at lo, same layout) -> one fp16 panel at hi.
template <int kThr>
__device__ __forceinline__ void planes_to_f16(char* hi, const char* lo, int bytes, int tid) {
  for (int c = tid; c < bytes / 16; c += kThr) {
    uint4 w = *reinterpret_cast<const uint4*>(hi + 16 * c);
    const uint4 l = *reinterpret_cast<const uint4*>(lo + 16 * c);
    uint32_t* x = reinterpret_cast<uint32_t*>(&w);
    const uint32_t* y = reinterpret_cast<const uint32_t*>(&l);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      x[e] = gdn_mma::pack_f16(__uint_as_float(x[e] << 16) + __uint_as_float(y[e] << 16),
                               __uint_as_float(x[e] & 0xffff0000u) + __uint_as_float(y[e] & 0xffff0000u));
    *reinterpret_cast<uint4*>(hi + 16 * c) = w;
  }
}
// The hi / lo A fragments of an m64n64 accumulator as the A operand of a product over its columns.
__device__ __forceinline__ void acc_frags(const float (&x)[kC / 2], uint32_t (&ah)[kC / 16][4],
                                          uint32_t (&al)[kC / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * kk + (q >> 1), hh = q & 1;
      gdn_mma::split_bf16(x[4 * nb + 2 * hh], x[4 * nb + 2 * hh + 1], ah[kk][q], al[kk][q]);
    }
}
// The accumulator's element (r, c) of thread (warp w of its warpgroup, g, t): register 4 nb + 2 hh + e
// holds row 16 w + g + 8 hh, column 8 nb + 2 t + e. f(v, r, c) per element, in that order.
template <int kN, class F>
__device__ __forceinline__ void acc_each(float (&acc)[kN / 2], F&& f) {
  const auto [w, g, t] = wg_lane();
#pragma unroll
  for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) f(acc[4 * nb + 2 * hh + e], 16 * w + g + 8 * hh, 8 * nb + 2 * t + e);
}
// Sums each of a thread's kV values over the 8 lanes sharing lane % 4 (lane bits 2-4) by halving
// exchanges: each xor step sends half of the values still held and adds the other half received, so
// 8 + 4 + 2 shuffles reduce 16 values (the plain xor tree takes 48). On return v[k], k < kV / 8,
// holds the full sum of value halving_index<kV>(k).
template <int kV, int kStep = 0>
__device__ __forceinline__ void xor_halving_sum(float (&v)[kV]) {
  constexpr int n = (kV >> kStep) / 2;
  const bool up = ((tid_x() & 31) >> (2 + kStep)) & 1;
#pragma unroll
  for (int k = 0; k < n; ++k) {
    const float send = up ? v[k] : v[k + n], keep = up ? v[k + n] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4 << kStep);
  }
  if constexpr (kStep < 2) xor_halving_sum<kV, kStep + 1>(v);
}
// The value index whose sum xor_halving_sum leaves in v[k] of this lane: the upper half at step s
// when lane bit 2 + s is set, so index = k + (kV / 2) b0 + (kV / 4) b1 + (kV / 8) b2.
template <int kV>
__device__ __forceinline__ int halving_index(int k) {
  const int g = (tid_x() & 31) >> 2;
  return k + (kV / 2) * (g & 1) + (kV / 4) * ((g >> 1) & 1) + (kV / 8) * ((g >> 2) & 1);
}
// red[c0 + c] (this warp's slot: the caller offsets red by warp * kC) = sum over the warp's 16 rows
// of f(v, q) (v the accumulator's register q): per thread its two rows, then xor_halving_sum over g.
template <int kN, class F>
__device__ __forceinline__ void acc_col_sums(float* red, const float (&acc)[kN / 2], int c0, F&& f) {
  const int t = tid_x() & 3;
  float p[kN / 4];  // value 2 nb + e: column 8 nb + 2 t + e
#pragma unroll
  for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 2; ++e) p[2 * nb + e] = f(acc[4 * nb + e], 4 * nb + e) + f(acc[4 * nb + 2 + e], 4 * nb + 2 + e);
  xor_halving_sum(p);
#pragma unroll
  for (int k = 0; k < kN / 32; ++k) {
    const int u = halving_index<kN / 4>(k);
    red[c0 + 8 * (u >> 1) + 2 * t + (u & 1)] = p[k];
  }
}
// red[r] (the caller offsets red by its warpgroup's slot) = sum over the accumulator's kN columns of
// f(v, q) (v its register q): per thread, then the xor tree over t.
template <int kN, class F>
__device__ __forceinline__ void acc_row_sums(float* red, const float (&acc)[kN / 2], F&& f) {
  const auto [w, g, t] = wg_lane();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = 16 * w + g + 8 * hh;
    float s = 0.f;
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) s += f(acc[4 * nb + 2 * hh + e], 4 * nb + 2 * hh + e);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (t == 0) red[r] = s;
  }
}
// The bf16 values of a 64-row panel tile at this thread's m64n64 accumulator positions (row r, column
// c as acc_each), packed x[2 nb + hh] = the pair at columns 8 nb + 2 t, + 1 of row 16 w + g + 8 hh, by
// 4 ldmatrix.x4: kTrans, the tile holds rows c, columns base + r (X^T: q, k against dq^T, dk^T);
// otherwise rows r, columns base + c (v against dv). Matrix mm of block kb is (hh, nb) = (mm & 1,
// 2 kb + mm / 2); its row lane % 8 is addressed by lane.
template <bool kTrans>
__device__ __forceinline__ void panel_frag(uint32_t (&x)[kC / 4], const char* tile, int base) {
  const int w = (tid_x() >> 5) & 3, lane = tid_x() & 31, mm = lane >> 3, rr = lane & 7;
#pragma unroll
  for (int kb = 0; kb < kC / 16; ++kb) {
    const int ar = 16 * w + 8 * (mm & 1), ac = 16 * kb + 8 * (mm >> 1);  // the matrix's first acc row, column
    const int row = kTrans ? ac + rr : ar + rr, col = kTrans ? base + ar : base + ac;
    uint32_t r[4];
    gdn_mma::ldmatrix_x4<kTrans>(
        r, reinterpret_cast<const bf16*>(tile + (col >> 6) * kDlPanel + wg::sw128(row, col & 63)));
#pragma unroll
    for (int m = 0; m < 4; ++m) x[2 * (2 * kb + (m >> 1)) + (m & 1)] = r[m];
  }
}
// Element e of packed pair x[2 nb + hh] (the acc_each order: register 4 nb + 2 hh + e).
__device__ __forceinline__ float pair_at(const uint32_t (&x)[kC / 4], int q) {
  const uint32_t v = x[q >> 1];
  return __uint_as_float((q & 1) ? (v & 0xffff0000u) : (v << 16));
}
// The same for fp16 pairs.
__device__ __forceinline__ float pair_at16(const uint32_t (&x)[kC / 4], int q) {
  const float2 v = gdn_mma::unpack_f16(x[q >> 1]);
  return (q & 1) ? v.y : v.x;
}
// Writes a transposed C x K result (rows d = d0 + r, columns i) as bf16 to out rows i < len (row
// stride ld): at nb's 8 columns, cx = per_cols(nb) once, then value(cx, q, e) for accumulator position
// q (acc_each's order), column 8 nb + 2 t + e. Lanes g, g ^ 1 exchange one value per pair of columns,
// so each store is 2 consecutive d of one row (4 bytes). The base pointer is hidden from the optimizer
// (as desc_opaque does for descriptors), so that the addresses are formed here instead of hoisted to
// the kernel's start and spilled.
template <class PerCols, class Value>
__device__ __forceinline__ void store_pairs_t(bf16* out, size_t ld, int d0, int len, PerCols per_cols, Value value) {
  const auto [w, g, t] = wg_lane();
  const int odd = g & 1;
  bf16* p = out + static_cast<size_t>(2 * t + odd) * ld + d0 + 16 * w + g - odd;  // row 2 t + odd, column d
  asm volatile("" : "+l"(p));
#pragma unroll
  for (int nb = 0; nb < kC / 8; ++nb) {
    const auto cx = per_cols(nb, t);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) v[e] = value(cx, 4 * nb + 2 * hh + e, e);
      const float recv = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 4);
      const int i = 8 * nb + 2 * t + odd;
      if (i < len) store_bf16x2(p + static_cast<size_t>(8 * nb) * ld + 8 * hh, odd ? recv : v[0], odd ? v[1] : recv);
    }
  }
}
// acc^T as bf16 (dq^, dk^ per value head for qk_grad).
__device__ __forceinline__ void store_t(bf16* out, size_t ld, const float (&acc)[kC / 2], int d0, int len) {
  store_pairs_t(out, ld, d0, len, [](int, int) { return 0; }, [&](int, int q, int) { return acc[q]; });
}

// The L2-norm backward of a transposed C x K result (dy^ = acc: rows d = d0 + r, columns i) written as
// bf16 to out rows i < len (row stride ld): dx_i = r_i dy^_i - kf r_i^2 (x^_i . dy^_i) x_i, with x the raw
// row at the accumulator positions (panel_frag<true>), r_i its scale (rq, rk: (ss + eps)^-1/2, times
// K^-1/2 for q, so kf = K there and 1 for k) and dot[i] = x^_i . dy^_i.
__device__ __forceinline__ void store_l2_t(bf16* out, size_t ld, const float (&acc)[kC / 2],
                                           const uint32_t (&x)[kC / 4], const float* dot, const float* r, float kf,
                                           int d0, int len) {
  struct Cols {
    float a[2], c[2];
  };
  store_pairs_t(
      out, ld, d0, len,
      [&](int nb, int t) {
        const float2 rr = ld_f2(r + 8 * nb + 2 * t), dd = ld_f2(dot + 8 * nb + 2 * t);
        return Cols{{rr.x, rr.y}, {kf * rr.x * rr.x * dd.x, kf * rr.y * rr.y * dd.y}};
      },
      [&](const Cols& cx, int q, int e) { return cx.a[e] * acc[q] - cx.c[e] * pair_at(x, q); });
}

// A C x C epilogue's thread (P1, Mx: m64n32, columns j0..j0 + 31 of the warpgroup): its rows
// i0, i0 + 8 (i0 = 16 w + g) and columns j0 + 8 nb + 2 t + e (value c = 2 nb + e), with G log2(e)
// and rk at them, read once. gam(hh, c) = e^{G_i - G_j}; i(hh), j(c) the indices.
struct CcThread {
  int i0, j0, t;
  float g2i[2], g2j[8], rkj[8];
  __device__ CcThread(const float* g2, const float* rk, int j0_, int w, int lane)
      : i0(16 * w + (lane >> 2)), j0(j0_), t(lane & 3) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) g2i[hh] = g2[i0 + 8 * hh];
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
      const float2 a = ld_f2(g2 + j0 + 8 * nb + 2 * t), r = ld_f2(rk + j0 + 8 * nb + 2 * t);
      g2j[2 * nb] = a.x;
      g2j[2 * nb + 1] = a.y;
      rkj[2 * nb] = r.x;
      rkj[2 * nb + 1] = r.y;
    }
  }
  __device__ int i(int hh) const { return i0 + 8 * hh; }
  __device__ int j(int c) const { return j0 + 8 * (c >> 1) + 2 * t + (c & 1); }
  __device__ float gam(int hh, int c) const { return ex2_ftz(g2i[hh] - g2j[c]); }
  // rows[i] = the row sums over the warpgroup's 32 columns (xor over t); cols[j] (this warp's slot)
  // = the column sums over the warp's 16 rows (xor over g).
  __device__ void store_sums(float (&rsum)[2], float (&csum)[8], float* rows, float* cols) const {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float r = rsum[hh];
      r += __shfl_xor_sync(0xffffffffu, r, 1);
      r += __shfl_xor_sync(0xffffffffu, r, 2);
      if (t == 0) rows[i(hh)] = r;
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float x = csum[c];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if ((i0 & 15) == 0) cols[j(c)] = x;  // g == 0
    }
  }
};

// kL2 (one value head per key head): the L2-norm backward runs here and dq, dk go to dqkv as bf16
// (no qk_grad, no dqn / dkn); otherwise dq^, dk^ per value head go to dqn, dkn as bf16 (qk_grad sums
// them in fp32: the rounding flash-linear-attention's repeated q, k get in transformers, where the
// repeat's backward sums bf16 per-head gradients; fp32 partials made qk_grad read twice the bytes).
template <bool kL2, bool kWs, bool kF16 = false>
__global__ void __launch_bounds__(kWs ? kBcWsThreads : 256, 1) gdn_bwd_chunk_wgmma_kernel(
    bf16* dqn, bf16* dkn, bf16* dqkv, float* dg, float* dbeta, const int4* rtable, const int* nchunks,
    const float* rs, const bf16* qkv, const float* g, const float* beta, const bf16* Dgh, const bf16* Dgl,
    const bf16* dDgh, const bf16* dDgl, const float* h, const float* dh, const bf16* d_o, const bf16* Th,
    const bf16* Tl, int Hk, int Hv, int conv_dim, const int* done_fwd, const int* done, int* work, const int* counts,
    const float* scl) {
  static_assert(!kF16 || kWs, "the fp16 form is warp-specialized");
  constexpr int D = kDlD;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  char* sm = align1024(smem_raw);
  char *sQ = sm + kBcQ, *sK = sm + kBcK, *sO = sm + kBcO, *sD = sm + kBcD, *sDD = sm + kBcDD, *sV = sm + kBcV,
       *sT = sm + kBcT, *sY = sm + kBcY, *sW = sm + kBcW;
  float* fl = reinterpret_cast<float*>(sm + kBcTiles);
  int par = 0;  // the item's row-data block
  const size_t x_ld = static_cast<size_t>(conv_dim), vh_ld = static_cast<size_t>(Hv) * D, dk_ld = vh_ld;
  // cp.async of the fp32 state rows 64 half .. + 63 of item's (chunk chn.w, head) (32 KB,
  // fragment-native; the states are stored chunk-major).
  // zero_flag: rtable's flag under which the state is 0 and unstored (chunk_state).
  // kF16: 16 KB of halves.
  auto async_state_half = [&](char* dst, const float* src, int item, int4 chn, int half, int zero_flag) {
    using E = std::conditional_t<kF16, __half, float>;
    constexpr int kPer16 = 16 / static_cast<int>(sizeof(E));  // elements per 16-byte piece
    const E* p = chunk_state<E>(src, chn, zero_flag, Hv, item % Hv, D, D) + half * (D * D / 2);
#pragma unroll 4
    for (int u = 0; u < D * D / 2 / kPer16 / 256; ++u) {
      const int e = tid_x() + 256 * u;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(wg::smem_addr(dst + 16 * e)), "l"(p + kPer16 * e)
                   : "memory");
    }
  };
  // Item's first row in the [T, Hv, D] tensors, from its chunk's table entry chn (read once per item).
  auto item_ro = [&](int item, int4 chn) { return (static_cast<size_t>(chn.x) * Hv + item % Hv) * D; };
  // The next item's operands that can land while this one finishes, each as soon as its region is
  // free: S0 (Y's and W's regions, after dT), dD (after dv), D and dS's second half (D's, v's and T's
  // regions, after Mx). One cp.async group each.
  // Beside the scans: each thread waits for an item's (segment, head) flags until it has seen a scan's
  // count of them complete (counts[1] segments x Hv heads), then never again (the flags' acquires, and
  // the L1 invalidation each brings, were ~2.7 % of the stall samples at 27B).
  bool fwd_all = false, rev_all = false;
  auto wait_scan = [&](const int* flags, int s, int head, bool& all) {
    if (flags == nullptr || all) return;
    if (ld_acquire(flags - 1) >= counts[1] * Hv) {
      all = true;
      return;
    }
    wait_done(flags, s, Hv, head);
  };
  auto async_early_s0 = [&](int item, int4 chn) {
    wait_scan(done_fwd, chn.z & kRtSeg, item % Hv, fwd_all);
    async_state_half(sY, h, item, chn, 0, kRtFirst);
    async_state_half(sW, h, item, chn, 1, kRtFirst);
    cp_async_commit();
  };
  // S0 and dD are the first of the forward scan's and the reverse scan's outputs an item reads:
  // beside those scans, wait for their (sample, head) first.
  auto async_early_dd = [&](int item, int4 chn) {
    wait_scan(done, chn.z & kRtSeg, item % Hv, rev_all);
    const size_t r = item_ro(item, chn);
    async_panels<256>(sDD, dDgh + r, vh_ld, chn.y, tid_x());
    if constexpr (!kF16) async_panels<256>(sDD + kDlTile, dDgl + r, vh_ld, chn.y, tid_x());
    cp_async_commit();
  };
  auto async_early_d = [&](int item, int4 chn) {
    const size_t r = item_ro(item, chn);
    async_panels<256>(sD, Dgh + r, vh_ld, chn.y, tid_x());
    if constexpr (!kF16) async_panels<256>(sD + kDlTile, Dgl + r, vh_ld, chn.y, tid_x());
    async_state_half(sV, dh, item, chn, 1, kRtLast);
    cp_async_commit();
  };
  // dS's first half (q, k regions) and dO (dO's region), the last of an item's state-product
  // operands: issued once the previous item's final dk^ product has read k, Pa and Pb there.
  auto async_late = [&](int item, int4 chn) {
    async_state_half(sQ, dh, item, chn, 0, kRtLast);
    cp_async_commit();
    async_panels<256>(sO, d_o + item_ro(item, chn), vh_ld, chn.y, tid_x());
    cp_async_commit();
  };
  // An item's chunk (first row, length) and gate rows, read ahead like its tiles: at an item's start
  // they would be the only global reads left in its chain. Lanes of warp 2 hold the gates and beta
  // of rows 2 lane, 2 lane + 1 (load_gates' layout), threads kC + i the L2 scales of row i: warps 2, 3
  // form the item's row data (row_data) while warps 0, 1 finish the item before it.
  struct ItemGates {
    int4 ch;
    float g0, g1, b0, b1;
    float2 r;
    float4 sc;   // kF16: the scans' scales of (chunk, head): h, D, dh, dD
    float2 sc2;  // dO, v
  };
  auto item_gates = [&](int item, int4 chn) {
    ItemGates x;
    const int hd = item % Hv, t = tid_x() - kC;
    x.ch = chn;
    x.g0 = x.g1 = x.b0 = x.b1 = 0.f;
    x.r = make_float2(0.f, 0.f);
    const size_t row0 = static_cast<size_t>(x.ch.x);
    if (t >= 0 && t < 32) {
      if (2 * t < x.ch.y) {
        x.g0 = g[(row0 + 2 * t) * Hv + hd];
        x.b0 = beta[(row0 + 2 * t) * Hv + hd];
      }
      if (2 * t + 1 < x.ch.y) {
        x.g1 = g[(row0 + 2 * t + 1) * Hv + hd];
        x.b1 = beta[(row0 + 2 * t + 1) * Hv + hd];
      }
    }
    if (t >= 0 && t < x.ch.y) x.r = reinterpret_cast<const float2*>(rs)[(row0 + t) * Hk + hd / (Hv / Hk)];
    if constexpr (kF16)
      if (t == 0) {
        const float* sp = scl + (static_cast<size_t>(x.ch.w) * Hv + hd) * kSclFloats;
        x.sc = *reinterpret_cast<const float4*>(sp);
        x.sc2 = *reinterpret_cast<const float2*>(sp + kSclDo);
      }
    return x;
  };
  // The fp16 form's scales of the item whose row data is block rb (kBcScl: kScl*).
  auto scales_of = [&](const float* rb) { return fl + kBcScl + (rb == fl ? 0 : kSclFloats); };
  // scale_of the largest m over the chain warpgroup's 128 threads (kWs; all call it).
  auto chain_scale = [&](float m) {
    m = warp_max(m);
    if ((tid_x() & 31) == 0) fl[kBcRedC + ((tid_x() >> 5) & 3)] = m;
    wg::named_sync(kBarChain, 128);
    return scale_of(fmaxf(fmaxf(fl[kBcRedC], fl[kBcRedC + 1]), fmaxf(fl[kBcRedC + 2], fl[kBcRedC + 3])));
  };
  // The row data of ig's item into block rb: G = the chunk-local cumsum of g (load_gates' scan), beta,
  // e^G, e^{G_L - G}, G log2(e), the L2 scales. Warps 2, 3 only (named barrier 1 between the scan and
  // its readers); the caller's next block barrier makes it visible.
  auto row_data = [&](const ItemGates& x, float* rb) {
    const int t = tid_x() - kC;
    if (t < 0 || t >= kC) return;
    if (t < 32) {
      gate_cumsum(rb + kBcGs, t, x.g0, x.g1);
      rb[kBcBs + 2 * t] = x.b0;
      rb[kBcBs + 2 * t + 1] = x.b1;
    }
    rb[kBcRq + t] = x.r.x;
    rb[kBcRk + t] = x.r.y;
    if constexpr (kF16)
      if (t == 0) {
        *reinterpret_cast<float4*>(scales_of(rb)) = x.sc;
        *reinterpret_cast<float2*>(scales_of(rb) + kSclDo) = x.sc2;
      }
    wg::named_sync(1, 64);
    const float gt = rb[kBcGs + t], gl = rb[kBcGs + kC - 1];
    rb[kBcEg + t] = expf(gt);
    rb[kBcEkl + t] = expf(gl - gt);
    rb[kBcG2 + t] = gt * kLog2e;
  };
  // The C x C chain's four phases. A phase's products form columns c0 .. c0 + N - 1 of its C x C
  // results (N from the accumulators' size: 32, one half per warpgroup, or 64 in the kWs chain's
  // warpgroup, which reads each A operand once); its epilogue takes the 32 columns 32 half .. of the
  // item with row data rb (an m64n64 accumulator's registers 16 half .. are its m64n32 half). The
  // caller makes the planes visible (fence_proxy_async, barrier) before the next phase reads them.
  // The register halves of an m64n64 accumulator (for the m64n32 epilogues).
  auto half_of = [](const float(&acc)[kC / 2], int half, float(&out)[16]) {
#pragma unroll
    for (int r = 0; r < 16; ++r) out[r] = acc[16 * half + r];
  };
  // P1: dP = dO D^T (D split: 2 products), q k^T (exact).
  auto cc_p1_products = [&](auto& dp, auto& qk, int c0) {
    constexpr int N = 2 * static_cast<int>(sizeof(dp) / sizeof(float));
    wg::fence();
    bc_ss<N, 0, 0, D / 16, kF16>(dp, sO, sD + c0 * 128, false);
    if constexpr (!kF16) bc_ss<N, 0, 0, D / 16>(dp, sO, sD + kDlTile + c0 * 128, true);
    bc_ss<N, 0, 0, D / 16>(qk, sQ, sK + c0 * 128, false);
    wg::commit();
  };
  auto cc_p1_epilogue = [&](const float* rb, int half, float(&dp)[16], const float(&qk)[16]) {
    const int lane = tid_x() & 31, wq = (tid_x() >> 5) & 3;
    const float* sb = scales_of(rb);
    const float inv = kF16 ? 1.f / (sb[kSclDo] * sb[kSclD]) : 1.f;  // dP = (dO s_dO)(D s_D)^T
    const float *rq = rb + kBcRq, *rk = rb + kBcRk, *g2 = rb + kBcG2;
    // Y_ij = dP_ij e^{G_i - G_j} (j <= i); the dP . P sums leave the diagonal out (it cancels in
    // rowsum - colsum exactly; see gdn_bwd_chunk_kernel's P1). The row and column scalars of this
    // thread's 2 rows and 8 columns are read once.
    const int j0 = 32 * half;
    const CcThread ct(g2, rk, j0, wq, lane);
    const float rqi[2] = {rq[ct.i(0)], rq[ct.i(1)]};
    float rsum[2] = {0.f, 0.f}, csum[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      csum[c] = 0.f;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int q = 4 * (c >> 1) + 2 * hh + (c & 1), i = ct.i(hh), j = ct.j(c);
        const float y = j <= i ? dp[q] * (inv * ct.gam(hh, c)) : 0.f;
        const float pp = j < i ? y * qk[q] * rqi[hh] * ct.rkj[c] : 0.f;
        if (kL2 && j == i) fl[kBcDiag + i] = y * qk[q] * rqi[hh] * ct.rkj[c];  // (q^_i . k^_i) Y_ii
        dp[q] = y;
        rsum[hh] += pp;
        csum[c] += pp;
      }
    }
    ct.store_sums(rsum, csum, fl + kBcRowA + half * kC, fl + kBcColA + wq * kC);
    acc_planes<32, false>(sY, nullptr, dp, 0, j0,
                          [&](float v, int, int j) { return v * ct.rkj[2 * (j >> 3) + (j & 1)]; });
    acc_planes<32, false>(sY + kDlPanel, nullptr, dp, 0, j0,
                          [&](float v, int i, int) { return v * rqi[(i >> 3) & 1]; });
  };
  // dT_ml = b_l (dD_m . v_l + e^{G_l} rk_l dW_m . k_l) for l < m, l < len: a1 = dD v^T, a2 = dW k^T
  // (a1 needs no dW: the kWs chain issues it before dW's planes are written).
  auto cc_dt_a1 = [&](auto& a1, int c0) {
    constexpr int N = 2 * static_cast<int>(sizeof(a1) / sizeof(float));
    wg::fence();
    bc_ss<N, 0, 0, D / 16, kF16>(a1, sDD, sV + c0 * 128, false);
    if constexpr (!kF16) bc_ss<N, 0, 0, D / 16>(a1, sDD + kDlTile, sV + c0 * 128, true);
    wg::commit();
  };
  auto cc_dt_a2 = [&](auto& a2, int c0) {
    constexpr int N = 2 * static_cast<int>(sizeof(a2) / sizeof(float));
    wg::fence();
    bc_ss<N, 0, 1, D / 16>(a2, sW, sK + c0 * 128, false);
    bc_ss<N, 0, 1, D / 16>(a2, sW + kDlTile, sK + c0 * 128, true);
    wg::commit();
  };
  // dT into a1, then its planes [m][l] (into dO's region).
  auto cc_dt_epilogue = [&](const float* rb, int len, auto& a1, const auto& a2, int l0) {
    constexpr int N = 2 * static_cast<int>(sizeof(a1) / sizeof(float));
    float* sb = scales_of(rb);
    const float inv = kF16 ? 1.f / (sb[kSclDd] * sb[kSclV]) : 1.f;  // a1 = (dD s_dD)(v s_v)^T
    const float *bs = rb + kBcBs, *eg = rb + kBcEg, *rk = rb + kBcRk;
    const int lane = tid_x() & 31, m0 = 16 * ((tid_x() >> 5) & 3) + (lane >> 2), t = lane & 3;
#pragma unroll
    for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = 4 * nb + 2 * hh + e, m = m0 + 8 * hh, l = l0 + 8 * nb + 2 * t + e;
          a1[q] = (l < m && l < len) ? bs[l] * (inv * a1[q] + eg[l] * rk[l] * a2[q]) : 0.f;
        }
    // kF16 (the chain warpgroup's whole dT): its fp16 plane times s_dT; X1 and Mx carry the scale
    float s_dt = 1.f;
    if constexpr (kF16) {
      float m = 0.f;
#pragma unroll
      for (int q = 0; q < N / 2; ++q) m = fmaxf(m, fabsf(a1[q]));
      s_dt = chain_scale(m);
      if (tid_x() == 256) sb[kSclDt] = s_dt;
    }
    acc_planes<N, true, kF16>(sO, sO + kDlPanel, a1, 0, l0, [&](float v, int, int) { return s_dt * v; });
  };
  // X1^T = T dT^T: planes [j][m] (into D's region).
  auto cc_x1 = [&](auto& x1, int c0) {
    constexpr int N = 2 * static_cast<int>(sizeof(x1) / sizeof(float));
    wg::fence();
    bc_ss<N, 0, 0, kC / 16, kF16>(x1, sT, sO + c0 * 128, false);
    if constexpr (!kF16) {
      bc_ss<N, 0, 0, kC / 16>(x1, sT + kDlPanel, sO + c0 * 128, true);
      bc_ss<N, 0, 0, kC / 16>(x1, sT, sO + kDlPanel + c0 * 128, true);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(x1);
    acc_planes<N, true, kF16>(sD, sD + kDlPanel, x1, 0, c0, [](float v, int, int) { return v; });
  };
  // Mx = -(T^T X1) . Gam (j < i), k k^T; F = Mx . (k^ k^T): row sums (dbeta, dG) and the column sums
  // of diag(b) F (dG); planes Pa = Mx_ij b_i rk_j, Pb = Mx_ij b_i rk_i.
  auto cc_mx_products = [&](auto& mx, auto& kq, int c0) {
    constexpr int N = 2 * static_cast<int>(sizeof(mx) / sizeof(float));
    wg::fence();
    bc_ss<N, 0, 1, kC / 16, kF16>(mx, sT, sD + c0 * 128, false);
    if constexpr (!kF16) {
      bc_ss<N, 0, 1, kC / 16>(mx, sT + kDlPanel, sD + c0 * 128, true);
      bc_ss<N, 0, 1, kC / 16>(mx, sT, sD + kDlPanel + c0 * 128, true);
    }
    bc_ss<N, 0, 0, D / 16>(kq, sK, sK + c0 * 128, false);
    wg::commit();
  };
  auto cc_mx_epilogue = [&](const float* rb, int half, float(&mx)[16], const float(&kq)[16]) {
    const int lane = tid_x() & 31, wq = (tid_x() >> 5) & 3;
    const float* sb = scales_of(rb);
    const float inv = kF16 ? 1.f / sb[kSclDt] : 1.f;  // Mx = T^T T (dT s_dT)^T
    const float *bs = rb + kBcBs, *rk = rb + kBcRk, *g2 = rb + kBcG2;
    const int j0 = 32 * half;
    const CcThread ct(g2, rk, j0, wq, lane);
    const float bi[2] = {bs[ct.i(0)], bs[ct.i(1)]}, rki[2] = {rk[ct.i(0)], rk[ct.i(1)]};
    float rsum[2] = {0.f, 0.f}, csum[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      csum[c] = 0.f;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int q = 4 * (c >> 1) + 2 * hh + (c & 1);
        const float m = ct.j(c) < ct.i(hh) ? -mx[q] * (inv * ct.gam(hh, c)) : 0.f;
        const float f = m * kq[q] * rki[hh] * ct.rkj[c];
        mx[q] = m;
        rsum[hh] += f;
        csum[c] += bi[hh] * f;
      }
    }
    ct.store_sums(rsum, csum, fl + kBcRowF + half * kC, fl + kBcColF + wq * kC);
    acc_planes<32, false>(sO, nullptr, mx, 0, j0,
                          [&](float v, int i, int j) { return v * bi[(i >> 3) & 1] * ct.rkj[2 * (j >> 3) + (j & 1)]; });
    acc_planes<32, false>(sQ, nullptr, mx, 0, j0,
                          [&](float v, int i, int) { return v * bi[(i >> 3) & 1] * rki[(i >> 3) & 1]; });
  };
  // One warpgroup's half of each phase (the two-warpgroup form).
  auto cc_p1 = [&](const float* rb, int half) {
    float dp[16], qk[16];
    cc_p1_products(dp, qk, 32 * half);
    wg::wait<0>();
    wg::fence_operands(dp);
    wg::fence_operands(qk);
    cc_p1_epilogue(rb, half, dp, qk);
  };
  auto cc_dt = [&](const float* rb, int half, int len) {
    float a1[16], a2[16];
    cc_dt_a1(a1, 32 * half);
    cc_dt_a2(a2, 32 * half);
    wg::wait<0>();
    wg::fence_operands(a1);
    wg::fence_operands(a2);
    cc_dt_epilogue(rb, len, a1, a2, 32 * half);
  };
  auto cc_mx = [&](const float* rb, int half) {
    float mx[16], kq[16];
    cc_mx_products(mx, kq, 32 * half);
    wg::wait<0>();
    wg::fence_operands(mx);
    wg::fence_operands(kq);
    cc_mx_epilogue(rb, half, mx, kq);
  };
  // dv = diag(b) T^T dD (columns n = 64 half ..), and v . (T^T dD) per row (dbeta): early, so that dD's
  // and v's regions are free for the next item before this one's last phase.
  auto bc_dv = [&](const float* rb, int half, int bos, int head, int len) {
    const float* bs = rb + kBcBs;
    float r[kC / 2];
    wg::fence();
    bc_ss<kC, 1, 1, kC / 16, kF16>(r, sT, sDD + half * kDlPanel, false);
    if constexpr (!kF16) {
      bc_ss<kC, 1, 1, kC / 16>(r, sT + kDlPanel, sDD + half * kDlPanel, true);
      bc_ss<kC, 1, 1, kC / 16>(r, sT, sDD + kDlTile + half * kDlPanel, true);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(r);
    const float* sb = scales_of(rb);
    if constexpr (kF16) {
      const float inv = 1.f / sb[kSclDd];  // T^T (dD s_dD)
#pragma unroll
      for (int q = 0; q < kC / 2; ++q) r[q] *= inv;
    }
    {
      uint32_t vx[kC / 4];
      panel_frag<false>(vx, sV, 64 * half);
      const float vinv = kF16 ? 1.f / sb[kSclV] : 1.f;
      acc_row_sums<kC>(fl + kBcRowV + half * kC, r,
                       [&](float v, int q) { return (kF16 ? vinv * pair_at16(vx, q) : pair_at(vx, q)) * v; });
    }
    bf16* dvbase = dqkv + static_cast<size_t>(bos) * conv_dim + 2 * Hk * D + head * D + 64 * half;
    const int lane = tid_x() & 31, w = (tid_x() >> 5) & 3, gg = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nb = 0; nb < kC / 8; ++nb)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = 16 * w + gg + 8 * hh;
        if (i < len)
          store_bf16x2(dvbase + static_cast<size_t>(i) * conv_dim + 8 * nb + 2 * t, bs[i] * r[4 * nb + 2 * hh],
                       bs[i] * r[4 * nb + 2 * hh + 1]);
      }
  };
  // Combine (fixed order) the item's row / column partials into dG and dbeta (thread lt < C: row
  // lt); then dg_reverse_cumsum adds the G_L terms into row C - 1 and sums dG in reverse.
  auto bc_combine = [&](const float* rb, int lt) {
    const float *bs = rb + kBcBs, *eg = rb + kBcEg, *rq = rb + kBcRq, *rk = rb + kBcRk;
    float* dGa = fl + kBcDg;
    float* dbv = fl + kBcDb;
    if (lt < kC) {
      const int i = lt;
      float s = 0.f, qa = 0.f, xi = 0.f, s2 = 0.f, rf = 0.f, cf = 0.f, sv = 0.f, ca = 0.f;
      for (int p = 0; p < 2; ++p) {
        s += fl[kBcRowA + p * kC + i];
        rf += fl[kBcRowF + p * kC + i];
        sv += fl[kBcRowV + p * kC + i];
      }
      for (int p = 0; p < 4; ++p) {
        ca += fl[kBcColA + p * kC + i];
        cf += fl[kBcColF + p * kC + i];
      }
      s -= ca;
      for (int p = 0; p < 8; ++p) {
        qa += fl[kBcRedE + p * kC + i];
        xi += fl[kBcRedXi + p * kC + i];
        s2 += fl[kBcRedS2 + p * kC + i];
      }
      xi *= rk[i];
      s2 *= rk[i];
      const float b = bs[i], e = eg[i];
      dGa[i] = s + rq[i] * qa - xi + b * rf - cf + b * e * s2;
      dbv[i] = rf + e * s2 + sv;
      fl[kBcXi + i] = xi;
      // kL2: k^_i . dk^_i, term by term as dk^T's products: F^T, (T^T dW) b e^G, q^T Yq (the P1 column
      // sums and the diagonal), k^T Pa (b F's row sums), k^T Pb (diag(b) F's column sums)
      if constexpr (kL2) fl[kBcKdot + i] = xi + b * e * s2 + ca + fl[kBcDiag + i] + b * rf + cf;
    }
  };
  auto bc_store_dg = [&](int lt, int bos, int head, int len) {
    if (lt < len) {
      dg[static_cast<size_t>(bos + lt) * Hv + head] = fl[kBcDg + lt];
      dbeta[static_cast<size_t>(bos + lt) * Hv + head] = fl[kBcDb + lt];
    }
  };
  // Persistent: item k is (chunk rtable[k / Hv].w, head k % Hv): chunk-major, shortest sample first.
  // A CTA walks blockIdx.x, + gridDim.x, ..; or, beside the reverse scan (work != nullptr), takes
  // its items from the counter `work` one item ahead, so CTAs that start early take more of them.
  const int total = *nchunks * Hv;
  int item = blockIdx.x;
  if (work != nullptr) {
    if (threadIdx.x == 0) fl[kBcNext] = __int_as_float(atomicAdd(work, 1));
    __syncthreads();
    item = __float_as_int(fl[kBcNext]);
    __syncthreads();  // read by all before the first item's claim overwrites it
  }
  if constexpr (kWs) {
    // warpgroup 2: the C x C chain of each item the rows warpgroups name in fl[kBcCur]
    if (__shfl_sync(0xffffffffu, tid_x() >> 7, 0) == 2) {
      wg::regs_dec<kBcChainRegs>();
      for (int pc = 0;; pc ^= 1) {
        wg::named_sync(kBarQkvt, kBcWsThreads);
        const int it = __float_as_int(fl[kBcCur]);
        if (it < 0) return;
        const float* rbc = fl + pc * kBcRowData;
        const int4 ch = rtable[it / Hv];
        if constexpr (kF16) {  // v to fp16 times s_v (dT's a1; the rows' dv row dots after kBarDt)
          tile_bf16_to_f16<128>(sV, kDlTile, scales_of(rbc)[kSclV], tid_x() - 256);
          wg::fence_proxy_async();
          wg::named_sync(kBarChain, 128);
        }
        cc_p1(rbc, 0);
        cc_p1(rbc, 1);
        wg::fence_proxy_async();
        wg::named_arrive(kBarY, kBcWsThreads);
        float a1[kC / 2], a2[kC / 2];
        cc_dt_a1(a1, 0);  // beside the rows' epilogues
        wg::named_sync(kBarDw, kBcWsThreads);
        cc_dt_a2(a2, 0);
        wg::wait<0>();
        wg::fence_operands(a1);
        wg::fence_operands(a2);
        wg::named_arrive(kBarDt, kBcWsThreads);
        cc_dt_epilogue(rbc, ch.y, a1, a2, 0);
        wg::fence_proxy_async();
        wg::named_sync(kBarChain, 128);  // dT's planes complete
        {
          float x1[kC / 2];
          cc_x1(x1, 0);
        }
        wg::fence_proxy_async();
        wg::named_sync(kBarChain, 128);  // X1's planes complete
        float mx[kC / 2], kq[kC / 2];
        cc_mx_products(mx, kq, 0);
        wg::wait<0>();
        wg::fence_operands(mx);
        wg::fence_operands(kq);
        wg::named_sync(kBarQ, kBcWsThreads);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float m16[16], k16[16];
          half_of(mx, half, m16);
          half_of(kq, half, k16);
          cc_mx_epilogue(rbc, half, m16, k16);
        }
        wg::fence_proxy_async();
        wg::named_arrive(kBarP, kBcWsThreads);
        // the rows' dv row dots; and, as every chain thread meets it too, Mx's sums complete
        wg::named_sync(kBarV, kBcWsThreads);
        const int lt = tid_x() - 256;
        bc_combine(rbc, lt);
        wg::named_sync(kBarChain, 128);
        if constexpr (kL2) wg::named_arrive(kBarK, kBcWsThreads);
        if (lt < 32) dg_reverse_cumsum(fl + kBcDg, fl + kBcXi, fl + kBcSdot + 8 * pc, expf(rbc[kBcGs + kC - 1]));
        wg::named_sync(kBarChain, 128);
        bc_store_dg(lt, ch.x, it % Hv, ch.y);
      }
    }
    wg::regs_inc<kBcRowsRegs>();
  }
  // The rows warpgroups' block barrier (kWs: without the chain's warpgroup).
  auto sync_rows = [] {
    if constexpr (kWs)
      wg::named_sync(kBarRows, 256);
    else
      __syncthreads();
  };
  ItemGates ig{};
  if (item < total) {
    const int4 chn = rtable[item / Hv];
    async_early_s0(item, chn);
    async_early_dd(item, chn);
    async_early_d(item, chn);
    ig = item_gates(item, chn);
    async_late(item, chn);
    row_data(ig, fl);
  }
  while (item < total) {
  const int tid = tid_x(), lane = tid & 31;
  // warp-uniform by construction (a shuffle from lane 0), so the descriptors built from them can sit
  // in uniform registers
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), wgi = warp >> 2;
  const int d0 = 64 * wgi;  // this warpgroup's rows d of the transposed results
  if (work != nullptr && tid == 0) fl[kBcNext] = __int_as_float(atomicAdd(work, 1));  // read after dT
  if (kWs && tid == 0) fl[kBcCur] = __int_as_float(item);
  const int4 ch = ig.ch;
  const int c = ch.w, head = item % Hv;
  const int bos = ch.x, len = ch.y, kh = head / (Hv / Hk);
  const bf16* xrow = qkv + static_cast<size_t>(bos) * x_ld;
  const size_t ro = item_ro(item, ch);  // row 0 of this head in [T, Hv, D] tensors

  // Every tile of the state products was issued during the previous item (the last two, dS's first
  // half and dO, in separate groups: F^T waits for all but dO). q, k, v and T follow into dS's
  // regions once its fragments are read, and land while the state products run. The row data was
  // formed during the previous item (or before the first), in block par.
  float* rb = fl + par * kBcRowData;
  float* sb = scales_of(rb);  // kF16: the scans' scales and the chain's dT (kScl*)
  const float *gs = rb + kBcGs, *bs = rb + kBcBs, *eg = rb + kBcEg, *ekl = rb + kBcEkl, *rq = rb + kBcRq,
              *rk = rb + kBcRk;
  cp_async_wait<1>();
  wg::fence_proxy_async();
  sync_rows();  // all but dO landed

  // The state products, rows d of this warpgroup: F^T = dS D^T, then E^T = S0 dO^T, dW^T = S0 dD^T;
  // the A fragments from the staged rows (this thread's: r0 + g, + 8), <S0, dS_end> on the way.
  const int r0 = d0 + 16 * (warp & 3);
  // row d at d * D: this warpgroup's half of S0 and of dS
  const float* s0s = reinterpret_cast<const float*>(wgi ? sW : sY) - static_cast<size_t>(d0) * D;
  const float* dss = reinterpret_cast<const float*>(wgi ? sV : sQ) - static_cast<size_t>(d0) * D;
  float fT[kC / 2], eT[kC / 2], wT[kC / 2];
  float sdot = 0.f;
  {
    uint32_t ah[D / 16][4], al[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int o = gdn_mma::frag_index(r0 + 8 * hh, 16 * kk, D) + 4 * lane;
        if constexpr (kF16) {  // the staged fp16 rows are the A fragments
          const __half* s016 = reinterpret_cast<const __half*>(wgi ? sW : sY) - static_cast<size_t>(d0) * D;
          const __half* ds16 = reinterpret_cast<const __half*>(wgi ? sV : sQ) - static_cast<size_t>(d0) * D;
          const uint2 x = *reinterpret_cast<const uint2*>(s016 + o), y = *reinterpret_cast<const uint2*>(ds16 + o);
          const float2 x0 = gdn_mma::unpack_f16(x.x), x1 = gdn_mma::unpack_f16(x.y);
          const float2 y0 = gdn_mma::unpack_f16(y.x), y1 = gdn_mma::unpack_f16(y.y);
          sdot += x0.x * y0.x + x0.y * y0.y + x1.x * y1.x + x1.y * y1.y;
          ah[kk][hh] = y.x;
          ah[kk][hh + 2] = y.y;
        } else {
          const float4 x = *reinterpret_cast<const float4*>(s0s + o), y = *reinterpret_cast<const float4*>(dss + o);
          sdot += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
          gdn_mma::split_bf16(y.x, y.y, ah[kk][hh], al[kk][hh]);
          gdn_mma::split_bf16(y.z, y.w, ah[kk][hh + 2], al[kk][hh + 2]);
        }
      }
    // Reduced and stored here, before the barrier: left to the compiler, the sum sinks to its use
    // at the end and keeps its 128 inputs alive (spilled) through the whole kernel.
    sdot = warp_sum(sdot);
    if constexpr (kF16) sdot *= 1.f / (sb[kSclH] * sb[kSclDh]);
    if (lane == 0) fl[kBcSdot + 8 * par + warp] = sdot;
    sync_rows();  // dS read by both warpgroups: q, k, v, T into its regions
    {
      const bf16* xr = xrow;  // formed here, not hoisted (see store_pairs_t)
      asm volatile("" : "+l"(xr));
      async_panels<256>(sQ, xr + static_cast<size_t>(kh) * D, x_ld, len, tid_x());
      async_panels<256>(sK, xr + static_cast<size_t>(Hk + kh) * D, x_ld, len, tid_x());
      async_panels<256>(sV, xr + 2 * static_cast<size_t>(Hk) * D + static_cast<size_t>(head) * D, x_ld, len, tid_x());
      const size_t tb = (static_cast<size_t>(c) * Hv + head) * kC * kC;  // T's planes: every row (padded rows identity)
      const bf16 *th = Th + tb, *tl = Tl + tb;
      asm volatile("" : "+l"(th), "+l"(tl));
      async_panels<256, kC>(sT, th, kC, kC, tid_x());
      async_panels<256, kC>(sT + kDlPanel, tl, kC, kC, tid_x());
    }
    cp_async_commit();
    wg::fence();
    if constexpr (kF16) {
      bc_rs<0, D / 16, true>(fT, ah, sD, false);
    } else {
      bc_rs<0, D / 16>(fT, ah, sD, false);
      bc_rs<0, D / 16>(fT, al, sD, true);
      bc_rs<0, D / 16>(fT, ah, sD + kDlTile, true);
    }
    wg::commit();
    cp_async_wait<1>();
    wg::fence_proxy_async();
    sync_rows();  // dO landed
    if constexpr (kF16) {  // dO to fp16, scaled (its products' operands)
      tile_bf16_to_f16<256>(sO, kDlTile, sb[kSclDo], tid_x());
      wg::fence_proxy_async();
      sync_rows();
    }
    wg::wait<0>();
  }
  {
    uint32_t ah[D / 16][4], al[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int o = gdn_mma::frag_index(r0 + 8 * hh, 16 * kk, D) + 4 * lane;
        if constexpr (kF16) {
          const __half* s016 = reinterpret_cast<const __half*>(wgi ? sW : sY) - static_cast<size_t>(d0) * D;
          const uint2 x = *reinterpret_cast<const uint2*>(s016 + o);
          ah[kk][hh] = x.x;
          ah[kk][hh + 2] = x.y;
        } else {
          const float4 x = *reinterpret_cast<const float4*>(s0s + o);
          gdn_mma::split_bf16(x.x, x.y, ah[kk][hh], al[kk][hh]);
          gdn_mma::split_bf16(x.z, x.w, ah[kk][hh + 2], al[kk][hh + 2]);
        }
      }
    wg::fence();
    if constexpr (kF16) {
      bc_rs<0, D / 16, true>(eT, ah, sO, false);
      bc_rs<0, D / 16, true>(wT, ah, sDD, false);
    } else {
      bc_rs<0, D / 16>(eT, ah, sO, false);
      bc_rs<0, D / 16>(eT, al, sO, true);
      bc_rs<0, D / 16>(wT, ah, sDD, false);
      bc_rs<0, D / 16>(wT, al, sDD, true);
      bc_rs<0, D / 16>(wT, ah, sDD + kDlTile, true);
    }
    wg::commit();
    cp_async_wait<0>();
    wg::fence_proxy_async();
    // q, k, v, T landed; both warpgroups' S0 fragments read (the Y, dW regions free)
    if constexpr (kWs)
      wg::named_sync(kBarQkvt, kBcWsThreads);
    else
      __syncthreads();
    if constexpr (kF16) {  // T's planes to one fp16 plane (tw, dv; the chain's X1, Mx after kBarDw)
      planes_to_f16<256>(sT, sT + kDlPanel, kDlPanel, tid_x());
      wg::fence_proxy_async();
    }
    wg::wait<0>();
  }
  wg::fence_operands(fT);
  wg::fence_operands(eT);
  wg::fence_operands(wT);

  // E^T diag(e^G), with dG's q_i . (e^{G_i} S0 dO_i) (column sums over d); F^T diag(e^{G_L - G})
  // with xi's k_i . (that) (rk_i, rq_i in the combine).
  float* red8 = fl + warp * kC;  // + an array's offset: this warp's slot of a [8][C] partial
  uint32_t kx[kC / 4];  // k^T at the accumulator positions (xi, then s2)
  {
    uint32_t qx[kC / 4];
    panel_frag<true>(qx, sQ, d0);
    const float inv_e = kF16 ? 1.f / (sb[kSclH] * sb[kSclDo]) : 1.f;  // (S0 s_h)(dO s_dO)^T
    acc_each<kC>(eT, [&](float& v, int, int i) { v *= inv_e * eg[i]; });
    acc_col_sums<kC>(red8 + kBcRedE, eT, 0, [&](float v, int q) { return pair_at(qx, q) * v; });
  }
  panel_frag<true>(kx, sK, d0);
  const float inv_f = kF16 ? 1.f / (sb[kSclDh] * sb[kSclD]) : 1.f;  // (dS s_dh)(D s_D)^T
  acc_each<kC>(fT, [&](float& v, int, int i) { v *= inv_f * ekl[i]; });
  acc_col_sums<kC>(red8 + kBcRedXi, fT, 0, [&](float v, int q) { return pair_at(kx, q) * v; });
  // dW^T = -S0 dD^T: planes [d][m] for dT, and the A fragments of (T^T dW)^T = dW^T T; dk^ gets
  // b_i e^{G_i} (T^T dW)_i, s2_i = rk_i k_i . (T^T dW)_i.
  {
    acc_each<kC>(wT, [](float& v, int, int) { v = -v; });
    const float inv_w = kF16 ? 1.f / (sb[kSclH] * sb[kSclDd]) : 1.f;  // (S0 s_h)(dD s_dD)^T
    acc_planes<kC>(sW, sW + kDlTile, wT, d0, 0, [&](float v, int, int) { return inv_w * v; });
    float tw[kC / 2];
    uint32_t ah[kC / 16][4], al[kC / 16][4];
    if constexpr (kF16) {
      acc_frags16(wT, ah);  // still scaled
      sync_rows();               // T's fp16 plane complete
      wg::fence();
      bc_rs<1, kC / 16, true>(tw, ah, sT, false);
    } else {
      acc_frags(wT, ah, al);
      wg::fence();
      bc_rs<1, kC / 16>(tw, ah, sT, false);
      bc_rs<1, kC / 16>(tw, al, sT, true);
      bc_rs<1, kC / 16>(tw, ah, sT + kDlPanel, true);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_operands(tw);
    if constexpr (kF16)
#pragma unroll
      for (int q = 0; q < kC / 2; ++q) tw[q] *= inv_w;
    acc_col_sums<kC>(red8 + kBcRedS2, tw, 0, [&](float v, int q) { return pair_at(kx, q) * v; });
    acc_each<kC>(tw, [&](float& v, int, int i) { v *= bs[i] * eg[i]; });
#pragma unroll
    for (int r = 0; r < kC / 2; ++r) fT[r] += tw[r];
  }

  if constexpr (kWs) {
    wg::fence_proxy_async();
    wg::named_arrive(kBarDw, kBcWsThreads);
    wg::named_sync(kBarY, kBcWsThreads);
  } else {
    cc_p1(rb, wgi);
    wg::fence_proxy_async();
    __syncthreads();  // Y and dW^T planes complete
  }

  // dq^T = E^T diag(e^G) + k^T Yk; dk^T += q^T Yq.
  wg::fence();
  bc_ss<kC, 0, 1, kC / 16>(eT, sK + wgi * kDlPanel, sY, true);
  bc_ss<kC, 1, 1, kC / 16>(fT, sQ + wgi * kDlPanel, sY + kDlPanel, true);
  wg::commit();
  // kL2: q^_i . dq^_i = rq_i q_i . (E^T e^G)_i + sum_{j <= i} (q^_i . k^_j) Y_ij, from the dG partials
  // (the P1 row sums leave the diagonal out), while the product runs; read after the next barrier.
  if (kL2 && tid < kC) {
    float qa = 0.f;
    for (int p = 0; p < 8; ++p) qa += fl[kBcRedE + p * kC + tid];
    fl[kBcQdot + tid] = rq[tid] * qa + fl[kBcRowA + tid] + fl[kBcRowA + kC + tid] + fl[kBcDiag + tid];
  }
  wg::wait<0>();
  wg::fence_operands(eT);
  wg::fence_operands(fT);
  if constexpr (!kL2) store_t(dqn + ro, dk_ld, eT, d0, len);

  auto store_dq_l2 = [&] {  // q is still in its region
    uint32_t qx[kC / 4];
    panel_frag<true>(qx, sQ, d0);
    store_l2_t(dqkv + static_cast<size_t>(bos) * conv_dim + static_cast<size_t>(kh) * D, conv_dim, eT, qx,
               fl + kBcQdot, rq, static_cast<float>(D), d0, len);
  };
  if constexpr (kWs) {
    sync_rows();  // q . dq^ complete (kL2); both warpgroups' Y reads done
    if constexpr (kL2) store_dq_l2();
    wg::named_arrive(kBarQ, kBcWsThreads);
  } else {
    cc_dt(rb, wgi, len);
    wg::fence_proxy_async();
    __syncthreads();  // dT planes complete; the Y planes and dW's are dead
    if constexpr (kL2) store_dq_l2();
  }
  const int next = work != nullptr ? __float_as_int(fl[kBcNext]) : item + static_cast<int>(gridDim.x);
  const int4 nch = next < total ? rtable[next / Hv] : make_int4(0, 0, 0, 0);
  if constexpr (kWs) wg::named_sync(kBarDt, kBcWsThreads);  // the chain's dT has read W's, dD's and v's regions
  if (next < total) async_early_s0(next, nch);
  bc_dv(rb, wgi, bos, head, len);
  if constexpr (kWs) {
    sync_rows();  // both warpgroups' dv done: dD's region is free
    wg::named_arrive(kBarV, kBcWsThreads);  // and v . (T^T dD) complete for the chain's combine
  } else {
    float x1[16];
    cc_x1(x1, 32 * wgi);
    wg::fence_proxy_async();
    __syncthreads();  // X1's planes complete; dv done: dD's region is free
  }
  if (next < total) async_early_dd(next, nch);  // kWs: the chain's dT read dD before kBarDt
  if constexpr (kWs) {
    wg::named_sync(kBarP, kBcWsThreads);  // Pa, Pb and Mx's sums: the chain is done with the item
  } else {
    cc_mx(rb, wgi);
    wg::fence_proxy_async();
    __syncthreads();  // Mx's planes complete; D's (X1's), dD's, v's and T's regions are free
  }
  if (next < total) {
    async_early_d(next, nch);
    ig = item_gates(next, nch);
  }
  // dk^T += k^T Pa (B K-major: B[j][i] = Pa[i][j]) + k^T Pb (B N-major: B[l][i] = Pb[l][i]).
  wg::fence();
  bc_ss<kC, 0, 1, kC / 16>(fT, sK + wgi * kDlPanel, sO, true);
  bc_ss<kC, 1, 1, kC / 16>(fT, sK + wgi * kDlPanel, sQ, true);
  wg::commit();
  wg::wait<0>();
  wg::fence_operands(fT);
  uint32_t kx2[kC / 4];  // kL2: k at the accumulator positions, read before the next item's dS lands there
  if constexpr (kL2)
    panel_frag<true>(kx2, sK, d0);
  else
    store_t(dkn + ro, dk_ld, fT, d0, len);
  sync_rows();  // both warpgroups' final dk^ products done: k's, Pb's and Pa's regions are free
  if (next < total) async_late(next, nch);
  auto store_dk_l2 = [&] {  // k^ . dk^ from the combine
    store_l2_t(dqkv + static_cast<size_t>(bos) * conv_dim + static_cast<size_t>(Hk + kh) * D, conv_dim, fT, kx2,
               fl + kBcKdot, rk, 1.f, d0, len);
  };

  // The next item's row data by warps 2, 3 while warps 0, 1 combine.
  if (next < total) row_data(ig, fl + (par ^ 1) * kBcRowData);
  if constexpr (kWs) {
    if constexpr (kL2) {
      wg::named_sync(kBarK, kBcWsThreads);  // the chain's combine
      store_dk_l2();
    }
  } else {
    bc_combine(rb, tid);
    __syncthreads();
    if (tid < 32) dg_reverse_cumsum(fl + kBcDg, fl + kBcXi, fl + kBcSdot + 8 * par, expf(gs[kC - 1]));
    if constexpr (kL2) store_dk_l2();
    __syncthreads();
    bc_store_dg(tid, bos, head, len);
  }
  item = next;
  par ^= 1;
  }  // items
  if constexpr (kWs) {  // the chain's warpgroup waits at kBarQkvt: no more items
    if (tid_x() == 0) fl[kBcCur] = __int_as_float(-1);
    wg::named_arrive(kBarQkvt, kBcWsThreads);
  }
}

// ---- backward: sum over each key head's value heads, then the L2-norm backward -------------------
// Rows (token, key head, q or k), kQkRows per warp: dx = s (r dy - r^3 (x . dy) x), s = K^-1/2 for
// q. Lane l owns the 4 elements 4l.. (K <= 128) of each row. The x loads and every load of a batch
// of kQkHeads value heads are issued before any is used, for all the warp's rows; the value heads
// are summed in head order. Two instances, both 64 registers and 4 CTAs per SM: 2 rows x 2 heads
// (several value heads per key head) and 4 rows x 1 head (one: 2B). One row per warp reached ~2 TB/s
// (2B 0.102 ms; now 0.069); 4 rows x 2 heads at 87 registers (2 CTAs per SM) were slower than one.
// This kernel takes the mma.sync bwd_chunk's fp32 dq^, dk^ (any K <= 128); the wgmma bwd_chunk's
// bf16 ones go to gdn_qk_grad16_kernel.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <int kQkRows, int kQkHeads, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gdn_qk_grad_kernel(bf16* dqkv, const float* dqn, const float* dkn,
                                                                           const bf16* qkv, int T, int Hk, int Hv,
                                                                           int K, int conv_dim) {
  const int warp = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31, rows = T * Hk * 2, ratio = Hv / Hk, d = 4 * lane;
  // Row r of the warp: token t, key head kh, q (which = 0) or k; x's offset in qkv.
  auto row_of = [&](int r, int& which, int& t, int& kh) {
    const int row = warp * kQkRows + r, th = row >> 1;
    which = row & 1;
    t = th / Hk;
    kh = th - t * Hk;
    return row < rows && d < K;
  };
  uint2 xr[kQkRows];
  float dy[kQkRows][4] = {};
#pragma unroll
  for (int r = 0; r < kQkRows; ++r) {
    int which, t, kh;
    xr[r] = make_uint2(0u, 0u);
    if (row_of(r, which, t, kh))
      xr[r] = *reinterpret_cast<const uint2*>(qkv + static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d);
  }
  // kQkHeads == 1: launched only for one value head per key head (ratio 1), a single batch.
  const int batches_end = kQkHeads == 1 ? 1 : ratio;
  for (int j0 = 0; j0 < batches_end; j0 += kQkHeads) {
    float4 acc[kQkRows][kQkHeads];
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      int which, t, kh;
      const bool live = row_of(r, which, t, kh);
      const float* p = (which == 0 ? dqn : dkn) + (static_cast<size_t>(t) * Hv + kh * ratio + j0) * K + d;
#pragma unroll
      for (int u = 0; u < kQkHeads; ++u)
        if (live && j0 + u < ratio) acc[r][u] = load4(p + static_cast<size_t>(u) * K);
    }
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      int which, t, kh;
      const bool live = row_of(r, which, t, kh);
#pragma unroll
      for (int u = 0; u < kQkHeads; ++u)
        if (live && j0 + u < ratio) {
          dy[r][0] += acc[r][u].x;
          dy[r][1] += acc[r][u].y;
          dy[r][2] += acc[r][u].z;
          dy[r][3] += acc[r][u].w;
        }
    }
  }
#pragma unroll
  for (int r = 0; r < kQkRows; ++r) {
    int which, t, kh;
    const bool live = row_of(r, which, t, kh);
    const float x[4] = {__uint_as_float(xr[r].x << 16), __uint_as_float(xr[r].x & 0xffff0000u),
                        __uint_as_float(xr[r].y << 16), __uint_as_float(xr[r].y & 0xffff0000u)};
    float ss = 0.f, xdy = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ss += x[e] * x[e];
      xdy += x[e] * dy[r][e];
    }
    ss = warp_sum(ss);
    xdy = warp_sum(xdy);
    const float rs = 1.f / sqrtf(ss + kL2Eps);
    const float s = which == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f;
    if (live) {
      const float r3 = rs * rs * rs * xdy;
      const __nv_bfloat162 lo = __floats2bfloat162_rn(s * (rs * dy[r][0] - r3 * x[0]), s * (rs * dy[r][1] - r3 * x[1]));
      const __nv_bfloat162 hi = __floats2bfloat162_rn(s * (rs * dy[r][2] - r3 * x[2]), s * (rs * dy[r][3] - r3 * x[3]));
      *reinterpret_cast<uint2*>(dqkv + static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d) =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
  }
}

// The same at K = 128 from the wgmma bwd_chunk's bf16 partials, with 16-byte accesses: a half-warp
// per row (lane l % 16 owns elements 8 (l % 16) .. + 7), the row's x and a batch of kQkHeads value
// heads issued before any is used, the heads summed in head order. Twice the bytes per load
// instruction of the 4-byte kernel's bf16 form, which moved ~2.9 TB/s at 27B (qk_grad 0.117 ms;
// 0.086 with this one, 38 registers; two row pairs per warp at 64 registers were even, and the
// batch loop where one batch holds every head cost 9 registers and 1 % at 4B).
template <int kQkHeads, bool kOneBatch>
__global__ void __launch_bounds__(kThreads, 4) gdn_qk_grad16_kernel(bf16* dqkv, const bf16* dqn, const bf16* dkn,
                                                                   const bf16* qkv, int T, int Hk, int Hv,
                                                                   int conv_dim) {
  constexpr int K = kDlD;
  const int lane = threadIdx.x & 31, d = 8 * (lane & 15), ratio = Hv / Hk;
  const int row = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 4);
  const bool live = row < T * Hk * 2;  // warp-uniform but for the last warp: the shuffles stay full-warp
  const int which = row & 1, t = (row >> 1) / Hk, kh = (row >> 1) - t * Hk;
  const size_t xo = static_cast<size_t>(t) * conv_dim + which * Hk * K + kh * K + d;
  const uint4 xr = live ? *reinterpret_cast<const uint4*>(qkv + xo) : make_uint4(0u, 0u, 0u, 0u);
  const bf16* p = (which == 0 ? dqn : dkn) + (static_cast<size_t>(t) * Hv + kh * ratio) * K + d;
  float dy[8] = {};
  const int batches_end = kOneBatch ? 1 : ratio;  // kOneBatch: ratio <= kQkHeads
  for (int j0 = 0; j0 < batches_end; j0 += kQkHeads) {
    uint4 acc[kQkHeads];
#pragma unroll
    for (int u = 0; u < kQkHeads; ++u)
      acc[u] = live && j0 + u < ratio ? *reinterpret_cast<const uint4*>(p + static_cast<size_t>(j0 + u) * K)
                                      : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < kQkHeads; ++u) {
      float a[8];
      dev::unpack8(a, acc[u]);
#pragma unroll
      for (int e = 0; e < 8; ++e) dy[e] += a[e];
    }
  }
  float x[8], ss = 0.f, xdy = 0.f;
  dev::unpack8(x, xr);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    ss += x[e] * x[e];
    xdy += x[e] * dy[e];
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) {  // over the half-warp's 16 lanes
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
    xdy += __shfl_xor_sync(0xffffffffu, xdy, o);
  }
  if (!live) return;
  const float rs = 1.f / sqrtf(ss + kL2Eps), sc = which == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f;
  const float r3 = rs * rs * rs * xdy;
  float dx[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) dx[e] = sc * (rs * dy[e] - r3 * x[e]);
  *reinterpret_cast<uint4*>(dqkv + xo) = dev::pack8(dx);
}

// ---- workspace -----------------------------------------------------------------------------------
struct Workspace {
  int4* table;
  int4* rtable;  // the table shortest sample first (.w: chunk index), bwd_chunk's item order
  int* nchunks;
  int* seq_off;
  int* seq_order;  // segments longest first (the scans' CTA order)
  int* vcu;        // segment boundaries (rows): without a split, cu_seqlens
  int4* seginfo;
  int *items, *items_rev, *counts;
  SplitStates split;
  int max_segs;    // num_seqs + split.slots
  // dD: U (mma.sync scans) in the forward, dD_local in the backward
  float *Gc, *h, *dD, *dh, *rs;
  // dq^, dk^ per value head: fp32 from the mma.sync bwd_chunk, bf16 from the wgmma one (layout sizes
  // them by path; untyped, so each path names its element type where it uses them)
  void *dqn, *dkn;
  int* prep_done;  // [chunk][Hk]: prep finished (chunk, key head) (the forward's output scan beside it)
  int* done;  // [count][flags: the forward scan has stored (segment, head)], the same for the reverse
              // scan, then bwd_chunk's item counter (gdn_backward's kernels beside one another):
              // done_flags, work_counter, done_ints
  bf16 *Wh, *Wl;    // W = T diag(b e^G) K^ as its bf16 hi / lo planes [T, Hv, K] (mma.sync scans only)
  bf16 *Dh, *Dl;    // D = U - W S, planes [T, Hv, V]
  bf16 *dDh, *dDl;  // full dD, planes [T, Hv, V]
  bf16 *Th, *Tl;    // T = (I + A)^-1 per (chunk, head), planes [chunk, Hv, C x C] (prep -> wgmma scans, bwd_chunk)
  float* scl;       // the fp16 backward's tile scales [chunk][Hv][kSclFloats] (the scans -> bwd_chunk)
  int nc_max;
};

bool wgmma_scans(int K, int V);
int env_knob(const char* name, std::initializer_list<int> allowed);
// The backward's A/B knobs (each read once), which the workspace layout needs as well: buffers only
// some kernels use are sized for the kernels a shape runs.
bool dlocal_separate() {  // QT_GDN_DLOCAL_SEPARATE=1: dD_local by its own kernel, not in the reverse scan
  static const bool on = env_knob("QT_GDN_DLOCAL_SEPARATE", {1}) != 0;
  return on;
}
bool wgmma_bwd_chunk(int K, int V) {  // QT_GDN_BWD_CHUNK_MMA_SYNC=1 keeps the mma.sync one at dk = dv = 128
  static const bool mma_sync = env_knob("QT_GDN_BWD_CHUNK_MMA_SYNC", {1}) != 0;
  return K == kDlD && V == kDlD && !mma_sync;
}
bool qk_grad_separate() {  // QT_GDN_QK_GRAD_SEPARATE=1: qk_grad also at one value head per key head
  static const bool on = env_knob("QT_GDN_QK_GRAD_SEPARATE", {1}) != 0;
  return on;
}
bool bwd_chunk_ws() {  // QT_GDN_BC_TWO_WARPGROUPS=1 keeps the wgmma bwd_chunk without its chain warpgroup
  static const bool two = env_knob("QT_GDN_BC_TWO_WARPGROUPS", {1}) != 0;
  return !two;
}

// w.done's parts: the flags of scan 0 (forward) and 1 (reverse), each array after its count
// (signal_done_counted), then bwd_chunk's item counter. done_ints: the ints up to the end of the
// forward's flags (with_backward = false) or of the counter.
size_t done_block(const Workspace& w, int Hv) { return static_cast<size_t>(w.max_segs) * Hv + 1; }  // count + flags
int* done_flags(const Workspace& w, int Hv, int scan) { return w.done + 1 + scan * done_block(w, Hv); }
int* work_counter(const Workspace& w, int Hv) { return w.done + 2 * done_block(w, Hv); }
size_t done_ints(const Workspace& w, int Hv, bool with_backward) {
  return with_backward ? 2 * done_block(w, Hv) + 1 : done_block(w, Hv);
}

// State slots of the intra-sample split (gdn_chunk_table_kernel): about two scan CTAs per SM's worth
// of segments (each slot is a D x D state per value head, three times); QT_GDN_NO_SPLIT=1: none.
int split_slots(const GdnArgs& a) {
  static const bool off = env_knob("QT_GDN_NO_SPLIT", {1}) != 0;
  if (off || !wgmma_scans(a.k_head_dim, a.v_head_dim)) return 0;
  return std::min(32, 2 * sm_count() / std::max(1, a.num_v_heads));
}

// Upper bound on the chunk count: sum ceil(len/C) <= T/C + N, and never more than T.
int max_chunks(const GdnArgs& a) {
  const int64_t b = static_cast<int64_t>(a.total_tokens) / kC + a.num_seqs;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b, std::max(a.total_tokens, 1))));
}

// Lays the forward state out from `state` and the backward-only buffers from `scratch` (nullptr:
// sizes only). Returns {state bytes, scratch bytes}. The state starts with prep's results and the
// chunk plan (Gc, T, rs, the table and the split's plan: GdnKeep::Prep's part); GdnKeep::States also
// keeps W, D, h and the split's maps and flags (what the backward reuses when the forward kept it),
// which GdnKeep::Prep leaves in the scratch.
// Prep keeps nothing where the mma.sync scans run (they read prep's W and U as well, which would
// make the part as large as States'): the backward recomputes prep there.
std::pair<size_t, size_t> layout(const GdnArgs& a, char* state, char* scratch, Workspace* w,
                                 GdnKeep keep = GdnKeep::States) {
  size_t off = 0;
  char* base = state;
  auto take = [&](size_t bytes) {
    char* p = base ? base + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  size_t state_bytes = 0;
  auto state_ends = [&] {  // the rest goes to the scratch
    state_bytes = off;
    off = 0;
    base = scratch;
  };
  const size_t T = static_cast<size_t>(a.total_tokens), Hk = static_cast<size_t>(a.num_k_heads),
               Hv = static_cast<size_t>(a.num_v_heads), K = static_cast<size_t>(a.k_head_dim),
               V = static_cast<size_t>(a.v_head_dim);
  const bool wg = wgmma_scans(a.k_head_dim, a.v_head_dim);
  const int nc = max_chunks(a);
  const size_t states = static_cast<size_t>(nc) * Hv * K * V * sizeof(float);
  Workspace ws{};
  ws.nc_max = nc;
  if (keep == GdnKeep::Prep && !wg) state_ends();
  ws.Gc = reinterpret_cast<float*>(take(T * Hv * sizeof(float)));
  ws.Th = reinterpret_cast<bf16*>(take(static_cast<size_t>(nc) * Hv * kC * kC * sizeof(bf16)));
  ws.Tl = reinterpret_cast<bf16*>(take(static_cast<size_t>(nc) * Hv * kC * kC * sizeof(bf16)));
  ws.rs = reinterpret_cast<float*>(take(T * Hk * 2 * sizeof(float)));  // L2 row scales of q, k
  ws.table = reinterpret_cast<int4*>(take(static_cast<size_t>(nc) * sizeof(int4)));
  ws.rtable = reinterpret_cast<int4*>(take(static_cast<size_t>(nc) * sizeof(int4)));
  ws.nchunks = reinterpret_cast<int*>(take(sizeof(int)));
  const int slots = split_slots(a);
  const size_t P = static_cast<size_t>(a.num_seqs) + slots;
  ws.max_segs = static_cast<int>(P);
  ws.seq_off = reinterpret_cast<int*>(take((P + 1) * sizeof(int)));
  ws.seq_order = reinterpret_cast<int*>(take(P * sizeof(int)));
  ws.vcu = reinterpret_cast<int*>(take((P + 1) * sizeof(int)));
  ws.seginfo = reinterpret_cast<int4*>(take(P * sizeof(int4)));
  ws.items = reinterpret_cast<int*>(take((static_cast<size_t>(a.num_seqs) + 3 * slots) * sizeof(int)));
  ws.items_rev = reinterpret_cast<int*>(take((static_cast<size_t>(a.num_seqs) + 2 * slots) * sizeof(int)));
  ws.counts = reinterpret_cast<int*>(take(5 * sizeof(int)));
  if (keep == GdnKeep::Prep && wg) state_ends();
  // W's planes: only the mma.sync scans read them (the wgmma ones form W S from T).
  const size_t w_bytes = wg ? 0 : T * Hv * K * sizeof(bf16);
  ws.Wh = reinterpret_cast<bf16*>(take(w_bytes));
  ws.Wl = reinterpret_cast<bf16*>(take(w_bytes));
  ws.Dh = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.Dl = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.h = reinterpret_cast<float*>(take(states));
  // The split's maps M and the flags: a backward reading a kept state combines its reverse
  // segments with the forward's M (the other slots are scratch).
  const size_t slot_bytes = static_cast<size_t>(slots) * Hv * K * V * sizeof(float);
  ws.split.M = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.flags = reinterpret_cast<int*>(take(kSplitStateCount * static_cast<size_t>(slots) * Hv * sizeof(int)));
  if (keep == GdnKeep::States) state_ends();
  // dD (fp32): U of the mma.sync forward scans, dD_local of a separate dlocal kernel; the wgmma
  // scans form both where they use them.
  ws.dD = reinterpret_cast<float*>(take(!wg || dlocal_separate() ? T * Hv * V * sizeof(float) : 0));
  ws.dDh = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.dDl = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.dh = reinterpret_cast<float*>(take(states));
  ws.scl = reinterpret_cast<float*>(take(wg ? static_cast<size_t>(nc) * Hv * kSclFloats * sizeof(float) : 0));
  // dq^, dk^ per value head for qk_grad: fp32 from the mma.sync bwd_chunk, bf16 from the wgmma one,
  // none where that applies the L2-norm backward itself (one value head per key head).
  const size_t dqk_bytes = !wgmma_bwd_chunk(a.k_head_dim, a.v_head_dim) ? T * Hv * K * sizeof(float)
                           : Hv == Hk && !qk_grad_separate()        ? 0
                                                                    : T * Hv * K * sizeof(bf16);
  ws.dqn = take(dqk_bytes);
  ws.dkn = take(dqk_bytes);
  ws.done = reinterpret_cast<int*>(take(done_ints(ws, a.num_v_heads, true) * sizeof(int)));
  ws.prep_done = reinterpret_cast<int*>(take(static_cast<size_t>(nc) * Hk * sizeof(int)));
  ws.split.S = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.E = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.G = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.F = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.slots = slots;

  if (w) *w = ws;
  return {state_bytes, off};
}

// The workspace of a call: the state from `state` when the caller keeps it (what `keep` names; the
// rest in the workspace), else its front part.
Workspace place(const GdnArgs& a, void* workspace, void* state, GdnKeep keep = GdnKeep::States) {
  Workspace w;
  if (state != nullptr) {
    layout(a, static_cast<char*>(state), static_cast<char*>(workspace), &w, keep);
  } else {
    const size_t front = layout(a, nullptr, nullptr, nullptr).first;
    layout(a, static_cast<char*>(workspace), static_cast<char*>(workspace) + front, &w);
  }
  return w;
}

// A tuning knob of bench_gdn: the integer the environment variable names when it is one of
// `allowed`, else 0 (keep the default). Read once per process.
int env_knob(const char* name, std::initializer_list<int> allowed) {
  const char* e = std::getenv(name);
  if (e == nullptr) return 0;
  const int want = std::atoi(e);
  for (int a : allowed)
    if (a == want) return want;
  return 0;
}

// The wgmma scans (one CTA per (sample, head) at every head count) serve dk = dv = 128, Qwen3.5's;
// QT_GDN_SCAN_MMA_SYNC=1 keeps the mma.sync ones (A/B runs of bench_gdn).
bool wgmma_scans(int K, int V) {
  static const bool off = env_knob("QT_GDN_SCAN_MMA_SYNC", {1}) != 0;
  return K == kDlD && V == kDlD && !off;
}
// dv columns per scan CTA (16, 32, 64 or 128, dividing V); QT_GDN_BV_FWD / QT_GDN_BV_BWD override
// the default for tuning runs of bench_gdn. Default: 128 (one 16-warp CTA per (sample, head), W and k
// read once per chunk) when there are at least 32 value heads and dk <= 128 (the state must fit
// the 16 warps and the smem), else 32. Measured on the H200
// (docs/gdn_kernels.md section 3.3): 128 is 4-5 % faster on the 4B / 27B training path (Hv = 32 / 48)
// but 5 % slower at Hv = 16, where 8 samples x 16 heads leave SMs idle at one CTA per SM.
int column_block(int K, int V, int num_v_heads, bool backward) {
  static const int fwd = env_knob("QT_GDN_BV_FWD", {16, 32, 64, 128}),
                   bwd = env_knob("QT_GDN_BV_BWD", {16, 32, 64, 128});
  const int want = backward ? bwd : fwd;
  if (want != 0 && V % want == 0) return want;
  if (num_v_heads >= 32 && K <= 128 && V % 128 == 0) return 128;
  return V % 32 == 0 ? 32 : 16;
}

// Threads per scan CTA: the K x bv state is spread over the warps in kScanTiles 16 x 16 tiles each,
// so bv = 128 (one CTA per head: W and k read once, not V / bv times) takes 16 warps.
int scan_threads(int K, int bv) {
  const int threads = bv > 64 ? 2 * kThreads : kThreads;
  QT_CHECK((K / 16) * (bv / 16) <= kScanTiles * (threads / 32), "gdn: a ", K, " x ", bv,
           " state does not fit the scan's ", threads / 32, " warps");
  return threads;
}

// The scans' grid: one CTA per (sample, value head, column block), 1-D (see scan_block).
unsigned scan_grid(const GdnArgs& a, int bv) {
  const int64_t n = static_cast<int64_t>(a.num_seqs) * a.num_v_heads * (a.v_head_dim / bv);
  QT_CHECK(n < (int64_t{1} << 31), "gdn: ", a.num_seqs, " samples x ", a.num_v_heads,
           " value heads is too many scan CTAs");
  return static_cast<unsigned>(n);
}

// Per-kernel device times for bench_gdn (QT_GDN_STAGE_TIMES=1 there): when on, every launch is
// bracketed by events and synchronized, so use it only for the breakdown, never for the totals.
struct StageTimes {
  bool on = false;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::vector<std::pair<std::string, double>> ms;
};
StageTimes& stage_times() {
  static StageTimes s;
  return s;
}
void stage_begin(cudaStream_t stream) {
  StageTimes& s = stage_times();
  if (!s.on) return;
  if (!s.e0) {
    CUDA_CHECK(cudaEventCreate(&s.e0));
    CUDA_CHECK(cudaEventCreate(&s.e1));
  }
  CUDA_CHECK(cudaEventRecord(s.e0, stream));
}
void stage_end(const char* name, cudaStream_t stream) {
  StageTimes& s = stage_times();
  if (!s.on) return;
  CUDA_CHECK(cudaEventRecord(s.e1, stream));
  CUDA_CHECK(cudaEventSynchronize(s.e1));
  float t = 0.f;
  CUDA_CHECK(cudaEventElapsedTime(&t, s.e0, s.e1));
  for (auto& kv : s.ms)
    if (kv.first == name) {
      kv.second += t;
      return;
    }
  s.ms.emplace_back(name, t);
}

// Whether the forward's output is formed by the wgmma scan (QT_GDN_OUTPUT_SEPARATE=1: never,
// QT_GDN_OUTPUT_FUSED=1: always, for A/B runs). When h and D are stored anyway (for_backward) and the
// scan is a single wave of CTAs (2B: 8 samples x 16 heads on 132 SMs), every CTA's chain is the
// critical path and the output kernel beside it (gdn_forward) is cheaper: 2B kept forward 0.287 ms
// against 0.343 fused, 0.350 with the output kernel after the scan. With more CTAs than SMs, or with
// nothing to store, the fused output wins (4B, an earlier round: 2.30 -> 2.26 ms, forward alone
// 0.79 -> 0.59).
bool output_in_scan(const GdnArgs& a, bool for_backward) {
  static const bool separate_output = env_knob("QT_GDN_OUTPUT_SEPARATE", {1}) != 0,
                    fused_output = env_knob("QT_GDN_OUTPUT_FUSED", {1}) != 0;
  return wgmma_scans(a.k_head_dim, a.v_head_dim) && !separate_output &&
         (fused_output || !for_backward || static_cast<int64_t>(a.num_seqs) * a.num_v_heads > sm_count());
}
// The stages shared by forward and backward: chunk table, prep (G, T, the L2 row scales), forward
// scan. for_backward: prep also stores T for bwd_chunk, the scan h and D (a forward that keeps no
// state skips those stores where the output is formed in the scan). out != nullptr: the wgmma scan
// forms the forward's output there (output_in_scan, decided by gdn_forward). done != nullptr: the
// wgmma scan flags each (sample, head) when its h and D are stored (the kernels beside it).
// Whether a sample as long as max_seqlen could be worth splitting (the plan, on the device, decides):
// only where its chunks are more than twice an even share of all the scan's chunk steps over the
// SMs. The plain scan is kept otherwise (the ticket walk costs the chat mix ~5 %). max_seqlen is the
// caller's bound, so a captured step keeps the decision of its capture.
bool split_possible(const GdnArgs& a, const Workspace& w) {
  return gdn_plan::split_worth_trying(a.max_seqlen, max_chunks(a), {w.split.slots, a.num_v_heads, sm_count()});
}
// GdnKeep::Prep's part (the chunk plan, G, T, the row scales) in a call: kMake, the chunk table and
// prep make it; kMakeKept, the same and the table kernel also builds rtable (bwd_chunk's order), for
// the backward that reads it (a forward keeping Prep); kHave, it is there (that backward): neither
// runs (the caller resets what the scans consume: reset_split_walks).
enum class PrepPart { kMake, kMakeKept, kHave };
// For a backward reading a kept plan (split_possible: it may split), what the chunk table kernel
// zeroed and the split's scans consume (a kept state may be read more than once: bench_gdn, gradient
// checks): with the forward scan running again (GdnKeep::Prep) every flag row and both scans' ticket
// counters; with the chunk states kept (States) only the reverse scan's, its G and F flag rows (the
// forward's S, M and E stay set: the reverse combines with the kept M) and its counter.
void reset_split_walks(const Workspace& w, int Hv, bool forward_too, cudaStream_t stream) {
  static_assert(kStateG + 1 == kStateF && kStateF + 1 == kSplitStateCount, "G, F: the flags' last rows");
  const size_t rows = static_cast<size_t>(w.split.slots) * Hv;
  const int first = forward_too ? 0 : kStateG;
  CUDA_CHECK(cudaMemsetAsync(w.split.flags + first * rows, 0, (kSplitStateCount - first) * rows * sizeof(int), stream));
  CUDA_CHECK(cudaMemsetAsync(w.counts + (forward_too ? 2 : 3), 0, (forward_too ? 2 : 1) * sizeof(int), stream));
}
// split: the plan may split long samples (its reverse scan then splits too: the backward combines
// with the maps' M, which a kept state keeps).
void forward_common(const Workspace& w, const bf16* qkv, const float* g, const float* beta, const GdnArgs& a,
                    bool for_backward, bf16* out, cudaStream_t stream, int* done = nullptr, bool split = false,
                    PrepPart part = PrepPart::kMake, bool f16 = false) {
  const int Hk = a.num_k_heads, Hv = a.num_v_heads, K = a.k_head_dim, V = a.v_head_dim;
  const int conv_dim = 2 * Hk * K + Hv * V;
  // The wgmma scans form W S and U from T themselves: prep stores G and T only (no W, U).
  const bool wg_scans = wgmma_scans(K, V);
  const bool fuse = out != nullptr;
  // rtable: bwd_chunk's and the output kernel's order, not needed by a plain forward with the output fused.
  const SplitArgs sp{w.vcu,
                     w.seginfo,
                     w.items,
                     w.items_rev,
                     w.counts,
                     w.split.flags,
                     {split && split_possible(a, w) ? w.split.slots : 0, Hv, sm_count()}};
  // The plain forward (the wgmma scan forms the output, keeps nothing, no tickets) runs prep beside
  // the table kernel (waiting for it) and the scan beside prep, each scan CTA waiting for its own
  // chunks (prep_done). Elsewhere each kernel starts after the one before: the flags cost the 2B
  // kept forward and backward 1-2 % (docs/gdn_kernels.md section 3.1). QT_GDN_PREP_AFTER=1: A/B.
  static const bool prep_after = env_knob("QT_GDN_PREP_AFTER", {1}) != 0;
  const bool keep = for_backward || !fuse;  // without the fused output, the output kernel reads h and D
  const bool tickets = sp.shape.max_slots >= 3;  // the plan may split a long sample
  const bool prep_beside = wg_scans && fuse && !keep && !tickets && !prep_after;
  int* prep_done = prep_beside ? w.prep_done : nullptr;
  if (part != PrepPart::kHave) {
    stage_begin(stream);
    const bool rtable = for_backward || !fuse || part == PrepPart::kMakeKept;
    gdn_chunk_table_kernel<<<1, kTableThreads, 0, stream>>>(w.table, rtable ? w.rtable : nullptr, w.nchunks,
                                                            w.seq_off, w.seq_order, a.cu_seqlens, a.num_seqs, sp,
                                                            prep_done, w.nc_max * Hk);
    QT_LAUNCH_CHECK("gdn_chunk_table_kernel");
    stage_end("gdn_chunk_table_kernel", stream);
    const size_t prep_bytes = static_cast<size_t>(prep_smem_floats(K, V, !wg_scans)) * sizeof(float);
    auto prep = !wg_scans ? gdn_prep_kernel<true> : Hv > Hk ? gdn_prep_kernel<false, true> : gdn_prep_kernel<false>;
    stage_begin(stream);
    // wgmma scans: one prep CTA per key head and chunk, its value heads in turn (gdn_prep_kernel).
    launch_smem_beside(prep_beside, prep, "gdn_prep_kernel", dim3(w.nc_max, wg_scans ? Hk : Hv), kThreads,
                       prep_bytes, stream, w.Gc, w.Wh, w.Wl, w.dD, for_backward || wg_scans ? w.Th : nullptr, w.Tl,
                       w.table, w.nchunks, w.rs, qkv, g, beta, Hk, Hv, K, V, conv_dim, prep_done);
    stage_end("gdn_prep_kernel", stream);
  }
  if (wg_scans) {
    const size_t bytes = fuse ? scan_fwd_wg_smem<true>() : scan_fwd_wg_smem<false>();
    // The instance: output formed here (fuse), its loads first where the state is kept too; by
    // tickets where the plan may split a long sample (their output items store h, D when given).
    auto kernel = tickets ? (fuse  ? gdn_scan_fwd_wgmma_kernel<true, false, true>
                             : f16 ? gdn_scan_fwd_wgmma_kernel<false, false, true, true>
                                   : gdn_scan_fwd_wgmma_kernel<false, false, true>)
                  : fuse  ? (keep ? gdn_scan_fwd_wgmma_kernel<true, true> : gdn_scan_fwd_wgmma_kernel<true, false>)
                  : f16   ? gdn_scan_fwd_wgmma_kernel<false, false, false, true>
                          : gdn_scan_fwd_wgmma_kernel<false, false>;
    // By tickets at most one CTA per SM runs (its smem allows one), and there are at most
    // max_segs + 2 slots items per value head; else one CTA per (sample, value head).
    const int64_t most = (static_cast<int64_t>(w.max_segs) + 2 * w.split.slots) * Hv;
    const unsigned grid = tickets ? static_cast<unsigned>(std::min<int64_t>(most, sm_count())) : scan_grid(a, V);
    stage_begin(stream);
    launch_smem_beside(prep_beside, kernel, "gdn_scan_fwd_wgmma_kernel", dim3(grid), 256, bytes, stream,
                       keep ? w.h : nullptr, keep ? w.Dh : nullptr, keep ? w.Dl : nullptr, out, w.Th, w.Tl, qkv, w.rs,
                       w.Gc, beta, w.vcu, w.seq_off, w.seq_order, w.seginfo, w.items, w.counts, w.split, Hk, Hv,
                       conv_dim, done, prep_done, f16 ? w.scl : nullptr);
    stage_end("gdn_scan_fwd_wgmma_kernel", stream);
    return;
  }
  const int bv = column_block(K, V, a.num_v_heads, false), scan_thr = scan_threads(K, bv);
  const size_t scan_bytes = static_cast<size_t>(scan_fwd_smem_floats(K, bv)) * sizeof(float);
  auto scan_fwd = scan_thr > kThreads ? gdn_scan_fwd_kernel<2 * kThreads> : gdn_scan_fwd_kernel<kThreads>;
  stage_begin(stream);
  launch_smem(scan_fwd, "gdn_scan_fwd_kernel", scan_grid(a, bv), scan_thr, scan_bytes, stream, w.h, w.Dh, w.Dl, w.dD,
              w.Wh, w.Wl, qkv, w.rs, w.Gc, w.vcu, w.seq_off, w.seq_order, Hk, Hv, K, V, conv_dim, bv);
  stage_end("gdn_scan_fwd_kernel", stream);
}

}  // namespace

size_t gdn_workspace_bytes(const GdnArgs& a) {
  const auto sizes = layout(a, nullptr, nullptr, nullptr);
  return sizes.first + sizes.second;
}

size_t gdn_state_bytes(const GdnArgs& a, GdnKeep keep) { return layout(a, nullptr, nullptr, nullptr, keep).first; }

// Benchmark hooks (declared by bench/bench_gdn.cu, not part of kernels.h): per-kernel timing.
void gdn_stage_timing(bool on) { stage_times().on = on; }
void gdn_stage_report(const char* label, int calls) {
  StageTimes& s = stage_times();
  double total = 0;
  for (const auto& kv : s.ms) total += kv.second;
  for (const auto& kv : s.ms)
    std::printf("# stage %s %-24s %8.3f ms  %5.1f%%\n", label, kv.first.c_str(), kv.second / calls,
                100.0 * kv.second / (total > 0 ? total : 1));
  s.ms.clear();
}

// The fp16 form (h, D, dh, dD as scaled fp16 tiles, bwd_chunk's products f16 x f16) where the
// recompute (plain or by tickets), the fused reverse scan and the warp-specialized bwd_chunk run;
// QT_GDN_HILO=1 keeps the hi / lo form there (A/B). gdn_backward also needs no kept states and the
// reverse scan forming dD_local (not QT_GDN_DLOCAL_SEPARATE=1).
bool gdn_backward_fp16(int K, int V) {
  static const bool hilo = env_knob("QT_GDN_HILO", {1}) != 0;
  return wgmma_scans(K, V) && wgmma_bwd_chunk(K, V) && bwd_chunk_ws() && !hilo;
}

int gdn_split_min_seqlen(const GdnArgs& a) {
  const int slots = split_slots(a), chunks = max_chunks(a);
  const gdn_plan::SplitShape shape{slots, a.num_v_heads, sm_count()};
  for (int n = 1; n <= chunks; ++n)  // split_worth_trying depends on max_seqlen by its chunks only
    if (gdn_plan::split_worth_trying(n * kC, chunks, shape)) return (n - 1) * kC + 1;
  return std::numeric_limits<int>::max();
}

int gdn_planned_segments(const GdnArgs& a, const void* workspace, const void* state, GdnKeep keep) {
  const Workspace w = place(a, const_cast<void*>(workspace), const_cast<void*>(state), keep);
  int n = 0;
  CUDA_CHECK(cudaMemcpy(&n, w.counts + 1, sizeof(int), cudaMemcpyDeviceToHost));
  return n;
}

void gdn_forward(void* o, const void* qkv, const float* g, const float* beta, const GdnArgs& a, void* workspace,
                 cudaStream_t stream, void* state, GdnKeep keep) {
  if (a.total_tokens <= 0 || a.num_seqs <= 0) return;
  const Workspace w = place(a, workspace, state, keep);
  // Keeping prep's results is the plain forward's work (prep writes them either way, here into the
  // caller's state); keeping the chunk states is the training path's forward.
  const bool keep_states = state != nullptr && keep == GdnKeep::States;
  const bf16* x = static_cast<const bf16*>(qkv);
  const int Hk = a.num_k_heads, Hv = a.num_v_heads, K = a.k_head_dim, V = a.v_head_dim;
  // Where the output kernel follows the wgmma scan (one wave of scan CTAs with the state kept: 2B),
  // it starts beside it (programmatic dependent launch) on the SMs the short samples' CTAs leave,
  // each CTA waiting for its (sample, head)'s flag, shortest sample first (rtable).
  // QT_GDN_OUTPUT_AFTER_SCAN=1 launches it after the scan, for A/B.
  static const bool after_scan = env_knob("QT_GDN_OUTPUT_AFTER_SCAN", {1}) != 0;
  const bool in_scan = output_in_scan(a, keep_states);
  const bool beside = wgmma_scans(K, V) && !in_scan && !after_scan;
  if (beside) CUDA_CHECK(cudaMemsetAsync(w.done, 0, done_ints(w, Hv, false) * sizeof(int), stream));
  // A kept state is computed at the backward's precision, so reusing it changes nothing. Long
  // samples may split either way: a kept state keeps the plan and the maps' M for the backward.
  const bool keep_prep = state != nullptr && keep == GdnKeep::Prep;
  forward_common(w, x, g, beta, a, keep_states, in_scan ? static_cast<bf16*>(o) : nullptr, stream,
                 beside ? done_flags(w, Hv, 0) : nullptr, true, keep_prep ? PrepPart::kMakeKept : PrepPart::kMake);
  if (in_scan) return;
  const size_t bytes = static_cast<size_t>(out_smem_floats(K, V)) * sizeof(float);
  stage_begin(stream);
  launch_smem_beside(beside, gdn_output_kernel, "gdn_output_kernel", dim3(w.nc_max * Hv), kThreads, bytes, stream,
                     static_cast<bf16*>(o), w.rtable, w.nchunks, w.rs, x, w.Gc, w.Dh, w.Dl, w.h, Hk, Hv, K, V,
                     2 * Hk * K + Hv * V, beside ? done_flags(w, Hv, 0) : nullptr);
  stage_end("gdn_output_kernel", stream);
}

void gdn_backward(void* dqkv, float* dg, float* dbeta, const void* d_o, const void* qkv, const float* g,
                  const float* beta, const GdnArgs& a, void* workspace, cudaStream_t stream, const void* state,
                  GdnKeep keep) {
  if (a.total_tokens <= 0 || a.num_seqs <= 0) return;
  // The backward only reads the state (the kernels below write dD, dh, dqn, dkn, never it), except
  // for the split's ticket counters (and, in States' part, the reverse split's flags), which it resets.
  const Workspace w = place(a, workspace, const_cast<void*>(state), keep);
  // kept: the forward's chunk states are there (nothing of the forward runs); with prep's part only
  // (the plan, G, T, the row scales; non-empty where the wgmma scans run), the forward scan runs
  // again, not the chunk table or prep.
  const bool kept = state != nullptr && keep == GdnKeep::States;
  const bool prep_kept = state != nullptr && keep == GdnKeep::Prep && wgmma_scans(a.k_head_dim, a.v_head_dim);
  const bf16* x = static_cast<const bf16*>(qkv);
  const bf16* dO = static_cast<const bf16*>(d_o);
  const int T = a.total_tokens, Hk = a.num_k_heads, Hv = a.num_v_heads, K = a.k_head_dim, V = a.v_head_dim;
  const int conv_dim = 2 * Hk * K + Hv * V;
  static const bool mma_sync_dlocal = env_knob("QT_GDN_DLOCAL_MMA_SYNC", {1}) != 0;  // read once, as column_block's
  const bool separate = dlocal_separate();
  // bwd_chunk on wgmma at dk = dv = 128 (QT_GDN_BWD_CHUNK_MMA_SYNC=1 keeps the mma.sync one, for A/B).
  const bool wg_scan = wgmma_scans(K, V), wg_bc = wgmma_bwd_chunk(K, V);
  // The wgmma kernels run beside one another (programmatic dependent launch), each waiting only for
  // what it reads: the reverse scan needs none of the recomputed forward scan's results (only prep's),
  // so it starts on the SMs the forward's finished CTAs leave; bwd_chunk starts beside the reverse
  // scan and waits per (sample, head) for both scans' flags, taking items from a counter, shortest
  // sample first. With the scans' CTAs longest sample first, the short samples' SMs would otherwise
  // idle while the longest chains finish (2B: one wave of 128 CTAs). QT_GDN_BWD_CHUNK_AFTER_SCAN=1
  // launches each after the one before, for A/B.
  static const bool after_scan = env_knob("QT_GDN_BWD_CHUNK_AFTER_SCAN", {1}) != 0;
  const bool beside = wg_scan && wg_bc && !after_scan, rev_beside = beside && !kept && !separate;
  int* done_fwd = rev_beside ? done_flags(w, Hv, 0) : nullptr;
  int* done_rev = beside ? done_flags(w, Hv, 1) : nullptr;
  int* work = beside ? work_counter(w, Hv) : nullptr;
  if (beside) CUDA_CHECK(cudaMemsetAsync(w.done, 0, done_ints(w, Hv, true) * sizeof(int), stream));
  // The forward (recomputed here or kept) may have split long samples; the reverse scan then splits
  // them as well (its ticket instance; with the separate dlocal kernel, A/B only, neither splits).
  // Both decide by split_possible on the same args, so a kept state's plan is the one read here.
  const bool split = wg_scan && !separate && split_possible(a, w);
  if ((kept || prep_kept) && split) reset_split_walks(w, Hv, prep_kept, stream);
  const bool f16 = !kept && !separate && gdn_backward_fp16(K, V);
  if (!kept)
    forward_common(w, x, g, beta, a, true, nullptr, stream, done_fwd, split,
                   prep_kept ? PrepPart::kHave : PrepPart::kMake, f16);

  // A separate dlocal kernel (QT_GDN_DLOCAL_SEPARATE=1, or where no reverse scan forms dD_local) is the
  // wgmma one at dk = dv = 128; QT_GDN_DLOCAL_MMA_SYNC=1 keeps the mma.sync one (A/B).
  const int bv = column_block(K, V, a.num_v_heads, true), scan_thr = scan_threads(K, bv);
  // dD_local is formed inside the reverse scan (the wgmma one, or the mma.sync one where it fits)
  // unless QT_GDN_DLOCAL_SEPARATE=1; otherwise by a dlocal kernel first.
  const bool in_scan = !separate && (wg_scan || scan_bwd_fused(K, bv));
  const bool fused = in_scan && !wg_scan;  // the mma.sync reverse scan's fused variant
  if (!in_scan) {
    stage_begin(stream);
    if (K == kDlD && V == kDlD && !mma_sync_dlocal) {
      launch_smem(gdn_dlocal_wgmma_kernel, "gdn_dlocal_wgmma_kernel", dim3(w.nc_max, Hv), 128, kDlSmem, stream, w.dD,
                  w.table, w.nchunks, w.rs, x, w.Gc, dO, Hk, Hv, conv_dim);
    } else {
      const size_t dl_bytes = static_cast<size_t>(dlocal_smem_floats(K, V)) * sizeof(float);
      launch_smem(gdn_dlocal_kernel, "gdn_dlocal_kernel", dim3(w.nc_max, Hv), kThreads, dl_bytes, stream, w.dD, w.table,
                  w.nchunks, w.rs, x, w.Gc, dO, Hk, Hv, K, V, conv_dim);
    }
    stage_end("gdn_dlocal_kernel", stream);
  }

  // Row scales of q, k for the reverse scan and bwd_chunk: written by gdn_prep_kernel into the
  // state (kept by the forward, or recomputed above).
  const float* rs = w.rs;
  if (wg_scan) {
    const size_t bytes = separate ? scan_bwd_wg_smem<false>() : scan_bwd_wg_smem<true>();
    auto kernel = split      ? (f16 ? gdn_scan_bwd_wgmma_kernel<true, true, true> : gdn_scan_bwd_wgmma_kernel<true, true>)
                  : separate ? gdn_scan_bwd_wgmma_kernel<false>
                  : f16      ? gdn_scan_bwd_wgmma_kernel<true, false, true>
                             : gdn_scan_bwd_wgmma_kernel<true>;
    // By tickets at most one CTA per SM runs, and there are at most max_segs items per value head.
    const unsigned grid = split ? static_cast<unsigned>(std::min<int64_t>(static_cast<int64_t>(w.max_segs) * Hv,
                                                                          sm_count()))
                                : scan_grid(a, V);
    stage_begin(stream);
    launch_smem_beside(rev_beside, kernel, "gdn_scan_bwd_wgmma_kernel", dim3(grid), 256, bytes, stream, w.dh, w.dDh,
                       w.dDl, w.dD, w.Th, w.Tl, x, rs, w.Gc, beta, dO, w.vcu, w.seq_off, w.seq_order, w.seginfo,
                       w.items_rev, w.counts, w.split, Hk, Hv, conv_dim, done_rev, w.scl);
    stage_end("gdn_scan_bwd_wgmma_kernel", stream);
  } else {
    const size_t sb_bytes =
        static_cast<size_t>(fused ? scan_bwd_fused_smem_floats(K, bv) : scan_bwd_smem_floats(K, bv)) * sizeof(float);
    auto scan_bwd = fused                   ? gdn_scan_bwd_kernel<2 * kThreads, true>
                    : scan_thr > kThreads ? gdn_scan_bwd_kernel<2 * kThreads, false>
                                            : gdn_scan_bwd_kernel<kThreads, false>;
    stage_begin(stream);
    launch_smem(scan_bwd, "gdn_scan_bwd_kernel", scan_grid(a, bv), scan_thr, sb_bytes, stream, w.dh, w.dDh, w.dDl, w.dD,
                w.Wh, w.Wl, x, rs, w.Gc, dO, w.vcu, w.seq_off, w.seq_order, Hk, Hv, K, V, conv_dim, bv);
    stage_end("gdn_scan_bwd_kernel", stream);
  }

  // One value head per key head (2B): the wgmma bwd_chunk applies the L2-norm backward itself
  // (QT_GDN_QK_GRAD_SEPARATE=1 keeps qk_grad, for A/B).
  const bool l2_in_bwd_chunk = wg_bc && Hv == Hk && !qk_grad_separate();
  // The wgmma bwd_chunk leaves dq^, dk^ per value head as bf16 (dqn, dkn: layout sizes them so).
  bf16* dqh = static_cast<bf16*>(w.dqn);
  bf16* dkh = static_cast<bf16*>(w.dkn);
  float* dqf = static_cast<float*>(w.dqn);  // the mma.sync bwd_chunk's
  float* dkf = static_cast<float*>(w.dkn);
  stage_begin(stream);
  if (wg_bc) {
    // persistent: one CTA per SM walks the (chunk, head) items, so the next item's first tiles land
    // while the current one finishes
    const int grid = std::min(w.nc_max * Hv, sm_count());
    const bool ws = bwd_chunk_ws();
    auto kernel = f16  ? (l2_in_bwd_chunk ? gdn_bwd_chunk_wgmma_kernel<true, true, true>
                                          : gdn_bwd_chunk_wgmma_kernel<false, true, true>)
                  : ws ? (l2_in_bwd_chunk ? gdn_bwd_chunk_wgmma_kernel<true, true> : gdn_bwd_chunk_wgmma_kernel<false, true>)
                       : (l2_in_bwd_chunk ? gdn_bwd_chunk_wgmma_kernel<true, false> : gdn_bwd_chunk_wgmma_kernel<false, false>);
    launch_smem_beside(beside, kernel, "gdn_bwd_chunk_wgmma_kernel", dim3(grid), ws ? kBcWsThreads : 256, kBcSmem,
                       stream, dqh, dkh,
                       static_cast<bf16*>(dqkv), dg, dbeta, w.rtable, w.nchunks, rs, x, g, beta, w.Dh, w.Dl, w.dDh,
                       w.dDl, w.h, w.dh, dO, w.Th, w.Tl, Hk, Hv, conv_dim, done_fwd, done_rev, work, w.counts, w.scl);
  } else {
    const size_t bc_bytes = static_cast<size_t>(bwd_chunk_smem_floats(K, V)) * sizeof(float);
    launch_smem(gdn_bwd_chunk_kernel, "gdn_bwd_chunk_kernel", dim3(w.nc_max, Hv), kThreads, bc_bytes, stream, dqf,
                dkf, static_cast<bf16*>(dqkv), dg, dbeta, w.rtable, w.nchunks, rs, x, g, beta, w.Dh, w.Dl, w.dDh,
                w.dDl, w.h, w.dh, dO, w.Th, w.Tl, Hk, Hv, K, V, conv_dim);
  }
  stage_end("gdn_bwd_chunk_kernel", stream);

  if (l2_in_bwd_chunk) return;
  stage_begin(stream);
  if (!wg_bc) {
    // the mma.sync bwd_chunk's fp32 partials; one value head per key head (2B): no head batches, so
    // four rows per warp fit in 64 registers
    const int rows_per_warp = Hv == Hk ? 4 : 2, warps = (T * Hk * 2 + rows_per_warp - 1) / rows_per_warp;
    auto kernel = Hv == Hk ? gdn_qk_grad_kernel<4, 1, 4> : gdn_qk_grad_kernel<2, 2, 4>;
    kernel<<<(warps + 7) / 8, kThreads, 0, stream>>>(static_cast<bf16*>(dqkv), dqf, dkf, x, T, Hk, Hv, K, conv_dim);
  } else {  // the wgmma bwd_chunk's bf16 partials (at Hv == Hk only with QT_GDN_QK_GRAD_SEPARATE=1)
    const int64_t threads = static_cast<int64_t>(T) * Hk * 2 * 16;  // a half-warp per row
    auto kernel = Hv / Hk <= 4 ? gdn_qk_grad16_kernel<4, true> : gdn_qk_grad16_kernel<4, false>;
    kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<bf16*>(dqkv), dqh, dkh, x, T, Hk, Hv, conv_dim);
  }
  QT_LAUNCH_CHECK("gdn_qk_grad_kernel");
  stage_end("gdn_qk_grad_kernel", stream);
}

}  // namespace qt::cuda
