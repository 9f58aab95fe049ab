// The per-chunk gradients on wgmma (dk = dv = 128): one persistent, warp-specialized CTA per SM
// walks the (chunk, value head) items.
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_wgmma.cuh"

namespace qt::cuda::gdn {
namespace {

// Persistent: one CTA per SM (221 KB of smem) walks the (chunk, value head) items. Two warpgroups run
// the rows d, a third the C x C chain (P1, dT, X1, Mx) and the item's combine beside them (kBarQkvt
// ..: the chain's P1 under the rows' epilogues, its dT, X1, Mx under their dq^ and dv). Every product
// operand is a 128-byte-swizzled smem tile (cp.async panels, or planes this kernel writes) or a
// register A fragment. The C x K results (dq^, dk^) are formed transposed, rows d, columns i:
// warpgroup wgi owns d = 64 wgi .. + 63 of both, so the state products take the state rows as
// register A fragments from the fragment-native h / dh (staged in smem: 16-byte loads), and dk^
// collects all its terms in one accumulator (written once, no read-modify-write). P1's products
// form 32-column halves (m64n32, B rows 32 half..: a K-major B may start at any row of its panel).
// Per item, in order:
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
// The warp specialization: warpgroups 0, 1 run rows d as above, warpgroup 2 runs the C x C chain
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

// gdn_bwd_chunk_wgmma_kernel's arguments, in the order the kernel took them (the kernel names them as
// locals).
struct WgBwdChunkParams {
  bf16* dqn;
  bf16* dkn;
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
  int conv_dim;
  const int* done_fwd;
  const int* done;
  int* work;
  const int* counts;
  const float* scl;
};
// kL2 (one value head per key head): the L2-norm backward runs here and dq, dk go to dqkv as bf16
// (no qk_grad, no dqn / dkn); otherwise dq^, dk^ per value head go to dqn, dkn as bf16 (qk_grad sums
// them in fp32: the rounding flash-linear-attention's repeated q, k get in transformers, where the
// repeat's backward sums bf16 per-head gradients; fp32 partials made qk_grad read twice the bytes).
template <bool kL2, bool kF16 = false>
__global__ void __launch_bounds__(kBcWsThreads, 1) gdn_bwd_chunk_wgmma_kernel(const WgBwdChunkParams args) {
  // The arguments under the names the code below uses.
  bf16* const dqn = args.dqn;
  bf16* const dkn = args.dkn;
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
  const int conv_dim = args.conv_dim;
  const int* const done_fwd = args.done_fwd;
  const int* const done = args.done;
  int* const work = args.work;
  const int* const counts = args.counts;
  const float* const scl = args.scl;
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
  // scale_of the largest m over the chain warpgroup's 128 threads (all call it).
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
  // results (N from the accumulators' size: 32, one half (P1), or 64, the chain warpgroup reading each
  // A operand once); its epilogue takes the 32 columns 32 half .. of the
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
  // (a1 needs no dW: the chain issues it before dW's planes are written).
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
  // One half of P1 (the chain runs both in turn).
  auto cc_p1 = [&](const float* rb, int half) {
    float dp[16], qk[16];
    cc_p1_products(dp, qk, 32 * half);
    wg::wait<0>();
    wg::fence_operands(dp);
    wg::fence_operands(qk);
    cc_p1_epilogue(rb, half, dp, qk);
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
  // The rows warpgroups' block barrier (without the chain's warpgroup).
  auto sync_rows = [] { wg::named_sync(kBarRows, 256); };
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
  if (tid == 0) fl[kBcCur] = __int_as_float(item);
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
  const float *bs = rb + kBcBs, *eg = rb + kBcEg, *ekl = rb + kBcEkl, *rq = rb + kBcRq, *rk = rb + kBcRk;
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
    wg::named_sync(kBarQkvt, kBcWsThreads);
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

  wg::fence_proxy_async();
  wg::named_arrive(kBarDw, kBcWsThreads);
  wg::named_sync(kBarY, kBcWsThreads);

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
  sync_rows();  // q . dq^ complete (kL2); both warpgroups' Y reads done
  if constexpr (kL2) store_dq_l2();
  wg::named_arrive(kBarQ, kBcWsThreads);
  const int next = work != nullptr ? __float_as_int(fl[kBcNext]) : item + static_cast<int>(gridDim.x);
  const int4 nch = next < total ? rtable[next / Hv] : make_int4(0, 0, 0, 0);
  wg::named_sync(kBarDt, kBcWsThreads);  // the chain's dT has read W's, dD's and v's regions
  if (next < total) async_early_s0(next, nch);
  bc_dv(rb, wgi, bos, head, len);
  sync_rows();  // both warpgroups' dv done: dD's region is free
  wg::named_arrive(kBarV, kBcWsThreads);  // and v . (T^T dD) complete for the chain's combine
  if (next < total) async_early_dd(next, nch);  // the chain's dT read dD before kBarDt
  wg::named_sync(kBarP, kBcWsThreads);  // Pa, Pb and Mx's sums: the chain is done with the item
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
  if constexpr (kL2) {
    wg::named_sync(kBarK, kBcWsThreads);  // the chain's combine
    store_dk_l2();
  }
  item = next;
  par ^= 1;
  }  // items
  // the chain's warpgroup waits at kBarQkvt: no more items
  if (tid_x() == 0) fl[kBcCur] = __int_as_float(-1);
  wg::named_arrive(kBarQkvt, kBcWsThreads);
}

}  // namespace

void bwd_chunk_wgmma(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  // persistent: one CTA per SM walks the (chunk, head) items, so the next item's first tiles land
  // while the current one finishes
  const int grid = std::min(w.nc_max * c.Hv, sm_count());
  auto kernel = c.f16 ? (c.l2_in_bwd_chunk ? gdn_bwd_chunk_wgmma_kernel<true, true>
                                           : gdn_bwd_chunk_wgmma_kernel<false, true>)
                      : (c.l2_in_bwd_chunk ? gdn_bwd_chunk_wgmma_kernel<true> : gdn_bwd_chunk_wgmma_kernel<false>);
  // dq^, dk^ per value head as bf16 for qk_grad (dqn, dkn: layout sizes them so)
  const WgBwdChunkParams p{static_cast<bf16*>(w.dqn), static_cast<bf16*>(w.dkn), c.dqkv, c.dg, c.dbeta, w.rtable,
                           w.nchunks, w.rs, c.qkv, c.g, c.beta, w.Dh, w.Dl, w.dDh, w.dDl, w.h, w.dh, c.d_o, w.Th,
                           w.Tl, c.Hk, c.Hv, c.conv_dim, c.done_fwd, c.done_rev, c.work, w.counts, w.scl};
  launch_smem_beside(c.work != nullptr, kernel, "gdn_bwd_chunk_wgmma_kernel", dim3(grid), kBcWsThreads, kBcSmem,
                     stream, p);
}

}  // namespace qt::cuda::gdn
