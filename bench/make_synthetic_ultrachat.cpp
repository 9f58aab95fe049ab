// A synthetic stand-in for HuggingFaceH4/ultrachat_200k, laid out as the hub keeps it, for
// measuring `qwentune prepare` on a set of that size without downloading it:
//   OUT/data/train_sft-0000i-of-0000K-synthetic.parquet   (--rows conversations over --shards files)
//   OUT/data/test_sft-00000-of-00001-synthetic.parquet    (--test-rows conversations)
// Columns as ultrachat's: prompt, prompt_id, messages list<struct<content, role>>; snappy pages,
// 1000-row row groups. Length mix: 1-5 turns (uniform), user turns ~480 and assistant turns ~2,100
// characters on average (log-normal), i.e. ~7,700 characters or ~1,400 tokens (under --tokenizer
// below) per conversation, ~1.6 GB of text for 208k conversations. English-like words from a fixed
// list, so compression and tokenization see word-shaped text, not noise.
// --tokenizer FILE also writes a byte-level BPE tokenizer.json (Qwen3.5 split regex and added
// tokens) whose merges are learnt on this text, so a conversation comes to roughly the token count
// the real set has under Qwen's tokenizer (the tiny preset's tokenizer splits it ~4x finer).
//
//   build-cpu/tests/make_synthetic_ultrachat --out /tmp/ultrachat_synth --rows 207865
//       --tokenizer /tmp/ultrachat_synth/tokenizer.json   (one command line)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parquet_test_writer.h"
#include "text/bpe_builder.h"

namespace {

const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this",
    "are", "or", "from", "an", "which", "can", "have", "their", "more", "also", "has", "one", "other", "these",
    "people", "time", "system", "example", "important", "different", "process", "provide", "information",
    "development", "research", "community", "environment", "experience", "technology", "understanding",
    "however", "therefore", "significant", "especially", "approach", "culture", "history", "health", "energy",
    "design", "language", "question", "answer", "model", "data", "water", "city", "music", "story", "change",
    "growth", "policy", "market", "quality", "support", "network", "science", "student", "teacher", "family",
    "business", "project", "strategy", "management", "performance", "potential", "challenge", "solution",
    "analysis", "individual", "social", "economic", "political", "natural", "public", "private", "global",
    "local", "creative", "effective", "sustainable", "traditional", "modern", "essay", "article", "recipe",
    "poem", "summary", "describe", "explain", "discuss", "write", "consider", "include", "improve", "create",
    "develop", "ensure", "reduce", "increase", "maintain", "achieve", "identify", "contribute", "benefit"};
constexpr size_t kNumWords = sizeof kWords / sizeof kWords[0];

// About `chars` characters of sentences.
std::string text(std::mt19937_64& rng, double chars) {
  std::uniform_int_distribution<size_t> word(0, kNumWords - 1);
  std::uniform_int_distribution<int> sentence_len(6, 24);
  std::string s;
  while (static_cast<double>(s.size()) < chars) {
    const int n = sentence_len(rng);
    for (int i = 0; i < n; ++i) {
      std::string w = kWords[word(rng)];
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      s += w;
      s += i + 1 == n ? ". " : (rng() % 9 == 0 ? ", " : " ");
    }
    if (rng() % 5 == 0) s += "\n\n";
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

nlohmann::json conversation(std::mt19937_64& rng, int64_t index) {
  std::uniform_int_distribution<int> turns_dist(1, 5);
  // Log-normal lengths with sigma 0.6: mean = exp(mu + sigma^2 / 2).
  std::lognormal_distribution<double> user_len(std::log(480.0) - 0.18, 0.6), reply_len(std::log(2100.0) - 0.18, 0.6);
  const int turns = turns_dist(rng);
  nlohmann::json msgs = nlohmann::json::array();
  std::string prompt;
  for (int t = 0; t < turns; ++t) {
    std::string user = text(rng, user_len(rng));
    if (t == 0) prompt = user;
    msgs.push_back({{"content", std::move(user)}, {"role", "user"}});
    msgs.push_back({{"content", text(rng, reply_len(rng))}, {"role", "assistant"}});
  }
  char id[24];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(index * 0x9e3779b97f4a7c15ull));
  return {{"prompt", std::move(prompt)}, {"prompt_id", id}, {"messages", std::move(msgs)}};
}

void write_shard(const std::string& path, std::mt19937_64& rng, int64_t first, int64_t rows) {
  std::vector<nlohmann::json> r;
  r.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) r.push_back(conversation(rng, first + i));
  qt::testing::PqWriteOptions o;
  o.codec = 1;  // snappy
  o.rows_per_group = 1000;
  qt::testing::pq_write_file(path, qt::testing::pq_ultrachat_schema(), r, o);
  std::fprintf(stderr, "%s: %lld rows, %.1f MiB\n", path.c_str(), static_cast<long long>(rows),
               static_cast<double>(std::filesystem::file_size(path)) / (1 << 20));
}

void write_tokenizer(const std::string& path, uint64_t seed) {
  std::mt19937_64 rng(seed + 1);
  std::string corpus;
  for (int i = 0; i < 40; ++i) corpus += text(rng, 2000) + "\n";
  const auto merges = qt::bpe_train_merges(corpus, 1200);
  const auto added = qt::qwen_added_tokens(static_cast<int64_t>(256 + merges.size()));
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "%s: cannot write\n", path.c_str());
    std::exit(1);
  }
  const std::string j = qt::bpe_tokenizer_json(merges, added, qt::kQwen35SplitRegex).dump();
  std::fwrite(j.data(), 1, j.size(), f);
  std::fclose(f);
  std::fprintf(stderr, "%s: %zu merges\n", path.c_str(), merges.size());
}

int usage() {
  std::fprintf(stderr,
               "usage: make_synthetic_ultrachat --out DIR [--rows 207865] [--test-rows 23110] [--shards 12] [--seed 0] "
               "[--tokenizer FILE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, tokenizer;
  int64_t rows = 207865, test_rows = 23110, shards = 12;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out") out = v;
    else if (k == "--rows") rows = std::atoll(v.c_str());
    else if (k == "--test-rows") test_rows = std::atoll(v.c_str());
    else if (k == "--shards") shards = std::atoll(v.c_str());
    else if (k == "--tokenizer") tokenizer = v;
    else if (k == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else return usage();
  }
  if (out.empty() || rows <= 0 || shards <= 0 || test_rows < 0 || argc % 2 == 0) return usage();
  const std::filesystem::path dir = std::filesystem::path(out) / "data";
  std::filesystem::create_directories(dir);
  if (!tokenizer.empty()) write_tokenizer(tokenizer, seed);
  std::mt19937_64 rng(seed);
  char name[96];
  int64_t done = 0;
  for (int64_t s = 0; s < shards; ++s) {
    const int64_t n = rows * (s + 1) / shards - done;
    std::snprintf(name, sizeof name, "train_sft-%05lld-of-%05lld-synthetic.parquet", static_cast<long long>(s),
                  static_cast<long long>(shards));
    write_shard((dir / name).string(), rng, done, n);
    done += n;
  }
  if (test_rows > 0) write_shard((dir / "test_sft-00000-of-00001-synthetic.parquet").string(), rng, done, test_rows);
  return 0;
}
