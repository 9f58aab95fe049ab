// CudaBackend kernels: causal depthwise conv1d (width 4) + SiLU, channel-last, varlen: the tiled
// forward and streamed backward (C % 8 == 0, 16-byte rows) and the register kernels for other shapes.
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

// ---- causal conv1d + SiLU, varlen --------------------------------------------------------------
// Warp w of a block = 32 lanes x VEC (4) adjacent channels over one time tile; lane walks time keeping
// the raw K-1 previous inputs in registers, loads U tokens ahead (U independent vector loads in
// flight), and masks taps by the token's distance from its sample start (tap at offset m is used
// iff m <= t - start), so no tap reads another sample, also for 1- and 2-token or empty samples.
// The backward scatters dc[t] = dy silu'(pre) into dx[t - m] (same mask), holding the K pending dx
// rows in registers; dw partials are summed over the block's kConvWarps tiles in warp order.

namespace {
constexpr int kConvWarps = 4;
constexpr int kConvTileF = 32;  // forward tokens per warp
constexpr int kConvTileB = 64;  // backward tokens per warp
constexpr int64_t kConvBlockTokensB = int64_t(kConvWarps) * kConvTileB;

// The sample containing token t: largest s < num_seqs with cu[s] <= t.
__device__ __forceinline__ int find_seq(const int32_t* cu, int num_seqs, int64_t t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One token of the forward: y = silu(sum_j w[j] tap[j]); MASK drops taps before the sample start
// (tap j sits K-1-j tokens back; dist = tokens since the sample start). Callers branch on the
// warp-uniform dist, so interior tokens run without selects.
template <int VEC, int K, bool MASK>
__device__ __forceinline__ void conv_fwd_token(float (&out)[VEC], const float (&wr)[VEC][K],
                                               const float (&hist)[K - 1][VEC], const float (&cur)[VEC],
                                               int64_t dist) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    float acc = wr[v][K - 1] * cur[v];
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
      if (!MASK || K - 1 - j <= dist) acc += wr[v][j] * hist[j][v];
    out[v] = dev::silu_fast(acc);
  }
}

// One token of the backward: dc = dy silu'(pre); dw += dc taps (when in the tile), and dc w[K-1-m]
// goes to the pending dx of the token m back (same sample only under MASK).
template <int VEC, int K, bool MASK>
__device__ __forceinline__ void conv_bwd_token(float (&dwacc)[VEC][K], float (&pend)[K][VEC],
                                               const float (&wr)[VEC][K], const float (&hist)[K - 1][VEC],
                                               const float (&cx)[VEC], const float (&cdy)[VEC], int64_t dist,
                                               bool in_tile) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    float tap[K];
#pragma unroll
    for (int j = 0; j < K - 1; ++j) tap[j] = (!MASK || K - 1 - j <= dist) ? hist[j][v] : 0.0f;
    tap[K - 1] = cx[v];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += wr[v][j] * tap[j];
    const float dc = cdy[v] * dev::silu_grad_fast(acc);
    if (in_tile) {
#pragma unroll
      for (int j = 0; j < K; ++j) dwacc[v][j] += dc * tap[j];
    }
#pragma unroll
    for (int m = 0; m < K; ++m)
      if (!MASK || m <= dist) pend[m][v] += dc * wr[v][K - 1 - m];
  }
}

template <int VEC, int K, int U>
__global__ void __launch_bounds__(kConvWarps * 32) conv1d_fwd_kernel(bf16* __restrict__ y, const bf16* __restrict__ x,
                                                                     const bf16* __restrict__ w,
                                                                     const int32_t* __restrict__ cu, int num_seqs,
                                                                     int64_t T, int64_t C) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cg = int64_t(blockIdx.x) * 32 + lane;
  if (cg >= C / VEC) return;
  const int64_t t0 = (int64_t(blockIdx.y) * kConvWarps + warp) * kConvTileF;
  if (t0 >= T) return;
  const int64_t t1 = min(T, t0 + kConvTileF);
  float wr[VEC][K];
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < K; ++j) wr[v][j] = to_f(w[(cg * VEC + v) * K + j]);
  int seq = find_seq(cu, num_seqs, t0);
  int64_t start = cu[seq], next = cu[seq + 1];
  float hist[K - 1][VEC];  // raw x[t - (K-1) + j], zero before token 0
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int64_t src = t0 - (K - 1) + j;
    if (src >= 0) {
      load_vec<VEC>(hist[j], x + src * C, cg);
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) hist[j][v] = 0.0f;
    }
  }
  for (int64_t tb = t0; tb < t1; tb += U) {
    float cur[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (tb + u < t1) load_vec<VEC>(cur[u], x + (tb + u) * C, cg);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t t = tb + u;
      if (t >= t1) break;
      while (t >= next) {
        ++seq;
        start = next;
        next = cu[seq + 1];
      }
      const int64_t dist = t - start;
      float out[VEC];
      if (dist >= K - 1) conv_fwd_token<VEC, K, false>(out, wr, hist, cur[u], dist);
      else conv_fwd_token<VEC, K, true>(out, wr, hist, cur[u], dist);
      store_vec<VEC>(y + t * C, cg, out);
#pragma unroll
      for (int j = 0; j < K - 2; ++j)
#pragma unroll
        for (int v = 0; v < VEC; ++v) hist[j][v] = hist[j + 1][v];
#pragma unroll
      for (int v = 0; v < VEC; ++v) hist[K - 2][v] = cur[u][v];
    }
  }
}

// Warp tile [t0, t1): computes dc[t] for t in [t0, t1 + K - 1) (zero past T) and, at step t,
// finishes dx[t - (K-1)] when that is >= t0; dw accumulates dc[t] x-taps for t < t1.
template <int VEC, int K, int U>
__global__ void __launch_bounds__(kConvWarps * 32) conv1d_bwd_kernel(bf16* __restrict__ dx, float* __restrict__ partials,
                                                                     const bf16* __restrict__ dy,
                                                                     const bf16* __restrict__ x,
                                                                     const bf16* __restrict__ w,
                                                                     const int32_t* __restrict__ cu, int num_seqs,
                                                                     int64_t T, int64_t C) {
  __shared__ float sm[kConvWarps][VEC * K][33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cvec = C / VEC;
  const int64_t cg = int64_t(blockIdx.x) * 32 + lane;
  const int64_t t0 = (int64_t(blockIdx.y) * kConvWarps + warp) * kConvTileB;
  const bool active = cg < cvec && t0 < T;
  float dwacc[VEC][K];
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < K; ++j) dwacc[v][j] = 0.0f;
  if (active) {
    const int64_t t1 = min(T, t0 + kConvTileB);
    const int64_t t_end = min(T, t1 + (K - 1));  // dc is computed (non-zero) for t < t_end
    float wr[VEC][K];
#pragma unroll
    for (int v = 0; v < VEC; ++v)
#pragma unroll
      for (int j = 0; j < K; ++j) wr[v][j] = to_f(w[(cg * VEC + v) * K + j]);
    int seq = find_seq(cu, num_seqs, t0);
    int64_t start = cu[seq], next = cu[seq + 1];
    float hist[K - 1][VEC];
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const int64_t src = t0 - (K - 1) + j;
      if (src >= 0) {
        load_vec<VEC>(hist[j], x + src * C, cg);
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) hist[j][v] = 0.0f;
      }
    }
    float pend[K][VEC];  // pend[m] accumulates dx[t - m]
#pragma unroll
    for (int m = 0; m < K; ++m)
#pragma unroll
      for (int v = 0; v < VEC; ++v) pend[m][v] = 0.0f;
    const int64_t t_stop = t1 + (K - 1);
    for (int64_t tb = t0; tb < t_stop; tb += U) {
      float cx[U][VEC], cdy[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (tb + u < t_end) {
          load_vec<VEC>(cx[u], x + (tb + u) * C, cg);
          load_vec<VEC>(cdy[u], dy + (tb + u) * C, cg);
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t t = tb + u;
        if (t >= t_stop) break;
#pragma unroll
        for (int m = K - 1; m > 0; --m)
#pragma unroll
          for (int v = 0; v < VEC; ++v) pend[m][v] = pend[m - 1][v];
#pragma unroll
        for (int v = 0; v < VEC; ++v) pend[0][v] = 0.0f;
        if (t < t_end) {
          while (t >= next) {
            ++seq;
            start = next;
            next = cu[seq + 1];
          }
          const int64_t dist = t - start;
          if (dist >= K - 1) conv_bwd_token<VEC, K, false>(dwacc, pend, wr, hist, cx[u], cdy[u], dist, t < t1);
          else conv_bwd_token<VEC, K, true>(dwacc, pend, wr, hist, cx[u], cdy[u], dist, t < t1);
#pragma unroll
          for (int j = 0; j < K - 2; ++j)
#pragma unroll
            for (int v = 0; v < VEC; ++v) hist[j][v] = hist[j + 1][v];
#pragma unroll
          for (int v = 0; v < VEC; ++v) hist[K - 2][v] = cx[u][v];
        }
        const int64_t tau = t - (K - 1);
        if (tau >= t0 && tau < t1) store_vec<VEC>(dx + tau * C, cg, pend[K - 1]);
      }
    }
  }
  if (partials == nullptr) return;
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < K; ++j) sm[warp][v * K + j][lane] = dwacc[v][j];
  __syncthreads();
  // Column (cg, v, j) of the block's partial row: sum over warps in order.
  float* part = partials + int64_t(blockIdx.y) * C * K;
  const int64_t base = int64_t(blockIdx.x) * 32 * VEC * K;  // first element of this block's channels
  for (int e = threadIdx.x; e < 32 * VEC * K; e += kConvWarps * 32) {
    const int l = e / (VEC * K), r = e % (VEC * K);
    if (int64_t(blockIdx.x) * 32 + l >= cvec) continue;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kConvWarps; ++k) acc += sm[k][r][l];
    part[base + e] = acc;
  }
}


// ---- causal conv1d + SiLU forward, tiled through shared memory (C % 8 == 0, 16-byte aligned rows) -
// Block = kCtChan adjacent channels (512 contiguous bytes of every token row) x one time span of
// SPAN tiles of TT = G * R tokens. Each tile (plus the K-1 = 3 x rows before it) is copied into
// shared memory by cp.async, double buffered, so the next tile's loads are in flight while this
// one is computed. Thread (q, g) then owns 4 channels (8 bytes, column q) and the R tokens
// g*R .. g*R+R-1 of the tile, walking them with the 3 previous x rows in registers.
// dist[i] = min(3, t - start(t)) for the tile's tokens masks every tap that would cross a sample
// start (warp-uniform: a warp shares its tokens). The backward (conv1d_bwd_stream below) uses the
// same row layout and masks.
// Used: VEC 4, G 4, R 8 (256 threads, 32-token tiles), 4 tiles per span, MINB 0 (61 registers; y
// stored by one 8-byte st.global per token, SiLU by the .ftz SFU forms: 64.2 -> 58.5 us on the H200).
// VEC 2 (4-byte columns, more warps) and minimum-block bounds of 3-6 measured slower on the H200
// (docs/dense_kernels.md section 5).
constexpr int kCtChan = 256;
constexpr int kCtRowBytes = kCtChan * 2;
constexpr int kCtChunks = kCtRowBytes / 16;
constexpr int kCtSpanB = 8;  // backward span = kCtSpanB * 32 tokens (conv1d_bwd_stream): one dw partial row each

__device__ __forceinline__ void ct_cp16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ct_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ct_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// rows token rows from t_first (channels c0 .. c0 + kCtChan) into dst; zero outside [0, T) x [0, C).
__device__ __forceinline__ void ct_load_rows(char* dst, const bf16* __restrict__ src, int64_t t_first, int rows,
                                             int64_t T, int64_t C, int64_t c0) {
  for (int i = threadIdx.x; i < rows * kCtChunks; i += blockDim.x) {
    const int r = i / kCtChunks, ch = i % kCtChunks;
    const int64_t t = t_first + r, c = c0 + int64_t(ch) * 8;
    const bool ok = t >= 0 && t < T && c < C;
    ct_cp16(dst + int64_t(i) * 16, ok ? src + t * C + c : src, ok);
  }
}

// min(3, t - start(t)), 3 at or past T; the sample of t < T lies in [lo, hi] (the span's first and
// last samples).
__device__ __forceinline__ int ct_dist(int64_t t, const int32_t* __restrict__ cu, int lo, int hi, int64_t T) {
  if (t >= T) return 3;
  int a = lo, b = hi;
  while (a < b) {
    const int mid = (a + b + 1) >> 1;
    if (cu[mid] <= t) a = mid; else b = mid - 1;
  }
  const int64_t dd = t - cu[a];
  return dd < 3 ? int(dd) : 3;
}

// dist[i] = ct_dist(t_first + i) for i < n.
__device__ __forceinline__ void ct_fill_dist(int* dist, int n, int64_t t_first, const int32_t* __restrict__ cu,
                                             int lo, int hi, int64_t T) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dist[i] = ct_dist(t_first + i, cu, lo, hi, T);
}

// VEC (4 or 2) channels of tile row r at column q (8- or 4-byte shared loads).
template <int VEC>
__device__ __forceinline__ void ct_row(float (&o)[VEC], const char* rows, int r, int q) {
  if constexpr (VEC == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(rows + r * kCtRowBytes + q * 8);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    o[0] = a.x;
    o[1] = a.y;
    o[2] = b.x;
    o[3] = b.y;
  } else {
    static_assert(VEC == 2, "VEC must be 2 or 4");
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + r * kCtRowBytes + q * 4));
    o[0] = a.x;
    o[1] = a.y;
  }
}
// The 3 previous x rows move back one token; cur becomes the newest.
template <int VEC>
__device__ __forceinline__ void ct_shift(float (&h)[3][VEC], const float (&cur)[VEC]) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    h[0][v] = h[1][v];
    h[1][v] = h[2][v];
    h[2][v] = cur[v];
  }
}
template <int VEC>
__device__ __forceinline__ void ct_store(bf16* p, const float (&v)[VEC]) {
  if constexpr (VEC == 4) dev::store4_v2(p, v[0], v[1], v[2], v[3]);
  else *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);
}

template <int TT>
constexpr int ct_fwd_stage_bytes() { return (TT + 3) * kCtRowBytes + (TT * 4 + 15) / 16 * 16; }

// Forward walk of one thread over its R tokens (tile rows u0 .. u0+R-1; x row u+3 is token u).
template <int VEC, int R, bool MASK>
__device__ __forceinline__ void ct_fwd_walk(bf16* __restrict__ y, const char* rows, const int* dist, int u0, int q,
                                            int64_t t_base, int64_t T, int64_t C, int64_t cq,
                                            const float (&wr)[VEC][4]) {
  float h[3][VEC];
#pragma unroll
  for (int j = 0; j < 3; ++j) ct_row<VEC>(h[j], rows, u0 + j, q);
#pragma unroll
  for (int k = 0; k < R; ++k) {
    float cur[VEC], out[VEC];
    ct_row<VEC>(cur, rows, u0 + k + 3, q);
    const int d = MASK ? dist[u0 + k] : 3;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      float acc = wr[v][3] * cur[v];
      acc += (!MASK || d >= 1) ? wr[v][2] * h[2][v] : 0.0f;
      acc += (!MASK || d >= 2) ? wr[v][1] * h[1][v] : 0.0f;
      acc += (!MASK || d >= 3) ? wr[v][0] * h[0][v] : 0.0f;
      out[v] = dev::silu_fast(acc);
    }
    const int64_t t = t_base + u0 + k;
    if (t < T) ct_store<VEC>(y + t * C + cq, out);
    ct_shift<VEC>(h, cur);
  }
}

template <int VEC, int G, int R, int SPAN, int MINB>
__global__ void __launch_bounds__(kCtChan / VEC * G, MINB)
    conv1d_fwd_tiled(bf16* __restrict__ y, const bf16* __restrict__ x,
                                                                 const bf16* __restrict__ w,
                                                                 const int32_t* __restrict__ cu, int num_seqs,
                                                                 int64_t T, int64_t C) {
  constexpr int TT = G * R, kRows = (TT + 3) * kCtRowBytes, kStage = ct_fwd_stage_bytes<TT>();
  extern __shared__ __align__(16) char ct_sm[];
  constexpr int NQ = kCtChan / VEC;  // threads across the block's channels
  const int q = threadIdx.x % NQ, g = threadIdx.x / NQ;
  const int64_t c0 = int64_t(blockIdx.x) * kCtChan, cq = c0 + VEC * q;
  const bool chan_ok = cq < C;
  const int64_t s0 = int64_t(blockIdx.y) * SPAN * TT, s1 = min(T, s0 + int64_t(SPAN) * TT);
  const int ntiles = int((s1 - s0 + TT - 1) / TT);
  const int lo = find_seq(cu, num_seqs, s0), hi = find_seq(cu, num_seqs, s1 - 1);
  float wr[VEC][4];
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < 4; ++j) wr[v][j] = chan_ok ? to_f(w[(cq + v) * 4 + j]) : 0.0f;
  ct_load_rows(ct_sm, x, s0 - 3, TT + 3, T, C, c0);
  ct_fill_dist(reinterpret_cast<int*>(ct_sm + kRows), TT, s0, cu, lo, hi, T);
  ct_commit();
  for (int i = 0; i < ntiles; ++i) {
    if (i + 1 < ntiles) {
      char* nst = ct_sm + ((i + 1) & 1) * kStage;
      const int64_t nt0 = s0 + int64_t(i + 1) * TT;
      ct_load_rows(nst, x, nt0 - 3, TT + 3, T, C, c0);
      ct_fill_dist(reinterpret_cast<int*>(nst + kRows), TT, nt0, cu, lo, hi, T);
    }
    ct_commit();
    ct_wait<1>();
    __syncthreads();
    const char* st = ct_sm + (i & 1) * kStage;
    const int* dist = reinterpret_cast<const int*>(st + kRows);
    const int u0 = g * R;
    int dmin = 3;
#pragma unroll
    for (int k = 0; k < R; ++k) dmin = min(dmin, dist[u0 + k]);
    const int64_t t_base = s0 + int64_t(i) * TT;
    if (chan_ok) {
      if (dmin >= 3) ct_fwd_walk<VEC, R, false>(y, st, dist, u0, q, t_base, T, C, cq, wr);
      else ct_fwd_walk<VEC, R, true>(y, st, dist, u0, q, t_base, T, C, cq, wr);
    }
    __syncthreads();
  }
}

// ---- conv1d backward, streamed per token group (C % 8 == 0, 16-byte aligned rows) ---------------
// Block = kCtChan channels x a span of G * L tokens (L = NSTEP * R). Group g (64 threads, 4 channels
// each) owns the L consecutive tokens s0 + g L .. and walks them in NSTEP steps of R tokens, keeping
// the 3 previous x rows and the 4 pending dx rows in registers across steps, so every dc is computed
// once (plus 3 tail tokens per group, whose dc reaches the group's last dx rows: 67 evaluations per
// 64 tokens instead of 11 per 8 in the earlier tiled backward). Each group double buffers its own rows
// (3 history x rows in its first step, R x and dy rows, 3 more of each in its last step) by
// cp.async and syncs only its 2 warps (named barrier 1 + g), so no block barrier inside the walk.
// Masking by dist[k] = min(3, t - start(t)): tap j of token t and dc[t] -> dx[t - m] only within
// t's sample. dw: per thread over its own tokens, then over the G groups in group order into one
// fp32 partial row per span (deterministic; launch_column_reduce sums the spans).
// Used: G 2, R 8, NSTEP 16 (128 threads, 128 tokens per group, 256-token spans = kCtSpanB * 32;
// 128 registers with the .ftz SiLU, held at 3 blocks per SM by the smem request). G 4 x 64 tokens
// (256 threads) and G 4, R 4 with a 3-blocks bound (spills) measured slower on the H200
// (docs/dense_kernels.md section 5).
template <int R>
constexpr int cs_stage_bytes() { return (2 * R + 9) * kCtRowBytes + 64; }  // x: 3 + R + 3, dy: R + 3, dist

__device__ __forceinline__ void cs_bar(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

// rows token rows from t_first into dst, by the 64 threads of a group (q = 0..63; 2 rows per pass).
__device__ __forceinline__ void cs_load_rows(char* dst, const bf16* __restrict__ src, int64_t t_first, int rows,
                                             int64_t T, int64_t C, int64_t c0, int q) {
  const int ch = q & 31;
  const int64_t c = c0 + int64_t(ch) * 8;
  for (int r = q >> 5; r < rows; r += 2) {
    const int64_t t = t_first + r;
    const bool ok = t >= 0 && t < T && c < C;
    ct_cp16(dst + r * kCtRowBytes + ch * 16, ok ? src + t * C + c : src, ok);
  }
}

// One step of a group's walk: tokens tb + k (x row 3 + k, dy row k, dist[k]), k < R own, then
// (last step only) 3 tail tokens that only feed pending dx. p[m] = pending dx of token t - m;
// dx[t - 3] is complete after token t and is stored when it lies in [gs, T).
template <int R, bool MASK>
__device__ __forceinline__ void cs_step(bf16* __restrict__ dx, float (&h)[3][4], float (&p)[4][4],
                                        float (&dw)[4][4], const float (&wr)[4][4], const char* xr,
                                        const char* yr, const int* dist, int q, int64_t tb, int64_t gs,
                                        int64_t T, int64_t C, int64_t cq, bool last) {
#pragma unroll
  for (int k = 0; k < R + 3; ++k) {
    if (k >= R && !last) break;
    float cur[4], gy[4];
    ct_row<4>(cur, xr, 3 + k, q);
    ct_row<4>(gy, yr, k, q);
    const int d = MASK ? dist[k] : 3;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float t0 = (!MASK || d >= 3) ? h[0][v] : 0.0f;
      const float t1 = (!MASK || d >= 2) ? h[1][v] : 0.0f;
      const float t2 = (!MASK || d >= 1) ? h[2][v] : 0.0f;
      const float pre = wr[v][0] * t0 + wr[v][1] * t1 + wr[v][2] * t2 + wr[v][3] * cur[v];
      const float dc = gy[v] * dev::silu_grad_fast(pre);
      if (k < R) {
        dw[v][0] += dc * t0;
        dw[v][1] += dc * t1;
        dw[v][2] += dc * t2;
        dw[v][3] += dc * cur[v];
      }
      p[0][v] += dc * wr[v][3];
      if (!MASK || d >= 1) p[1][v] += dc * wr[v][2];
      if (!MASK || d >= 2) p[2][v] += dc * wr[v][1];
      if (!MASK || d >= 3) p[3][v] += dc * wr[v][0];
    }
    const int64_t tau = tb + k - 3;
    // store_vec's two 4-byte stores, not ct_store's single 8-byte one: the latter (an asm store
    // with a memory clobber) keeps NVVM from hoisting the next token's shared loads above it, and
    // measured slower here (bwd+dw 113 vs 106 us), though faster in the forward (notes).
    if (tau >= gs && tau < T) store_vec<4>(dx + tau * C + cq, 0, p[3]);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      p[3][v] = p[2][v];
      p[2][v] = p[1][v];
      p[1][v] = p[0][v];
      p[0][v] = 0.0f;
    }
    ct_shift<4>(h, cur);
  }
}

template <int G, int R, int NSTEP, int MINB>
__global__ void __launch_bounds__(64 * G, MINB)
    conv1d_bwd_stream(bf16* __restrict__ dx, float* __restrict__ partials, const bf16* __restrict__ dy,
                      const bf16* __restrict__ x, const bf16* __restrict__ w, const int32_t* __restrict__ cu,
                      int num_seqs, int64_t T, int64_t C) {
  constexpr int L = R * NSTEP, kXB = (R + 6) * kCtRowBytes, kYB = (R + 3) * kCtRowBytes;
  constexpr int kStage = cs_stage_bytes<R>();
  static_assert(R + 3 <= 16, "dist slots");
  static_assert(2 * G * kStage >= G * kCtChan * 16, "dw reduction buffer does not fit");
  extern __shared__ __align__(16) char ct_sm[];
  const int q = threadIdx.x & 63, g = threadIdx.x >> 6;
  const int64_t c0 = int64_t(blockIdx.x) * kCtChan, cq = c0 + 4 * q;
  const bool chan_ok = cq < C;
  const int64_t s0 = int64_t(blockIdx.y) * G * L, s1 = min(T, s0 + int64_t(G) * L);
  const int lo = find_seq(cu, num_seqs, s0), hi = find_seq(cu, num_seqs, min(T - 1, s1 + 2));
  const int64_t gs = s0 + int64_t(g) * L, ge = min(s1, gs + L);
  const int ns = ge > gs ? int((ge - gs + R - 1) / R) : 0;
  float wr[4][4], dw[4][4], h[3][4], p[4][4];
#pragma unroll
  for (int v = 0; v < 4; ++v)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wr[v][j] = chan_ok ? to_f(w[(cq + v) * 4 + j]) : 0.0f;
      dw[v][j] = 0.0f;
      p[j][v] = 0.0f;
    }
  char* gsm = ct_sm + g * 2 * kStage;
  auto issue = [&](char* st, int j) {
    const int64_t tb = gs + int64_t(j) * R;
    const int n = j == ns - 1 ? R + 3 : R;
    if (j == 0) cs_load_rows(st, x, tb - 3, 3, T, C, c0, q);
    cs_load_rows(st + 3 * kCtRowBytes, x, tb, n, T, C, c0, q);
    cs_load_rows(st + kXB, dy, tb, n, T, C, c0, q);
    if (q < R + 3) reinterpret_cast<int*>(st + kXB + kYB)[q] = ct_dist(tb + q, cu, lo, hi, T);
  };
  if (ns > 0) issue(gsm, 0);
  ct_commit();
  for (int j = 0; j < ns; ++j) {
    if (j + 1 < ns) issue(gsm + ((j + 1) & 1) * kStage, j + 1);
    ct_commit();
    ct_wait<1>();
    cs_bar(1 + g);
    const char* st = gsm + (j & 1) * kStage;
    const int* dist = reinterpret_cast<const int*>(st + kXB + kYB);
    if (j == 0) {
#pragma unroll
      for (int r = 0; r < 3; ++r) ct_row<4>(h[r], st, r, q);
    }
    int dmin = 3;
#pragma unroll
    for (int k = 0; k < R + 3; ++k) dmin = min(dmin, dist[k]);
    const int64_t tb = gs + int64_t(j) * R;
    const bool last = j == ns - 1;
    if (chan_ok) {
      if (dmin >= 3) cs_step<R, false>(dx, h, p, dw, wr, st, st + kXB, dist, q, tb, gs, T, C, cq, last);
      else cs_step<R, true>(dx, h, p, dw, wr, st, st + kXB, dist, q, tb, gs, T, C, cq, last);
    }
    cs_bar(1 + g);
  }
  if (partials == nullptr) return;
  ct_wait<0>();
  __syncthreads();
  float4* red = reinterpret_cast<float4*>(ct_sm);  // [G][64][4 float4]
#pragma unroll
  for (int v = 0; v < 4; ++v) red[(g * 64 + q) * 4 + v] = make_float4(dw[v][0], dw[v][1], dw[v][2], dw[v][3]);
  __syncthreads();
  const float* redf = reinterpret_cast<const float*>(ct_sm);
  float* part = partials + int64_t(blockIdx.y) * C * 4 + c0 * 4;
  for (int e = threadIdx.x; e < kCtChan * 4; e += blockDim.x) {
    if (c0 + e / 4 >= C) break;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < G; ++k) acc += redf[k * kCtChan * 4 + e];
    part[e] = acc;
  }
}

// Returns the number of partial rows written (one per span of G * R * NSTEP tokens).
template <int G, int R, int NSTEP, int MINB>
int64_t cs_bwd_launch(bf16* dx, float* partials, const bf16* dy, const bf16* x, const bf16* w, const int32_t* cu,
                      int num_seqs, int64_t T, int64_t C, cudaStream_t s) {
  // Exactly 3 blocks per SM: the dynamic smem request is padded to 60 KB (4 x 61 KB > 228 KB).
  // At 128 registers 4 blocks would fit, and 4 blocks measured slower on the H200 each time (bwd+dw
  // 113 -> 120 us, 110 -> 124 us with a 128-register bound), 2 blocks slower still (133 us): more
  // concurrent streams do not hide more latency here (docs/dense_kernels.md section 5).
  const int smem = std::max(2 * G * cs_stage_bytes<R>(), 60 * 1024);
  auto kernel = conv1d_bwd_stream<G, R, NSTEP, MINB>;
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t spans = ceil_div(T, int64_t(G) * R * NSTEP);
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kCtChan)), static_cast<unsigned>(spans));
  kernel<<<grid, 64 * G, smem, s>>>(dx, partials, dy, x, w, cu, num_seqs, T, C);
  return spans;
}

template <int VEC, int G, int R, int SPAN, int MINB>
void ct_fwd_launch(bf16* y, const bf16* x, const bf16* w, const int32_t* cu, int num_seqs, int64_t T, int64_t C,
                   cudaStream_t s) {
  constexpr int TT = G * R;
  const int smem = 2 * ct_fwd_stage_bytes<TT>();
  auto kernel = conv1d_fwd_tiled<VEC, G, R, SPAN, MINB>;
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kCtChan)), static_cast<unsigned>(ceil_div(T, int64_t(SPAN) * TT)));
  kernel<<<grid, kCtChan / VEC * G, smem, s>>>(y, x, w, cu, num_seqs, T, C);
}

}  // namespace

void launch_conv1d_silu_forward(void* y, const void* x, const void* w, const int32_t* cu, int num_seqs, int64_t T,
                                int64_t C, int K, cudaStream_t s) {
  if (T <= 0 || C <= 0) return;
  if (K != 4) QT_FAIL("conv1d_silu_forward: kernel width ", K, " is not supported by the CUDA kernel (4 only)");
  if (C % 8 == 0 && aligned16(y) && aligned16(x)) {
    ct_fwd_launch<4, 4, 8, 4, 0>(static_cast<bf16*>(y), static_cast<const bf16*>(x), static_cast<const bf16*>(w), cu,
                                 num_seqs, T, C, s);
    QT_LAUNCH_CHECK("conv1d_silu_forward");
    return;
  }
  // 4 channels (8 bytes) per lane: half the registers of 8 channels, so twice the warps resident.
  const bool vec = C % 4 == 0 && aligned8(y) && aligned8(x);
  const int64_t cvec = vec ? C / 4 : C;
  const dim3 grid(static_cast<unsigned>(ceil_div(cvec, 32)),
                  static_cast<unsigned>(ceil_div(T, int64_t(kConvWarps) * kConvTileF)));
  if (vec)
    conv1d_fwd_kernel<4, 4, 8><<<grid, kConvWarps * 32, 0, s>>>(static_cast<bf16*>(y), static_cast<const bf16*>(x),
                                                                 static_cast<const bf16*>(w), cu, num_seqs, T, C);
  else
    conv1d_fwd_kernel<1, 4, 8><<<grid, kConvWarps * 32, 0, s>>>(static_cast<bf16*>(y), static_cast<const bf16*>(x),
                                                                 static_cast<const bf16*>(w), cu, num_seqs, T, C);
  QT_LAUNCH_CHECK("conv1d_silu_forward");
}

size_t conv1d_silu_backward_workspace_bytes(int64_t T, int64_t C, int K) {
  // One partial row per span of the streamed kernel (kCtSpanB * 32 tokens) or per block of the
  // register kernel, whichever is more.
  const int64_t rows = std::max(ceil_div(std::max<int64_t>(T, 1), int64_t(kCtSpanB) * 32),
                                ceil_div(std::max<int64_t>(T, 1), kConvBlockTokensB));
  return sizeof(float) * size_t(rows) * size_t(C) * size_t(K);
}

void launch_conv1d_silu_backward(void* dx, void* dw, bool dw_f32, const void* dy, const void* x, const void* w,
                                 const int32_t* cu, int num_seqs, int64_t T, int64_t C, int K, void* ws,
                                 cudaStream_t s) {
  if (T <= 0 || C <= 0) return;
  if (K != 4) QT_FAIL("conv1d_silu_backward: kernel width ", K, " is not supported by the CUDA kernel (4 only)");
  if (C % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    float* partials = dw != nullptr ? static_cast<float*>(ws) : nullptr;
    static_assert(2 * 8 * 16 == kCtSpanB * 32, "workspace rows assume 256-token spans");
    const int64_t spans = cs_bwd_launch<2, 8, 16, 0>(
        static_cast<bf16*>(dx), partials, static_cast<const bf16*>(dy), static_cast<const bf16*>(x),
        static_cast<const bf16*>(w), cu, num_seqs, T, C, s);
    QT_LAUNCH_CHECK("conv1d_silu_backward");
    if (dw != nullptr) launch_column_reduce(dw, dw_f32, partials, spans, C * K, C * K, s);
    return;
  }
  const bool vec = C % 4 == 0 && aligned8(dx) && aligned8(dy) && aligned8(x);
  const int64_t cvec = vec ? C / 4 : C;
  const int64_t tiles = ceil_div(T, kConvBlockTokensB);
  const dim3 grid(static_cast<unsigned>(ceil_div(cvec, 32)), static_cast<unsigned>(tiles));
  float* partials = dw != nullptr ? static_cast<float*>(ws) : nullptr;
  if (vec)
    conv1d_bwd_kernel<4, 4, 8><<<grid, kConvWarps * 32, 0, s>>>(static_cast<bf16*>(dx), partials,
                                                                 static_cast<const bf16*>(dy), static_cast<const bf16*>(x),
                                                                 static_cast<const bf16*>(w), cu, num_seqs, T, C);
  else
    conv1d_bwd_kernel<1, 4, 8><<<grid, kConvWarps * 32, 0, s>>>(static_cast<bf16*>(dx), partials,
                                                                 static_cast<const bf16*>(dy), static_cast<const bf16*>(x),
                                                                 static_cast<const bf16*>(w), cu, num_seqs, T, C);
  QT_LAUNCH_CHECK("conv1d_silu_backward");
  if (dw != nullptr) launch_column_reduce(dw, dw_f32, partials, tiles, C * K, C * K, s);
}

}  // namespace qt::cuda
