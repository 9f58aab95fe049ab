// GemmRunner: the CUDA backend's cuBLASLt matmuls. One plan (descriptors + algorithm) per shape,
// strides, output type and operand alignment, made on first use; with tuning on (train.cuda.gemm_tune,
// default) a plan's first beta = 0 call outside graph capture times cuBLASLt's heuristic candidates
// and keeps the fastest of those that write exactly the bits of the heuristic's first choice, so
// tuning changes speed, never results.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace qt::cuda {

// Row-major C[M,N] (=, or += when beta == 1) alpha op(A) op(B) with bf16 A, B, fp32 accumulation and a
// bf16 or f32 C. op(A) is [M,K] (A stored [K,M] when trans_a), op(B) is [K,N] (B stored [N,K] when
// trans_b); ld* are the stored row strides in elements. fp8: A and B are e4m3 (the only layout the
// FP8 tensor cores take: !trans_a, trans_b) and the product is scaled by *a_scale * *b_scale (device
// floats, read when the GEMM runs); one of them may be e5m2 instead (a_e5m2 / b_e5m2); fast_accum: Hopper's FP8 accumulation without the periodic
// promotion to full fp32 (faster, a few more bits lost over long K).
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  bool c_f32 = false;
  float beta = 0.0f, alpha = 1.0f;
  bool fp8 = false, fast_accum = false;
  bool a_e5m2 = false, b_e5m2 = false;  // fp8: that operand's codes are e5m2 (not both)
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

class GemmRunner {
 public:
  static constexpr int kMaxCandidates = 64;
  // candidates: heuristic candidates a new plan's tuning times (train.cuda.gemm_candidates, 1..64).
  GemmRunner(int candidates, bool tune);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues the product on `stream`; `capturing`: the stream is being captured (no tuning then).
  void run(const GemmCall& g, cudaStream_t stream, bool capturing);
  void set_tuning(bool on) { tune_ = on; }  // affects plans made after the call

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // Heuristic candidates (best first) while the plan waits to be timed; empty once settled.
    std::vector<cublasLtMatmulAlgo_t> candidates;
  };
  using Key =
      std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int, int, int, bool, bool, bool,
                 bool>;
  Plan make_plan(const GemmCall& g, const Key& key);
  void tune(Plan& p, const GemmCall& g, cudaStream_t stream);

  // 32 candidates found faster bit-identical algorithms than 8 (4b +0.8 % end to end,
  // docs/dense_kernels.md section 2).
  int candidates_ = 32;
  bool tune_ = true;
  cublasLtHandle_t lt_ = nullptr;
  std::map<Key, Plan> plans_;
  void* ws_ = nullptr;  // cuBLASLt on Hopper wants up to 32 MiB
  size_t ws_bytes_ = size_t(32) << 20;
  unsigned long long* d_hash_ = nullptr;  // tune()'s output hash
};

}  // namespace qt::cuda
