// The forward state scan on wgmma (dk = dv = 128): one CTA of two warpgroups per (segment, value
// head), or CTAs taking the split plan's items by ticket; forms the output in the scan where no
// output kernel follows.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_wgmma.cuh"

namespace qt::cuda::gdn {
namespace {

// ---- forward state scan on wgmma (dk = dv = 128) -------------------------------------------------
// One CTA of two warpgroups per (sample, value head). Warpgroup wg owns the state columns
// n = 64 wg .. 64 wg + 63 and keeps them transposed, S^T (64 x K), in its m64n128 accumulator, which
// is also the m64nNk16 A-fragment layout of a product over d. Per chunk (D = U - W S = T Y with
// Y = diag(b) V - diag(kbs) k S, so W and U are never formed):
//   acc = S^T k^T                    A = S^T split hi / lo in registers, B = raw k (K-major):
//                                    2 x 8 m64n64k16;
//   D^T = Y^T T^T                    Y^T = V^T diag(b) - acc diag(kbs) split in registers, B = T's
//                                    planes (K-major): 3 x 4 m64n64k16;
//   S^T = e^{G_L} S^T + (ks D)^T k   A = (ks D)^T split from the D^T accumulator, B = raw k
//                                    (N-major): 2 x 4 m64n128k16; ks_i = e^{G_L - G_i} rs_k(i).
// So neither S nor D passes through shared memory (the mma.sync kernel writes and reads both as
// planes every chunk): T's planes, raw k (and q) as 128-byte-swizzled panels and the raw v rows are
// the only tiles (cp.async, two buffers: chunk c+1 loads during chunk c), one barrier per chunk; the
// two warpgroups share nothing else. Every fp32 x fp32 product is split hi / lo as in the mma.sync
// kernels (the sums run in another order). 103 KB of smem, 167 KB with the output.

// The raw v rows of a chunk (plain [i][n] rows, stride kVLd: 16-byte aligned, the 8 rows of an
// ldmatrix hit 8 distinct 16-byte bank groups, and the transposed 2-byte reads 16 distinct banks per
// warp) and the accumulators' transposed layout read from them: x[4 j + 2 hh + e] = v[8 j + 2 t + e][n0 +
// g + 8 hh] for the warp's columns n0 = 64 wgi + 16 w. kLdsm: each 8 x 8 block (j, hh) is one
// ldmatrix.trans matrix (its thread l gets rows 2 (l % 4), + 1 of column l / 4), 4 ldmatrix.x4
// instead of 32 2-byte loads. That gained 2-3 % in the forward scan that forms only the output, and
// lost 1-4 % in the two that keep the state (call 11), which keep the 2-byte loads.
constexpr int kVLd = kDlD + 8;
template <bool kLdsm>
__device__ __forceinline__ void v_tile_t(float (&x)[kC / 2], const bf16* vs, int n0) {
  const int lane = threadIdx.x & 31;
  if constexpr (kLdsm) {
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int kb = 0; kb < kC / 16; ++kb) {
      uint32_t r[4];
      gdn_mma::ldmatrix_x4<true>(r, vs + (16 * kb + 8 * (m >> 1) + rr) * kVLd + n0 + 8 * (m & 1));
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
        const int q = 4 * (2 * kb + (mm >> 1)) + 2 * (mm & 1);
        x[q] = __uint_as_float(r[mm] << 16);
        x[q + 1] = __uint_as_float(r[mm] & 0xffff0000u);
      }
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kC / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) x[4 * j + 2 * hh + e] = to_f(vs[(8 * j + 2 * t + e) * kVLd + n0 + g + 8 * hh]);
  }
}

// kOut: the output O = diag(e^G rq) q S + P D of each chunk is formed here too (no output kernel,
// and h is not read back in the forward): O^T = (S^T q^T) diag(eq) + D^T P^T, with A = S^T (the
// fragments of the first product) and B = raw q (K-major), then A = D^T with B = P's planes
// (K-major): 2 x 8 + 3 x 4 more m64n64k16 per chunk, the q tile in each buffer and P per warpgroup.
// h and the D planes are stored only when given (the backward needs them; a forward that keeps no
// state passes nullptr).
template <bool kOut>
constexpr uint32_t scan_fwd_wg_buf() {  // T hi, T lo (one panel each), raw k (, raw q) panels, raw v rows
  return 2 * kDlPanel + (kOut ? 2 : 1) * kDlTile + kC * kVLd * 2;
}
template <bool kOut>
constexpr size_t scan_fwd_wg_smem() {
  return 2 * scan_fwd_wg_buf<kOut>() + (kOut ? 2 * kDlPanel : 0) + (2 * kWgRows + 48) * sizeof(float) + 1024;
}
static_assert(scan_fwd_wg_buf<true>() % 1024 == 0 && scan_fwd_wg_buf<false>() % 1024 == 0, "panels 1024-aligned");

// S_out = M S_in + E (D x D, fragment-native), all 256 threads: the split's combine, ~fp32 products
// (hi / lo split, 3 mma per k step).
__device__ void combine_state(float* S_out, const float* M, const float* S_in, const float* E) {
  constexpr int D = kDlD;
  auto m_pair = [M](int i, int k) { return ld_f2(M + gdn_mma::frag_index(i, k, D)); };
  gdn_mma::for_tiles<4>(
      D, D,
      [&](float (&acc)[4][4], int m0, int n0) { mma_acc<4>(acc, m0, n0, 0, D, Gk<decltype(m_pair)>{m_pair}, NtT{S_in, D}); },
      Pair{[&](int i, int j, float v0, float v1) {
        const int o = gdn_mma::frag_index(i, j, D);
        const float2 e = ld_f2(E + o);
        *reinterpret_cast<float2*>(S_out + o) = make_float2(v0 + e.x, v1 + e.y);
      }});
}

// S_s for a kItemOutFromState item of segment index s (all threads): S_1 is the first segment's
// leaving state (its flag awaited); from s = 2 on S_s = M_{s-1} S_{s-1} + E_{s-1} is formed here once
// the predecessor's S and map are stored, and published for segment s + 1.
__device__ void split_entering_state(const SplitStates& st, int idx, int slot, int Hv, int head) {
  if (idx < 2) {
    wait_done(st.flag(kStateS, Hv), slot, Hv, head);
    return;
  }
  for (SplitState which : {kStateS, kStateM, kStateE}) wait_done(st.flag(which, Hv), slot - 1, Hv, head);
  combine_state(st.at(kStateS, slot, Hv, head), st.at(kStateM, slot - 1, Hv, head),
                st.at(kStateS, slot - 1, Hv, head), st.at(kStateE, slot - 1, Hv, head));
  signal_done(st.flag(kStateS, Hv), slot, Hv, head);  // its barrier makes S visible to this CTA too
}

// Each product batch is issued by warpgroup 0 before warpgroup 1's (wg::issue_after_wg0): forward
// +1.5-2 % at every shape in the sixteenth round.
// kMode (ScanMode): kPlain (no split: the code the scans were tuned with), kSplitOut (an output item
// of the split), kSplitMap (a map: kItemE from 0, kItemM from I with v = 0, i.e. beta 0 on v's rows; it
// stores nothing but its leaving state). kItemOutFromState starts from S_s (split_entering_state
// made it); a split sample's kItemOut stores its leaving state as S_1. The split items read their
// kind and slot again from smem (scan_item) after the chunk loop, so those are not held in registers
// across it.
// kWaitPrep (the plain forward's scan, beside prep): the item's first k, q, v tiles are issued before
// it waits for prep's flags of its chunks (prep_done), then T's and the gates.
template <bool kOut, bool kLoadsFirst, int kMode, bool kWaitPrep = false, bool kF16 = false>
__device__ __forceinline__ void scan_fwd_item(const WgScanItem& cta, unsigned char* smem_raw, float* h, bf16* Dgh,
                                              bf16* Dgl, bf16* o, const bf16* Th, const bf16* Tl, const bf16* qkv,
                                              const float* rs, const float* Gc, const float* beta,
                                              const SplitStates& st, int Hk, int Hv, int conv_dim, int* done,
                                              const int* prep_done = nullptr, float* scl = nullptr) {
  static_assert(!kF16 || (!kOut && kMode != kSplitMap), "fp16 stores: the backward's recompute only");
  constexpr int D = kDlD;
  constexpr uint32_t kBuf = scan_fwd_wg_buf<kOut>(), kTk = 2 * kDlPanel, kTq = kTk + kDlTile;
  constexpr uint32_t kTv = kTk + (kOut ? 2 : 1) * kDlTile;
  // The output instance without kLoadsFirst is the plain forward's (gdn_forward keeps no h, D there):
  // its state stores are compiled out, as the maps' are.
  constexpr bool kMap = kMode == kSplitMap;
  constexpr bool kStores = (!kOut || kLoadsFirst) && !kMap;
  // D's planes by store_planes_pair_t in the recompute's (and 2B kept forward's) instance: the kept
  // instance that forms the output lost 3-4 % with them, the ticket instance spilled.
  constexpr bool kPairStores = kStores && !kOut && kMode == kPlain;
  // The same instances store h under D's product batch (below), the others at the chunk's top.
  constexpr bool kHUnderBatch = kPairStores;
  // The plain instances form the output (bf16) from the hi parts of S, D and P (one product each,
  // as flash-linear-attention's bf16 h); the state recurrence, h and D keep the hi / lo products.
  // The ticket instance keeps hi / lo there too: with one product its registers spilled.
  constexpr bool kOutHi = kOut && kMode == kPlain;
  const int head = cta.head, kh = cta.kh, bos = cta.bos, len = cta.len, n = cta.n, first = cta.first;
  // A sample's first segment enters with state 0: its first h is not stored (rtable's kRtFirst).
  const bool zero_first = cta.kind == kItemOut;
  char* tiles = align1024(smem_raw);  // panels 1024-aligned
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  char* pplanes = tiles + 2 * kBuf;  // kOut: P hi, lo [i][j] (wg_p_planes)
  float* rows = reinterpret_cast<float*>(tiles + 2 * kBuf + (kOut ? 2 * kDlPanel : 0));  // [parity][kWgRows]
  const int ncol = 64 * wgi + 16 * w + g;  // this thread's state columns: ncol, ncol + 8
  const size_t w_ld = static_cast<size_t>(Hv) * D, x_ld = static_cast<size_t>(conv_dim);
  const bf16* qraw = qkv + static_cast<size_t>(kh) * D;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * D;
  const bf16* vraw = qkv + 2 * static_cast<size_t>(Hk) * D + static_cast<size_t>(head) * D;
  // with_t: T's tiles (prep's results); with_x: k, q, v (the input's)
  auto load_chunk = [&](int ci, int b, bool with_t = true, bool with_x = true) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    char* dst = tiles + b * kBuf;
    const size_t tb = (static_cast<size_t>(first + ci) * Hv + head) * kC * kC;
    if (with_t) {
      async_panels<256, kC>(dst, Th + tb, kC, kC);  // every row: T's padded rows are identity rows
      async_panels<256, kC>(dst + kDlPanel, Tl + tb, kC, kC);
    }
    if (with_x) {
      async_panels<256>(dst + kTk, kraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
      if constexpr (kOut) async_panels<256>(dst + kTq, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
      async_rows(reinterpret_cast<bf16*>(dst + kTv), kVLd, vraw + static_cast<size_t>(c0) * x_ld, x_ld, L, D);
    }
  };
  WgGates nx;
  if (n > 0) {
    if constexpr (kWaitPrep) {
      load_chunk(0, 0, false, true);
      wait_prep_chunks(prep_done, first, n, Hk, kh);
      load_chunk(0, 0, true, false);
    } else {
      load_chunk(0, 0);
    }
    nx.load(Gc, rs, beta, bos, min(kC, len), Hk, Hv, head, kh);
  }
  cp_async_commit();
  // S^T: rows ncol (regs 4 j + 0, 1) and ncol + 8 (4 j + 2, 3), columns d = 8 j + 2 t (+1).
  float sT[2 * D / 4];
  if (kMode == kSplitOut && cta.kind == kItemOutFromState) {
    load_state_t(sT, st.at(kStateS, cta.slot, Hv, head), ncol, t);  // split_entering_state made it
  } else {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          sT[4 * j + 2 * hh + e] = cta.kind == kItemM && 8 * j + 2 * t + e == ncol + 8 * hh ? 1.f : 0.f;
  }
  const float vb_on = kMap && cta.kind == kItemM ? 0.f : 1.f;
  // kF16: D of the last chunk, stored at this chunk's top once the top barrier has published its scale,
  // with the largest |D|, |v| of this thread's part of that chunk (the chunk's tile maxima).
  const size_t dcol = static_cast<size_t>(head) * D;
  auto store_d = [&](const float (&x)[kC / 2], int c0, int L, float s) {
#pragma unroll
    for (int j = 0; j < kC / 8; ++j)
      store_planes_pair_t<kF16>(Dgh + static_cast<size_t>(c0) * w_ld + dcol, Dgl + static_cast<size_t>(c0) * w_ld + dcol,
                                w_ld, L, 8 * j, 64 * wgi + 16 * w, {x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]},
                                g, t, s);
  };
  float dprev[kF16 ? kC / 2 : 1], m_d = 0.f, m_v = 0.f;
  float* red = rows + 2 * kWgRows;  // kF16: [parity][h, D, v][8]
  for (int ci = 0; ci < n; ++ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC), buf = ci & 1;
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = nx.gl;
    const float* rw = rows + buf * kWgRows;  // two copies: the other warpgroup may still read the last chunk's
    wg_store_rows<!kStores && kOut>(rows + buf * kWgRows, L, gl, nx.gi, nx.r, nx.b, kMap ? nx.b * vb_on : nx.b);
    if (ci + 1 < n) nx.load(Gc, rs, beta, c0 + kC, min(kC, len - (ci + 1) * kC), Hk, Hv, head, kh);
    cp_async_wait<0>();  // this chunk's tiles
    wg::fence_proxy_async();
    if constexpr (kF16) {  // h's maximum, and the last chunk's D's and v's
      float m = 0.f;
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) m = fmaxf(m, fabsf(sT[r]));
      publish_max(m, red + 24 * buf);
      publish_max(m_d, red + 24 * buf + 8);
      publish_max(m_v, red + 24 * buf + 16);
    }
    __syncthreads();  // tiles and rows visible; both warpgroups are done with the other buffer
    // The next chunk's tiles into the other buffer: issued under the first product batch (below),
    // unless kLoadsFirst (the instance that forms the output and keeps the state: there that cost
    // the training path 2-3 %, though the forward alone gained 3-5 %).
    if constexpr (kLoadsFirst) {
      if (ci + 1 < n) load_chunk(ci + 1, buf ^ 1);
      cp_async_commit();
    }
    const char* cur = tiles + buf * kBuf;

    // h[chunk] = the state entering the chunk (fragment-native K x V), here or under D's batch.
    float s_h = 1.f;  // kF16: h's tile scale
    if constexpr (kF16) {
      s_h = published_scale(red + 24 * buf);
      if (tid == 0) scl[(chunk * Hv + head) * kSclFloats + kSclH] = s_h;
      if (ci > 0) {
        const float s_d = published_scale(red + 24 * buf + 8);
        if (tid == 0) {
          scl[((chunk - 1) * Hv + head) * kSclFloats + kSclD] = s_d;
          scl[((chunk - 1) * Hv + head) * kSclFloats + kSclV] = published_scale(red + 24 * buf + 16);
        }
        if (Dgh != nullptr) store_d(dprev, c0 - kC, kC, s_d);  // every chunk but a sample's last is full
      }
    }
    auto store_h = [&] {
      if constexpr (kF16)
        store_state_t<true>(reinterpret_cast<__half*>(h) + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t, s_h);
      else
        store_state_t<!kOut>(h + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t);
    };
    const bool h_stored = h != nullptr && (ci > 0 || !zero_first);
    if (kStores && !kHUnderBatch && h_stored) store_h();
    if constexpr (kOut) wg_p_planes<!kOutHi>(pplanes, cur + kTq, cur + kTk, rw + 2 * kC, rw + 3 * kC, rw + 4 * kC, wgi);

    // D = U - W S = T Y with Y = diag(b) V - diag(kbs) k S (W = T diag(kbs) k and U = T diag(b) V are
    // never formed). First acc = S^T k^T (kOut: and oT = S^T q^T, same fragments; k, q exact).
    float acc[kC / 2], oT[kC / 2];
    {
      uint32_t ah[D / 16][4], al[D / 16][4];
      state_frags_t(sT, ah, al);
      const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur + kTk, 16, 1024));
      const uint64_t q0 = wg::desc_opaque(wg::desc_sw128(cur + kTq, 16, 1024));
      wg::issue_after_wg0(wgi, 1);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * kDlPanel + (kk % 4) * 32;
        wg::mma_m64n64k16_rs<0>(acc, ah[kk], wg::desc_advance(k0, off), kk > 0);
        wg::mma_m64n64k16_rs<0>(acc, al[kk], wg::desc_advance(k0, off), 1);
        if constexpr (kOut) {
          wg::mma_m64n64k16_rs<0>(oT, ah[kk], wg::desc_advance(q0, off), kk > 0);
          if constexpr (!kOutHi) wg::mma_m64n64k16_rs<0>(oT, al[kk], wg::desc_advance(q0, off), 1);
        }
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 1);
      if constexpr (!kLoadsFirst) {
        if (ci + 1 < n) load_chunk(ci + 1, buf ^ 1);
        cp_async_commit();
      }
      wg::wait<0>();
    }
    wg::fence_operands(acc);
    if constexpr (kOut) wg::fence_operands(oT);
    // Y^T = V^T diag(b) - acc diag(kbs) as A fragments, then D^T = Y^T T^T (B = T's planes, K-major).
    float dT[kC / 2];
    {
      uint32_t yh[kC / 16][4], yl[kC / 16][4];
      float vT[kC / 2];
      v_tile_t<kOut && !kLoadsFirst>(vT, reinterpret_cast<const bf16*>(cur + kTv), 64 * wgi + 16 * w);
      if constexpr (kF16) {  // the CTA's vT together hold the whole v tile
        m_v = 0.f;
#pragma unroll
        for (int r = 0; r < kC / 2; ++r) m_v = fmaxf(m_v, fabsf(vT[r]));
      }
#pragma unroll
      for (int j = 0; j < kC / 8; ++j) {
        const float2 bv = ld_f2(rw + 5 * kC + 8 * j + 2 * t), kv = ld_f2(rw + 6 * kC + 8 * j + 2 * t);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          gdn_mma::split_bf16(bv.x * vT[4 * j + 2 * hh] - kv.x * acc[4 * j + 2 * hh],
                              bv.y * vT[4 * j + 2 * hh + 1] - kv.y * acc[4 * j + 2 * hh + 1],
                              yh[j >> 1][hh + 2 * (j & 1)], yl[j >> 1][hh + 2 * (j & 1)]);
      }
      const uint64_t th0 = wg::desc_opaque(wg::desc_sw128(cur, 16, 1024));
      const uint64_t tl0 = wg::desc_opaque(wg::desc_sw128(cur + kDlPanel, 16, 1024));
      wg::issue_after_wg0(wgi, 2);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        wg::mma_m64n64k16_rs<0>(dT, yh[kk], wg::desc_advance(th0, kk * 32), kk > 0);
        wg::mma_m64n64k16_rs<0>(dT, yl[kk], wg::desc_advance(th0, kk * 32), 1);
        wg::mma_m64n64k16_rs<0>(dT, yh[kk], wg::desc_advance(tl0, kk * 32), 1);
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 2);
      // h[chunk] under this batch (the recompute's, the 2B kept forward's instance): the warps' wait for
      // the 16 stores to drain overlaps the tensor work (recompute scan 27B -3.5 %; under the first
      // batch it lost 2 %; the kept output instance lost 6-12 % under either and stores at the top).
      if (kHUnderBatch && h_stored) store_h();
      wg::wait<0>();
    }
    wg::fence_operands(dT);
    if constexpr (kF16) {
      m_d = 0.f;
#pragma unroll
      for (int r = 0; r < kC / 2; ++r) {
        m_d = fmaxf(m_d, fabsf(dT[r]));
        dprev[r] = dT[r];
      }
    }

    // D out as planes (each 8 x 8 block of D^T transposed by movmatrix, so a lane stores a pair
    // adjacent in n), (ks D)^T as the update's A fragments, kOut: D^T as the output's, and oT's
    // columns scaled by eq_i.
    const size_t dbase = static_cast<size_t>(c0) * w_ld + static_cast<size_t>(head) * D;
    uint32_t ph[kC / 16][4], pl[kC / 16][4], xh[kC / 16][4], xl[kC / 16][4];
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      const float2 kv = ld_f2(rw + 8 * j + 2 * t);
      const float2 ev = ld_f2(rw + kC + 8 * j + 2 * t);
      if (kPairStores && !kF16 && Dgh != nullptr)
        store_planes_pair_t(Dgh + dbase, Dgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w,
                            {dT[4 * j], dT[4 * j + 1], dT[4 * j + 2], dT[4 * j + 3]}, g, t);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float x0 = dT[4 * j + 2 * hh], x1 = dT[4 * j + 2 * hh + 1];
        if (kStores && !kPairStores && !kF16 && Dgh != nullptr)
          store_planes_t(Dgh + dbase, Dgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w + 8 * hh, x0, x1, g, t);
        const int kk = j >> 1, q = hh + 2 * (j & 1);
        gdn_mma::split_bf16(kv.x * x0, kv.y * x1, ph[kk][q], pl[kk][q]);
        if constexpr (kOut) {
          if constexpr (kOutHi)
            xh[kk][q] = gdn_mma::pack_bf16(x0, x1);
          else
            gdn_mma::split_bf16(x0, x1, xh[kk][q], xl[kk][q]);
          oT[4 * j + 2 * hh] *= ev.x;
          oT[4 * j + 2 * hh + 1] *= ev.y;
        }
      }
    }

    // S^T = e^{G_L} S^T + (ks D)^T k: B = the raw k rows, N-major (64-column blocks kDlPanel apart);
    // kOut: oT += D^T P^T, B = P's planes, K-major. Not in a plain recompute's last chunk: the state
    // leaving the sample is never read there.
    if (kOut || kMode != kPlain || ci + 1 < n) {
      const float egl = expf(gl);
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) sT[r] *= egl;
      {
        const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur + kTk, kDlPanel, 1024));
        const uint64_t p0 = wg::desc_opaque(wg::desc_sw128(pplanes, 16, 1024));
        wg::issue_after_wg0(wgi, 3);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          wg::mma_m64n128k16_rs<1>(sT, ph[kk], wg::desc_advance(k0, kk * 2048), 1);
          wg::mma_m64n128k16_rs<1>(sT, pl[kk], wg::desc_advance(k0, kk * 2048), 1);
        }
        if constexpr (kOut) {
#pragma unroll
          for (int kk = 0; kk < kC / 16; ++kk) {
            wg::mma_m64n64k16_rs<0>(oT, xh[kk], wg::desc_advance(p0, kk * 32), 1);
            if constexpr (!kOutHi) {
              wg::mma_m64n64k16_rs<0>(oT, xl[kk], wg::desc_advance(p0, kk * 32), 1);
              wg::mma_m64n64k16_rs<0>(oT, xh[kk], wg::desc_advance(p0, kDlPanel + kk * 32), 1);
            }
          }
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 3);
        wg::wait<0>();
      }
      wg::fence_operands(sT);
    }
    if constexpr (kOut) {
      wg::fence_operands(oT);
      // O rows i < L as bf16 (8 x 8 blocks of O^T transposed by movmatrix, as the D planes).
#pragma unroll
      for (int j = 0; j < kC / 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t v = gdn_mma::movmatrix_trans(gdn_mma::pack_bf16(oT[4 * j + 2 * hh], oT[4 * j + 2 * hh + 1]));
          if (8 * j + g < L)
            *reinterpret_cast<uint32_t*>(o + dbase + static_cast<size_t>(8 * j + g) * w_ld + 64 * wgi + 16 * w + 8 * hh +
                                         2 * t) = v;
        }
    }
  }
  cp_async_wait<0>();
  if constexpr (kF16) {  // the last chunk's D
    if (n > 0) {
      publish_max(m_d, red + 24 * (n & 1) + 8);
      publish_max(m_v, red + 24 * (n & 1) + 16);
      __syncthreads();
      const float s_d = published_scale(red + 24 * (n & 1) + 8);
      const size_t last = static_cast<size_t>(first + n - 1);
      if (tid == 0) {
        scl[(last * Hv + head) * kSclFloats + kSclD] = s_d;
        scl[(last * Hv + head) * kSclFloats + kSclV] = published_scale(red + 24 * (n & 1) + 16);
      }
      if (Dgh != nullptr) store_d(dprev, bos + (n - 1) * kC, len - (n - 1) * kC, s_d);
    }
  }
  if constexpr (kMode == kPlain) {
    if constexpr (!kOut) signal_done_counted(done, cta.p, Hv, head);
    return;
  }
  // The leaving state where the split needs it: a map's M or E, a split sample's S_1.
  const volatile WgScanItem* vit = &scan_item;
  const int kind = vit->kind, slot = vit->slot;
  if (kind != kItemOut || vit->nseg > 1) {
    const SplitState which = kind == kItemE ? kStateE : kind == kItemM ? kStateM : kStateS;
    const int to = which == kStateS ? slot + 1 : slot, hd = vit->head;
    store_state_t(st.at(which, to, Hv, hd), sT, ncol, t);
    signal_done(st.flag(which, Hv), to, Hv, hd);
  }
  if constexpr (!kOut && !kMap) signal_done_counted(done, vit->p, Hv, vit->head);
}

// gdn_scan_fwd_wgmma_kernel's arguments, in the order the kernel took them (the kernel names them as
// locals).
struct WgScanFwdParams {
  float* h;
  bf16* Dgh;
  bf16* Dgl;
  bf16* o;
  const bf16* Th;
  const bf16* Tl;
  const bf16* qkv;
  const float* rs;
  const float* Gc;
  const float* beta;
  const int* vcu;
  const int* seq_off;
  const int* seq_order;
  const int4* seginfo;
  const int* items;
  int* counts;
  SplitStates st;
  int Hk;
  int Hv;
  int conv_dim;
  int* done;
  const int* prep_done;
  float* scl;
};
// The forward scan. Plain: CTA b runs (segment of rank b / Hv, head b % Hv) from state 0, as the
// scans were tuned (no split). kTickets (a forward with a long sample, split_possible): the CTAs take
// (item, value head) tickets in the plan's order until none are left (gdn_chunk_table_kernel zeroes
// the counter); an item that waits for another's state waits only for one of a smaller ticket, taken
// by a running CTA. The ticket walk costs the chat mix's forward ~5 % (its per-item code in a loop;
// launched beside the plain one, each returning at once where the plan was the other's, 8-10 %), so
// it runs only where a long sample may be split.
template <bool kOut, bool kLoadsFirst = false, bool kTickets = false, bool kF16 = false>
__global__ void __launch_bounds__(256, 1) gdn_scan_fwd_wgmma_kernel(const WgScanFwdParams p) {
  // The arguments under the names the code below uses.
  float* const h = p.h;
  bf16* const Dgh = p.Dgh;
  bf16* const Dgl = p.Dgl;
  bf16* const o = p.o;
  const bf16* const Th = p.Th;
  const bf16* const Tl = p.Tl;
  const bf16* const qkv = p.qkv;
  const float* const rs = p.rs;
  const float* const Gc = p.Gc;
  const float* const beta = p.beta;
  const int* const vcu = p.vcu;
  const int* const seq_off = p.seq_off;
  const int* const seq_order = p.seq_order;
  const int4* const seginfo = p.seginfo;
  const int* const items = p.items;
  int* const counts = p.counts;
  const SplitStates st = p.st;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int conv_dim = p.conv_dim;
  int* const done = p.done;
  const int* const prep_done = p.prep_done;
  float* const scl = p.scl;
  // The backward's recompute (no output): its reverse scan needs none of this kernel's results. The
  // output instances keep the code they were tuned with (the flag cost the forward 3-4 %).
  if constexpr (!kOut) launch_dependents();
  // The plain forward's instance starts beside prep (gdn_forward, prep_done given): the table
  // kernel's results are visible once one prep CTA's flag is (it waited for that grid), each item's
  // chunks once theirs are. Prep's last wave then overlaps the first items. Not the kept instance:
  // there the changed item start cost 7-9 %.
  constexpr bool kBesidePrep = kOut && !kLoadsFirst && !kTickets;
  if constexpr (kBesidePrep) wait_prep_chunks(prep_done, 0, 1, Hk, 0);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if constexpr (!kTickets) {
    if constexpr (kBesidePrep) {
      scan_fwd_item<kOut, kLoadsFirst, kPlain, true>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, h, Dgh,
                                                     Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv, conv_dim, done,
                                                     prep_done);
    } else {
      scan_fwd_item<kOut, kLoadsFirst, kPlain, false, kF16>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, h,
                                                            Dgh, Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv,
                                                            conv_dim, done, nullptr, scl);
    }
  } else {
    WgScanItem& item = scan_item;
    while (take_scan_item(counts, 2, 0, items, vcu, seq_off, seginfo, Hk, Hv)) {
      // The maps form no output and store no h, D: the output-free code.
      if (item.kind == kItemE || item.kind == kItemM) {
        scan_fwd_item<false, false, kSplitMap>(WgScanItem(item), smem_raw, h, Dgh, Dgl, o, Th, Tl, qkv, rs, Gc, beta, st, Hk, Hv,
                                          conv_dim, done);
      } else {
        if (item.kind == kItemOutFromState) split_entering_state(st, item.idx, item.slot, Hv, item.head);
        // (The output items with their loads first: the other order spills here.)
        scan_fwd_item<kOut, true, kSplitOut, false, kF16>(WgScanItem(item), smem_raw, h, Dgh, Dgl, o, Th, Tl, qkv, rs, Gc,
                                                           beta, st, Hk, Hv, conv_dim, done, nullptr, scl);
      }
    }
  }
}

}  // namespace

void scan_fwd_wgmma(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  const bool fuse = c.scan_out != nullptr;
  const size_t bytes = fuse ? scan_fwd_wg_smem<true>() : scan_fwd_wg_smem<false>();
  // The instance: output formed here (fuse), its loads first where the state is kept too; by
  // tickets where the plan may split a long sample (their output items store h, D when given).
  auto kernel = c.split ? (fuse    ? gdn_scan_fwd_wgmma_kernel<true, false, true>
                           : c.f16 ? gdn_scan_fwd_wgmma_kernel<false, false, true, true>
                                   : gdn_scan_fwd_wgmma_kernel<false, false, true>)
                : fuse  ? (c.keep ? gdn_scan_fwd_wgmma_kernel<true, true> : gdn_scan_fwd_wgmma_kernel<true, false>)
                : c.f16 ? gdn_scan_fwd_wgmma_kernel<false, false, false, true>
                        : gdn_scan_fwd_wgmma_kernel<false, false>;
  // By tickets at most one CTA per SM runs (its smem allows one), and there are at most
  // max_segs + 2 slots items per value head; else one CTA per (sample, value head).
  const int64_t most = (static_cast<int64_t>(w.max_segs) + 2 * w.split.slots) * c.Hv;
  const unsigned grid = c.split ? static_cast<unsigned>(std::min<int64_t>(most, sm_count())) : scan_grid(c.a, c.V);
  const WgScanFwdParams p{c.keep ? w.h : nullptr,
                          c.keep ? w.Dh : nullptr,
                          c.keep ? w.Dl : nullptr,
                          c.scan_out,
                          w.Th,
                          w.Tl,
                          c.qkv,
                          w.rs,
                          w.Gc,
                          c.beta,
                          w.vcu,
                          w.seq_off,
                          w.seq_order,
                          w.seginfo,
                          w.items,
                          w.counts,
                          SplitStates{w.split},
                          c.Hk,
                          c.Hv,
                          c.conv_dim,
                          c.done_fwd,
                          c.prep_beside ? w.prep_done : nullptr,
                          c.f16 ? w.scl : nullptr};
  launch_smem_beside(c.prep_beside, kernel, "gdn_scan_fwd_wgmma_kernel", dim3(grid), 256, bytes, stream, p);
}

}  // namespace qt::cuda::gdn
