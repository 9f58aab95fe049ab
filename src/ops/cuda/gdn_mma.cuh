// Warp-level tensor-core helpers for gdn.cu: mma.sync m16n8k8 TF32 with fp32 accumulation,
// operands gathered from fp32 shared (or global) memory through functors, so one helper serves
// every product of the chunked gated delta rule (transposes, masks and row scales live in the
// functors). Optional 3xTF32 split (a = hi + lo, a b ~ hi hi + hi lo + lo hi) gives ~fp32 products.
#pragma once
#include <cstdint>
#include <type_traits>

namespace qt::cuda::gdn_mma {

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc (a 16 x 8NT warp tile at rows m0.., columns n0..) += sum_{k in [k0, k1)} fa(i, k) fb(k, j).
// (k1 - k0) % 8 == 0. Fragment layout (PTX m16n8k8 .tf32): g = lane / 4, t = lane % 4;
// A: (g, t) (g+8, t) (g, t+4) (g+8, t+4); B: (t, g) (t+4, g); C: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1).
// kAExact (kBExact): every A (B) element is exact in TF32 (bf16 values), so its lo part is 0 and
// the split needs 2 mma per step instead of 3, same result.
template <int NT, int kUnroll = 4, bool kAExact = false, bool kBExact = false, class FA, class FB>
__device__ __forceinline__ void mma_acc(float (&acc)[NT][4], int m0, int n0, int k0, int k1, FA fa, FB fb,
                                        bool split) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll kUnroll
  for (int k = k0; k < k1; k += 8) {
    const float af[4] = {fa(m0 + g, k + t), fa(m0 + g + 8, k + t), fa(m0 + g, k + t + 4), fa(m0 + g + 8, k + t + 4)};
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      ah[r] = to_tf32(af[r]);
      al[r] = to_tf32(af[r] - __uint_as_float(ah[r]));
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = n0 + nt * 8 + g;
      const float b0 = fb(k + t, j), b1 = fb(k + t + 4, j);
      const uint32_t bh0 = to_tf32(b0), bh1 = to_tf32(b1);
      mma_tf32(acc[nt], ah, bh0, bh1);
      if (split) {
        if (!kAExact) mma_tf32(acc[nt], al, bh0, bh1);
        if (!kBExact) mma_tf32(acc[nt], ah, to_tf32(b0 - __uint_as_float(bh0)), to_tf32(b1 - __uint_as_float(bh1)));
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
    if constexpr (std::is_void_v<decltype(epi(0, 0, 0.f))>) {
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
// kAExact: every A element is exact in TF32, so the split costs 2 mma per step instead of 3.
template <int MT, int NT, int kUnroll = 4, bool kAExact = false, class FA, class FB>
__device__ __forceinline__ void mma_acc_m(float (&acc)[MT][NT][4], int m0, int n0, int k0, int k1, FA fa, FB fb,
                                          bool split) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll kUnroll
  for (int k = k0; k < k1; k += 8) {
    uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = n0 + nt * 8 + g;
      const float b0 = fb(k + t, j), b1 = fb(k + t + 4, j);
      bh[nt][0] = to_tf32(b0);
      bh[nt][1] = to_tf32(b1);
      bl[nt][0] = to_tf32(b0 - __uint_as_float(bh[nt][0]));
      bl[nt][1] = to_tf32(b1 - __uint_as_float(bh[nt][1]));
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = m0 + 16 * mt;
      const float af[4] = {fa(m + g, k + t), fa(m + g + 8, k + t), fa(m + g, k + t + 4), fa(m + g + 8, k + t + 4)};
      uint32_t ah[4], al[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        ah[r] = to_tf32(af[r]);
        al[r] = to_tf32(af[r] - __uint_as_float(ah[r]));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_tf32(acc[mt][nt], ah, bh[nt][0], bh[nt][1]);
        if (split) {
          if (!kAExact) mma_tf32(acc[mt][nt], al, bh[nt][0], bh[nt][1]);
          mma_tf32(acc[mt][nt], ah, bl[nt][0], bl[nt][1]);
        }
      }
    }
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
      if constexpr (!std::is_void_v<decltype(epi(0, 0, 0.f, 0.f))>) {
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
