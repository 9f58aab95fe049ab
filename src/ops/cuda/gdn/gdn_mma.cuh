// Warp-level tensor-core helpers for the GDN kernels (gdn/*.cu): mma.sync m16n8k16 bf16 with fp32 accumulation. Operands
// come either from raw bf16 smem tiles by ldmatrix (Ld<..>, exact: q, k, v, dO as staged), or are
// gathered elementwise (or pairwise along k: Gk) through functors from fp32 shared (or global)
// memory, or read from a fragment-native fp32 matrix in global memory (Nt: the chunk states), so
// one helper serves every product of the chunked gated delta rule (transposes, masks and row scales
// live in the functors). A gathered operand is split, a = hi + lo (two bf16,
// |a - hi - lo| <= 2^-18 |a|), and a b ~ hi hi + hi lo + lo hi (relative error <= ~3 2^-18 per
// product, i.e. ~fp32 products: 3 mma per k step; an exact operand needs no lo: 2; two exact: 1).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ops/cuda/warp_mma.cuh"

namespace qt::cuda::gdn_mma {

using warp_mma::mma_bf16;
using warp_mma::mma_tf32;
using warp_mma::pack_bf16;

// x split in two tf32 parts (mma_tf32's operands): |x - hi - lo| <= 2^-22 |x|.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}
// (x0, x1) as an fp16 pair (x0 in the low half), and back.
__device__ __forceinline__ uint32_t pack_f16(float x0, float x1) {
  const __half2 v = __floats2half2_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_f16(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
// hi = bf16(x0, x1); lo = bf16(x - hi) (the differences are exact in fp32).
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  lo = pack_bf16(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
}

// A raw bf16 smem tile read by ldmatrix (rows 16-byte aligned: ld % 8 == 0, p 16-byte aligned,
// column offsets multiples of 8). As an A operand: kTrans = false: A(i, k) = p[i ld + k], true:
// A(i, k) = p[k ld + i]. As a B operand: kTrans = false: B(k, j) = p[j ld + k], true: B(k, j) = p[k ld + j].
template <bool kTrans>
struct Ld {
  static constexpr bool trans = kTrans;
  const __nv_bfloat16* p;
  int ld;
};
// An fp32 operand stored split into two bf16 tiles of that layout (a = hi + lo, as split_bf16
// makes them): the same values as gathering a and splitting it, by ldmatrix.
template <bool kTrans>
struct Ld2 {
  static constexpr bool trans = kTrans;
  const __nv_bfloat16* hi;
  const __nv_bfloat16* lo;
  int ld;
};
// A B operand B(k, j) = s[k] p[k ld + j]: a raw bf16 tile (k rows, layout as Ld<true>) with an fp32
// scale per k row, read by ldmatrix and scaled and split in the registers: the same products and
// split as gathering s[k] p[k ld + j] elementwise, from 1 ldmatrix and 2 64-bit loads per k step
// and n tile pair instead of 8 16-bit and 4 32-bit ones.
struct LdKs {
  const __nv_bfloat16* p;
  int ld;
  const float* s;  // 8-byte aligned
};
// A gathered fp32 operand whose functor returns two elements adjacent along k at once (k even):
// as an A operand f(i, k) = (A(i, k), A(i, k + 1)), as a B operand f(k, j) = (B(k, j), B(k + 1, j)),
// so a pair stored contiguously comes from one 64-bit load instead of two 32-bit ones. Same values,
// same split, same products as the elementwise functor.
template <class F>
struct Gk {
  F f;
};
template <class F>
Gk(F) -> Gk<F>;
// is_tag<T, Gk>::value: T is a functor wrapped in the tag Gk (or Pair, below).
template <class T, template <class> class Tag>
struct is_tag : std::false_type {};
template <class F, template <class> class Tag>
struct is_tag<Tag<F>, Tag> : std::true_type {};
// The float2 at p (8-byte aligned: an even float offset from an aligned base).
__device__ __forceinline__ float2 ld_f2(const float* p) { return *reinterpret_cast<const float2*>(p); }

// Fragment-native fp32 storage of an R x N matrix X (R % 8 == 0, N % 16 == 0): the 8-row x 16-column
// blocks in row-major block order, 128 floats each; in a block, lane l = 4 (r % 8) + (c % 8) / 2 of
// a warp owns the float4 at 4 l holding X[r][c0 + 2t], X[r][c0 + 2t + 1], X[r][c0 + 2t + 8],
// X[r][c0 + 2t + 9] (c0 the block's first column, t = l % 4). That is what an mma C fragment of a
// 16 x 16 tile holds per row, so a producer stores it with one 16-byte store per row half, and what
// the B fragments of B(k, n) = X[n][k] need, so a consumer loads them with one 16-byte load per n
// tile: a warp reads or writes 512 contiguous bytes per instruction instead of 8 scattered rows.
// Rows 8 j.. start at float 8 j N, as in row-major order, so row offsets carry over unchanged.
__host__ __device__ __forceinline__ int frag_index(int r, int c, int ncols) {
  return ((r >> 3) * (ncols >> 4) + (c >> 4)) * 128 + ((r & 7) * 4 + ((c & 7) >> 1)) * 4 + (c & 1) + ((c & 8) >> 2);
}
// A B operand read from a fragment-native matrix X with ncols columns: B(k, n) = X[n][k] (k
// multiples of 16, n of 8 at every call, as the mma loops make them).
struct Nt {
  const float* p;
  int ncols;
};
// A B operand read from a fragment-native matrix X with ncols columns without transposing it:
// B(k, n) = X[k][n] (k multiples of 16, n of 16). The 16-byte loads of Nt give 8 x 8 blocks of X
// in the row-major fragment layout; movmatrix transposes each into the B fragment (after the
// split, as it moves 16-bit values): 2 16-byte loads and 8 movmatrix per k step and n tile pair
// instead of 16 scalar loads touching twice the sectors.
struct NtT {
  const float* p;
  int ncols;
};
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Nt with a side product: when on, the same 16-byte pieces of a second fragment-native matrix q
// (same shape) are loaded too and their elementwise products with p summed into *dot, so a kernel
// that streams p through an mma anyway gets <p, q> over the pieces it reads without reading p twice.
struct NtDot {
  const float* p;
  const float* q;
  int ncols;
  float* dot;
  bool on;
};

template <class F>
struct is_ld : std::false_type {};
template <bool kT>
struct is_ld<Ld<kT>> : std::true_type {};
template <class F>
struct is_ld2 : std::false_type {};
template <bool kT>
struct is_ld2<Ld2<kT>> : std::true_type {};

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
}
// Stores four 8 x 8 bf16 matrices: register m of each lane holds the pair (row lane / 4, columns
// 2 (lane % 4), + 1) of matrix m (the accumulator fragment's layout), and lane l gives the shared
// address of row l % 8 of matrix l / 8. One instruction for what takes four 4-byte stores.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// The A fragment of rows m.., k columns k..k+15 from a bf16 tile (layout as Ld<kTrans>): the 8 x 8
// matrix q = lane / 8 is register q, its row r = lane % 8 is addressed by that lane.
template <bool kTrans>
__device__ __forceinline__ void ld_a(uint32_t (&r)[4], const __nv_bfloat16* p, int ld, int m, int k) {
  const int lane = threadIdx.x & 31, q = lane >> 3, rr = lane & 7;
  if constexpr (kTrans) {
    ldmatrix_x4<true>(r, p + (k + (q >> 1) * 8 + rr) * ld + m + (q & 1) * 8);
  } else {
    ldmatrix_x4<false>(r, p + (m + (q & 1) * 8 + rr) * ld + k + (q >> 1) * 8);
  }
}
// The B fragments of the n tiles n.. and n+8.. (k rows k..k+15) from a bf16 tile.
template <bool kTrans>
__device__ __forceinline__ void ld_b2(uint32_t (&r)[4], const __nv_bfloat16* p, int ld, int k, int n) {
  const int lane = threadIdx.x & 31, q = lane >> 3, rr = lane & 7;
  if constexpr (kTrans) {
    ldmatrix_x4<true>(r, p + (k + (q & 1) * 8 + rr) * ld + n + (q >> 1) * 8);
  } else {
    ldmatrix_x4<false>(r, p + (n + (q >> 1) * 8 + rr) * ld + k + (q & 1) * 8);
  }
}

// One fragment register from the k-adjacent fp32 pair (x0, x1): its bf16 pair, or its hi / lo
// split when want_lo.
__device__ __forceinline__ void frag_pair(float x0, float x1, uint32_t& h, uint32_t& l, bool want_lo) {
  if (want_lo) {
    split_bf16(x0, x1, h, l);
  } else {
    h = pack_bf16(x0, x1);
  }
}
// One fragment register of a gathered operand: the k-adjacent pair (k, k + 1) at row / column i
// of A (kA: A(i, k), A(i, k + 1)) or B (B(k, i), B(k + 1, i)), as bf16 (hi / lo when want_lo).
template <bool kA, class F>
__device__ __forceinline__ void gather_pair(const F& f, int i, int k, uint32_t& h, uint32_t& l, bool want_lo) {
  float x0, x1;
  if constexpr (is_tag<F, Gk>::value) {
    const float2 x = kA ? f.f(i, k) : f.f(k, i);
    x0 = x.x;
    x1 = x.y;
  } else {
    x0 = kA ? f(i, k) : f(k, i);
    x1 = kA ? f(i, k + 1) : f(k + 1, i);
  }
  frag_pair(x0, x1, h, l, want_lo);
}

// A fragment (PTX m16n8k16 .bf16; g = lane / 4, t = lane % 4) of rows m.., k columns k..k+15:
// reg 0 (g, 2t..2t+1), 1 (g+8, 2t..), 2 (g, 2t+8..), 3 (g+8, 2t+8..). lo only when want_lo.
template <class FA>
__device__ __forceinline__ void frag_a(const FA& fa, int m, int k, uint32_t (&h)[4], uint32_t (&l)[4], bool want_lo) {
  if constexpr (is_ld<FA>::value) {
    ld_a<FA::trans>(h, fa.p, fa.ld, m, k);
  } else if constexpr (is_ld2<FA>::value) {
    ld_a<FA::trans>(h, fa.hi, fa.ld, m, k);
    if (want_lo) ld_a<FA::trans>(l, fa.lo, fa.ld, m, k);
  } else {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      gather_pair<true>(fa, m + g + (q & 1) * 8, k + 2 * t + (q >> 1) * 8, h[q], l[q], want_lo);
  }
}

// B fragments of the two n tiles n.. and n+8.. (k rows k..k+15): tile u gets regs (2u, 2u+1) =
// B(2t..2t+1, g), B(2t+8..2t+9, g).
template <class FB>
__device__ __forceinline__ void frag_b2(const FB& fb, int k, int n, uint32_t (&h)[4], uint32_t (&l)[4], bool want_lo) {
  if constexpr (is_ld<FB>::value) {
    ld_b2<FB::trans>(h, fb.p, fb.ld, k, n);
  } else if constexpr (is_ld2<FB>::value) {
    ld_b2<FB::trans>(h, fb.hi, fb.ld, k, n);
    if (want_lo) ld_b2<FB::trans>(l, fb.lo, fb.ld, k, n);
  } else if constexpr (std::is_same_v<FB, NtT>) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // rows k + 8r.. of X: register r of both n tiles
      const float4 x = *reinterpret_cast<const float4*>(fb.p + frag_index(k + 8 * r, n, fb.ncols) + 4 * lane);
      uint32_t h0, l0, h1, l1;  // the 8 x 8 blocks at columns n.. and n + 8..
      frag_pair(x.x, x.y, h0, l0, want_lo);
      frag_pair(x.z, x.w, h1, l1, want_lo);
      h[r] = movmatrix_trans(h0);
      h[2 + r] = movmatrix_trans(h1);
      if (want_lo) {
        l[r] = movmatrix_trans(l0);
        l[2 + r] = movmatrix_trans(l1);
      }
    }
  } else if constexpr (std::is_same_v<FB, LdKs>) {
    ld_b2<true>(h, fb.p, fb.ld, k, n);
    const int t = threadIdx.x & 3;
    const float2 s0 = ld_f2(fb.s + k + 2 * t), s1 = ld_f2(fb.s + k + 8 + 2 * t);  // rows of regs 0, 2 / 1, 3
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 sc = (q & 1) ? s1 : s0;
      frag_pair(__uint_as_float(h[q] << 16) * sc.x, __uint_as_float(h[q] & 0xffff0000u) * sc.y, h[q], l[q], want_lo);
    }
  } else if constexpr (std::is_same_v<FB, Nt> || std::is_same_v<FB, NtDot>) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // n tile u: X[n + 8u + g][k + 2t, +1, +8, +9], the slot of this lane
      const int off = frag_index(n + 8 * u, k, fb.ncols) + 4 * lane;
      const float4 x = *reinterpret_cast<const float4*>(fb.p + off);
      if constexpr (std::is_same_v<FB, NtDot>) {
        if (fb.on) {
          const float4 y = *reinterpret_cast<const float4*>(fb.q + off);
          *fb.dot += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
        }
      }
      frag_pair(x.x, x.y, h[2 * u], l[2 * u], want_lo);
      frag_pair(x.z, x.w, h[2 * u + 1], l[2 * u + 1], want_lo);
    }
  } else {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      gather_pair<false>(fb, n + g + (q >> 1) * 8, k + 2 * t + (q & 1) * 8, h[q], l[q], want_lo);
  }
}

// acc (a 16 x 8NT warp tile at rows m0.., columns n0..; NT even) += sum_{k in [k0, k1)} A(i, k) B(k, j),
// (k1 - k0) % 16 == 0. C fragment: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1).
// kAExact (kBExact): every A (B) element is a bf16 value (raw tiles are by construction), so its lo
// part is 0 and the split needs 2 mma per step instead of 3, same result.
template <int NT, int kUnroll = 4, bool kAExact = false, bool kBExact = false, class FA, class FB>
__device__ __forceinline__ void mma_acc(float (&acc)[NT][4], int m0, int n0, int k0, int k1, FA fa, FB fb) {
  static_assert(NT % 2 == 0, "n tiles come in pairs");
  constexpr bool aex = kAExact || is_ld<FA>::value, bex = kBExact || is_ld<FB>::value;
  constexpr int kU = kUnroll > 1 ? kUnroll / 2 : 1;  // kUnroll counts k steps of 8 (TF32 era)
#pragma unroll kU
  for (int k = k0; k < k1; k += 16) {
    uint32_t ah[4], al[4];
    frag_a(fa, m0, k, ah, al, !aex);
#pragma unroll
    for (int np = 0; np < NT; np += 2) {
      uint32_t bh[4], bl[4];
      frag_b2(fb, k, n0 + np * 8, bh, bl, !bex);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        mma_bf16(acc[np + u], ah, bh[2 * u], bh[2 * u + 1]);
        if (!aex) mma_bf16(acc[np + u], al, bh[2 * u], bh[2 * u + 1]);
        if (!bex) mma_bf16(acc[np + u], ah, bl[2 * u], bl[2 * u + 1]);
      }
    }
  }
}

// Fixed-order xor sums over the 4 lanes of a fragment row (t = 0..3) and over the 8 row groups
// (g = 0..7, lanes of equal t). Every lane ends with the same value (fp addition is commutative).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
__device__ __forceinline__ float group_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  return v;
}
// Pair epilogues: wrapping an epilogue in Pair{f} makes for_tiles / for_tiles_m2 call it once per
// pair of adjacent columns (j, j + 1) of a thread's C fragment (j even) instead of once per element,
// so stores can be 32-bit (bf16 pairs) or 64-bit (float2) words: f(i, j, v0, v1) for for_tiles,
// f(i, j, a0, a1, b0, b1) (accumulators 1 and 2) for for_tiles_m2. A row-sum epilogue returns a
// float2 (the two elements' contributions), added in the per-element order: same sums as unpaired.
template <class F>
struct Pair {
  F f;
};
template <class F>
Pair(F) -> Pair<F>;

// Every 16 x 8NT tile of an M x N output (M % 16 == 0, N % (8 NT) == 0), warp-strided over the
// block: body(acc, m0, n0) accumulates into a zeroed tile, then epi(i, j, value) per element.
// A given (i, j) always lands on the same thread for the same M, N, NT and block size.
// Row dot products reduced in registers: when epi returns a float (row i's contribution of element
// (i, j)), the tile's row sums land in rowp[(n0 / (8 NT)) * M + i] (one slot per column tile, each
// written exactly once per call, skipped tiles' zero sums too), summed in a fixed order (per
// thread, then the quad tree), so the result is deterministic.
template <int NT, class Body, class Epi>
__device__ __forceinline__ void for_tiles(int M, int N, Body body, Epi epi, float* rowp = nullptr) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tn = N / (8 * NT), tiles = (M / 16) * tn;
  for (int tile = warp; tile < tiles; tile += nw) {
    const int m0 = (tile / tn) * 16, n0 = (tile % tn) * 8 * NT;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[nt][r] = 0.f;
    body(acc, m0, n0);
    if constexpr (is_tag<Epi, Pair>::value) {
      if constexpr (std::is_void_v<decltype(epi.f(0, 0, 0.f, 0.f))>) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            epi.f(m0 + g + 8 * hh, n0 + nt * 8 + 2 * t, acc[nt][2 * hh], acc[nt][2 * hh + 1]);
      } else {
        float rsum[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const float2 r = epi.f(m0 + g + 8 * hh, n0 + nt * 8 + 2 * t, acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            rsum[hh] += r.x;
            rsum[hh] += r.y;
          }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = quad_sum(rsum[hh]);
          if (t == 0) rowp[(n0 / (8 * NT)) * M + m0 + g + 8 * hh] = s;
        }
      }
    } else if constexpr (std::is_void_v<decltype(epi(0, 0, 0.f))>) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) epi(m0 + g + (r >= 2 ? 8 : 0), n0 + nt * 8 + 2 * t + (r & 1), acc[nt][r]);
    } else {
      float rsum[2] = {0.f, 0.f};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          rsum[r >> 1] += epi(m0 + g + (r >= 2 ? 8 : 0), n0 + nt * 8 + 2 * t + (r & 1), acc[nt][r]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(rsum[hh]);
        if (t == 0) rowp[(n0 / (8 * NT)) * M + m0 + g + 8 * hh] = s;
      }
    }
  }
}

// As mma_acc for MT row tiles (rows m0 + 16 mt ..) that share each B fragment: each B element is
// loaded and split once per k step for all MT tiles (B operands read from global memory).
// ms: the row step between the MT tiles (16: adjacent).
template <int MT, int NT, int kUnroll = 4, bool kAExact = false, class FA, class FB>
__device__ __forceinline__ void mma_acc_m(float (&acc)[MT][NT][4], int m0, int n0, int k0, int k1, FA fa, FB fb,
                                          int ms = 16) {
  static_assert(NT % 2 == 0, "n tiles come in pairs");
  constexpr bool aex = kAExact || is_ld<FA>::value, bex = is_ld<FB>::value;
  constexpr int kU = kUnroll > 1 ? kUnroll / 2 : 1;
#pragma unroll kU
  for (int k = k0; k < k1; k += 16) {
    uint32_t bh[NT / 2][4], bl[NT / 2][4];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) frag_b2(fb, k, n0 + np * 16, bh[np], bl[np], !bex);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t ah[4], al[4];
      frag_a(fa, m0 + ms * mt, k, ah, al, !aex);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = bh[nt >> 1][2 * (nt & 1)], b1 = bh[nt >> 1][2 * (nt & 1) + 1];
        mma_bf16(acc[mt][nt], ah, b0, b1);
        if (!aex) mma_bf16(acc[mt][nt], al, b0, b1);
        if (!bex) mma_bf16(acc[mt][nt], ah, bl[nt >> 1][2 * (nt & 1)], bl[nt >> 1][2 * (nt & 1) + 1]);
      }
    }
  }
}
// Whether a for_tiles_m2 epilogue returns row contributions (a float, or a float2 for a Pair).
template <class Epi>
__device__ constexpr bool m2_sums() {
  if constexpr (is_tag<Epi, Pair>::value) {
    return !std::is_void_v<decltype(std::declval<Epi>().f(0, 0, 0.f, 0.f, 0.f, 0.f))>;
  } else {
    return !std::is_void_v<decltype(std::declval<Epi>()(0, 0, 0.f, 0.f))>;
  }
}
// As for_tiles with (16 MT) x (8 NT) warp tiles (M % (16 MT) == 0) and two accumulators:
// body(a1, a2, m0, n0) with a1, a2 float[MT][NT][4], then epi(i, j, v1, v2) per element.
// When epi returns a float, row sums go to rowp as in for_tiles.
template <int MT, int NT, class Body, class Epi>
__device__ __forceinline__ void for_tiles_m2(int M, int N, Body body, Epi epi, float* rowp = nullptr) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tn = N / (8 * NT), tiles = (M / (16 * MT)) * tn;
  for (int tile = warp; tile < tiles; tile += nw) {
    const int m0 = (tile / tn) * 16 * MT, n0 = (tile % tn) * 8 * NT;
    float a1[MT][NT][4], a2[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) a1[mt][nt][r] = a2[mt][nt][r] = 0.f;
    body(a1, a2, m0, n0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float rsum[2] = {0.f, 0.f};
      if constexpr (is_tag<Epi, Pair>::value) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int i = m0 + 16 * mt + g + 8 * hh, j = n0 + nt * 8 + 2 * t;
            const float x0 = a1[mt][nt][2 * hh], x1 = a1[mt][nt][2 * hh + 1];
            const float y0 = a2[mt][nt][2 * hh], y1 = a2[mt][nt][2 * hh + 1];
            if constexpr (std::is_void_v<decltype(epi.f(0, 0, 0.f, 0.f, 0.f, 0.f))>) {
              epi.f(i, j, x0, x1, y0, y1);
            } else {
              const float2 r = epi.f(i, j, x0, x1, y0, y1);
              rsum[hh] += r.x;
              rsum[hh] += r.y;
            }
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int i = m0 + 16 * mt + g + (r >= 2 ? 8 : 0), j = n0 + nt * 8 + 2 * t + (r & 1);
            if constexpr (std::is_void_v<decltype(epi(0, 0, 0.f, 0.f))>) {
              epi(i, j, a1[mt][nt][r], a2[mt][nt][r]);
            } else {
              rsum[r >> 1] += epi(i, j, a1[mt][nt][r], a2[mt][nt][r]);
            }
          }
      }
      if constexpr (m2_sums<Epi>()) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = quad_sum(rsum[hh]);
          if (t == 0) rowp[(n0 / (8 * NT)) * M + m0 + 16 * mt + g + 8 * hh] = s;
        }
      }
    }
  }
}

// Row and column sums in registers, two accumulators per tile: body(a1, a2, m0, n0), then
// epi(i, j, v1, v2, rc, cc) sets element (i, j)'s contribution rc to row i and cc to column j;
// rowp[(n0 / (8 NT)) * M + i] gets the tile's row sums, colp[(m0 / 16) * N + j] its column sums
// (every slot written exactly once per call). Fixed order: deterministic.
template <int NT, class Body, class Epi>
__device__ __forceinline__ void for_tiles_rc(int M, int N, Body body, Epi epi, float* rowp, float* colp) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tn = N / (8 * NT), tiles = (M / 16) * tn;
  for (int tile = warp; tile < tiles; tile += nw) {
    const int m0 = (tile / tn) * 16, n0 = (tile % tn) * 8 * NT;
    float a1[NT][4], a2[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) a1[nt][r] = a2[nt][r] = 0.f;
    body(a1, a2, m0, n0);
    float rsum[2] = {0.f, 0.f}, csum[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      csum[nt][0] = csum[nt][1] = 0.f;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float rc, cc;
        epi(m0 + g + (r >= 2 ? 8 : 0), n0 + nt * 8 + 2 * t + (r & 1), a1[nt][r], a2[nt][r], rc, cc);
        rsum[r >> 1] += rc;
        csum[nt][r & 1] += cc;
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float s = quad_sum(rsum[hh]);
      if (t == 0) rowp[(n0 / (8 * NT)) * M + m0 + g + 8 * hh] = s;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float s = group_sum(csum[nt][q]);
        if (g == 0) colp[(m0 / 16) * N + n0 + nt * 8 + 2 * t + q] = s;
      }
  }
}

}  // namespace qt::cuda::gdn_mma
