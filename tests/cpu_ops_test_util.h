// Tests of the CPU reference backend (src/ops/cpu).
//  * CpuOpsGrad:     every backward against float64 central finite differences of its forward
//                    (the double instantiation of reference_ops.h), per element.
//  * CpuOpsForward:  forward math against naive re-implementations written differently here, and
//                    the GDN intra-sample split (forward and backward) against the whole range.
//  * CpuOpsPacked:   a packed row gives exactly what each sample gives alone (conv, GDN, attention).
//  * CpuOpsFloat:    CpuBackend (float, through Tensors) against the double reference, including
//                    "=" vs "+=" output semantics and thread-count determinism.
//  * CpuOpsErrors:   bad inputs throw qt::Error naming the op and the tensor.
//
// Tolerances: finite differences use eps = 1e-6 in double; truncation error is ~eps^2 |f'''| ~ 1e-11
// and rounding ~1e-16 |L| / eps ~ 1e-9, so 1e-6 * max(1, |g|) leaves three orders of margin while
// any real bug (a wrong term) is O(|g|). Float vs double: fp32 rounding over sums of <= a few
// hundred terms stays far below 1e-4 of the output's max magnitude (normwise).
//
// The suites' tests live in test_cpu_ops_dense.cpp (dense ops), test_cpu_ops_mixers.cpp (GDN and
// attention) and test_cpu_ops_checks.cpp (CpuOpsErrors, SharedOpChecks); this header holds the
// helpers and fixtures they share.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/reference_ops.h"
#include "ops/op_check.h"
#include "test_util.h"

namespace qt::cpu_ops_test {

using Vec = std::vector<double>;
using Cu = std::vector<int32_t>;
constexpr double kGradTol = 1e-6;
constexpr double kFloatTol = 1e-4;

// ---- helpers -------------------------------------------------------------------------------------

// Uniform values rounded to float, so the float and double paths see identical inputs.
inline Vec random_vec(std::mt19937_64& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<double>(static_cast<float>(dist(rng)));
  return v;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline double max_abs(const Vec& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

// Runs fn with the given thread count, then restores the previous one.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Compares analytic[i] with (loss(x + eps e_i) - loss(x - eps e_i)) / 2eps for every element.
inline void expect_grad_fd(const char* name, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  constexpr double eps = 1e-6;
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double lp = loss();
    x[i] = saved - eps;
    const double lm = loss();
    x[i] = saved;
    const double fd = (lp - lm) / (2 * eps);
    const double err = std::abs(fd - analytic[i]) / std::max(1.0, std::abs(analytic[i]));
    worst = std::max(worst, err);
    if (err > kGradTol && failures++ < 5)
      ADD_FAILURE() << name << "[" << i << "]: analytic " << analytic[i] << ", finite difference " << fd;
  }
  EXPECT_LE(worst, kGradTol) << name << ": worst relative error over " << x.size() << " elements";
  // Guard against a vacuous check: the gradient must not be identically zero.
  EXPECT_GT(max_abs(analytic), 1e-3) << name << ": gradient is (near) zero everywhere";
}

// max |got - want| <= tol * max|want| (normwise relative error).
inline void expect_close(const char* name, const Vec& got, const Vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << name;
  const double scale = std::max(max_abs(want), 1e-30);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::isnan(got[i]) ? std::numeric_limits<double>::infinity() : std::abs(got[i] - want[i]);
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << name << "[" << worst_i << "]: got " << (got.empty() ? 0.0 : got[worst_i])
                                << ", want " << (want.empty() ? 0.0 : want[worst_i]) << " (max |want| " << scale
                                << ")";
}

inline std::vector<int64_t> segment_ids(const Cu& cu) {
  std::vector<int64_t> seg(static_cast<size_t>(cu.back()));
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) seg[static_cast<size_t>(t)] = static_cast<int64_t>(s);
  return seg;
}

inline int num_seqs(const Cu& cu) { return static_cast<int>(cu.size()) - 1; }

// Segments of 1, 2, 3 and 5 tokens in one row, plus a 6-token one.
inline const Cu kRaggedCu = {0, 1, 3, 6, 11, 17};

// SeqInfo over a host i32 cu_seqlens tensor.
struct Seqs {
  HostTensor cu;
  SeqInfo info;
  explicit Seqs(const Cu& offsets) : cu(DType::I32, {static_cast<int64_t>(offsets.size())}) {
    std::memcpy(cu.t.data, offsets.data(), offsets.size() * sizeof(int32_t));
    info.cu_seqlens = cu.t;
    info.num_seqs = num_seqs(offsets);
    info.total_tokens = offsets.back();
    for (size_t s = 0; s + 1 < offsets.size(); ++s)
      info.max_seqlen = std::max(info.max_seqlen, offsets[s + 1] - offsets[s]);
  }
};

inline Tensor upload(CpuBackend& be, const Vec& v, const Shape& shape) {
  Tensor t = be.alloc(DType::F32, shape);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  be.copy_from_host(t, f.data());
  return t;
}

inline Tensor upload_i32(CpuBackend& be, const std::vector<int32_t>& v) {
  Tensor t = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
  be.copy_from_host(t, v.data());
  return t;
}

inline Tensor filled(CpuBackend& be, const Shape& shape, float value) {
  Tensor t = be.alloc(DType::F32, shape);
  std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), value);
  return t;
}
// An "overwritten" output starts as NaN so a missed element shows.
inline Tensor garbage(CpuBackend& be, const Shape& shape) { return filled(be, shape, std::nanf("")); }
// "acc" outputs start here on the backend (the double reference starts at 0), so the backend must
// return kAccInit + the reference gradient.
constexpr float kAccInit = 0.25f;

inline Vec plus_acc(const Vec& v) {
  Vec r = v;
  for (auto& e : r) e += kAccInit;
  return r;
}

inline Vec download(CpuBackend& be, const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  be.copy_to_host(f.data(), t);
  return Vec(f.begin(), f.end());
}

// ---- CpuOpsGrad: backward vs finite differences --------------------------------------------------

class CpuOpsGrad : public ::testing::Test {
 protected:
  std::mt19937_64 rng{1234};
  ThreadCount threads{1};  // thousands of tiny forward calls: skip thread start-up
};

// ---- CpuOpsForward: against naive implementations ------------------------------------------------

class CpuOpsForward : public ::testing::Test {
 protected:
  std::mt19937_64 rng{99};
};

// ---- CpuOpsPacked: packed row == each sample alone ------------------------------------------------

class CpuOpsPacked : public ::testing::Test {
 protected:
  std::mt19937_64 rng{7};
  CpuBackend be;
  const Cu cu = {0, 1, 3, 6, 11, 90};  // 1, 2, 3, 5 and 79 tokens (beyond one GDN checkpoint chunk)
  const int64_t T = 90;
};

// Each sample alone: a Tensor view of rows [begin, begin + len) of a token-major buffer.
inline Tensor rows_of(const Tensor& t, int64_t begin, int64_t len) {
  Shape s = t.shape_vec();
  const int64_t row = t.numel() / s[0];
  s[0] = len;
  return Tensor(t.ptr<float>() + begin * row, t.dtype, s);
}

// ---- CpuOpsFloat: CpuBackend (float) vs the double reference -------------------------------------

class CpuOpsFloat : public ::testing::Test {
 protected:
  std::mt19937_64 rng{2024};
  CpuBackend be;
};

}  // namespace qt::cpu_ops_test
