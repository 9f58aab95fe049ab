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

namespace qt {
namespace {

using Vec = std::vector<double>;
using Cu = std::vector<int32_t>;
constexpr double kGradTol = 1e-6;
constexpr double kFloatTol = 1e-4;

// ---- helpers -------------------------------------------------------------------------------------

// Uniform values rounded to float, so the float and double paths see identical inputs.
Vec random_vec(std::mt19937_64& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<double>(static_cast<float>(dist(rng)));
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_abs(const Vec& v) {
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
void expect_grad_fd(const char* name, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
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
void expect_close(const char* name, const Vec& got, const Vec& want, double tol) {
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

std::vector<int64_t> segment_ids(const Cu& cu) {
  std::vector<int64_t> seg(static_cast<size_t>(cu.back()));
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) seg[static_cast<size_t>(t)] = static_cast<int64_t>(s);
  return seg;
}

int num_seqs(const Cu& cu) { return static_cast<int>(cu.size()) - 1; }

// Segments of 1, 2, 3 and 5 tokens in one row, plus a 6-token one.
const Cu kRaggedCu = {0, 1, 3, 6, 11, 17};

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

Tensor upload(CpuBackend& be, const Vec& v, const Shape& shape) {
  Tensor t = be.alloc(DType::F32, shape);
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  be.copy_from_host(t, f.data());
  return t;
}

Tensor upload_i32(CpuBackend& be, const std::vector<int32_t>& v) {
  Tensor t = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
  be.copy_from_host(t, v.data());
  return t;
}

Tensor filled(CpuBackend& be, const Shape& shape, float value) {
  Tensor t = be.alloc(DType::F32, shape);
  std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), value);
  return t;
}
// An "overwritten" output starts as NaN so a missed element shows.
Tensor garbage(CpuBackend& be, const Shape& shape) { return filled(be, shape, std::nanf("")); }
// "acc" outputs start here on the backend (the double reference starts at 0), so the backend must
// return kAccInit + the reference gradient.
constexpr float kAccInit = 0.25f;

Vec plus_acc(const Vec& v) {
  Vec r = v;
  for (auto& e : r) e += kAccInit;
  return r;
}

Vec download(CpuBackend& be, const Tensor& t) {
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

TEST_F(CpuOpsGrad, Linear) {
  const int64_t T = 5, N = 3, K = 4;
  Vec x = random_vec(rng, T * K), w = random_vec(rng, N * K), R = random_vec(rng, T * N);
  Vec y(static_cast<size_t>(T * N));
  auto loss = [&] {
    ref::linear_forward(y.data(), x.data(), w.data(), T, N, K);
    return dot(y, R);
  };
  Vec dx(x.size()), dw(w.size(), 0.0);
  ref::linear_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), T, N, K, false, false);
  expect_grad_fd("linear dx", x, dx, loss);
  expect_grad_fd("linear dw", w, dw, loss);
}

TEST_F(CpuOpsGrad, Embedding) {
  const int64_t V = 5, H = 3;
  const std::vector<int32_t> ids = {2, 0, 2, 4, 2};
  const int64_t T = static_cast<int64_t>(ids.size());
  Vec table = random_vec(rng, V * H), R = random_vec(rng, T * H), out(static_cast<size_t>(T * H));
  auto loss = [&] {
    ref::embedding_forward(out.data(), table.data(), ids.data(), T, H);
    return dot(out, R);
  };
  Vec dtable(table.size(), 0.0);
  ref::embedding_backward(dtable.data(), R.data(), ids.data(), T, H);
  expect_grad_fd("embedding dtable", table, dtable, loss);
}

TEST_F(CpuOpsGrad, RmsNorm) {
  const int64_t rows = 4, cols = 7;
  Vec x = random_vec(rng, rows * cols), w = random_vec(rng, cols, -0.5, 0.5), R = random_vec(rng, rows * cols);
  Vec y(x.size()), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-6);
    return dot(y, R);
  };
  loss();
  Vec dx(x.size()), dw(w.size(), 0.0);
  ref::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), rows, cols, false);
  expect_grad_fd("rmsnorm dx", x, dx, loss);
  expect_grad_fd("rmsnorm dw", w, dw, loss);
}

TEST_F(CpuOpsGrad, SwiGlu) {
  const int64_t n = 13;
  Vec gate = random_vec(rng, n, -4, 4), up = random_vec(rng, n), R = random_vec(rng, n), h(static_cast<size_t>(n));
  auto loss = [&] {
    ref::swiglu_forward(h.data(), gate.data(), up.data(), n);
    return dot(h, R);
  };
  Vec dgate(gate.size()), dup(up.size());
  ref::swiglu_backward(dgate.data(), dup.data(), R.data(), gate.data(), up.data(), n);
  expect_grad_fd("swiglu dgate", gate, dgate, loss);
  expect_grad_fd("swiglu dup", up, dup, loss);
}

TEST_F(CpuOpsGrad, Conv1dSiluVarlen) {
  const Cu& cu = kRaggedCu;
  const int64_t T = cu.back(), C = 3, K = 4;
  Vec x = random_vec(rng, T * C, -2, 2), w = random_vec(rng, C * K), R = random_vec(rng, T * C);
  Vec y(x.size());
  auto loss = [&] {
    ref::conv1d_silu_forward(y.data(), x.data(), w.data(), T, C, K, cu.data(), num_seqs(cu));
    return dot(y, R);
  };
  Vec dx(x.size()), dw(w.size(), 0.0);
  ref::conv1d_silu_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), T, C, K, cu.data(), num_seqs(cu));
  expect_grad_fd("conv1d dx", x, dx, loss);
  expect_grad_fd("conv1d dw", w, dw, loss);
}

TEST_F(CpuOpsGrad, GdnGates) {
  const int64_t T = 5, H = 3;
  Vec b = random_vec(rng, T * H, -3, 3), a = random_vec(rng, T * H, -4, 4);
  Vec a_log = random_vec(rng, H, -1, 1), dt_bias = random_vec(rng, H, -1, 1);
  a[4] = 25.0f;  // a + dt_bias > 20: softplus is the identity there (torch threshold)
  Vec Rb = random_vec(rng, T * H), Rg = random_vec(rng, T * H);
  Vec beta(b.size()), g(b.size());
  auto loss = [&] {
    ref::gdn_gates_forward(beta.data(), g.data(), b.data(), a.data(), a_log.data(), dt_bias.data(), T, H);
    return dot(beta, Rb) + dot(g, Rg);
  };
  Vec db(b.size()), da(a.size()), da_log(a_log.size(), 0.0), ddt(dt_bias.size(), 0.0);
  ref::gdn_gates_backward(db.data(), da.data(), da_log.data(), ddt.data(), Rb.data(), Rg.data(), b.data(), a.data(),
                          a_log.data(), dt_bias.data(), T, H);
  expect_grad_fd("gates db", b, db, loss);
  expect_grad_fd("gates da", a, da, loss);
  expect_grad_fd("gates dA_log", a_log, da_log, loss);
  expect_grad_fd("gates ddt_bias", dt_bias, ddt, loss);
}

void check_gdn_grad(std::mt19937_64& rng, const GdnDims& dims, const Cu& cu) {
  const int64_t T = cu.back(), Hv = dims.num_v_heads, CD = dims.conv_dim();
  Vec qkv = random_vec(rng, T * CD), g = random_vec(rng, T * Hv, -0.3, -0.01), beta = random_vec(rng, T * Hv, 0.1, 0.9);
  Vec R = random_vec(rng, T * Hv * dims.v_head_dim), o(R.size());
  auto loss = [&] {
    ref::gdn_forward(o.data(), qkv.data(), g.data(), beta.data(), dims, T, cu.data(), num_seqs(cu));
    return dot(o, R);
  };
  Vec dqkv(qkv.size()), dg(g.size()), dbeta(beta.size());
  ref::gdn_backward(dqkv.data(), dg.data(), dbeta.data(), R.data(), qkv.data(), g.data(), beta.data(), dims, T,
                    cu.data(), num_seqs(cu));
  expect_grad_fd("gdn dqkv", qkv, dqkv, loss);
  expect_grad_fd("gdn dg", g, dg, loss);
  expect_grad_fd("gdn dbeta", beta, dbeta, loss);
}

TEST_F(CpuOpsGrad, GatedDeltaRuleGroupedVarlen) {
  // dk != dv, Hv = 2 Hk, segments of 1, 2, 3, 5 and 6 tokens.
  check_gdn_grad(rng, GdnDims{2, 4, 3, 5}, kRaggedCu);
}

TEST_F(CpuOpsGrad, GatedDeltaRuleAcrossStateCheckpoints) {
  // Samples longer than the 64-token checkpoint interval of the backward (70 = 64 + 6, 81).
  check_gdn_grad(rng, GdnDims{1, 2, 3, 2}, Cu{0, 70, 71, 152});
}

TEST_F(CpuOpsGrad, GatedRmsNorm) {
  const int64_t rows = 6, cols = 5;
  Vec x = random_vec(rng, rows * cols), z = random_vec(rng, rows * cols, -3, 3), w = random_vec(rng, cols, 0.5, 1.5);
  Vec R = random_vec(rng, rows * cols), y(x.size()), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    ref::gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, cols, 1e-6);
    return dot(y, R);
  };
  loss();
  Vec dx(x.size()), dz(z.size()), dw(w.size(), 0.0);
  ref::gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), R.data(), x.data(), z.data(), w.data(), rstd.data(),
                              rows, cols);
  expect_grad_fd("gated_rmsnorm dx", x, dx, loss);
  expect_grad_fd("gated_rmsnorm dz", z, dz, loss);
  expect_grad_fd("gated_rmsnorm dw", w, dw, loss);
}

TEST_F(CpuOpsGrad, AttnPrep) {
  const std::vector<int32_t> positions = {0, 1, 2, 7, 3, 0};
  const int64_t T = static_cast<int64_t>(positions.size());
  for (int64_t rot : {4, 6, 0}) {
    SCOPED_TRACE(::testing::Message() << "rotary_dim " << rot);
    const AttnDims dims{4, 2, 6, rot, 10000.0};
    const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
    Vec qg = random_vec(rng, T * Hq * 2 * D), kr = random_vec(rng, T * Hkv * D);
    Vec qw = random_vec(rng, D, -0.5, 0.5), kw = random_vec(rng, D, -0.5, 0.5);
    Vec Rq = random_vec(rng, T * Hq * D), Rk = random_vec(rng, T * Hkv * D), Rg = random_vec(rng, T * Hq * D);
    Vec q(Rq.size()), k(Rk.size()), gate(Rg.size()), q_rstd(static_cast<size_t>(T * Hq)),
        k_rstd(static_cast<size_t>(T * Hkv));
    auto loss = [&] {
      ref::attn_prep_forward(q.data(), k.data(), gate.data(), q_rstd.data(), k_rstd.data(), qg.data(), kr.data(),
                             qw.data(), kw.data(), positions.data(), dims, T, 1e-6);
      return dot(q, Rq) + dot(k, Rk) + dot(gate, Rg);
    };
    loss();
    Vec dqg(qg.size()), dkr(kr.size()), dqw(qw.size(), 0.0), dkw(kw.size(), 0.0);
    ref::attn_prep_backward(dqg.data(), dkr.data(), dqw.data(), dkw.data(), Rq.data(), Rk.data(), Rg.data(),
                            qg.data(), kr.data(), qw.data(), kw.data(), q_rstd.data(), k_rstd.data(),
                            positions.data(), dims, T);
    expect_grad_fd("attn_prep dqg", qg, dqg, loss);
    expect_grad_fd("attn_prep dkr", kr, dkr, loss);
    expect_grad_fd("attn_prep dq_norm_w", qw, dqw, loss);
    expect_grad_fd("attn_prep dk_norm_w", kw, dkw, loss);
  }
}

TEST_F(CpuOpsGrad, AttentionGqaVarlen) {
  const Cu& cu = kRaggedCu;
  const AttnDims dims{4, 2, 3, 2, 10000.0};
  const int64_t T = cu.back(), Hq = 4, Hkv = 2, D = 3;
  Vec q = random_vec(rng, T * Hq * D, -2, 2), k = random_vec(rng, T * Hkv * D, -2, 2), v = random_vec(rng, T * Hkv * D);
  Vec R = random_vec(rng, T * Hq * D), o(R.size()), lse(static_cast<size_t>(Hq * T));
  auto loss = [&] {
    ref::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), dims, T, cu.data(), num_seqs(cu));
    return dot(o, R);
  };
  loss();
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  ref::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), q.data(), k.data(), v.data(), o.data(),
                          lse.data(), dims, T, cu.data(), num_seqs(cu));
  expect_grad_fd("attention dq", q, dq, loss);
  expect_grad_fd("attention dk", k, dk, loss);
  expect_grad_fd("attention dv", v, dv, loss);
}

TEST_F(CpuOpsGrad, AttnGate) {
  const int64_t n = 11;
  Vec o = random_vec(rng, n), gate = random_vec(rng, n, -4, 4), R = random_vec(rng, n), y(static_cast<size_t>(n));
  auto loss = [&] {
    ref::attn_gate_forward(y.data(), o.data(), gate.data(), n);
    return dot(y, R);
  };
  Vec d_o(o.size()), dgate(gate.size());
  ref::attn_gate_backward(d_o.data(), dgate.data(), R.data(), o.data(), gate.data(), n);
  expect_grad_fd("attn_gate d_o", o, d_o, loss);
  expect_grad_fd("attn_gate dgate", gate, dgate, loss);
}

TEST_F(CpuOpsGrad, LinearCrossEntropyChunked) {
  const int64_t H = 4, V = 9;
  const std::vector<int32_t> targets = {3, -100, 0, 8, -100, 5, 2};
  const int64_t T = static_cast<int64_t>(targets.size());
  const double grad_scale = 0.37;
  Vec hidden = random_vec(rng, T * H, -2, 2), w = random_vec(rng, V * H, -2, 2);
  for (int64_t chunk : {3, 0}) {  // 3 rows per chunk (3 + 3 + 1), and the default (one chunk)
    auto loss = [&] {
      return grad_scale * ref::linear_cross_entropy<double>(nullptr, nullptr, nullptr, hidden.data(), w.data(),
                                                            targets.data(), T, V, H, grad_scale, chunk);
    };
    Vec dh(hidden.size()), dw(w.size(), 0.0);
    ref::linear_cross_entropy(dh.data(), dw.data(), static_cast<double*>(nullptr), hidden.data(), w.data(),
                              targets.data(), T, V, H, grad_scale, chunk);
    expect_grad_fd("cross_entropy dhidden", hidden, dh, loss);
    expect_grad_fd("cross_entropy dw", w, dw, loss);
    for (int64_t t = 0; t < T; ++t) {
      if (targets[static_cast<size_t>(t)] != -100) continue;
      for (int64_t c = 0; c < H; ++c) EXPECT_EQ(dh[static_cast<size_t>(t * H + c)], 0.0) << "ignored token " << t;
    }
  }
}

// ---- CpuOpsForward: against naive implementations ------------------------------------------------

class CpuOpsForward : public ::testing::Test {
 protected:
  std::mt19937_64 rng{99};
};

// The gated delta rule written as matrices: S_t = e^g (I - beta k k^T) S_{t-1} + beta k v^T,
// o_t = S_t^T q, with q, k normalized here.
Vec naive_gdn(const Vec& qkv, const Vec& g, const Vec& beta, const GdnDims& d, const Cu& cu) {
  const int64_t T = cu.back(), Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, CD = d.conv_dim();
  Vec o(static_cast<size_t>(T * Hv * dv), 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t j = 0; j < Hv; ++j) {
      const int64_t kh = j * d.num_k_heads / Hv;
      Vec S(static_cast<size_t>(dk * dv), 0.0);
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        Vec q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), v(static_cast<size_t>(dv));
        double nq = 0, nk = 0;
        for (int64_t r = 0; r < dk; ++r) {
          q[r] = qkv[t * CD + kh * dk + r];
          k[r] = qkv[t * CD + d.key_dim() + kh * dk + r];
          nq += q[r] * q[r];
          nk += k[r] * k[r];
        }
        for (int64_t r = 0; r < dk; ++r) {
          q[r] /= std::sqrt(nq + 1e-6) * std::sqrt(static_cast<double>(dk));
          k[r] /= std::sqrt(nk + 1e-6);
        }
        for (int64_t c = 0; c < dv; ++c) v[c] = qkv[t * CD + 2 * d.key_dim() + j * dv + c];
        const double e = std::exp(g[t * Hv + j]), b = beta[t * Hv + j];
        Vec A(static_cast<size_t>(dk * dk));
        for (int64_t r = 0; r < dk; ++r)
          for (int64_t c = 0; c < dk; ++c) A[r * dk + c] = e * ((r == c ? 1.0 : 0.0) - b * k[r] * k[c]);
        Vec Snew(S.size(), 0.0);
        for (int64_t r = 0; r < dk; ++r)
          for (int64_t c = 0; c < dv; ++c) {
            double acc = b * k[r] * v[c];
            for (int64_t m = 0; m < dk; ++m) acc += A[r * dk + m] * S[m * dv + c];
            Snew[r * dv + c] = acc;
          }
        S = Snew;
        for (int64_t c = 0; c < dv; ++c)
          for (int64_t r = 0; r < dk; ++r) o[(t * Hv + j) * dv + c] += S[r * dv + c] * q[r];
      }
    }
  }
  return o;
}

TEST_F(CpuOpsForward, GatedDeltaRuleMatchesMatrixRecurrence) {
  const GdnDims dims{2, 4, 3, 5};
  const Cu cu = {0, 1, 3, 6, 11, 80};
  const int64_t T = cu.back(), Hv = 4;
  Vec qkv = random_vec(rng, T * dims.conv_dim()), g = random_vec(rng, T * Hv, -1.0, 0.0),
      beta = random_vec(rng, T * Hv, 0.0, 1.0);
  Vec o(static_cast<size_t>(T * Hv * dims.v_head_dim));
  ref::gdn_forward(o.data(), qkv.data(), g.data(), beta.data(), dims, T, cu.data(), num_seqs(cu));
  expect_close("gdn o", o, naive_gdn(qkv, g, beta, dims, cu), 1e-12);
}

// The split tests' row: a first sample of 37 tokens, then the sample they cut (tokens 37 .. 236),
// dk = 5 != dv = 3, and their small products. Gates near 0 and small betas keep the state (and a
// segment's M) of order 1 across the sample: with g in [-1, 0] M was ~1e-14 and symmetric to 1e-17,
// so a transposed M in the backward's combine passed unnoticed.
struct SplitRow {
  static constexpr int64_t kBegin = 37, kEnd = 237, Hv = 4, dk = 5, dv = 3;
  const GdnDims dims{2, Hv, dk, dv};
  const Cu cu = {0, kBegin, kEnd};
  const int64_t T = kEnd, CD = dims.conv_dim();
  Vec qkv, g, beta;
  explicit SplitRow(std::mt19937_64& rng)
      : qkv(random_vec(rng, T * CD)), g(random_vec(rng, T * Hv, -0.01, 0.0)), beta(random_vec(rng, T * Hv, 0.0, 0.2)) {}
  // Value head j's map over tokens [t0, t1): S_end = M S_0 + E.
  void map(Vec& M, Vec& E, int64_t j, int64_t t0, int64_t t1) const {
    M.assign(static_cast<size_t>(dk * dk), 0.0);
    E.assign(static_cast<size_t>(dk * dv), 0.0);
    ref::gdn_segment_map(M.data(), E.data(), qkv.data(), g.data(), beta.data(), dims, j, t0, t1);
  }
};
// A X + B for A [n, n] (transposed: A^T X + B), X and B [n, m], row-major.
Vec affine(const Vec& A, const Vec& X, const Vec& B, int64_t n, int64_t m, bool transpose_a = false) {
  Vec y = B;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t c = 0; c < m; ++c) y[r * m + c] += (transpose_a ? A[k * n + r] : A[r * n + k]) * X[k * m + c];
  return y;
}

// The intra-sample split (gdn_segment_map): a sample cut into segments (at chunk multiples and at
// odd places, one of a single token), run as maps, the serial combine S_{s+1} = M_s S_s + E_s and each
// segment's forward from its S_s, gives gdn_forward's outputs; the maps compose (dk != dv, so M's
// dk x dk shape is exercised).
TEST_F(CpuOpsForward, GatedDeltaRuleSegmentSplit) {
  const SplitRow row(rng);
  const int64_t Hv = SplitRow::Hv, dk = SplitRow::dk, dv = SplitRow::dv, b = SplitRow::kBegin, e = SplitRow::kEnd;
  Vec o(static_cast<size_t>(row.T * Hv * dv));
  ref::gdn_forward(o.data(), row.qkv.data(), row.g.data(), row.beta.data(), row.dims, row.T, row.cu.data(),
                   num_seqs(row.cu));
  const std::vector<Cu> cuts = {{b, 101, 165, e}, {b, 38, 150, 151, e}, {b, e}};
  for (const Cu& seg : cuts) {
    Vec split(o.size(), 0.0), M, E;
    for (int64_t j = 0; j < Hv; ++j) {
      Vec S(static_cast<size_t>(dk * dv), 0.0);  // the state entering segment s
      for (size_t s = 0; s + 1 < seg.size(); ++s) {
        Vec fwd = S;
        row.map(M, E, j, seg[s], seg[s + 1]);
        ref::gdn_forward_segment(split.data(), fwd.data(), row.qkv.data(), row.g.data(), row.beta.data(), row.dims, j,
                                 seg[s], seg[s + 1]);
        S = affine(M, S, E, dk, dv);
        expect_close("segment's leaving state: M S + E against its forward", S, fwd, 1e-12);
      }
    }
    Vec want(o.size(), 0.0);  // rows of the split sample only
    for (int64_t t = b; t < e; ++t)
      for (int64_t x = 0; x < Hv * dv; ++x) want[t * Hv * dv + x] = o[t * Hv * dv + x];
    expect_close("gdn o by segments", split, want, 1e-12);
  }
  // Composition: the map of [37, 237) is the map of [101, 237) after that of [37, 101).
  Vec M0, E0, M1, E1, M, E;
  row.map(M0, E0, 1, b, 101);
  row.map(M1, E1, 1, 101, e);
  row.map(M, E, 1, b, e);
  expect_close("M composed", affine(M1, M0, Vec(M.size(), 0.0), dk, dk), M, 1e-12);
  expect_close("E composed", affine(M1, E0, E1, dk, dv), E, 1e-12);
}

// The split backward: segments run last first, each from its entering state S_s and the gradient
// dL/dS leaving it, give the gradients of the whole range, and the gradient entering a segment is
// M_s^T (the gradient leaving it) + F_s, with F_s the segment's backward from a zero leaving gradient.
TEST_F(CpuOpsForward, GatedDeltaRuleSegmentSplitBackward) {
  const SplitRow row(rng);
  const int64_t T = row.T, Hv = SplitRow::Hv, dk = SplitRow::dk, dv = SplitRow::dv, CD = row.CD;
  const int64_t b = SplitRow::kBegin, e = SplitRow::kEnd;
  const Vec d_o = random_vec(rng, T * Hv * dv);
  auto grads = [&] {  // dq^, dk^, dqkv (v columns), dg, dbeta
    const auto n = [](int64_t x) { return Vec(static_cast<size_t>(x)); };
    return std::vector<Vec>{n(T * Hv * dk), n(T * Hv * dk), n(T * CD), n(T * Hv), n(T * Hv)};
  };
  auto backward = [&](std::vector<Vec>& x, Vec& dstate, const Vec* state, int64_t j, int64_t t0, int64_t t1) {
    ref::gdn_backward_segment(x[0].data(), x[1].data(), x[2].data(), x[3].data(), x[4].data(), dstate.data(),
                              state ? state->data() : nullptr, d_o.data(), row.qkv.data(), row.g.data(),
                              row.beta.data(), row.dims, j, t0, t1);
  };
  const char* names[] = {"dq^", "dk^", "dv", "dg", "dbeta"};
  const std::vector<Cu> cuts = {{b, 101, 165, e}, {b, 38, 150, 151, e}};
  for (const Cu& seg : cuts) {
    std::vector<Vec> whole = grads(), split = grads(), scratch = grads();
    for (int64_t j = 0; j < Hv; ++j) {
      Vec none(static_cast<size_t>(dk * dv), 0.0);
      backward(whole, none, nullptr, j, b, e);
      std::vector<Vec> entering(seg.size() - 1, Vec(static_cast<size_t>(dk * dv), 0.0));  // S_s
      for (size_t s = 0; s + 2 < seg.size(); ++s) {
        entering[s + 1] = entering[s];
        ref::gdn_forward_segment(scratch[2].data(), entering[s + 1].data(), row.qkv.data(), row.g.data(),
                                 row.beta.data(), row.dims, j, seg[s], seg[s + 1]);
      }
      Vec G(static_cast<size_t>(dk * dv), 0.0), M, E;  // G: dL/dS leaving segment s
      for (size_t s = seg.size() - 1; s-- > 0;) {
        Vec F(G.size(), 0.0);
        row.map(M, E, j, seg[s], seg[s + 1]);
        backward(scratch, F, &entering[s], j, seg[s], seg[s + 1]);
        const Vec want = affine(M, G, F, dk, dv, true);
        backward(split, G, &entering[s], j, seg[s], seg[s + 1]);
        expect_close("dL/dS entering a segment: M^T dS_end + F", G, want, 1e-12);
      }
    }
    for (size_t x = 0; x < 5; ++x) expect_close(names[x], split[x], whole[x], 1e-12);
  }
}

TEST_F(CpuOpsForward, AttentionMatchesMaskedSoftmax) {
  const Cu& cu = kRaggedCu;
  const AttnDims dims{4, 2, 5, 4, 10000.0};
  const int64_t T = cu.back(), Hq = 4, Hkv = 2, D = 5;
  Vec q = random_vec(rng, T * Hq * D, -2, 2), k = random_vec(rng, T * Hkv * D, -2, 2), v = random_vec(rng, T * Hkv * D);
  Vec o(q.size()), lse(static_cast<size_t>(Hq * T));
  ref::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), dims, T, cu.data(), num_seqs(cu));

  const std::vector<int64_t> seg = segment_ids(cu);
  Vec want_o(o.size(), 0.0), want_lse(lse.size());
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kvh = h / (Hq / Hkv);
    for (int64_t i = 0; i < T; ++i) {
      Vec s(static_cast<size_t>(T));  // full row, masked with -inf
      for (int64_t j = 0; j < T; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += q[(i * Hq + h) * D + d] * k[(j * Hkv + kvh) * D + d];
        s[j] = (j <= i && seg[j] == seg[i]) ? acc / std::sqrt(double(D)) : -INFINITY;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double e : s) sum += std::exp(e - mx);
      want_lse[h * T + i] = mx + std::log(sum);
      for (int64_t j = 0; j < T; ++j)
        for (int64_t d = 0; d < D; ++d)
          want_o[(i * Hq + h) * D + d] += std::exp(s[j] - mx) / sum * v[(j * Hkv + kvh) * D + d];
    }
  }
  expect_close("attention o", o, want_o, 1e-12);
  expect_close("attention lse", lse, want_lse, 1e-12);
}

TEST_F(CpuOpsForward, AttnPrepMatchesHfRotateHalf) {
  // HF form: y = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1).
  const AttnDims dims{2, 1, 8, 4, 1e7};
  const std::vector<int32_t> positions = {0, 5, 4000};
  const int64_t T = 3, Hq = 2, Hkv = 1, D = 8, rot = 4, half = 2;
  Vec qg = random_vec(rng, T * Hq * 2 * D), kr = random_vec(rng, T * Hkv * D), qw = random_vec(rng, D, -0.5, 0.5),
      kw = random_vec(rng, D, -0.5, 0.5);
  Vec q(static_cast<size_t>(T * Hq * D)), k(static_cast<size_t>(T * Hkv * D)), gate(q.size()),
      q_rstd(static_cast<size_t>(T * Hq)), k_rstd(static_cast<size_t>(T * Hkv));
  ref::attn_prep_forward(q.data(), k.data(), gate.data(), q_rstd.data(), k_rstd.data(), qg.data(), kr.data(),
                         qw.data(), kw.data(), positions.data(), dims, T, 1e-6);
  auto expect_head = [&](const double* x, const Vec& w, int32_t pos, const double* got, const char* what) {
    double ms = 0;
    for (int64_t d = 0; d < D; ++d) ms += x[d] * x[d] / double(D);
    Vec n(static_cast<size_t>(D)), cosv(static_cast<size_t>(rot)), sinv(static_cast<size_t>(rot));
    for (int64_t d = 0; d < D; ++d) n[d] = x[d] / std::sqrt(ms + 1e-6) * (1 + w[d]);
    for (int64_t i = 0; i < rot; ++i) {
      const double freq = 1.0 / std::pow(dims.rope_theta, double(2 * (i % half)) / double(rot));
      cosv[i] = std::cos(pos * freq);
      sinv[i] = std::sin(pos * freq);
    }
    for (int64_t d = 0; d < D; ++d) {
      double want = n[d];
      if (d < rot) {
        const double rh = d < half ? -n[d + half] : n[d - half];
        want = n[d] * cosv[d] + rh * sinv[d];
      }
      EXPECT_NEAR(got[d], want, 1e-12) << what << " pos " << pos << " dim " << d;
    }
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hq; ++h) {
      expect_head(&qg[(t * Hq + h) * 2 * D], qw, positions[t], &q[(t * Hq + h) * D], "q");
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(gate[(t * Hq + h) * D + d], qg[(t * Hq + h) * 2 * D + D + d]);
    }
    expect_head(&kr[t * D], kw, positions[t], &k[t * D], "k");
  }
}

TEST_F(CpuOpsForward, Conv1dMatchesZeroPaddedSamples) {
  const Cu& cu = kRaggedCu;
  const int64_t T = cu.back(), C = 4, K = 4;
  Vec x = random_vec(rng, T * C), w = random_vec(rng, C * K), y(x.size());
  ref::conv1d_silu_forward(y.data(), x.data(), w.data(), T, C, K, cu.data(), num_seqs(cu));
  Vec want(x.size());
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    Vec padded(static_cast<size_t>((len + K - 1) * C), 0.0);  // K-1 zero rows, then the sample
    for (int64_t t = 0; t < len; ++t)
      for (int64_t c = 0; c < C; ++c) padded[(t + K - 1) * C + c] = x[(cu[s] + t) * C + c];
    for (int64_t t = 0; t < len; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * padded[(t + j) * C + c];
        want[(cu[s] + t) * C + c] = acc / (1 + std::exp(-acc));
      }
  }
  expect_close("conv1d y", y, want, 1e-14);
}

TEST_F(CpuOpsForward, NormsAndGates) {
  const int64_t rows = 3, cols = 6;
  Vec x = random_vec(rng, rows * cols), z = random_vec(rng, rows * cols, -3, 3), w = random_vec(rng, cols);
  Vec y(x.size()), rstd(static_cast<size_t>(rows)), gy(x.size()), grstd(rstd.size());
  ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-6);
  ref::gated_rmsnorm_forward(gy.data(), grstd.data(), x.data(), z.data(), w.data(), rows, cols, 1e-6);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += x[r * cols + c] * x[r * cols + c];
    const double rs = 1.0 / std::sqrt(ss / cols + 1e-6);
    EXPECT_NEAR(rstd[r], rs, 1e-14);
    EXPECT_NEAR(grstd[r], rs, 1e-14);
    for (int64_t c = 0; c < cols; ++c) {
      const double xv = x[r * cols + c], zv = z[r * cols + c];
      EXPECT_NEAR(y[r * cols + c], xv * rs * (1 + w[c]), 1e-14);
      EXPECT_NEAR(gy[r * cols + c], w[c] * xv * rs * zv / (1 + std::exp(-zv)), 1e-14);
    }
  }
  // Gates, including the softplus threshold and a very negative argument.
  const Vec b = {-3.0, 0.0, 2.5}, a = {-40.0, 0.3, 30.0}, a_log = {0.5}, dt = {0.25};
  Vec beta(3), g(3);
  ref::gdn_gates_forward(beta.data(), g.data(), b.data(), a.data(), a_log.data(), dt.data(), 3, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(beta[i], 1.0 / (1.0 + std::exp(-b[i])), 1e-15);
    const double u = a[i] + dt[0];
    const double sp = u > 20 ? u : std::log(1.0 + std::exp(u));
    EXPECT_NEAR(g[i], -std::exp(a_log[0]) * sp, 1e-14 * std::max(1.0, std::abs(g[i])));
    EXPECT_LE(g[i], 0.0);
  }
  EXPECT_GT(-g[0], 0.0);  // softplus(-39.75) ~ 5.5e-18 must not underflow to 0 through log(1 + exp)
}

TEST_F(CpuOpsForward, CrossEntropyMatchesNaiveLogSoftmax) {
  const int64_t H = 5, V = 11;
  const std::vector<int32_t> targets = {10, 0, -100, 4, 7};
  const int64_t T = 5;
  Vec hidden = random_vec(rng, T * H, -3, 3), w = random_vec(rng, V * H, -3, 3), token_loss(static_cast<size_t>(T));
  const double loss = ref::linear_cross_entropy(static_cast<double*>(nullptr), static_cast<double*>(nullptr),
                                                token_loss.data(), hidden.data(), w.data(), targets.data(), T, V, H,
                                                1.0, 2);
  double want = 0;
  for (int64_t t = 0; t < T; ++t) {
    Vec logits(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < H; ++c) logits[v] += hidden[t * H + c] * w[v * H + c];
    double sum = 0;
    for (double l : logits) sum += std::exp(l);
    const int32_t tg = targets[static_cast<size_t>(t)];
    const double lt = tg == -100 ? 0.0 : -(logits[tg] - std::log(sum));
    EXPECT_NEAR(token_loss[t], lt, 1e-12) << "token " << t;
    want += lt;
  }
  EXPECT_NEAR(loss, want, 1e-12);
}

// ---- CpuOpsPacked: packed row == each sample alone ------------------------------------------------

class CpuOpsPacked : public ::testing::Test {
 protected:
  std::mt19937_64 rng{7};
  CpuBackend be;
  const Cu cu = {0, 1, 3, 6, 11, 90};  // 1, 2, 3, 5 and 79 tokens (beyond one GDN checkpoint chunk)
  const int64_t T = 90;
};

// Each sample alone: a Tensor view of rows [begin, begin + len) of a token-major buffer.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t len) {
  Shape s = t.shape_vec();
  const int64_t row = t.numel() / s[0];
  s[0] = len;
  return Tensor(t.ptr<float>() + begin * row, t.dtype, s);
}

TEST_F(CpuOpsPacked, Conv1dSilu) {
  const int64_t C = 5, K = 4;
  Seqs packed(cu);
  Tensor x = upload(be, random_vec(rng, T * C), {T, C}), w = upload(be, random_vec(rng, C * K), {C, K});
  Tensor dy = upload(be, random_vec(rng, T * C), {T, C});
  Tensor y = garbage(be, {T, C}), dx = garbage(be, {T, C}), dw = filled(be, {C, K}, 0.0f);
  be.conv1d_silu_forward(y, x, w, packed.info);
  be.conv1d_silu_backward(dx, dw, dy, x, w, packed.info);
  Vec dw_sum(static_cast<size_t>(C * K), 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], len = cu[s + 1] - cu[s];
    Seqs alone({0, static_cast<int32_t>(len)});
    Tensor y1 = garbage(be, {len, C}), dx1 = garbage(be, {len, C}), dw1 = filled(be, {C, K}, 0.0f);
    be.conv1d_silu_forward(y1, rows_of(x, b, len), w, alone.info);
    be.conv1d_silu_backward(dx1, dw1, rows_of(dy, b, len), rows_of(x, b, len), w, alone.info);
    expect_close("conv y", download(be, rows_of(y, b, len)), download(be, y1), 0.0);
    expect_close("conv dx", download(be, rows_of(dx, b, len)), download(be, dx1), 0.0);
    const Vec d = download(be, dw1);
    for (size_t i = 0; i < d.size(); ++i) dw_sum[i] += d[i];
  }
  expect_close("conv dw", download(be, dw), dw_sum, 1e-6);
}

TEST_F(CpuOpsPacked, GatedDeltaRule) {
  const GdnDims dims{2, 4, 4, 3};
  const int64_t CD = dims.conv_dim(), Hv = 4, dv = 3;
  Seqs packed(cu);
  Tensor qkv = upload(be, random_vec(rng, T * CD), {T, CD});
  Tensor g = upload(be, random_vec(rng, T * Hv, -0.5, 0.0), {T, Hv});
  Tensor beta = upload(be, random_vec(rng, T * Hv, 0.0, 1.0), {T, Hv});
  Tensor d_o = upload(be, random_vec(rng, T * Hv * dv), {T, Hv, dv});
  Tensor o = garbage(be, {T, Hv, dv}), dqkv = garbage(be, {T, CD}), dg = garbage(be, {T, Hv}),
         dbeta = garbage(be, {T, Hv});
  be.gdn_forward(o, qkv, g, beta, dims, packed.info, Tensor(), GdnKeep::States);
  be.gdn_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, dims, packed.info, Tensor(), GdnKeep::States);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "sample " << s);
    const int64_t b = cu[s], len = cu[s + 1] - cu[s];
    Seqs alone({0, static_cast<int32_t>(len)});
    Tensor o1 = garbage(be, {len, Hv, dv}), dqkv1 = garbage(be, {len, CD}), dg1 = garbage(be, {len, Hv}),
           dbeta1 = garbage(be, {len, Hv});
    be.gdn_forward(o1, rows_of(qkv, b, len), rows_of(g, b, len), rows_of(beta, b, len), dims, alone.info, Tensor(), GdnKeep::States);
    be.gdn_backward(dqkv1, dg1, dbeta1, rows_of(d_o, b, len), rows_of(qkv, b, len), rows_of(g, b, len),
                    rows_of(beta, b, len), dims, alone.info, Tensor(), GdnKeep::States);
    expect_close("gdn o", download(be, rows_of(o, b, len)), download(be, o1), 0.0);
    expect_close("gdn dqkv", download(be, rows_of(dqkv, b, len)), download(be, dqkv1), 0.0);
    expect_close("gdn dg", download(be, rows_of(dg, b, len)), download(be, dg1), 0.0);
    expect_close("gdn dbeta", download(be, rows_of(dbeta, b, len)), download(be, dbeta1), 0.0);
  }
}

TEST_F(CpuOpsPacked, Attention) {
  const AttnDims dims{4, 2, 4, 4, 10000.0};
  const int64_t Hq = 4, Hkv = 2, D = 4;
  Seqs packed(cu);
  Tensor q = upload(be, random_vec(rng, T * Hq * D), {T, Hq, D}), k = upload(be, random_vec(rng, T * Hkv * D), {T, Hkv, D}),
         v = upload(be, random_vec(rng, T * Hkv * D), {T, Hkv, D}), d_o = upload(be, random_vec(rng, T * Hq * D), {T, Hq, D});
  Tensor o = garbage(be, {T, Hq, D}), lse = garbage(be, {Hq, T}), dq = garbage(be, {T, Hq, D}),
         dk = garbage(be, {T, Hkv, D}), dv = garbage(be, {T, Hkv, D});
  be.attention_forward(o, lse, q, k, v, dims, packed.info);
  be.attention_backward(dq, dk, dv, d_o, q, k, v, o, lse, dims, packed.info);
  const Vec lse_all = download(be, lse);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "sample " << s);
    const int64_t b = cu[s], len = cu[s + 1] - cu[s];
    Seqs alone({0, static_cast<int32_t>(len)});
    Tensor o1 = garbage(be, {len, Hq, D}), lse1 = garbage(be, {Hq, len}), dq1 = garbage(be, {len, Hq, D}),
           dk1 = garbage(be, {len, Hkv, D}), dv1 = garbage(be, {len, Hkv, D});
    be.attention_forward(o1, lse1, rows_of(q, b, len), rows_of(k, b, len), rows_of(v, b, len), dims, alone.info);
    be.attention_backward(dq1, dk1, dv1, rows_of(d_o, b, len), rows_of(q, b, len), rows_of(k, b, len),
                          rows_of(v, b, len), o1, lse1, dims, alone.info);
    expect_close("attention o", download(be, rows_of(o, b, len)), download(be, o1), 0.0);
    Vec lse_packed;
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < len; ++i) lse_packed.push_back(lse_all[static_cast<size_t>(h * T + b + i)]);
    expect_close("attention lse", lse_packed, download(be, lse1), 0.0);
    expect_close("attention dq", download(be, rows_of(dq, b, len)), download(be, dq1), 0.0);
    expect_close("attention dk", download(be, rows_of(dk, b, len)), download(be, dk1), 0.0);
    expect_close("attention dv", download(be, rows_of(dv, b, len)), download(be, dv1), 0.0);
  }
}

// ---- CpuOpsFloat: CpuBackend (float) vs the double reference -------------------------------------

class CpuOpsFloat : public ::testing::Test {
 protected:
  std::mt19937_64 rng{2024};
  CpuBackend be;
};

TEST_F(CpuOpsFloat, Dense) {
  const int64_t T = 37, N = 29, K = 23, V = 17;
  Vec x = random_vec(rng, T * K), w = random_vec(rng, N * K), dy = random_vec(rng, T * N), dx0 = random_vec(rng, T * K);
  Vec y(static_cast<size_t>(T * N)), dx(x.size()), dw(w.size(), 0.0);
  ref::linear_forward(y.data(), x.data(), w.data(), T, N, K);
  ref::linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), T, N, K, false, false);

  Tensor tx = upload(be, x, {T, K}), tw = upload(be, w, {N, K}), tdy = upload(be, dy, {T, N});
  Tensor ty = garbage(be, {T, N}), tdx = garbage(be, {T, K}), tdw = filled(be, {N, K}, kAccInit);
  be.linear_forward(ty, tx, tw);
  be.linear_backward(tdx, tdw, tdy, tx, tw, false, true);
  expect_close("linear y", download(be, ty), y, kFloatTol);
  expect_close("linear dx", download(be, tdx), dx, kFloatTol);
  expect_close("linear dw (+=)", download(be, tdw), plus_acc(dw), kFloatTol);
  // accumulate_dw false writes dw over whatever it held.
  Tensor tdw_set = garbage(be, {N, K});
  be.linear_backward(Tensor(), tdw_set, tdy, tx, tw, false, false);
  expect_close("linear dw (=)", download(be, tdw_set), dw, kFloatTol);
  // accumulate_dx adds into dx; a null dw is skipped.
  Tensor tdx_acc = upload(be, dx0, {T, K});
  be.linear_backward(tdx_acc, Tensor(), tdy, tx, tw, true, true);
  Vec want_acc = dx;
  for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += dx0[i];
  expect_close("linear dx (+=)", download(be, tdx_acc), want_acc, kFloatTol);

  // Embedding.
  const std::vector<int32_t> ids = {3, 16, 3, 0, 9, 3};
  const int64_t Te = 6, H = K;
  Vec table = random_vec(rng, V * H), dout = random_vec(rng, Te * H), emb(static_cast<size_t>(Te * H)),
      dtable(table.size(), 0.0);
  ref::embedding_forward(emb.data(), table.data(), ids.data(), Te, H);
  ref::embedding_backward(dtable.data(), dout.data(), ids.data(), Te, H);
  Tensor ttable = upload(be, table, {V, H}), tids = upload_i32(be, ids), temb = garbage(be, {Te, H}),
         tdtable = filled(be, {V, H}, kAccInit);
  be.embedding_forward(temb, ttable, tids);
  be.embedding_backward(tdtable, upload(be, dout, {Te, H}), tids);
  expect_close("embedding out", download(be, temb), emb, 0.0);
  expect_close("embedding dtable (+=)", download(be, tdtable), plus_acc(dtable), kFloatTol);

  // RMSNorm, as [T, 1, K] rows (the trailing dim is the normalized one).
  Vec nw = random_vec(rng, K, -0.5, 0.5), ny(x.size()), rstd(static_cast<size_t>(T)), ndx(x.size()),
      ndw(nw.size(), 0.0);
  Vec ndy = random_vec(rng, T * K);
  ref::rmsnorm_forward(ny.data(), rstd.data(), x.data(), nw.data(), T, K, 1e-6);
  ref::rmsnorm_backward(ndx.data(), ndw.data(), ndy.data(), x.data(), nw.data(), rstd.data(), T, K, false);
  Tensor tx3 = upload(be, x, {T, 1, K}), tnw = upload(be, nw, {K}), tny = garbage(be, {T, 1, K}),
         trstd = garbage(be, {T}), tndx = garbage(be, {T, 1, K}), tndw = filled(be, {K}, kAccInit);
  be.rmsnorm_forward(tny, trstd, tx3, tnw, 1e-6);
  be.rmsnorm_backward(tndx, tndw, upload(be, ndy, {T, 1, K}), tx3, tnw, trstd, false);
  expect_close("rmsnorm y", download(be, tny), ny, kFloatTol);
  expect_close("rmsnorm rstd", download(be, trstd), rstd, kFloatTol);
  expect_close("rmsnorm dx", download(be, tndx), ndx, kFloatTol);
  expect_close("rmsnorm dw (+=)", download(be, tndw), plus_acc(ndw), kFloatTol);

  // SwiGLU and add.
  Vec gate = random_vec(rng, T * K, -4, 4), h(x.size()), dg(x.size()), du(x.size());
  ref::swiglu_forward(h.data(), gate.data(), x.data(), T * K);
  ref::swiglu_backward(dg.data(), du.data(), ndy.data(), gate.data(), x.data(), T * K);
  Tensor tgate = upload(be, gate, {T, K}), th = garbage(be, {T, K}), tdg = garbage(be, {T, K}), tdu = garbage(be, {T, K});
  be.swiglu_forward(th, tgate, tx);
  be.swiglu_backward(tdg, tdu, upload(be, ndy, {T, K}), tgate, tx);
  expect_close("swiglu h", download(be, th), h, kFloatTol);
  expect_close("swiglu dgate", download(be, tdg), dg, kFloatTol);
  expect_close("swiglu dup", download(be, tdu), du, kFloatTol);
  be.add(tgate, tgate, tx);  // out aliases a
  Vec sum = gate;
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  expect_close("add", download(be, tgate), sum, 1e-7);
}

TEST_F(CpuOpsFloat, GatedDeltaNet) {
  const GdnDims dims{2, 4, 8, 6};
  const Cu cu = {0, 1, 3, 6, 11, 100};
  const int64_t T = 100, CD = dims.conv_dim(), Hv = 4, dv = 6, K = 4;
  Seqs seqs(cu);
  // conv1d + SiLU
  Vec x = random_vec(rng, T * CD), cw = random_vec(rng, CD * K), cdy = random_vec(rng, T * CD);
  Vec cy(x.size()), cdx(x.size()), cdw(cw.size(), 0.0);
  ref::conv1d_silu_forward(cy.data(), x.data(), cw.data(), T, CD, K, cu.data(), num_seqs(cu));
  ref::conv1d_silu_backward(cdx.data(), cdw.data(), cdy.data(), x.data(), cw.data(), T, CD, K, cu.data(),
                            num_seqs(cu));
  Tensor tx = upload(be, x, {T, CD}), tcw = upload(be, cw, {CD, 1, K}), tcy = garbage(be, {T, CD}),
         tcdx = garbage(be, {T, CD}), tcdw = filled(be, {CD, 1, K}, kAccInit);
  be.conv1d_silu_forward(tcy, tx, tcw, seqs.info);
  be.conv1d_silu_backward(tcdx, tcdw, upload(be, cdy, {T, CD}), tx, tcw, seqs.info);
  expect_close("conv y", download(be, tcy), cy, kFloatTol);
  expect_close("conv dx", download(be, tcdx), cdx, kFloatTol);
  expect_close("conv dw (+=)", download(be, tcdw), plus_acc(cdw), kFloatTol);

  // gates
  Vec b = random_vec(rng, T * Hv, -3, 3), a = random_vec(rng, T * Hv, -3, 3), a_log = random_vec(rng, Hv, -1, 1),
      dt = random_vec(rng, Hv), dbeta_in = random_vec(rng, T * Hv), dg_in = random_vec(rng, T * Hv);
  Vec beta(b.size()), g(b.size()), db(b.size()), da(b.size()), dalog(a_log.size(), 0.0), ddt(dt.size(), 0.0);
  ref::gdn_gates_forward(beta.data(), g.data(), b.data(), a.data(), a_log.data(), dt.data(), T, Hv);
  ref::gdn_gates_backward(db.data(), da.data(), dalog.data(), ddt.data(), dbeta_in.data(), dg_in.data(), b.data(),
                          a.data(), a_log.data(), dt.data(), T, Hv);
  Tensor tb = upload(be, b, {T, Hv}), ta = upload(be, a, {T, Hv}), talog = upload(be, a_log, {Hv}),
         tdt = upload(be, dt, {Hv}), tbeta = garbage(be, {T, Hv}), tg = garbage(be, {T, Hv}),
         tdb = garbage(be, {T, Hv}), tda = garbage(be, {T, Hv}), tdalog = filled(be, {Hv}, kAccInit),
         tddt = filled(be, {Hv}, kAccInit);
  be.gdn_gates_forward(tbeta, tg, tb, ta, talog, tdt);
  be.gdn_gates_backward(tdb, tda, tdalog, tddt, upload(be, dbeta_in, {T, Hv}), upload(be, dg_in, {T, Hv}), tb, ta,
                        talog, tdt);
  expect_close("gates beta", download(be, tbeta), beta, kFloatTol);
  expect_close("gates g", download(be, tg), g, kFloatTol);
  expect_close("gates db", download(be, tdb), db, kFloatTol);
  expect_close("gates da", download(be, tda), da, kFloatTol);
  expect_close("gates dA_log (+=)", download(be, tdalog), plus_acc(dalog), kFloatTol);
  expect_close("gates ddt_bias (+=)", download(be, tddt), plus_acc(ddt), kFloatTol);

  // gated delta rule on the conv output, with the gates above
  Vec o(static_cast<size_t>(T * Hv * dv)), d_o = random_vec(rng, T * Hv * dv), dqkv(x.size()), dgo(g.size()),
      dbo(g.size());
  ref::gdn_forward(o.data(), cy.data(), g.data(), beta.data(), dims, T, cu.data(), num_seqs(cu));
  ref::gdn_backward(dqkv.data(), dgo.data(), dbo.data(), d_o.data(), cy.data(), g.data(), beta.data(), dims, T,
                    cu.data(), num_seqs(cu));
  Tensor tqkv = upload(be, cy, {T, CD}), tgf = upload(be, g, {T, Hv}), tbf = upload(be, beta, {T, Hv}),
         to = garbage(be, {T, Hv, dv}), tdqkv = garbage(be, {T, CD}), tdgo = garbage(be, {T, Hv}),
         tdbo = garbage(be, {T, Hv});
  be.gdn_forward(to, tqkv, tgf, tbf, dims, seqs.info, Tensor(), GdnKeep::States);
  be.gdn_backward(tdqkv, tdgo, tdbo, upload(be, d_o, {T, Hv, dv}), tqkv, tgf, tbf, dims, seqs.info, Tensor(), GdnKeep::States);
  expect_close("gdn o", download(be, to), o, kFloatTol);
  expect_close("gdn dqkv", download(be, tdqkv), dqkv, kFloatTol);
  expect_close("gdn dg", download(be, tdgo), dgo, kFloatTol);
  expect_close("gdn dbeta", download(be, tdbo), dbo, kFloatTol);

  // gated RMSNorm over [T, Hv, dv]
  Vec z = random_vec(rng, T * Hv * dv, -3, 3), nw = random_vec(rng, dv, 0.5, 1.5), ny(o.size()),
      rstd(static_cast<size_t>(T * Hv)), ndx(o.size()), ndz(o.size()), ndw(nw.size(), 0.0);
  ref::gated_rmsnorm_forward(ny.data(), rstd.data(), o.data(), z.data(), nw.data(), T * Hv, dv, 1e-6);
  ref::gated_rmsnorm_backward(ndx.data(), ndz.data(), ndw.data(), d_o.data(), o.data(), z.data(), nw.data(),
                              rstd.data(), T * Hv, dv);
  Tensor tz = upload(be, z, {T, Hv, dv}), tnw = upload(be, nw, {dv}), tny = garbage(be, {T, Hv, dv}),
         trstd = garbage(be, {T * Hv}), tndx = garbage(be, {T, Hv, dv}), tndz = garbage(be, {T, Hv, dv}),
         tndw = filled(be, {dv}, kAccInit);
  Tensor to_exact = upload(be, o, {T, Hv, dv});  // the reference's o, rounded to float
  be.gated_rmsnorm_forward(tny, trstd, to_exact, tz, tnw, 1e-6);
  be.gated_rmsnorm_backward(tndx, tndz, tndw, upload(be, d_o, {T, Hv, dv}), to_exact, tz, tnw, trstd);
  expect_close("gated_rmsnorm y", download(be, tny), ny, kFloatTol);
  expect_close("gated_rmsnorm dx", download(be, tndx), ndx, kFloatTol);
  expect_close("gated_rmsnorm dz", download(be, tndz), ndz, kFloatTol);
  expect_close("gated_rmsnorm dw (+=)", download(be, tndw), plus_acc(ndw), kFloatTol);
}

TEST_F(CpuOpsFloat, Attention) {
  const AttnDims dims{4, 2, 16, 4, 1e7};
  const Cu cu = {0, 1, 3, 6, 11, 40};
  const std::vector<int32_t> positions = [] {
    std::vector<int32_t> p;
    const Cu c = {0, 1, 3, 6, 11, 40};
    for (size_t s = 0; s + 1 < c.size(); ++s)
      for (int32_t t = 0; t < c[s + 1] - c[s]; ++t) p.push_back(t + (s == 4 ? 3000 : 0));  // also large positions
    return p;
  }();
  const int64_t T = 40, Hq = 4, Hkv = 2, D = 16;
  Seqs seqs(cu);
  Vec qg = random_vec(rng, T * Hq * 2 * D, -2, 2), kr = random_vec(rng, T * Hkv * D, -2, 2),
      qw = random_vec(rng, D, -0.5, 0.5), kw = random_vec(rng, D, -0.5, 0.5), v = random_vec(rng, T * Hkv * D);
  Vec q(static_cast<size_t>(T * Hq * D)), k(static_cast<size_t>(T * Hkv * D)), gate(q.size()),
      q_rstd(static_cast<size_t>(T * Hq)), k_rstd(static_cast<size_t>(T * Hkv));
  ref::attn_prep_forward(q.data(), k.data(), gate.data(), q_rstd.data(), k_rstd.data(), qg.data(), kr.data(),
                         qw.data(), kw.data(), positions.data(), dims, T, 1e-6);
  Vec o(q.size()), lse(static_cast<size_t>(Hq * T)), d_o = random_vec(rng, T * Hq * D), dq(q.size()), dk(k.size()),
      dv(v.size());
  ref::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), dims, T, cu.data(), num_seqs(cu));
  ref::attention_backward(dq.data(), dk.data(), dv.data(), d_o.data(), q.data(), k.data(), v.data(), o.data(),
                          lse.data(), dims, T, cu.data(), num_seqs(cu));
  Vec dgate_in = random_vec(rng, T * Hq * D), dqg(qg.size()), dkr(kr.size()), dqw(qw.size(), 0.0),
      dkw(kw.size(), 0.0);
  ref::attn_prep_backward(dqg.data(), dkr.data(), dqw.data(), dkw.data(), dq.data(), dk.data(), dgate_in.data(),
                          qg.data(), kr.data(), qw.data(), kw.data(), q_rstd.data(), k_rstd.data(), positions.data(),
                          dims, T);
  Vec y(o.size()), gdo(o.size()), gdg(o.size());
  ref::attn_gate_forward(y.data(), o.data(), gate.data(), T * Hq * D);
  ref::attn_gate_backward(gdo.data(), gdg.data(), d_o.data(), o.data(), gate.data(), T * Hq * D);

  Tensor tqg = upload(be, qg, {T, Hq * 2 * D}), tkr = upload(be, kr, {T, Hkv * D}), tqw = upload(be, qw, {D}),
         tkw = upload(be, kw, {D}), tpos = upload_i32(be, positions), tv = upload(be, v, {T, Hkv, D});
  Tensor tq = garbage(be, {T, Hq, D}), tk = garbage(be, {T, Hkv, D}), tgate = garbage(be, {T, Hq * D}),
         tqr = garbage(be, {T * Hq}), tkrs = garbage(be, {T * Hkv});
  be.attn_prep_forward(tq, tk, tgate, tqr, tkrs, tqg, tkr, tqw, tkw, tpos, dims, 1e-6);
  expect_close("attn_prep q", download(be, tq), q, kFloatTol);
  expect_close("attn_prep k", download(be, tk), k, kFloatTol);
  expect_close("attn_prep gate", download(be, tgate), gate, 0.0);
  expect_close("attn_prep q_rstd", download(be, tqr), q_rstd, kFloatTol);

  Tensor to = garbage(be, {T, Hq, D}), tlse = garbage(be, {Hq, T}), tdq = garbage(be, {T, Hq, D}),
         tdk = garbage(be, {T, Hkv, D}), tdv = garbage(be, {T, Hkv, D}), tdo = upload(be, d_o, {T, Hq, D});
  be.attention_forward(to, tlse, tq, tk, tv, dims, seqs.info);
  be.attention_backward(tdq, tdk, tdv, tdo, tq, tk, tv, to, tlse, dims, seqs.info);
  expect_close("attention o", download(be, to), o, kFloatTol);
  expect_close("attention lse", download(be, tlse), lse, kFloatTol);
  expect_close("attention dq", download(be, tdq), dq, kFloatTol);
  expect_close("attention dk", download(be, tdk), dk, kFloatTol);
  expect_close("attention dv", download(be, tdv), dv, kFloatTol);

  Tensor tdqg = garbage(be, {T, Hq * 2 * D}), tdkr = garbage(be, {T, Hkv * D}), tdqw = filled(be, {D}, kAccInit),
         tdkw = filled(be, {D}, kAccInit);
  be.attn_prep_backward(tdqg, tdkr, tdqw, tdkw, upload(be, dq, {T, Hq, D}), upload(be, dk, {T, Hkv, D}),
                        upload(be, dgate_in, {T, Hq * D}), tqg, tkr, tqw, tkw, tqr, tkrs, tpos, dims);
  expect_close("attn_prep dqg", download(be, tdqg), dqg, kFloatTol);
  expect_close("attn_prep dkr", download(be, tdkr), dkr, kFloatTol);
  expect_close("attn_prep dq_norm_w (+=)", download(be, tdqw), plus_acc(dqw), kFloatTol);
  expect_close("attn_prep dk_norm_w (+=)", download(be, tdkw), plus_acc(dkw), kFloatTol);

  Tensor to_exact = upload(be, o, {T, Hq * D}), tgate_exact = upload(be, gate, {T, Hq * D});
  Tensor ty = garbage(be, {T, Hq * D}), tgdo = garbage(be, {T, Hq * D}), tgdg = garbage(be, {T, Hq * D});
  be.attn_gate_forward(ty, to_exact, tgate_exact);
  be.attn_gate_backward(tgdo, tgdg, upload(be, d_o, {T, Hq * D}), to_exact, tgate_exact);
  expect_close("attn_gate y", download(be, ty), y, kFloatTol);
  expect_close("attn_gate d_o", download(be, tgdo), gdo, kFloatTol);
  expect_close("attn_gate dgate", download(be, tgdg), gdg, kFloatTol);
}

TEST_F(CpuOpsFloat, LinearCrossEntropy) {
  const int64_t T = 13, H = 24, V = 1000;
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) targets[static_cast<size_t>(t)] = t % 5 == 1 ? -100 : static_cast<int32_t>((t * 397) % V);
  targets.back() = static_cast<int32_t>(V - 1);
  const double grad_scale = 1.0 / 11.0;
  Vec hidden = random_vec(rng, T * H, -2, 2), w = random_vec(rng, V * H), dh(hidden.size()), dw(w.size(), 0.0),
      tl(static_cast<size_t>(T));
  const double want = ref::linear_cross_entropy(dh.data(), dw.data(), tl.data(), hidden.data(), w.data(),
                                                targets.data(), T, V, H, grad_scale, 0);
  for (int64_t chunk : {int64_t{4}, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "chunk rows " << chunk);
    be.set_cross_entropy_chunk_rows(chunk);
    Tensor th = upload(be, hidden, {T, H}), tw = upload(be, w, {V, H}), ttg = upload_i32(be, targets);
    Tensor tdh = garbage(be, {T, H}), tdw = filled(be, {V, H}, kAccInit), ttl = garbage(be, {T});
    const double got = be.linear_cross_entropy(tdh, tdw, ttl, th, tw, ttg, grad_scale, true);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want));
    expect_close("ce token_loss", download(be, ttl), tl, kFloatTol);
    expect_close("ce dhidden", download(be, tdh), dh, kFloatTol);
    expect_close("ce dw (+=)", download(be, tdw), plus_acc(dw), kFloatTol);
    // accumulate_dw false writes dw over whatever it held.
    Tensor tdw_set = garbage(be, {V, H});
    be.linear_cross_entropy(Tensor(), tdw_set, Tensor(), th, tw, ttg, grad_scale, false);
    expect_close("ce dw (=)", download(be, tdw_set), dw, kFloatTol);
    // Loss only: no gradient outputs.
    EXPECT_NEAR(be.linear_cross_entropy(Tensor(), Tensor(), Tensor(), th, tw, ttg, grad_scale, true), got, 1e-9 * got);
  }
}

TEST_F(CpuOpsFloat, BackwardIsIndependentOfThreadCount) {
  const GdnDims dims{1, 2, 4, 4};
  const Cu cu = {0, 7, 200};
  const int64_t T = 200, CD = dims.conv_dim(), Hv = 2;
  Seqs seqs(cu);
  Tensor qkv = upload(be, random_vec(rng, T * CD), {T, CD}), g = upload(be, random_vec(rng, T * Hv, -0.5, 0), {T, Hv}),
         beta = upload(be, random_vec(rng, T * Hv, 0, 1), {T, Hv}), d_o = upload(be, random_vec(rng, T * Hv * 4), {T, Hv, 4}),
         cw = upload(be, random_vec(rng, CD * 4), {CD, 4}), nw = upload(be, random_vec(rng, CD), {CD});
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    Tensor dqkv = garbage(be, {T, CD}), dg = garbage(be, {T, Hv}), db = garbage(be, {T, Hv}),
           dx = garbage(be, {T, CD}), dw = filled(be, {CD, 4}, 0), rdx = garbage(be, {T, CD}),
           rdw = filled(be, {CD}, 0), rstd = garbage(be, {T}), y = garbage(be, {T, CD});
    be.gdn_backward(dqkv, dg, db, d_o, qkv, g, beta, dims, seqs.info, Tensor(), GdnKeep::States);
    be.conv1d_silu_backward(dx, dw, qkv, qkv, cw, seqs.info);
    be.rmsnorm_forward(y, rstd, qkv, nw, 1e-6);
    be.rmsnorm_backward(rdx, rdw, qkv, qkv, nw, rstd, false);
    Vec all;
    for (const Tensor* t : {&dqkv, &dg, &db, &dx, &dw, &rdx, &rdw}) {
      const Vec v = download(be, *t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const Vec one = run(1);
  for (int threads : {2, 3, 5}) {
    const Vec many = run(threads);
    ASSERT_EQ(one.size(), many.size());
    size_t diff = 0;
    for (size_t i = 0; i < one.size(); ++i) diff += one[i] != many[i];
    EXPECT_EQ(diff, 0u) << threads << " threads";
  }
}

TEST_F(CpuOpsFloat, AllocIsZeroedAndOwned) {
  EXPECT_EQ(be.activation_dtype(), DType::F32);
  EXPECT_TRUE(be.device() == Device::cpu());
  Tensor a = be.alloc(DType::F32, {3, 5});
  Tensor b = be.alloc(DType::I32, {4});
  ASSERT_NE(a.data, nullptr);
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(a.shape_vec(), (Shape{3, 5}));
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.ptr<float>()[i], 0.0f);
  for (int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(b.ptr<int32_t>()[i], 0);
  std::fill(a.ptr<float>(), a.ptr<float>() + a.numel(), 3.0f);
  Tensor c = be.alloc(DType::F32, {15});
  be.copy(c, a);
  EXPECT_EQ(c.ptr<float>()[14], 3.0f);
  be.zero(a);
  EXPECT_EQ(a.ptr<float>()[7], 0.0f);
}

// ---- CpuOpsErrors: the API boundary names op and tensor ------------------------------------------

TEST(CpuOpsErrors, WrongShapesAndDtypes) {
  CpuBackend be;
  const GdnDims dims{2, 4, 16, 16};  // conv_dim = 2*32 + 64 = 128
  Seqs seqs({0, 4, 10});
  Tensor qkv = be.alloc(DType::F32, {10, 96}), g = be.alloc(DType::F32, {10, 4}), beta = be.alloc(DType::F32, {10, 4}),
         o = be.alloc(DType::F32, {10, 4, 16});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv, g, beta, dims, seqs.info, Tensor(), GdnKeep::States); }, "gdn_forward", "qkv",
                        "f32[10, 96]", "[10, 128]");
  Tensor qkv_ok = be.alloc(DType::F32, {10, 128});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, be.alloc(DType::F32, {10, 3}), dims, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_forward", "beta", "[10, 4]");
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, beta, GdnDims{3, 4, 16, 16}, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_forward", "num_v_heads 4", "num_k_heads 3");
  Seqs bad_end({0, 4, 9});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv_ok, g, beta, dims, bad_end.info, Tensor(), GdnKeep::States); }, "gdn_forward",
                        "cu_seqlens", "ends at 9", "T = 10");
  Tensor dqkv = be.alloc(DType::F32, {10, 128}), dg = be.alloc(DType::F32, {10, 4}),
         d_o_bf16 = be.alloc(DType::BF16, {10, 4, 16});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_backward(dqkv, dg, beta, d_o_bf16, qkv_ok, g, beta, dims, seqs.info, Tensor(), GdnKeep::States); },
                        "gdn_backward", "d_o", "bf16", "expected dtype f32");

  Tensor x = be.alloc(DType::F32, {10, 8}), w = be.alloc(DType::F32, {8, 4});
  EXPECT_ERROR_CONTAINS([&] { be.conv1d_silu_forward(be.alloc(DType::F32, {10, 7}), x, w, seqs.info); },
                        "conv1d_silu_forward", "y", "f32[10, 7]", "[10, 8]");

  const AttnDims ad{4, 2, 8, 4, 1e4};
  Tensor q = be.alloc(DType::F32, {10, 4, 8}), k = be.alloc(DType::F32, {10, 2, 8}), v = be.alloc(DType::F32, {10, 2, 8}),
         ao = be.alloc(DType::F32, {10, 4, 8});
  EXPECT_ERROR_CONTAINS([&] { be.attention_forward(ao, be.alloc(DType::F32, {10, 4}), q, k, v, ad, seqs.info); },
                        "attention_forward", "lse", "f32[10, 4]", "[4, 10]");
  EXPECT_ERROR_CONTAINS([&] { be.attention_forward(ao, be.alloc(DType::F32, {4, 10}), q, k, k, AttnDims{4, 3, 8, 4, 1e4}, seqs.info); },
                        "attention_forward", "num_kv_heads 3");
  EXPECT_ERROR_CONTAINS(
      [&] {
        be.attn_prep_forward(q, k, be.alloc(DType::F32, {10, 32}), be.alloc(DType::F32, {40}), be.alloc(DType::F32, {20}),
                             be.alloc(DType::F32, {10, 64}), be.alloc(DType::F32, {10, 16}), be.alloc(DType::F32, {8}),
                             be.alloc(DType::F32, {8}), be.alloc(DType::F32, {10}), ad, 1e-6);
      },
      "attn_prep_forward", "positions", "expected dtype i32");

  EXPECT_ERROR_CONTAINS([&] { be.linear_forward(be.alloc(DType::F32, {10, 3}), x, be.alloc(DType::F32, {4, 8})); },
                        "linear_forward", "y", "f32[10, 3]", "[10, 4]");
  Tensor ids = upload_i32(be, {0, 1, 9});
  EXPECT_ERROR_CONTAINS([&] { be.embedding_forward(be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {9, 4}), ids); },
                        "embedding_forward", "ids[2] = 9", "[0, 9)");
  Tensor targets = upload_i32(be, {1, -100, -5});
  EXPECT_ERROR_CONTAINS(
      [&] { be.linear_cross_entropy(Tensor(), Tensor(), Tensor(), be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {6, 4}), targets, 1.0, true); },
      "linear_cross_entropy", "targets[2] = -5");
  EXPECT_ERROR_CONTAINS(
      [&] { be.linear_cross_entropy(be.alloc(DType::F32, {3, 5}), Tensor(), Tensor(), be.alloc(DType::F32, {3, 4}), be.alloc(DType::F32, {6, 4}), upload_i32(be, {1, 2, 3}), 1.0, true); },
      "linear_cross_entropy", "dhidden", "f32[3, 5]", "[3, 4]");
  EXPECT_ERROR_CONTAINS([&] { be.rmsnorm_forward(x, be.alloc(DType::F32, {10}), x, be.alloc(DType::F32, {7}), 1e-6); },
                        "rmsnorm_forward", "x", "last dim 7");
}

// The per-op checks both backends share (ops/op_check.h), in the CUDA backend's configuration:
// bf16 activations on a CUDA device. The tensors only carry a non-null address (nothing is read),
// so this runs without a GPU and covers the argument sets CudaBackend passes.
TEST(SharedOpChecks, CudaConfigurationAcceptsRightShapesAndNamesWrongOnes) {
  static char storage[16];
  const Device dev = Device::cuda();
  auto t = [&](DType dt, const Shape& s) { return Tensor(storage, dt, s, dev); };
  const DType BF = DType::BF16, F = DType::F32;
  const DeviceKind cuda = DeviceKind::CUDA;
  const int64_t T = 11;
  // Gated delta rule: Hk 2, Hv 4, dk 16, dv 32 -> conv_dim 2*2*16 + 4*32 = 192.
  const GdnDims gd{2, 4, 16, 32};
  const Tensor qkv = t(BF, {T, 192}), g = t(F, {T, 4}), beta = t(F, {T, 4}), o = t(BF, {T, 4, 32});
  EXPECT_EQ(ops::check_gdn_forward("gdn_forward", gd, o, qkv, g, beta, BF, cuda), T);
  EXPECT_EQ(ops::check_gdn_backward("gdn_backward", gd, t(BF, {T, 192}), t(F, {T, 4}), t(F, {T, 4}), o, qkv, g, beta,
                                    BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS([&] { ops::check_gdn_forward("gdn_forward", gd, o, qkv, t(F, {T, 3}), beta, BF, cuda); },
                        "gdn_forward", "g is", "[11, 4]");
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_gdn_backward("gdn_backward", gd, t(BF, {T, 192}), g, beta, t(F, {T, 4, 32}), qkv, g, beta, BF, cuda);
      },
      "gdn_backward", "d_o", "expected dtype bf16");
  EXPECT_ERROR_CONTAINS([&] { ops::check_gdn_forward("gdn_forward", gd, o, Tensor(storage, BF, {T, 192}), g, beta, BF,
                                                     cuda); },
                        "gdn_forward", "qkv", "not on the CUDA device");
  // Gates: [T, H] projections and [H] parameters in bf16, beta / g in f32.
  const auto th = ops::check_gdn_gates_backward("gdn_gates_backward", t(BF, {T, 4}), t(BF, {T, 4}), t(F, {T, 4}),
                                                t(F, {T, 4}), t(BF, {T, 4}), t(BF, {T, 4}), t(BF, {4}), t(BF, {4}), BF,
                                                cuda);
  EXPECT_EQ(th.first, T);
  EXPECT_EQ(th.second, 4);
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_gdn_gates_forward("gdn_gates_forward", t(F, {T, 4}), t(F, {T, 4}), t(BF, {T, 4}), t(BF, {T, 4}),
                                     t(F, {4}), t(BF, {4}), BF, cuda);
      },
      "gdn_gates_forward", "a_log", "expected dtype bf16");
  // Attention (8 q / 2 kv heads, D 64) and its prep (qg holds q and the gate per head).
  const AttnDims ad{8, 2, 64, 32, 1e6};
  const Tensor q = t(BF, {T, 8, 64}), k = t(BF, {T, 2, 64}), v = t(BF, {T, 2, 64}), ao = t(BF, {T, 8, 64}),
               lse = t(F, {8, T});
  EXPECT_EQ(ops::check_attention_backward("attention_backward", ad, t(BF, {T, 8, 64}), t(BF, {T, 2, 64}),
                                          t(BF, {T, 2, 64}), t(BF, {T, 8, 64}), q, k, v, ao, lse, BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_attention_forward("attention_forward", ad, ao, t(F, {T, 8}), q, k, v, BF, cuda); },
      "attention_forward", "lse", "[8, 11]");
  const Tensor qg = t(BF, {T, 8 * 2 * 64}), kr = t(BF, {T, 2 * 64}), w = t(BF, {64}), pos = t(DType::I32, {T});
  EXPECT_EQ(ops::check_attn_prep_forward("attn_prep_forward", ad, q, k, t(BF, {T, 8 * 64}), t(F, {T * 8}),
                                         t(F, {T * 2}), qg, kr, w, w, pos, BF, cuda),
            T);
  EXPECT_ERROR_CONTAINS(
      [&] {
        ops::check_attn_prep_backward("attn_prep_backward", ad, qg, t(BF, {T, 2 * 64 + 1}), q, k, t(BF, {T, 8 * 64}),
                                      qg, kr, w, w, t(F, {T * 8}), t(F, {T * 2}), pos, BF, cuda);
      },
      "attn_prep_backward", "dkr");
  EXPECT_ERROR_CONTAINS([&] { ops::check_attn_dims("attention_forward", AttnDims{6, 4, 64, 32, 1e6}); },
                        "num_q_heads 6", "num_kv_heads 4");
  // Linear: w [N, K], x [T, K], y / dy [T, N].
  const ops::LinearDims ld =
      ops::check_linear("linear_forward", t(BF, {6, 9}), t(BF, {T, 9}), "y", t(BF, {T, 6}), BF, cuda);
  EXPECT_EQ(ld.T, T);
  EXPECT_EQ(ld.N, 6);
  EXPECT_EQ(ld.K, 9);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_linear("linear_backward", t(BF, {6, 9}), t(BF, {T, 9}), "dy", t(BF, {T, 7}), BF, cuda); },
      "linear_backward", "dy is", "[11, 6]");
  // Row norms: w [cols], x [..., cols], rstd [rows], the rest shaped like x.
  const Tensor nx = t(BF, {T, 4, 32});
  const ops::NormDims nd = ops::check_norm("gated_rmsnorm_forward", t(BF, {32}), nx, {{"z", &nx}, {"y", &nx}},
                                           t(F, {T * 4}), BF, cuda);
  EXPECT_EQ(nd.rows, T * 4);
  EXPECT_EQ(nd.cols, 32);
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_norm("rmsnorm_forward", t(BF, {32}), nx, {{"y", &nx}}, t(F, {T}), BF, cuda); },
      "rmsnorm_forward", "rstd", "[44]");
  EXPECT_ERROR_CONTAINS(
      [&] { ops::check_norm("rmsnorm_forward", t(BF, {31}), nx, {{"y", &nx}}, t(F, {T * 4}), BF, cuda); },
      "rmsnorm_forward", "last dim 31");
  // Elementwise: every tensor shaped like the first.
  ops::check_same_shape("swiglu_forward", BF, cuda, {{"gate", &qg}, {"up", &qg}, {"h", &qg}});
  EXPECT_ERROR_CONTAINS([&] { ops::check_same_shape("swiglu_forward", BF, cuda, {{"gate", &qg}, {"up", &kr}}); },
                        "swiglu_forward", "up is");
}

}  // namespace
}  // namespace qt
