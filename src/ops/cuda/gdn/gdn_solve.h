// The chunk's triangular solve T = (I + A)^-1 (A strictly lower, C = 64) in 16 x 16 blocks, as
// phases of a 256-thread block with a barrier after each: per thread (phase 0), per warp (1, 2).
// The phases' index logic compiles for the host too, so a CPU test runs it thread by thread and
// warp by warp (tests/test_gdn_solve.cpp).
//
// With T_II = (I + A_II)^-1 and B_IK = T_II A_IK (K < I), the rows of T below the diagonal blocks
// follow from T (I + A) = I:
//   T_IJ = -sum_{K=J}^{I-1} B_IK T_KJ   (I > J).
//  - Phase 0: T_II and B_IK together. Block row I is a forward substitution through (I + A_II)
//    with 16 (I + 1) right-hand sides, e_c and A_IK's columns; one thread per column (160
//    threads), each 16 rows deep. B_IK goes into As's unused upper block (K, I). The other 96
//    threads zero T's upper blocks.
//  - Phases 1, 2: the blocks at distance 1, then those at 2 and 3, one 16 x 16 x 16 product per
//    warp (level_product): phase 1 also forms C_20 = B_20 - B_21 B_10 and C_3K = B_3K - B_32 B_2K,
//    so that T_20 = -C_20 T_00, T_31 = -C_31 T_11 and T_30 = -(C_30 T_00 + C_31 T_10), whose two
//    products run on two warps: the second into a scratch block that combine_t30 (or the caller,
//    on its way out) adds. The prep kernel runs them on the tensor cores (mma m16n8k8 tf32, each
//    operand split in two tf32 parts: 3 products, ~fp32). As scalar FMAs (16 threads per block, a
//    4 x 4 tile each) the two phases' 16-step chains on 3 and 2 warps left the CTA's other warps at
//    the barriers: 25 % of prep's stall samples at 27B.
// Every sum runs in a fixed order: deterministic. As and Ts are 64 x 64 fp32 with row stride ld
// (a multiple of 4, so rows stay 16-byte aligned; ld = 8 mod 32 spreads rows over the banks).
#pragma once

#if defined(__CUDACC__)
#define QT_HD __host__ __device__ __forceinline__
#else
#define QT_HD inline
#endif

namespace qt::gdn_solve {

constexpr int kPhases = 3;          // barrier after each: diag_phase, then level_product's 1 and 2
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

// Phases 1 and 2: warp w forms one 16 x 16 block O = S + sign L R (level_product; the prep kernel
// on the tensor cores, block_product below on the host).
//  Phase 1 (warps 0..5): T_10, T_21, T_32 = -B_{J+1,J} T_JJ, and C_30 = B_30 - B_32 B_20,
//           C_31 = B_31 - B_32 B_21, C_20 = B_20 - B_21 B_10 into A's dead blocks (3, 0), (3, 1), (2, 0).
//  Phase 2 (warps 0..3): T_20 = -C_20 T_00 (= -(B_20 T_00 + B_21 T_10) with T_10 = -B_10 T_00),
//           T_31 = -C_31 T_11 (likewise) and T_30 = -(C_30 T_00 + C_31 T_10), which is -(B_30 T_00 +
//           B_31 T_10 + B_32 T_20) with T_20 substituted, so it does not wait for a third level:
//           -C_30 T_00 into T_30, -C_31 T_10 into A's dead block (1, 0) (t30_part), summed by
//           combine_t30.
// No product reads a block another product of its phase writes.
struct BlockProduct {
  const float* l;  // 16 x 16 blocks, row stride ld
  const float* r;
  float* o;
  const float* s;  // nullptr: O = sign L R
  float sign;
};
constexpr int kT30Row = 16;  // t30_part: A's block (1, 0), rows 16 .. 31, columns 0 .. 15
QT_HD bool level_product(int phase, int w, float* Ts, float* As, int ld, BlockProduct& p) {
  float* const b = As;  // B_IK: As's upper block (K, I); C_IK: its lower block (I, K)
  auto blk = [&](float* m, int row, int col) { return m + 16 * row * ld + 16 * col; };
  if (phase == 1) {
    if (w < 3) {  // T_{J+1,J} = -B_{J+1,J} T_JJ
      p = {blk(b, w, w + 1), blk(Ts, w, w), blk(Ts, w + 1, w), nullptr, -1.f};
      return true;
    }
    if (w < 6) {  // C_IK = B_IK - B_IM B_MK: C_30, C_31 (M = 2), C_20 (M = 1)
      const int I = w < 5 ? 3 : 2, K = w < 5 ? w - 3 : 0, M = I - 1;
      p = {blk(b, M, I), blk(b, K, M), blk(b, I, K), blk(b, K, I), -1.f};
      return true;
    }
    return false;
  }
  if (w >= 4) return false;
  // -C_20 T_00 -> T_20, -C_31 T_11 -> T_31, -C_30 T_00 -> T_30, -C_31 T_10 -> t30_part
  const int I = w == 0 ? 2 : 3, K = w == 1 || w == 3 ? 1 : 0, J = w == 1 ? 1 : 0;
  p = {blk(b, I, K), blk(Ts, K, J), w == 3 ? blk(b, 1, 0) : blk(Ts, I, J), nullptr, -1.f};
  return true;
}
// The host's form of a block product: fp32 sums in k order (the kernel's runs on the tensor cores
// in three tf32 parts, ~fp32 products; tests/test_gdn_solve.cpp checks the blocks and their order,
// the CUDA tests the kernel's arithmetic).
inline void block_product(const BlockProduct& p, int ld) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float acc = 0.f;
      for (int m = 0; m < 16; ++m) acc += p.l[i * ld + m] * p.r[m * ld + j];
      p.o[i * ld + j] = (p.s != nullptr ? p.s[i * ld + j] : 0.f) + p.sign * acc;
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

}  // namespace qt::gdn_solve
