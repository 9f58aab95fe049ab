// Text generation with a Qwen35Model's weights: greedy or temperature/top-k sampling until a stop
// token, decoding incrementally (KV cache + recurrent GDN state, model/decoder.h) on the CPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/qwen35.h"

namespace qt {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = whole vocabulary
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  // Ids that may be generated (a model's vocab_size is often larger than its tokenizer's: ids
  // without a token are never sampled); empty = all.
  std::vector<bool> allowed_ids;
};

struct GenerateResult {
  std::vector<int32_t> ids;  // without the prompt; a final stop id is included
  std::string stop_reason;   // "stop token", "max_new_tokens" or "max_position_embeddings"
};

GenerateResult generate(Qwen35Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opts);

}  // namespace qt
