// CPU reference: fused lm_head + cross-entropy (docs/model_spec.md section 6), chunked over tokens so the [T, V]
// logits never exist at once. Per row: log-softmax over all V logits with a double sum of
// exponentials; the loss sum over tokens is accumulated in double, in token order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "core/parallel.h"
#include "ops/op_check.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_check.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/reference_ops.h"

namespace qt {
namespace ref {

constexpr int32_t kIgnoreIndex = -100;

int64_t cross_entropy_chunk_rows(int64_t V) {
  constexpr int64_t kLogitsPerChunk = int64_t{8} << 20;
  return std::max<int64_t>(1, kLogitsPerChunk / std::max<int64_t>(1, V));
}

template <typename S>
double linear_cross_entropy(S* dhidden, S* dw, S* token_loss, const S* hidden, const S* w, const int32_t* targets,
                            int64_t T, int64_t V, int64_t H, double grad_scale, int64_t chunk_rows) {
  if (chunk_rows <= 0) chunk_rows = cross_entropy_chunk_rows(V);
  chunk_rows = std::max<int64_t>(1, std::min(chunk_rows, T));
  const bool want_grad = dhidden != nullptr || dw != nullptr;
  std::vector<S> logits(static_cast<size_t>(chunk_rows * V));
  std::vector<double> row_loss(static_cast<size_t>(chunk_rows));
  double total = 0.0;

  for (int64_t c0 = 0; c0 < T; c0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, T - c0);
    gemm(false, true, n, V, H, S(1), hidden + c0 * H, w, S(0), logits.data());  // [n, V]

    // Per row: loss = logsumexp - logit[target]; the logits row becomes grad_scale * dloss/dlogits.
    parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        S* row = logits.data() + r * V;
        const int32_t tgt = targets[c0 + r];
        if (tgt == kIgnoreIndex) {
          row_loss[static_cast<size_t>(r)] = 0.0;
          if (want_grad) std::fill(row, row + V, S(0));
          continue;
        }
        double mx = -INFINITY;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        const double lse = mx + std::log(sum);
        row_loss[static_cast<size_t>(r)] = lse - static_cast<double>(row[tgt]);
        if (!want_grad) continue;
        for (int64_t v = 0; v < V; ++v) row[v] = static_cast<S>(grad_scale * std::exp(static_cast<double>(row[v]) - lse));
        row[tgt] -= static_cast<S>(grad_scale);
      }
    });
    for (int64_t r = 0; r < n; ++r) {
      total += row_loss[static_cast<size_t>(r)];
      if (token_loss != nullptr) token_loss[c0 + r] = static_cast<S>(row_loss[static_cast<size_t>(r)]);
    }
    if (dhidden != nullptr) gemm(false, false, n, H, V, S(1), logits.data(), w, S(0), dhidden + c0 * H);  // dl w
    if (dw != nullptr) gemm(true, false, V, H, n, S(1), logits.data(), hidden + c0 * H, S(1), dw);     // dl^T h
  }
  return total;
}

QT_REF_INSTANTIATE(linear_cross_entropy);

}  // namespace ref

namespace {
const int32_t* checked_targets(const char* op, const Tensor& targets, int64_t T, int64_t V) {
  const int32_t* tg = targets.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    QT_CHECK(tg[t] == ref::kIgnoreIndex || (tg[t] >= 0 && tg[t] < V), op, ": targets[", t, "] = ", tg[t],
             " is neither -100 nor in [0, ", V, ")");
  return tg;
}
}  // namespace

double CpuBackend::linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss,
                                        const Tensor& hidden, const Tensor& w, const Tensor& targets,
                                        double grad_scale, bool accumulate_dw) {
  const char* op = "linear_cross_entropy";
  constexpr DType F32 = DType::F32;
  QT_CHECK(w.ndim == 2, op, ": w is ", w.describe(), ", expected 2 dims [V, H]");
  const int64_t V = w.size(0), H = w.size(1), T = cpu::dim_of(op, "hidden", hidden, 0);
  cpu::check_tensor(op, "w", w, F32, {V, H});
  cpu::check_tensor(op, "hidden", hidden, F32, {T, H});
  cpu::check_tensor(op, "targets", targets, DType::I32, {T});
  const bool want_dh = cpu::check_optional(op, "dhidden", dhidden, F32, {T, H});
  const bool want_dw = cpu::check_optional(op, "dw", dw, F32, {V, H});
  const bool want_tl = cpu::check_optional(op, "token_loss", token_loss, F32, {T});
  const int32_t* tg = checked_targets(op, targets, T, V);
  if (want_dw && !accumulate_dw) zero(dw);  // the reference accumulates
  return ref::linear_cross_entropy(want_dh ? dhidden.ptr<float>() : nullptr, want_dw ? dw.ptr<float>() : nullptr,
                                   want_tl ? token_loss.ptr<float>() : nullptr, hidden.ptr<float>(), w.ptr<float>(),
                                   tg, T, V, H, grad_scale, ce_chunk_rows_);
}

// The FP8 head (backend_ops.def): the decoded codes' products in fp32, the softmax in double as
// above, the logits' gradient through e5m2 codes at the static scale 2^15. dgrad reads wq_t and
// wgrad hq_t, as the device does.
void CpuBackend::linear_cross_entropy_fp8(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                          const Tensor& token_loss, const Fp8HeadCodes& head, const Tensor& targets,
                                          double grad_scale, bool accumulate_dw) {
  const char* op = "linear_cross_entropy_fp8";
  constexpr DType F32 = DType::F32;
  const auto [T, V, H] = ops::check_fp8_head(op, loss_sum, head, targets, DeviceKind::CPU);
  const bool want_dh = cpu::check_optional(op, "dhidden", dhidden, F32, {T, H});
  const bool want_dw = cpu::check_optional(op, "dw", dw, F32, {V, H});
  const bool want_tl = cpu::check_optional(op, "token_loss", token_loss, F32, {T});
  const int32_t* tg = checked_targets(op, targets, T, V);
  if (want_dw && !accumulate_dw) zero(dw);
  const int64_t Tp = (T + 15) / 16 * 16;
  auto decode = [](const Tensor& q) {
    std::vector<float> f(static_cast<size_t>(q.numel()));
    const auto* b = static_cast<const uint8_t*>(q.data);
    for (size_t i = 0; i < f.size(); ++i) f[i] = fp8_e4m3_to_float(b[i]);
    return f;
  };
  const std::vector<float> h = decode(head.hq), w = decode(head.wq), ht = decode(head.hq_t), wt = decode(head.wq_t);
  const float sh = *head.h_scale_inv.ptr<float>(), sw = *head.w_scale_inv.ptr<float>();
  constexpr float kCodeScale = 32768.0f;  // 2^15
  const float dl_scale = float(grad_scale) / kCodeScale;
  const int64_t chunk = std::max<int64_t>(1, std::min(ce_chunk_rows_ > 0 ? ce_chunk_rows_ : ref::cross_entropy_chunk_rows(V), T));
  std::vector<float> logits(static_cast<size_t>(chunk * V)), hc(static_cast<size_t>(chunk * H));
  double total = 0.0;
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int64_t n = std::min(chunk, T - c0);
    ref::gemm(false, true, n, V, H, sh * sw, h.data() + c0 * H, w.data(), 0.0f, logits.data());
    std::vector<double> row_loss(static_cast<size_t>(n));
    parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = logits.data() + r * V;
        const int32_t tgt = tg[c0 + r];
        if (tgt == ref::kIgnoreIndex) {
          std::fill(row, row + V, 0.0f);
          continue;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
        const double lse = mx + std::log(sum);
        row_loss[static_cast<size_t>(r)] = lse - double(row[tgt]);
        for (int64_t v = 0; v < V; ++v) {
          const float d = float(std::exp(double(row[v]) - lse)) - (v == tgt ? 1.0f : 0.0f);
          row[v] = fp8_e5m2_to_float(float_to_fp8_e5m2(d * kCodeScale));
        }
      }
    });
    for (int64_t r = 0; r < n; ++r) {
      total += row_loss[static_cast<size_t>(r)];
      if (want_tl) token_loss.ptr<float>()[c0 + r] = float(row_loss[static_cast<size_t>(r)]);
    }
    if (want_dh)  // dh = dl W, W [V, H] read from wq_t [H, V]
      ref::gemm(false, true, n, H, V, dl_scale * sw, logits.data(), wt.data(), 0.0f, dhidden.ptr<float>() + c0 * H);
    if (want_dw) {  // dw += dl^T h, h's chunk read from hq_t [H, Tp]
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < H; ++k) hc[static_cast<size_t>(t * H + k)] = ht[static_cast<size_t>(k * Tp + c0 + t)];
      ref::gemm(true, false, V, H, n, dl_scale * sh, logits.data(), hc.data(), 1.0f, dw.ptr<float>());
    }
  }
  *loss_sum.ptr<double>() = total;
}

}  // namespace qt
