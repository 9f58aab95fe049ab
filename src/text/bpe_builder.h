// Builds byte-level BPE tokenizer.json files in the format Hugging Face `tokenizers` reads: used
// by `init-model` to give every random model directory a working tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt {

struct AddedToken {
  int64_t id;
  std::string content;
  bool special;
};

// GPT-2's byte -> printable code point mapping, as UTF-8 strings (index = byte value).
const std::vector<std::string>& byte_level_alphabet();

// The Qwen3.5 split regex (marks count as letters) and the Qwen2/3 one.
extern const char* const kQwen35SplitRegex;
extern const char* const kQwen2SplitRegex;

// Learns `num_merges` merges over a corpus (pre-split roughly like the Qwen regex), in the
// byte-level alphabet. Deterministic: ties go to the lexicographically smallest pair.
std::vector<std::pair<std::string, std::string>> bpe_train_merges(const std::string& corpus, int num_merges);

// The 26 added tokens of Qwen3.5's tokenizer.json, numbered from first_id (248044 in real models).
std::vector<AddedToken> qwen_added_tokens(int64_t first_id);

// tokenizer.json: vocab = 256 byte symbols (ids 0..255) + one token per merge, then `added`.
nlohmann::ordered_json bpe_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                          const std::vector<AddedToken>& added, const std::string& split_regex);
// tokenizer_config.json with the ChatML special tokens and a ChatML chat template.
nlohmann::ordered_json bpe_tokenizer_config_json(const std::vector<AddedToken>& added, int64_t model_max_length);

}  // namespace qt
