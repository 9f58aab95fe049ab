#include "text/bpe_builder.h"

#include <map>

#include "core/error.h"

namespace qt {

const char* const kQwen35SplitRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2SplitRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

namespace {

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

enum class CharClass { Letter, Digit, Space, Other };
CharClass classify(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CharClass::Letter;
  if (c >= '0' && c <= '9') return CharClass::Digit;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return CharClass::Space;
  return CharClass::Other;
}

// Rough ASCII version of the Qwen split: " word", single digits, punctuation runs, whitespace.
std::vector<std::string> rough_split(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' && i + 1 < text.size() && classify(static_cast<unsigned char>(text[i + 1])) == CharClass::Letter) ++j;
    CharClass k = classify(static_cast<unsigned char>(text[j]));
    if (k == CharClass::Digit) {
      ++j;
    } else {
      while (j < text.size() && classify(static_cast<unsigned char>(text[j])) == k) ++j;
    }
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& byte_level_alphabet() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = utf8_encode(printable ? b : 256 + extra++);
    }
    return t;
  }();
  return table;
}

std::vector<std::pair<std::string, std::string>> bpe_train_merges(const std::string& corpus, int num_merges) {
  const auto& alpha = byte_level_alphabet();
  std::map<std::string, int64_t> word_counts;
  for (const auto& w : rough_split(corpus)) word_counts[w]++;
  struct Word {
    std::vector<std::string> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, n] : word_counts) {
    Word wd{{}, n};
    for (unsigned char c : w) wd.symbols.push_back(alpha[c]);
    words.push_back(std::move(wd));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int>(merges.size()) < num_merges) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) pairs[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;  // map order breaks ties deterministically
    if (best->second < 2) break;
    const auto pair = best->first;
    merges.push_back(pair);
    const std::string joined = pair.first + pair.second;
    for (auto& w : words) {
      std::vector<std::string> next;
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == pair.first && w.symbols[i + 1] == pair.second) {
          next.push_back(joined);
          ++i;
        } else {
          next.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(next);
    }
  }
  return merges;
}

std::vector<AddedToken> qwen_added_tokens(int64_t first_id) {
  static const char* const names[] = {
      "<|endoftext|>",     "<|im_start|>",       "<|im_end|>",      "<|object_ref_start|>", "<|object_ref_end|>",
      "<|box_start|>",     "<|box_end|>",        "<|quad_start|>",  "<|quad_end|>",         "<|vision_start|>",
      "<|vision_end|>",    "<|vision_pad|>",     "<|image_pad|>",   "<|video_pad|>",        "<tool_call>",
      "</tool_call>",      "<|fim_prefix|>",     "<|fim_middle|>",  "<|fim_suffix|>",       "<|fim_pad|>",
      "<|repo_name|>",     "<|file_sep|>",       "<tool_response>", "</tool_response>",     "<think>",
      "</think>"};
  std::vector<AddedToken> out;
  for (int i = 0; i < 26; ++i) out.push_back({first_id + i, names[i], i < 14});  // 248058..69 are not special
  return out;
}

nlohmann::ordered_json bpe_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                          const std::vector<AddedToken>& added, const std::string& split_regex) {
  using oj = nlohmann::ordered_json;
  oj vocab = oj::object();
  const auto& alpha = byte_level_alphabet();
  int64_t next = 0;
  for (int b = 0; b < 256; ++b) vocab[alpha[static_cast<size_t>(b)]] = next++;
  oj merge_list = oj::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;  // two merges may build the same token
    merge_list.push_back({a, b});
  }
  oj added_list = oj::array();
  for (const auto& t : added) {
    QT_CHECK(t.id >= next, "added token ", t.content, " id ", t.id, " collides with the BPE vocabulary");
    added_list.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", t.special}});
  }
  const oj byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  oj j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added_list;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", split_regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                          byte_level}}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},       {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab},
                {"merges", merge_list}};
  return j;
}

nlohmann::ordered_json bpe_tokenizer_config_json(const std::vector<AddedToken>& added, int64_t model_max_length) {
  using oj = nlohmann::ordered_json;
  oj decoder = oj::object();
  for (const auto& t : added)
    decoder[std::to_string(t.id)] = {{"content", t.content}, {"lstrip", false}, {"normalized", false},
                                     {"rstrip", false}, {"single_word", false}, {"special", t.special}};
  oj j;
  j["add_bos_token"] = false;
  j["add_prefix_space"] = false;
  j["added_tokens_decoder"] = decoder;
  j["bos_token"] = nullptr;
  j["eos_token"] = "<|im_end|>";
  j["pad_token"] = "<|endoftext|>";
  j["unk_token"] = nullptr;
  j["errors"] = "replace";
  j["model_max_length"] = model_max_length;
  j["split_special_tokens"] = false;
  j["tokenizer_class"] = "Qwen2Tokenizer";
  j["chat_template"] =
      "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + "
      "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  return j;
}

}  // namespace qt
