// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the kind Qwen uses): NFC
// normalizer, Split pre-tokenizer regex taken from the file, ByteLevel mapping, BPE merges by
// rank, added/special tokens matched in the raw text before BPE exactly as HF `tokenizers` does.
// encode() gives the same ids as HF `tokenizers` with add_special_tokens=False.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qt {

class Tokenizer {
 public:
  // Throws qt::Error naming the file and what is wrong (unsupported model type, bad regex, ...).
  static Tokenizer load(const std::string& tokenizer_json_path);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe. Invalid UTF-8 throws qt::Error (offset named) unless fix_utf8 replaces it with U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool fix_utf8 = false) const;
  // encode(), appending to out (no allocation beyond out's growth once the thread is warm).
  void encode_append(std::string_view text, std::vector<int32_t>& out, bool fix_utf8 = false) const;
  // Invalid UTF-8 replaced by U+FFFD per maximal ill-formed subsequence (Rust's from_utf8_lossy).
  static std::string fix_utf8(std::string_view text);
  std::string decode(const std::vector<int32_t>& ids) const;

  // Any token of the vocabulary or the added tokens, by its string form.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Highest id + 1 over the vocabulary and the added tokens.
  int64_t vocab_size() const;
  // `token` is one of tokenizer.json's added tokens (matched before BPE, never split).
  bool is_added_token(std::string_view token) const;
  // decode() knows id (ids can have gaps, and a model's vocab_size is often larger).
  bool has_id(int32_t id) const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Chat data is rendered with ChatML: an error naming the file when <|im_start|> or <|im_end|> is
// not an added token of the tokenizer (its markers would be byte-split and trained as text).
void check_chat_tokenizer(const Tokenizer& tok);

}  // namespace qt
