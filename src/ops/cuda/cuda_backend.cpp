// CudaBackend: validation at the API boundary and the entry points that call the GEMM runner
// (cuda_gemm.h), the launchers of ops_launch.h (own kernels), kernels.h (attention) and gdn/gdn.h (GDN).
#include "ops/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/ops_launch.h"
#include "ops/op_check.h"

namespace qt {

namespace {

constexpr DType BF16 = DType::BF16;
constexpr DType F32 = DType::F32;
constexpr DType I32 = DType::I32;
constexpr size_t kAlign = cuda::DeviceArena::kAlign;

void check_storage(const char* op, const char* name, const Tensor& t, DType dtype) {
  ops::check_storage(op, name, t, dtype, DeviceKind::CUDA);
}
void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  ops::check_tensor(op, name, t, dtype, expected, DeviceKind::CUDA);
}
bool check_optional(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& expected) {
  return ops::check_optional(op, name, t, dtype, expected, DeviceKind::CUDA);
}
using ops::dim_of;

// A weight-gradient ("acc") output: bf16 or f32. Returns whether it is f32.
bool check_grad(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  QT_CHECK(t.dtype == BF16 || t.dtype == F32, op, ": ", name, " is ", t.describe(), ", expected bf16 or f32");
  check_tensor(op, name, t, t.dtype, expected);
  return t.dtype == F32;
}

// Device cu_seqlens: shape, dtype and the host-side counts (contents are not read back: that
// would synchronize; the packer validates them on the host).
void check_seqs(const char* op, const SeqInfo& seqs, int64_t T) {
  QT_CHECK(seqs.num_seqs >= 1, op, ": seqs.num_seqs is ", seqs.num_seqs, ", expected >= 1");
  check_tensor(op, "seqs.cu_seqlens", seqs.cu_seqlens, I32, {seqs.num_seqs + 1});
  QT_CHECK(seqs.total_tokens == T, op, ": seqs.total_tokens is ", seqs.total_tokens, ", expected T = ", T);
  QT_CHECK(seqs.max_seqlen >= 0 && seqs.max_seqlen <= T, op, ": seqs.max_seqlen is ", seqs.max_seqlen,
           ", expected in [0, T = ", T, "]");
}

void conv_weight_dims(const char* op, const Tensor& w, int64_t* C, int64_t* K) {
  QT_CHECK(w.ndim == 2 || (w.ndim == 3 && w.shape[1] == 1), op, ": w is ", w.describe(), ", expected [C, K]");
  *C = w.shape[0];
  *K = w.shape[static_cast<size_t>(w.ndim - 1)];
  QT_CHECK(*K == 4, op, ": w is ", w.describe(), ", the CUDA conv1d supports kernel width 4 only");
}

// The GDN kernels' limits on top of ops::check_gdn_dims (which the shared argument checks run).
void check_gdn_kernel_dims(const char* op, const GdnDims& d) {
  ops::check_gdn_dims(op, d);
  QT_CHECK(d.k_head_dim % 16 == 0 && d.k_head_dim > 0 && d.k_head_dim <= 128 && d.v_head_dim % 16 == 0 &&
               d.v_head_dim > 0 && d.v_head_dim <= 128,
           op, ": head dims dk ", d.k_head_dim, ", dv ", d.v_head_dim,
           " must be multiples of 16 in [16, 128] for the CUDA kernel");
}

// The attention kernels' head dims on top of ops::check_attention_* (which the shared checks run).
void check_attn_kernel_dims(const char* op, const AttnDims& d) {
  QT_CHECK(d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256, op, ": head_dim ", d.head_dim,
           " is not supported by the CUDA kernel (64, 128, 256)");
}

}  // namespace

// ---- lifetime and memory ---------------------------------------------------------------------

namespace {
// The options first (a bad setting fails before anything is acquired, also on a machine without a
// GPU), then the device: the arena and the GEMM runner allocate on it.
int select_device(const BackendOptions& o) {
  QT_CHECK(o.gemm_candidates >= 1 && o.gemm_candidates <= cuda::GemmRunner::kMaxCandidates,
           "train.cuda.gemm_candidates is ", o.gemm_candidates, ": expected an integer from 1 to ",
           cuda::GemmRunner::kMaxCandidates);
  QT_CHECK(o.arena_mib >= 16, "train.cuda.arena_mib is ", o.arena_mib, ": expected at least 16 (MiB)");
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  const int device = o.share_devices && count > 0 ? o.device % count : o.device;
  QT_CHECK(device >= 0 && device < count, "CudaBackend: device ", device, " does not exist (", count, " found)");
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}
}  // namespace

CudaBackend::CudaBackend(const BackendOptions& o)
    : device_(select_device(o)),
      arena_(static_cast<size_t>(o.arena_mib) << 20),
      gemm_(o.gemm_candidates, o.gemm_tune),
      deterministic_attention_(o.deterministic) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  alloc_scalars();
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cudaFree(ws_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::alloc(DType dtype, const Shape& shape) {
  Tensor probe(nullptr, dtype, shape);
  if (probe.nbytes() == 0) return Tensor(nullptr, dtype, shape, device());
  return Tensor(arena_.alloc(probe.nbytes(), stream_), dtype, shape, device());
}

void* CudaBackend::alloc_host(size_t bytes) { return arena_.alloc_host(bytes); }

void CudaBackend::reset_arena() {
  synchronize();
  arena_.reset();
  alloc_scalars();
}

// The backend's own device words from the arena: the loss sum, and quantize_fp8's amax word and
// block counter (zero between quantizes: each cast leaves them so).
void CudaBackend::alloc_scalars() {
  d_scalar_ = static_cast<double*>(alloc(DType::F64, {1}).data);
  fp8_words_ = static_cast<unsigned*>(alloc(DType::I32, {2}).data);
  CUDA_CHECK(cudaMemsetAsync(fp8_words_, 0, 2 * sizeof(unsigned), stream_));
  fp8_one_ = static_cast<float*>(alloc(DType::F32, {1}).data);
  static const float kOne = 1.0f;
  CUDA_CHECK(cudaMemcpyAsync(fp8_one_, &kOne, sizeof(float), cudaMemcpyHostToDevice, stream_));
  synchronize();  // kOne's copy (pageable) has been taken before anything else runs
}

size_t CudaBackend::arena_bytes_reserved() const { return arena_.reserved_bytes(); }

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void* CudaBackend::workspace(size_t bytes) {
  if (bytes <= ws_bytes_) return ws_;
  QT_CHECK(!capturing(), "CudaBackend: the workspace must grow to ", bytes,
           " bytes during CUDA-graph capture; run the step once eagerly before capturing");
  synchronize();
  CUDA_CHECK(cudaFree(ws_));
  ws_ = nullptr;
  const size_t grown = std::max(bytes, ws_bytes_ + ws_bytes_ / 2);
  CUDA_CHECK(cudaMalloc(&ws_, grown));
  ws_bytes_ = grown;
  ++ws_generation_;
  return ws_;
}

void CudaBackend::zero(const Tensor& t) {
  QT_CHECK(t.data != nullptr || t.numel() == 0, "zero: tensor is missing (data is null)");
  QT_CHECK(t.device.kind == DeviceKind::CUDA, "zero: tensor ", t.describe(), " is not on the CUDA device");
  QT_CHECK(t.is_contiguous(), "zero: tensor ", t.describe(), " is not contiguous");
  if (t.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_));
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  check_storage("copy", "dst", dst, dst.dtype);
  check_storage("copy", "src", src, dst.dtype);
  QT_CHECK(dst.numel() == src.numel(), "copy: dst is ", dst.describe(), " but src is ", src.describe(),
           " (element counts differ)");
  if (dst.nbytes() > 0 && dst.data != src.data)
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_from_host(const Tensor& dst, const void* src) {
  check_storage("copy_from_host", "dst", dst, dst.dtype);
  QT_CHECK(src != nullptr || dst.nbytes() == 0, "copy_from_host: src is null");
  if (dst.nbytes() > 0) CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::copy_to_host(void* dst, const Tensor& src) {
  check_storage("copy_to_host", "src", src, src.dtype);
  QT_CHECK(dst != nullptr || src.nbytes() == 0, "copy_to_host: dst is null");
  if (src.nbytes() == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

int64_t CudaBackend::free_memory_bytes() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

void CudaBackend::copy_to_host_async(void* dst, const Tensor& src) {
  check_storage("copy_to_host_async", "src", src, src.dtype);
  QT_CHECK(dst != nullptr || src.nbytes() == 0, "copy_to_host_async: dst is null");
  if (src.nbytes() > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const DType t = a.dtype == F32 ? F32 : BF16;  // bf16 activations, or fp32 gradient sums
  check_storage("add", "a", a, t);
  const Shape s = a.shape_vec();
  check_tensor("add", "b", b, t, s);
  check_tensor("add", "out", out, t, s);
  if (t == F32) cuda::launch_add_f32(out.ptr<float>(), a.ptr<float>(), b.ptr<float>(), a.numel(), stream_);
  else cuda::launch_add(out.data, a.data, b.data, a.numel(), stream_);
}

// ---- GEMM (cuBLASLt) --------------------------------------------------------------------------

void CudaBackend::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                       const void* B, int64_t ldb, void* C, int64_t ldc, bool c_f32, float beta, float alpha) {
  gemm_.run({trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, c_f32, beta, alpha}, stream_, capturing());
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream_, &cs));
  return cs != cudaStreamCaptureStatusNone;
}

void CudaBackend::linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) {
  const auto [T, N, K] = ops::check_linear("linear_forward", w, x, "y", y, BF16, DeviceKind::CUDA);
  gemm(false, true, T, N, K, x.data, K, w.data, K, y.data, N, false, 0.0f);
}

void CudaBackend::linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                  const Tensor& w, bool accumulate_dx, bool accumulate_dw) {
  const char* op = "linear_backward";
  const auto [T, N, K] = ops::check_linear(op, w, x, "dy", dy, BF16, DeviceKind::CUDA);
  if (check_optional(op, "dx", dx, BF16, {T, K}))
    gemm(false, false, T, K, N, dy.data, N, w.data, K, dx.data, K, false, accumulate_dx ? 1.0f : 0.0f);
  if (dw.data != nullptr) {
    const bool f32 = check_grad(op, "dw", dw, {N, K});
    gemm(true, false, N, K, T, dy.data, N, x.data, K, dw.data, K, f32, accumulate_dw ? 1.0f : 0.0f);
  }
}

void CudaBackend::quantize_fp8(const Tensor& q, const Tensor& q_t, const Tensor& scale_inv, const Tensor& x,
                               const Tensor& amax) {
  const int64_t n = ops::check_quantize_fp8("quantize_fp8", q, q_t, scale_inv, x, amax, BF16, DeviceKind::CUDA);
  if (n == 0) return;
  const int64_t rows = q_t.data != nullptr ? x.size(0) : 1;
  const int64_t rows_pad = q_t.data != nullptr ? q_t.size(1) : 1;
  cuda::launch_quantize_fp8({q.data, q_t.data, scale_inv.ptr<float>(), x.data, n, rows, n / rows, rows_pad,
                             static_cast<unsigned*>(amax.data), fp8_words_, fp8_words_ + 1},
                            stream_);
}

void CudaBackend::linear_fp8(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                             const Tensor& w_scale_inv, bool accumulate, bool fast_accum) {
  const auto [T, N, K] = ops::check_linear_fp8("linear_fp8", y, xq, x_scale_inv, wq, w_scale_inv, DeviceKind::CUDA);
  const bool y_f32 = check_grad("linear_fp8", "y", y, {T, N});
  cuda::GemmCall g{false, true, T, N, K, xq.data, K, wq.data, K, y.data, N, y_f32, accumulate ? 1.0f : 0.0f, 1.0f};
  g.fp8 = true;
  g.fast_accum = fast_accum;
  g.a_scale = x_scale_inv.ptr<float>();
  g.b_scale = w_scale_inv.ptr<float>();
  gemm_.run(g, stream_, capturing());
}

void CudaBackend::dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) {
  const int64_t n = ops::check_dropout(out, x, d, BF16, DeviceKind::CUDA);
  cuda::launch_dropout(out.data, x.data, d.seed.ptr<int32_t>(), n, d.stream, d.p, accumulate, stream_);
}

// LoRA: four small GEMMs around the frozen projection's (r is 8-64, so each is a thin product);
// scale rides on cuBLASLt's alpha.
void CudaBackend::lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) {
  const auto [T, N, K, r] = ops::check_lora("lora_forward", y, t, x, lora, BF16, DeviceKind::CUDA);
  gemm(false, true, T, r, K, x.data, K, lora.a.data, K, t.data, r, false, 0.0f, float(lora.scale));  // t = s x A^T
  gemm(false, true, T, N, r, t.data, r, lora.b.data, r, y.data, N, false, 1.0f);                     // y += t B^T
}

void CudaBackend::lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy,
                                const Tensor& x, const Tensor& t, const LoraArgs& lora) {
  const char* op = "lora_backward";
  const auto [T, N, K, r] = ops::check_lora(op, dy, t, x, lora, BF16, DeviceKind::CUDA);
  check_tensor(op, "dt", dt, BF16, {T, r});
  const bool want_dx = check_optional(op, "dx", dx, BF16, {T, K});
  const bool da_f32 = check_grad(op, "dA", grads.da, {r, K}), db_f32 = check_grad(op, "dB", grads.db, {N, r});
  const float beta = grads.accumulate ? 1.0f : 0.0f;
  gemm(true, false, N, r, T, dy.data, N, t.data, r, grads.db.data, r, db_f32, beta);                  // dB = dy^T t
  gemm(false, false, T, r, N, dy.data, N, lora.b.data, r, dt.data, r, false, 0.0f, float(lora.scale));  // dt = s dy B
  gemm(true, false, r, K, T, dt.data, r, x.data, K, grads.da.data, K, da_f32, beta);                  // dA = dt^T x
  if (want_dx) gemm(false, false, T, K, r, dt.data, r, lora.a.data, K, dx.data, K, false, 1.0f);     // dx += dt A
}

// ---- embedding, norms, pointwise ---------------------------------------------------------------

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const char* op = "embedding_forward";
  QT_CHECK(table.ndim == 2, op, ": table is ", table.describe(), ", expected 2 dims [V, H]");
  const int64_t V = table.size(0), H = table.size(1), T = dim_of(op, "ids", ids, 0);
  check_tensor(op, "table", table, BF16, {V, H});
  check_tensor(op, "ids", ids, I32, {T});
  check_tensor(op, "out", out, BF16, {T, H});
  cuda::launch_embedding_forward(out.data, table.data, ids.ptr<int32_t>(), T, H, V, stream_);
}

void CudaBackend::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const char* op = "embedding_backward";
  QT_CHECK(dtable.ndim == 2, op, ": dtable is ", dtable.describe(), ", expected 2 dims [V, H]");
  const int64_t V = dtable.size(0), H = dtable.size(1), T = dim_of(op, "ids", ids, 0);
  const bool f32 = check_grad(op, "dtable", dtable, {V, H});
  check_tensor(op, "ids", ids, I32, {T});
  check_tensor(op, "dout", dout, BF16, {T, H});
  QT_CHECK(T < (int64_t(1) << 31), op, ": T = ", T, " exceeds the sort's int range");
  const size_t bytes = cuda::embedding_backward_workspace_bytes(T);
  void* ws = workspace(bytes);
  cuda::launch_embedding_backward(dtable.data, f32, dout.data, ids.ptr<int32_t>(), T, H, V, ws, bytes, stream_);
}

void CudaBackend::rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps,
                                  const Tensor& amax_y) {
  const auto [rows, cols] = ops::check_norm("rmsnorm_forward", w, x, {{"y", &y}}, rstd, BF16, DeviceKind::CUDA);
  ops::check_amax("rmsnorm_forward", "amax_y", amax_y, DeviceKind::CUDA);
  cuda::launch_rmsnorm_forward(y.data, rstd.ptr<float>(), x.data, nullptr, w.data, rows, cols, float(eps),
                               cuda::NormKind::OnePlusW, amax_y.ptr<float>(), stream_);
}

void CudaBackend::add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x,
                                      const Tensor& r, const Tensor& w, double eps, const Tensor& amax_y) {
  const auto [rows, cols] =
      ops::check_norm("add_rmsnorm_forward", w, x, {{"r", &r}, {"h", &h}, {"y", &y}}, rstd, BF16, DeviceKind::CUDA);
  ops::check_amax("add_rmsnorm_forward", "amax_y", amax_y, DeviceKind::CUDA);
  if (cuda::launch_add_rmsnorm_forward(h.data, y.data, rstd.ptr<float>(), x.data, r.data, w.data, rows, cols,
                                       float(eps), amax_y.ptr<float>(), stream_))
    return;
  Backend::add_rmsnorm_forward(h, y, rstd, x, r, w, eps, amax_y);  // shapes outside the fused kernel
}

void CudaBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                   const Tensor& w, const Tensor& rstd, bool accumulate_dx, const Tensor& amax_dx) {
  const char* op = "rmsnorm_backward";
  const auto [rows, cols] = ops::check_norm(op, w, x, {{"dy", &dy}}, rstd, BF16, DeviceKind::CUDA);
  const bool want_dx = check_optional(op, "dx", dx, BF16, x.shape_vec());
  QT_CHECK(!ops::check_amax(op, "amax_dx", amax_dx, DeviceKind::CUDA) || want_dx, op, ": amax_dx given without dx");
  const bool want_dw = dw.data != nullptr;
  const bool f32 = want_dw && check_grad(op, "dw", dw, {cols});
  void* ws = want_dw ? workspace(cuda::rmsnorm_backward_workspace_bytes(rows, cols)) : nullptr;
  cuda::launch_rmsnorm_backward(want_dx ? dx.data : nullptr, accumulate_dx, nullptr, want_dw ? dw.data : nullptr, f32,
                                dy.data, x.data, nullptr, w.data, rstd.ptr<float>(), rows, cols,
                                cuda::NormKind::OnePlusW, ws, amax_dx.ptr<float>(), stream_);
}

void CudaBackend::swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up, const Tensor& amax_h) {
  ops::check_same_shape("swiglu_forward", BF16, DeviceKind::CUDA, {{"gate", &gate}, {"up", &up}, {"h", &h}});
  ops::check_amax("swiglu_forward", "amax_h", amax_h, DeviceKind::CUDA);
  cuda::launch_swiglu_forward(h.data, amax_h.ptr<float>(), gate.data, up.data, gate.numel(), stream_);
}

void CudaBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                                  const Tensor& up, const Tensor& amax_dgate, const Tensor& amax_dup) {
  const char* op = "swiglu_backward";
  ops::check_same_shape(op, BF16, DeviceKind::CUDA,
                        {{"gate", &gate}, {"up", &up}, {"dh", &dh}, {"dgate", &dgate}, {"dup", &dup}});
  ops::check_amax(op, "amax_dgate", amax_dgate, DeviceKind::CUDA);
  ops::check_amax(op, "amax_dup", amax_dup, DeviceKind::CUDA);
  cuda::launch_swiglu_backward(dgate.data, dup.data, amax_dgate.ptr<float>(), amax_dup.ptr<float>(), dh.data,
                               gate.data, up.data, gate.numel(), stream_);
}

// ---- Gated DeltaNet ----------------------------------------------------------------------------

void CudaBackend::conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) {
  const char* op = "conv1d_silu_forward";
  int64_t C = 0, K = 0;
  conv_weight_dims(op, w, &C, &K);
  check_storage(op, "w", w, BF16);
  const int64_t T = dim_of(op, "x", x, 0);
  check_tensor(op, "x", x, BF16, {T, C});
  check_tensor(op, "y", y, BF16, {T, C});
  check_seqs(op, seqs, T);
  cuda::launch_conv1d_silu_forward(y.data, x.data, w.data, seqs.cu_seqlens.ptr<int32_t>(), seqs.num_seqs, T, C,
                                   int(K), stream_);
}

void CudaBackend::conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                       const Tensor& w, const SeqInfo& seqs) {
  const char* op = "conv1d_silu_backward";
  int64_t C = 0, K = 0;
  conv_weight_dims(op, w, &C, &K);
  check_storage(op, "w", w, BF16);
  const int64_t T = dim_of(op, "x", x, 0);
  check_tensor(op, "x", x, BF16, {T, C});
  check_tensor(op, "dy", dy, BF16, {T, C});
  check_tensor(op, "dx", dx, BF16, {T, C});
  const bool want_dw = dw.data != nullptr;
  const bool f32 = want_dw && check_grad(op, "dw", dw, {C, K});
  check_seqs(op, seqs, T);
  void* ws = workspace(cuda::conv1d_silu_backward_workspace_bytes(T, C, int(K)));
  cuda::launch_conv1d_silu_backward(dx.data, want_dw ? dw.data : nullptr, f32, dy.data, x.data, w.data,
                                    seqs.cu_seqlens.ptr<int32_t>(), seqs.num_seqs, T, C, int(K), ws, stream_);
}

void CudaBackend::gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                                    const Tensor& a_log, const Tensor& dt_bias) {
  const auto [T, H] =
      ops::check_gdn_gates_forward("gdn_gates_forward", beta, g, b, a, a_log, dt_bias, BF16, DeviceKind::CUDA);
  cuda::launch_gdn_gates_forward(beta.ptr<float>(), g.ptr<float>(), b.data, a.data, a_log.data, dt_bias.data, T, H,
                                 stream_);
}

void CudaBackend::gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log,
                                     const Tensor& ddt_bias, const Tensor& dbeta, const Tensor& dg, const Tensor& b,
                                     const Tensor& a, const Tensor& a_log, const Tensor& dt_bias) {
  const char* op = "gdn_gates_backward";
  const auto [T, H] =
      ops::check_gdn_gates_backward(op, db, da, dbeta, dg, b, a, a_log, dt_bias, BF16, DeviceKind::CUDA);
  const bool want_alog = da_log.data != nullptr, want_dt = ddt_bias.data != nullptr;
  const bool alog_f32 = want_alog && check_grad(op, "da_log", da_log, {H});
  const bool dt_f32 = want_dt && check_grad(op, "ddt_bias", ddt_bias, {H});
  void* ws = workspace(cuda::gdn_gates_backward_workspace_bytes(T, H));
  cuda::launch_gdn_gates_backward(db.data, da.data, want_alog ? da_log.data : nullptr, alog_f32,
                                  want_dt ? ddt_bias.data : nullptr, dt_f32, dbeta.ptr<float>(), dg.ptr<float>(),
                                  b.data, a.data, a_log.data, dt_bias.data, T, H, ws, stream_);
}

namespace {
cuda::GdnArgs gdn_args(const GdnDims& d, const SeqInfo& s) {
  cuda::GdnArgs a{};
  a.cu_seqlens = s.cu_seqlens.ptr<int32_t>();
  a.num_seqs = s.num_seqs;
  a.max_seqlen = s.max_seqlen;
  a.total_tokens = s.total_tokens;
  a.num_k_heads = int(d.num_k_heads);
  a.num_v_heads = int(d.num_v_heads);
  a.k_head_dim = int(d.k_head_dim);
  a.v_head_dim = int(d.v_head_dim);
  a.split = true;      // long samples split across scan CTAs where the plan finds it faster
  a.mma_sync = false;  // the wgmma kernels at dk = dv = 128
  return a;
}
// The kernels' arguments, with the backend's choice of dQ (deterministic or by atomics).
cuda::AttnArgs attn_args(const AttnDims& d, const SeqInfo& s, bool deterministic) {
  cuda::AttnArgs a{};
  a.cu_seqlens = s.cu_seqlens.ptr<int32_t>();
  a.num_seqs = s.num_seqs;
  a.max_seqlen = s.max_seqlen;
  a.total_tokens = s.total_tokens;
  a.num_q_heads = int(d.num_q_heads);
  a.num_kv_heads = int(d.num_kv_heads);
  a.head_dim = int(d.head_dim);
  a.scale = float(1.0 / std::sqrt(double(d.head_dim)));
  a.mma_sync = false;  // head dim 256 on the wgmma kernels (the other head dims always run mma.sync)
  a.deterministic = deterministic;
  return a;
}
}  // namespace

namespace {
// The GDN args of any row of `tokens` tokens and at most `num_seqs` samples (the bounds a static
// shape plans by).
cuda::GdnArgs gdn_bound_args(const GdnDims& dims, int64_t tokens, int num_seqs) {
  SeqInfo bound;
  bound.num_seqs = num_seqs;
  bound.total_tokens = static_cast<int>(tokens);
  bound.max_seqlen = static_cast<int>(tokens);
  return gdn_args(dims, bound);
}
}  // namespace

int64_t CudaBackend::gdn_state_bytes(const GdnDims& dims, int64_t tokens, int num_seqs, GdnKeep keep) const {
  return static_cast<int64_t>(cuda::gdn_state_bytes(gdn_bound_args(dims, tokens, num_seqs), keep));
}

// The fp16 backward recomputing the chunk states matches the hi / lo one reading them (bench_gdn, a
// layer's forward + backward: 0.613 against 0.664 ms at 2B, 1.640 against 1.740 at 27B; qwentune
// bench even at 2b, +0.6 % at 4b, ~1 % slower on whole 8192-token rows; docs/gdn_kernels.md section 6).
bool CudaBackend::gdn_prefers_prep(const GdnDims& dims) const {
  return cuda::gdn_backward_fp16(static_cast<int>(dims.k_head_dim), static_cast<int>(dims.v_head_dim));
}

int CudaBackend::gdn_split_seqlen(const GdnDims& dims, int64_t tokens, int num_seqs) const {
  return cuda::gdn_split_min_seqlen(gdn_bound_args(dims, tokens, num_seqs));
}

namespace {
// The kept GDN state buffer: absent (recompute), or large enough for this call's shapes and `keep`.
void* gdn_state_ptr(const char* op, const Tensor& state, const cuda::GdnArgs& args, GdnKeep keep) {
  if (state.data == nullptr) return nullptr;
  const size_t need = cuda::gdn_state_bytes(args, keep);
  QT_CHECK(state.nbytes() >= need, op, ": state is ", state.describe(), " (", state.nbytes(), " bytes), needs ", need,
           " for ", args.total_tokens, " tokens in ", args.num_seqs, " samples (keeping ",
           keep == GdnKeep::Prep ? "prep's results" : "the chunk states", ")");
  return state.data;
}
// Workspace a GDN call needs: all of it, or without the state part when the caller keeps that.
size_t gdn_scratch_bytes(const cuda::GdnArgs& args, bool state_kept, GdnKeep keep) {
  return cuda::gdn_workspace_bytes(args) - (state_kept ? cuda::gdn_state_bytes(args, keep) : 0);
}
}  // namespace

void CudaBackend::gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                              const GdnDims& dims, const SeqInfo& seqs, const Tensor& state, GdnKeep keep) {
  const char* op = "gdn_forward";
  check_gdn_kernel_dims(op, dims);
  const int64_t T = ops::check_gdn_forward(op, dims, o, qkv, g, beta, BF16, DeviceKind::CUDA);
  check_seqs(op, seqs, T);
  if (T == 0) return;
  const cuda::GdnArgs args = gdn_args(dims, seqs);
  void* st = gdn_state_ptr(op, state, args, keep);
  void* ws = workspace(gdn_scratch_bytes(args, st != nullptr, keep));
  cuda::gdn_forward(o.data, qkv.data, g.ptr<float>(), beta.ptr<float>(), args, ws, stream_, st, keep);
  QT_LAUNCH_CHECK("gdn_forward");
}

void CudaBackend::gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o,
                               const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                               const SeqInfo& seqs, const Tensor& state, GdnKeep keep) {
  const char* op = "gdn_backward";
  check_gdn_kernel_dims(op, dims);
  const int64_t T = ops::check_gdn_backward(op, dims, dqkv, dg, dbeta, d_o, qkv, g, beta, BF16, DeviceKind::CUDA);
  check_seqs(op, seqs, T);
  if (T == 0) return;
  const cuda::GdnArgs args = gdn_args(dims, seqs);
  const void* st = gdn_state_ptr(op, state, args, keep);
  void* ws = workspace(gdn_scratch_bytes(args, st != nullptr, keep));
  cuda::gdn_backward(dqkv.data, dg.ptr<float>(), dbeta.ptr<float>(), d_o.data, qkv.data, g.ptr<float>(),
                     beta.ptr<float>(), args, ws, stream_, st, keep);
  QT_LAUNCH_CHECK("gdn_backward");
}

void CudaBackend::gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z,
                                        const Tensor& w, double eps) {
  const auto [rows, cols] =
      ops::check_norm("gated_rmsnorm_forward", w, x, {{"z", &z}, {"y", &y}}, rstd, BF16, DeviceKind::CUDA);
  cuda::launch_rmsnorm_forward(y.data, rstd.ptr<float>(), x.data, z.data, w.data, rows, cols, float(eps),
                               cuda::NormKind::Gated, nullptr, stream_);
}

void CudaBackend::gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                         const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& rstd) {
  const char* op = "gated_rmsnorm_backward";
  const auto [rows, cols] =
      ops::check_norm(op, w, x, {{"z", &z}, {"dy", &dy}, {"dx", &dx}, {"dz", &dz}}, rstd, BF16, DeviceKind::CUDA);
  const bool want_dw = dw.data != nullptr;
  const bool f32 = want_dw && check_grad(op, "dw", dw, {cols});
  void* ws = want_dw ? workspace(cuda::rmsnorm_backward_workspace_bytes(rows, cols)) : nullptr;
  cuda::launch_rmsnorm_backward(dx.data, false, dz.data, want_dw ? dw.data : nullptr, f32, dy.data, x.data, z.data,
                                w.data, rstd.ptr<float>(), rows, cols, cuda::NormKind::Gated, ws, nullptr, stream_);
}

// ---- gated full attention ----------------------------------------------------------------------

void CudaBackend::attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                                    const Tensor& k_rstd, const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                                    const Tensor& k_norm_w, const Tensor& positions, const AttnDims& dims,
                                    double eps) {
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
  const int64_t T = ops::check_attn_prep_forward("attn_prep_forward", dims, q, k, gate, q_rstd, k_rstd, qg, kr,
                                                 q_norm_w, k_norm_w, positions, BF16, DeviceKind::CUDA);
  cuda::launch_attn_prep_forward(q.data, k.data, gate.data, q_rstd.ptr<float>(), k_rstd.ptr<float>(), qg.data,
                                 kr.data, q_norm_w.data, k_norm_w.data, positions.ptr<int32_t>(), T, int(Hq),
                                 int(Hkv), int(D), int(dims.rotary_dim), dims.rope_theta, float(eps), stream_);
}

void CudaBackend::attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w,
                                     const Tensor& dk_norm_w, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dgate, const Tensor& qg, const Tensor& kr,
                                     const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& q_rstd,
                                     const Tensor& k_rstd, const Tensor& positions, const AttnDims& dims) {
  const char* op = "attn_prep_backward";
  const int64_t T = ops::check_attn_prep_backward(op, dims, dqg, dkr, dq, dk, dgate, qg, kr, q_norm_w, k_norm_w, q_rstd,
                                                  k_rstd, positions, BF16, DeviceKind::CUDA);
  const int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
  const bool want_q = dq_norm_w.data != nullptr, want_k = dk_norm_w.data != nullptr;
  const bool q_f32 = want_q && check_grad(op, "dq_norm_w", dq_norm_w, {D});
  const bool k_f32 = want_k && check_grad(op, "dk_norm_w", dk_norm_w, {D});
  void* ws = workspace(cuda::attn_prep_backward_workspace_bytes(T, int(D)));
  cuda::launch_attn_prep_backward(dqg.data, dkr.data, want_q ? dq_norm_w.data : nullptr, q_f32,
                                  want_k ? dk_norm_w.data : nullptr, k_f32, dq.data, dk.data, dgate.data, qg.data,
                                  kr.data, q_norm_w.data, k_norm_w.data, q_rstd.ptr<float>(), k_rstd.ptr<float>(),
                                  positions.ptr<int32_t>(), T, int(Hq), int(Hkv), int(D), int(dims.rotary_dim),
                                  dims.rope_theta, ws, stream_);
}

void CudaBackend::attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttnDims& dims, const SeqInfo& seqs) {
  const char* op = "attention_forward";
  check_attn_kernel_dims(op, dims);
  const int64_t T = ops::check_attention_forward(op, dims, o, lse, q, k, v, BF16, DeviceKind::CUDA);
  check_seqs(op, seqs, T);
  if (T == 0) return;
  const cuda::AttnArgs args = attn_args(dims, seqs, deterministic_attention_);
  void* ws = workspace(cuda::attention_workspace_bytes(args));
  cuda::attention_forward(o.data, lse.ptr<float>(), q.data, k.data, v.data, args, ws, stream_);
  QT_LAUNCH_CHECK("attention_forward");
}

void CudaBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse, const AttnDims& dims, const SeqInfo& seqs) {
  const char* op = "attention_backward";
  check_attn_kernel_dims(op, dims);
  const int64_t T = ops::check_attention_backward(op, dims, dq, dk, dv, d_o, q, k, v, o, lse, BF16, DeviceKind::CUDA);
  check_seqs(op, seqs, T);
  if (T == 0) return;
  const cuda::AttnArgs args = attn_args(dims, seqs, deterministic_attention_);
  void* ws = workspace(cuda::attention_workspace_bytes(args));
  cuda::attention_backward(dq.data, dk.data, dv.data, d_o.data, q.data, k.data, v.data, o.data, lse.ptr<float>(),
                           args, ws, stream_);
  QT_LAUNCH_CHECK("attention_backward");
}

void CudaBackend::attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) {
  ops::check_same_shape("attn_gate_forward", BF16, DeviceKind::CUDA, {{"o", &o}, {"gate", &gate}, {"y", &y}});
  cuda::launch_attn_gate_forward(y.data, o.data, gate.data, o.numel(), stream_);
}

void CudaBackend::attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                                     const Tensor& gate) {
  ops::check_same_shape("attn_gate_backward", BF16, DeviceKind::CUDA,
                        {{"o", &o}, {"gate", &gate}, {"dy", &dy}, {"d_o", &d_o}, {"dgate", &dgate}});
  cuda::launch_attn_gate_backward(d_o.data, dgate.data, dy.data, o.data, gate.data, o.numel(), stream_);
}

// ---- fused lm_head + cross-entropy -------------------------------------------------------------

int64_t CudaBackend::cross_entropy_chunk_rows(int64_t V, int64_t T) const {
  int64_t rows = ce_chunk_rows_;
  if (rows <= 0) {
    // fp32 logits of one chunk: 1000 MiB keeps the op's extra memory under 1 GiB and gives 1024
    // rows at V = 248,320, i.e. exactly 8 chunks at 8192 tokens (960 MiB gave 896: 9 + a 128-row tail).
    const int64_t budget = ce_budget_bytes_ > 0 ? ce_budget_bytes_ : int64_t(1000) << 20;
    rows = std::max<int64_t>(128, budget / (4 * std::max<int64_t>(V, 1)) / 128 * 128);
  }
  return std::max<int64_t>(1, std::min(rows, T));
}

size_t CudaBackend::cross_entropy_workspace_bytes(int64_t V, int64_t T) const {
  const int64_t n = cross_entropy_chunk_rows(V, T);
  const size_t logits = (size_t(n) * size_t(V) * 4 + kAlign - 1) / kAlign * kAlign;
  return logits + (size_t(T) * 4 + kAlign - 1) / kAlign * kAlign;
}

double CudaBackend::linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss,
                                         const Tensor& hidden, const Tensor& w, const Tensor& targets,
                                         double grad_scale, bool accumulate_dw) {
  enqueue_cross_entropy(d_scalar_, dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
  double total = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&total, d_scalar_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  synchronize();
  return total;
}

void CudaBackend::linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                          const Tensor& token_loss, const Tensor& hidden, const Tensor& w,
                                          const Tensor& targets, double grad_scale, bool accumulate_dw) {
  check_tensor("linear_cross_entropy_to", "loss_sum", loss_sum, DType::F64, {1});
  enqueue_cross_entropy(loss_sum.ptr<double>(), dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
}

void CudaBackend::enqueue_cross_entropy(double* sum_dst, const Tensor& dhidden, const Tensor& dw,
                                        const Tensor& token_loss, const Tensor& hidden, const Tensor& w,
                                        const Tensor& targets, double grad_scale, bool accumulate_dw) {
  const char* op = "linear_cross_entropy";
  QT_CHECK(w.ndim == 2, op, ": w is ", w.describe(), ", expected 2 dims [V, H]");
  const int64_t V = w.size(0), H = w.size(1), T = dim_of(op, "hidden", hidden, 0);
  check_tensor(op, "w", w, BF16, {V, H});
  check_tensor(op, "hidden", hidden, BF16, {T, H});
  check_tensor(op, "targets", targets, I32, {T});
  const bool want_dh = check_optional(op, "dhidden", dhidden, BF16, {T, H});
  const bool want_dw = dw.data != nullptr;
  const bool dw_f32 = want_dw && check_grad(op, "dw", dw, {V, H});
  const bool want_tl = check_optional(op, "token_loss", token_loss, F32, {T});
  if (T == 0) {
    CUDA_CHECK(cudaMemsetAsync(sum_dst, 0, sizeof(double), stream_));
    if (want_dw && !accumulate_dw) zero(dw);
    return;
  }
  const bool want_grad = want_dh || want_dw;
  const int64_t n_chunk = cross_entropy_chunk_rows(V, T);
  const size_t logits_bytes = (size_t(n_chunk) * size_t(V) * 4 + kAlign - 1) / kAlign * kAlign;
  char* ws = static_cast<char*>(workspace(cross_entropy_workspace_bytes(V, T)));
  float* logits = reinterpret_cast<float*>(ws);
  float* row_loss = want_tl ? token_loss.ptr<float>() : reinterpret_cast<float*>(ws + logits_bytes);
  const auto* h = static_cast<const char*>(hidden.data);
  const auto* tg = targets.ptr<int32_t>();
  for (int64_t c0 = 0; c0 < T; c0 += n_chunk) {
    const int64_t n = std::min(n_chunk, T - c0);
    const void* h_c = h + size_t(c0 * H) * 2;
    gemm(false, true, n, V, H, h_c, H, w.data, H, logits, V, true, 0.0f);  // logits[n,V] fp32
    cuda::launch_cross_entropy_chunk(logits, row_loss + c0, tg + c0, n, V, float(grad_scale), want_grad, stream_);
    // The bf16 gradient dl[n,V] now lies in place with a row stride of 2V elements.
    if (want_dh)
      gemm(false, false, n, H, V, logits, 2 * V, w.data, H, static_cast<char*>(dhidden.data) + size_t(c0 * H) * 2, H,
           false, 0.0f);
    if (want_dw)  // the first chunk writes dw unless it accumulates
      gemm(true, false, V, H, n, logits, 2 * V, h_c, H, dw.data, H, dw_f32, accumulate_dw || c0 > 0 ? 1.0f : 0.0f);
  }
  cuda::launch_sum_to_double(sum_dst, row_loss, T, stream_);
}

// The FP8 head: per chunk of n rows the forward product into fp32 logits, the softmax writing the
// e5m2 codes of p - onehot in place (row stride 4V bytes), dgrad from them and wq_t, and the codes
// transposed into the chunk's columns of dl^T [V, Tp] (zero past T). One wgrad over all T tokens
// then reads dl^T and hq_t: a chunked wgrad would read and write the fp32 dw [V, H] once a chunk
// (2 GiB each at 2B), as long as its math. grad_scale 2^-15 rides on alpha; the codes' scale word is 1.
void CudaBackend::linear_cross_entropy_fp8(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                           const Tensor& token_loss, const Fp8HeadCodes& head, const Tensor& targets,
                                           double grad_scale, bool accumulate_dw) {
  const char* op = "linear_cross_entropy_fp8";
  const auto [T, V, H] = ops::check_fp8_head(op, loss_sum, head, targets, DeviceKind::CUDA);
  const bool want_dh = check_optional(op, "dhidden", dhidden, BF16, {T, H});
  const bool want_dw = dw.data != nullptr;
  const bool dw_f32 = want_dw && check_grad(op, "dw", dw, {V, H});
  const bool want_tl = check_optional(op, "token_loss", token_loss, F32, {T});
  double* sum_dst = loss_sum.ptr<double>();
  if (T == 0) {
    CUDA_CHECK(cudaMemsetAsync(sum_dst, 0, sizeof(double), stream_));
    if (want_dw && !accumulate_dw) zero(dw);
    return;
  }
  const bool want_grad = want_dh || want_dw;
  auto pad16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  // Chunks start on 16-token boundaries: hq_t's columns of a chunk are then a 16-byte aligned operand.
  const int64_t n_chunk = std::min(pad16(cross_entropy_chunk_rows(V, T)), T);
  const int64_t Tp = pad16(T);
  auto aligned = [](size_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  const size_t logits_bytes = aligned(size_t(n_chunk) * size_t(V) * 4), loss_bytes = aligned(size_t(T) * 4);
  char* ws = static_cast<char*>(workspace(logits_bytes + loss_bytes + (want_dw ? size_t(V) * size_t(Tp) : 0)));
  float* logits = reinterpret_cast<float*>(ws);
  float* row_loss = want_tl ? token_loss.ptr<float>() : reinterpret_cast<float*>(ws + logits_bytes);
  uint8_t* dl_t = reinterpret_cast<uint8_t*>(ws + logits_bytes + loss_bytes);
  const auto* hq = static_cast<const uint8_t*>(head.hq.data);
  const auto* hq_t = static_cast<const uint8_t*>(head.hq_t.data);
  const auto* tg = targets.ptr<int32_t>();
  const float alpha = float(grad_scale / 32768.0);
  // The backward's products: A the e5m2 gradient codes (their scale word 1), B e4m3 with b_scale.
  auto e5m2_gemm = [&](cuda::GemmCall g, const Tensor& b_scale) {
    g.fp8 = true;
    g.a_e5m2 = true;
    g.a_scale = fp8_one_;
    g.b_scale = b_scale.ptr<float>();
    gemm_.run(g, stream_, capturing());
  };
  for (int64_t c0 = 0; c0 < T; c0 += n_chunk) {
    const int64_t n = std::min(n_chunk, T - c0);
    cuda::GemmCall fwd{false, true, n, V, H, hq + c0 * H, H, head.wq.data, H, logits, V, true, 0.0f, 1.0f};
    fwd.fp8 = true;
    fwd.a_scale = head.h_scale_inv.ptr<float>();
    fwd.b_scale = head.w_scale_inv.ptr<float>();
    gemm_.run(fwd, stream_, capturing());
    cuda::launch_cross_entropy_chunk_e5m2(logits, row_loss + c0, tg + c0, n, V, want_grad, stream_);
    if (want_dh)  // dh[n, H] = dl[n, V] W[V, H]: B is W stored [H, V] (wq_t)
      e5m2_gemm({false, true, n, H, V, logits, 4 * V, head.wq_t.data, V,
                 static_cast<char*>(dhidden.data) + size_t(c0 * H) * 2, H, false, 0.0f, alpha},
                head.w_scale_inv);
    if (want_dw)  // the last chunk also zeroes the padding columns T..Tp
      cuda::launch_transpose_fp8_codes(
          {dl_t + c0, reinterpret_cast<const uint8_t*>(logits), n, V, 4 * V, Tp, c0 + n == T ? Tp - c0 : n}, stream_);
  }
  if (want_dw)  // dw[V, H] (+)= dl^T[V, Tp] hq[Tp, H]: A is dl_t, B hq_t [H, Tp]
    e5m2_gemm({false, true, V, H, Tp, dl_t, Tp, hq_t, Tp, dw.data, H, dw_f32, accumulate_dw ? 1.0f : 0.0f, alpha},
              head.h_scale_inv);
  cuda::launch_sum_to_double(sum_dst, row_loss, T, stream_);
}

}  // namespace qt
