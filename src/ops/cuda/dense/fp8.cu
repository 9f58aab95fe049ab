// FP8 casts with per-tensor current scaling. The amax is a device word holding max|x| as a float
// (the bits of the bf16 magnitude, so NaN outranks inf and every value, and the result does not
// depend on the order): either folded in by the op that wrote x (its amax output, ops_device.cuh's
// fold_amax_block) or taken here by a pass over x into the backend's own word. The cast then
// writes q = e4m3(x * 448 / amax) (saturating, round to nearest even) and 1 / s, and/or the
// transposed codes (the K-major operands of the backward's FP8 GEMMs), and its last block to
// finish resets the amax word to zero for its next producer: no memset node, no host round trip,
// so a captured step runs them as they are.
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "core/fp8.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {

// *amax (zero on entry: the previous cast reset it) = max(|x|) as float bits.
__global__ void __launch_bounds__(kThreads) fp8_amax_kernel(unsigned* amax, const uint16_t* __restrict__ x, int64_t n,
                                                             bool vec) {
  unsigned m = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (; i < n / 8; i += stride) m = max(m, dev::bf16x8_mag_bits(reinterpret_cast<const uint4*>(x)[i]));
    i = n / 8 * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // the tail
  }
  for (; i < n; i += stride) m = max(m, unsigned(x[i] & 0x7FFFu) << 16);
  dev::fold_amax_block(amax, m);
}

__device__ __forceinline__ float amax_of(const unsigned* amax_bits) { return __uint_as_float(*amax_bits); }

// The end of every cast kernel: once all its blocks have read the amax (each has used its scale by
// now), the last one resets the word and the block counter for the next quantize.
__device__ __forceinline__ void release_amax(unsigned* amax_bits, unsigned* done) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *amax_bits = 0;
      *done = 0;
    }
  }
}

// s = fp8_scale_for_amax (core/fp8.h), from the device word.
__device__ __forceinline__ float scale_of(const unsigned* amax_bits) {
  const float amax = amax_of(amax_bits);
  return amax > 0.0f ? kFp8E4M3Max / amax : 1.0f;
}

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__global__ void __launch_bounds__(kThreads) fp8_cast_kernel(uint8_t* __restrict__ q, float* scale_inv,
                                                             const bf16* __restrict__ x, unsigned* amax_bits, unsigned* done,
                                                             int64_t n, bool vec) {
  const float s = scale_of(amax_bits);
  if (blockIdx.x == 0 && threadIdx.x == 0 && scale_inv != nullptr) *scale_inv = 1.0f / s;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (; i < n / 8; i += stride) {
      float f[8];
      load_vec(f, x, i);
      unsigned short p[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        p[k] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * k] * s, f[2 * k + 1] * s), __NV_SATFINITE, __NV_E4M3);
      uint2 out;
      out.x = unsigned(p[0]) | (unsigned(p[1]) << 16);
      out.y = unsigned(p[2]) | (unsigned(p[3]) << 16);
      reinterpret_cast<uint2*>(q)[i] = out;
    }
    i = n / 8 * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  }
  for (; i < n; i += stride) q[i] = to_e4m3(to_f(x[i]) * s);
  release_amax(amax_bits, done);
}

// The transposed codes: a 64 x 64 tile of x (rows r, columns c) read row-wise, its codes written
// to q_t[c][r] through shared memory, so both the reads and the 64-byte writes stay coalesced; q
// (optional) gets the row-major codes from the same read. q_t's rows are rows_pad >= rows long: the
// padding columns are written zero (the wgrad GEMM's inner dimension must be a multiple of 16).
constexpr int kTile = 64;
constexpr int64_t kCastBlocks = 1056;  // 8 blocks per SM of an H200: a full wave, grid-stride beyond
__global__ void __launch_bounds__(kThreads) fp8_cast_t_kernel(uint8_t* __restrict__ q_t, uint8_t* __restrict__ q,
                                                               float* scale_inv, const bf16* __restrict__ x,
                                                               unsigned* amax_bits, unsigned* done, int64_t rows,
                                                               int64_t cols, int64_t rows_pad) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = scale_of(amax_bits);
  if (blockIdx.x == 0 && threadIdx.x == 0 && scale_inv != nullptr) *scale_inv = 1.0f / s;
  const int64_t tiles_x = (cols + kTile - 1) / kTile, ntiles = tiles_x * ((rows_pad + kTile - 1) / kTile);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;  // 64 x 4
  for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_x * kTile, c0 = t % tiles_x * kTile;
    for (int rr = ty; rr < kTile; rr += kThreads / kTile) {
      const int64_t r = r0 + rr, c = c0 + tx;
      const bool in = r < rows && c < cols;
      const uint8_t code = in ? to_e4m3(to_f(x[r * cols + c]) * s) : 0;
      tile[tx][rr] = code;
      if (q != nullptr && in) q[r * cols + c] = code;
    }
    __syncthreads();
    for (int cc = ty; cc < kTile; cc += kThreads / kTile) {
      const int64_t c = c0 + cc, r = r0 + tx;
      if (c < cols && r < rows_pad) q_t[c * rows_pad + r] = tile[cc][tx];
    }
    __syncthreads();  // the tile is refilled next
  }
  release_amax(amax_bits, done);
}

// The same tile with 16-byte loads (8 values a thread), 8-byte row-major and 4-byte transposed
// stores: for cols % 8 == 0, rows_pad % 4 == 0 and aligned pointers (the model's shapes).
__global__ void __launch_bounds__(kThreads) fp8_cast_t_vec_kernel(uint8_t* __restrict__ q_t, uint8_t* __restrict__ q,
                                                                   float* scale_inv, const bf16* __restrict__ x,
                                                                   unsigned* amax_bits, unsigned* done,
                                                                   int64_t rows, int64_t cols, int64_t rows_pad) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 4];  // [column][row]
  const float s = scale_of(amax_bits);
  if (blockIdx.x == 0 && threadIdx.x == 0 && scale_inv != nullptr) *scale_inv = 1.0f / s;
  const int64_t tiles_x = (cols + kTile - 1) / kTile, ntiles = tiles_x * ((rows_pad + kTile - 1) / kTile);
  for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_x * kTile, c0 = t % tiles_x * kTile;
    {
      const int cv = (threadIdx.x % 8) * 8, rr0 = threadIdx.x / 8;  // 8 threads a row, 32 rows a pass
      const int64_t c = c0 + cv;
      for (int rr = rr0; rr < kTile; rr += kThreads / 8) {
        const int64_t r = r0 + rr;
        const bool in = r < rows && c < cols;
        unsigned short p[4] = {0, 0, 0, 0};
        if (in) {
          float f[8];
          load_vec(f, x + r * cols, c / 8);
#pragma unroll
          for (int k = 0; k < 4; ++k)
            p[k] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * k] * s, f[2 * k + 1] * s), __NV_SATFINITE, __NV_E4M3);
          if (q != nullptr) {
            uint2 out;
            out.x = unsigned(p[0]) | (unsigned(p[1]) << 16);
            out.y = unsigned(p[2]) | (unsigned(p[3]) << 16);
            *reinterpret_cast<uint2*>(q + r * cols + c) = out;
          }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          tile[cv + 2 * k][rr] = uint8_t(p[k] & 0xFF);
          tile[cv + 2 * k + 1][rr] = uint8_t(p[k] >> 8);
        }
      }
    }
    __syncthreads();
    const int rv = (threadIdx.x % 16) * 4, cc0 = threadIdx.x / 16;  // 16 threads a q_t row, 16 rows a pass
    const int64_t r = r0 + rv;
    for (int cc = cc0; cc < kTile; cc += kThreads / 16) {
      const int64_t c = c0 + cc;
      if (c < cols && r < rows_pad)
        *reinterpret_cast<unsigned*>(q_t + c * rows_pad + r) = *reinterpret_cast<const unsigned*>(&tile[cc][rv]);
    }
    __syncthreads();  // the tile is refilled next
  }
  release_amax(amax_bits, done);
}

// Codes transposed through a 64 x 64 byte tile: 4-byte reads along src's rows, 4-byte writes
// along dst's; rows past `rows` (up to ld_dst) read as zero codes.
__global__ void __launch_bounds__(kThreads) fp8_transpose_codes_kernel(TransposeCodesParams p) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int lane4 = (threadIdx.x % 16) * 4, row0 = threadIdx.x / 16;
  for (int rr = row0; rr < kTile; rr += kThreads / 16) {
    const int64_t r = r0 + rr, c = c0 + lane4;
    const unsigned v = r < p.rows && c < p.cols ? *reinterpret_cast<const unsigned*>(p.src + r * p.ld_src + c) : 0u;
#pragma unroll
    for (int k = 0; k < 4; ++k) tile[rr][lane4 + k] = uint8_t(v >> (8 * k));
  }
  __syncthreads();
  for (int cc = row0; cc < kTile; cc += kThreads / 16) {
    const int64_t c = c0 + cc, r = r0 + lane4;
    if (c >= p.cols || r >= p.rows_out) continue;
    unsigned v = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) v |= unsigned(tile[lane4 + k][cc]) << (8 * k);
    *reinterpret_cast<unsigned*>(p.dst + c * p.ld_dst + r) = v;
  }
}

}  // namespace

void launch_transpose_fp8_codes(const TransposeCodesParams& p, cudaStream_t s) {
  QT_CHECK(p.cols % 4 == 0 && p.ld_src % 4 == 0 && p.ld_dst % 4 == 0 && p.rows_out % 4 == 0 &&
               p.rows <= p.rows_out && p.rows_out <= p.ld_dst && reinterpret_cast<uintptr_t>(p.src) % 4 == 0 &&
               reinterpret_cast<uintptr_t>(p.dst) % 4 == 0,
           "transpose_fp8_codes: cols ", p.cols, ", ld_src ", p.ld_src, ", ld_dst ", p.ld_dst, " and rows_out ",
           p.rows_out, " must be multiples of 4 with rows ", p.rows, " <= rows_out <= ld_dst");
  if (p.cols == 0 || p.rows_out == 0) return;
  const dim3 grid(unsigned(ceil_div(p.cols, kTile)), unsigned(ceil_div(p.rows_out, kTile)));
  fp8_transpose_codes_kernel<<<grid, kThreads, 0, s>>>(p);
  QT_LAUNCH_CHECK("fp8_transpose_codes_kernel");
}

void launch_amax_fold(unsigned* amax, const void* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned16(x);
  const unsigned grid = std::min(grid_for(vec ? n / 8 + 1 : n, kThreads), 1056u);  // 8 blocks per SM at most
  fp8_amax_kernel<<<grid, kThreads, 0, s>>>(amax, static_cast<const uint16_t*>(x), n, vec);
  QT_LAUNCH_CHECK("fp8_amax_kernel");
}

void launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t s) {
  const int64_t n = p.n;
  unsigned* amax = p.amax_in != nullptr ? p.amax_in : p.own_amax;
  if (p.amax_in == nullptr) launch_amax_fold(amax, p.x, n, s);
  const bool vec = aligned16(p.x) && (p.q == nullptr || aligned8(p.q));
  const bf16* x = static_cast<const bf16*>(p.x);
  if (p.q_t != nullptr) {  // both codes from one read of x
    // Every block adds to the release counter: a wave of blocks looping over the tiles keeps that
    // to one atomic per block (a block per tile made the counter the bottleneck).
    const unsigned tgrid = unsigned(std::min<int64_t>(ceil_div(p.cols, kTile) * ceil_div(p.rows_pad, kTile), kCastBlocks));
    const bool tvec = p.cols % 8 == 0 && p.rows_pad % 4 == 0 && aligned16(p.x) && aligned8(p.q) && aligned16(p.q_t);
    if (tvec) {
      fp8_cast_t_vec_kernel<<<tgrid, kThreads, 0, s>>>(static_cast<uint8_t*>(p.q_t), static_cast<uint8_t*>(p.q),
                                                       p.scale_inv, x, amax, p.done, p.rows, p.cols, p.rows_pad);
      QT_LAUNCH_CHECK("fp8_cast_t_vec_kernel");
    } else {
      fp8_cast_t_kernel<<<tgrid, kThreads, 0, s>>>(static_cast<uint8_t*>(p.q_t), static_cast<uint8_t*>(p.q),
                                                   p.scale_inv, x, amax, p.done, p.rows, p.cols, p.rows_pad);
      QT_LAUNCH_CHECK("fp8_cast_t_kernel");
    }
  } else {
    fp8_cast_kernel<<<std::min(grid_for(vec ? n / 8 + 1 : n, kThreads), unsigned(kCastBlocks)), kThreads, 0, s>>>(static_cast<uint8_t*>(p.q),
                                                                                  p.scale_inv, x, amax, p.done, n, vec);
    QT_LAUNCH_CHECK("fp8_cast_kernel");
  }
}

}  // namespace qt::cuda
