// Device helpers every Gated DeltaNet kernel file shares (gdn/*.cu): the chunk's constants, the
// smem carve, the gates' cumsum, cp.async tile loads, the chunk table's flags and zero state, the
// flags between kernels launched beside one another, and the fp16 form's tile scales. Each file's
// kernels and helpers live in an anonymous namespace, as this header's do.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "ops/cuda/gdn/gdn_mma.cuh"
#include "ops/cuda/gdn/gdn_plan.h"
#include "ops/cuda/gdn/gdn_stages.h"
#include "ops/cuda/ops_device.cuh"

namespace qt::cuda::gdn {
namespace {

using gdn_mma::for_tiles;
using gdn_mma::Gk;
using gdn_mma::ld_f2;
using gdn_mma::Ld;
using gdn_mma::Ld2;
using gdn_mma::LdKs;
using gdn_mma::NtT;
using gdn_mma::NtDot;
using gdn_mma::Pair;
using gdn_mma::for_tiles_m2;
using gdn_mma::for_tiles_rc;
using gdn_mma::mma_acc;
using gdn_mma::mma_acc_m;
using gdn_mma::Nt;

constexpr int kC = 64;         // chunk rows
constexpr int kLdC = kC + 8;   // padded stride of C x C tiles: 8 mod 32 words, so the mma gathers' 64-bit
                               // pair loads (rows g, column pairs t) are conflict-free; scalar ones 2-way at worst
constexpr int kThreads = 256;  // per block, every kernel but the chunk table
constexpr float kL2Eps = 1e-6f;

using dev::to_f;
using dev::ex2_ftz;
using dev::kLog2e;
using dev::warp_max;
using dev::warp_sum;

// Bump allocator over dynamic shared memory (floats); the host mirrors each kernel's sequence.
struct Carve {
  float* p;
  __device__ float* take(int n) {
    float* r = p;
    p += n;
    return r;
  }
};

// A warp's lane holding g of rows 2 lane, 2 lane + 1 (0 past the chunk): gs[i] = the inclusive cumsum
// of g over the chunk.
__device__ __forceinline__ void gate_cumsum(float* gs, int lane, float g0, float g1) {
  float incl = g0 + g1;
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  gs[2 * lane] = incl - g1;
  gs[2 * lane + 1] = incl;
}
// gs[i] = inclusive cumsum of g over the chunk (g = 0 past len), bs[i] = beta (0 past len).
// Warp 0 scans, two rows per lane. Caller syncs.
__device__ void load_gates(float* gs, float* bs, const float* g, const float* beta, int bos, int len, int Hv,
                           int head) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, i0 = 2 * lane, i1 = i0 + 1;
    gate_cumsum(gs, lane, i0 < len ? g[static_cast<size_t>(bos + i0) * Hv + head] : 0.f,
                i1 < len ? g[static_cast<size_t>(bos + i1) * Hv + head] : 0.f);
    bs[i0] = i0 < len ? beta[static_cast<size_t>(bos + i0) * Hv + head] : 0.f;
    bs[i1] = i1 < len ? beta[static_cast<size_t>(bos + i1) * Hv + head] : 0.f;
  }
}

// threadIdx.x read by a volatile asm: the persistent kernel's per-item code would otherwise have
// every thread-dependent offset hoisted out of its item loop and kept live (spilled) across it.
__device__ __forceinline__ int tid_x() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Stores the split of (x0, x1) (adjacent columns) into the hi / lo planes at offset o (even): one
// 32-bit word per plane (smem or global).
__device__ __forceinline__ void store_split(bf16* hi, bf16* lo, size_t o, float x0, float x1) {
  uint32_t h, l;
  gdn_mma::split_bf16(x0, x1, h, l);
  *reinterpret_cast<uint32_t*>(hi + o) = h;
  *reinterpret_cast<uint32_t*>(lo + o) = l;
}
// Elementwise product of two pairs (a Gk functor's scaled gather: the products of the scalar form).
__device__ __forceinline__ float2 mul2(float2 a, float2 b) { return make_float2(a.x * b.x, a.y * b.y); }
// (x0, x1) as a bf16 pair at p (4-byte aligned).
__device__ __forceinline__ void store_bf16x2(bf16* p, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(p) = gdn_mma::pack_bf16(x0, x1);
}

static_assert(gdn_plan::kChunkRows == kC, "the plan counts chunks of the scans' rows");
// The scan items of the split plan (the chunk table kernel, gdn/plan.cu): the forward's and the
// reverse scan's.
enum ScanItem : int { kItemOut = 0, kItemE = 1, kItemM = 2, kItemOutFromState = 3 };
enum RevItem : int { kRevOut = 0, kRevF = 1, kRevOutFromGrad = 3 };  // the reverse scan's (rev_scan.cu)
// rtable's .z: the segment, with kRtFirst where the chunk is its sample's first (it enters with state
// 0) and kRtLast where it is its sample's last (it leaves with gradient 0). A split sample's inner
// segment ends carry states: no flag there. The wgmma scans store neither zero state (a sample's
// first h and last dh, ~6 % each of the bench mix's state stores at 27B; more where samples are
// short); every reader of h and dh walks rtable and takes them from chunk_state.
constexpr int kRtFirst = 1 << 30, kRtLast = 1 << 29, kRtSeg = kRtLast - 1;
constexpr int kZeroStateFloats = kWgmmaDim * kWgmmaDim;  // a dk = dv = 128 state
__device__ float g_zero_state[kZeroStateFloats];  // zero-initialized at module load, never written
// The K x V state of rtable entry ch's chunk for `head` in a chunk-major [chunks, Hv, K, V] buffer
// (h, dh): g_zero_state where ch carries `zero_flag` (kRtFirst for h, kRtLast for dh). Only the wgmma
// scans (dk = dv = 128, which fits the zero block) leave those states unstored; the mma.sync ones
// store them at every size.
// The fp16 backward (gdn_backward's f16 at dk = dv = 128): h, D, dh, dD stored as fp16, each
// (chunk, head) tile times a power of two (scale_of its largest magnitude, kept in [chunk][head]
// [kSclFloats]), and bwd_chunk's products f16 x f16, each result times the inverse scales.
// The power of two s with m s in [0.5, 1); 1 for 0 or a value that is not finite (NaN propagates).
__device__ __forceinline__ float scale_of(float m) {
  if (!(m > 0.f) || !(m < INFINITY)) return 1.f;
  int e;
  frexpf(m, &e);
  return ldexpf(1.f, -max(-100, min(100, e)));
}
// The wgmma scans' tile maxima ride on the step-top __syncthreads instead of a barrier of their own
// (a mid-step CTA barrier broke the two warpgroups' offset: 27B recompute 0.213 -> 0.263 ms with two):
// each warp's largest m goes to slot[warp] before it, and every thread reads the 8 slots after it.
// A quantity's slots are written again only after a later CTA barrier.
__device__ __forceinline__ void publish_max(float m, float* slot) {
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = m;
}
__device__ __forceinline__ float published_scale(const float* slot) {
  float mx = slot[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) mx = fmaxf(mx, slot[i]);
  return scale_of(mx);
}
// (The scales' layout: kScl* in gdn_stages.h.)
__device__ __forceinline__ float absmax_bf16x2(uint32_t x) {
  return fmaxf(fabsf(__uint_as_float(x << 16)), fabsf(__uint_as_float(x & 0xffff0000u)));
}
// E: the stored element (float, or __half in the fp16 backward).
template <class E = float>
__device__ __forceinline__ const E* chunk_state(const float* base, int4 ch, int zero_flag, int Hv, int head, int K,
                                                int V) {
  return (ch.z & zero_flag) && K * V <= kZeroStateFloats
             ? reinterpret_cast<const E*>(g_zero_state)
             : reinterpret_cast<const E*>(base) + (static_cast<size_t>(ch.w) * Hv + head) * K * V;
}
// Programmatic dependent launch (launch_smem_beside): the kernel beside this grid may start once
// every CTA of it has run launch_dependents (or exited). wait_previous_grid: the previous kernel in
// the stream complete and its writes visible (a no-op without programmatic dependence).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The scans' 1-D grid: block b runs column block b % cbs of head (b / cbs) % Hv of the sample of
// rank b / (cbs Hv), so every CTA of the longest sample is dispatched first.
struct ScanBlock {
  int s, head, e0;
};
__device__ __forceinline__ ScanBlock scan_block(const int* seq_order, int Hv, int V, int bv) {
  const int cbs = V / bv, b = static_cast<int>(blockIdx.x);
  const int col = b % cbs, rest = b / cbs;
  return {seq_order[rest / Hv], rest % Hv, col * bv};
}
// The scans' grid: one CTA per (sample, value head, column block), 1-D (see scan_block).
inline unsigned scan_grid(const GdnArgs& a, int bv) {
  const int64_t n = static_cast<int64_t>(a.num_seqs) * a.num_v_heads * (a.v_head_dim / bv);
  QT_CHECK(n < (int64_t{1} << 31), "gdn: ", a.num_seqs, " samples x ", a.num_v_heads,
           " value heads is too many scan CTAs");
  return static_cast<unsigned>(n);
}

// Row stride (bf16 elements) of raw q / k / v tiles: 16-byte rows, and the fragment reads of both
// orientations ([row on the group index][d], [row on the thread-in-group index][d]) hit distinct banks.
__host__ __device__ constexpr int raw_ld(int K) { return K + 8; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }

// ---- cp.async tile loads ----------------------------------------------------------------------
// Row stride of the bv-wide tiles (S, D, dO): bv + 8 keeps the B-fragment reads ([k][n], k on the
// thread-in-group index) free of bank conflicts.
__host__ __device__ constexpr int bv_ld(int bv) { return bv + 8; }

// Asynchronous copy (cp.async, 16-byte pieces) of a chunk tile, kC rows x ncols elements, into
// dst (row stride ld elements, ld * sizeof(T) a multiple of 16); rows >= len are zero-filled.
// The caller commits the group and waits (cp.async.wait_group) plus __syncthreads before use.
template <typename T>
__device__ __forceinline__ void async_rows(T* dst, int ld, const T* src, size_t src_ld, int len, int ncols) {
  constexpr int n = 16 / static_cast<int>(sizeof(T));
  const int per_row = ncols / n, total = kC * per_row;
  // Rows of a power-of-two piece count (every tile at dk = dv = 128 and bv = 16..128) by a shift:
  // an integer division per piece costs ~20 instructions, and the scans issue ~10 pieces per thread
  // per chunk step (-2.5 % on the 4B training path, eighth round).
  const bool pow2 = (per_row & (per_row - 1)) == 0;
  const int lg = __ffs(per_row) - 1;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int i = pow2 ? idx >> lg : idx / per_row, c = (idx - i * per_row) * n;
    const T* gp = src + static_cast<size_t>(i < len ? i : 0) * src_ld + c;
    const uint32_t sp = static_cast<uint32_t>(__cvta_generic_to_shared(dst + i * ld + c));
    const int bytes = i < len ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sp), "l"(gp), "r"(bytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- flags between kernels launched beside one another ------------------------------------------
// Kernels beside a scan (programmatic dependent launch: gdn_forward, gdn_backward) read a (sample,
// head)'s results once its flag is set. The scan CTA's end: the flag after every thread's stores,
// which the barrier and thread 0's fence make visible to the GPU first (the fence is cumulative).
__device__ __forceinline__ void signal_done(int* done, int s, int Hv, int head) {
  if (done == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(done + static_cast<size_t>(s) * Hv + head), "r"(1)
                 : "memory");
  }
}
// The scans' per-(segment, head) flags (gdn_backward's kernels beside one another): also counted in
// done[-1], which bwd_chunk reads to stop waiting flag by flag once both scans are done
// (release: the count follows the flag and the CTA's stores).
__device__ __forceinline__ void signal_done_counted(int* done, int s, int Hv, int head) {
  if (done == nullptr) return;
  signal_done(done, s, Hv, head);
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(done - 1) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Every thread that reads the results waits (acquire) for itself, so its own later reads, cp.async
// included, see them. Flag s * Hv + head; polls sleep_ns apart.
__device__ __forceinline__ void wait_done(const int* done, int s, int Hv, int head, unsigned sleep_ns = 200) {
  if (done == nullptr) return;
  const int* f = done + static_cast<size_t>(s) * Hv + head;
  while (ld_acquire(f) == 0) __nanosleep(sleep_ns);
}
// prep -> the forward scan's output instances (launched beside prep, gdn_forward): prep flags each
// (chunk, key head) it finished, [chunk][Hk], zeroed by the chunk table kernel. Threads 0 .. n - 1
// each wait (acquire) for one of chunks first .. first + n - 1, then a barrier: what any thread reads
// of them afterwards, cp.async included, was written first (acquire, then bar.sync).
__device__ __forceinline__ void wait_prep_chunks(const int* prep_done, int first, int n, int Hk, int kh) {
  if (prep_done != nullptr)
    for (int i = threadIdx.x; i < n; i += blockDim.x) wait_done(prep_done, first + i, Hk, kh, 100);
  __syncthreads();
}

// The end of both bwd_chunk kernels, by warp 0: the G_L terms (sum_i xi_i + e^{G_L} <S0, dS_end>,
// from the per-row xi and the 8 per-warp partials of the state dot) go into row C-1 of dG, then the
// reverse cumsum dg_i = sum_{l >= i} dG_l in place (lane l: rows 63 - 2l, 62 - 2l), fixed order.
__device__ __forceinline__ void dg_reverse_cumsum(float* dGa, const float* xi, const float* sdot8, float egl) {
  const int lane = threadIdx.x & 31;
  float xs = xi[lane] + xi[lane + 32], sd = 0.f;
  for (int q = 0; q < 8; ++q) sd += sdot8[q];
  xs = warp_sum(xs);
  const int r0 = kC - 1 - 2 * lane, r1 = r0 - 1;
  const float a = dGa[r0] + (lane == 0 ? xs + egl * sd : 0.f), b = dGa[r1];
  float incl = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const float excl = incl - (a + b);
  __syncwarp();
  dGa[r0] = excl + a;
  dGa[r1] = incl;
}

}  // namespace
}  // namespace qt::cuda::gdn
