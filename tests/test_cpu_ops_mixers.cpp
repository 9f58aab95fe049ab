// CPU reference backend tests of the token mixers (Gated DeltaNet, attention); the suites are
// described in cpu_ops_test_util.h.
#include "cpu_ops_test_util.h"

namespace qt {
namespace {

using namespace cpu_ops_test;

// ---- CpuOpsGrad: backward vs finite differences --------------------------------------------------

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

// ---- CpuOpsForward: against naive implementations ------------------------------------------------

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

// ---- CpuOpsPacked: packed row == each sample alone ------------------------------------------------

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
    be.rmsnorm_forward(y, rstd, qkv, nw, 1e-6, Tensor());
    be.rmsnorm_backward(rdx, rdw, qkv, qkv, nw, rstd, false, Tensor());
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

}  // namespace
}  // namespace qt
