// CPU reference: GEMM, linear, embedding, (1+w) RMSNorm, SwiGLU, and CpuBackend's memory ops.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp8.h"
#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_check.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/reference_ops.h"
#include "ops/dropout_hash.h"

namespace qt {
namespace ref {

using detail::rows_with_column_sums;
using detail::sigmoid;
using detail::silu;
using detail::silu_grad;

// ---- GEMM ----------------------------------------------------------------------------------------

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
          float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS would scale C by beta; do the same without calling it with empty operands
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    return;
  }
  QT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "gemm: dims [", M, ", ", N, ", ", K,
           "] exceed the BLAS int range");
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, A, trans_a ? m : k, B, trans_b ? k : n, beta, C, n);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          const double* B, double beta, double* C) {
  parallel_for(M, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < K; ++p) {
          const double a = trans_a ? A[p * M + i] : A[i * K + p];
          const double b = trans_b ? B[j * K + p] : B[p * N + j];
          acc += a * b;
        }
        double& c = C[i * N + j];
        c = alpha * acc + (beta == 0.0 ? 0.0 : beta * c);
      }
    }
  });
}

// ---- linear --------------------------------------------------------------------------------------

template <typename S>
void linear_forward(S* y, const S* x, const S* w, int64_t T, int64_t N, int64_t K) {
  gemm(false, true, T, N, K, S(1), x, w, S(0), y);  // y = x w^T
}

template <typename S>
void linear_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, int64_t T, int64_t N, int64_t K,
                     bool accumulate_dx, bool accumulate_dw) {
  if (dx != nullptr) gemm(false, false, T, K, N, S(1), dy, w, accumulate_dx ? S(1) : S(0), dx);  // dy w
  if (dw != nullptr) gemm(true, false, N, K, T, S(1), dy, x, accumulate_dw ? S(1) : S(0), dw);   // dy^T x
}

template <typename S>
void lora_forward(S* y, S* t, const S* x, const S* a, const S* b, int64_t T, int64_t N, int64_t K, int64_t r, S scale) {
  gemm(false, true, T, r, K, scale, x, a, S(0), t);  // t = s x A^T
  gemm(false, true, T, N, r, S(1), t, b, S(1), y);   // y += t B^T
}

template <typename S>
void lora_backward(S* dx, S* da, S* db, S* dt, const S* dy, const S* x, const S* t, const S* a, const S* b, int64_t T,
                   int64_t N, int64_t K, int64_t r, S scale, bool accumulate_dw) {
  const S beta = accumulate_dw ? S(1) : S(0);
  gemm(true, false, N, r, T, S(1), dy, t, beta, db);    // dB = dy^T t
  gemm(false, false, T, r, N, scale, dy, b, S(0), dt);  // dt = s dy B
  gemm(true, false, r, K, T, S(1), dt, x, beta, da);    // dA = dt^T x
  if (dx != nullptr) gemm(false, false, T, K, r, S(1), dt, a, S(1), dx);  // dx += dt A
}

// ---- embedding -----------------------------------------------------------------------------------

template <typename S>
void embedding_forward(S* out, const S* table, const int32_t* ids, int64_t T, int64_t H) {
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) std::memcpy(out + t * H, table + int64_t{ids[t]} * H, sizeof(S) * H);
  });
}

template <typename S>
void embedding_backward(S* dtable, const S* dout, const int32_t* ids, int64_t T, int64_t H) {
  // Parallel over hidden columns, tokens in order: repeated ids accumulate deterministically.
  parallel_for(H, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      S* row = dtable + int64_t{ids[t]} * H;
      const S* src = dout + t * H;
      for (int64_t c = c0; c < c1; ++c) row[c] += src[c];
    }
  }, 64);
}

// ---- (1+w) RMSNorm -------------------------------------------------------------------------------

template <typename S>
void rmsnorm_forward(S* y, S* rstd, const S* x, const S* w, int64_t rows, int64_t cols, double eps) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const S* xr = x + r * cols;
      S ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
      const S rs = S(1) / std::sqrt(ss / S(cols) + S(eps));
      rstd[r] = rs;
      for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = xr[c] * rs * (S(1) + w[c]);
    }
  });
}

template <typename S>
void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const S* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx) {
  // n = x rstd, dn = dy (1+w): dx = rstd (dn - n mean(n dn)); dw = sum_rows dy n.
  rows_with_column_sums<S>(rows, cols, dw, [&](int64_t r, S* dw_part) {
    const S* xr = x + r * cols;
    const S* dyr = dy + r * cols;
    const S rs = rstd[r];
    if (dx != nullptr) {
      S dot = 0;
      for (int64_t c = 0; c < cols; ++c) dot += (xr[c] * rs) * (dyr[c] * (S(1) + w[c]));
      const S mean = dot / S(cols);
      S* dxr = dx + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const S v = rs * (dyr[c] * (S(1) + w[c]) - xr[c] * rs * mean);
        dxr[c] = accumulate_dx ? dxr[c] + v : v;
      }
    }
    if (dw != nullptr)
      for (int64_t c = 0; c < cols; ++c) dw_part[c] += dyr[c] * xr[c] * rs;
  });
}

// ---- SwiGLU --------------------------------------------------------------------------------------

template <typename S>
void swiglu_forward(S* h, const S* gate, const S* up, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) h[i] = silu(gate[i]) * up[i];
  }, 4096);
}

template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dh, const S* gate, const S* up, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      dgate[i] = dh[i] * up[i] * silu_grad(gate[i]);
      dup[i] = dh[i] * silu(gate[i]);
    }
  }, 4096);
}

QT_REF_INSTANTIATE(linear_forward);
QT_REF_INSTANTIATE(linear_backward);
QT_REF_INSTANTIATE(lora_forward);
QT_REF_INSTANTIATE(lora_backward);
QT_REF_INSTANTIATE(embedding_forward);
QT_REF_INSTANTIATE(embedding_backward);
QT_REF_INSTANTIATE(rmsnorm_forward);
QT_REF_INSTANTIATE(rmsnorm_backward);
QT_REF_INSTANTIATE(swiglu_forward);
QT_REF_INSTANTIATE(swiglu_backward);

}  // namespace ref

// ---- CpuBackend: memory --------------------------------------------------------------------------

using cpu::check_optional;
using cpu::check_storage;
using cpu::check_tensor;
using cpu::dim_of;
constexpr DType F32 = DType::F32;

CpuBackend::CpuBackend() { openblas_set_num_threads(1); }

Tensor CpuBackend::alloc(DType dtype, const Shape& shape) {
  allocations_.push_back(std::make_unique<HostTensor>(dtype, shape));  // HostBuffer zero-fills
  return allocations_.back()->t;
}

void* CpuBackend::alloc_host(size_t bytes) {
  host_blocks_.push_back(std::make_unique<char[]>(std::max<size_t>(bytes, 1)));  // value-initialized: zeros
  return host_blocks_.back().get();
}

void CpuBackend::zero(const Tensor& t) {
  QT_CHECK(t.data != nullptr || t.numel() == 0, "zero: tensor is missing (data is null)");
  QT_CHECK(t.is_contiguous(), "zero: tensor ", t.describe(), " is not contiguous");
  if (t.numel() > 0) std::memset(t.data, 0, t.nbytes());
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  check_storage("copy", "dst", dst, dst.dtype);
  check_storage("copy", "src", src, dst.dtype);
  QT_CHECK(dst.numel() == src.numel(), "copy: dst is ", dst.describe(), " but src is ", src.describe(),
           " (element counts differ)");
  if (dst.nbytes() > 0 && dst.data != src.data) std::memmove(dst.data, src.data, dst.nbytes());
}

void CpuBackend::copy_from_host(const Tensor& dst, const void* src) {
  check_storage("copy_from_host", "dst", dst, dst.dtype);
  QT_CHECK(src != nullptr || dst.nbytes() == 0, "copy_from_host: src is null");
  if (dst.nbytes() > 0) std::memcpy(dst.data, src, dst.nbytes());
}

void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
  check_storage("copy_to_host", "src", src, src.dtype);
  QT_CHECK(dst != nullptr || src.nbytes() == 0, "copy_to_host: dst is null");
  if (src.nbytes() > 0) std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_storage("add", "a", a, F32);
  const Shape s = a.shape_vec();
  check_tensor("add", "b", b, F32, s);
  check_tensor("add", "out", out, F32, s);
  const float* pa = a.ptr<float>();
  const float* pb = b.ptr<float>();
  float* po = out.ptr<float>();
  parallel_for(a.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) po[i] = pa[i] + pb[i];
  }, 4096);
}

// ---- CpuBackend: dense ---------------------------------------------------------------------------

void CpuBackend::linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) {
  const auto [T, N, K] = ops::check_linear("linear_forward", w, x, "y", y, F32, DeviceKind::CPU);
  ref::linear_forward(y.ptr<float>(), x.ptr<float>(), w.ptr<float>(), T, N, K);
}

// The fp32 reference of the fp8 ops: the same codes as the device (core/fp8.h), then an fp32 GEMM of
// the decoded values (every fp8 x fp8 product is exact in fp32).
// An op's amax output (ops/backend_ops.def): *amax = max(*amax, max|v|), NaN above everything (the
// device's order of magnitude bits).
namespace {
void fold_amax(const Tensor& amax, const float* v, int64_t n) {
  if (amax.data == nullptr) return;
  float& a = *amax.ptr<float>();
  for (int64_t i = 0; i < n && !std::isnan(a); ++i) {
    const float m = std::fabs(v[i]);
    if (std::isnan(m) || m > a) a = m;
  }
}
}  // namespace

void CpuBackend::quantize_fp8(const Tensor& q, const Tensor& q_t, const Tensor& scale_inv, const Tensor& x,
                              const Tensor& amax_in) {
  const int64_t n = ops::check_quantize_fp8("quantize_fp8", q, q_t, scale_inv, x, amax_in, F32, DeviceKind::CPU);
  const float* in = x.ptr<float>();
  float amax = 0.0f;
  if (amax_in.data != nullptr) {  // folded in by x's producer; reset for its next one
    amax = *amax_in.ptr<float>();
    *amax_in.ptr<float>() = 0.0f;
  } else {
    fold_amax(Tensor(&amax, DType::F32, {1}), in, n);
  }
  const float s = fp8_scale_for_amax(amax);
  if (q.data != nullptr) {
    uint8_t* out = static_cast<uint8_t*>(q.data);
    parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = float_to_fp8_e4m3(in[i] * s);
    }, 1 << 14);
  }
  if (q_t.data != nullptr) {
    const int64_t R = x.size(0), C = x.size(1), Rp = q_t.size(1);  // padding columns: zero codes
    uint8_t* out = static_cast<uint8_t*>(q_t.data);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < Rp; ++r) out[c * Rp + r] = r < R ? float_to_fp8_e4m3(in[r * C + c] * s) : 0;
  }
  *scale_inv.ptr<float>() = 1.0f / s;
}

void CpuBackend::linear_fp8(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                            const Tensor& w_scale_inv, bool accumulate, bool /*fast_accum: fp32 here always*/) {
  const auto [T, N, K] = ops::check_linear_fp8("linear_fp8", y, xq, x_scale_inv, wq, w_scale_inv, DeviceKind::CPU);
  check_storage("linear_fp8", "y", y, F32);
  std::vector<float> xf(size_t(T * K)), wf(size_t(N * K));
  const uint8_t* xb = static_cast<const uint8_t*>(xq.data);
  const uint8_t* wb = static_cast<const uint8_t*>(wq.data);
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = fp8_e4m3_to_float(xb[i]);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = fp8_e4m3_to_float(wb[i]);
  const float scale = *x_scale_inv.ptr<float>() * *w_scale_inv.ptr<float>();
  ref::gemm(false, true, T, N, K, scale, xf.data(), wf.data(), accumulate ? 1.0f : 0.0f, y.ptr<float>());
}

void CpuBackend::dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) {
  const int64_t n = ops::check_dropout(out, x, d, F32, DeviceKind::CPU);
  const int32_t* sw = d.seed.ptr<int32_t>();
  const uint64_t seed = (uint64_t(uint32_t(sw[1])) << 32) | uint32_t(sw[0]);
  const uint32_t th = dropout_threshold(d.p);
  const float scale = float(1.0 / (1.0 - d.p));
  float* o = out.ptr<float>();
  const float* in = x.ptr<float>();
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = dropout_keep(seed, d.stream, uint64_t(i), th) ? in[i] * scale : 0.0f;
      o[i] = accumulate ? o[i] + v : v;
    }
  }, 1 << 14);
}

void CpuBackend::lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) {
  const auto [T, N, K, r] = ops::check_lora("lora_forward", y, t, x, lora, F32, DeviceKind::CPU);
  ref::lora_forward(y.ptr<float>(), t.ptr<float>(), x.ptr<float>(), lora.a.ptr<float>(), lora.b.ptr<float>(), T, N, K, r,
                    float(lora.scale));
}

void CpuBackend::lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy,
                               const Tensor& x, const Tensor& t, const LoraArgs& lora) {
  const char* op = "lora_backward";
  const auto [T, N, K, r] = ops::check_lora(op, dy, t, x, lora, F32, DeviceKind::CPU);
  check_tensor(op, "dt", dt, F32, {T, r});
  const bool want_dx = check_optional(op, "dx", dx, F32, {T, K});
  check_tensor(op, "dA", grads.da, F32, {r, K});
  check_tensor(op, "dB", grads.db, F32, {N, r});
  ref::lora_backward(want_dx ? dx.ptr<float>() : nullptr, grads.da.ptr<float>(), grads.db.ptr<float>(), dt.ptr<float>(),
                     dy.ptr<float>(), x.ptr<float>(), t.ptr<float>(), lora.a.ptr<float>(), lora.b.ptr<float>(), T, N, K, r,
                     float(lora.scale), grads.accumulate);
}

void CpuBackend::linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                 const Tensor& w, bool accumulate_dx, bool accumulate_dw) {
  const char* op = "linear_backward";
  const auto [T, N, K] = ops::check_linear(op, w, x, "dy", dy, F32, DeviceKind::CPU);
  const bool want_dx = check_optional(op, "dx", dx, F32, {T, K});
  const bool want_dw = check_optional(op, "dw", dw, F32, {N, K});
  ref::linear_backward(want_dx ? dx.ptr<float>() : nullptr, want_dw ? dw.ptr<float>() : nullptr, dy.ptr<float>(),
                       x.ptr<float>(), w.ptr<float>(), T, N, K, accumulate_dx, accumulate_dw);
}

namespace {
void check_ids(const char* op, const Tensor& ids, int64_t V) {
  const int32_t* p = ids.ptr<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t)
    QT_CHECK(p[t] >= 0 && p[t] < V, op, ": ids[", t, "] = ", p[t], " is outside the table [0, ", V, ")");
}
}  // namespace

void CpuBackend::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const char* op = "embedding_forward";
  QT_CHECK(table.ndim == 2, op, ": table is ", table.describe(), ", expected 2 dims [V, H]");
  const int64_t V = table.size(0), H = table.size(1), T = dim_of(op, "ids", ids, 0);
  check_tensor(op, "table", table, F32, {V, H});
  check_tensor(op, "ids", ids, DType::I32, {T});
  check_tensor(op, "out", out, F32, {T, H});
  check_ids(op, ids, V);
  ref::embedding_forward(out.ptr<float>(), table.ptr<float>(), ids.ptr<int32_t>(), T, H);
}

void CpuBackend::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const char* op = "embedding_backward";
  QT_CHECK(dtable.ndim == 2, op, ": dtable is ", dtable.describe(), ", expected 2 dims [V, H]");
  const int64_t V = dtable.size(0), H = dtable.size(1), T = dim_of(op, "ids", ids, 0);
  check_tensor(op, "dtable", dtable, F32, {V, H});
  check_tensor(op, "ids", ids, DType::I32, {T});
  check_tensor(op, "dout", dout, F32, {T, H});
  check_ids(op, ids, V);
  ref::embedding_backward(dtable.ptr<float>(), dout.ptr<float>(), ids.ptr<int32_t>(), T, H);
}

void CpuBackend::rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps,
                                 const Tensor& amax_y) {
  const auto [rows, cols] = ops::check_norm("rmsnorm_forward", w, x, {{"y", &y}}, rstd, F32, DeviceKind::CPU);
  ops::check_amax("rmsnorm_forward", "amax_y", amax_y, DeviceKind::CPU);
  ref::rmsnorm_forward(y.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), w.ptr<float>(), rows, cols, eps);
  fold_amax(amax_y, y.ptr<float>(), y.numel());
}

void CpuBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                  const Tensor& w, const Tensor& rstd, bool accumulate_dx, const Tensor& amax_dx) {
  const char* op = "rmsnorm_backward";
  const auto [rows, cols] = ops::check_norm(op, w, x, {{"dy", &dy}}, rstd, F32, DeviceKind::CPU);
  const bool want_dx = check_optional(op, "dx", dx, F32, x.shape_vec());
  QT_CHECK(!ops::check_amax(op, "amax_dx", amax_dx, DeviceKind::CPU) || want_dx, op, ": amax_dx given without dx");
  const bool want_dw = check_optional(op, "dw", dw, F32, {cols});
  ref::rmsnorm_backward(want_dx ? dx.ptr<float>() : nullptr, want_dw ? dw.ptr<float>() : nullptr, dy.ptr<float>(),
                        x.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(), rows, cols, accumulate_dx);
  if (want_dx) fold_amax(amax_dx, dx.ptr<float>(), dx.numel());
}

void CpuBackend::swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up, const Tensor& amax_h) {
  ops::check_same_shape("swiglu_forward", F32, DeviceKind::CPU, {{"gate", &gate}, {"up", &up}, {"h", &h}});
  ops::check_amax("swiglu_forward", "amax_h", amax_h, DeviceKind::CPU);
  ref::swiglu_forward(h.ptr<float>(), gate.ptr<float>(), up.ptr<float>(), gate.numel());
  fold_amax(amax_h, h.ptr<float>(), h.numel());
}

void CpuBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                                 const Tensor& up, const Tensor& amax_dgate, const Tensor& amax_dup) {
  const char* op = "swiglu_backward";
  ops::check_same_shape(op, F32, DeviceKind::CPU,
                        {{"gate", &gate}, {"up", &up}, {"dh", &dh}, {"dgate", &dgate}, {"dup", &dup}});
  ops::check_amax(op, "amax_dgate", amax_dgate, DeviceKind::CPU);
  ops::check_amax(op, "amax_dup", amax_dup, DeviceKind::CPU);
  ref::swiglu_backward(dgate.ptr<float>(), dup.ptr<float>(), dh.ptr<float>(), gate.ptr<float>(), up.ptr<float>(),
                       gate.numel());
  fold_amax(amax_dgate, dgate.ptr<float>(), dgate.numel());
  fold_amax(amax_dup, dup.ptr<float>(), dup.numel());
}

}  // namespace qt
