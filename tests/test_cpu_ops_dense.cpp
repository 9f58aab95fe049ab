// CPU reference backend tests of the dense ops (linear, embedding, norms, SwiGLU, conv1d, GDN gates,
// attn_prep, attention gate, cross-entropy); the suites are described in cpu_ops_test_util.h.
#include "cpu_ops_test_util.h"

#include <random>
#include <string>

#include "core/error.h"
#include "core/fp8.h"

namespace qt {
namespace {

using namespace cpu_ops_test;

// ---- CpuOpsGrad: backward vs finite differences --------------------------------------------------

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

// ---- CpuOpsFloat: CpuBackend (float) vs the double reference -------------------------------------

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
  be.rmsnorm_forward(tny, trstd, tx3, tnw, 1e-6, Tensor());
  be.rmsnorm_backward(tndx, tndw, upload(be, ndy, {T, 1, K}), tx3, tnw, trstd, false, Tensor());
  expect_close("rmsnorm y", download(be, tny), ny, kFloatTol);
  expect_close("rmsnorm rstd", download(be, trstd), rstd, kFloatTol);
  expect_close("rmsnorm dx", download(be, tndx), ndx, kFloatTol);
  expect_close("rmsnorm dw (+=)", download(be, tndw), plus_acc(ndw), kFloatTol);

  // SwiGLU and add.
  Vec gate = random_vec(rng, T * K, -4, 4), h(x.size()), dg(x.size()), du(x.size());
  ref::swiglu_forward(h.data(), gate.data(), x.data(), T * K);
  ref::swiglu_backward(dg.data(), du.data(), ndy.data(), gate.data(), x.data(), T * K);
  Tensor tgate = upload(be, gate, {T, K}), th = garbage(be, {T, K}), tdg = garbage(be, {T, K}), tdu = garbage(be, {T, K});
  be.swiglu_forward(th, tgate, tx, Tensor());
  be.swiglu_backward(tdg, tdu, upload(be, ndy, {T, K}), tgate, tx, Tensor(), Tensor());
  expect_close("swiglu h", download(be, th), h, kFloatTol);
  expect_close("swiglu dgate", download(be, tdg), dg, kFloatTol);
  expect_close("swiglu dup", download(be, tdu), du, kFloatTol);
  be.add(tgate, tgate, tx);  // out aliases a
  Vec sum = gate;
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  expect_close("add", download(be, tgate), sum, 1e-7);
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

}  // namespace
}  // namespace qt

// ---- FP8 E4M3 codec and the fp8 ops' CPU reference ----------------------------------------------

namespace qt {
namespace {

TEST(Fp8E4M3, CodecRoundTripsRoundsToEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_float(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(float_to_fp8_e4m3(v), uint8_t(c)) << "code " << c << " value " << v;
    // Halfway to the next code up rounds to the even one of the two.
    if ((c & 0x7F) < 0x7E) {
      const float next = fp8_e4m3_to_float(uint8_t(c + 1)), mid = 0.5f * (v + next);
      const uint8_t even = (c & 1) ? uint8_t(c + 1) : uint8_t(c);
      EXPECT_EQ(float_to_fp8_e4m3(mid), even) << "midpoint of codes " << c << ", " << c + 1;
    }
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(float_to_fp8_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-460.0f), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter step: to zero
  EXPECT_EQ(float_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(fp8_scale_for_amax(0.0f), 1.0f);
}

TEST(Fp8E5M2, CodecRoundTripsRoundsToEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e5m2_to_float(uint8_t(c));
    if ((c & 0x7F) > 0x7C) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    if ((c & 0x7F) == 0x7C) {  // infinity: saturates to the largest finite code
      EXPECT_TRUE(std::isinf(v)) << c;
      EXPECT_EQ(float_to_fp8_e5m2(v), uint8_t((c & 0x80) | 0x7B));
      continue;
    }
    EXPECT_EQ(float_to_fp8_e5m2(v), uint8_t(c)) << "code " << c << " value " << v;
    if ((c & 0x7F) < 0x7B) {
      const float next = fp8_e5m2_to_float(uint8_t(c + 1)), mid = 0.5f * (v + next);
      const uint8_t even = (c & 1) ? uint8_t(c + 1) : uint8_t(c);
      EXPECT_EQ(float_to_fp8_e5m2(mid), even) << "midpoint of codes " << c << ", " << c + 1;
      // Just above the midpoint rounds up, just below down.
      EXPECT_EQ(float_to_fp8_e5m2(std::nextafter(mid, 2 * next)), uint8_t(c + 1)) << c;
      EXPECT_EQ(float_to_fp8_e5m2(std::nextafter(mid, 0.0f)), uint8_t(c)) << c;
    }
  }
  EXPECT_EQ(fp8_e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(float_to_fp8_e5m2(1e9f), 0x7B);
  EXPECT_EQ(float_to_fp8_e5m2(-60000.0f), 0xFB);
  EXPECT_EQ(float_to_fp8_e5m2(-INFINITY), 0xFB);
  EXPECT_EQ(float_to_fp8_e5m2(std::nanf("")), 0x7F);
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(1.0f, -18)), 0x00);  // a quarter step: to zero
  EXPECT_EQ(float_to_fp8_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8_e5m2(1.0f), 0x3C);
  EXPECT_EQ(float_to_fp8_e5m2(-0.7f), 0xBA);  // -0.75: 2 mantissa bits
}

TEST(Fp8E4M3, CpuQuantizeAndLinear) {
  CpuBackend be;
  const int64_t T = 3, N = 8, K = 16;
  Tensor x = be.alloc(DType::F32, {T, K}), w = be.alloc(DType::F32, {N, K});
  for (int64_t i = 0; i < T * K; ++i) x.ptr<float>()[i] = float(i % 7) - 3.0f;   // amax 3
  for (int64_t i = 0; i < N * K; ++i) w.ptr<float>()[i] = (i % 3 == 0) ? 0.5f : -0.25f;
  Tensor xq = be.alloc(DType::F8E4M3, {T, K}), wq = be.alloc(DType::F8E4M3, {N, K});
  Tensor xs = be.alloc(DType::F32, {1}), ws = be.alloc(DType::F32, {1}), y = be.alloc(DType::F32, {T, N});
  be.quantize_fp8(xq, Tensor(), xs, x, Tensor());
  be.quantize_fp8(wq, Tensor(), ws, w, Tensor());
  EXPECT_FLOAT_EQ(xs.ptr<float>()[0], 3.0f / 448.0f);
  EXPECT_FLOAT_EQ(ws.ptr<float>()[0], 0.5f / 448.0f);
  be.linear_fp8(y, xq, xs, wq, ws, false, false);
  // w's values are exact in e4m3 after scaling, x's (integers times 448 / 3) are not: the product
  // stays within e4m3's rounding of x (2^-4 relative per term; mag / 8 leaves a factor of 2).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += double(x.ptr<float>()[t * K + k]) * w.ptr<float>()[n * K + k];
        mag += std::fabs(double(x.ptr<float>()[t * K + k]) * w.ptr<float>()[n * K + k]);
      }
      EXPECT_NEAR(y.ptr<float>()[t * N + n], exact, mag / 8 + 1e-6) << t << ", " << n;
    }
  // The transposed codes are q's, transposed.
  Tensor xq_t = be.alloc(DType::F8E4M3, {K, T});
  be.quantize_fp8(Tensor(), xq_t, xs, x, Tensor());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      EXPECT_EQ(static_cast<uint8_t*>(xq_t.data)[k * T + t], static_cast<uint8_t*>(xq.data)[t * K + k]);
  // Padded to 16 tokens (q_t [K, 16]): the same codes, then zeros; past 16 is refused.
  Tensor xq_p = be.alloc(DType::F8E4M3, {K, 16});
  be.quantize_fp8(Tensor(), xq_p, xs, x, Tensor());
  for (int64_t k = 0; k < K; ++k)
    for (int64_t t = 0; t < 16; ++t)
      EXPECT_EQ(static_cast<uint8_t*>(xq_p.data)[k * 16 + t], t < T ? static_cast<uint8_t*>(xq.data)[t * K + k] : 0);
  Tensor xq_p32 = be.alloc(DType::F8E4M3, {K, 32});
  EXPECT_THROW(be.quantize_fp8(Tensor(), xq_p32, xs, x, Tensor()), Error);
  EXPECT_THROW(be.quantize_fp8(Tensor(), Tensor(), xs, x, Tensor()), Error);  // neither output
  EXPECT_THROW(be.quantize_fp8(Tensor(), xq, xs, x, Tensor()), Error);        // q_t must be [K, T]
  // All-zero input: scale 1, codes 0.
  Tensor z = be.alloc(DType::F32, {2, 16}), zq = be.alloc(DType::F8E4M3, {2, 16}), zs = be.alloc(DType::F32, {1});
  be.quantize_fp8(zq, Tensor(), zs, z, Tensor());
  EXPECT_EQ(zs.ptr<float>()[0], 1.0f);
  // Bad shapes and dtypes are named.
  Tensor wq_bad = be.alloc(DType::F8E4M3, {8, 24}), xq_bad = be.alloc(DType::F8E4M3, {T, 24});
  try {
    be.linear_fp8(y, xq_bad, xs, wq_bad, ws, false, false);
    FAIL() << "K = 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_fp8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be.quantize_fp8(x, Tensor(), xs, x, Tensor()), Error);  // q must be F8E4M3
  // A scale pointer only 4-byte aligned is refused by name (cuBLASLt would answer NOT_SUPPORTED).
  Tensor two = be.alloc(DType::F32, {8});
  const Tensor off(two.ptr<float>() + 1, DType::F32, {1}, two.device);
  EXPECT_ERROR_CONTAINS([&] { be.linear_fp8(y, xq, off, wq, ws, false, false); }, "x_scale_inv must be 16-byte aligned");
}

// linear_cross_entropy_fp8 on the CPU reference: the loss is the fp32 head's on the decoded codes
// (the same logits), the gradients lie within e5m2's rounding of the logits' gradient (each
// |dl8 - dl| <= |dl| / 8 + 2^-17 grad_scale: half an ulp of 2 mantissa bits, or of the subnormal
// step at the static scale 2^15) but differ from the fp32 ones; ignored rows get nothing; bad
// shapes, scales and targets are named.
TEST(Fp8E5M2, CpuLinearCrossEntropy) {
  CpuBackend be;
  be.set_cross_entropy_chunk_rows(8);  // three chunks, the last one short
  const int64_t T = 21, V = 48, H = 32, Tp = 32;
  const double gs = 0.37;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uh(-2.0f, 2.0f), uw(-0.5f, 0.5f);
  Tensor h = be.alloc(DType::F32, {T, H}), w = be.alloc(DType::F32, {V, H}), tg = be.alloc(DType::I32, {T});
  for (int64_t i = 0; i < T * H; ++i) h.ptr<float>()[i] = uh(rng);
  for (int64_t i = 0; i < V * H; ++i) w.ptr<float>()[i] = uw(rng);
  for (int64_t t = 0; t < T; ++t) tg.ptr<int32_t>()[t] = t % 5 == 3 ? -100 : int32_t(rng() % V);
  Fp8HeadCodes c{be.alloc(DType::F8E4M3, {T, H}), be.alloc(DType::F8E4M3, {H, Tp}), be.alloc(DType::F32, {1}),
                 be.alloc(DType::F8E4M3, {V, H}), be.alloc(DType::F8E4M3, {H, V}), be.alloc(DType::F32, {1})};
  be.quantize_fp8(c.hq, c.hq_t, c.h_scale_inv, h, Tensor());
  be.quantize_fp8(c.wq, c.wq_t, c.w_scale_inv, w, Tensor());
  std::vector<double> hd(size_t(T * H)), wd(size_t(V * H));
  for (size_t i = 0; i < hd.size(); ++i)
    hd[i] = double(fp8_e4m3_to_float(static_cast<uint8_t*>(c.hq.data)[i])) * c.h_scale_inv.ptr<float>()[0];
  for (size_t i = 0; i < wd.size(); ++i)
    wd[i] = double(fp8_e4m3_to_float(static_cast<uint8_t*>(c.wq.data)[i])) * c.w_scale_inv.ptr<float>()[0];
  // The exact loss and logits' gradient of the decoded operands, in double.
  std::vector<double> dl(size_t(T * V), 0.0);
  double want = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t y = tg.ptr<int32_t>()[t];
    if (y < 0) continue;
    std::vector<double> z(static_cast<size_t>(V), 0.0);
    double mx = -1e300, sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t k = 0; k < H; ++k) z[size_t(v)] += hd[size_t(t * H + k)] * wd[size_t(v * H + k)];
      mx = std::max(mx, z[size_t(v)]);
    }
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - mx);
    want += mx + std::log(sum) - z[size_t(y)];
    for (int64_t v = 0; v < V; ++v) dl[size_t(t * V + v)] = gs * (std::exp(z[size_t(v)] - mx) / sum - (v == y ? 1 : 0));
  }
  Tensor sum = be.alloc(DType::F64, {1}), dh = be.alloc(DType::F32, {T, H}), dw = be.alloc(DType::F32, {V, H}),
         tl = be.alloc(DType::F32, {T});
  for (int64_t i = 0; i < V * H; ++i) dw.ptr<float>()[i] = 0.25f;  // accumulated onto
  be.linear_cross_entropy_fp8(sum, dh, dw, tl, c, tg, gs, true);
  EXPECT_NEAR(sum.ptr<double>()[0], want, 1e-5 * want);
  const double u = gs * std::ldexp(1.0, -17);
  double max_dh = 0, max_dw = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (tg.ptr<int32_t>()[t] < 0) {
      EXPECT_EQ(tl.ptr<float>()[t], 0.0f);
    }
    for (int64_t k = 0; k < H; ++k) {
      double exact = 0, bound = 1e-6;
      for (int64_t v = 0; v < V; ++v) {
        exact += dl[size_t(t * V + v)] * wd[size_t(v * H + k)];
        bound += (std::fabs(dl[size_t(t * V + v)]) / 8 + u) * std::fabs(wd[size_t(v * H + k)]);
      }
      const double got = dh.ptr<float>()[t * H + k];
      if (tg.ptr<int32_t>()[t] < 0) {
        EXPECT_EQ(got, 0.0) << t;
      }
      EXPECT_NEAR(got, exact, bound) << "dhidden " << t << ", " << k;
      max_dh = std::max(max_dh, std::fabs(got - exact));
    }
  }
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < H; ++k) {
      double exact = 0.25, bound = 1e-6;
      for (int64_t t = 0; t < T; ++t) {
        exact += dl[size_t(t * V + v)] * hd[size_t(t * H + k)];
        bound += (std::fabs(dl[size_t(t * V + v)]) / 8 + u) * std::fabs(hd[size_t(t * H + k)]);
      }
      EXPECT_NEAR(dw.ptr<float>()[v * H + k], exact, bound) << "dw " << v << ", " << k;
      max_dw = std::max(max_dw, std::fabs(dw.ptr<float>()[v * H + k] - exact));
    }
  EXPECT_GT(max_dh, 1e-5);  // the e5m2 gradient is not the exact one
  EXPECT_GT(max_dw, 1e-5);
  // Written, not accumulated: dw = the gradient alone; loss only: the same sum.
  Tensor dw_set = be.alloc(DType::F32, {V, H});
  be.linear_cross_entropy_fp8(sum, Tensor(), dw_set, Tensor(), c, tg, gs, false);
  for (int64_t i = 0; i < V * H; ++i) EXPECT_NEAR(dw_set.ptr<float>()[i], dw.ptr<float>()[i] - 0.25f, 1e-5) << i;
  be.linear_cross_entropy_fp8(sum, Tensor(), Tensor(), Tensor(), c, tg, gs, false);
  EXPECT_NEAR(sum.ptr<double>()[0], want, 1e-5 * want);
  // Bad input, by name.
  Fp8HeadCodes bad = c;
  bad.wq = be.alloc(DType::F8E4M3, {40, H});
  EXPECT_ERROR_CONTAINS([&] { be.linear_cross_entropy_fp8(sum, dh, dw, tl, bad, tg, gs, true); },
                        "linear_cross_entropy_fp8", "multiples of 16");
  bad = c;
  bad.hq_t = be.alloc(DType::F8E4M3, {H, T});
  EXPECT_ERROR_CONTAINS([&] { be.linear_cross_entropy_fp8(sum, dh, dw, tl, bad, tg, gs, true); }, "hq_t");
  Tensor two = be.alloc(DType::F32, {8});
  bad = c;
  bad.w_scale_inv = Tensor(two.ptr<float>() + 1, DType::F32, {1}, two.device);
  EXPECT_ERROR_CONTAINS([&] { be.linear_cross_entropy_fp8(sum, dh, dw, tl, bad, tg, gs, true); },
                        "w_scale_inv must be 16-byte aligned");
  tg.ptr<int32_t>()[4] = int32_t(V);
  EXPECT_ERROR_CONTAINS([&] { be.linear_cross_entropy_fp8(sum, dh, dw, tl, c, tg, gs, true); }, "targets[4] = 48");
  EXPECT_ERROR_CONTAINS([&] { be.linear_cross_entropy_fp8(Tensor(), dh, dw, tl, c, tg, gs, true); }, "loss_sum");
}

}  // namespace
}  // namespace qt
