// The GDN prep kernel's blocked triangular solve (src/ops/cuda/gdn/gdn_solve.h), run on the CPU: its
// phases for all 256 threads (phase 0) and 8 warps (the block products of phases 1, 2, here as fp32
// sums: the kernel runs them on the tensor cores), phase by phase as the barriers order them, then
// combine_t30 (which the prep kernel folds into its T stores), against a float64 forward
// substitution. Running the threads (warps) of each phase in two different orders and comparing the
// results bit for bit catches a phase that reads what another of the same phase writes (a missing
// barrier on the GPU). The CUDA tests check the kernel's arithmetic as a whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cuda/gdn/gdn_solve.h"

namespace qt {
namespace {

constexpr int kN = 64, kLd = 72, kThreadsPerBlock = 256;

// A strictly lower 64 x 64 in ld-strided storage; the strict upper part holds garbage (the kernel
// leaves it unwritten) and the diagonal zero.
std::vector<float> random_a(std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(kN * kLd);
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kLd; ++j) a[i * kLd + j] = j < i ? scale * u(rng) : (j == i ? 0.f : 1e30f);
  return a;
}

// T = (I + A)^-1 in float64, row by row.
std::vector<double> reference_inverse(const std::vector<float>& a) {
  std::vector<double> t(kN * kN, 0.0);
  for (int c = 0; c < kN; ++c)
    for (int i = c; i < kN; ++i) {
      double s = i == c ? 1.0 : 0.0;
      for (int j = c; j < i; ++j) s -= a[i * kLd + j] * t[j * kN + c];
      t[i * kN + c] = s;
    }
  return t;
}

// The phases as the kernel runs them; reverse = the threads (warps) of each phase in the other order.
std::vector<float> solve(std::vector<float> a, bool reverse) {
  std::vector<float> t(kN * kLd, 7.f);  // T starts over dead k rows: anything
  for (int n = 0; n < kThreadsPerBlock; ++n)
    gdn_solve::diag_phase(reverse ? kThreadsPerBlock - 1 - n : n, t.data(), a.data(), kLd);
  constexpr int kWarps = kThreadsPerBlock / 32;
  for (int p = 1; p < gdn_solve::kPhases; ++p)
    for (int n = 0; n < kWarps; ++n) {
      gdn_solve::BlockProduct bp;
      if (gdn_solve::level_product(p, reverse ? kWarps - 1 - n : n, t.data(), a.data(), kLd, bp))
        gdn_solve::block_product(bp, kLd);
    }
  for (int n = 0; n < kThreadsPerBlock; ++n)  // solve_unit_lower<true>'s last step
    gdn_solve::combine_t30(reverse ? kThreadsPerBlock - 1 - n : n, t.data(), a.data(), kLd);
  return t;
}

void check_solve(float scale, double tol, unsigned seed) {
  std::mt19937 rng(seed);
  const std::vector<float> a = random_a(rng, scale);
  const std::vector<double> ref = reference_inverse(a);
  const std::vector<float> fwd = solve(a, false), rev = solve(a, true);
  ASSERT_EQ(0, std::memcmp(fwd.data(), rev.data(), fwd.size() * sizeof(float)))
      << "thread order changed the result: a phase reads another thread's writes of the same phase";
  double max_ref = 0.0, max_err = 0.0;
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j) {
      const double r = ref[i * kN + j], g = fwd[i * kLd + j];
      if (j > i) {
        ASSERT_EQ(g, 0.0) << "T[" << i << "][" << j << "] above the diagonal";
      } else if (j == i) {
        ASSERT_EQ(g, 1.0) << "T[" << i << "][" << i << "]";
      }
      max_ref = std::max(max_ref, std::fabs(r));
      max_err = std::max(max_err, std::fabs(g - r));
    }
  EXPECT_LT(max_err, tol * max_ref) << "scale " << scale << ": max |T - T_ref| " << max_err << " of max |T| "
                                    << max_ref;
}

TEST(GdnSolve, MatchesForwardSubstitution) {
  // A's entries are b_i (k^_i . k^_j) e^{G_i - G_j}: |A_ij| < 1. Small entries keep T near I;
  // entries near 1 make T's entries grow with the distance below the diagonal.
  check_solve(0.05f, 1e-6, 1);
  check_solve(0.3f, 1e-5, 2);
  check_solve(1.0f, 1e-4, 3);
}

TEST(GdnSolve, UnitBlocksAlone) {
  // A zero below the diagonal blocks: T is the four diagonal inverses and zeros elsewhere.
  std::mt19937 rng(4);
  std::vector<float> a = random_a(rng, 0.5f);
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < (i / 16) * 16; ++j) a[i * kLd + j] = 0.f;
  const std::vector<double> ref = reference_inverse(a);
  const std::vector<float> t = solve(a, false);
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j) {
      if (i / 16 != j / 16) {
        ASSERT_EQ(t[i * kLd + j], 0.f) << "T[" << i << "][" << j << "]";
      }
      EXPECT_NEAR(t[i * kLd + j], ref[i * kN + j], 1e-5 * std::max(1.0, std::fabs(ref[i * kN + j])));
    }
}

}  // namespace
}  // namespace qt
