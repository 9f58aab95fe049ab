// The chunk table and the intra-sample split's plan, made on the device by one CTA per call
// (gdn_chunk_table_kernel): every later kernel walks its tables.
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn/gdn_common.cuh"

namespace qt::cuda::gdn {
namespace {

// The scans are serial over a sample's chunks, so one long sample with few heads leaves most SMs
// idle (docs/gdn_kernels.md). The plan splits the longest samples into chunk-aligned segments (virtual
// samples: every table below is over segments) and the forward wgmma scan runs them as items:
//   kItemOut: a sample's first segment from state 0 (every unsplit sample is one); when the sample
//             is split, its leaving state is S_1;
//   kItemE, kItemM: a middle segment's map S_end = M S_0 + E (E from 0, M from I with v = 0);
//   kItemOutFromState: a later segment s from S_s = M_{s-1} S_{s-1} + E_{s-1} (the item forms it
//             first, from its predecessor's S, and publishes it for the next).
// Items are taken by ticket (gdn_scan_fwd_wgmma_kernel), the later segments after every map in
// segment order, so an item waits only on items taken before it: no deadlock at any grid size.
using gdn_plan::kMinSegChunks;
using gdn_plan::kSplitCand;
using gdn_plan::kSplitTop;
using gdn_plan::seg_chunks;
using gdn_plan::seg_first;
struct SplitArgs {
  int* vcu;           // [P + 1] segment boundaries (rows); P = num_seqs + max_slots
  int4* seginfo;      // [P] {sample, index in sample, segments of the sample, state slot (-1: unsplit)}
  int* items;         // [num_seqs + 3 max_slots] item = segment * 4 + ScanItem, in ticket order
  int* items_rev;     // [num_seqs + 2 max_slots] the reverse scan's items (RevItem), in ticket order
  int* counts;        // [0] items, [1] segments, [2], [3] the forward, reverse scans' ticket counters
                      // (zeroed here), [4] items_rev
  int* flags;         // [SplitState][max_slots][Hv] ready flags of the slots (zeroed here)
  gdn_plan::SplitShape shape;  // max_slots: state slots, one per segment of a split sample; 0: never split
};

// table[c] = {bos, len, segment, index in segment} for every chunk, seq_off[p] = first chunk of
// segment p, seq_off[P] = *nchunks; seq_order[r] = the segment of rank r, longest first; rtable =
// the table's entries ordered shortest segment first, with .w = the chunk's index in table
// (nullptr: not built). That is the order in which a single wave of reverse-scan CTAs finishes:
// bwd_chunk's order when it starts beside that scan. Without a split, segment p is sample p.
// One block of 1024 threads, each owning a run of samples (of segments, of ranks).
// The scans are serial over a segment's chunks, so a long one whose CTAs start in the last wave
// sets the tail; they run segments in seq_order (LPT). The order is a counting sort over the
// clamped chunk count; within a count it is arbitrary and harmless, since every CTA's result is
// independent of when it runs.
constexpr int kTableThreads = 1024, kOrderKeys = 1024;
__global__ void __launch_bounds__(kTableThreads, 1) gdn_chunk_table_kernel(int4* table, int4* rtable, int* nchunks,
                                                                        int* seq_off, int* seq_order,
                                                                        const int32_t* cu, int num_seqs,
                                                                        SplitArgs sp, int* prep_done,
                                                                        int prep_flags) {
  launch_dependents();  // prep, beside this grid, waits for it to complete before reading anything
  __shared__ int sums[kTableThreads];
  __shared__ int count[kOrderKeys];
  __shared__ int top_n[kSplitTop], top_s[kSplitTop], top_k[kSplitTop], top_seg[kSplitTop];
  __shared__ float cand[kSplitCand + 1];
  __shared__ int plan[3];  // n_top, the other samples' chunks, the longest of them
  const int tid = threadIdx.x, nt = kTableThreads;
  for (int i = tid; i < kSplitStateCount * sp.shape.max_slots * sp.shape.hv; i += nt) sp.flags[i] = 0;
  if (tid >= 2 && tid < 4) sp.counts[tid] = 0;
  if (prep_done != nullptr)
    for (int i = tid; i < prep_flags; i += nt) prep_done[i] = 0;
  if (tid == 0) plan[2] = 0;
  const int per = (num_seqs + nt - 1) / nt;
  const int s0 = min(num_seqs, tid * per), s1 = min(num_seqs, s0 + per);
  static_assert(kOrderKeys == kTableThreads, "one order key per thread");
  auto nchunks_of = [&](int s) { return (cu[s + 1] - cu[s] + kC - 1) / kC; };
  // Key k = kOrderKeys - 1 - min(chunks, kOrderKeys - 1): ascending keys are descending lengths.
  auto key_of = [](int n) { return kOrderKeys - 1 - min(n, kOrderKeys - 1); };
  // Counting sort: count[key] holds counts on entry, each key's first rank on return.
  auto ranks_from_counts = [&]() {
    __syncthreads();  // counts complete, every thread done reading sums[]
    const int mine = count[tid];
    sums[tid] = mine;
    dev::block_inclusive_scan(sums);
    count[tid] = sums[tid] - mine;
    __syncthreads();
  };

  // 1. Chunks per sample, their prefix, the samples longest first.
  count[tid] = 0;
  int local = 0;
  for (int s = s0; s < s1; ++s) local += nchunks_of(s);
  sums[tid] = local;
  dev::block_inclusive_scan(sums);  // starts with a barrier: count[] is zeroed
  const int chunk_base = sums[tid] - local, total = sums[nt - 1];
  for (int s = s0; s < s1; ++s) atomicAdd(&count[key_of(nchunks_of(s))], 1);
  ranks_from_counts();
  // Without a possible split (segment s is sample s) the samples' order is the scans' order;
  // else the samples of the first ranks (longest first) and the chunks of the next one.
  const bool may_split = sp.shape.max_slots >= 3;
  for (int s = s0; s < s1; ++s) {
    const int n = nchunks_of(s), r = atomicAdd(&count[key_of(n)], 1);
    if (!may_split) {
      seq_order[r] = s;
    } else if (r < kSplitTop) {
      top_s[r] = s;
      top_n[r] = n;
    } else if (r == kSplitTop) {
      plan[2] = n;
    }
  }
  __syncthreads();

  // 2. The plan: the cheapest candidate, taken only where it saves a tenth.
  if (tid == 0) {
    const int n_top = may_split ? min(num_seqs, kSplitTop) : 0;
    int top_work = 0;
    for (int r = 0; r < n_top; ++r) {
      top_k[r] = 1;
      top_work += top_n[r];
    }
    plan[0] = n_top;
    plan[1] = total - top_work;
  }
  __syncthreads();
  const int n_top = plan[0];
  if (n_top > 0 && tid <= kSplitCand)
    cand[tid] = gdn_plan::split_cost(tid, top_n, n_top, plan[1], plan[2], sp.shape, nullptr);
  __syncthreads();
  if (tid == 0 && n_top > 0) {
    const int best = gdn_plan::split_pick(cand);
    if (best > 0) gdn_plan::split_cost(best, top_n, n_top, plan[1], plan[2], sp.shape, top_k);
  }
  __syncthreads();
  auto k_of = [&](int s) {
    for (int r = 0; r < n_top; ++r)
      if (top_s[r] == s) return top_k[r];
    return 1;
  };

  // 3. Segments: boundaries, info, the chunk table.
  int nseg = 0, seg_base = s0, num_segs = num_seqs;
  if (may_split) {
    for (int s = s0; s < s1; ++s) nseg += k_of(s);
    sums[tid] = nseg;
    dev::block_inclusive_scan(sums);
    seg_base = sums[tid] - nseg;
    num_segs = sums[nt - 1];
  }
  {
    int p = seg_base, cb = chunk_base;
    for (int s = s0; s < s1; ++s) {
      const int bos = cu[s], len = cu[s + 1] - bos, n = nchunks_of(s), k = k_of(s);
      int slot = -1;
      if (k > 1) {  // slots of the split samples in top order
        slot = 0;
        for (int r = 0; r < n_top && top_s[r] != s; ++r) slot += top_k[r] > 1 ? top_k[r] : 0;
        for (int r = 0; r < n_top; ++r)
          if (top_s[r] == s) top_seg[r] = p;
      }
      for (int i = 0; i < k; ++i, ++p) {
        const int f = seg_first(n, k, i), m = seg_chunks(n, k, i);
        sp.vcu[p] = bos + f * kC;
        seq_off[p] = cb + f;
        if (may_split) sp.seginfo[p] = make_int4(s, i, k, slot < 0 ? -1 : slot + i);
        for (int c = f; c < f + m; ++c) table[cb + c] = make_int4(bos + c * kC, min(kC, len - c * kC), p, c - f);
      }
      cb += n;
    }
  }
  if (tid == nt - 1) {
    *nchunks = total;
    seq_off[num_segs] = total;
    sp.vcu[num_segs] = num_seqs > 0 ? cu[num_seqs] : 0;
    sp.counts[1] = num_segs;
  }
  __syncthreads();  // vcu, seq_off, seginfo, top_seg complete

  // 4. Segments longest first (the scans' LPT order; without a possible split, done in 1).
  const int pper = (num_segs + nt - 1) / nt;
  const int p0 = min(num_segs, tid * pper), p1 = min(num_segs, p0 + pper);
  auto seg_n = [&](int p) { return seq_off[p + 1] - seq_off[p]; };
  if (!may_split) {
    if (tid == 0) sp.counts[0] = sp.counts[4] = 0;  // no items: the ticket scans run only where a split may happen
  } else {
    count[tid] = 0;
    __syncthreads();
    for (int p = p0; p < p1; ++p) atomicAdd(&count[key_of(seg_n(p))], 1);
    ranks_from_counts();
    for (int p = p0; p < p1; ++p) seq_order[atomicAdd(&count[key_of(seg_n(p))], 1)] = p;
    __syncthreads();  // seq_order complete

    // An item list: per_seg(p) items of each segment p in LPT order, placed by a block scan and written
    // by emit(p, q) from slot q on; then tail(q) on thread 0 from the first free slot (the items that
    // wait for others, in the order they may run).
    auto item_list = [&](auto per_seg, auto emit, auto tail) {
      __syncthreads();  // every thread is done reading sums[]
      local = 0;
      for (int r = p0; r < p1; ++r) local += per_seg(seq_order[r]);
      sums[tid] = local;
      dev::block_inclusive_scan(sums);
      int q = sums[tid] - local;
      for (int r = p0; r < p1; ++r) emit(seq_order[r], q);
      if (tid == 0) tail(sums[nt - 1]);
    };
    int kmax = 1;
    for (int r = 0; r < n_top; ++r) kmax = max(kmax, top_k[r]);
    // 5. The forward scan's items: every sample's first segment and every middle segment's two maps
    // in LPT order, then the later segments by index (each after its predecessor).
    auto first_items = [&](int p) {
      const int4 si = sp.seginfo[p];
      return si.y == 0 ? 1 : si.y < si.z - 1 ? 2 : 0;
    };
    item_list(
        first_items,
        [&](int p, int& q) {
          const int e = first_items(p);
          if (e == 1) sp.items[q++] = 4 * p + kItemOut;
          if (e == 2) {
            sp.items[q++] = 4 * p + kItemE;
            sp.items[q++] = 4 * p + kItemM;
          }
        },
        [&](int q) {
          for (int i = 1; i < kmax; ++i)
            for (int r = 0; r < n_top; ++r)
              if (top_k[r] > i) sp.items[q++] = 4 * (top_seg[r] + i) + kItemOutFromState;
          sp.counts[0] = q;
        });

    // 6. The reverse scan's items: every sample's last segment and every middle segment's F in LPT
    // order, then the earlier segments from the last but one down (each after its successor).
    auto rev_items = [&](int p) {
      const int4 si = sp.seginfo[p];
      return si.y == si.z - 1 || (si.y > 0 && si.y < si.z - 1) ? 1 : 0;
    };
    item_list(
        rev_items,
        [&](int p, int& q) {
          if (rev_items(p) == 0) return;
          const int4 si = sp.seginfo[p];
          sp.items_rev[q++] = 4 * p + (si.y == si.z - 1 ? kRevOut : kRevF);
        },
        [&](int q) {
          for (int j = 0; j + 2 <= kmax; ++j)  // segment index k - 2 - j of each split sample
            for (int r = 0; r < n_top; ++r)
              if (top_k[r] > 1 && top_k[r] - 2 - j >= 0)
                sp.items_rev[q++] = 4 * (top_seg[r] + top_k[r] - 2 - j) + kRevOutFromGrad;
          sp.counts[4] = q;
        });
  }
  if (rtable == nullptr) return;  // a forward that keeps nothing for the backward
  __syncthreads();  // thread 0 is done reading sums[]
  // rtable: this thread's ranks p0..p1 - 1 counted from the shortest segment.
  local = 0;
  for (int r = p0; r < p1; ++r) local += seg_n(seq_order[num_segs - 1 - r]);
  sums[tid] = local;
  dev::block_inclusive_scan(sums);
  int base = sums[tid] - local;
  for (int r = p0; r < p1; ++r) {
    const int p = seq_order[num_segs - 1 - r], bos = sp.vcu[p], len = sp.vcu[p + 1] - bos, n = seg_n(p);
    const int4 si = may_split ? sp.seginfo[p] : make_int4(p, 0, 1, -1);
    const int first = si.y == 0 ? kRtFirst : 0, last = si.y == si.z - 1 ? kRtLast : 0;
    for (int c = 0; c < n; ++c)
      rtable[base + c] = make_int4(bos + c * kC, min(kC, len - c * kC),
                                   p | (c == 0 ? first : 0) | (c == n - 1 ? last : 0), seq_off[p] + c);
    base += n;
  }
}

}  // namespace

bool chunk_table(const Call& c, cudaStream_t stream) {
  if (!c.make_prep) return false;
  const Workspace& w = c.w;
  const SplitArgs sp{w.vcu,
                     w.seginfo,
                     w.items,
                     w.items_rev,
                     w.counts,
                     w.split.flags,
                     {c.split ? w.split.slots : 0, c.Hv, sm_count()}};
  gdn_chunk_table_kernel<<<1, kTableThreads, 0, stream>>>(w.table, c.rtable ? w.rtable : nullptr, w.nchunks,
                                                          w.seq_off, w.seq_order, c.a.cu_seqlens, c.a.num_seqs, sp,
                                                          c.prep_beside ? w.prep_done : nullptr, w.nc_max * c.Hk);
  QT_LAUNCH_CHECK("gdn_chunk_table_kernel");
  return true;
}

}  // namespace qt::cuda::gdn
