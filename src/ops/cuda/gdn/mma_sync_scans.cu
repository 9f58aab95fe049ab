// The mma.sync family's state scans (warp-level m16n8k16 products, gdn_mma.cuh), per column block of
// dv: the forward scan (prep formed W and U) and the reverse scan (which also forms dD_local =
// P^T dO where scan_bwd_fused holds). What every head dim but dk = dv = 128 runs, and that one where
// GdnArgs::mma_sync asks.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/mma_sync_common.cuh"

namespace qt::cuda::gdn {
namespace {
using namespace mma_sync;

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

// ---- backward reverse state scan -------------------------------------------------------------------

// As the forward scan: raw q, k, dO tiles, W as its planes, dS fp32 in the update's registers with
// hi / lo planes for the dD product, -dD as planes for the update; 115,200 bytes at K = V = 128,
// bv = 32: 2 CTAs per SM.
int scan_bwd_smem_floats(int K, int bv) {
  return K * bv_ld(bv) + kC * raw_ld(K) + kC * raw_ld(K) + kC * bv_ld(bv) / 2 + kC * bv_ld(bv) + kC * (bv + 4) +
         2 * kC;
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

}  // namespace qt::cuda::gdn
