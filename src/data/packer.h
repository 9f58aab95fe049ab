// Packer: tokenized samples -> static-shape training batches.
//
// Packed mode (default): each batch is one 1-D row of exactly tokens_per_batch tokens holding
// whole samples, chosen by best-fit-decreasing inside a shuffle window:
//   1. the epoch's sample order is a seeded permutation (seed, epoch);
//   2. consecutive windows of shuffle_window samples are packed on their own: longest first, each
//      into the open bin with the least room that still fits it (a new bin if none does); all bins
//      of a window are closed when the window ends;
//   3. the bins of a window are emitted in a seeded random order (BFD fills long-sample bins first).
// Inside a batch, samples sit in placement order. The tail of a bin is one extra padding segment
// (pad_id, labels/targets -100, its own cu_seqlens entry and positions from 0), so cu_seqlens always
// ends at tokens_per_batch and every kernel sees the padding as an isolated sequence.
//   input_ids[t], labels[t]   the samples' ids and unshifted labels (-100 = not trained)
//   targets[t]                labels[t+1] inside the same sample; -100 at each sample's last token
//                             (no target crosses a boundary); the loss is CE(logits[t], targets[t])
//   position_ids[t]           restart at 0 for each sample (and for the padding segment)
//   cu_seqlens                segment starts + total; num_seqs real samples (+1 if padded tail)
// A sample longer than tokens_per_batch is truncated to its first tokens_per_batch tokens
// (Overflow::Truncate, default) or cut into tokens_per_batch chunks packed as independent samples
// (Overflow::Split; a chunk does not see the previous chunk). Samples that end up with no trained
// target are dropped and counted.
//
// Padded mode (the common baseline, for comparisons): the samples in the same shuffled order are
// grouped greedily into rectangles of rows x longest, as many rows as keep rows*longest within
// tokens_per_batch; each row is one sample padded at its end. The Batch has rows > 1, row_len =
// longest, and cu_seqlens has one entry per row.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qt {

// Tokenized dataset in flat arrays: sample i is [offsets[i], offsets[i+1]).
struct TokenizedDataset {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;   // unshifted; -100 = not trained
  std::vector<int64_t> offsets{0};
  int64_t num_samples() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)]; }
  int64_t num_tokens() const { return static_cast<int64_t>(input_ids.size()); }
  void add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labs);
};

enum class PackMode { Packed, Padded };
enum class Overflow { Truncate, Split };
PackMode pack_mode_from_name(const std::string& name);
Overflow overflow_from_name(const std::string& name);
const char* pack_mode_name(PackMode m);
const char* overflow_name(Overflow o);

struct PackOptions {
  int64_t tokens_per_batch = 8192;
  int64_t shuffle_window = 10000;  // samples per best-fit window
  uint64_t seed = 0;
  PackMode mode = PackMode::Packed;
  Overflow overflow = Overflow::Truncate;
  int32_t pad_id = 0;
};

// A piece of a sample placed in a batch.
struct PackItem {
  int64_t sample = 0;
  int64_t begin = 0;  // token offset inside the sample
  int64_t len = 0;
};

struct PackedBin {
  std::vector<PackItem> items;
  int64_t tokens = 0;   // real tokens
  int64_t row_len = 0;  // padded mode: longest item; packed mode: tokens_per_batch
};

struct PackStats {
  int64_t samples = 0;           // samples in the dataset
  int64_t tokens = 0;            // tokens placed in batches (after truncation)
  int64_t trained_targets = 0;   // targets != -100 over all batches
  int64_t truncated = 0;         // samples cut to tokens_per_batch (Truncate)
  int64_t truncated_tokens = 0;  // tokens dropped by truncation
  int64_t split = 0;             // samples cut into chunks (Split)
  int64_t dropped_untrained = 0; // samples / chunks with no trained target, not packed
  int64_t batches = 0;
  int64_t capacity = 0;          // batches * tokens_per_batch (packed) or sum rows*row_len (padded)
  double fill_ratio() const { return capacity ? static_cast<double>(tokens) / static_cast<double>(capacity) : 0.0; }
};

struct PackPlan {
  std::vector<PackedBin> bins;
  PackStats stats;
};

// Deterministic in (dataset lengths and labels, opts, epoch).
PackPlan pack_plan(const TokenizedDataset& data, const PackOptions& opts, int64_t epoch);

struct Batch {
  int64_t epoch = 0, index = 0;        // position of this batch
  int64_t rows = 1, row_len = 0;       // rows * row_len tokens
  std::vector<int32_t> input_ids;      // (rows * row_len)
  std::vector<int32_t> labels;         // (rows * row_len)
  std::vector<int32_t> targets;        // (rows * row_len)
  std::vector<int32_t> position_ids;   // (rows * row_len)
  std::vector<int32_t> cu_seqlens;     // (segments + 1)
  int64_t num_seqs = 0;                // real samples (the padding segment not counted)
  int64_t max_seqlen = 0;              // longest segment
  int64_t num_tokens = 0;              // real tokens
  int64_t num_targets = 0;             // targets != -100
};

Batch pack_materialize(const TokenizedDataset& data, const PackedBin& bin, const PackOptions& opts);

}  // namespace qt
