// CUDA varlen causal GQA flash attention (src/ops/cuda/attention/) against the CPU reference.
//
// Every case rounds random N(0, 1) inputs (q, k, v, dO) to bf16, runs the CUDA launchers on them,
// and compares o, lse, dq, dk, dv with two references computed on the host from the same inputs:
//   ref32: qt::CpuBackend::attention_forward / attention_backward in fp32 (the "true" answer);
//   refbf: the same naive algorithm as a bf16 PyTorch program would run it (as flash-attention's
//          hopper/test_flash_attn.py builds out_pt): q * scale, the scores, the softmax
//          probabilities, O, dP, dS and the final gradients rounded to bf16 where PyTorch would
//          store a bf16 tensor; products accumulate in fp32 as in a bf16 GEMM.
// Tolerance (flash-attention's rule, docs/attention_kernels.md section 8): for each output,
//   max|gpu - ref32| <= 2 * max|refbf - ref32| + floor + 1e-5 * max(1, max|ref32|),
// where floor = max|bf16(ref32) - ref32| is the error any bf16 output must carry (half an ulp of
// the largest element; lse is fp32, its floor is 0), and the last term only matters when an output
// is (nearly) exactly zero in both references (a 1-token sample has dS = 0). The GPU keeps S, the
// softmax statistics and all accumulators in fp32 and rounds only P and dS to bf16 for the tensor
// cores, so its error is of the same order as refbf's; a real bug (wrong mask, tile, head or sample
// offset) is O(max|ref32|), orders of magnitude above this bound.
// Also checked: no NaN/inf in any output (outputs start as all-ones bytes = NaN, so an element the
// kernels never write fails this too), and a 256-byte sentinel after every output buffer comes
// back unchanged (out-of-bounds writes).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cuda/kernels.h"

namespace qt {
namespace {

#define CUDA_OK(expr)                                                                     \
  do {                                                                                    \
    const cudaError_t err_ = (expr);                                                      \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);            \
  } while (0)

bool have_cuda_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// ---- bf16 on the host (round to nearest even) -------------------------------------------------
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float bfr(float f) { return from_bf16(to_bf16(f)); }

using Vec = std::vector<float>;

struct Problem {
  std::vector<int32_t> cu;  // [num_seqs + 1]
  int hq = 0, hkv = 0, d = 0;
  int total() const { return cu.back(); }
  int num_seqs() const { return static_cast<int>(cu.size()) - 1; }
  int max_seqlen() const {
    int m = 0;
    for (size_t s = 0; s + 1 < cu.size(); ++s) m = std::max(m, cu[s + 1] - cu[s]);
    return m;
  }
};

Problem make_problem(const std::vector<int>& lens, int hq, int hkv, int d) {
  Problem p;
  p.cu.push_back(0);
  for (int l : lens) p.cu.push_back(p.cu.back() + l);
  p.hq = hq;
  p.hkv = hkv;
  p.d = d;
  return p;
}

// ---- bf16-program reference ----------------------------------------------------------------------
// Element functions of (query row i, head h, key j), so the three passes below recompute bit-identical
// scores, probabilities and dP without materialising [T, T] matrices.
struct RowCtx {
  const Problem& p;
  const Vec &q, &k, &v, &d_o;  // bf16-valued floats
  Vec qs;                      // bf16(q * scale)
  std::vector<int> start;      // sample start of every token
  float scale;

  int kv_head(int h) const { return h / (p.hq / p.hkv); }
  // bf16(qs_i . k_j): the bf16 score matrix of (q * scale) k^T.
  float score(int i, int h, int j) const {
    const int D = p.d;
    const float* qi = &qs[(static_cast<size_t>(i) * p.hq + h) * D];
    const float* kj = &k[(static_cast<size_t>(j) * p.hkv + kv_head(h)) * D];
    float dot = 0.f;
    for (int e = 0; e < D; ++e) dot += qi[e] * kj[e];
    return bfr(dot);
  }
  // bf16 softmax output from the row's max and sum (fp32 inside the softmax, as PyTorch's kernel).
  float prob(int i, int h, int j, float mx, float sum) const { return bfr(std::exp(score(i, h, j) - mx) / sum); }
  // bf16(dO_i . v_j).
  float dpv(int i, int h, int j) const {
    const int D = p.d;
    const float* doi = &d_o[(static_cast<size_t>(i) * p.hq + h) * D];
    const float* vj = &v[(static_cast<size_t>(j) * p.hkv + kv_head(h)) * D];
    float dot = 0.f;
    for (int e = 0; e < D; ++e) dot += doi[e] * vj[e];
    return bfr(dot);
  }
  // Softmax statistics of row (i, h).
  void stats(int i, int h, float& mx, float& sum) const {
    const int s0 = start[static_cast<size_t>(i)];
    mx = -INFINITY;
    for (int j = s0; j <= i; ++j) mx = std::max(mx, score(i, h, j));
    sum = 0.f;
    for (int j = s0; j <= i; ++j) sum += std::exp(score(i, h, j) - mx);
  }
};

RowCtx make_ctx(const Problem& p, const Vec& q, const Vec& k, const Vec& v, const Vec& d_o) {
  RowCtx c{p, q, k, v, d_o, Vec(q.size()), std::vector<int>(static_cast<size_t>(p.total())),
           1.f / std::sqrt(static_cast<float>(p.d))};
  for (size_t e = 0; e < q.size(); ++e) c.qs[e] = bfr(q[e] * c.scale);
  for (int s = 0; s < p.num_seqs(); ++s)
    for (int t = p.cu[static_cast<size_t>(s)]; t < p.cu[static_cast<size_t>(s) + 1]; ++t)
      c.start[static_cast<size_t>(t)] = p.cu[static_cast<size_t>(s)];
  return c;
}

struct Outputs {
  Vec o, lse, dq, dk, dv;
};

Outputs reference_bf16(const Problem& p, const Vec& q, const Vec& k, const Vec& v, const Vec& d_o, bool backward) {
  const int T = p.total(), Hq = p.hq, Hkv = p.hkv, D = p.d, G = Hq / Hkv;
  const RowCtx c = make_ctx(p, q, k, v, d_o);
  Outputs r;
  r.o.assign(q.size(), 0.f);
  r.lse.assign(static_cast<size_t>(Hq) * T, 0.f);
  Vec mxs(static_cast<size_t>(Hq) * T), sums(static_cast<size_t>(Hq) * T), di(static_cast<size_t>(Hq) * T, 0.f);
  // Pass 1, per (i, h): softmax statistics, o, lse, Di = sum_j p_j dp_j (the softmax backward's row sum).
  parallel_for(static_cast<int64_t>(T) * Hq, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t row = r0; row < r1; ++row) {
      const int i = static_cast<int>(row / Hq), h = static_cast<int>(row % Hq), kvh = h / G;
      const size_t hi = static_cast<size_t>(h) * T + i;
      c.stats(i, h, mxs[hi], sums[hi]);
      std::fill(acc.begin(), acc.end(), 0.f);
      float dsum = 0.f;
      for (int j = c.start[static_cast<size_t>(i)]; j <= i; ++j) {
        const float pj = c.prob(i, h, j, mxs[hi], sums[hi]);
        const float* vj = &v[(static_cast<size_t>(j) * Hkv + kvh) * D];
        for (int e = 0; e < D; ++e) acc[static_cast<size_t>(e)] += pj * vj[e];
        if (backward) dsum += pj * c.dpv(i, h, j);
      }
      for (int e = 0; e < D; ++e) r.o[static_cast<size_t>(row) * D + e] = bfr(acc[static_cast<size_t>(e)]);
      r.lse[hi] = mxs[hi] + std::log(sums[hi]);
      di[hi] = dsum;
    }
  });
  if (!backward) return r;
  auto ds_of = [&](int i, int h, int j, float& pij) {
    const size_t hi = static_cast<size_t>(h) * T + i;
    pij = c.prob(i, h, j, mxs[hi], sums[hi]);
    return bfr(pij * (c.dpv(i, h, j) - di[hi]));
  };
  // Pass 2, per (i, h): dq_i = bf16(bf16(sum_j ds_ij k_j) * scale).
  r.dq.assign(q.size(), 0.f);
  parallel_for(static_cast<int64_t>(T) * Hq, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t row = r0; row < r1; ++row) {
      const int i = static_cast<int>(row / Hq), h = static_cast<int>(row % Hq), kvh = h / G;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int j = c.start[static_cast<size_t>(i)]; j <= i; ++j) {
        float pij;
        const float ds = ds_of(i, h, j, pij);
        const float* kj = &k[(static_cast<size_t>(j) * Hkv + kvh) * D];
        for (int e = 0; e < D; ++e) acc[static_cast<size_t>(e)] += ds * kj[e];
      }
      for (int e = 0; e < D; ++e)
        r.dq[static_cast<size_t>(row) * D + e] = bfr(bfr(acc[static_cast<size_t>(e)]) * c.scale);
    }
  });
  // Pass 3, per (j, kv head): dk_j = bf16(sum_{h in group, i >= j} ds_ij qs_i), dv_j = bf16(sum p_ij dO_i).
  r.dk.assign(k.size(), 0.f);
  r.dv.assign(v.size(), 0.f);
  std::vector<int> end(static_cast<size_t>(T));
  for (int s = 0; s < p.num_seqs(); ++s)
    for (int t = p.cu[static_cast<size_t>(s)]; t < p.cu[static_cast<size_t>(s) + 1]; ++t)
      end[static_cast<size_t>(t)] = p.cu[static_cast<size_t>(s) + 1];
  parallel_for(static_cast<int64_t>(T) * Hkv, [&](int64_t r0, int64_t r1) {
    std::vector<float> ak(static_cast<size_t>(D)), av(static_cast<size_t>(D));
    for (int64_t row = r0; row < r1; ++row) {
      const int j = static_cast<int>(row / Hkv), kvh = static_cast<int>(row % Hkv);
      std::fill(ak.begin(), ak.end(), 0.f);
      std::fill(av.begin(), av.end(), 0.f);
      for (int h = kvh * G; h < (kvh + 1) * G; ++h)
        for (int i = j; i < end[static_cast<size_t>(j)]; ++i) {
          float pij;
          const float ds = ds_of(i, h, j, pij);
          const float* qi = &c.qs[(static_cast<size_t>(i) * Hq + h) * D];
          const float* doi = &d_o[(static_cast<size_t>(i) * Hq + h) * D];
          for (int e = 0; e < D; ++e) {
            ak[static_cast<size_t>(e)] += ds * qi[e];
            av[static_cast<size_t>(e)] += pij * doi[e];
          }
        }
      for (int e = 0; e < D; ++e) {
        r.dk[static_cast<size_t>(row) * D + e] = bfr(ak[static_cast<size_t>(e)]);
        r.dv[static_cast<size_t>(row) * D + e] = bfr(av[static_cast<size_t>(e)]);
      }
    }
  });
  return r;
}

// ---- fp32 reference through CpuBackend -------------------------------------------------------------
Outputs reference_f32(const Problem& p, const Vec& q, const Vec& k, const Vec& v, const Vec& d_o, bool backward) {
  CpuBackend be;
  const int64_t T = p.total(), Hq = p.hq, Hkv = p.hkv, D = p.d;
  auto up = [&](const Vec& x, const Shape& shape) {
    Tensor t = be.alloc(DType::F32, shape);
    std::memcpy(t.ptr<float>(), x.data(), x.size() * sizeof(float));
    return t;
  };
  auto down = [&](const Tensor& t) {
    Vec x(static_cast<size_t>(t.numel()));
    std::memcpy(x.data(), t.ptr<float>(), x.size() * sizeof(float));
    return x;
  };
  SeqInfo seqs;
  seqs.cu_seqlens = be.alloc(DType::I32, {static_cast<int64_t>(p.cu.size())});
  std::memcpy(seqs.cu_seqlens.ptr<int32_t>(), p.cu.data(), p.cu.size() * sizeof(int32_t));
  seqs.num_seqs = p.num_seqs();
  seqs.max_seqlen = p.max_seqlen();
  seqs.total_tokens = p.total();
  const AttnDims dims{Hq, Hkv, D, 0, 10000.0};
  Tensor tq = up(q, {T, Hq, D}), tk = up(k, {T, Hkv, D}), tv = up(v, {T, Hkv, D});
  Tensor to = be.alloc(DType::F32, {T, Hq, D}), tl = be.alloc(DType::F32, {Hq, T});
  be.attention_forward(to, tl, tq, tk, tv, dims, seqs);
  Outputs r;
  r.o = down(to);
  r.lse = down(tl);
  if (backward) {
    Tensor tdo = up(d_o, {T, Hq, D});
    Tensor tdq = be.alloc(DType::F32, {T, Hq, D}), tdk = be.alloc(DType::F32, {T, Hkv, D}),
           tdv = be.alloc(DType::F32, {T, Hkv, D});
    be.attention_backward(tdq, tdk, tdv, tdo, tq, tk, tv, to, tl, dims, seqs);
    r.dq = down(tdq);
    r.dk = down(tdk);
    r.dv = down(tdv);
  }
  return r;
}

// ---- device buffers with a sentinel tail -----------------------------------------------------------
constexpr size_t kGuard = 256;

struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

// Allocates bytes + guard, all bytes 0xFF (bf16 / f32 NaN), then copies src (if any) in front.
void dev_alloc(DevBuf& b, size_t bytes, const void* src) {
  b.bytes = bytes;
  ASSERT_EQ(cudaMalloc(&b.ptr, bytes + kGuard), cudaSuccess);
  ASSERT_EQ(cudaMemset(b.ptr, 0xFF, bytes + kGuard), cudaSuccess);
  if (src != nullptr) {
    ASSERT_EQ(cudaMemcpy(b.ptr, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
}

void expect_guard_intact(const char* name, const DevBuf& b) {
  std::vector<uint8_t> tail(kGuard);
  ASSERT_EQ(cudaMemcpy(tail.data(), static_cast<const char*>(b.ptr) + b.bytes, kGuard, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < kGuard; ++i)
    if (tail[i] != 0xFF) {
      ADD_FAILURE() << name << ": sentinel byte " << i << " after the buffer was overwritten";
      return;
    }
}

Vec download_bf16(const DevBuf& b) {
  std::vector<uint16_t> h(b.bytes / 2);
  EXPECT_EQ(cudaMemcpy(h.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  Vec out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = from_bf16(h[i]);
  return out;
}
Vec download_f32(const DevBuf& b) {
  Vec out(b.bytes / 4);
  EXPECT_EQ(cudaMemcpy(out.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

double max_abs(const Vec& x) {
  double m = 0;
  for (float e : x) m = std::max(m, static_cast<double>(std::fabs(e)));
  return m;
}

void expect_close(const std::string& name, const Vec& gpu, const Vec& ref32, const Vec& refbf, bool bf16_output) {
  ASSERT_EQ(gpu.size(), ref32.size()) << name;
  ASSERT_EQ(refbf.size(), ref32.size()) << name;
  double err_gpu = 0, err_bf = 0, floor = 0;
  size_t worst = 0, nonfinite = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) {
      if (nonfinite++ == 0) ADD_FAILURE() << name << "[" << i << "] is not finite: " << gpu[i];
      continue;
    }
    const double e = std::fabs(static_cast<double>(gpu[i]) - ref32[i]);
    if (e > err_gpu) {
      err_gpu = e;
      worst = i;
    }
    err_bf = std::max(err_bf, std::fabs(static_cast<double>(refbf[i]) - ref32[i]));
    if (bf16_output) floor = std::max(floor, std::fabs(static_cast<double>(bfr(ref32[i])) - ref32[i]));
  }
  EXPECT_EQ(nonfinite, 0u) << name << ": non-finite elements";
  const double tol = 2 * err_bf + floor + 1e-5 * std::max(1.0, max_abs(ref32));
  EXPECT_LE(err_gpu, tol) << name << ": max |gpu - ref32| at [" << worst << "]: gpu " << gpu[worst] << ", ref32 "
                          << ref32[worst] << ", refbf " << refbf[worst] << "; bf16-program error " << err_bf
                          << ", rounding floor " << floor;
}

Vec random_bf16(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> dist(0.f, 1.f);
  Vec x(n);
  for (auto& e : x) e = bfr(dist(rng));
  return x;
}

std::vector<uint16_t> to_bf16_vec(const Vec& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = to_bf16(x[i]);
  return h;
}

// The problem's arguments (head dim scale, no kernel options); cu_seqlens is set by AttnBuffers.
cuda::AttnArgs problem_args(const Problem& p) {
  return cuda::AttnArgs{nullptr, p.num_seqs(), p.max_seqlen(), p.total(), p.hq, p.hkv, p.d,
                        1.f / std::sqrt(static_cast<float>(p.d))};
}

// Device copies of a problem's inputs and (guarded) room for every output; a.cu_seqlens points at
// the copy of p.cu. Callers check HasFatalFailure() after construction.
struct AttnBuffers {
  DevBuf q, k, v, d_o, cu, o, lse, dq, dk, dv, ws;
  cuda::AttnArgs& a;
  AttnBuffers(const Problem& p, cuda::AttnArgs& args, const Vec& hq, const Vec& hk, const Vec& hv, const Vec& hdo)
      : a(args) {
    const size_t T = static_cast<size_t>(p.total()), nq = T * p.hq * p.d, nk = T * p.hkv * p.d;
    dev_alloc(q, nq * 2, to_bf16_vec(hq).data());
    dev_alloc(k, nk * 2, to_bf16_vec(hk).data());
    dev_alloc(v, nk * 2, to_bf16_vec(hv).data());
    dev_alloc(d_o, nq * 2, to_bf16_vec(hdo).data());
    dev_alloc(cu, p.cu.size() * 4, p.cu.data());
    dev_alloc(o, nq * 2, nullptr);
    dev_alloc(lse, T * p.hq * 4, nullptr);
    dev_alloc(dq, nq * 2, nullptr);
    dev_alloc(dk, nk * 2, nullptr);
    dev_alloc(dv, nk * 2, nullptr);
    a.cu_seqlens = static_cast<const int32_t*>(cu.ptr);
    dev_alloc(ws, std::max<size_t>(cuda::attention_workspace_bytes(a), 16), nullptr);
  }
  // Launches only (not synchronized); the backward reads the forward's o and lse.
  void forward() {
    cuda::attention_forward(o.ptr, static_cast<float*>(lse.ptr), q.ptr, k.ptr, v.ptr, a, ws.ptr, nullptr);
  }
  void backward() {
    cuda::attention_backward(dq.ptr, dk.ptr, dv.ptr, d_o.ptr, q.ptr, k.ptr, v.ptr, o.ptr,
                             static_cast<const float*>(lse.ptr), a, ws.ptr, nullptr);
  }
};

// deterministic: the backward's dQ from attn_bwd_dq_kernel; it also runs the backward twice and
// requires the same bits for dq, dk and dv. mma_sync: head_dim 256 on the mma.sync kernels instead
// of the default wgmma ones (the forward, and the deterministic backward's dK / dV).
void run_case(const Problem& p, bool backward, uint64_t seed, bool deterministic = false, bool mma_sync = false) {
  SCOPED_TRACE("D " + std::to_string(p.d) + ", Hq " + std::to_string(p.hq) + ", Hkv " + std::to_string(p.hkv) +
               ", T " + std::to_string(p.total()) + ", samples " + std::to_string(p.num_seqs()) +
               (deterministic ? ", deterministic" : "") + (mma_sync ? ", mma.sync kernels" : ""));
  const size_t T = static_cast<size_t>(p.total()), nq = T * p.hq * p.d, nk = T * p.hkv * p.d;
  std::mt19937_64 rng(seed);
  const Vec q = random_bf16(rng, nq), k = random_bf16(rng, nk), v = random_bf16(rng, nk), d_o = random_bf16(rng, nq);

  cuda::AttnArgs a = problem_args(p);
  a.deterministic = deterministic;
  a.mma_sync = mma_sync;
  AttnBuffers b(p, a, q, k, v, d_o);
  if (::testing::Test::HasFatalFailure()) return;
  b.forward();
  if (backward) b.backward();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());

  const Outputs r32 = reference_f32(p, q, k, v, d_o, backward);
  const Outputs rbf = reference_bf16(p, q, k, v, d_o, backward);
  expect_close("o", download_bf16(b.o), r32.o, rbf.o, true);
  expect_close("lse", download_f32(b.lse), r32.lse, rbf.lse, false);
  expect_guard_intact("o", b.o);
  expect_guard_intact("lse", b.lse);
  if (backward) {
    expect_close("dq", download_bf16(b.dq), r32.dq, rbf.dq, true);
    expect_close("dk", download_bf16(b.dk), r32.dk, rbf.dk, true);
    expect_close("dv", download_bf16(b.dv), r32.dv, rbf.dv, true);
    expect_guard_intact("dq", b.dq);
    expect_guard_intact("dk", b.dk);
    expect_guard_intact("dv", b.dv);
  }
  if (backward && deterministic) {
    const std::vector<float> q1 = download_bf16(b.dq), k1 = download_bf16(b.dk), v1 = download_bf16(b.dv);
    b.backward();
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(download_bf16(b.dq) == q1) << "dq differs between two deterministic runs";
    EXPECT_TRUE(download_bf16(b.dk) == k1) << "dk differs between two deterministic runs";
    EXPECT_TRUE(download_bf16(b.dv) == v1) << "dv differs between two deterministic runs";
  }
}

// (Hq, Hkv) per GQA ratio 1, 2, 4, 8.
const int kHeads[4][2] = {{2, 2}, {4, 2}, {4, 1}, {8, 1}};

#define SKIP_WITHOUT_CUDA() \
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device"

// Every awkward length around the 64-row tiles, packed in one row, for every head dim and GQA ratio.
TEST(CudaAttention, MixedLengthsAllHeadDimsAndRatios) {
  SKIP_WITHOUT_CUDA();
  const std::vector<int> lens = {1, 2, 3, 63, 64, 65, 127, 129};
  uint64_t seed = 1;
  for (int d : {64, 128, 256})
    for (const auto& hh : kHeads) run_case(make_problem(lens, hh[0], hh[1], d), true, seed++);
}

// The same lengths in a different order (the sample start is not tile-aligned for the long ones).
TEST(CudaAttention, MixedLengthsReversed) {
  SKIP_WITHOUT_CUDA();
  run_case(make_problem({129, 127, 65, 64, 63, 3, 2, 1}, 8, 2, 256), true, 11);
}

// Many short samples in one row.
TEST(CudaAttention, ManyShortSamples) {
  SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> len(1, 48);
  std::vector<int> lens(60);
  for (auto& l : lens) l = len(rng);
  run_case(make_problem(lens, 4, 1, 128), true, 21);
  run_case(make_problem(lens, 8, 2, 256), true, 22);
  run_case(make_problem(lens, 8, 8, 64), true, 23);
}

// One long sample (2048 keeps the CPU references at a few seconds), and a long one packed with others.
TEST(CudaAttention, LongSample) {
  SKIP_WITHOUT_CUDA();
  run_case(make_problem({2048}, 2, 1, 256), true, 31);
  run_case(make_problem({700, 1, 1300, 47}, 4, 2, 128), true, 32);
}

// The deterministic backward (dQ by its own kernel, no atomics): the same cases against the
// references, and bit-equal across two runs.
TEST(CudaAttention, DeterministicBackward) {
  SKIP_WITHOUT_CUDA();
  const std::vector<int> lens = {1, 2, 3, 63, 64, 65, 127, 129};
  uint64_t seed = 51;
  for (int d : {64, 128, 256})
    for (const auto& hh : kHeads) run_case(make_problem(lens, hh[0], hh[1], d), true, seed++, true);
  std::mt19937_64 rng(6);
  std::uniform_int_distribution<int> len(1, 48);
  std::vector<int> short_lens(60);
  for (auto& l : short_lens) l = len(rng);
  run_case(make_problem(short_lens, 8, 2, 256), true, seed++, true);
  run_case(make_problem({700, 1, 1300, 47}, 8, 2, 256), true, seed++, true);
}

// Head dim 256 has two sets of kernels (wgmma by default, mma.sync on request: the forward and the
// deterministic backward's dK / dV): the other tests cover the wgmma ones, this the mma.sync ones,
// on the awkward lengths and on many short samples, with both backward modes.
TEST(CudaAttention, MmaSyncKernelsHeadDim256) {
  SKIP_WITHOUT_CUDA();
  uint64_t seed = 71;
  for (const auto& hh : kHeads)
    for (bool det : {false, true})
      run_case(make_problem({1, 2, 3, 63, 64, 65, 127, 129}, hh[0], hh[1], 256), true, seed++, det, true);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> len(1, 48);
  std::vector<int> short_lens(60);
  for (auto& l : short_lens) l = len(rng);
  run_case(make_problem(short_lens, 8, 2, 256), true, seed++, true, true);
}

// The persistent forward deals (query tile, head) items to one CTA per SM: at 24 query tiles and 16
// heads there are 384 items, so every CTA walks about three, its K / V rings and the Q stage running
// on across items of different samples (long ones: many key tiles per item). Against the
// references, and the deterministic backward bit-equal across two runs.
TEST(CudaAttention, PersistentForwardManyItemsPerCta) {
  SKIP_WITHOUT_CUDA();
  run_case(make_problem({600, 3, 300, 129, 450, 64, 250, 700}, 16, 4, 256), true, 98, true);
}

// A sample's results must not depend on its neighbours in the packed row, even when those hold
// non-finite values: the wgmma kernels (D = 256) read the key tiles past a sample's end from the
// next sample by TMA (masked scores, P and dS; V, K and, in dK / dV, Q and dO rows zeroed), the
// mma.sync kernels (D = 64, 128) zero-fill them. The odd samples' q, k, v and dO become NaN / Inf;
// every even sample's o, lse, dq, dk and dv must keep the clean run's bits (deterministic backward,
// so two runs are comparable bit for bit).
TEST(CudaAttention, NeighboursNonFiniteDoNotLeak) {
  SKIP_WITHOUT_CUDA();
  const std::vector<int> lens = {65, 63, 130, 1, 70, 200, 129};
  for (int d : {64, 128, 256}) {
    const Problem p = make_problem(lens, 4, 2, d);
    SCOPED_TRACE("D " + std::to_string(d));
    const size_t T = static_cast<size_t>(p.total()), nq = T * p.hq * d, nk = T * p.hkv * d;
    std::mt19937_64 rng(100 + d);
    Vec q = random_bf16(rng, nq), k = random_bf16(rng, nk), v = random_bf16(rng, nk), d_o = random_bf16(rng, nq);
    cuda::AttnArgs a = problem_args(p);
    a.deterministic = true;
    struct Run {
      Vec o, lse, dq, dk, dv;
    };
    auto run = [&](const Vec& hq_, const Vec& hk, const Vec& hv, const Vec& hdo) -> Run {
      AttnBuffers b(p, a, hq_, hk, hv, hdo);
      if (::testing::Test::HasFatalFailure()) return Run{};
      b.forward();
      b.backward();
      const cudaError_t err = cudaDeviceSynchronize();
      EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
      if (err != cudaSuccess) return Run{};
      return Run{download_bf16(b.o), download_f32(b.lse), download_bf16(b.dq), download_bf16(b.dk),
                 download_bf16(b.dv)};
    };
    const Run clean = run(q, k, v, d_o);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int s = 1; s < p.num_seqs(); s += 2)
      for (int t = p.cu[s]; t < p.cu[s + 1]; ++t) {
        for (size_t e = 0; e < static_cast<size_t>(p.hq) * d; ++e) {
          q[static_cast<size_t>(t) * p.hq * d + e] = bad[e % 3];
          d_o[static_cast<size_t>(t) * p.hq * d + e] = bad[(e + 1) % 3];
        }
        for (size_t e = 0; e < static_cast<size_t>(p.hkv) * d; ++e) {
          k[static_cast<size_t>(t) * p.hkv * d + e] = bad[(e + 2) % 3];
          v[static_cast<size_t>(t) * p.hkv * d + e] = bad[e % 3];
        }
      }
    const Run dirty = run(q, k, v, d_o);
    if (::testing::Test::HasFatalFailure()) return;
    size_t differ = 0, checked = 0;
    auto same_rows = [&](const Vec& x, const Vec& y, size_t row_elems) {
      for (int s = 0; s < p.num_seqs(); s += 2)
        for (size_t i = p.cu[s] * row_elems; i < p.cu[s + 1] * row_elems; ++i, ++checked)
          if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) ++differ;
    };
    same_rows(clean.o, dirty.o, static_cast<size_t>(p.hq) * d);
    same_rows(clean.dq, dirty.dq, static_cast<size_t>(p.hq) * d);
    same_rows(clean.dk, dirty.dk, static_cast<size_t>(p.hkv) * d);
    same_rows(clean.dv, dirty.dv, static_cast<size_t>(p.hkv) * d);
    for (int h = 0; h < p.hq; ++h)
      for (int s = 0; s < p.num_seqs(); s += 2)
        for (int t = p.cu[s]; t < p.cu[s + 1]; ++t, ++checked) {
          const size_t i = static_cast<size_t>(h) * T + t;
          if (std::memcmp(&clean.lse[i], &dirty.lse[i], sizeof(float)) != 0) ++differ;
        }
    EXPECT_EQ(differ, 0u) << "of " << checked << " elements of the even samples changed";
    EXPECT_GT(checked, 0u);
  }
}

// 8192-token sample, forward only: o and lse of a subset of rows (the first, some in the middle,
// the last 64) against a double-precision per-row reference and the bf16-program row.
TEST(CudaAttention, Forward8192RowSubset) {
  SKIP_WITHOUT_CUDA();
  const Problem p = make_problem({8192}, 2, 1, 256);
  const int T = p.total(), Hq = p.hq, D = p.d;
  const size_t nq = static_cast<size_t>(T) * Hq * D, nk = static_cast<size_t>(T) * p.hkv * D;
  std::mt19937_64 rng(41);
  const Vec q = random_bf16(rng, nq), k = random_bf16(rng, nk), v = random_bf16(rng, nk);
  DevBuf dq_in, dk_in, dv_in, dcu, o, lse, ws;
  dev_alloc(dq_in, nq * 2, to_bf16_vec(q).data());
  dev_alloc(dk_in, nk * 2, to_bf16_vec(k).data());
  dev_alloc(dv_in, nk * 2, to_bf16_vec(v).data());
  dev_alloc(dcu, p.cu.size() * 4, p.cu.data());
  dev_alloc(o, nq * 2, nullptr);
  dev_alloc(lse, static_cast<size_t>(T) * Hq * 4, nullptr);
  cuda::AttnArgs a{static_cast<const int32_t*>(dcu.ptr), 1, T, T, Hq, p.hkv, D, 1.f / 16.f};
  dev_alloc(ws, cuda::attention_workspace_bytes(a), nullptr);
  if (::testing::Test::HasFatalFailure()) return;
  cuda::attention_forward(o.ptr, static_cast<float*>(lse.ptr), dq_in.ptr, dk_in.ptr, dv_in.ptr, a, ws.ptr, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const Vec go = download_bf16(o), gl = download_f32(lse);
  expect_guard_intact("o", o);
  expect_guard_intact("lse", lse);

  std::vector<int> rows;
  for (int i = 0; i < 8; ++i) rows.push_back(i);
  for (int i = 4090; i < 4100; ++i) rows.push_back(i);
  for (int i = T - 64; i < T; ++i) rows.push_back(i);
  const RowCtx c = make_ctx(p, q, k, v, v);
  Vec g_o, r_o, b_o, g_l, r_l, b_l;
  for (int h = 0; h < Hq; ++h)
    for (int i : rows) {
      // double reference
      std::vector<double> s(static_cast<size_t>(i + 1));
      double mx = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int e = 0; e < D; ++e)
          dot += static_cast<double>(q[(static_cast<size_t>(i) * Hq + h) * D + e]) * k[static_cast<size_t>(j) * D + e];
        s[static_cast<size_t>(j)] = dot / 16.0;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      std::vector<double> od(static_cast<size_t>(D), 0.0);
      for (int j = 0; j <= i; ++j)
        for (int e = 0; e < D; ++e) od[static_cast<size_t>(e)] += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j) * D + e];
      // bf16-program row
      float bmx, bsum;
      c.stats(i, h, bmx, bsum);
      std::vector<float> ob(static_cast<size_t>(D), 0.f);
      for (int j = 0; j <= i; ++j) {
        const float pj = c.prob(i, h, j, bmx, bsum);
        for (int e = 0; e < D; ++e) ob[static_cast<size_t>(e)] += pj * v[static_cast<size_t>(j) * D + e];
      }
      for (int e = 0; e < D; ++e) {
        g_o.push_back(go[(static_cast<size_t>(i) * Hq + h) * D + e]);
        r_o.push_back(static_cast<float>(od[static_cast<size_t>(e)]));
        b_o.push_back(bfr(ob[static_cast<size_t>(e)]));
      }
      g_l.push_back(gl[static_cast<size_t>(h) * T + i]);
      r_l.push_back(static_cast<float>(mx + std::log(sum)));
      b_l.push_back(bmx + std::log(bsum));
    }
  expect_close("o (row subset)", g_o, r_o, b_o, true);
  expect_close("lse (row subset)", g_l, r_l, b_l, false);
}

}  // namespace
}  // namespace qt
