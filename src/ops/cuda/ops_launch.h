// Launchers of CudaBackend's own kernels (everything but the GDN and attention mixers, which are
// in kernels.h). Plain device pointers, bf16 as void*, dims, caller-owned scratch, a stream; they
// validate nothing (CudaBackend's entry points do) and never allocate. "acc" outputs are added
// into; weight-gradient outputs may be bf16 or f32 (the *_f32 flag), reduced in fp32 either way.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace qt::cuda {

// ---- dropout.cu ----
// out (= or += per accumulate) x * keep / (1 - p) over n bf16, the mask of ops/dropout_hash.h under the
// device seed (i32 [2]).
void launch_dropout(void* out, const void* x, const int32_t* seed, int64_t n, uint32_t stream, double p,
                    bool accumulate, cudaStream_t s);

// ---- dense/pointwise.cu ----
void launch_add(void* out, const void* a, const void* b, int64_t n, cudaStream_t s);
void launch_add_f32(float* out, const float* a, const float* b, int64_t n, cudaStream_t s);
// amax_* (optional): max|out| folded in (an op's amax output, docs/fp8.md).
void launch_swiglu_forward(void* h, float* amax_h, const void* gate, const void* up, int64_t n, cudaStream_t s);
void launch_swiglu_backward(void* dgate, void* dup, float* amax_dgate, float* amax_dup, const void* dh,
                            const void* gate, const void* up, int64_t n, cudaStream_t s);
void launch_attn_gate_forward(void* y, const void* o, const void* gate, int64_t n, cudaStream_t s);
void launch_attn_gate_backward(void* d_o, void* dgate, const void* dy, const void* o, const void* gate, int64_t n,
                               cudaStream_t s);

// ---- dense/embedding.cu ----
// Ids outside [0, V) give zero rows (device ids are not checked on the host).
void launch_embedding_forward(void* out, const void* table, const int32_t* ids, int64_t T, int64_t H, int64_t V,
                              cudaStream_t s);
// Deterministic: a stable radix sort of (id, token) pairs, then one fp32 sum per distinct id in token
// order, added once into dtable.
size_t embedding_backward_workspace_bytes(int64_t T);
void launch_embedding_backward(void* dtable, bool dtable_f32, const void* dout, const int32_t* ids, int64_t T,
                               int64_t H, int64_t V, void* ws, size_t ws_bytes, cudaStream_t s);

// ---- dense/gdn_gates.cu ----
void launch_gdn_gates_forward(float* beta, float* g, const void* b, const void* a, const void* a_log,
                              const void* dt_bias, int64_t T, int64_t H, cudaStream_t s);
size_t gdn_gates_backward_workspace_bytes(int64_t T, int64_t H);
void launch_gdn_gates_backward(void* db, void* da, void* da_log, bool da_log_f32, void* ddt_bias, bool ddt_bias_f32,
                               const float* dbeta, const float* dg, const void* b, const void* a, const void* a_log,
                               const void* dt_bias, int64_t T, int64_t H, void* ws, cudaStream_t s);

// ---- dense/conv1d.cu ----
// Causal depthwise conv + SiLU, channel-last, varlen (cu_seqlens on the device), kernel width K <= 8.
void launch_conv1d_silu_forward(void* y, const void* x, const void* w, const int32_t* cu, int num_seqs, int64_t T,
                                int64_t C, int K, cudaStream_t s);
size_t conv1d_silu_backward_workspace_bytes(int64_t T, int64_t C, int K);
void launch_conv1d_silu_backward(void* dx, void* dw, bool dw_f32, const void* dy, const void* x, const void* w,
                                 const int32_t* cu, int num_seqs, int64_t T, int64_t C, int K, void* ws,
                                 cudaStream_t s);

// ---- dense/fp8.cu ----
// q (e4m3, n bytes; optional) = x (bf16 [rows, cols], n) * s, s = 448 / max|x| (1 if x is zero),
// saturating; q_t (optional) the same codes as [cols, rows_pad], columns from rows on zero;
// *scale_inv = 1 / s.
struct QuantizeFp8Params {
  void* q;
  void* q_t;
  float* scale_inv;
  const void* x;
  int64_t n, rows, cols, rows_pad;
  unsigned* amax_in;   // max|x| folded in by x's producer (an op's amax output), or null: a pass takes it
  unsigned* own_amax;  // the backend's amax word for that pass (zero between quantizes)
  unsigned* done;      // the backend's block counter (zero between quantizes)
};
void launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t s);
// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: fp8 codes transposed; dst's
// columns rows..rows_out are written zero (the padding of a wgrad's inner dim). cols, ld_src,
// ld_dst and rows_out multiples of 4, rows <= rows_out <= ld_dst.
struct TransposeCodesParams {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  int64_t rows = 0, cols = 0, ld_src = 0, ld_dst = 0, rows_out = 0;
};
void launch_transpose_fp8_codes(const TransposeCodesParams& p, cudaStream_t s);
// *amax = max(*amax, max|x|) over n bf16 values (as float bits): the amax output of an op whose
// kernel does not fold it in itself.
void launch_amax_fold(unsigned* amax, const void* x, int64_t n, cudaStream_t s);

// ---- dense/reductions.cu ----
// out[c] (+)= sum_{p < P} partials[p * ld + c] for c < ncols, p in order (fp32), then stored.
void launch_column_reduce(void* out, bool out_f32, const float* partials, int64_t P, int64_t ld, int64_t ncols,
                          cudaStream_t s);
// *out = an order-free 64-bit hash of the 16-bit words of p[0, bytes) (bytes even): equal bytes
// give equal hashes; used to tell whether two GEMM algorithms wrote the same bits.
void launch_hash_words(unsigned long long* out, const void* p, size_t bytes, cudaStream_t s);

// ---- dense/cross_entropy.cu ----
// Cross-entropy on one chunk of fp32 logits [n, V] (row stride V floats). Writes row_loss[n]
// (lse - logit[target], 0 for target -100); with want_grad it overwrites each row's first 2V bytes
// with the bf16 gradient grad_scale * (softmax - onehot), so the gradient is a bf16 [n, V] matrix
// of leading dimension 2V (elements) in place.
void launch_cross_entropy_chunk(float* logits, float* row_loss, const int32_t* targets, int64_t n, int64_t V,
                                float grad_scale, bool want_grad, cudaStream_t s);
// The FP8 head's chunk: row loss as above, and with want_grad the e5m2 codes of (p - onehot) 2^15
// in place: row r's V codes at byte r * 4V of the logits (V a multiple of 4).
void launch_cross_entropy_chunk_e5m2(float* logits, float* row_loss, const int32_t* targets, int64_t n, int64_t V,
                                     bool want_grad, cudaStream_t s);
// *out = sum of x[0, n) in double, one fixed reduction order.
void launch_sum_to_double(double* out, const float* x, int64_t n, cudaStream_t s);

// ---- dense/rmsnorm.cu (rmsnorm_wide.cu, rmsnorm_narrow.cu) ----
enum class NormKind { OnePlusW, Gated };  // y = x rstd (1 + w)  |  y = w x rstd silu(z)
// amax (optional, here and below): max|y| (max|dx| for the backward) folded in, an op's amax output.
void launch_rmsnorm_forward(void* y, float* rstd, const void* x, const void* z, const void* w, int64_t rows,
                            int64_t cols, float eps, NormKind kind, float* amax, cudaStream_t s);
// h = x + r (bf16), then the (1+w) RMSNorm of h, in one pass; false (nothing launched) when the
// shape or alignment is outside the fused kernel's wide-row path (cols % 8, cols <= 4096, 16-byte).
bool launch_add_rmsnorm_forward(void* h, void* y, float* rstd, const void* x, const void* r, const void* w,
                                int64_t rows, int64_t cols, float eps, float* amax_y, cudaStream_t s);
size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t cols);
// dx (= or += per accumulate_dx; may be null for OnePlusW), dz (Gated only, overwritten), dw acc (may be null).
void launch_rmsnorm_backward(void* dx, bool accumulate_dx, void* dz, void* dw, bool dw_f32, const void* dy,
                             const void* x, const void* z, const void* w, const float* rstd, int64_t rows,
                             int64_t cols, NormKind kind, void* ws, float* amax_dx, cudaStream_t s);

// ---- dense/attention_prep.cu ----
void launch_attn_prep_forward(void* q, void* k, void* gate, float* q_rstd, float* k_rstd, const void* qg,
                              const void* kr, const void* q_norm_w, const void* k_norm_w, const int32_t* positions,
                              int64_t T, int Hq, int Hkv, int D, int rotary_dim, double theta, float eps,
                              cudaStream_t s);
size_t attn_prep_backward_workspace_bytes(int64_t T, int D);
void launch_attn_prep_backward(void* dqg, void* dkr, void* dq_norm_w, bool dqw_f32, void* dk_norm_w, bool dkw_f32,
                               const void* dq, const void* dk, const void* dgate, const void* qg, const void* kr,
                               const void* q_norm_w, const void* k_norm_w, const float* q_rstd, const float* k_rstd,
                               const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rotary_dim,
                               double theta, void* ws, cudaStream_t s);

}  // namespace qt::cuda
