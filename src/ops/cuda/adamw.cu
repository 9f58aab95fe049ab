#include "ops/cuda/adamw.h"

#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"

namespace qt::cuda {
namespace {

constexpr int64_t kChunk = 65536;  // elements per block
constexpr int kThreads = 512;

struct DevTensor {
  float* master;
  float* m;
  float* v;
  const void* grad;  // bf16 or f32 (grad_f32)
  dev::bf16* param;
  int64_t n;
  int decay;     // 1: weight decay float(weight_decay); 0: none (selected, never multiplied)
  int vec;       // 1: master/m/v and an f32 grad 16-byte, a bf16 grad and param 8-byte aligned
  int grad_f32;  // 1: fp32 gradients (accumulated across micro-batches without bf16 rounding)
  int in_norm;   // 0: left out of the gradient norm (its partials are 0)
};

__device__ __forceinline__ float grad_at(const DevTensor& t, int64_t i) {
  return t.grad_f32 ? static_cast<const float*>(t.grad)[i] : dev::to_f(static_cast<const dev::bf16*>(t.grad)[i]);
}
struct ChunkRef {
  int32_t tensor;
  int32_t chunk;
};

}  // namespace

// Read by the kernels from device memory (not passed by value), so a captured step picks up each
// replay's learning rate, bias corrections and gradient multiplier from the copy that precedes it.
struct AdamWHyper {
  float b1, b2, one_minus_b1, one_minus_b2, bc1, bc2, lr, eps, wd;
  double host_clip;
  double grad_mult;  // the gradients are multiplied by this (1 / trained tokens of the step)
  int use_device_clip;
};

namespace {
using Hyper = AdamWHyper;

__global__ void __launch_bounds__(kThreads) sumsq_kernel(double* partials, const DevTensor* ts, const ChunkRef* map) {
  __shared__ double sm[kThreads];
  const ChunkRef cr = map[blockIdx.x];
  const DevTensor t = ts[cr.tensor];
  const int64_t i0 = int64_t(cr.chunk) * kChunk, i1 = min(t.n, i0 + kChunk);
  double acc = 0.0;
  // Same order as one element per step (i = i0 + tid, + kThreads, ...); only the loads are batched.
  constexpr int kB = 8;
  int64_t i = t.in_norm ? i0 + threadIdx.x : i1;
  for (; i + (kB - 1) * kThreads < i1; i += kB * kThreads) {
    float g[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) g[b] = grad_at(t, i + b * kThreads);
#pragma unroll
    for (int b = 0; b < kB; ++b) acc = __dadd_rn(acc, __dmul_rn(double(g[b]), double(g[b])));
  }
  for (; i < i1; i += kThreads) {
    const double g = double(grad_at(t, i));
    acc = __dadd_rn(acc, __dmul_rn(g, g));
  }
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sm[threadIdx.x] = __dadd_rn(sm[threadIdx.x], sm[threadIdx.x + o]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sm[0];
}

// The norm and clip factor from the sum of squares (norm_clip[0] holds it, and gets the norm).
__device__ void norm_clip_from_sumsq(double* norm_clip, double sumsq, double max_norm, const Hyper* h) {
  // The norm of grad_mult * g; the factor applied to g is grad_mult times the clip factor (both
  // products are exact when grad_mult is 1, which keeps the bit-exact CPU twin).
  const double mult = h->grad_mult;
  const double norm = __dmul_rn(__dsqrt_rn(sumsq), mult);
  norm_clip[0] = norm;
  // clip_factor(): 1 when max_norm <= 0 or !(norm > max_norm), else max_norm / (norm + 1e-6).
  const double clip = (max_norm <= 0.0 || !(norm > max_norm)) ? 1.0 : __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
  norm_clip[1] = __dmul_rn(clip, mult);
}

// sum_only: leave the sum of squares in norm_clip[0] (a reducer sums it over the ranks, then
// norm_finish_kernel takes the norm).
__global__ void __launch_bounds__(1024) norm_kernel(double* norm_clip, const double* partials, int64_t n,
                                                    double max_norm, const Hyper* h, int sum_only) {
  __shared__ double sm[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += 1024) acc = __dadd_rn(acc, partials[i]);
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int o = 512; o > 0; o >>= 1) {
    if (threadIdx.x < o) sm[threadIdx.x] = __dadd_rn(sm[threadIdx.x], sm[threadIdx.x + o]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (sum_only) norm_clip[0] = sm[0];
    else norm_clip_from_sumsq(norm_clip, sm[0], max_norm, h);
  }
}

__global__ void norm_finish_kernel(double* norm_clip, double max_norm, const Hyper* h) {
  norm_clip_from_sumsq(norm_clip, norm_clip[0], max_norm, h);
}

// The exact float operation sequence of adamw_update (ops/cpu/adamw.cpp), with g = float(g * clip)
// as the trainer clips (a double product rounded to float) when clip != 1.
__global__ void __launch_bounds__(kThreads) adamw_kernel(const DevTensor* ts, const ChunkRef* map, const Hyper* hp,
                                                         const double* norm_clip) {
  const Hyper h = *hp;
  // A non-finite gradient norm skips the update: the weights and moments stay as they were, and
  // the host, reading the norm after the step, stops naming the first bad tensor.
  if (h.use_device_clip && !isfinite(norm_clip[0])) return;
  const ChunkRef cr = map[blockIdx.x];
  const DevTensor t = ts[cr.tensor];
  const double clip = h.use_device_clip ? norm_clip[1] : h.host_clip;
  const float wd = t.decay ? h.wd : 0.0f;
  const int64_t i0 = int64_t(cr.chunk) * kChunk, i1 = min(t.n, i0 + kChunk);
  auto step = [&](float gi, float& m_io, float& v_io, float& p_io) {
    if (clip != 1.0) gi = __double2float_rn(__dmul_rn(double(gi), clip));
    const float m = __fadd_rn(__fmul_rn(h.b1, m_io), __fmul_rn(h.one_minus_b1, gi));
    const float v = __fadd_rn(__fmul_rn(h.b2, v_io), __fmul_rn(__fmul_rn(h.one_minus_b2, gi), gi));
    m_io = m;
    v_io = v;
    const float mhat = __fdiv_rn(m, h.bc1), vhat = __fdiv_rn(v, h.bc2);
    const float p = p_io;
    const float upd = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), h.eps)), __fmul_rn(wd, p));
    p_io = __fsub_rn(p, __fmul_rn(h.lr, upd));
  };
  int64_t i = i0;
  if (t.vec) {
    // Four elements per thread per step (float4 / 8-byte accesses); the tail falls to the scalar loop.
    for (i = i0 + 4 * int64_t(threadIdx.x); i + 4 <= i1; i += 4 * kThreads) {
      float4 m4 = *reinterpret_cast<const float4*>(t.m + i);
      float4 v4 = *reinterpret_cast<const float4*>(t.v + i);
      float4 p4 = *reinterpret_cast<const float4*>(t.master + i);
      float2 g01, g23;
      if (t.grad_f32) {
        const float4 g4 = *reinterpret_cast<const float4*>(static_cast<const float*>(t.grad) + i);
        g01 = make_float2(g4.x, g4.y);
        g23 = make_float2(g4.z, g4.w);
      } else {
        const uint2 graw = *reinterpret_cast<const uint2*>(static_cast<const dev::bf16*>(t.grad) + i);
        g01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&graw.x));
        g23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&graw.y));
      }
      step(g01.x, m4.x, v4.x, p4.x);
      step(g01.y, m4.y, v4.y, p4.y);
      step(g23.x, m4.z, v4.z, p4.z);
      step(g23.y, m4.w, v4.w, p4.w);
      *reinterpret_cast<float4*>(t.m + i) = m4;
      *reinterpret_cast<float4*>(t.v + i) = v4;
      *reinterpret_cast<float4*>(t.master + i) = p4;
      if (t.param != nullptr) {
        uint2 praw;
        *reinterpret_cast<__nv_bfloat162*>(&praw.x) = __halves2bfloat162(dev::to_bf(p4.x), dev::to_bf(p4.y));
        *reinterpret_cast<__nv_bfloat162*>(&praw.y) = __halves2bfloat162(dev::to_bf(p4.z), dev::to_bf(p4.w));
        *reinterpret_cast<uint2*>(t.param + i) = praw;
      }
    }
    // Elements past the last full group of four (at most 3 per chunk end), one thread each.
    i = i0 + ((i1 - i0) / 4) * 4 + threadIdx.x;
  } else {
    i = i0 + threadIdx.x;
  }
  for (; i < i1; i += kThreads) {
    float m = t.m[i], v = t.v[i], p = t.master[i];
    step(grad_at(t, i), m, v, p);
    t.m[i] = m;
    t.v[i] = v;
    t.master[i] = p;
    if (t.param != nullptr) t.param[i] = dev::to_bf(p);
  }
}

}  // namespace

AdamWMultiTensor::AdamWMultiTensor(const std::vector<AdamWTensor>& tensors) {
  std::vector<DevTensor> dt;
  std::vector<ChunkRef> map;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const AdamWTensor& t = tensors[k];
    QT_CHECK(t.n >= 0 && (t.n == 0 || (t.master && t.m && t.v && t.grad)), "AdamWMultiTensor: tensor ", k,
             " is missing a buffer");
    const uintptr_t grad_align = t.grad_f32 ? 15u : 7u;
    dt.push_back(DevTensor{t.master, t.m, t.v, t.grad, static_cast<dev::bf16*>(t.param), t.n, t.decay ? 1 : 0,
                           aligned16(t.master) && aligned16(t.m) && aligned16(t.v) &&
                                   (reinterpret_cast<uintptr_t>(t.grad) & grad_align) == 0 &&
                                   (reinterpret_cast<uintptr_t>(t.param) & 7u) == 0
                               ? 1
                               : 0,
                           t.grad_f32 ? 1 : 0, t.in_norm ? 1 : 0});
    const int64_t chunks = ceil_div(t.n, kChunk);
    QT_CHECK(chunks < (int64_t(1) << 31), "AdamWMultiTensor: tensor ", k, " is too large");
    for (int64_t c = 0; c < chunks; ++c) map.push_back(ChunkRef{int32_t(k), int32_t(c)});
    total_ += t.n;
  }
  num_tensors_ = int64_t(dt.size());
  num_chunks_ = int64_t(map.size());
  const size_t tbytes = sizeof(DevTensor) * dt.size(), mbytes = sizeof(ChunkRef) * map.size();
  CUDA_CHECK(cudaMalloc(&table_, tbytes + mbytes + 16));
  CUDA_CHECK(cudaMalloc(&partials_, sizeof(double) * size_t(std::max<int64_t>(num_chunks_, 1))));
  CUDA_CHECK(cudaMalloc(&norm_clip_, 2 * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&hyper_dev_, 2 * sizeof(Hyper)));
  CUDA_CHECK(cudaHostAlloc(&hyper_host_, sizeof(Hyper), cudaHostAllocDefault));
  Hyper unit{};
  unit.grad_mult = 1.0;
  unit.host_clip = 1.0;
  *static_cast<Hyper*>(hyper_host_) = unit;
  CUDA_CHECK(cudaMemcpy(hyper_dev_, &unit, sizeof(Hyper), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(static_cast<Hyper*>(hyper_dev_) + 1, &unit, sizeof(Hyper), cudaMemcpyHostToDevice));
  if (tbytes > 0) CUDA_CHECK(cudaMemcpy(table_, dt.data(), tbytes, cudaMemcpyHostToDevice));
  if (mbytes > 0) CUDA_CHECK(cudaMemcpy(static_cast<char*>(table_) + tbytes, map.data(), mbytes, cudaMemcpyHostToDevice));
  const double init[2] = {0.0, 1.0};
  CUDA_CHECK(cudaMemcpy(norm_clip_, init, sizeof(init), cudaMemcpyHostToDevice));
}

AdamWMultiTensor::~AdamWMultiTensor() {
  cudaFree(table_);
  cudaFree(partials_);
  cudaFree(norm_clip_);
  cudaFree(hyper_dev_);
  cudaFreeHost(hyper_host_);
}

namespace {
// Host-side constants exactly as adamw_update computes them (double -> float casts). The
// per-tensor weight decay is float(weight_decay) for decayed tensors and 0 otherwise.
Hyper make_hyper(double lr, double weight_decay, const AdamWConfig& cfg, int64_t step, double grad_mult,
                 bool use_device_clip, double host_clip) {
  Hyper h{};
  h.b1 = static_cast<float>(cfg.beta1);
  h.b2 = static_cast<float>(cfg.beta2);
  h.one_minus_b1 = 1.0f - h.b1;
  h.one_minus_b2 = 1.0f - h.b2;
  h.bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
  h.bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
  h.lr = static_cast<float>(lr);
  h.eps = static_cast<float>(cfg.eps);
  h.host_clip = host_clip;
  h.grad_mult = grad_mult;
  h.use_device_clip = use_device_clip ? 1 : 0;
  h.wd = static_cast<float>(weight_decay);
  return h;
}
}  // namespace

void AdamWMultiTensor::norm_pass(double max_norm, const void* hyper, cudaStream_t stream) {
  const auto* ts = static_cast<const DevTensor*>(table_);
  const auto* map = reinterpret_cast<const ChunkRef*>(static_cast<char*>(table_) + sizeof(DevTensor) * size_t(num_tensors_));
  if (num_chunks_ > 0) {
    sumsq_kernel<<<static_cast<unsigned>(num_chunks_), kThreads, 0, stream>>>(partials_, ts, map);
    QT_LAUNCH_CHECK("adamw grad_norm (partials)");
  }
  const int sum_only = reducer_ ? 1 : 0;
  norm_kernel<<<1, 1024, 0, stream>>>(norm_clip_, partials_, num_chunks_, max_norm, static_cast<const Hyper*>(hyper),
                                      sum_only);
  QT_LAUNCH_CHECK("adamw grad_norm");
  if (!reducer_) return;
  reducer_(norm_clip_, stream);
  norm_finish_kernel<<<1, 1, 0, stream>>>(norm_clip_, max_norm, static_cast<const Hyper*>(hyper));
  QT_LAUNCH_CHECK("adamw grad_norm (finish)");
}

void AdamWMultiTensor::update_pass(const void* hyper, cudaStream_t stream) {
  if (num_chunks_ == 0) return;
  const auto* map = reinterpret_cast<const ChunkRef*>(static_cast<char*>(table_) + sizeof(DevTensor) * size_t(num_tensors_));
  adamw_kernel<<<static_cast<unsigned>(num_chunks_), kThreads, 0, stream>>>(static_cast<const DevTensor*>(table_), map,
                                                                           static_cast<const Hyper*>(hyper), norm_clip_);
  QT_LAUNCH_CHECK("adamw update");
}

// Eager calls use hyper slot 0 (written from pageable memory: the copy is staged before
// cudaMemcpyAsync returns, so back-to-back calls cannot overwrite each other's values); its
// grad_mult is always 1.
void AdamWMultiTensor::grad_norm(double max_norm, cudaStream_t stream) { norm_pass(max_norm, hyper_dev_, stream); }

void AdamWMultiTensor::update(double lr, double weight_decay, const AdamWConfig& cfg, int64_t step,
                              cudaStream_t stream, bool use_device_clip, double host_clip) {
  const Hyper h = make_hyper(lr, weight_decay, cfg, step, 1.0, use_device_clip, host_clip);
  CUDA_CHECK(cudaMemcpyAsync(hyper_dev_, &h, sizeof h, cudaMemcpyHostToDevice, stream));
  update_pass(hyper_dev_, stream);
}

void AdamWMultiTensor::set_step(double lr, double weight_decay, const AdamWConfig& cfg, int64_t step,
                                double grad_mult) {
  *static_cast<Hyper*>(hyper_host_) = make_hyper(lr, weight_decay, cfg, step, grad_mult, true, 1.0);
}

void AdamWMultiTensor::enqueue(double max_norm, cudaStream_t stream) {
  Hyper* staged = static_cast<Hyper*>(hyper_dev_) + 1;
  CUDA_CHECK(cudaMemcpyAsync(staged, hyper_host_, sizeof(Hyper), cudaMemcpyHostToDevice, stream));
  norm_pass(max_norm, staged, stream);
  update_pass(staged, stream);
}

}  // namespace qt::cuda
