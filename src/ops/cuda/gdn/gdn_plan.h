// The intra-sample split's plan (docs/gdn_kernels.md; the chunk table kernel, gdn/plan.cu, makes it
// on the device): which of the longest samples the forward scan splits into how many
// chunk-aligned segments. The functions compile for the host too, so a CPU test runs the plan the
// kernel runs (tests/test_gdn_plan.cpp).
//
// Cost model, in chunk steps of one scan CTA (one CTA per SM; all value heads alike): a sample of n
// chunks unsplit is n steps of work and a chain of n. Split into k >= 3 segments of about l = n / k:
// the first segment runs from state 0 and the middle ones' maps (M, E: two items each) at once,
// then the later segments from their entering states, each formed by a combine in segment order:
// work n + 2 (k - 2) l, chain 2 l + (k - 2) combines. Every item also costs kItemSteps (its
// ticket, the cold start of its loads, its flags), and a combine kCombineSteps. The estimate is the
// largest of the work over the SMs, the longest chain, and the waves of equal segments (items that
// do not pack).
//
// The two overheads were fitted to the H200: without them the model
// split a 2600-token sample among short ones at 2B heads into 9 segments of 5 chunks and a 1603-token
// one into 6, and the chat row's training path went 0.81 -> 1.08 ms; one 8192-token sample there
// gains 1.73x, one 32768-token sample at 4B heads 1.9x, and those still split.
#pragma once

#if !defined(QT_HD)
#if defined(__CUDACC__)
#define QT_HD __host__ __device__ __forceinline__
#else
#define QT_HD inline
#endif
#endif

#include <cmath>

namespace qt::gdn_plan {

constexpr int kChunkRows = 64;    // rows per chunk (the kernels' kC)
constexpr int kSplitTop = 8;      // the longest samples the plan may split
constexpr int kSplitCand = 32;    // candidate segment counts of the longest sample: 3 .. kSplitCand + 2
constexpr int kMinSegChunks = 4;  // no segment shorter than 256 rows
constexpr float kItemSteps = 6.f;     // per item: ticket, cold loads, flags (fitted, see above)
constexpr float kCombineSteps = 2.f;  // per combine on the chain (a D x D product from L2, a flag)

QT_HD int imin(int a, int b) { return a < b ? a : b; }
QT_HD int imax(int a, int b) { return a > b ? a : b; }

// Chunks of segment i of a sample of n chunks in k segments, and its first chunk.
QT_HD int seg_chunks(int n, int k, int i) { return n / k + (i < n % k ? 1 : 0); }
QT_HD int seg_first(int n, int k, int i) { return i * (n / k) + imin(i, n % k); }

// What the estimate needs of the call: state slots (segments of split samples in all), value
// heads, SMs.
struct SplitShape {
  int max_slots, hv, sms;
};

// The estimate for candidate c (0: no split; else the longest sample in c + 2 segments, every top
// sample longer than that segment length split as finely, longest first while slots last).
// top_n: the n_top longest samples' chunk counts, longest first; rest_work: the other samples'
// chunks, rest_max: the longest of them. k_out (may be null): the segment counts chosen.
QT_HD float split_cost(int c, const int* top_n, int n_top, int rest_work, int rest_max, SplitShape sp, int* k_out) {
  const int lt = c == 0 ? 0x7fffffff : (top_n[0] + c + 1) / (c + 2);
  int slots = 0, items1 = 0, items3 = 0, lmax = 0;
  // The other samples: one item each (their count is not known here; their overhead is the same
  // in every candidate but the chain's).
  float work = static_cast<float>(rest_work), path = rest_max > 0 ? rest_max + kItemSteps : 0.f;
  for (int r = 0; r < n_top; ++r) {
    const int n = top_n[r];
    int k = 1;
    if (n > lt) {
      k = imin(imax(3, (n + lt - 1) / lt), n / kMinSegChunks);
      if (k < 3 || slots + k > sp.max_slots) k = 1;
    }
    if (k_out) k_out[r] = k;
    if (k == 1) {
      work += n + kItemSteps;
      path = fmaxf(path, n + kItemSteps);
      continue;
    }
    slots += k;
    const int l = (n + k - 1) / k;
    // every chunk once, the middle ones twice more; 3 k - 4 items
    work += static_cast<float>(n + 2 * (k - 2) * l) + (3 * k - 4) * kItemSteps;
    path = fmaxf(path, 2 * (l + kItemSteps) + (k - 2) * kCombineSteps);  // map, the combines, then out
    items1 += 2 * k - 3;
    items3 += k - 1;
    lmax = imax(lmax, l);
  }
  const float hv = static_cast<float>(sp.hv), sms = static_cast<float>(sp.sms);
  // Whole waves of equal segments: their items do not pack below the ticket order's waves.
  const float waves = (lmax + kItemSteps) * (ceilf(items1 * hv / sms) + ceilf(items3 * hv / sms));
  return fmaxf(fmaxf(work * hv / sms, path), waves);
}

// The candidate to take from the estimates cost[0..kSplitCand]: the cheapest, where it saves a
// tenth of the unsplit estimate; else 0. The plan runs only where the ticket instances already run,
// and a row they run unsplit costs 7-9 % more than on the plain ones (measured on the H200), so a
// split that only evens with the plain scan still gains there.
QT_HD int split_pick(const float* cost) {
  int best = 0;
  for (int c = 1; c <= kSplitCand; ++c)
    if (cost[c] < cost[best]) best = c;
  return best > 0 && cost[best] < 0.9f * cost[0] ? best : 0;
}

// Whether a sample as long as max_seqlen could be worth splitting (the host's check, before the
// device plans): its chunks must be more than twice an even share of all chunk steps over the SMs,
// and enough for three segments.
QT_HD bool split_worth_trying(int max_seqlen, int max_chunks, SplitShape sp) {
  const float n_max = ceilf(static_cast<float>(max_seqlen) / kChunkRows);
  const float share = static_cast<float>(max_chunks) * sp.hv / sp.sms;
  return sp.max_slots >= 3 && n_max >= 3 * kMinSegChunks && n_max > 2.f * share;
}

}  // namespace qt::gdn_plan
