// The stages of a Gated DeltaNet call and what they share (internal to gdn/*.cu and bench_gdn): the
// workspace's buffers and the call's decisions, planned once by plan_forward / plan_backward
// (gdn.cu). gdn_forward and gdn_backward run the stages in order; bench_gdn times them one by one.
// Each stage picks its kernel instances from the call and returns whether it launched anything.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "ops/cuda/gdn/gdn.h"

namespace qt::cuda::gdn {

using bf16 = __nv_bfloat16;

constexpr int kWgmmaDim = 128;  // dk = dv of the wgmma kernels (Qwen3.5's)

// The split's states per slot: S entering the segment, its map's M and E; the reverse scan's G (the
// gradient entering the segment) and F (that from a zero leaving gradient) (SplitStates).
enum SplitState : int { kStateS = 0, kStateM = 1, kStateE = 2, kStateG = 3, kStateF = 4, kSplitStateCount = 5 };
// The fp16 form's tile scales [chunk][head][kSclFloats]: h, D (the recompute's), dh, dD, dO (the reverse
// scan's), v (the recompute's); bwd_chunk's copy adds dT's (its own). T is converted unscaled (its
// entries are O(1): the diagonal is 1, the rest products of gates <= 1 and beta < 1).
enum : int { kSclH = 0, kSclD, kSclDh, kSclDd, kSclDo, kSclV, kSclDt = 7, kSclFloats = 8 };

// The split's state buffers (the chunk table kernel's plan): per slot and value head a D x D fp32
// matrix, fragment-native [d][n]: S entering the slot's segment, its map's M and E, and the reverse
// scan's G and F; flags [SplitState][slots][Hv] set when each is stored.
struct SplitBuffers {
  float *S, *M, *E, *G, *F;
  int* flags;
  int slots;
};

struct Workspace {
  int4* table;
  int4* rtable;  // the table shortest sample first (.w: chunk index), bwd_chunk's item order
  int* nchunks;
  int* seq_off;
  int* seq_order;  // segments longest first (the scans' CTA order)
  int* vcu;        // segment boundaries (rows): without a split, cu_seqlens
  int4* seginfo;
  int *items, *items_rev, *counts;
  SplitBuffers split;
  int max_segs;    // num_seqs + split.slots
  // dD: U (mma.sync scans) in the forward, dD_local in the backward
  float *Gc, *h, *dD, *dh, *rs;
  // dq^, dk^ per value head: fp32 from the mma.sync bwd_chunk, bf16 from the wgmma one (layout sizes
  // them by path; untyped, so each path names its element type where it uses them)
  void *dqn, *dkn;
  int* prep_done;  // [chunk][Hk]: prep finished (chunk, key head) (the forward's output scan beside it)
  int* done;  // [count][flags: the forward scan has stored (segment, head)], the same for the reverse
              // scan, then bwd_chunk's item counter (gdn_backward's kernels beside one another)
  bf16 *Wh, *Wl;    // W = T diag(b e^G) K^ as its bf16 hi / lo planes [T, Hv, K] (mma.sync scans only)
  bf16 *Dh, *Dl;    // D = U - W S, planes [T, Hv, V]
  bf16 *dDh, *dDl;  // full dD, planes [T, Hv, V]
  bf16 *Th, *Tl;    // T = (I + A)^-1 per (chunk, head), planes [chunk, Hv, C x C] (prep -> wgmma scans, bwd_chunk)
  float* scl;       // the fp16 backward's tile scales [chunk][Hv][kSclFloats] (the scans -> bwd_chunk)
  int nc_max;
};

// One gdn_forward or gdn_backward call: its tensors, its workspace and what each stage runs.
struct Call {
  GdnArgs a;
  Workspace w;
  int Hk, Hv, K, V, conv_dim;
  const bf16* qkv;
  const float *g, *beta;
  const bf16* d_o;  // the backward's
  bf16* o;          // the forward's
  bf16* dqkv;
  float *dg, *dbeta;
  bool wg;        // the wgmma kernels (dk = dv = 128, a.mma_sync off); else the mma.sync ones
  bool backward;  // gdn_backward's call
  bool split;     // the plan may split a long sample (split_possible): the scans run by tickets
  // reset_flags: w.done's first ints zeroed (the flags of the kernels launched beside one another);
  // where a backward reads a kept plan that may split, the split's walks reset (the forward scan's too
  // where it runs again).
  size_t zero_done_ints;
  bool reset_split, reset_split_fwd;
  // chunk table and prep: not where the backward reads prep's kept part
  bool make_prep;
  bool rtable;       // the table kernel builds rtable (bwd_chunk's and the output kernel's order)
  bool store_t;      // prep stores T (bwd_chunk, the wgmma scans)
  bool prep_beside;  // the plain forward: prep beside the table kernel, the scan beside prep
  // the forward scan: not where the backward reads kept chunk states
  bool run_scan_fwd;
  bool keep;          // the wgmma scan stores h and D (the backward's, or the output kernel's)
  bool f16;           // the backward's fp16 form (h, D, dh, dD as scaled fp16 tiles)
  bf16* scan_out;     // the wgmma scan forms the output there (nullptr: it does not)
  int* done_fwd;      // the forward scan flags each (segment, head) there (a kernel beside it waits)
  bool run_output;    // the forward's output kernel
  bool out_beside;    //   beside the scan
  // the backward's kernels after the forward scan
  bool rev_beside;    // the reverse scan beside the forward scan
  int* done_rev;      // the reverse scan's flags (bwd_chunk beside it)
  int* work;          // bwd_chunk's item counter (beside the reverse scan; nullptr: not beside)
  bool l2_in_bwd_chunk;  // the wgmma bwd_chunk applies the L2-norm backward (one value head per key head)
};

// o [T, Hv, dv] and the rest as gdn_forward / gdn_backward take them.
Call plan_forward(void* o, const void* qkv, const float* g, const float* beta, const GdnArgs& a, void* workspace,
                  void* state, GdnKeep keep);
Call plan_backward(void* dqkv, float* dg, float* dbeta, const void* d_o, const void* qkv, const float* g,
                   const float* beta, const GdnArgs& a, void* workspace, const void* state, GdnKeep keep);

// The stages. gdn_forward: reset_flags, chunk_table, prep, scan_fwd, output; gdn_backward:
// reset_flags, chunk_table, prep, scan_fwd, dlocal, scan_bwd, bwd_chunk, qk_grad. Each returns
// whether it launched work for this call.
bool reset_flags(const Call& c, cudaStream_t stream);  // gdn.cu
bool chunk_table(const Call& c, cudaStream_t stream);  // plan.cu
bool prep(const Call& c, cudaStream_t stream);         // prep.cu
bool scan_fwd(const Call& c, cudaStream_t stream);     // gdn.cu: fwd_scan.cu's or mma_sync_scans.cu's
bool output(const Call& c, cudaStream_t stream);       // mma_sync_chunks.cu
bool dlocal(const Call& c, cudaStream_t stream);       // mma_sync_chunks.cu
bool scan_bwd(const Call& c, cudaStream_t stream);     // gdn.cu: rev_scan.cu's or mma_sync_scans.cu's
bool bwd_chunk(const Call& c, cudaStream_t stream);    // gdn.cu: bwd_chunk.cu's or mma_sync_chunks.cu's
bool qk_grad(const Call& c, cudaStream_t stream);      // qk_grad.cu

// The families behind scan_fwd, scan_bwd and bwd_chunk.
void scan_fwd_wgmma(const Call& c, cudaStream_t stream);     // fwd_scan.cu
void scan_bwd_wgmma(const Call& c, cudaStream_t stream);     // rev_scan.cu
void bwd_chunk_wgmma(const Call& c, cudaStream_t stream);    // bwd_chunk.cu
void scan_fwd_mma_sync(const Call& c, cudaStream_t stream);  // mma_sync_scans.cu
void scan_bwd_mma_sync(const Call& c, cudaStream_t stream);
void bwd_chunk_mma_sync(const Call& c, cudaStream_t stream);  // mma_sync_chunks.cu

}  // namespace qt::cuda::gdn
