#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "model/decoder.h"

namespace qt {

std::vector<int32_t> generate(Qwen35Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opts) {
  QT_CHECK(!prompt.empty(), "generate: empty prompt");
  const int64_t V = model.config().vocab_size;
  std::mt19937_64 rng(opts.seed);
  IncrementalDecoder dec(model);
  const std::vector<float>* logits = nullptr;
  for (int32_t t : prompt) logits = &dec.step(t);
  std::vector<int32_t> out;
  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    const float* last = logits->data();
    int32_t next = 0;
    if (opts.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    } else {
      std::vector<int32_t> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      int64_t k = opts.top_k > 0 ? std::min(opts.top_k, V) : V;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return last[a] > last[b]; });
      std::vector<double> p(static_cast<size_t>(k));
      const double mx = last[idx[0]];
      for (int64_t i = 0; i < k; ++i) p[static_cast<size_t>(i)] = std::exp((last[idx[static_cast<size_t>(i)]] - mx) / opts.temperature);
      std::discrete_distribution<int64_t> dist(p.begin(), p.end());
      next = idx[static_cast<size_t>(dist(rng))];
    }
    out.push_back(next);
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), next) != opts.stop_ids.end()) break;
    if (n + 1 < opts.max_new_tokens) logits = &dec.step(next);
  }
  return out;
}

}  // namespace qt
