// CudaBackend kernels: attn_prep, q / k (1+w) RMSNorm per head + partial rotate-half RoPE
// (forward / backward; the dw sums through per-block partial rows and launch_column_reduce).
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

// cos/sin of position * theta^(-2j/rot), computed in double like the CPU reference.
__device__ __forceinline__ void rope_cs(float& c, float& s, int32_t pos, int j, int rot, double theta) {
  const double inv_freq = pow(theta, -2.0 * double(j) / double(rot));
  double sd, cd;
  sincos(double(pos) * inv_freq, &sd, &cd);
  c = float(cd);
  s = float(sd);
}

// The cos/sin pairs of `ntok` consecutive tokens' rotary frequencies into cs[token][j], j < rot/2:
// each is computed once per token (in double, like the CPU reference), not once per head and
// rotated element.
__device__ __forceinline__ void rope_table(float2 (*cs)[kMaxHeadDim / 2], const int32_t* positions, int64_t t0,
                                           int ntok, int rot, double theta, int tid, int nthreads) {
  const int half = rot / 2;
  for (int i = tid; i < ntok * half; i += nthreads) {
    float c, sn;
    rope_cs(c, sn, positions[t0 + i / half], i % half, rot, theta);
    cs[i / half][i % half] = make_float2(c, sn);
  }
}

// Rotate-half RoPE of element d of a head row r held in shared memory (r[d] is also passed as v):
// dir +1 applies the rotation (forward), -1 its inverse (backward: rotating dy back).
__device__ __forceinline__ float rope_elem(const float* r, float v, const float2* cs, int d, int rot, float dir) {
  const int half = rot / 2;
  if (d < half) return v * cs[d].x - dir * r[d + half] * cs[d].y;
  if (d < rot) return v * cs[d - half].x + dir * r[d - half] * cs[d - half].y;
  return v;
}

// Lane l holds elements [8 l, 8 l + 8) of a head row (l < D / 8): 16-byte loads and stores, the
// row also parked in the warp's shared row so lanes can read their rotation partners.
__device__ __forceinline__ void park8(float* row, int lane, const float (&v)[8]) {
  reinterpret_cast<float4*>(row)[2 * lane] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(row)[2 * lane + 1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Block = kPrepTokens tokens: their cos/sin rows first, then warps take (token, head) items; heads
// [0, Hq) are query heads (from qg, also copying the gate half), [Hq, Hq + Hkv) key heads (from kr).
constexpr int kPrepTokens = 8;
__global__ void __launch_bounds__(kFwdWarps * 32) attn_prep_fwd_kernel(
    bf16* q, bf16* k, bf16* gate, float* q_rstd, float* k_rstd, const bf16* qg, const bf16* kr, const bf16* qw,
    const bf16* kw, const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rot, double theta, float eps) {
  __shared__ __align__(16) float sm[kFwdWarps][kMaxHeadDim];
  __shared__ float2 cs[kPrepTokens][kMaxHeadDim / 2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * kPrepTokens;
  const int ntok = T - t0 < kPrepTokens ? int(T - t0) : kPrepTokens;
  rope_table(cs, positions, t0, ntok, rot, theta, threadIdx.x, blockDim.x);
  __syncthreads();
  const int H = Hq + Hkv;
  const bool on = lane < D / 8;
  float* n = sm[warp];
  for (int item = warp; item < ntok * H; item += kFwdWarps) {
    const int64_t t = t0 + item / H;
    const int hh = item % H;
    const bool is_q = hh < Hq;
    const bf16* src = is_q ? qg + (t * Hq + hh) * 2 * D : kr + (t * Hkv + (hh - Hq)) * D;
    float v[8];
    dev::unpack8(v, on ? reinterpret_cast<const uint4*>(src)[lane] : make_uint4(0u, 0u, 0u, 0u));
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    ss = dev::warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / float(D) + eps);
    if (lane == 0) {
      if (is_q) q_rstd[t * Hq + hh] = rs;
      else k_rstd[t * Hkv + (hh - Hq)] = rs;
    }
    if (on) {
      float wv[8];
      dev::unpack8(wv, reinterpret_cast<const uint4*>(is_q ? qw : kw)[lane]);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * rs * (1.0f + wv[j]);
      park8(n, lane, v);
    }
    __syncwarp();
    if (on) {
      float out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = rope_elem(n, v[j], cs[item / H], 8 * lane + j, rot, 1.0f);
      bf16* dst = is_q ? q + (t * Hq + hh) * D : k + (t * Hkv + (hh - Hq)) * D;
      reinterpret_cast<uint4*>(dst)[lane] = dev::pack8(out);
      if (is_q) reinterpret_cast<uint4*>(gate + (t * Hq + hh) * D)[lane] = reinterpret_cast<const uint4*>(src + D)[lane];
    }
    __syncwarp();  // the partners are read before the next item overwrites the row
  }
}

// Block = kPrepBwdWarps warps over a range of tokens; a warp handles whole tokens (all heads), with
// the token's cos/sin row computed once into its shared row. Per lane: 8 elements of a head row,
// the (1 + w) factors of both norms and the dw sums in registers; smem per warp: the cos/sin row,
// dy parked for the rotation partners, the final dw row [2D] (query weight, then key weight).
constexpr int kPrepBwdWarps = 8;
__global__ void __launch_bounds__(kPrepBwdWarps * 32) attn_prep_bwd_kernel(
    bf16* dqg, bf16* dkr, float* partials, const bf16* dq, const bf16* dk, const bf16* dgate, const bf16* qg,
    const bf16* kr, const bf16* qw, const bf16* kw, const float* q_rstd, const float* k_rstd,
    const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rot, double theta, int64_t tokens_per_block) {
  __shared__ __align__(16) float sm_dy[kPrepBwdWarps][kMaxHeadDim];
  __shared__ float sm_dw[kPrepBwdWarps][2 * kMaxHeadDim];
  __shared__ float2 sm_cs[kPrepBwdWarps][kMaxHeadDim / 2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool on = lane < D / 8;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float* dyrow = sm_dy[warp];
  const float2* cs = sm_cs[warp];
  float wq[8], wk[8], dwq[8], dwk[8];
  dev::unpack8(wq, on ? reinterpret_cast<const uint4*>(qw)[lane] : zero);
  dev::unpack8(wk, on ? reinterpret_cast<const uint4*>(kw)[lane] : zero);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    wq[j] += 1.0f;
    wk[j] += 1.0f;
    dwq[j] = dwk[j] = 0.0f;
  }
  const int64_t t0 = int64_t(blockIdx.x) * tokens_per_block, t1 = min(T, t0 + tokens_per_block);
  for (int64_t t = t0 + warp; t < t1; t += kPrepBwdWarps) {
    __syncwarp();  // the previous token's reads of the cos/sin row are done
    rope_table(&sm_cs[warp], positions, t, 1, rot, theta, lane, 32);
    for (int hh = 0; hh < Hq + Hkv; ++hh) {
      const bool is_q = hh < Hq;
      const bf16* dy = is_q ? dq + (t * Hq + hh) * D : dk + (t * Hkv + (hh - Hq)) * D;
      const bf16* x = is_q ? qg + (t * Hq + hh) * 2 * D : kr + (t * Hkv + (hh - Hq)) * D;
      const float rs = is_q ? q_rstd[t * Hq + hh] : k_rstd[t * Hkv + (hh - Hq)];
      float dv[8], xv[8];
      dev::unpack8(dv, on ? reinterpret_cast<const uint4*>(dy)[lane] : zero);
      dev::unpack8(xv, on ? reinterpret_cast<const uint4*>(x)[lane] : zero);
      __syncwarp();  // the previous head's partner reads are done (and the cos/sin row is written)
      if (on) park8(dyrow, lane, dv);
      __syncwarp();
      float r[8], dot = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // r = dy rotated back by the angle
        r[j] = on ? rope_elem(dyrow, dv[j], cs, 8 * lane + j, rot, -1.0f) : 0.0f;
        dot += (xv[j] * rs) * (r[j] * (is_q ? wq[j] : wk[j]));
      }
      const float mean = dev::warp_sum(dot) / float(D);
      if (!on) continue;
      float dx[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float n = xv[j] * rs;
        dx[j] = rs * (r[j] * (is_q ? wq[j] : wk[j]) - n * mean);
        if (is_q) dwq[j] += r[j] * n;
        else dwk[j] += r[j] * n;
      }
      bf16* dxp = is_q ? dqg + (t * Hq + hh) * 2 * D : dkr + (t * Hkv + (hh - Hq)) * D;
      reinterpret_cast<uint4*>(dxp)[lane] = dev::pack8(dx);
      if (is_q) reinterpret_cast<uint4*>(dxp + D)[lane] = reinterpret_cast<const uint4*>(dgate + (t * Hq + hh) * D)[lane];
    }
  }
  if (on)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sm_dw[warp][8 * lane + j] = dwq[j];
      sm_dw[warp][D + 8 * lane + j] = dwk[j];
    }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kPrepBwdWarps; ++k) acc += sm_dw[k][c];
    partials[int64_t(blockIdx.x) * 2 * D + c] = acc;
  }
}

int64_t prep_bwd_blocks(int64_t T) { return std::min<int64_t>(kMaxPartialBlocks, ceil_div(T, 8)); }

}  // namespace

void launch_attn_prep_forward(void* q, void* k, void* gate, float* q_rstd, float* k_rstd, const void* qg,
                              const void* kr, const void* q_norm_w, const void* k_norm_w, const int32_t* positions,
                              int64_t T, int Hq, int Hkv, int D, int rotary_dim, double theta, float eps,
                              cudaStream_t s) {
  if (T <= 0) return;
  QT_CHECK(D <= kMaxHeadDim, "attn_prep_forward: head_dim ", D, " exceeds the CUDA kernel's ", kMaxHeadDim);
  QT_CHECK(D % 8 == 0 && aligned16(qg) && aligned16(kr), "attn_prep_forward: head_dim ", D,
           " must be a multiple of 8 with 16-byte aligned rows (the CUDA kernel's vectors)");
  attn_prep_fwd_kernel<<<static_cast<unsigned>(ceil_div(T, kPrepTokens)), kFwdWarps * 32, 0, s>>>(
      static_cast<bf16*>(q), static_cast<bf16*>(k), static_cast<bf16*>(gate), q_rstd, k_rstd,
      static_cast<const bf16*>(qg), static_cast<const bf16*>(kr), static_cast<const bf16*>(q_norm_w),
      static_cast<const bf16*>(k_norm_w), positions, T, Hq, Hkv, D, rotary_dim, theta, eps);
  QT_LAUNCH_CHECK("attn_prep_forward");
}

size_t attn_prep_backward_workspace_bytes(int64_t T, int D) {
  return sizeof(float) * size_t(prep_bwd_blocks(std::max<int64_t>(T, 1))) * size_t(2 * D);
}

void launch_attn_prep_backward(void* dqg, void* dkr, void* dq_norm_w, bool dqw_f32, void* dk_norm_w, bool dkw_f32,
                               const void* dq, const void* dk, const void* dgate, const void* qg, const void* kr,
                               const void* q_norm_w, const void* k_norm_w, const float* q_rstd, const float* k_rstd,
                               const int32_t* positions, int64_t T, int Hq, int Hkv, int D, int rotary_dim,
                               double theta, void* ws, cudaStream_t s) {
  if (T <= 0) return;
  QT_CHECK(D <= kMaxHeadDim, "attn_prep_backward: head_dim ", D, " exceeds the CUDA kernel's ", kMaxHeadDim);
  QT_CHECK(D % 8 == 0 && aligned16(qg) && aligned16(kr), "attn_prep_backward: head_dim ", D,
           " must be a multiple of 8 with 16-byte aligned rows (the CUDA kernel's vectors)");
  const int64_t blocks = prep_bwd_blocks(T);
  float* partials = static_cast<float*>(ws);
  attn_prep_bwd_kernel<<<static_cast<unsigned>(blocks), kPrepBwdWarps * 32, 0, s>>>(
      static_cast<bf16*>(dqg), static_cast<bf16*>(dkr), partials, static_cast<const bf16*>(dq),
      static_cast<const bf16*>(dk), static_cast<const bf16*>(dgate), static_cast<const bf16*>(qg),
      static_cast<const bf16*>(kr), static_cast<const bf16*>(q_norm_w), static_cast<const bf16*>(k_norm_w), q_rstd,
      k_rstd, positions, T, Hq, Hkv, D, rotary_dim, theta, ceil_div(T, blocks));
  QT_LAUNCH_CHECK("attn_prep_backward");
  launch_column_reduce(dq_norm_w, dqw_f32, partials, blocks, 2 * D, D, s);
  launch_column_reduce(dk_norm_w, dkw_f32, partials + D, blocks, 2 * D, D, s);
}

}  // namespace qt::cuda
