// Host-callable entry points of the CUDA Gated DeltaNet kernels (gdn/*.cu; semantics of
// Backend::gdn_forward / gdn_backward: the gated delta rule of Qwen3.5's linear-attention layers,
// docs/gdn_kernels.md). Plain pointers and dims; every pointer is device memory; bf16 tensors are
// __nv_bfloat16 passed as void*, so this header needs no CUDA headers beyond cudaStream_t. The
// functions validate nothing (CudaBackend's entry points do) and never allocate: scratch comes from
// the caller's workspace (query its size first).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/gdn_keep.h"

namespace qt::cuda {

struct GdnArgs {
  const int32_t* cu_seqlens;  // [num_seqs + 1] on the device
  int num_seqs;
  int max_seqlen;
  int total_tokens;           // T
  int num_k_heads, num_v_heads, k_head_dim, v_head_dim;  // Hk, Hv, dk, dv (dk, dv multiples of 16, <= 128)
  // The intra-sample split: the forward and reverse scans may split a long sample across CTAs where
  // the plan on the device finds it faster (dk = dv = 128 only). Off: every sample runs on one CTA
  // per head, the plain scans' code; for tests and benchmarks (the same args must reach the forward
  // that keeps a state and the backward that reads it).
  bool split = true;
  // dk = dv = 128 on the mma.sync kernels (the family every other head dim runs) instead of the
  // wgmma ones, so that a test or benchmark can compare both families on one shape.
  bool mma_sync = false;
};
// Scratch for forward and backward (chunk states etc.), bytes.
size_t gdn_workspace_bytes(const GdnArgs& a);
// The part of it the forward can leave for the backward, by what it keeps (ops/gdn_keep.h):
// GdnKeep::States the chunk table, gates, T = (I + A)^-1, D, chunk states, L2 row scales of q/k (W
// too where the mma.sync scans read it); GdnKeep::Prep the chunk table, gates, T and the row scales (0 where
// the mma.sync scans run, dk or dv != 128 or mma_sync: they need prep's W and U as well, so there the
// backward recomputes prep). The caller's `state` buffer, when given, takes that part.
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
// these head dims (dk = dv = 128, on the wgmma kernels): that backward from prep's results is then as
// fast as the one reading kept chunk states.
bool gdn_backward_fp16(int k_head_dim, int v_head_dim);
// The segments the last gdn_forward (or recomputing gdn_backward) planned in `workspace`, or in
// `state` where it kept one: num_seqs, or more where it split long samples across scan CTAs (the
// intra-sample split, gdn/plan.cu). Synchronizes; for tests and benchmarks.
int gdn_planned_segments(const GdnArgs& a, const void* workspace, const void* state = nullptr,
                         GdnKeep keep = GdnKeep::States);

}  // namespace qt::cuda
