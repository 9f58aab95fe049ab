// The reverse state scan on wgmma (dk = dv = 128): one CTA of two warpgroups per (segment, value
// head), or CTAs taking the split plan's reverse items by ticket; forms dD_local = P^T dO itself.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_wgmma.cuh"

namespace qt::cuda::gdn {
namespace {

// The forward wgmma scan's structure in reverse: warpgroup wg keeps dS^T (its 64 state columns n,
// transposed) in its m64n128 accumulator. Per chunk, last to first:
//   dD^T = dD_local^T + (dS^T k^T) diag(ks)  A = dS^T split from the registers, B = raw k (K-major):
//                                            2 x 8 m64n64k16; the column scales ks after a wait;
//   dS^T = e^{G_L} dS^T + (diag(eq) dO)^T q - dD^T W,  with W^T dD = k^T diag(kbs) T^T dD:
//                                            A = (eq dO)^T (ldmatrix.trans of the raw dO rows, scaled
//                                            and split in registers) with B = raw q (N-major): 2 x 4
//                                            m64n128k16; Z^T = -dD^T T (A = -dD^T split from the
//                                            accumulator, B = T's planes, N-major: 3 x 4 m64n64k16),
//                                            then A = Z^T diag(kbs) with B = raw k: 2 x 4 m64n128k16.
// ks_i = e^{G_L - G_i} rs_k(i), eq_i = e^{G_i} rs_q(i), kbs_i = b_i e^{G_i} rs_k(i). k, q, T, dO
// (128-byte-swizzled panels) of chunk c - 1 load during chunk c (two buffers), one barrier per chunk.
// dD_local^T = dO^T P is formed here (P = q k^T gated, by each warpgroup for itself: 8 m64n64k16
// issued ahead of the dS^T k^T product, then split into hi / lo planes in the warpgroup's smem;
// A = dO^T M-major: 2 x 4 m64n64k16), so there is no dlocal kernel and no dD_local round trip.
// 165 KB of smem.
constexpr uint32_t kScanBwdBuf = 4 * kDlTile;  // raw k, raw q, T hi + lo, dO
constexpr size_t scan_bwd_wg_smem() {
  return 2 * kScanBwdBuf + 2 * kDlPanel + (2 * kWgRows + 48) * sizeof(float) + 1024;
}

// The reverse scan's split (the forward's transposed): the gradient
// entering a segment is M_s^T (the gradient leaving it) + F_s. Items (gdn_chunk_table_kernel):
//   kRevOut: a sample's last segment from 0 (every unsplit sample is one); a split sample's stores
//            its entering gradient G_{k-1};
//   kRevF: a middle segment's F_s (from 0, no dh, dD stores), stored;
//   kRevOutFromGrad: an earlier segment s from G_{s+1}, which the item forms first where s + 1 is a
//            middle segment (G_{s+1} = M_{s+1}^T G_{s+2} + F_{s+1}, M from the forward's maps) and
//            publishes for segment s - 1.
// S_out = M^T G + F (D x D, fragment-native), all 256 threads.
__device__ void combine_state_t(float* S_out, const float* M, const float* G, const float* F) {
  constexpr int D = kDlD;
  auto mt = [M](int i, int k) { return M[gdn_mma::frag_index(k, i, D)]; };  // M^T(i, k)
  gdn_mma::for_tiles<4>(
      D, D, [&](float (&acc)[4][4], int m0, int n0) { mma_acc<4>(acc, m0, n0, 0, D, mt, NtT{G, D}); },
      Pair{[&](int i, int j, float v0, float v1) {
        const int o = gdn_mma::frag_index(i, j, D);
        const float2 f = ld_f2(F + o);
        *reinterpret_cast<float2*>(S_out + o) = make_float2(v0 + f.x, v1 + f.y);
      }});
}
// The gradient leaving segment s (index idx of nseg) of a kRevOutFromGrad item, G_{s+1}, at slot + 1
// on return (all threads).
__device__ void split_leaving_gradient(const SplitStates& st, int idx, int nseg, int slot, int Hv, int head) {
  if (idx + 1 == nseg - 1) {  // the last segment's entering gradient
    wait_done(st.flag(kStateG, Hv), slot + 1, Hv, head);
    return;
  }
  wait_done(st.flag(kStateG, Hv), slot + 2, Hv, head);
  wait_done(st.flag(kStateF, Hv), slot + 1, Hv, head);
  wait_done(st.flag(kStateM, Hv), slot + 1, Hv, head);
  combine_state_t(st.at(kStateG, slot + 1, Hv, head), st.at(kStateM, slot + 1, Hv, head),
                  st.at(kStateG, slot + 2, Hv, head), st.at(kStateF, slot + 1, Hv, head));
  signal_done(st.flag(kStateG, Hv), slot + 1, Hv, head);  // its barrier makes G visible to this CTA too
}

// Each product batch is issued by warpgroup 0 before warpgroup 1's (wg::issue_after_wg0).
// kMode: kPlain (no split: the code as tuned) or kSplitOut (every split item, kRevF with its dh, dD
// stores off). The split items read their kind and slot again from smem (scan_item) after the chunk
// loop.
template <int kMode, bool kF16 = false>
__device__ __forceinline__ void scan_bwd_item(const WgScanItem& cta, unsigned char* smem_raw, float* dh, bf16* dDgh,
                                              bf16* dDgl, const bf16* Th, const bf16* Tl,
                                              const bf16* qkv, const float* rs, const float* Gc, const float* beta,
                                              const bf16* d_o, const SplitStates& st, int Hk, int Hv, int conv_dim,
                                              int* done, float* scl = nullptr) {
  constexpr uint32_t kTq = kDlTile, kTt = 2 * kDlTile, kTo = 3 * kDlTile;
  constexpr int D = kDlD;
  const bool stores = kMode == kPlain || cta.kind != kRevF;  // a split F item stores only its result
  // A sample's last segment leaves with gradient 0: its last dh is not stored (rtable's kRtLast).
  const bool zero_last = cta.kind == kRevOut;
  constexpr bool kDhUnderBatch = kMode == kPlain;    // where dh[chunk] is stored (below)
  const int head = cta.head, kh = cta.kh, bos = cta.bos, len = cta.len, n = cta.n, first = cta.first;
  char* tiles = align1024(smem_raw);  // panels 1024-aligned
  float* rows = reinterpret_cast<float*>(tiles + 2 * kScanBwdBuf + 2 * kDlPanel);  // [parity][kWgRows]
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  char* pplanes = tiles + 2 * kScanBwdBuf;  // P hi, lo [i][j] (wg_p_planes)
  const int ncol = 64 * wgi + 16 * w + g;  // this thread's state columns: ncol, ncol + 8
  const size_t w_ld = static_cast<size_t>(Hv) * D, x_ld = static_cast<size_t>(conv_dim);
  const bf16* qraw = qkv + static_cast<size_t>(kh) * D;
  const bf16* kraw = qkv + static_cast<size_t>(Hk + kh) * D;
  auto load_chunk = [&](int ci, int b) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC);
    char* dst = tiles + b * kScanBwdBuf;
    const size_t wo = (static_cast<size_t>(c0) * Hv + head) * D;
    const size_t tb = (static_cast<size_t>(first + ci) * Hv + head) * kC * kC;
    async_panels<256>(dst, kraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
    async_panels<256>(dst + kTq, qraw + static_cast<size_t>(c0) * x_ld, x_ld, L);
    async_panels<256, kC>(dst + kTt, Th + tb, kC, kC);  // every row: T's padded rows are identity rows
    async_panels<256, kC>(dst + kTt + kDlPanel, Tl + tb, kC, kC);
    async_panels<256>(dst + kTo, d_o + wo, w_ld, L);
  };
  // The next chunk in reverse order (every chunk but a sample's last is full).
  WgGates nx;
  auto next_gates = [&](int ci) {
    nx.load(Gc, rs, beta, bos + ci * kC, min(kC, len - ci * kC), Hk, Hv, head, kh);
  };
  if (n > 0) {
    load_chunk(n - 1, (n - 1) & 1);
    next_gates(n - 1);
  }
  cp_async_commit();
  // dS^T: rows ncol (regs 4 j + 0, 1) and ncol + 8 (4 j + 2, 3), columns d = 8 j + 2 t (+1).
  float sT[2 * D / 4];
  if (kMode == kSplitOut && cta.kind == kRevOutFromGrad) {
    load_state_t(sT, st.at(kStateG, cta.slot + 1, Hv, head), ncol, t);  // split_leaving_gradient made it
  } else {
#pragma unroll
    for (int r = 0; r < 2 * D / 4; ++r) sT[r] = 0.f;
  }
  // kF16: dD of the last step's chunk (the next one), stored at this step's top once the top barrier
  // has published its scale, from the update's -dD^T fragments (hi + lo: 16 bits, rounded once more
  // to fp16's 11), and this thread's largest |dD| of it.
  // kDdNow (the ticket instance, where holding them spilled 60 bytes): dD stored as it is formed, its
  // scale from a mid-step CTA max reduction (named barrier 6).
  constexpr bool kDdNow = kF16 && kMode != kPlain;
  const size_t dcol = static_cast<size_t>(head) * D;
  uint32_t ph[kC / 16][4], pl[kC / 16][4];  // the update's -dD^T fragments (every instance's)
  auto store_dd = [&](int c0, int L, float s) {
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      float x[4];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t hi = ph[j >> 1][hh + 2 * (j & 1)], lo = pl[j >> 1][hh + 2 * (j & 1)];
        x[2 * hh] = -(__uint_as_float(hi << 16) + __uint_as_float(lo << 16));
        x[2 * hh + 1] = -(__uint_as_float(hi & 0xffff0000u) + __uint_as_float(lo & 0xffff0000u));
      }
      store_planes_pair_t<true>(dDgh + static_cast<size_t>(c0) * w_ld + dcol, nullptr, w_ld, L, 8 * j, 64 * wgi + 16 * w,
                                x, g, t, s);
    }
  };
  float m_dd = 0.f;
  float* red = rows + 2 * kWgRows;  // kF16: [parity][dh, dD, dO][8]
  for (int ci = n - 1; ci >= 0; --ci) {
    const int c0 = bos + ci * kC, L = min(kC, len - ci * kC), buf = ci & 1;
    const size_t chunk = static_cast<size_t>(first + ci);
    const float gl = nx.gl;
    const float* ksc = rows + buf * kWgRows;  // two copies: the other warpgroup may still read the last chunk's
    const float* eqc = ksc + kC;
    wg_store_rows(rows + buf * kWgRows, L, gl, nx.gi, nx.r, nx.b, nx.b);
    if (ci > 0) next_gates(ci - 1);
    cp_async_wait<0>();  // k, q, T, dO of this chunk
    wg::fence_proxy_async();
    if constexpr (kF16) {  // dh's maximum, this chunk's dO's, the last step's dD's
      float m = 0.f;
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) m = fmaxf(m, fabsf(sT[r]));
      publish_max(m, red + 24 * buf);
      if (!kDdNow) publish_max(m_dd, red + 24 * buf + 8);
      publish_max(own_panels_absmax<256>(tiles + buf * kScanBwdBuf + kTo), red + 24 * buf + 16);
    }
    __syncthreads();  // tiles and row scales visible; both warpgroups are done with the other buffer
    if (ci > 0) load_chunk(ci - 1, buf ^ 1);
    cp_async_commit();
    const char* cur = tiles + buf * kScanBwdBuf;

    // dh[chunk] = dL/d(state leaving the chunk) (fragment-native K x V, 16-byte stores). The plain
    // instance stores it under the first batch (below); the ticket instance lost 2-4 % on split rows
    // there.
    float s_dh = 1.f;  // kF16: dh's tile scale
    if constexpr (kF16) {  // (a split F item stores nothing: the same chunks' Out item does)
      s_dh = published_scale(red + 24 * buf);
      if (tid == 0 && stores) {
        scl[(chunk * Hv + head) * kSclFloats + kSclDh] = s_dh;
        scl[(chunk * Hv + head) * kSclFloats + kSclDo] = published_scale(red + 24 * buf + 16);
      }
      if (!kDdNow && ci + 1 < n) {
        const float s_dd = published_scale(red + 24 * buf + 8);
        if (stores) {
          if (tid == 0) scl[((chunk + 1) * Hv + head) * kSclFloats + kSclDd] = s_dd;
          store_dd(c0 + kC, min(kC, len - (ci + 1) * kC), s_dd);
        }
      }
    }
    auto store_dh = [&] {
      if constexpr (kF16)
        store_state_t<true>(reinterpret_cast<__half*>(dh) + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t,
                            s_dh);
      else
        store_state_t<true>(dh + (chunk * Hv + head) * static_cast<size_t>(D) * D, sT, ncol, t);
    };
    const bool dh_stored = stores && (ci < n - 1 || !zero_last);
    if (dh_stored && !kDhUnderBatch) store_dh();
    // P's planes (the N-major B of dO^T P) before the dS^T fragments exist. (With them and the dS^T
    // k^T product in flight during P's epilogue, ptxas ran out of registers and waited for the
    // product anyway: 0.36 instead of 0.30 ms at 4B.)
    wg_p_planes(pplanes, cur + kTq, cur, ksc + 2 * kC, ksc + 3 * kC, ksc + 4 * kC, wgi);

    // acc = dS^T k^T (k exact: 2 products per k step).
    float acc[kC / 2];
    {
      uint32_t ah[D / 16][4], al[D / 16][4];
      state_frags_t(sT, ah, al);
      const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur, 16, 1024));
      wg::issue_after_wg0(wgi, 1);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * kDlPanel + (kk % 4) * 32;
        wg::mma_m64n64k16_rs<0>(acc, ah[kk], wg::desc_advance(k0, off), kk > 0);
        wg::mma_m64n64k16_rs<0>(acc, al[kk], wg::desc_advance(k0, off), 1);
      }
      wg::commit();
      wg::issued_by_wg0(wgi, 1);
      // dh[chunk] under the batch: the warps' wait for the 16 stores to drain (their address and
      // source registers), a quarter of the scan's stall samples at the chunk's top, overlaps the
      // tensor work here (reverse scan 27B -3 %; the forward scans' h stores lost there).
      if (dh_stored && kDhUnderBatch) store_dh();
      wg::wait<0>();
    }
    wg::fence_operands(acc);
    // acc = (dS^T k^T) diag(ks) + dO^T P: A = dO^T (the warpgroup's dO panel, M-major), P exact in dO.
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      const float2 kv = ld_f2(ksc + 8 * j + 2 * t);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        acc[4 * j + 2 * hh] *= kv.x;
        acc[4 * j + 2 * hh + 1] *= kv.y;
      }
    }
    const uint64_t o0 = wg::desc_opaque(wg::desc_sw128(cur + kTo + wgi * kDlPanel, kDlPanel, 1024));
    const uint64_t p0 = wg::desc_opaque(wg::desc_sw128(pplanes, kDlPanel, 1024));
    wg::issue_after_wg0(wgi, 2);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      wg::mma_m64n64k16<1, 1>(acc, wg::desc_advance(o0, kk * 2048), wg::desc_advance(p0, kk * 2048), 1);
      wg::mma_m64n64k16<1, 1>(acc, wg::desc_advance(o0, kk * 2048), wg::desc_advance(p0, kDlPanel + kk * 2048), 1);
    }
    wg::commit();
    wg::issued_by_wg0(wgi, 2);
    wg::wait<0>();
    wg::fence_operands(acc);

    // dD = dD_local + diag(ks) k dS out as planes (8 x 8 blocks of dD^T transposed by movmatrix, as in
    // the forward scan), and -dD^T as the update's A fragments.
    const size_t dbase = static_cast<size_t>(c0) * w_ld + static_cast<size_t>(head) * D;
    float s_dd_now = 1.f;  // kDdNow: this chunk's dD scale
    if constexpr (kF16) {  // dD is acc
      m_dd = 0.f;
#pragma unroll
      for (int r = 0; r < kC / 2; ++r) m_dd = fmaxf(m_dd, fabsf(acc[r]));
      if constexpr (kDdNow) {
        if (stores) {  // CTA-uniform
          publish_max(m_dd, red + 24 * buf + 8);  // the slot the top leaves free in this form
          wg::named_sync(6, 256);
          s_dd_now = published_scale(red + 24 * buf + 8);
          if (tid == 0) scl[(chunk * Hv + head) * kSclFloats + kSclDd] = s_dd_now;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) {
      float x[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) x[q] = acc[4 * j + q];
      if (stores && !kF16) store_planes_pair_t(dDgh + dbase, dDgl + dbase, w_ld, L, 8 * j, 64 * wgi + 16 * w, x, g, t);
      if (stores && kDdNow) store_planes_pair_t<true>(dDgh + dbase, nullptr, w_ld, L, 8 * j, 64 * wgi + 16 * w, x, g, t, s_dd_now);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        gdn_mma::split_bf16(-x[2 * hh], -x[2 * hh + 1], ph[j >> 1][hh + 2 * (j & 1)], pl[j >> 1][hh + 2 * (j & 1)]);
    }
    // The update below is not run in a plain scan's last step (the sample's first chunk): the gradient
    // entering the sample is never read there.
    if (kMode != kPlain || ci > 0) {
      // (diag(eq) dO)^T fragments: the raw dO rows by ldmatrix.trans from the warpgroup's swizzled panel
      // (lane l addresses row 16 kk + 8 (l / 16) + l % 8, 8-column chunk 2 w + (l / 8) % 2), scaled by eq_i.
      uint32_t oh[kC / 16][4], ol[kC / 16][4];
      {
        const char* dO = cur + kTo + wgi * kDlPanel;
        const int lq = lane >> 3, rr = lane & 7;
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          uint32_t r[4];
          const int row = 16 * kk + (lq >> 1) * 8 + rr, chunk16 = 2 * w + (lq & 1);
          gdn_mma::ldmatrix_x4<true>(r, reinterpret_cast<const bf16*>(dO + row * 128 + ((chunk16 ^ (row & 7)) << 4)));
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 e = ld_f2(eqc + 16 * kk + 8 * (q >> 1) + 2 * t);
            gdn_mma::split_bf16(__uint_as_float(r[q] << 16) * e.x, __uint_as_float(r[q] & 0xffff0000u) * e.y, oh[kk][q],
                                ol[kk][q]);
          }
        }
      }

      // dS^T = e^{G_L} dS^T + (eq dO)^T q (B = raw q, N-major), with Z^T = -dD^T T (B = T's planes,
      // N-major) in the same batch; then dS^T += Z^T diag(kbs) k (B = raw k, N-major).
      const float egl = expf(gl);
#pragma unroll
      for (int r = 0; r < 2 * D / 4; ++r) sT[r] *= egl;
      float zT[kC / 2];
      {
        const uint64_t q0 = wg::desc_opaque(wg::desc_sw128(cur + kTq, kDlPanel, 1024));
        const uint64_t th0 = wg::desc_opaque(wg::desc_sw128(cur + kTt, kDlPanel, 1024));
        const uint64_t tl0 = wg::desc_opaque(wg::desc_sw128(cur + kTt + kDlPanel, kDlPanel, 1024));
        wg::issue_after_wg0(wgi, 3);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          const uint32_t off = kk * 2048;
          wg::mma_m64n64k16_rs<1>(zT, ph[kk], wg::desc_advance(th0, off), kk > 0);
          wg::mma_m64n64k16_rs<1>(zT, pl[kk], wg::desc_advance(th0, off), 1);
          wg::mma_m64n64k16_rs<1>(zT, ph[kk], wg::desc_advance(tl0, off), 1);
          wg::mma_m64n128k16_rs<1>(sT, oh[kk], wg::desc_advance(q0, off), 1);
          wg::mma_m64n128k16_rs<1>(sT, ol[kk], wg::desc_advance(q0, off), 1);
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 3);
        wg::wait<0>();
      }
      wg::fence_operands(zT);
      {
        uint32_t zh[kC / 16][4], zl[kC / 16][4];
#pragma unroll
        for (int j = 0; j < kC / 8; ++j) {
          const float2 kv = ld_f2(ksc + 6 * kC + 8 * j + 2 * t);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            gdn_mma::split_bf16(kv.x * zT[4 * j + 2 * hh], kv.y * zT[4 * j + 2 * hh + 1], zh[j >> 1][hh + 2 * (j & 1)],
                                zl[j >> 1][hh + 2 * (j & 1)]);
        }
        const uint64_t k0 = wg::desc_opaque(wg::desc_sw128(cur, kDlPanel, 1024));
        wg::issue_after_wg0(wgi, 4);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          wg::mma_m64n128k16_rs<1>(sT, zh[kk], wg::desc_advance(k0, kk * 2048), 1);
          wg::mma_m64n128k16_rs<1>(sT, zl[kk], wg::desc_advance(k0, kk * 2048), 1);
        }
        wg::commit();
        wg::issued_by_wg0(wgi, 4);
        wg::wait<0>();
      }
      wg::fence_operands(sT);
    }
  }
  cp_async_wait<0>();
  if constexpr (kF16) {  // the segment's first chunk's dD
    if (!kDdNow && n > 0 && stores) {
      publish_max(m_dd, red + 24 + 8);  // parity 1: read last before step 0's top barrier
      __syncthreads();
      const float s_dd = published_scale(red + 24 + 8);
      if (tid == 0) scl[(static_cast<size_t>(first) * Hv + head) * kSclFloats + kSclDd] = s_dd;
      store_dd(bos, min(kC, len), s_dd);
    }
  }
  if constexpr (kMode == kPlain) {
    signal_done_counted(done, cta.p, Hv, head);
    return;
  }
  // The entering gradient where the split needs it: F_s, or a split sample's G_{k-1}.
  const volatile WgScanItem* vit = &scan_item;
  const int kind = vit->kind, slot = vit->slot, hd = vit->head;
  if (kind == kRevF || vit->nseg > 1) {
    const SplitState which = kind == kRevF ? kStateF : kStateG;
    store_state_t(st.at(which, slot, Hv, hd), sT, ncol, t);
    signal_done(st.flag(which, Hv), slot, Hv, hd);
  }
  if (kind != kRevF) signal_done_counted(done, vit->p, Hv, hd);
}

// gdn_scan_bwd_wgmma_kernel's arguments, in the order the kernel took them (the kernel names them as
// locals).
struct WgScanBwdParams {
  float* dh;
  bf16* dDgh;
  bf16* dDgl;
  const bf16* Th;
  const bf16* Tl;
  const bf16* qkv;
  const float* rs;
  const float* Gc;
  const float* beta;
  const bf16* d_o;
  const int* vcu;
  const int* seq_off;
  const int* seq_order;
  const int4* seginfo;
  const int* items_rev;
  int* counts;
  SplitStates st;
  int Hk;
  int Hv;
  int conv_dim;
  int* done;
  float* scl;
};
// The reverse scan. Plain: CTA b runs (segment of rank b / Hv, head b % Hv), as tuned. kTickets
// (a backward whose recomputed forward may split): the CTAs take (item, value head) tickets in the
// plan's order (items_rev, counts[4] of them, counter counts[3]), as the forward's ticket instance.
// bwd_chunk may be launched beside this grid once every CTA of it is running; it waits for each
// (segment, head)'s `done` flag before reading its dh, dD.
template <bool kTickets = false, bool kF16 = false>
__global__ void __launch_bounds__(256, 1) gdn_scan_bwd_wgmma_kernel(const WgScanBwdParams p) {
  // The arguments under the names the code below uses.
  float* const dh = p.dh;
  bf16* const dDgh = p.dDgh;
  bf16* const dDgl = p.dDgl;
  const bf16* const Th = p.Th;
  const bf16* const Tl = p.Tl;
  const bf16* const qkv = p.qkv;
  const float* const rs = p.rs;
  const float* const Gc = p.Gc;
  const float* const beta = p.beta;
  const bf16* const d_o = p.d_o;
  const int* const vcu = p.vcu;
  const int* const seq_off = p.seq_off;
  const int* const seq_order = p.seq_order;
  const int4* const seginfo = p.seginfo;
  const int* const items_rev = p.items_rev;
  int* const counts = p.counts;
  const SplitStates st = p.st;
  const int Hk = p.Hk;
  const int Hv = p.Hv;
  const int conv_dim = p.conv_dim;
  int* const done = p.done;
  float* const scl = p.scl;
  launch_dependents();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  if constexpr (!kTickets) {
    scan_bwd_item<kPlain, kF16>(wg_scan_cta(seq_order, vcu, seq_off, Hk, Hv), smem_raw, dh, dDgh, dDgl, Th, Tl, qkv, rs,
                                Gc, beta, d_o, st, Hk, Hv, conv_dim, done, scl);
  } else {
    WgScanItem& item = scan_item;
    while (take_scan_item(counts, 3, 4, items_rev, vcu, seq_off, seginfo, Hk, Hv)) {
      if (item.kind == kRevOutFromGrad) split_leaving_gradient(st, item.idx, item.nseg, item.slot, Hv, item.head);
      // F items run the same code with their dh, dD stores off (one copy of the chunk loop: with a
      // second, output-free copy for them the kernel spilled).
      scan_bwd_item<kSplitOut, kF16>(WgScanItem(item), smem_raw, dh, dDgh, dDgl, Th, Tl, qkv, rs, Gc, beta, d_o, st, Hk,
                                     Hv, conv_dim, done, scl);
    }
  }
}

}  // namespace

void scan_bwd_wgmma(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  auto kernel = c.split ? (c.f16 ? gdn_scan_bwd_wgmma_kernel<true, true> : gdn_scan_bwd_wgmma_kernel<true>)
                : c.f16 ? gdn_scan_bwd_wgmma_kernel<false, true>
                        : gdn_scan_bwd_wgmma_kernel<>;
  // By tickets at most one CTA per SM runs, and there are at most max_segs items per value head.
  const unsigned grid =
      c.split ? static_cast<unsigned>(std::min<int64_t>(static_cast<int64_t>(w.max_segs) * c.Hv, sm_count()))
              : scan_grid(c.a, c.V);
  const WgScanBwdParams p{w.dh,      w.dDh,       w.dDl,      w.Th,      w.Tl,     c.qkv,    w.rs,
                          w.Gc,      c.beta,      c.d_o,      w.vcu,     w.seq_off, w.seq_order, w.seginfo,
                          w.items_rev, w.counts,  SplitStates{w.split}, c.Hk, c.Hv, c.conv_dim, c.done_rev,
                          w.scl};
  launch_smem_beside(c.rev_beside, kernel, "gdn_scan_bwd_wgmma_kernel", dim3(grid), 256, scan_bwd_wg_smem(), stream,
                     p);
}

}  // namespace qt::cuda::gdn
