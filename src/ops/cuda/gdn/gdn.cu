// Gated DeltaNet on CUDA, chunked WY/UT form with C = 64 (docs/gdn_kernels.md): the entry points
// (gdn.h), the workspace's layout and the plan of a call's stages (gdn_stages.h).
//
// Products on bf16 tensor cores (mma m16n8k16 or wgmma, fp32 accumulation): q, k, v, dO are staged
// as their raw bf16 rows (exact operands, L2 scales applied per row), every fp32 operand is split
// into bf16 hi + lo (~fp32 products, relative error <= ~3 2^-18), except those that feed only a bf16
// output, whose own rounding is 2^-9: the plain forward's output products and bwd_chunk's Y, Pa, Pb
// (dq^, dk^ only; the dG / dbeta sums read the fp32 values). The state, gates, cumsums and the
// triangular solve stay fp32; W, D, dD and the scans' smem states are kept as hi / lo planes (the
// values the split makes) so they are read by ldmatrix; the chunk states h, dh are fp32 in the mma
// fragment order (gdn_mma::frag_index), so their writers and readers move whole 512-byte runs.
// The backward at dk = dv = 128 from a recompute (not from kept chunk states) is fp16 instead: h, D,
// dh, dD stored as fp16 tiles, each (chunk, head) tile times a power of two from its largest
// magnitude (so gradients far from 1 keep 11 bits), and bwd_chunk's products f16 x f16, one per
// operand pair where hi / lo took two or three (dq, dk, dv as before; dg, dbeta ~3e-4 rel RMS
// against ~5e-5).
//
// Per chunk of C rows (padded rows: q = k = v = dO = 0, beta = 0, g = 0, which makes them inert and
// keeps G[C-1] equal to G at the last valid row):
//   G_i = cumsum g, Gam_ij = exp(G_i - G_j) (only j <= i is ever exponentiated, so exp <= 1)
//   A = strict_lower(diag(b) K K^T . Gam), T = (I + A)^-1
//   W = T diag(b e^G) K, U = T diag(b) V
//   D = U - W S0                 ("v_new", the per-token delta vectors)
//   O = diag(e^G) Q S0 + (Q K^T . Gam . M_incl) D
//   S_end = e^{G_L} S0 + (diag(e^{G_L - G}) K)^T D
// At dk = dv = 128 (Qwen3.5's; the wgmma kernels) D = T Y with Y = diag(b) V - diag(b e^G) K S0: W
// and U are never formed, and the scans run on wgmma with the state in their accumulators.
// Forward:  chunk table (plan.cu) -> prep (prep.cu: G, T by a register-tiled block solve, the q / k
//           L2 row scales; one CTA per (chunk, key head)) -> state scan on wgmma (fwd_scan.cu: h, D
//           when kept; the output formed in the scan) [-> output kernel beside the scan when h, D are
//           kept and the scan is one wave]. A long sample may be split across CTAs (intra-sample
//           split: segments' maps S_end = M S_0 + E in parallel, then each segment from its entering
//           state; planned on the device by the chunk table kernel).
// Backward: the same up to the scan, then the reverse scan on wgmma (rev_scan.cu: dh, full dD,
//           dD_local formed inside) -> per-chunk gradients on wgmma, one persistent kernel
//           (bwd_chunk.cu: dq^, dk^ per value head, dv, dg, dbeta; T from prep) -> group sum +
//           L2-norm bwd (qk_grad.cu; at one value head per key head the per-chunk kernel applies the
//           L2-norm bwd itself). The wgmma kernels after the forward scan start beside their
//           predecessors (programmatic dependent launch) and wait per (sample, head) for the flags
//           of what they read (signal_done / wait_done). In the scans warpgroup 0 issues each
//           product batch before warpgroup 1 (named barriers).
// Gates: e^{G_i - G_j} (j <= i, so <= 1) by ex2 of log2-scaled G wherever a kernel forms many of
// them (P in the scans, prep's A, bwd_chunk), with the row and column values read once per thread.
// Other head dims (and dk = dv = 128 with GdnArgs::mma_sync; mma_sync_scans.cu, mma_sync_chunks.cu): prep also forms W, U;
// mma.sync scans (h, D), then the output kernel; in the backward dD_local = P^T dO by its own
// kernel unless the mma.sync reverse scan can form it, and the mma.sync per-chunk gradient kernel.
// Per-(chunk, head) kernels: 256 threads; row reductions go through fixed-order per-tile partials
// (gdn_mma.cuh's for_tiles*), so every result is deterministic.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn.h"
#include "ops/cuda/gdn/gdn_plan.h"
#include "ops/cuda/gdn/gdn_stages.h"

namespace qt::cuda {
namespace gdn {
namespace {

constexpr int kC = gdn_plan::kChunkRows;

// The wgmma kernels (one CTA per (sample, head) at every head count) serve dk = dv = 128, Qwen3.5's;
// a.mma_sync runs the mma.sync ones there too.
bool wgmma_kernels(const GdnArgs& a) {
  return a.k_head_dim == kWgmmaDim && a.v_head_dim == kWgmmaDim && !a.mma_sync;
}

// w.done's parts: the flags of scan 0 (forward) and 1 (reverse), each array after its count
// (signal_done_counted), then bwd_chunk's item counter. done_ints: the ints up to the end of the
// forward's flags (with_backward = false) or of the counter.
size_t done_block(const Workspace& w, int Hv) { return static_cast<size_t>(w.max_segs) * Hv + 1; }  // count + flags
int* done_flags(const Workspace& w, int Hv, int scan) { return w.done + 1 + scan * done_block(w, Hv); }
int* work_counter(const Workspace& w, int Hv) { return w.done + 2 * done_block(w, Hv); }
size_t done_ints(const Workspace& w, int Hv, bool with_backward) {
  return with_backward ? 2 * done_block(w, Hv) + 1 : done_block(w, Hv);
}

// State slots of the intra-sample split (gdn_chunk_table_kernel): about two scan CTAs per SM's worth
// of segments (each slot is a D x D state per value head, three times); none without a.split.
int split_slots(const GdnArgs& a) {
  if (!a.split || !wgmma_kernels(a)) return 0;
  return std::min(32, 2 * sm_count() / std::max(1, a.num_v_heads));
}

// Upper bound on the chunk count: sum ceil(len/C) <= T/C + N, and never more than T.
int max_chunks(const GdnArgs& a) {
  const int64_t b = static_cast<int64_t>(a.total_tokens) / kC + a.num_seqs;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b, std::max(a.total_tokens, 1))));
}

// Lays the forward state out from `state` and the backward-only buffers from `scratch` (nullptr:
// sizes only). Returns {state bytes, scratch bytes}. The state starts with prep's results and the
// chunk plan (Gc, T, rs, the table and the split's plan: GdnKeep::Prep's part); GdnKeep::States also
// keeps W, D, h and the split's maps and flags (what the backward reuses when the forward kept it),
// which GdnKeep::Prep leaves in the scratch.
// Prep keeps nothing where the mma.sync scans run (they read prep's W and U as well, which would
// make the part as large as States'): the backward recomputes prep there.
std::pair<size_t, size_t> layout(const GdnArgs& a, char* state, char* scratch, Workspace* w,
                                 GdnKeep keep = GdnKeep::States) {
  size_t off = 0;
  char* base = state;
  auto take = [&](size_t bytes) {
    char* p = base ? base + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  size_t state_bytes = 0;
  auto state_ends = [&] {  // the rest goes to the scratch
    state_bytes = off;
    off = 0;
    base = scratch;
  };
  const size_t T = static_cast<size_t>(a.total_tokens), Hk = static_cast<size_t>(a.num_k_heads),
               Hv = static_cast<size_t>(a.num_v_heads), K = static_cast<size_t>(a.k_head_dim),
               V = static_cast<size_t>(a.v_head_dim);
  const bool wg = wgmma_kernels(a);
  const int nc = max_chunks(a);
  const size_t states = static_cast<size_t>(nc) * Hv * K * V * sizeof(float);
  Workspace ws{};
  ws.nc_max = nc;
  if (keep == GdnKeep::Prep && !wg) state_ends();
  ws.Gc = reinterpret_cast<float*>(take(T * Hv * sizeof(float)));
  ws.Th = reinterpret_cast<bf16*>(take(static_cast<size_t>(nc) * Hv * kC * kC * sizeof(bf16)));
  ws.Tl = reinterpret_cast<bf16*>(take(static_cast<size_t>(nc) * Hv * kC * kC * sizeof(bf16)));
  ws.rs = reinterpret_cast<float*>(take(T * Hk * 2 * sizeof(float)));  // L2 row scales of q, k
  ws.table = reinterpret_cast<int4*>(take(static_cast<size_t>(nc) * sizeof(int4)));
  ws.rtable = reinterpret_cast<int4*>(take(static_cast<size_t>(nc) * sizeof(int4)));
  ws.nchunks = reinterpret_cast<int*>(take(sizeof(int)));
  const int slots = split_slots(a);
  const size_t P = static_cast<size_t>(a.num_seqs) + slots;
  ws.max_segs = static_cast<int>(P);
  ws.seq_off = reinterpret_cast<int*>(take((P + 1) * sizeof(int)));
  ws.seq_order = reinterpret_cast<int*>(take(P * sizeof(int)));
  ws.vcu = reinterpret_cast<int*>(take((P + 1) * sizeof(int)));
  ws.seginfo = reinterpret_cast<int4*>(take(P * sizeof(int4)));
  ws.items = reinterpret_cast<int*>(take((static_cast<size_t>(a.num_seqs) + 3 * slots) * sizeof(int)));
  ws.items_rev = reinterpret_cast<int*>(take((static_cast<size_t>(a.num_seqs) + 2 * slots) * sizeof(int)));
  ws.counts = reinterpret_cast<int*>(take(5 * sizeof(int)));
  if (keep == GdnKeep::Prep && wg) state_ends();
  // W's planes: only the mma.sync scans read them (the wgmma ones form W S from T).
  const size_t w_bytes = wg ? 0 : T * Hv * K * sizeof(bf16);
  ws.Wh = reinterpret_cast<bf16*>(take(w_bytes));
  ws.Wl = reinterpret_cast<bf16*>(take(w_bytes));
  ws.Dh = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.Dl = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.h = reinterpret_cast<float*>(take(states));
  // The split's maps M and the flags: a backward reading a kept state combines its reverse
  // segments with the forward's M (the other slots are scratch).
  const size_t slot_bytes = static_cast<size_t>(slots) * Hv * K * V * sizeof(float);
  ws.split.M = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.flags = reinterpret_cast<int*>(take(kSplitStateCount * static_cast<size_t>(slots) * Hv * sizeof(int)));
  if (keep == GdnKeep::States) state_ends();
  // dD (fp32): U of the mma.sync forward scans, dD_local of the mma.sync dlocal kernel; the wgmma
  // scans form both where they use them.
  ws.dD = reinterpret_cast<float*>(take(!wg ? T * Hv * V * sizeof(float) : 0));
  ws.dDh = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.dDl = reinterpret_cast<bf16*>(take(T * Hv * V * sizeof(bf16)));
  ws.dh = reinterpret_cast<float*>(take(states));
  ws.scl = reinterpret_cast<float*>(take(wg ? static_cast<size_t>(nc) * Hv * kSclFloats * sizeof(float) : 0));
  // dq^, dk^ per value head for qk_grad: fp32 from the mma.sync bwd_chunk, bf16 from the wgmma one,
  // none where that applies the L2-norm backward itself (one value head per key head).
  const size_t dqk_bytes = !wg ? T * Hv * K * sizeof(float) : Hv == Hk ? 0 : T * Hv * K * sizeof(bf16);
  ws.dqn = take(dqk_bytes);
  ws.dkn = take(dqk_bytes);
  ws.done = reinterpret_cast<int*>(take(done_ints(ws, a.num_v_heads, true) * sizeof(int)));
  ws.prep_done = reinterpret_cast<int*>(take(static_cast<size_t>(nc) * Hk * sizeof(int)));
  ws.split.S = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.E = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.G = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.F = reinterpret_cast<float*>(take(slot_bytes));
  ws.split.slots = slots;

  if (w) *w = ws;
  return {state_bytes, off};
}

// The workspace of a call: the state from `state` when the caller keeps it (what `keep` names; the
// rest in the workspace), else its front part.
Workspace place(const GdnArgs& a, void* workspace, void* state, GdnKeep keep = GdnKeep::States) {
  Workspace w;
  if (state != nullptr) {
    layout(a, static_cast<char*>(state), static_cast<char*>(workspace), &w, keep);
  } else {
    const size_t front = layout(a, nullptr, nullptr, nullptr).first;
    layout(a, static_cast<char*>(workspace), static_cast<char*>(workspace) + front, &w);
  }
  return w;
}


// Whether a sample as long as max_seqlen could be worth splitting (the plan, on the device, decides):
// only where its chunks are more than twice an even share of all the scan's chunk steps over the
// SMs. The plain scan is kept otherwise (the ticket walk costs the chat mix ~5 %). max_seqlen is the
// caller's bound, so a captured step keeps the decision of its capture.
bool split_possible(const GdnArgs& a, const Workspace& w) {
  return gdn_plan::split_worth_trying(a.max_seqlen, max_chunks(a), {w.split.slots, a.num_v_heads, sm_count()});
}

// Whether the forward's output is formed by the wgmma scan. When h and D are stored anyway
// (for_backward) and the scan is a single wave of CTAs (2B: 8 samples x 16 heads on 132 SMs), every
// CTA's chain is the critical path and the output kernel beside it is cheaper: 2B kept forward
// 0.287 ms against 0.343 fused, 0.350 with the output kernel after the scan. With more CTAs than
// SMs, or with nothing to store, the fused output wins (4B, an earlier round: 2.30 -> 2.26 ms,
// forward alone 0.79 -> 0.59).
bool output_in_scan(const GdnArgs& a, bool for_backward) {
  return wgmma_kernels(a) && (!for_backward || static_cast<int64_t>(a.num_seqs) * a.num_v_heads > sm_count());
}

// A call's tensors, workspace and shape.
Call call_of(const GdnArgs& a, const Workspace& w, const void* qkv, const float* g, const float* beta) {
  Call c{};
  c.a = a;
  c.w = w;
  c.Hk = a.num_k_heads;
  c.Hv = a.num_v_heads;
  c.K = a.k_head_dim;
  c.V = a.v_head_dim;
  c.conv_dim = 2 * c.Hk * c.K + c.Hv * c.V;
  c.qkv = static_cast<const bf16*>(qkv);
  c.g = g;
  c.beta = beta;
  c.wg = wgmma_kernels(a);
  return c;
}

}  // namespace

Call plan_forward(void* o, const void* qkv, const float* g, const float* beta, const GdnArgs& a, void* workspace,
                  void* state, GdnKeep keep) {
  Call c = call_of(a, place(a, workspace, state, keep), qkv, g, beta);
  c.o = static_cast<bf16*>(o);
  // Keeping prep's results is the plain forward's work (prep writes them either way, here into the
  // caller's state); keeping the chunk states is the training path's forward, computed at the
  // backward's precision, so reusing it changes nothing. Long samples may split either way: a kept
  // state keeps the plan and the maps' M for the backward.
  const bool keep_states = state != nullptr && keep == GdnKeep::States;
  const bool keep_prep = state != nullptr && keep == GdnKeep::Prep;
  const bool in_scan = output_in_scan(a, keep_states);
  c.split = split_possible(a, c.w);
  c.make_prep = true;
  // rtable: bwd_chunk's and the output kernel's order, not needed by a plain forward with the output fused.
  c.rtable = keep_states || !in_scan || keep_prep;
  // The wgmma scans form W S and U from T themselves: prep stores G and T only (no W, U).
  c.store_t = keep_states || c.wg;
  c.run_scan_fwd = true;
  c.keep = keep_states || !in_scan;  // without the fused output, the output kernel reads h and D
  c.scan_out = in_scan ? c.o : nullptr;
  // The plain forward (the wgmma scan forms the output, keeps nothing, no tickets) runs prep beside
  // the table kernel (waiting for it) and the scan beside prep, each scan CTA waiting for its own
  // chunks (prep_done). Elsewhere each kernel starts after the one before: the flags cost the 2B
  // kept forward and backward 1-2 %.
  c.prep_beside = in_scan && !c.keep && !c.split;
  // Where the output kernel follows the wgmma scan (one wave of scan CTAs with the state kept: 2B),
  // it starts beside it (programmatic dependent launch) on the SMs the short samples' CTAs leave,
  // each CTA waiting for its (sample, head)'s flag, shortest sample first (rtable).
  c.run_output = !in_scan;
  c.out_beside = c.wg && !in_scan;
  c.done_fwd = c.out_beside ? done_flags(c.w, c.Hv, 0) : nullptr;
  c.zero_done_ints = c.out_beside ? done_ints(c.w, c.Hv, false) : 0;
  return c;
}

Call plan_backward(void* dqkv, float* dg, float* dbeta, const void* d_o, const void* qkv, const float* g,
                   const float* beta, const GdnArgs& a, void* workspace, const void* state, GdnKeep keep) {
  // The backward only reads the state (the kernels write dD, dh, dqn, dkn, never it), except for
  // the split's ticket counters (and, in States' part, the reverse split's flags), which it resets.
  Call c = call_of(a, place(a, workspace, const_cast<void*>(state), keep), qkv, g, beta);
  c.backward = true;
  c.d_o = static_cast<const bf16*>(d_o);
  c.dqkv = static_cast<bf16*>(dqkv);
  c.dg = dg;
  c.dbeta = dbeta;
  // kept: the forward's chunk states are there (nothing of the forward runs); with prep's part only
  // (the plan, G, T, the row scales; non-empty where the wgmma scans run), the forward scan runs
  // again, not the chunk table or prep.
  const bool kept = state != nullptr && keep == GdnKeep::States;
  const bool prep_kept = state != nullptr && keep == GdnKeep::Prep && c.wg;
  // The wgmma kernels run beside one another (programmatic dependent launch), each waiting only for
  // what it reads: the reverse scan needs none of the recomputed forward scan's results (only prep's),
  // so it starts on the SMs the forward's finished CTAs leave; bwd_chunk starts beside the reverse
  // scan and waits per (sample, head) for both scans' flags, taking items from a counter, shortest
  // sample first. With the scans' CTAs longest sample first, the short samples' SMs would otherwise
  // idle while the longest chains finish (2B: one wave of 128 CTAs).
  c.rev_beside = c.wg && !kept;
  c.done_fwd = c.rev_beside ? done_flags(c.w, c.Hv, 0) : nullptr;
  c.done_rev = c.wg ? done_flags(c.w, c.Hv, 1) : nullptr;
  c.work = c.wg ? work_counter(c.w, c.Hv) : nullptr;
  c.zero_done_ints = c.wg ? done_ints(c.w, c.Hv, true) : 0;
  // The forward (recomputed here or kept) may have split long samples; the reverse scan then splits
  // them as well. Both decide by split_possible on the same args, so a kept state's plan is the one
  // read here.
  c.split = c.wg && split_possible(a, c.w);
  c.reset_split = (kept || prep_kept) && c.split;
  c.reset_split_fwd = prep_kept;
  c.f16 = !kept && c.wg;  // gdn_backward_fp16
  c.run_scan_fwd = !kept;
  c.make_prep = !kept && !prep_kept;
  c.rtable = true;
  c.store_t = true;
  c.keep = true;
  // One value head per key head (2B): the wgmma bwd_chunk applies the L2-norm backward itself.
  c.l2_in_bwd_chunk = c.wg && c.Hv == c.Hk;
  return c;
}

// For a backward reading a kept plan that may split, what the chunk table kernel zeroed and the
// split's scans consume (a kept state may be read more than once: bench_gdn, gradient checks): with
// the forward scan running again (GdnKeep::Prep) every flag row and both scans' ticket counters;
// with the chunk states kept (States) only the reverse scan's, its G and F flag rows (the forward's
// S, M and E stay set: the reverse combines with the kept M) and its counter.
bool reset_flags(const Call& c, cudaStream_t stream) {
  const Workspace& w = c.w;
  if (c.zero_done_ints > 0) CUDA_CHECK(cudaMemsetAsync(w.done, 0, c.zero_done_ints * sizeof(int), stream));
  if (c.reset_split) {
    static_assert(kStateG + 1 == kStateF && kStateF + 1 == kSplitStateCount, "G, F: the flags' last rows");
    const size_t rows = static_cast<size_t>(w.split.slots) * c.Hv;
    const bool fwd = c.reset_split_fwd;
    const int first = fwd ? 0 : kStateG;
    CUDA_CHECK(
        cudaMemsetAsync(w.split.flags + first * rows, 0, (kSplitStateCount - first) * rows * sizeof(int), stream));
    CUDA_CHECK(cudaMemsetAsync(w.counts + (fwd ? 2 : 3), 0, (fwd ? 2 : 1) * sizeof(int), stream));
  }
  return c.zero_done_ints > 0 || c.reset_split;
}

bool scan_fwd(const Call& c, cudaStream_t stream) {
  if (!c.run_scan_fwd) return false;
  c.wg ? scan_fwd_wgmma(c, stream) : scan_fwd_mma_sync(c, stream);
  return true;
}

bool scan_bwd(const Call& c, cudaStream_t stream) {
  if (!c.backward) return false;
  c.wg ? scan_bwd_wgmma(c, stream) : scan_bwd_mma_sync(c, stream);
  return true;
}

bool bwd_chunk(const Call& c, cudaStream_t stream) {
  if (!c.backward) return false;
  c.wg ? bwd_chunk_wgmma(c, stream) : bwd_chunk_mma_sync(c, stream);
  return true;
}

}  // namespace gdn

size_t gdn_workspace_bytes(const GdnArgs& a) {
  const auto sizes = gdn::layout(a, nullptr, nullptr, nullptr);
  return sizes.first + sizes.second;
}

size_t gdn_state_bytes(const GdnArgs& a, GdnKeep keep) { return gdn::layout(a, nullptr, nullptr, nullptr, keep).first; }

// The fp16 form (h, D, dh, dD as scaled fp16 tiles, bwd_chunk's products f16 x f16) where the
// recompute (plain or by tickets), the reverse scan and bwd_chunk run on wgmma: gdn_backward uses it
// wherever it reads no kept chunk states.
bool gdn_backward_fp16(int K, int V) { return K == gdn::kWgmmaDim && V == gdn::kWgmmaDim; }

int gdn_split_min_seqlen(const GdnArgs& a) {
  const int slots = gdn::split_slots(a), chunks = gdn::max_chunks(a);
  const gdn_plan::SplitShape shape{slots, a.num_v_heads, sm_count()};
  for (int n = 1; n <= chunks; ++n)  // split_worth_trying depends on max_seqlen by its chunks only
    if (gdn_plan::split_worth_trying(n * gdn::kC, chunks, shape)) return (n - 1) * gdn::kC + 1;
  return std::numeric_limits<int>::max();
}

int gdn_planned_segments(const GdnArgs& a, const void* workspace, const void* state, GdnKeep keep) {
  const gdn::Workspace w = gdn::place(a, const_cast<void*>(workspace), const_cast<void*>(state), keep);
  int n = 0;
  CUDA_CHECK(cudaMemcpy(&n, w.counts + 1, sizeof(int), cudaMemcpyDeviceToHost));
  return n;
}

void gdn_forward(void* o, const void* qkv, const float* g, const float* beta, const GdnArgs& a, void* workspace,
                 cudaStream_t stream, void* state, GdnKeep keep) {
  if (a.total_tokens <= 0 || a.num_seqs <= 0) return;
  const gdn::Call c = gdn::plan_forward(o, qkv, g, beta, a, workspace, state, keep);
  gdn::reset_flags(c, stream);
  gdn::chunk_table(c, stream);
  gdn::prep(c, stream);
  gdn::scan_fwd(c, stream);
  gdn::output(c, stream);
}

void gdn_backward(void* dqkv, float* dg, float* dbeta, const void* d_o, const void* qkv, const float* g,
                  const float* beta, const GdnArgs& a, void* workspace, cudaStream_t stream, const void* state,
                  GdnKeep keep) {
  if (a.total_tokens <= 0 || a.num_seqs <= 0) return;
  const gdn::Call c = gdn::plan_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, workspace, state, keep);
  gdn::reset_flags(c, stream);
  gdn::chunk_table(c, stream);
  gdn::prep(c, stream);
  gdn::scan_fwd(c, stream);
  gdn::dlocal(c, stream);
  gdn::scan_bwd(c, stream);
  gdn::bwd_chunk(c, stream);
  gdn::qk_grad(c, stream);
}

}  // namespace qt::cuda
