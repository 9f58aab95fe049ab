// Small helpers shared by the CPU reference op files (internal to src/ops/cpu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/parallel.h"

namespace qt::ref::detail {

template <typename S>
inline S sigmoid(S x) {
  return S(1) / (S(1) + std::exp(-x));
}
template <typename S>
inline S silu(S x) {
  return x * sigmoid(x);
}
// d/dx silu(x) = s (1 + x (1 - s)), s = sigmoid(x).
template <typename S>
inline S silu_grad(S x) {
  S s = sigmoid(x);
  return s * (S(1) + x * (S(1) - s));
}

// Column sums that do not depend on the thread count: rows are split into fixed blocks of
// kRowBlock, each block sums into its own partial (in row order), and the partials are added to
// acc in block order. fn(r, partial) handles row r: it adds row r's contribution to partial[0,width)
// and may write per-row outputs. acc == nullptr still runs fn (for the per-row outputs).
constexpr int64_t kRowBlock = 64;
template <typename S, typename RowFn>
void rows_with_column_sums(int64_t rows, int64_t width, S* acc, RowFn fn) {
  const int64_t nblocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<S> partials(static_cast<size_t>(nblocks * width), S(0));
  parallel_for(nblocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      S* part = partials.data() + b * width;
      const int64_t r1 = std::min(rows, (b + 1) * kRowBlock);
      for (int64_t r = b * kRowBlock; r < r1; ++r) fn(r, part);
    }
  });
  if (acc == nullptr) return;
  for (int64_t b = 0; b < nblocks; ++b)
    for (int64_t c = 0; c < width; ++c) acc[c] += partials[static_cast<size_t>(b * width + c)];
}

// seq_start[t] = the first token of t's sample.
inline std::vector<int64_t> sequence_starts(const int32_t* cu, int num_seqs, int64_t T) {
  std::vector<int64_t> start(static_cast<size_t>(T), 0);
  for (int s = 0; s < num_seqs; ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) start[static_cast<size_t>(t)] = cu[s];
  return start;
}

}  // namespace qt::ref::detail

// Explicit instantiation of a reference op for float and double.
#define QT_REF_INSTANTIATE(fn)                  \
  template decltype(fn<float>) fn<float>;       \
  template decltype(fn<double>) fn<double>
