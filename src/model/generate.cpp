#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "model/decoder.h"

namespace qt {

GenerateResult generate(Qwen35Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opts) {
  QT_CHECK(!prompt.empty(), "generate: empty prompt");
  QT_CHECK(std::isfinite(opts.temperature) && opts.temperature >= 0, "generate: temperature ", opts.temperature,
           " must be a finite number >= 0");
  QT_CHECK(opts.top_k >= 0, "generate: top_k ", opts.top_k, " must be >= 0");
  const int64_t V = model.config().vocab_size;
  const int64_t max_pos = model.config().max_position_embeddings;
  QT_CHECK(opts.allowed_ids.empty() || static_cast<int64_t>(opts.allowed_ids.size()) <= V,
           "generate: allowed_ids has ", opts.allowed_ids.size(), " entries, vocab_size is ", V);
  const bool masked = !opts.allowed_ids.empty();
  auto allowed = [&](int64_t id) { return !masked || (id < static_cast<int64_t>(opts.allowed_ids.size()) && opts.allowed_ids[size_t(id)]); };
  std::mt19937_64 rng(opts.seed);
  IncrementalDecoder dec(model);
  const std::vector<float>* logits = nullptr;
  for (int32_t t : prompt) logits = &dec.step(t);
  GenerateResult r;
  r.stop_reason = "max_new_tokens";
  std::vector<float> scores(static_cast<size_t>(V));
  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    if (static_cast<int64_t>(prompt.size()) + n >= max_pos) {
      r.stop_reason = "max_position_embeddings";
      break;
    }
    for (int64_t i = 0; i < V; ++i)
      scores[size_t(i)] = allowed(i) ? (*logits)[size_t(i)] : -std::numeric_limits<float>::infinity();
    const float* last = scores.data();
    int32_t next = 0;
    if (opts.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    } else {
      std::vector<int32_t> idx;
      idx.reserve(static_cast<size_t>(V));
      for (int32_t i = 0; i < V; ++i)
        if (allowed(i)) idx.push_back(i);
      QT_CHECK(!idx.empty(), "generate: no id may be generated (allowed_ids is all false)");
      const int64_t n_ok = static_cast<int64_t>(idx.size());
      const int64_t k = opts.top_k > 0 ? std::min(opts.top_k, n_ok) : n_ok;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return last[a] > last[b]; });
      std::vector<double> p(static_cast<size_t>(k));
      const double mx = last[idx[0]];
      for (int64_t i = 0; i < k; ++i) p[static_cast<size_t>(i)] = std::exp((last[idx[static_cast<size_t>(i)]] - mx) / opts.temperature);
      std::discrete_distribution<int64_t> dist(p.begin(), p.end());
      next = idx[static_cast<size_t>(dist(rng))];
    }
    r.ids.push_back(next);
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), next) != opts.stop_ids.end()) {
      r.stop_reason = "stop token";
      break;
    }
    if (n + 1 < opts.max_new_tokens) logits = &dec.step(next);
  }
  return r;
}

}  // namespace qt
