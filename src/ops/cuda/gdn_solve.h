// The chunk's triangular solve T = (I + A)^-1 (A strictly lower, C = 64) in 16 x 16 blocks, as
// per-thread phases of a 256-thread block with a barrier after each. The phases compile for the
// host too, so a CPU test runs the exact index logic of the kernel thread by thread
// (tests/test_gdn_solve.cpp).
//
// With T_II = (I + A_II)^-1 and B_IK = T_II A_IK (K < I), the rows of T below the diagonal blocks
// follow from T (I + A) = I:
//   T_IJ = -sum_{K=J}^{I-1} B_IK T_KJ   (I > J).
//  - Phase 0: T_II and B_IK together. Block row I is a forward substitution through (I + A_II)
//    with 16 (I + 1) right-hand sides, e_c and A_IK's columns; one thread per column (160
//    threads), each 16 rows deep. B_IK goes into As's unused upper block (K, I). The other 96
//    threads zero T's upper blocks.
//  - Phases 1, 2: the blocks at distance 1, then those at 2 and 3 (level_phase), one 16 x 16 x 16
//    product per output block and phase: phase 1 also forms C_20 = B_20 - B_21 B_10 and
//    C_3K = B_3K - B_32 B_2K, so that T_20 = -C_20 T_00, T_31 = -C_31 T_11 and
//    T_30 = -(C_30 T_00 + C_31 T_10), whose two products run on two thread groups: the second
//    into a scratch block that combine_t30 (or the caller, on its way out) adds. 16 threads per
//    product, each a 4 x 4 tile (rows tr + 4 i, columns 4 tc + j): per inner step 4 scalar loads
//    (rows 8 banks apart) and one 16-byte load feed 16 FMAs. The one-output-per-thread form it
//    replaced loaded two floats per FMA and kept the smem pipe ~80 % busy, over 7 barriers
//    (notes/gdn_kernels.md step 18); phase 2 ran two products in a row on 48 threads (step 24).
// Every sum runs in a fixed order: deterministic. As and Ts are 64 x 64 fp32 with row stride ld
// (a multiple of 4, so rows stay 16-byte aligned; ld = 8 mod 32 spreads rows over the banks).
#pragma once

#if defined(__CUDACC__)
#define QT_HD __host__ __device__ __forceinline__
#else
#define QT_HD inline
#endif

namespace qt::gdn_solve {

constexpr int kPhases = 3;          // barrier after each
constexpr int kDiagThreads = 160;   // sum over I < 4 of 16 (I + 1) columns

struct alignas(16) F4 {
  float x, y, z, w;
};
QT_HD F4 ld4(const float* p) {
  const F4 v = *reinterpret_cast<const F4*>(p);
  return v;
}

// Phase 0 for thread tid (of 256).
QT_HD void diag_phase(int tid, float* Ts, float* As, int ld) {
  if (tid >= kDiagThreads) {
    // T's six upper blocks, 1536 floats: 96 threads x 4 pieces of 4.
    for (int p = tid - kDiagThreads; p < 6 * 64; p += 256 - kDiagThreads) {
      const int blk = p >> 6, q = p & 63, row = q >> 2, c4 = 4 * (q & 3);
      // blocks (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)
      const int bi = blk < 3 ? 0 : blk < 5 ? 1 : 2;
      const int bj = blk < 3 ? blk + 1 : blk < 5 ? blk - 1 : 3;
      float* d = Ts + (16 * bi + row) * ld + 16 * bj + c4;
      d[0] = d[1] = d[2] = d[3] = 0.f;
    }
    return;
  }
  const int I = tid < 16 ? 0 : tid < 48 ? 1 : tid < 96 ? 2 : 3;
  const int c = tid - 8 * I * (I + 1), r0 = 16 * I;
  const bool ident = c < 16;
  const int K = ident ? 0 : (c >> 4) - 1, cc = c & 15;
  // Right-hand side: e_c, or column cc of A_IK; the solution into T_II's column c, or B_IK's
  // column cc in As's upper block (K, I).
  const float* rhs = As + r0 * ld + 16 * K + cc;
  float* out = ident ? Ts + r0 * ld + r0 + cc : As + 16 * K * ld + r0 + cc;
  float t[16];
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) {
    // Row i of A_II: entries j >= i are zero (strictly lower) and t[j >= i] not formed yet, so
    // only the 16-byte pieces below the diagonal are read and only their first i entries used.
    const float* a = As + (r0 + i) * ld + r0;
    float s0 = 0.f, s1 = 0.f;
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int j = 0; j < i; j += 4) {
      const F4 v = ld4(a + j);
      s0 += v.x * t[j];
      if (j + 1 < i) s1 += v.y * t[j + 1];
      if (j + 2 < i) s0 += v.z * t[j + 2];
      if (j + 3 < i) s1 += v.w * t[j + 3];
    }
    const float b = ident ? (i == cc ? 1.f : 0.f) : rhs[i * ld];
    t[i] = b - (s0 + s1);
    out[i * ld] = t[i];
  }
}

// acc[i][j] += sum_{m < 16} l[4 i ld + m] r[m ld + j]: a 16 x 16 block product's 4 x 4 tile, with l
// at row tr of the left block (the tile's rows tr + 4 i) and r at column 4 tc of the right one.
QT_HD void mac16(float (&acc)[4][4], const float* l, const float* r, int ld) {
#if defined(__CUDACC__)
#pragma unroll 4
#endif
  for (int m = 0; m < 16; ++m) {
    const F4 v = ld4(r + m * ld);
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int i = 0; i < 4; ++i) {
      const float a = l[4 * i * ld + m];
      acc[i][0] += a * v.x;
      acc[i][1] += a * v.y;
      acc[i][2] += a * v.z;
      acc[i][3] += a * v.w;
    }
  }
}
// The tile (rows tr + 4 i, columns 4 tc + j) of a 16 x 16 block at o: sign acc.
QT_HD void store_tile(float* o, int ld, const float (&acc)[4][4], float sign) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<F4*>(o + 4 * i * ld) = F4{sign * acc[i][0], sign * acc[i][1], sign * acc[i][2], sign * acc[i][3]};
}

// Phases 1 and 2 for thread tid: 16 threads per product, tile (tr, tc).
//  Phase 1: T_10, T_21, T_32 = -B_{J+1,J} T_JJ, and C_30 = B_30 - B_32 B_20, C_31 = B_31 - B_32 B_21,
//           C_20 = B_20 - B_21 B_10 into A's dead blocks (3, 0), (3, 1), (2, 0).
//  Phase 2: T_20 = -C_20 T_00 (= -(B_20 T_00 + B_21 T_10) with T_10 = -B_10 T_00), T_31 = -C_31 T_11
//           (likewise) and T_30 = -(C_30 T_00 + C_31 T_10), which is -(B_30 T_00 + B_31 T_10 +
//           B_32 T_20) with T_20 substituted, so it does not wait for a third level: -C_30 T_00 into
//           T_30, -C_31 T_10 into A's dead block (1, 0) (t30_part), summed by combine_t30.
constexpr int kT30Row = 16;  // t30_part: A's block (1, 0), rows 16 .. 31, columns 0 .. 15
QT_HD void level_phase(int tid, int phase, float* Ts, float* As, int ld) {
  const int grp = tid >> 4, tr = (tid >> 2) & 3, tc = tid & 3;
  // B_IK (upper block (K, I) of As), rows tr + 4 i; T_KJ, C_IK (lower block (I, K) of As) likewise.
  auto b = [&](int I, int K) { return As + (16 * K + tr) * ld + 16 * I; };
  auto c = [&](int I, int K) { return As + (16 * I + tr) * ld + 16 * K; };
  auto t = [&](int I, int J) { return Ts + (16 * I + tr) * ld + 16 * J; };
  auto tcol = [&](int K, int J) { return Ts + 16 * K * ld + 16 * J + 4 * tc; };  // T_KJ as the right factor
  auto bcol = [&](int I, int K) { return As + 16 * K * ld + 16 * I + 4 * tc; };  // B_IK as the right factor
  float acc[4][4] = {};
  if (phase == 1) {
    if (grp < 3) {
      const int J = grp, I = J + 1;
      mac16(acc, b(I, J), tcol(J, J), ld);
      store_tile(t(I, J) + 4 * tc, ld, acc, -1.f);
    } else if (grp < 6) {
      // C_IK = B_IK - B_IM B_MK: C_30, C_31 (M = 2), C_20 (M = 1)
      const int I = grp < 5 ? 3 : 2, K = grp < 5 ? grp - 3 : 0, M = I - 1;
      mac16(acc, b(I, M), bcol(M, K), ld);
      const float* bik = b(I, K) + 4 * tc;
      float d[4][4];
      for (int i = 0; i < 4; ++i) {
        const F4 v = ld4(bik + 4 * i * ld);
        d[i][0] = v.x - acc[i][0];
        d[i][1] = v.y - acc[i][1];
        d[i][2] = v.z - acc[i][2];
        d[i][3] = v.w - acc[i][3];
      }
      store_tile(c(I, K) + 4 * tc, ld, d, 1.f);
    }
  } else if (grp < 4) {
    // -C_20 T_00 -> T_20, -C_31 T_11 -> T_31, -C_30 T_00 -> T_30, -C_31 T_10 -> t30_part
    const int I = grp == 0 ? 2 : 3, K = grp == 1 || grp == 3 ? 1 : 0, J = grp == 1 ? 1 : 0;
    mac16(acc, c(I, K), tcol(K, J), ld);
    store_tile((grp == 3 ? c(1, 0) : t(I, J)) + 4 * tc, ld, acc, -1.f);
  }
}
// A's block (1, 0), where phase 2 leaves T_30's second part.
QT_HD const float* t30_part(const float* As, int ld) { return As + kT30Row * ld; }
// After phase 2 (and its barrier): T_30 += t30_part, threads tid < 64 one row of 4 each. The prep
// kernel instead adds it as it stores T (no barrier more).
constexpr int kCombineThreads = 64;
QT_HD void combine_t30(int tid, float* Ts, const float* As, int ld) {
  if (tid >= kCombineThreads) return;
  const int r = tid >> 2, c4 = 4 * (tid & 3);
  float* t = Ts + (48 + r) * ld + c4;
  const F4 v = ld4(t30_part(As, ld) + r * ld + c4);
  t[0] += v.x;
  t[1] += v.y;
  t[2] += v.z;
  t[3] += v.w;
}

// Phase p (0..kPhases-1) of the solve for thread tid.
QT_HD void phase(int p, int tid, float* Ts, float* As, int ld) {
  if (p == 0)
    diag_phase(tid, Ts, As, ld);
  else
    level_phase(tid, p, Ts, As, ld);
}

}  // namespace qt::gdn_solve
