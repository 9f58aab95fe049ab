// The mma.sync family (warp-level m16n8k16 tensor-core products, gdn_mma.cuh): what every head dim
// but dk = dv = 128 runs (and that one where GdnArgs::mma_sync asks), per column block of dv: the
// forward state scan (prep formed W and U), the output kernel (also the wgmma forward's where it keeps
// its state in one wave of scan CTAs), dD_local = P^T dO, the reverse state scan and the per-chunk
// gradients.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_common.cuh"

namespace qt::cuda::gdn {
namespace {

constexpr int kLdP = kC + 4;   // P^T in the fused reverse scan: fills the (raw_ld(128) / 2)-float q buffer


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

// gdn_scan_fwd_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct ScanFwdParams {
  float* h;
  bf16* Dgh;
  bf16* Dgl;
  const float* U;
  const bf16* Wh;
  const bf16* Wl;
  const bf16* qkv;
  const float* rs;
  const float* Gc;
  const int32_t* cu;
  const int* seq_off;
  const int* seq_order;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
  int bv;
};
// h[chunk, Hv, K x V] = state entering each chunk (fp32, fragment-native); D = U - W S out as its
// planes Dgh, Dgl [T, Hv, V]; W as its planes Wh, Wl [T, Hv, K]. k^ = k rs[., 1] (rs from
// gdn_prep_kernel): the update takes the raw k rows as its A operand and folds e^{G_L - G_i} rs_i
// into D's rows. Two barriers per chunk: W, U and k of chunk c+1 load (cp.async, one group) during
// chunk c's update and are waited on at the top of chunk c+1; the gates and row scales of chunk c+1
// are read into registers during chunk c.
// kMaxThreads: 256, or 512 for bv = 128 (16 warps, kScanTiles state tiles each; see scan_threads).
template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads) gdn_scan_fwd_kernel(const ScanFwdParams p) {
  // The arguments under the names the code below uses.
  float* const h = p.h;
  bf16* const Dgh = p.Dgh;
  bf16* const Dgl = p.Dgl;
  const float* const U = p.U;
  const bf16* const Wh = p.Wh;
  const bf16* const Wl = p.Wl;
  const bf16* const qkv = p.qkv;
  const float* const rs = p.rs;
  const float* const Gc = p.Gc;
  const int32_t* const cu = p.cu;
  const int* const seq_off = p.seq_off;
  const int* const seq_order = p.seq_order;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int K = p.K;
  const int V = p.V;
  const int conv_dim = p.conv_dim;
  const int bv = p.bv;
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

// gdn_output_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct OutputParams {
  bf16* o;
  const int4* rtable;
  const int* nchunks;
  const float* rs;
  const bf16* qkv;
  const float* Gc;
  const bf16* Dgh;
  const bf16* Dgl;
  const float* h;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
  const int* done;
};
// O = diag(e^G rq) (q S0) + P D, per (chunk, value head).
// A 1-D grid, heads fastest, over the entries of rtable (shortest sample first, the order in which a
// single wave of scan CTAs finishes; its flags name the zero states, chunk_state). done != nullptr:
// launched beside the scan, a CTA waits for its (sample, head)'s flag first.
__global__ void __launch_bounds__(kThreads) gdn_output_kernel(const OutputParams p) {
  // The arguments under the names the code below uses.
  bf16* const o = p.o;
  const int4* const rtable = p.rtable;
  const int* const nchunks = p.nchunks;
  const float* const rs = p.rs;
  const bf16* const qkv = p.qkv;
  const float* const Gc = p.Gc;
  const bf16* const Dgh = p.Dgh;
  const bf16* const Dgl = p.Dgl;
  const float* const h = p.h;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int K = p.K;
  const int V = p.V;
  const int conv_dim = p.conv_dim;
  const int* const done = p.done;
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

// gdn_dlocal_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct DlocalParams {
  float* dD;
  const int4* table;
  const int* nchunks;
  const float* rs;
  const bf16* qkv;
  const float* Gc;
  const bf16* d_o;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
};
__global__ void __launch_bounds__(kThreads) gdn_dlocal_kernel(const DlocalParams p) {
  // The arguments under the names the code below uses.
  float* const dD = p.dD;
  const int4* const table = p.table;
  const int* const nchunks = p.nchunks;
  const float* const rs = p.rs;
  const bf16* const qkv = p.qkv;
  const float* const Gc = p.Gc;
  const bf16* const d_o = p.d_o;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int K = p.K;
  const int V = p.V;
  const int conv_dim = p.conv_dim;
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

// gdn_scan_bwd_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct ScanBwdParams {
  float* dh;
  bf16* dDgh;
  bf16* dDgl;
  const float* dD;
  const bf16* Wh;
  const bf16* Wl;
  const bf16* qkv;
  const float* rs;
  const float* Gc;
  const bf16* d_o;
  const int32_t* cu;
  const int* seq_off;
  const int* seq_order;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
  int bv;
};
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
    gdn_scan_bwd_kernel(const ScanBwdParams p) {
  // The arguments under the names the code below uses.
  float* const dh = p.dh;
  bf16* const dDgh = p.dDgh;
  bf16* const dDgl = p.dDgl;
  const float* const dD = p.dD;
  const bf16* const Wh = p.Wh;
  const bf16* const Wl = p.Wl;
  const bf16* const qkv = p.qkv;
  const float* const rs = p.rs;
  const float* const Gc = p.Gc;
  const bf16* const d_o = p.d_o;
  const int32_t* const cu = p.cu;
  const int* const seq_off = p.seq_off;
  const int* const seq_order = p.seq_order;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int K = p.K;
  const int V = p.V;
  const int conv_dim = p.conv_dim;
  const int bv = p.bv;
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

// gdn_bwd_chunk_kernel's arguments, in the order the kernel took them (the kernel names them as locals).
struct BwdChunkParams {
  float* dqn;
  float* dkn;
  bf16* dqkv;
  float* dg;
  float* dbeta;
  const int4* rtable;
  const int* nchunks;
  const float* rs;
  const bf16* qkv;
  const float* g;
  const float* beta;
  const bf16* Dgh;
  const bf16* Dgl;
  const bf16* dDgh;
  const bf16* dDgl;
  const float* h;
  const float* dh;
  const bf16* d_o;
  const bf16* Th;
  const bf16* Tl;
  int Hk;
  int Hv;
  int K;
  int V;
  int conv_dim;
};
// dqn, dkn [T, Hv, K] (grads w.r.t. q^, k^ per value head), dv into dqkv, dg, dbeta. q^ = q rs[., 0],
// k^ = k rs[., 1] (rs [T, Hk, 2] from gdn_prep_kernel); D, dD as their planes [T, Hv, V].
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_chunk_kernel(const BwdChunkParams args) {
  // The arguments under the names the code below uses.
  float* const dqn = args.dqn;
  float* const dkn = args.dkn;
  bf16* const dqkv = args.dqkv;
  float* const dg = args.dg;
  float* const dbeta = args.dbeta;
  const int4* const rtable = args.rtable;
  const int* const nchunks = args.nchunks;
  const float* const rs = args.rs;
  const bf16* const qkv = args.qkv;
  const float* const g = args.g;
  const float* const beta = args.beta;
  const bf16* const Dgh = args.Dgh;
  const bf16* const Dgl = args.Dgl;
  const bf16* const dDgh = args.dDgh;
  const bf16* const dDgl = args.dDgl;
  const float* const h = args.h;
  const float* const dh = args.dh;
  const bf16* const d_o = args.d_o;
  const bf16* const Th = args.Th;
  const bf16* const Tl = args.Tl;
  const int Hk = args.Hk;
  const int Hv = args.Hv;
  const int K = args.K;
  const int V = args.V;
  const int conv_dim = args.conv_dim;
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

// dv columns per scan CTA (16, 32 or 128, dividing V): 128 (one 16-warp CTA per (sample, head), W
// and k read once per chunk) when there are at least 32 value heads and dk <= 128 (the state must fit
// the 16 warps and the smem), else 32. Measured on the H200: 128 is 4-5 % faster on the 4B / 27B
// training path (Hv = 32 / 48) but 5 % slower at Hv = 16, where 8 samples x 16 heads leave SMs idle
// at one CTA per SM.
int column_block(int K, int V, int num_v_heads) {
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

}  // namespace

void scan_fwd_mma_sync(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  const int bv = column_block(c.K, c.V, c.Hv), threads = scan_threads(c.K, bv);
  const size_t bytes = static_cast<size_t>(scan_fwd_smem_floats(c.K, bv)) * sizeof(float);
  auto kernel = threads > kThreads ? gdn_scan_fwd_kernel<2 * kThreads> : gdn_scan_fwd_kernel<kThreads>;
  const ScanFwdParams p{w.h,   w.Dh,     w.Dl,      w.dD,   w.Wh,   w.Wl,  c.qkv, w.rs,       w.Gc,
                        w.vcu, w.seq_off, w.seq_order, c.Hk, c.Hv, c.K, c.V, c.conv_dim, bv};
  launch_smem(kernel, "gdn_scan_fwd_kernel", scan_grid(c.a, bv), threads, bytes, stream, p);
}

bool output(const Call& c, cudaStream_t stream) {
  if (!c.run_output) return false;
  const Workspace& w = c.w;
  const size_t bytes = static_cast<size_t>(out_smem_floats(c.K, c.V)) * sizeof(float);
  const OutputParams p{c.o, w.rtable, w.nchunks, w.rs, c.qkv, w.Gc, w.Dh, w.Dl, w.h, c.Hk, c.Hv, c.K, c.V, c.conv_dim,
                       c.done_fwd};
  launch_smem_beside(c.out_beside, gdn_output_kernel, "gdn_output_kernel", dim3(w.nc_max * c.Hv), kThreads, bytes,
                     stream, p);
  return true;
}

bool dlocal(const Call& c, cudaStream_t stream) {
  if (!c.backward || c.wg) return false;
  const int bv = column_block(c.K, c.V, c.Hv);
  if (scan_bwd_fused(c.K, bv)) return false;  // the reverse scan forms dD_local itself
  const Workspace& w = c.w;
  const size_t bytes = static_cast<size_t>(dlocal_smem_floats(c.K, c.V)) * sizeof(float);
  const DlocalParams p{w.dD, w.table, w.nchunks, w.rs, c.qkv, w.Gc, c.d_o, c.Hk, c.Hv, c.K, c.V, c.conv_dim};
  launch_smem(gdn_dlocal_kernel, "gdn_dlocal_kernel", dim3(w.nc_max, c.Hv), kThreads, bytes, stream, p);
  return true;
}

void scan_bwd_mma_sync(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  const int bv = column_block(c.K, c.V, c.Hv), threads = scan_threads(c.K, bv);
  const bool fused = scan_bwd_fused(c.K, bv);
  const size_t bytes =
      static_cast<size_t>(fused ? scan_bwd_fused_smem_floats(c.K, bv) : scan_bwd_smem_floats(c.K, bv)) * sizeof(float);
  auto kernel = fused                 ? gdn_scan_bwd_kernel<2 * kThreads, true>
                : threads > kThreads ? gdn_scan_bwd_kernel<2 * kThreads, false>
                                      : gdn_scan_bwd_kernel<kThreads, false>;
  const ScanBwdParams p{w.dh, w.dDh, w.dDl, w.dD, w.Wh, w.Wl, c.qkv, w.rs, w.Gc, c.d_o, w.vcu, w.seq_off, w.seq_order,
                        c.Hk, c.Hv, c.K, c.V, c.conv_dim, bv};
  launch_smem(kernel, "gdn_scan_bwd_kernel", scan_grid(c.a, bv), threads, bytes, stream, p);
}

void bwd_chunk_mma_sync(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  const size_t bytes = static_cast<size_t>(bwd_chunk_smem_floats(c.K, c.V)) * sizeof(float);
  // dq^, dk^ per value head as fp32 for qk_grad
  const BwdChunkParams p{static_cast<float*>(w.dqn), static_cast<float*>(w.dkn), c.dqkv, c.dg, c.dbeta, w.rtable,
                         w.nchunks, w.rs, c.qkv, c.g, c.beta, w.Dh, w.Dl, w.dDh, w.dDl, w.h, w.dh, c.d_o, w.Th, w.Tl,
                         c.Hk, c.Hv, c.K, c.V, c.conv_dim};
  launch_smem(gdn_bwd_chunk_kernel, "gdn_bwd_chunk_kernel", dim3(w.nc_max, c.Hv), kThreads, bytes, stream, p);
}

}  // namespace qt::cuda::gdn
