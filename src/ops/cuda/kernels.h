// Host-callable launchers of the CUDA kernels for the two token mixers, shared between the
// kernel files (gdn.cu, attention.cu) and CudaBackend. Plain pointers and dims; every pointer is
// device memory; bf16 tensors are __nv_bfloat16 passed as void* so this header needs no CUDA
// headers beyond cudaStream_t. Launchers validate nothing (CudaBackend's entry points do) and
// never allocate: scratch comes from the caller's workspace (query its size first).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/gdn_keep.h"

namespace qt::cuda {

// ---- Gated DeltaNet (docs/model_spec.md 3.5 / 4, docs/gdn_kernels.md; as Backend::gdn_forward/backward) ----
struct GdnArgs {
  const int32_t* cu_seqlens;  // [num_seqs + 1] on the device
  int num_seqs;
  int max_seqlen;
  int total_tokens;           // T
  int num_k_heads, num_v_heads, k_head_dim, v_head_dim;  // Hk, Hv, dk, dv (dk, dv multiples of 16, <= 128)
};
// Scratch for forward and backward (chunk states etc.), bytes.
size_t gdn_workspace_bytes(const GdnArgs& a);
// The part of it the forward can leave for the backward, by what it keeps (ops/gdn_keep.h):
// GdnKeep::States the chunk table, gates, T = (I + A)^-1, D, chunk states, L2 row scales of q/k (W
// too where the mma.sync scans read it); GdnKeep::Prep the chunk table, gates, T and the row scales (0 where
// the mma.sync scans run, dk or dv != 128: they need prep's W and U as well, so there the backward
// recomputes prep). The caller's `state` buffer, when given, takes that part.
size_t gdn_state_bytes(const GdnArgs& a, GdnKeep keep = GdnKeep::States);
// o [T, Hv, dv] bf16; qkv [T, 2*Hk*dk + Hv*dv] bf16 (q | k | v, raw: L2 norm and dk^-1/2 inside);
// g, beta f32 [T, Hv]. With `state` (gdn_state_bytes(a, keep)), what `keep` names is kept there,
// computed at the backward's precision. Keeping Prep costs the forward nothing (prep's results are
// written either way); keeping States adds the chunk states' stores.
void gdn_forward(void* o, const void* qkv, const float* g, const float* beta, const GdnArgs& a, void* workspace,
                 cudaStream_t stream, void* state = nullptr, GdnKeep keep = GdnKeep::States);
// dqkv [T, conv_dim] bf16, dg, dbeta f32 [T, Hv] (all overwritten); d_o [T, Hv, dv] bf16.
// Recomputes the forward state from the inputs, or with `state` reads what gdn_forward kept there
// (with the same `keep`) for these same inputs and args, recomputing the rest.
void gdn_backward(void* dqkv, float* dg, float* dbeta, const void* d_o, const void* qkv, const float* g,
                  const float* beta, const GdnArgs& a, void* workspace, cudaStream_t stream,
                  const void* state = nullptr, GdnKeep keep = GdnKeep::States);
// The shortest max_seqlen with which gdn_forward / gdn_backward may split a sample (the plan on the
// device then decides): below it they run the unsplit kernels. INT_MAX where they never split.
int gdn_split_min_seqlen(const GdnArgs& a);
// Whether gdn_backward, where it recomputes the chunk states (no kept States), runs its fp16 form at
// these head dims (dk = dv = 128, unless an A/B knob such as QT_GDN_HILO=1 picks other kernels): that
// backward from prep's results is then as fast as the one reading kept chunk states.
bool gdn_backward_fp16(int k_head_dim, int v_head_dim);
// The segments the last gdn_forward (or recomputing gdn_backward) planned in `workspace`, or in
// `state` where it kept one: num_seqs, or more where it split long samples across scan CTAs (the
// intra-sample split, gdn.cu). Synchronizes; for tests and benchmarks.
int gdn_planned_segments(const GdnArgs& a, const void* workspace, const void* state = nullptr,
                         GdnKeep keep = GdnKeep::States);

// ---- causal varlen attention with GQA (semantics of Backend::attention_forward/backward) ----
struct AttnArgs {
  const int32_t* cu_seqlens;  // [num_seqs + 1] on the device
  int num_seqs;
  int max_seqlen;
  int total_tokens;
  int num_q_heads, num_kv_heads, head_dim;  // head_dim 64, 128 or 256
  float scale;                              // 1/sqrt(head_dim)
  // Backward: dQ summed over the key tiles in a fixed order by its own kernel (bitwise
  // reproducible, ~1.4x the backward's MMA work) instead of fp32 atomics. At head dim 256 on the
  // wgmma kernels (mma_sync off) dQ always comes from its own kernel, which is faster there.
  bool deterministic = false;
  // Head dim 256 on the mma.sync kernels instead of the wgmma ones (the forward, and the
  // deterministic backward's dK / dV and dQ), for A/B benchmarks and as the fallback
  // QT_ATTN_WGMMA=0 selects; other head dims, and the atomic backward, always run on mma.sync.
  bool mma_sync = false;
  // Head dim 256's forward, dK / dV and dQ kernels on cp.async loads by every thread instead of
  // the warp-specialized TMA kernels (the default; QT_ATTN_TMA=0 selects them too), for tests and
  // A/B runs, and the path taken when the driver has no cuTensorMapEncodeTiled.
  bool cp_async = false;
};
size_t attention_workspace_bytes(const AttnArgs& a);
// o, q [T, Hq, D] bf16; k, v [T, Hkv, D] bf16; lse f32 [Hq, T].
void attention_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                       void* workspace, cudaStream_t stream);
// dq [T, Hq, D], dk, dv [T, Hkv, D] bf16 (overwritten).
void attention_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                        const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream);

// ---- Hopper wgmma conventions check (wgmma_check.cu, wgmma.cuh) ----
// c [64, n] f32 = a [64, k] (bf16, row-major) times b, given as [n, k] (b_k_major) or [k, n], bf16
// row-major; n 64, 128 or 256, k a multiple of 64 up to 256; one warpgroup, b in 128-byte-swizzled shared
// memory, a there too (K-major, or M-major: wgmma's transposed A) or in registers. Pins the
// descriptor / fragment layouts of wgmma.cuh (tests/test_cuda_wgmma.cpp).
enum WgmmaA : int { kWgmmaASmemKMajor = 0, kWgmmaASmemMMajor = 1, kWgmmaARegisters = 2 };
void wgmma_gemm_check(float* c, const void* a, const void* b, int n, int k, bool b_k_major, WgmmaA a_form,
                      cudaStream_t stream);

}  // namespace qt::cuda
