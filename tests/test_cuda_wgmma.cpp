// Hopper wgmma conventions (src/ops/cuda/wgmma.cuh) against a host GEMM: descriptors of the
// 128-byte-swizzled K-major and N-major operands, the k16 start-address steps, LBO / SBO and the
// accumulator fragment layout, through qt::cuda::wgmma_gemm_check (one warpgroup, C = A B).
// Inputs are bf16-exact, products exact in fp32, so the only error is fp32 summation order:
// allowed |c - ref| <= 1e-5 * sum_k |a b| + 1e-6 (ref in double). A wrong swizzle, stride or
// fragment mapping moves whole rows or columns (errors O(1)). GTEST_SKIP without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/cuda/kernels.h"

namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

using qt::cuda::WgmmaA;
constexpr WgmmaA kSmemK = qt::cuda::kWgmmaASmemKMajor, kSmemM = qt::cuda::kWgmmaASmemMMajor,
                 kRegs = qt::cuda::kWgmmaARegisters;

void run_case(int n, int k, bool b_k_major, WgmmaA a_form, uint64_t seed) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + (b_k_major ? " B [n, k]" : " B [k, n]") +
               (a_form == kRegs ? ", A in registers" : a_form == kSmemM ? ", A [k, 64] in smem" : ", A in smem"));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<qt::bf16> a(64 * size_t(k)), b(size_t(n) * k);
  for (auto& x : a) x = qt::float_to_bf16(dist(rng));
  for (auto& x : b) x = qt::float_to_bf16(dist(rng));
  void *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  ASSERT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dc), 64 * size_t(n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dc, 0xFF, 64 * size_t(n) * 4), cudaSuccess);  // NaN: unwritten elements fail
  qt::cuda::wgmma_gemm_check(dc, da, db, n, k, b_k_major, a_form, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> c(64 * size_t(n));
  ASSERT_EQ(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  int bad = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int t = 0; t < k; ++t) {
        const double bv = qt::bf16_to_float(b_k_major ? b[size_t(j) * k + t] : b[size_t(t) * n + j]);
        const double p = double(qt::bf16_to_float(a[size_t(i) * k + t])) * bv;
        ref += p;
        mag += std::fabs(p);
      }
      const float got = c[size_t(i) * n + j];
      if (!(std::fabs(got - ref) <= 1e-5 * mag + 1e-6) && ++bad <= 5)
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", expected " << ref;
    }
  EXPECT_EQ(bad, 0) << bad << " of " << 64 * n << " elements wrong";
}

TEST(CudaWgmma, KMajorBN64OnePanel) { run_case(64, 64, true, kSmemK, 1); }
TEST(CudaWgmma, KMajorBN128ThreePanels) { run_case(128, 192, true, kSmemK, 2); }
TEST(CudaWgmma, NMajorBN64) { run_case(64, 128, false, kSmemK, 3); }
TEST(CudaWgmma, NMajorBN128TwoBlocks) { run_case(128, 256, false, kSmemK, 4); }
// A from registers (how attention's P V and the GDN products would feed wgmma).
TEST(CudaWgmma, RegisterAKMajorBN64) { run_case(64, 128, true, kRegs, 5); }
TEST(CudaWgmma, RegisterANMajorBN128) { run_case(128, 256, false, kRegs, 6); }
// N = 256: attention's O += P V at head_dim 256 (P in registers, V [keys, 256] N-major).
TEST(CudaWgmma, RegisterANMajorBN256) { run_case(256, 64, false, kRegs, 7); }
TEST(CudaWgmma, KMajorBN256) { run_case(256, 128, true, kSmemK, 8); }
// A M-major (wgmma's transposed A): attention's dV += P^T dO and dK += dS^T Q with P, dS stored
// [queries, keys] and dO, Q N-major.
TEST(CudaWgmma, MMajorANMajorBN128) { run_case(128, 64, false, kSmemM, 9); }
TEST(CudaWgmma, MMajorAKMajorBN64) { run_case(64, 192, true, kSmemM, 10); }

// Shapes the check does not support are refused before anything reaches the device.
TEST(CudaWgmmaBadInput, ShapesNamed) {
  try {
    qt::cuda::wgmma_gemm_check(nullptr, nullptr, nullptr, 96, 64, true, kSmemK, nullptr);
    ADD_FAILURE() << "n = 96 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("n = 96"), std::string::npos) << e.what();
  }
  try {
    qt::cuda::wgmma_gemm_check(nullptr, nullptr, nullptr, 64, 80, true, kSmemK, nullptr);
    ADD_FAILURE() << "k = 80 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("k = 80"), std::string::npos) << e.what();
  }
  try {
    qt::cuda::wgmma_gemm_check(nullptr, nullptr, nullptr, 64, 64, true, static_cast<WgmmaA>(3), nullptr);
    ADD_FAILURE() << "a_form = 3 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a_form = 3"), std::string::npos) << e.what();
  }
}

}  // namespace
