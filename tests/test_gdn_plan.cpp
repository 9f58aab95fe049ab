// The intra-sample split's plan (src/ops/cuda/gdn/gdn_plan.h), run on the CPU as the chunk table kernel
// runs it: every candidate's estimate, the pick, the chosen segment counts. The CUDA tests check
// that the forward splits and stays exact (CudaGdn.Split*); these pin what the plan decides for the
// shapes bench_gdn measures and the limits it must keep.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/cuda/gdn/gdn_plan.h"

namespace qt {
namespace {

using gdn_plan::kMinSegChunks;
using gdn_plan::kSplitCand;
using gdn_plan::kSplitTop;
using gdn_plan::SplitShape;

constexpr int kSms = 132;  // the H200's

int chunks(int len) { return (len + 63) / 64; }
// As gdn/gdn.cu's split_slots: about two scan CTAs per SM's worth of segments.
int slots_for(int hv) { return std::min(32, 2 * kSms / hv); }

// The plan for samples of these lengths (tokens) at hv value heads: segment counts, longest first.
std::vector<int> plan(std::vector<int> lens, int hv) {
  std::vector<int> n;
  for (int l : lens) n.push_back(chunks(l));
  std::sort(n.begin(), n.end(), std::greater<int>());
  const int n_top = std::min<int>(static_cast<int>(n.size()), kSplitTop);
  int rest_work = 0, rest_max = 0;
  for (size_t i = static_cast<size_t>(n_top); i < n.size(); ++i) {
    rest_work += n[i];
    rest_max = std::max(rest_max, n[i]);
  }
  const SplitShape sp{slots_for(hv), hv, kSms};
  std::vector<float> cost(kSplitCand + 1);
  for (int c = 0; c <= kSplitCand; ++c) cost[c] = gdn_plan::split_cost(c, n.data(), n_top, rest_work, rest_max, sp, nullptr);
  std::vector<int> k(static_cast<size_t>(n_top), 1);
  const int best = gdn_plan::split_pick(cost.data());
  if (best > 0) gdn_plan::split_cost(best, n.data(), n_top, rest_work, rest_max, sp, k.data());
  // Whatever was chosen keeps the limits: 1 or >= 3 segments of >= kMinSegChunks chunks, within the slots.
  int used = 0;
  for (int r = 0; r < n_top; ++r) {
    EXPECT_TRUE(k[r] == 1 || k[r] >= 3) << "sample " << r << ": " << k[r] << " segments";
    if (k[r] > 1) {
      EXPECT_GE(n[r] / k[r], kMinSegChunks) << "sample " << r;
      used += k[r];
    }
  }
  EXPECT_LE(used, sp.max_slots);
  return k;
}

TEST(GdnPlan, SegmentsPartitionTheChunks) {
  for (int n = 1; n <= 300; ++n)
    for (int k = 1; k <= std::min(n, 40); ++k) {
      int next = 0, lo = n, hi = 0;
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(gdn_plan::seg_first(n, k, i), next) << "n " << n << " k " << k << " i " << i;
        const int m = gdn_plan::seg_chunks(n, k, i);
        next += m;
        lo = std::min(lo, m);
        hi = std::max(hi, m);
      }
      ASSERT_EQ(next, n) << "n " << n << " k " << k;
      ASSERT_LE(hi - lo, 1) << "n " << n << " k " << k;  // as even as chunks allow
    }
}

// bench_gdn's chat mix (8 samples summing to 8192): the GPU is full or nearly so at every head
// count, so neither the host check nor the plan splits (the plain scan runs).
TEST(GdnPlan, ChatMixIsNotSplit) {
  const std::vector<int> mix = {1187, 412, 1603, 256, 977, 1420, 731, 1606};
  const int max_chunks = 8192 / 64 + 8;
  for (int hv : {16, 32, 48}) {
    EXPECT_FALSE(gdn_plan::split_worth_trying(1606, max_chunks, {slots_for(hv), hv, kSms})) << "Hv " << hv;
    for (int k : plan(mix, hv)) EXPECT_EQ(k, 1) << "Hv " << hv;
  }
}

// The flash-linear-attention comparison's shape (one 32k-token sample, Hv = 32): 5 segments (estimate 327 chunk steps:
// 224 first-phase items in two waves of 103-chunk segments, then 128 later ones, each with its
// item overhead; unsplit: 518), measured 1.60 ms against 3.07 unsplit. CudaGdn.SplitFourBHeads*
// (6000 tokens) plan 5 segments too, and so does 4100 (estimate 0.80 of unsplit). A 4400-token
// sample among short ones, split in 3, measured even with the plain scans and 9 % faster than the
// ticket instances left unsplit.
TEST(GdnPlan, LongSampleFourBHeads) {
  EXPECT_TRUE(gdn_plan::split_worth_trying(32768, 32768 / 64 + 1, {slots_for(32), 32, kSms}));
  EXPECT_EQ(plan({32768}, 32), std::vector<int>{5});
  EXPECT_EQ(plan({6000}, 32), std::vector<int>{5});
  EXPECT_EQ(plan({4100}, 32), std::vector<int>{5});
  EXPECT_EQ(plan({4400, 1187, 412, 977, 256, 731, 229}, 32), (std::vector<int>{3, 1, 1, 1, 1, 1, 1}));
}

// The row that fitted the item overheads (bench_gdn's 2b_mix2600): split into 9 and 6 segments of
// 5 chunks, its training path went 0.81 -> 1.08 ms. Now it stays whole.
TEST(GdnPlan, ShortSegmentsAmongShortSamplesAreNotWorthIt) {
  for (int k : plan({2600, 412, 1603, 256, 977, 731, 1187, 426}, 16)) EXPECT_EQ(k, 1);
}

// One 8192-token sample at the 2B heads: more segments (16 value heads leave room for more items).
TEST(GdnPlan, LongSampleTwoBHeads) {
  EXPECT_TRUE(gdn_plan::split_worth_trying(8192, 8192 / 64 + 1, {slots_for(16), 16, kSms}));
  const std::vector<int> k = plan({8192}, 16);
  ASSERT_EQ(k.size(), 1u);
  EXPECT_GE(k[0], 4);
  EXPECT_LE(k[0], slots_for(16));
}

// A long sample among short ones is split, the short ones are not; two long ones share the slots.
TEST(GdnPlan, OnlyTheLongSamplesAreSplit) {
  const std::vector<int> k = plan({700, 5000, 1, 129}, 4);
  EXPECT_GE(k[0], 3);  // 5000 tokens
  for (size_t r = 2; r < k.size(); ++r) EXPECT_EQ(k[r], 1);
  const std::vector<int> two = plan({3000, 65, 2600}, 3);
  EXPECT_GE(two[0], 3);
  EXPECT_GE(two[1], 3);
  EXPECT_EQ(two[2], 1);
}

// The kept-state CUDA test whose output is formed in the scan (CudaGdn.SplitKeptStateFourBHeadsOutputInScan:
// five samples at 4B heads) and the trainer's (CudaTrainStep.OneGraphPerSplitKind: 4 value heads)
// rely on these plans.
TEST(GdnPlan, PlansTheGpuTestsRelyOn) {
  EXPECT_EQ(plan({6000, 100, 100, 100, 64}, 32), (std::vector<int>{5, 1, 1, 1, 1}));
  EXPECT_GE(plan({3000, 900, 65, 3}, 4)[0], 3);
}

// A limit of the model, pinned: at 27B heads (48) one 8192-token sample is not split. Its 5 slots
// allow k <= 5, and the first wave's items (2 k - 3 per head) then fill more than two waves of the
// SMs, which the estimate (whole waves of equal segments) prices above the unsplit chain.
TEST(GdnPlan, TwentySevenBHeadsLongSampleNotSplit) {
  EXPECT_EQ(plan({8192}, 48), std::vector<int>{1});
}

// Many long samples and few slots (48 value heads: 5): the longest first, the rest unsplit.
TEST(GdnPlan, SlotsBoundTheSplit) {
  const std::vector<int> k = plan({4000, 3900, 3800, 3700}, 48);
  EXPECT_LE(std::accumulate(k.begin(), k.end(), 0) - static_cast<int>(k.size()) + 1, slots_for(48));
}

// Samples too short for three segments of kMinSegChunks chunks are never split, however idle the GPU.
TEST(GdnPlan, ShortSamplesAreNeverSplit) {
  EXPECT_FALSE(gdn_plan::split_worth_trying(700, 12, {32, 1, kSms}));
  for (int k : plan({700}, 1)) EXPECT_EQ(k, 1);
}

}  // namespace
}  // namespace qt
