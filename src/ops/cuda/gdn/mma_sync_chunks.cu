// The mma.sync family's per-chunk kernels (warp-level m16n8k16 products, gdn_mma.cuh): the forward
// output (also the wgmma forward's where it keeps its state in one wave of scan CTAs), dD_local =
// P^T dO where the reverse scan does not form it, and the per-chunk gradients. What every head dim
// but dk = dv = 128 runs, and that one where GdnArgs::mma_sync asks.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/mma_sync_common.cuh"

namespace qt::cuda::gdn {
namespace {
using namespace mma_sync;

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

}  // namespace

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
