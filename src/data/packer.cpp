#include "data/packer.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/splitmix.h"

namespace qt {
namespace {

constexpr int32_t kIgnore = -100;

using Rng = SplitMix64;

template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

int64_t piece_targets(const TokenizedDataset& d, const PackItem& p) {
  const int64_t base = d.offsets[static_cast<size_t>(p.sample)] + p.begin;
  int64_t n = 0;
  for (int64_t t = 1; t < p.len; ++t) n += d.labels[static_cast<size_t>(base + t)] != kIgnore;
  return n;
}

}  // namespace

void TokenizedDataset::add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labs) {
  QT_CHECK(ids.size() == labs.size(), "sample has ", ids.size(), " ids but ", labs.size(), " labels");
  input_ids.insert(input_ids.end(), ids.begin(), ids.end());
  labels.insert(labels.end(), labs.begin(), labs.end());
  offsets.push_back(static_cast<int64_t>(input_ids.size()));
}

PackMode pack_mode_from_name(const std::string& name) {
  if (name == "packed") return PackMode::Packed;
  if (name == "padded") return PackMode::Padded;
  QT_FAIL("packing mode '", name, "' is not one of packed, padded");
}

Overflow overflow_from_name(const std::string& name) {
  if (name == "truncate") return Overflow::Truncate;
  if (name == "split") return Overflow::Split;
  QT_FAIL("overflow '", name, "' is not one of truncate, split");
}

const char* pack_mode_name(PackMode m) { return m == PackMode::Packed ? "packed" : "padded"; }
const char* overflow_name(Overflow o) { return o == Overflow::Truncate ? "truncate" : "split"; }

PackPlan pack_plan(const TokenizedDataset& data, const PackOptions& opts, int64_t epoch) {
  const int64_t T = opts.tokens_per_batch;
  QT_CHECK(T >= 2, "tokens_per_batch must be at least 2 (got ", T, ")");
  QT_CHECK(opts.shuffle_window >= 1, "shuffle_window must be at least 1 (got ", opts.shuffle_window, ")");
  PackPlan plan;
  PackStats& st = plan.stats;
  st.samples = data.num_samples();

  Rng rng{opts.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ull + 1};
  std::vector<int64_t> order(static_cast<size_t>(data.num_samples()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  shuffle(order, rng);

  // Samples -> pieces that fit a bin, in shuffled order.
  std::vector<PackItem> pieces;
  pieces.reserve(order.size());
  for (int64_t s : order) {
    const int64_t len = data.length(s);
    std::vector<PackItem> parts;
    if (len <= T) {
      parts.push_back({s, 0, len});
    } else if (opts.overflow == Overflow::Truncate) {
      st.truncated++;
      st.truncated_tokens += len - T;
      parts.push_back({s, 0, T});
    } else {
      st.split++;
      for (int64_t b = 0; b < len; b += T) parts.push_back({s, b, std::min(T, len - b)});
    }
    for (const auto& p : parts) {
      const int64_t n = piece_targets(data, p);
      if (n == 0) {
        st.dropped_untrained++;
        continue;
      }
      st.tokens += p.len;
      st.trained_targets += n;
      pieces.push_back(p);
    }
  }

  const size_t W = static_cast<size_t>(opts.shuffle_window);
  if (opts.mode == PackMode::Padded) {
    PackedBin cur;
    for (const auto& p : pieces) {
      const int64_t row_len = std::max(cur.row_len, p.len);
      if (!cur.items.empty() && static_cast<int64_t>(cur.items.size() + 1) * row_len > T) {
        plan.bins.push_back(std::move(cur));
        cur = PackedBin{};
      }
      cur.items.push_back(p);
      cur.tokens += p.len;
      cur.row_len = std::max(cur.row_len, p.len);
    }
    if (!cur.items.empty()) plan.bins.push_back(std::move(cur));
    for (const auto& b : plan.bins) st.capacity += static_cast<int64_t>(b.items.size()) * b.row_len;
  } else {
    for (size_t w0 = 0; w0 < pieces.size(); w0 += W) {
      const size_t w1 = std::min(pieces.size(), w0 + W);
      std::vector<size_t> idx;
      for (size_t i = w0; i < w1; ++i) idx.push_back(i);
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return pieces[a].len > pieces[b].len; });
      std::vector<PackedBin> bins;
      std::multimap<int64_t, size_t> room;  // free tokens -> bin
      for (size_t i : idx) {
        const PackItem& p = pieces[i];
        auto it = room.lower_bound(p.len);
        size_t b;
        if (it == room.end()) {
          b = bins.size();
          bins.push_back(PackedBin{});
          bins.back().row_len = T;
        } else {
          b = it->second;
          room.erase(it);
        }
        bins[b].items.push_back(p);
        bins[b].tokens += p.len;
        if (bins[b].tokens < T) room.emplace(T - bins[b].tokens, b);
      }
      shuffle(bins, rng);
      for (auto& b : bins) plan.bins.push_back(std::move(b));
    }
    st.capacity = static_cast<int64_t>(plan.bins.size()) * T;
  }
  st.batches = static_cast<int64_t>(plan.bins.size());
  return plan;
}

Batch pack_materialize(const TokenizedDataset& data, const PackedBin& bin, const PackOptions& opts) {
  Batch b;
  const bool padded = opts.mode == PackMode::Padded;
  b.rows = padded ? static_cast<int64_t>(bin.items.size()) : 1;
  b.row_len = padded ? bin.row_len : opts.tokens_per_batch;
  const size_t n = static_cast<size_t>(b.rows * b.row_len);
  b.input_ids.assign(n, opts.pad_id);
  b.labels.assign(n, kIgnore);
  b.targets.assign(n, kIgnore);
  b.position_ids.assign(n, 0);
  b.cu_seqlens.push_back(0);
  int64_t cursor = 0;
  for (const PackItem& p : bin.items) {
    QT_CHECK(p.len <= b.row_len && (padded || cursor + p.len <= b.row_len), "packed bin overflows its batch");
    const size_t src = static_cast<size_t>(data.offsets[static_cast<size_t>(p.sample)] + p.begin);
    const size_t dst = static_cast<size_t>(cursor);
    for (int64_t t = 0; t < p.len; ++t) {
      const size_t k = static_cast<size_t>(t);
      b.input_ids[dst + k] = data.input_ids[src + k];
      b.labels[dst + k] = data.labels[src + k];
      b.position_ids[dst + k] = static_cast<int32_t>(t);
      if (t + 1 < p.len) {
        b.targets[dst + k] = data.labels[src + k + 1];
        b.num_targets += b.targets[dst + k] != kIgnore;
      }
    }
    b.num_tokens += p.len;
    b.num_seqs++;
    if (padded) {
      for (int64_t t = p.len; t < b.row_len; ++t) b.position_ids[dst + static_cast<size_t>(t)] = static_cast<int32_t>(t);
      cursor += b.row_len;
      b.max_seqlen = std::max(b.max_seqlen, b.row_len);
    } else {
      cursor += p.len;
      b.max_seqlen = std::max(b.max_seqlen, p.len);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(cursor));
  }
  if (!padded && cursor < b.row_len) {  // the padding segment
    for (int64_t t = cursor; t < b.row_len; ++t) b.position_ids[static_cast<size_t>(t)] = static_cast<int32_t>(t - cursor);
    b.max_seqlen = std::max(b.max_seqlen, b.row_len - cursor);
    b.cu_seqlens.push_back(static_cast<int32_t>(b.row_len));
  }
  return b;
}

}  // namespace qt
