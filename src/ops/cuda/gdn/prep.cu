// Prep: per (chunk, head) the gates' chunk-local cumsum G, T = (I + A)^-1 by the blocked
// triangular solve (gdn_solve.h) and the L2 row scales of q and k; for the mma.sync scans also W
// and U.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_common.cuh"
#include "ops/cuda/gdn/gdn_solve.h"

namespace qt::cuda::gdn {
namespace {

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

// ---- L2 norm (formed in prep) -------------------------------------------------------------------
// rs [T, Hk, 2]: the L2 scales of q (times K^-1/2) and k (q^ = q rs[., 0], k^ = k rs[., 1]), part
// of the kept state: every kernel stages the raw bf16 rows (exact bf16 mma operands) and applies
// the scale per row. The scale of a row with squared norm ss: (ss + eps)^-1/2, times K^-1/2 for q
// (row even).
__device__ __forceinline__ float l2_scale(float ss, int row, int K) {
  return (1.f / sqrtf(ss + kL2Eps)) * ((row & 1) == 0 ? 1.f / sqrtf(static_cast<float>(K)) : 1.f);
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

// gdn_prep_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct PrepParams {
  float* Gc;
  bf16* Wh;
  bf16* Wl;
  float* U;
  bf16* Th;
  bf16* Tl;
  const int4* table;
  const int* nchunks;
  float* rs;
  const bf16* qkv;
  const float* g;
  const float* beta;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
  int* prep_done;
};
// kWU = false (the wgmma scans, which form W S and U from T themselves): G and T only.
// kGroup (the wgmma scans' prep at more than one value head per key head): the CTA loops over the
// group's value heads, holding k k^T through the loop: 59 registers, 4 CTAs per SM; otherwise 48, 5.
template <bool kWU, bool kGroup = false>
__global__ void __launch_bounds__(kThreads, kGroup ? 4 : 5) gdn_prep_kernel(const PrepParams p) {
  // The arguments under the names the code below uses.
  float* const Gc = p.Gc;
  bf16* const Wh = p.Wh;
  bf16* const Wl = p.Wl;
  float* const U = p.U;
  bf16* const Th = p.Th;
  bf16* const Tl = p.Tl;
  const int4* const table = p.table;
  const int* const nchunks = p.nchunks;
  float* const rs = p.rs;
  const bf16* const qkv = p.qkv;
  const float* const g = p.g;
  const float* const beta = p.beta;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int K = p.K;
  const int V = p.V;
  const int conv_dim = p.conv_dim;
  int* const prep_done = p.prep_done;
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

}  // namespace

bool prep(const Call& c, cudaStream_t stream) {
  if (!c.make_prep) return false;
  const Workspace& w = c.w;
  // U goes to dD (the mma.sync forward scan reads it there); T only where a later kernel reads it.
  const PrepParams p{w.Gc, w.Wh, w.Wl, w.dD, c.store_t ? w.Th : nullptr, w.Tl, w.table, w.nchunks, w.rs, c.qkv, c.g,
                     c.beta, c.Hk, c.Hv, c.K, c.V, c.conv_dim, c.prep_beside ? w.prep_done : nullptr};
  const size_t bytes = static_cast<size_t>(prep_smem_floats(c.K, c.V, !c.wg)) * sizeof(float);
  auto kernel = !c.wg ? gdn_prep_kernel<true> : c.Hv > c.Hk ? gdn_prep_kernel<false, true> : gdn_prep_kernel<false>;
  // wgmma scans: one prep CTA per key head and chunk, its value heads in turn (gdn_prep_kernel).
  launch_smem_beside(c.prep_beside, kernel, "gdn_prep_kernel", dim3(w.nc_max, c.wg ? c.Hk : c.Hv), kThreads, bytes,
                     stream, p);
  return true;
}

}  // namespace qt::cuda::gdn
