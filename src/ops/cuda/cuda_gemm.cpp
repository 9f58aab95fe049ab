#include "ops/cuda/cuda_gemm.h"

#include <cstdint>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {
int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (u % (2 * a)) == 0) a *= 2;
  return a;
}
}  // namespace

GemmRunner::GemmRunner(int candidates, bool tune) : candidates_(candidates), tune_(tune) {
  QT_CHECK(candidates >= 1 && candidates <= kMaxCandidates, "train.cuda.gemm_candidates is ", candidates,
           ": expected an integer from 1 to ", kMaxCandidates);
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_hash_), sizeof(*d_hash_)));
}

GemmRunner::~GemmRunner() {
  for (auto& kv : plans_) {
    cublasLtMatrixLayoutDestroy(kv.second.a);
    cublasLtMatrixLayoutDestroy(kv.second.b);
    cublasLtMatrixLayoutDestroy(kv.second.c);
    cublasLtMatmulDescDestroy(kv.second.desc);
  }
  cudaFree(d_hash_);
  cudaFree(ws_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

GemmRunner::Plan GemmRunner::make_plan(const GemmCall& g, const Key& key) {
  const int64_t M = g.M, N = g.N, K = g.K;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt A = our B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (g.fp8) {
    const int8_t fast = g.fast_accum ? 1 : 0;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  // Column-major views of the row-major stored matrices.
  auto in = [&](bool e5m2) { return !g.fp8 ? CUDA_R_16BF : e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; };
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in(g.b_e5m2), g.trans_b ? K : N, g.trans_b ? N : K, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in(g.a_e5m2), g.trans_a ? M : K, g.trans_a ? K : M, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, g.c_f32 ? CUDA_R_32F : CUDA_R_16BF, N, M, g.ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_,
                                                    sizeof(ws_bytes_)));
  const uint32_t al_a = uint32_t(std::get<10>(key)), al_b = uint32_t(std::get<9>(key)),
                 al_c = uint32_t(std::get<11>(key));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t res[kMaxCandidates] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, tune_ ? candidates_ : 1, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
    QT_FAIL("gemm: cuBLASLt has no algorithm for ", g.fp8 ? "fp8 " : "", "M ", M, " N ", N, " K ", K, " (trans_a ", g.trans_a, ", trans_b ",
            g.trans_b, ", lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc, ", C ", g.c_f32 ? "f32" : "bf16",
            "): ", cublas_status_str(st));
  }
  p.algo = res[0].algo;
  if (found > 1)
    for (int i = 0; i < found; ++i) p.candidates.push_back(res[i].algo);
  return p;
}

void GemmRunner::run(const GemmCall& g, cudaStream_t stream, bool capturing) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) {
    QT_CHECK(g.beta == 1.0f || g.ldc == g.N, "gemm: K = 0 with beta ", g.beta, " and a strided C is not supported");
    if (g.beta != 1.0f) CUDA_CHECK(cudaMemsetAsync(g.C, 0, size_t(g.M * g.N) * (g.c_f32 ? 4 : 2), stream));
    return;
  }
  // Row-major C[M,N] is column-major C^T[N,M]: C^T = op(B)^T op(A)^T, so cuBLASLt's "A" is our B.
  QT_CHECK(!g.fp8 || (!g.trans_a && g.trans_b && g.a_scale != nullptr && g.b_scale != nullptr),
           "gemm: an fp8 product takes A [M,K] and B stored [N,K] (trans_a off, trans_b on) and both scales");
  QT_CHECK(!(g.a_e5m2 && g.b_e5m2) && (g.fp8 || !(g.a_e5m2 || g.b_e5m2)),
           "gemm: e5m2 takes one fp8 operand (the FP8 tensor cores have no e5m2 x e5m2 product)");
  const Key key{g.trans_a, g.trans_b, g.M,      g.N,          g.K,      g.lda,   g.ldb,
                g.ldc,     g.c_f32,   alignment_of(g.A), alignment_of(g.B), alignment_of(g.C), g.fp8, g.fast_accum,
                g.a_e5m2,  g.b_e5m2};
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(key, make_plan(g, key)).first;
  Plan& p = it->second;
  if (g.fp8) {  // cuBLASLt's A is our B; the pointers are read when the GEMM runs (graph replays too)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b_scale,
                                                sizeof(g.b_scale)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a_scale,
                                                sizeof(g.a_scale)));
  }
  if (!p.candidates.empty() && g.beta == 0.0f && !capturing) tune(p, g, stream);
  CUBLAS_CHECK(cublasLtMatmul(lt_, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, g.C, p.c, g.C, p.c, &p.algo, ws_,
                              ws_bytes_, stream));
  QT_LAUNCH_CHECK("gemm");
}

// Runs in place (every candidate writes C = alpha op(A) op(B)): the heuristic's first choice gives
// the reference bits (a hash of C), then each candidate that reproduces them is timed over 3 runs.
// Graph and eager steps, a resumed and an uninterrupted run, two processes stay bit-equal.
void GemmRunner::tune(Plan& p, const GemmCall& g, cudaStream_t stream) {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  candidates.swap(p.candidates);
  const size_t c_bytes = size_t((g.M - 1) * g.ldc + g.N) * (g.c_f32 ? 4 : 2);
  const float beta = 0.0f;
  auto run_algo = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt_, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &beta, g.C, p.c, g.C, p.c, &algo, ws_, ws_bytes_,
                          stream);
  };
  auto hash = [&] {
    launch_hash_words(d_hash_, g.C, c_bytes, stream);
    unsigned long long h = 0;
    CUDA_CHECK(cudaMemcpyAsync(&h, d_hash_, sizeof(h), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return h;
  };
  const cublasStatus_t first = run_algo(p.algo);
  QT_CHECK(first == CUBLAS_STATUS_SUCCESS, "gemm: cuBLASLt's first algorithm does not run for ", g.fp8 ? "fp8 " : "",
           "M ", g.M, " N ", g.N, " K ", g.K, " (lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc, ", C ",
           g.c_f32 ? "f32" : "bf16", ", A/B/C aligned to ", alignment_of(g.A), "/", alignment_of(g.B), "/",
           alignment_of(g.C), " bytes", g.fp8 ? str(", scales to ", alignment_of(g.a_scale), "/", alignment_of(g.b_scale)) : "",
           "): ", cublas_status_str(first));
  const unsigned long long ref = hash();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float best = -1.0f;
  for (const cublasLtMatmulAlgo_t& algo : candidates) {
    if (run_algo(algo) != CUBLAS_STATUS_SUCCESS) continue;  // cannot run here
    if (hash() != ref) continue;                            // another summation order: other bits
    CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int r = 0; r < 3; ++r) CUBLAS_CHECK(run_algo(algo));
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (best < 0.0f || ms < best) {
      best = ms;
      p.algo = algo;
    }
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
}

}  // namespace qt::cuda
