// Device helpers of the dk = dv = 128 kernels on wgmma (fwd_scan.cu, rev_scan.cu, bwd_chunk.cu):
// 128-byte-swizzled panel loads, the transposed state and plane stores of the scans, their items and
// row data, and the split's state buffers.
#pragma once
#include "ops/cuda/gdn/gdn_common.cuh"
#include "ops/cuda/wgmma.cuh"

namespace qt::cuda::gdn {
namespace {

constexpr int kDlD = kWgmmaDim;                // dk = dv these kernels serve
constexpr uint32_t kDlPanel = kC * 128;        // one 64-row x 64-column bf16 panel
constexpr uint32_t kDlTile = 2 * kDlPanel;     // a 64 x 128 tile

// Rows [0, kC) of a 64 x kCols bf16 tile (row r at src + r * ld) into kCols / 64 128-byte-swizzled
// panels (columns 0-63, 64-127, ..); rows >= valid are zero-filled. kThr threads, 16-byte pieces.
// tid: the thread's index (the persistent bwd_chunk passes tid_x(), so that the offsets are not hoisted
// out of its item loop).
template <int kThr = 128, int kCols = kDlD>
__device__ __forceinline__ void async_panels(char* dst, const bf16* src, size_t ld, int valid,
                                             int tid = threadIdx.x) {
#pragma unroll
  for (int u = 0; u < kC * (kCols / 8) / kThr; ++u) {
    const int c = tid + u * kThr, row = c / (kCols / 8), ch = c % (kCols / 8);
    const uint32_t sp = static_cast<uint32_t>(__cvta_generic_to_shared(
        dst + (ch / 8) * kDlPanel + row * 128 + (((ch % 8) ^ (row & 7)) << 4)));
    const bool ok = row < valid;
    const bf16* gp = src + static_cast<size_t>(ok ? row : 0) * ld + ch * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sp), "l"(gp), "r"(ok ? 16 : 0) : "memory");
  }
}

// The largest magnitude of the pieces this thread's async_panels<kThr, kCols> call loaded into dst: its
// own cp.async writes are visible to it once their group has been waited for, before any barrier.
template <int kThr, int kCols = kDlD>
__device__ __forceinline__ float own_panels_absmax(const char* dst, int tid = threadIdx.x) {
  float m = 0.f;
#pragma unroll
  for (int u = 0; u < kC * (kCols / 8) / kThr; ++u) {
    const int c = tid + u * kThr, row = c / (kCols / 8), ch = c % (kCols / 8);
    const uint4 x = *reinterpret_cast<const uint4*>(dst + (ch / 8) * kDlPanel + row * 128 + (((ch % 8) ^ (row & 7)) << 4));
    m = fmaxf(fmaxf(m, fmaxf(absmax_bf16x2(x.x), absmax_bf16x2(x.y))), fmaxf(absmax_bf16x2(x.z), absmax_bf16x2(x.w)));
  }
  return m;
}

// The wgmma scans keep transposed tiles in accumulators: register 4 j + 2 hh + e of a thread holds
// row ncol + 8 hh (the thread's state column) and column 8 j + 2 t + e (t = lane % 4).
// The transposed state sT (rows n, columns d) into the fragment-native K x V matrix dst (S[d][n]).
// A row d's float4 there holds columns n0 + 2u, + 1, + 8, + 9 (u = (n % 8) / 2): this lane has the
// even or odd ones of them (g even or odd) for both d = 8 j + 2 t and d + 1, its partner lane ^ 4
// the others. One xor shuffle per pair swaps what each needs, so the even lane stores row d's float4
// and the odd lane row d + 1's: 16 16-byte stores (a warp writes one whole 512-byte block each)
// instead of 64 scattered 4-byte ones, at the top of every chunk of the serial chain. kPaired =
// false keeps the 4-byte stores (the forward scan with the output: 92 bytes of spills otherwise).
template <bool kPaired = false, class E = float>
__device__ __forceinline__ void store_state_t(E* dst, const float (&sT)[kDlD / 2], int ncol, int t, float sc = 1.f) {
  if constexpr (!kPaired) {
#pragma unroll
    for (int j = 0; j < kDlD / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          dst[gdn_mma::frag_index(8 * j + 2 * t + e, ncol + 8 * hh, kDlD)] = sT[4 * j + 2 * hh + e];
    return;
  }
  const int g = (threadIdx.x & 31) >> 2, odd = g & 1;
  // row 2 t + odd of the first 8-row block, at the float4 of columns n0 = the 16-column block + 2u;
  // row block j is 8 x 128 elements further on
  E* p = dst + gdn_mma::frag_index(2 * t + odd, ncol - g + 2 * (g >> 1), kDlD);
#pragma unroll
  for (int j = 0; j < kDlD / 8; ++j) {
    // send the values of the other row (d + 1 from an even lane, d from an odd one)
    const float s0 = odd ? sT[4 * j] : sT[4 * j + 1], s1 = odd ? sT[4 * j + 2] : sT[4 * j + 3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 4), r1 = __shfl_xor_sync(0xffffffffu, s1, 4);
    const float4 v = odd ? make_float4(r0, sT[4 * j + 1], r1, sT[4 * j + 3]) : make_float4(sT[4 * j], r0, sT[4 * j + 2], r1);
    if constexpr (sizeof(E) == 2)  // fp16 elements (times sc): 8-byte stores
      reinterpret_cast<uint2*>(p)[j * (8 * kDlD / 4)] =
          make_uint2(gdn_mma::pack_f16(sc * v.x, sc * v.y), gdn_mma::pack_f16(sc * v.z, sc * v.w));
    else
      reinterpret_cast<float4*>(p)[j * (8 * kDlD / 4)] = v;
  }
}
// The hi / lo A fragments of a product over the columns of the transposed state: k step kk takes
// its column blocks 2 kk, 2 kk + 1 (the m64nNk16 A layout).
__device__ __forceinline__ void state_frags_t(const float (&sT)[kDlD / 2], uint32_t (&ah)[kDlD / 16][4],
                                              uint32_t (&al)[kDlD / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kDlD / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * kk + (q >> 1), hh = q & 1;
      gdn_mma::split_bf16(sT[4 * nb + 2 * hh], sT[4 * nb + 2 * hh + 1], ah[kk][q], al[kk][q]);
    }
}
// Row n of an 8 x 8 block of a transposed tile, (x0, x1) at columns i, i + 1, out as hi / lo planes
// [rows i][n] (row stride ld): split, then each plane word transposed by movmatrix, so lane (g, t)
// stores the pair at row i0 + g, columns n0 + 2 t, n0 + 2 t + 1 (rows >= L not stored).
// The hi / lo plane words of (x0, x1), each transposed in its 8 x 8 block (movmatrix).
__device__ __forceinline__ void plane_words_t(float x0, float x1, uint32_t& h, uint32_t& l) {
  gdn_mma::split_bf16(x0, x1, h, l);
  h = gdn_mma::movmatrix_trans(h);
  l = gdn_mma::movmatrix_trans(l);
}
__device__ __forceinline__ void store_planes_t(bf16* hi, bf16* lo, size_t ld, int L, int i0, int n0, float x0,
                                               float x1, int g, int t) {
  uint32_t h2, l2;
  plane_words_t(x0, x1, h2, l2);
  if (i0 + g < L) {
    const size_t o = static_cast<size_t>(i0 + g) * ld + n0 + 2 * t;
    *reinterpret_cast<uint32_t*>(hi + o) = h2;
    *reinterpret_cast<uint32_t*>(lo + o) = l2;
  }
}
// Both 8 x 8 blocks of 16 columns n0 .. n0 + 15 (x = the pairs at n0 and n0 + 8): after the
// transposes, lanes t and t ^ 1 swap one word per plane, so an even t stores columns n0 + 2 t .. + 3
// and an odd t columns n0 + 8 + 2 (t - 1) .. + 3 (8 bytes): a warp's store fills each row's whole
// 32-byte sector. (Two 4-byte stores per block filled half a sector each: the recompute scan's
// store segments were half its stall samples.)
template <bool kF16 = false>  // kF16: one fp16 plane (times sc) at hi, no lo
__device__ __forceinline__ void store_planes_pair_t(bf16* hi, bf16* lo, size_t ld, int L, int i0, int n0,
                                                    const float (&x)[4], int g, int t, float sc = 1.f) {
  uint32_t h[2], l[2] = {0u, 0u};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if constexpr (kF16)
      h[hh] = gdn_mma::movmatrix_trans(gdn_mma::pack_f16(sc * x[2 * hh], sc * x[2 * hh + 1]));
    else
      plane_words_t(x[2 * hh], x[2 * hh + 1], h[hh], l[hh]);
  }
  const int odd = t & 1;
  const uint32_t rh = __shfl_xor_sync(0xffffffffu, odd ? h[0] : h[1], 1);
  uint32_t rl = 0u;
  if constexpr (!kF16) rl = __shfl_xor_sync(0xffffffffu, odd ? l[0] : l[1], 1);
  if (i0 + g < L) {
    const size_t o = static_cast<size_t>(i0 + g) * ld + n0 + 2 * t + 6 * odd;  // odd: n0 + 8 + 2 (t - 1)
    *reinterpret_cast<uint2*>(hi + o) = odd ? make_uint2(rh, h[1]) : make_uint2(h[0], rh);
    if constexpr (!kF16) *reinterpret_cast<uint2*>(lo + o) = odd ? make_uint2(rl, l[1]) : make_uint2(l[0], rl);
  }
}

// One item of a wgmma scan: segment p (every unsplit sample is one) of one value head, its first row,
// length, chunk count and first chunk; and, for the split (gdn_chunk_table_kernel's plan), the
// item's kind (ScanItem), the segment's index in its sample, the sample's segment count and the
// segment's state slot.
struct WgScanItem {
  int head, kh, bos, len, n, first, p, kind, idx, nseg, slot;
};
// A plain wgmma scan CTA's item from the 1-D grid (scan_block at bv = dv): an unsplit segment.
__device__ __forceinline__ WgScanItem wg_scan_cta(const int* seq_order, const int32_t* cu, const int* seq_off, int Hk,
                                                  int Hv) {
  const ScanBlock sb = scan_block(seq_order, Hv, kDlD, kDlD);
  const int bos = cu[sb.s], len = cu[sb.s + 1] - bos;
  return {sb.head, sb.head / (Hv / Hk), bos, len, (len + kC - 1) / kC, seq_off[sb.s], sb.s, kItemOut, 0, 1, -1};
}
// The first 1024-byte-aligned address of dynamic smem (the 128-byte swizzle's panels need it).
__device__ __forceinline__ char* align1024(unsigned char* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return reinterpret_cast<char*>(smem) + ((1024u - (a & 1023u)) & 1023u);
}
// A thread of a warpgroup's accumulator: warp w of the warpgroup, lane / 4 = g, lane % 4 = t (from one
// tid_x read).
struct WgLane {
  int w, g, t;
};
__device__ __forceinline__ WgLane wg_lane() {
  const int x = tid_x();
  return {(x >> 5) & 3, (x & 31) >> 2, x & 3};
}
// hi / lo planes (row r at r * 128 bytes, 128-byte swizzle) of f(v, r, c) over the accumulator,
// rows r0 + r, columns c0 + c (r0, c0 multiples of 8; pairs of columns per 32-bit word). kLo = false:
// the bf16 plane hi only (lo unused), for operands that feed only bf16 outputs (dq^, dk^), whose own
// rounding is the same 2^-9. By stmatrix: the accumulator's pairs are the 8 x 8 matrices' fragments,
// so one instruction stores a warp's 4 matrices (rows 16 w .. + 15, two column blocks of 8) per plane
// where 4-byte stores took four.
template <int kN, bool kLo = true, bool kF16 = false, class F>
__device__ __forceinline__ void acc_planes(char* hi, char* lo, const float (&acc)[kN / 2], int r0, int c0, F&& f) {
  const auto [w, g, t] = wg_lane();
  // This lane addresses row rr of matrix m = (column block 2 nb2 + m / 2, row half m % 2).
  const int lane = tid_x() & 31, m = lane >> 3, rr = lane & 7;
  const int row = r0 + 16 * w + 8 * (m & 1) + rr, cb = (c0 >> 3) + (m >> 1);
  const uint32_t hrow = wg::smem_addr(hi) + row * 128u, lrow = kLo ? wg::smem_addr(lo) + row * 128u : 0u;
#pragma unroll
  for (int nb2 = 0; nb2 < kN / 16; ++nb2) {
    uint32_t h[4], l[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nb = 2 * nb2 + (q >> 1), hh = q & 1;
      const int r = 16 * w + g + 8 * hh, c = 8 * nb + 2 * t;
      const float x0 = f(acc[4 * nb + 2 * hh], r, c), x1 = f(acc[4 * nb + 2 * hh + 1], r, c + 1);
      if constexpr (kF16)
        h[q] = gdn_mma::pack_f16(x0, x1);
      else if constexpr (kLo)
        gdn_mma::split_bf16(x0, x1, h[q], l[q]);
      else
        h[q] = gdn_mma::pack_bf16(x0, x1);
    }
    const uint32_t chunk = ((((cb + 2 * nb2) ^ row) & 7) << 4);
    gdn_mma::stmatrix_x4(hrow + chunk, h[0], h[1], h[2], h[3]);
    if constexpr (kLo && !kF16) gdn_mma::stmatrix_x4(lrow + chunk, l[0], l[1], l[2], l[3]);
  }
}
// P = (q k^T) gated (p_entry's values, its gates by ex2) for a chunk whose raw q and k rows sit in
// the 128-byte-swizzled panel tiles qt, kt, shared by both warpgroups: warpgroup wgi forms columns
// j = 32 wgi .. 32 wgi + 31 (exact bf16 products: 8 m64n32k16 with B = k's rows from 32 wgi) and
// splits them into the hi / lo planes [i][j] at planes, planes + kDlPanel (row i, column j: the
// K-major layout of B = P^T and the N-major one of B = P). Ends with a CTA barrier, so either
// warpgroup's wgmma may read all of P.
// (Each warpgroup formed the whole of P for itself before: its epilogue was ~23 % of the forward
// scan's stall samples.) The caller has no product in flight (with one in flight, reading registers
// it wrote makes ptxas wait for it), and both warpgroups are done reading the previous chunk's P.
// kLo = false: the hi plane only (the plain instances' output products read no lo part).
template <bool kLo = true>
__device__ __forceinline__ void wg_p_planes(char* planes, const char* qt, const char* kt, const float* gsc,
                                            const float* rqc, const float* rkc, int wgi) {
  constexpr int kHalf = kC / 2;
  const int w = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  float pacc[kHalf / 2];
  wg::mma_abt_sync<kHalf, kDlD / 16>(pacc, qt, kDlPanel, kt + wgi * kHalf * 128, kDlPanel);
  // The row and column data of this thread's 2 rows and 8 columns read once, and the gates by ex2 of
  // log2-scaled differences (as bwd_chunk's CcThread): p_entry's expf and per-entry loads made this
  // epilogue ~42 instructions per entry, 16 % of the 27B forward scan (ncu, sixteenth round).
  const int i0 = 16 * w + g, j0 = kHalf * wgi + 2 * t;
  float g2i[2], rqi[2], g2j[kHalf / 4], rkj[kHalf / 4];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    g2i[hh] = gsc[i0 + 8 * hh] * kLog2e;
    rqi[hh] = rqc[i0 + 8 * hh];
  }
#pragma unroll
  for (int nb = 0; nb < kHalf / 8; ++nb) {
    const float2 gj = ld_f2(gsc + j0 + 8 * nb), rj = ld_f2(rkc + j0 + 8 * nb);
    g2j[2 * nb] = gj.x * kLog2e;
    g2j[2 * nb + 1] = gj.y * kLog2e;
    rkj[2 * nb] = rj.x;
    rkj[2 * nb + 1] = rj.y;
  }
  // the planes by stmatrix (acc_planes): element (i, 32 wgi + c) with c = 8 nb + 2 t + e
  acc_planes<kHalf, kLo>(planes, planes + kDlPanel, pacc, 0, kHalf * wgi, [&](float v, int i, int c) {
    const int hh = (i >> 3) & 1, q = 2 * (c >> 3) + (c & 1);
    return kHalf * wgi + c <= i ? rqi[hh] * rkj[q] * v * ex2_ftz(g2i[hh] - g2j[q]) : 0.f;
  });
  wg::fence_proxy_async();
  __syncthreads();
}

// Per chunk parity, the row arrays of the wgmma scans: ks = e^{G_L - G_i} rs_k(i), eq = e^{G_i} rs_q(i),
// G (past L: G_L, so e^{G_i - G_j} stays finite), rq, rk for P, beta and kbs = beta e^{G_i} rs_k(i).
// Rows >= L: scales and beta 0.
constexpr int kWgRows = 7 * kC;
// kEx2: the exponentials as ex2 of log2-scaled G (expf's range reduction is ~10 instructions each,
// at the top of every chunk, where the other warps wait at the barrier for these rows). Used by the
// plain forward's scan only: there it gained, in the scans that store their state it cost ~1 %.
template <bool kEx2 = false>
__device__ __forceinline__ void wg_store_rows(float* rows, int L, float gl, float gi, float2 r, float b, float vb) {
  const int i = threadIdx.x;
  if (i < kC) {
    const float egi = kEx2 ? ex2_ftz(gi * kLog2e) : expf(gi);
    rows[i] = (kEx2 ? ex2_ftz((gl - gi) * kLog2e) : expf(gl - gi)) * r.y;
    rows[kC + i] = egi * r.x;
    rows[2 * kC + i] = i < L ? gi : gl;
    rows[3 * kC + i] = r.x;
    rows[4 * kC + i] = r.y;
    rows[5 * kC + i] = vb;  // beta on v's rows: 0 in the split's M map (v = 0)
    rows[6 * kC + i] = b * egi * r.y;
  }
}
// The wgmma scans' next chunk (in either direction): G at its last valid row; G, the row scales and
// beta at row threadIdx.x (0 past the chunk).
struct WgGates {
  float gl = 0.f, gi = 0.f, b = 0.f;
  float2 r = make_float2(0.f, 0.f);
  __device__ void load(const float* Gc, const float* rs, const float* beta, int c0, int L, int Hk, int Hv, int head,
                       int kh) {
    const int i = threadIdx.x;
    gl = Gc[static_cast<size_t>(c0 + L - 1) * Hv + head];
    gi = 0.f;
    b = 0.f;
    r = make_float2(0.f, 0.f);
    if (i < L) {
      gi = Gc[static_cast<size_t>(c0 + i) * Hv + head];
      b = beta[static_cast<size_t>(c0 + i) * Hv + head];
      r = reinterpret_cast<const float2*>(rs)[static_cast<size_t>(c0 + i) * Hk + kh];
    }
  }
};

// The split's state buffers (gdn_stages.h's SplitBuffers) as the scans address them: S entering a
// slot's segment, its map's M and E, the reverse scan's G and F (fragment-native [d][n], store_state_t's
// layout), and the flags set when each is stored (signal_done).
struct SplitStates : SplitBuffers {
  __device__ float* at(SplitState which, int slot, int Hv, int head) const {
    float* base = which == kStateS ? S : which == kStateM ? M : which == kStateE ? E : which == kStateG ? G : F;
    return base + (static_cast<size_t>(slot) * Hv + head) * kDlD * kDlD;
  }
  __device__ int* flag(SplitState which, int Hv) const { return flags + static_cast<size_t>(which) * slots * Hv; }
};
// sT (store_state_t's register layout) from a fragment-native D x D state.
__device__ __forceinline__ void load_state_t(float (&sT)[kDlD / 2], const float* src, int ncol, int t) {
#pragma unroll
  for (int j = 0; j < kDlD / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) sT[4 * j + 2 * hh + e] = src[gdn_mma::frag_index(8 * j + 2 * t + e, ncol + 8 * hh, kDlD)];
}

// The scan CTA's current item (a fixed smem address: no register holds a pointer to it).
__shared__ WgScanItem scan_item;
__device__ __forceinline__ WgScanItem wg_scan_item(int ticket, const int* items, const int* vcu, const int* seq_off,
                                                   const int4* seginfo, int Hk, int Hv) {
  const int it = items[ticket / Hv], head = ticket % Hv, p = it >> 2;
  const int4 si = seginfo[p];
  const int bos = vcu[p], len = vcu[p + 1] - bos;
  return {head, head / (Hv / Hk), bos, len, (len + kC - 1) / kC, seq_off[p], p, it & 3, si.y, si.z, si.w};
}

// The next ticket of counts[counter] (of counts[count] x Hv), decoded into scan_item by thread 0; every
// thread returns whether there was one. Starts with a barrier: every thread is done with the last.
__device__ __forceinline__ bool take_scan_item(int* counts, int counter, int count, const int* items, const int* vcu,
                                               const int* seq_off, const int4* seginfo, int Hk, int Hv) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const int b = atomicAdd(counts + counter, 1);
    if (b < counts[count] * Hv) {
      scan_item = wg_scan_item(b, items, vcu, seq_off, seginfo, Hk, Hv);
    } else {
      scan_item.head = -1;
    }
  }
  __syncthreads();
  return scan_item.head >= 0;
}

// A scan item's code path: kPlain (no split: the code the scans were tuned with), kSplitOut (an
// item of the split), kSplitMap (the forward's maps; fwd_scan.cu).
enum ScanMode : int { kPlain = 0, kSplitOut = 1, kSplitMap = 2 };

}  // namespace
}  // namespace qt::cuda::gdn
