// Data pipeline: readers (schemas and every bad input), token cache, packer properties, loader.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "data/loader.h"
#include "data/packer.h"
#include "data/readers.h"
#include "data/token_cache.h"
#include "test_util.h"
#include "text/bpe_builder.h"
#include "text/tokenizer.h"

namespace qt {
namespace {

std::string data_file(const std::string& name) { return testing::testdata_dir() + "/data/" + name; }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// ---- readers ---------------------------------------------------------------------------------

TEST(DataReaders, UltrachatJsonl) {
  ReadStats st;
  const auto s = read_samples(data_file("ultrachat.jsonl"), {}, &st);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(st.rows, 3);
  EXPECT_EQ(st.schema_by_file.begin()->second, "ultrachat");
  EXPECT_EQ(s[1].messages.size(), 5u);
  EXPECT_EQ(s[1].messages[0].role, ChatRole::System);
  EXPECT_EQ(s[2].line, 4);  // the blank line 3 is skipped, line numbers stay physical
  EXPECT_EQ(s[2].location(), data_file("ultrachat.jsonl") + ":4");
}

TEST(DataReaders, ShareGptJsonArray) {
  ReadStats st;
  const auto s = read_samples(data_file("sharegpt.json"), {}, &st);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(st.schema_by_file.begin()->second, "sharegpt");
  EXPECT_EQ(s[0].line, 2);
  EXPECT_EQ(s[1].line, 3);
  EXPECT_EQ(s[0].messages[1].role, ChatRole::User);
  EXPECT_EQ(s[0].messages[2].role, ChatRole::Assistant);
  EXPECT_EQ(s[0].messages[2].content, "Hello.");
}

TEST(DataReaders, Alpaca) {
  const auto s = read_samples(data_file("alpaca.jsonl"), {});
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(s[0].messages.size(), 2u);
  EXPECT_EQ(s[0].messages[0].content, "Translate to French.\n\nGood morning");
  EXPECT_EQ(s[0].messages[1].content, "Bonjour");
  EXPECT_EQ(s[1].messages[0].content, "Give a synonym for happy.");
}

TEST(DataReaders, Tokenized) {
  const auto s = read_samples(data_file("tokenized.jsonl"), {});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0].pretokenized);
  EXPECT_EQ(s[0].labels, (std::vector<int32_t>{-100, -100, 3, 4, 5}));
  EXPECT_TRUE(s[1].labels.empty());
}

TEST(DataReaders, ForcedSchemaMismatch) {
  ReadOptions o;
  o.schema = DataSchema::ShareGpt;
  EXPECT_ERROR_CONTAINS([&] { read_samples(data_file("ultrachat.jsonl"), o); }, "ultrachat.jsonl:1:",
                        "missing field 'conversations'");
}

TEST(DataReaders, MalformedJsonLine) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("bad_json.jsonl"), {}); }, "bad_json.jsonl:2:", "malformed JSON",
                        "\"broken\"");
  ReadOptions o;
  o.skip_bad_rows = true;
  ReadStats st;
  const auto s = read_samples(data_file("bad_json.jsonl"), o, &st);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(st.rows, 3);
  EXPECT_EQ(st.bad_rows, 1);
  EXPECT_EQ(st.bad_by_reason["malformed JSON"], 1);
  ASSERT_EQ(st.bad_examples.size(), 1u);
  EXPECT_NE(st.bad_examples[0].find("bad_json.jsonl:2:"), std::string::npos);
}

TEST(DataReaders, MalformedJsonArrayElement) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("bad_array.json"), {}); }, "bad_array.json:3:", "malformed JSON");
  testing::ScratchDir dir("data-array");
  write_file(dir.file("open.json"), "[\n {\"messages\": []},\n");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("open.json"), {}); }, "open.json:", "unterminated JSON array");
  write_file(dir.file("trail.json"), "[]\nxyz");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("trail.json"), {}); }, "trail.json:2:", "after the JSON array");
}

TEST(DataReaders, UnknownRole) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("bad_role.jsonl"), {}); }, "bad_role.jsonl:2:", "messages[1]",
                        "unknown role 'robot'");
}

TEST(DataReaders, EmptyConversation) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("empty_conversation.jsonl"), {}); }, "empty_conversation.jsonl:1:",
                        "empty conversation");
}

TEST(DataReaders, NoAssistantTurn) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("no_assistant.jsonl"), {}); }, "no_assistant.jsonl:2:",
                        "no assistant turn");
  ReadOptions o;
  o.skip_bad_rows = true;
  ReadStats st;
  EXPECT_EQ(read_samples(data_file("no_assistant.jsonl"), o, &st).size(), 1u);
  EXPECT_EQ(st.bad_by_reason["no assistant turn"], 1);
}

TEST(DataReaders, InvalidUtf8RejectedOrFixed) {
  EXPECT_ERROR_CONTAINS([] { read_samples(data_file("bad_utf8.jsonl"), {}); }, "bad_utf8.jsonl:2:", "invalid UTF-8",
                        "--fix-utf8", "\\xe9");
  ReadOptions o;
  o.fix_utf8 = true;
  ReadStats st;
  const auto s = read_samples(data_file("bad_utf8.jsonl"), o, &st);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(st.utf8_fixed, 1);
  EXPECT_EQ(s[1].messages[0].content, "caf\xef\xbf\xbd latte");
}

TEST(DataReaders, Utf8Helpers) {
  EXPECT_EQ(utf8_first_invalid("abc \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(utf8_first_invalid("ab\xc0\xaf"), 2u);      // overlong
  EXPECT_EQ(utf8_first_invalid("\xed\xa0\x80"), 0u);    // surrogate
  EXPECT_EQ(utf8_first_invalid("x\xe2\x82"), 1u);       // truncated
  EXPECT_EQ(utf8_replace_invalid("a\xe2\x82z\xff"), "a\xef\xbf\xbdz\xef\xbf\xbd");
}

TEST(DataReaders, PretokenizedOutOfVocab) {
  ReadOptions o;
  o.vocab_size = 1000;
  EXPECT_ERROR_CONTAINS([&] { read_samples(data_file("bad_vocab.jsonl"), o); }, "bad_vocab.jsonl:2:", "input_ids[1]",
                        "999999999", "vocabulary");
  testing::ScratchDir dir("data-tok");
  write_file(dir.file("len.jsonl"), "{\"input_ids\": [1, 2], \"labels\": [1]}\n");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("len.jsonl"), o); }, "len.jsonl:1:", "labels has 1 entries");
  write_file(dir.file("neg.jsonl"), "{\"input_ids\": [1, -5]}\n");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("neg.jsonl"), o); }, "neg.jsonl:1:", "input_ids[1] = -5");
}

TEST(DataReaders, DirectoryAndExtensions) {
  testing::ScratchDir dir("data-dir");
  write_file(dir.file("b.jsonl"), "{\"instruction\": \"i\", \"output\": \"o\"}\n");
  write_file(dir.file("a.json"), "[{\"instruction\": \"i\", \"output\": \"o\"}]");
  write_file(dir.file("notes.txt"), "ignored");
  const auto files = list_data_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(std::filesystem::path(files[0]).filename(), "a.json");
  EXPECT_EQ(read_dataset({dir.path()}, {}).size(), 2u);
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("notes.txt"), {}); }, "unknown data file extension '.txt'");
  EXPECT_ERROR_CONTAINS([&] { list_data_files(dir.file("missing")); }, "does not exist");
  write_file(dir.file("unknown.jsonl"), "{\"text\": \"hello\"}\n");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("unknown.jsonl"), {}); }, "unknown.jsonl:1:", "cannot detect the schema");
}

// ---- token cache -----------------------------------------------------------------------------

std::string write_bpe_tokenizer(const testing::ScratchDir& dir) {
  const auto merges = bpe_train_merges("Hello there, what is the capital of France? Paris is. cats dogs", 100);
  const auto added = qwen_added_tokens(static_cast<int64_t>(256 + merges.size()));
  write_file(dir.file("tokenizer.json"), bpe_tokenizer_json(merges, added, kQwen35SplitRegex).dump());
  return dir.file("tokenizer.json");
}

TEST(DataTokenCache, SecondRunHitsChangedOptionMisses) {
  testing::ScratchDir dir("data-cache");
  const Tokenizer tok = Tokenizer::load(write_bpe_tokenizer(dir));
  std::filesystem::copy_file(data_file("ultrachat.jsonl"), dir.file("chat.jsonl"));
  const std::string cache = dir.file("cache");
  DataOptions o;
  const TokenizeResult a = tokenize_dataset({dir.file("chat.jsonl")}, tok, o, cache, 2);
  EXPECT_FALSE(a.cache_hit);
  EXPECT_TRUE(std::filesystem::exists(a.cache_path));
  EXPECT_EQ(a.data.num_samples(), 3);
  const TokenizeResult b = tokenize_dataset({dir.file("chat.jsonl")}, tok, o, cache, 2);
  EXPECT_TRUE(b.cache_hit);
  EXPECT_EQ(b.key, a.key);
  EXPECT_EQ(b.data.input_ids, a.data.input_ids);
  EXPECT_EQ(b.data.labels, a.data.labels);
  EXPECT_EQ(b.data.offsets, a.data.offsets);
  EXPECT_EQ(b.read_stats.rows, 3);

  DataOptions off = o;
  off.chat.thinking = ThinkingMode::Off;
  const TokenizeResult c = tokenize_dataset({dir.file("chat.jsonl")}, tok, off, cache, 2);
  EXPECT_FALSE(c.cache_hit);
  EXPECT_NE(c.key, a.key);
  // Sample 3 carries reasoning: thinking off drops it from the text; the think blocks are not trained.
  EXPECT_NE(c.data.input_ids, a.data.input_ids);
  EXPECT_EQ(c.data.offsets[2], a.data.offsets[2]);  // samples 1-2 render the same text ...
  EXPECT_NE(std::vector<int32_t>(c.data.labels.begin(), c.data.labels.begin() + c.data.offsets[2]),
            std::vector<int32_t>(a.data.labels.begin(), a.data.labels.begin() + a.data.offsets[2]));  // ... masked differently

  // Changed data content misses; a damaged cache file is rebuilt.
  write_file(dir.file("chat.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                                     "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  const TokenizeResult d = tokenize_dataset({dir.file("chat.jsonl")}, tok, o, cache, 2);
  EXPECT_FALSE(d.cache_hit);
  EXPECT_EQ(d.data.num_samples(), 1);
  write_file(d.cache_path, "QTTOKCv1 garbage");
  const TokenizeResult e = tokenize_dataset({dir.file("chat.jsonl")}, tok, o, cache, 2);
  EXPECT_FALSE(e.cache_hit);
  EXPECT_EQ(e.data.input_ids, d.data.input_ids);
  EXPECT_TRUE(tokenize_dataset({dir.file("chat.jsonl")}, tok, o, cache, 2).cache_hit);
}

TEST(DataTokenCache, MultiThreadedEqualsSingleThreaded) {
  testing::ScratchDir dir("data-mt");
  const Tokenizer tok = Tokenizer::load(write_bpe_tokenizer(dir));
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "{\"messages\": [{\"role\": \"user\", \"content\": \"question " + std::to_string(i) +
            "\"}, {\"role\": \"assistant\", \"content\": \"answer " + std::string(static_cast<size_t>(i % 17), 'x') + "\"}]}\n";
  write_file(dir.file("many.jsonl"), text);
  const TokenizeResult one = tokenize_dataset({dir.file("many.jsonl")}, tok, {}, "", 1);
  const TokenizeResult two = tokenize_dataset({dir.file("many.jsonl")}, tok, {}, "", 2);
  EXPECT_EQ(one.data.input_ids, two.data.input_ids);
  EXPECT_EQ(one.data.offsets, two.data.offsets);
  EXPECT_EQ(one.data.num_samples(), 200);
}

TEST(DataTokenCache, PretokenizedVocabCheckedAgainstTokenizer) {
  testing::ScratchDir dir("data-vocab");
  const Tokenizer tok = Tokenizer::load(write_bpe_tokenizer(dir));
  EXPECT_ERROR_CONTAINS([&] { tokenize_dataset({data_file("bad_vocab.jsonl")}, tok, {}, "", 1); }, "bad_vocab.jsonl:2:",
                        "outside the vocabulary");
  const TokenizeResult r = tokenize_dataset({data_file("tokenized.jsonl")}, tok, {}, "", 1);
  EXPECT_EQ(r.data.labels, (std::vector<int32_t>{-100, -100, 3, 4, 5, 7, 8, 9}));
}

// ---- packer ----------------------------------------------------------------------------------

// A chat-like length mix: many short exchanges, a long tail, a few over the batch size.
TokenizedDataset synthetic_dataset(int64_t n, uint64_t seed) {
  TokenizedDataset d;
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto rnd = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0;
  };
  for (int64_t i = 0; i < n; ++i) {
    const double u = rnd();
    int64_t len = u < 0.55 ? 30 + static_cast<int64_t>(rnd() * 500)
                : u < 0.90 ? 500 + static_cast<int64_t>(rnd() * 1500)
                : u < 0.99 ? 2000 + static_cast<int64_t>(rnd() * 4000)
                           : 8000 + static_cast<int64_t>(rnd() * 6000);
    std::vector<int32_t> ids(static_cast<size_t>(len)), labels(static_cast<size_t>(len));
    const int64_t prompt = len / 3;
    for (int64_t t = 0; t < len; ++t) {
      ids[static_cast<size_t>(t)] = static_cast<int32_t>((i * 7919 + t) % 50000);
      labels[static_cast<size_t>(t)] = t < prompt ? -100 : ids[static_cast<size_t>(t)];
    }
    d.add(ids, labels);
  }
  return d;
}

void check_batch(const TokenizedDataset& d, const PackedBin& bin, const Batch& b, const PackOptions& o) {
  const int64_t T = o.tokens_per_batch;
  ASSERT_EQ(b.rows, 1);
  ASSERT_EQ(static_cast<int64_t>(b.input_ids.size()), T);
  ASSERT_EQ(b.labels.size(), b.input_ids.size());
  ASSERT_EQ(b.targets.size(), b.input_ids.size());
  ASSERT_EQ(b.position_ids.size(), b.input_ids.size());
  ASSERT_EQ(b.cu_seqlens.front(), 0);
  ASSERT_EQ(b.cu_seqlens.back(), T);
  EXPECT_EQ(b.num_seqs, static_cast<int64_t>(bin.items.size()));
  const int64_t segments = static_cast<int64_t>(b.cu_seqlens.size()) - 1;
  EXPECT_EQ(segments, b.num_seqs + (bin.tokens < T ? 1 : 0));
  int64_t tokens = 0, targets = 0;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t lo = b.cu_seqlens[static_cast<size_t>(s)], hi = b.cu_seqlens[static_cast<size_t>(s) + 1];
    ASSERT_LT(lo, hi);
    const bool pad = s >= b.num_seqs;
    const PackItem* item = pad ? nullptr : &bin.items[static_cast<size_t>(s)];
    if (item) {
      ASSERT_EQ(hi - lo, item->len);
    }
    for (int64_t t = lo; t < hi; ++t) {
      const size_t k = static_cast<size_t>(t);
      EXPECT_EQ(b.position_ids[k], t - lo);
      if (pad) {
        EXPECT_EQ(b.input_ids[k], o.pad_id);
        EXPECT_EQ(b.labels[k], -100);
        EXPECT_EQ(b.targets[k], -100);
        continue;
      }
      const size_t src = static_cast<size_t>(d.offsets[static_cast<size_t>(item->sample)] + item->begin + (t - lo));
      EXPECT_EQ(b.input_ids[k], d.input_ids[src]);
      EXPECT_EQ(b.labels[k], d.labels[src]);
      // No target crosses a boundary: the last token of each sample predicts nothing.
      EXPECT_EQ(b.targets[k], t + 1 < hi ? d.labels[src + 1] : -100);
      targets += b.targets[k] != -100;
    }
    if (!pad) tokens += hi - lo;
  }
  EXPECT_EQ(tokens, bin.tokens);
  EXPECT_EQ(b.num_tokens, bin.tokens);
  EXPECT_EQ(b.num_targets, targets);
}

TEST(Packer, PropertiesTruncate) {
  const TokenizedDataset d = synthetic_dataset(3000, 1);
  PackOptions o;
  o.shuffle_window = 1000;
  o.seed = 7;
  o.pad_id = 248044;
  const PackPlan plan = pack_plan(d, o, 0);
  // Every token accounted for: each sample appears once, whole or truncated to T.
  std::vector<int> seen(static_cast<size_t>(d.num_samples()), 0);
  int64_t tokens = 0;
  for (const auto& bin : plan.bins) {
    EXPECT_LE(bin.tokens, o.tokens_per_batch);
    for (const auto& it : bin.items) {
      seen[static_cast<size_t>(it.sample)]++;
      EXPECT_EQ(it.begin, 0);
      EXPECT_EQ(it.len, std::min(d.length(it.sample), o.tokens_per_batch));
      tokens += it.len;
    }
    check_batch(d, bin, pack_materialize(d, bin, o), o);
  }
  int64_t over = 0, expect_tokens = 0;
  for (int64_t i = 0; i < d.num_samples(); ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "sample " << i;
    over += d.length(i) > o.tokens_per_batch;
    expect_tokens += std::min(d.length(i), o.tokens_per_batch);
  }
  EXPECT_GT(over, 0);
  EXPECT_EQ(plan.stats.truncated, over);
  EXPECT_EQ(tokens, expect_tokens);
  EXPECT_EQ(plan.stats.tokens, expect_tokens);
  EXPECT_EQ(plan.stats.truncated_tokens + expect_tokens, d.num_tokens());
}

TEST(Packer, PropertiesSplit) {
  const TokenizedDataset d = synthetic_dataset(600, 2);
  PackOptions o;
  o.tokens_per_batch = 4096;
  o.overflow = Overflow::Split;
  const PackPlan plan = pack_plan(d, o, 3);
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> pieces;
  for (const auto& bin : plan.bins) {
    for (const auto& it : bin.items) pieces[it.sample].push_back({it.begin, it.len});
    check_batch(d, bin, pack_materialize(d, bin, o), o);
  }
  int64_t split = 0;
  for (int64_t i = 0; i < d.num_samples(); ++i) {
    auto& p = pieces[i];
    std::sort(p.begin(), p.end());
    // Expected: the chunks [k*T, (k+1)*T) that hold at least one trained target, each exactly once.
    std::vector<std::pair<int64_t, int64_t>> want;
    const int64_t L = d.length(i), T = o.tokens_per_batch;
    for (int64_t b = 0; b < L; b += T) {
      const int64_t len = std::min(T, L - b);
      bool any = false;
      for (int64_t t = 1; t < len; ++t) any |= d.labels[static_cast<size_t>(d.offsets[static_cast<size_t>(i)] + b + t)] != -100;
      if (any) want.push_back({b, len});
    }
    EXPECT_EQ(p, want) << "sample " << i;
    split += L > T;
  }
  EXPECT_EQ(plan.stats.split, split);
  EXPECT_EQ(plan.stats.truncated, 0);
}

TEST(Packer, DeterministicForSeed) {
  const TokenizedDataset d = synthetic_dataset(1500, 3);
  PackOptions o;
  o.shuffle_window = 500;
  o.seed = 11;
  auto flat = [&](const PackPlan& p) {
    std::vector<int64_t> v;
    for (const auto& b : p.bins)
      for (const auto& it : b.items) v.push_back(it.sample);
    return v;
  };
  const auto a = flat(pack_plan(d, o, 0));
  EXPECT_EQ(a, flat(pack_plan(d, o, 0)));
  EXPECT_NE(a, flat(pack_plan(d, o, 1)));  // a new epoch reshuffles
  PackOptions o2 = o;
  o2.seed = 12;
  EXPECT_NE(a, flat(pack_plan(d, o2, 0)));
}

TEST(Packer, PackedVersusPaddedOnChatLikeMix) {
  const TokenizedDataset d = synthetic_dataset(5000, 4);
  PackOptions o;
  const PackPlan packed = pack_plan(d, o, 0);
  o.mode = PackMode::Padded;
  const PackPlan padded = pack_plan(d, o, 0);
  std::cout << "[ packer ] 5000 chat-like samples, " << d.num_tokens() << " tokens, T=8192: packed "
            << packed.stats.batches << " batches (fill " << packed.stats.fill_ratio() << "), padded "
            << padded.stats.batches << " batches (fill " << padded.stats.fill_ratio() << ")\n";
  ::testing::Test::RecordProperty("batches_packed", static_cast<int>(packed.stats.batches));
  ::testing::Test::RecordProperty("batches_padded", static_cast<int>(padded.stats.batches));
  EXPECT_EQ(packed.stats.tokens, padded.stats.tokens);
  EXPECT_GT(packed.stats.fill_ratio(), 0.97);
  EXPECT_LT(packed.stats.batches, padded.stats.batches);
  // Padded batches are rectangles: rows x longest, each row one sample.
  for (size_t i = 0; i < 20 && i < padded.bins.size(); ++i) {
    const Batch b = pack_materialize(d, padded.bins[i], o);
    EXPECT_EQ(b.rows, static_cast<int64_t>(padded.bins[i].items.size()));
    EXPECT_LE(b.rows * b.row_len, o.tokens_per_batch);
    EXPECT_EQ(b.cu_seqlens.size(), static_cast<size_t>(b.rows + 1));
    for (int64_t r = 0; r < b.rows; ++r) {
      const PackItem& it = padded.bins[i].items[static_cast<size_t>(r)];
      EXPECT_EQ(b.targets[static_cast<size_t>(r * b.row_len + it.len - 1)], -100);
    }
  }
}

TEST(Packer, EdgeCases) {
  TokenizedDataset d;
  d.add({5}, {5});                     // one token: no target, dropped
  d.add({1, 2, 3}, {-100, -100, -100});  // nothing trained, dropped
  d.add({1, 2, 3}, {-100, 2, 3});
  PackOptions o;
  o.tokens_per_batch = 16;
  const PackPlan p = pack_plan(d, o, 0);
  EXPECT_EQ(p.stats.dropped_untrained, 2);
  ASSERT_EQ(p.bins.size(), 1u);
  const Batch b = pack_materialize(d, p.bins[0], o);
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 3, 16}));
  EXPECT_EQ(b.targets[0], 2);
  EXPECT_EQ(b.targets[1], 3);
  EXPECT_EQ(b.targets[2], -100);
  EXPECT_EQ(b.position_ids[3], 0);
  EXPECT_EQ(b.num_targets, 2);
  o.tokens_per_batch = 1;
  EXPECT_ERROR_CONTAINS([&] { pack_plan(d, o, 0); }, "tokens_per_batch");
}

// ---- loader ----------------------------------------------------------------------------------

TEST(DataLoader, DeterministicAndResumable) {
  const TokenizedDataset d = synthetic_dataset(800, 5);
  PackOptions o;
  o.tokens_per_batch = 4096;
  o.seed = 3;
  std::vector<Batch> all;
  {
    Loader l(d, o, {}, 2, 3);
    while (auto b = l.next()) all.push_back(std::move(*b));
    EXPECT_EQ(l.position(), (LoaderPosition{1, l.batches_per_epoch(1)}));
  }
  const int64_t n0 = pack_plan(d, o, 0).stats.batches;
  ASSERT_EQ(static_cast<int64_t>(all.size()), n0 + pack_plan(d, o, 1).stats.batches);
  EXPECT_EQ(all[static_cast<size_t>(n0)].epoch, 1);
  EXPECT_EQ(all[static_cast<size_t>(n0)].index, 0);
  // Stop after k batches, resume from the saved position: the same batches follow.
  const size_t k = static_cast<size_t>(n0) - 2;
  LoaderPosition saved;
  {
    Loader l(d, o, {}, 2, 2);
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(l.next().has_value());
    saved = l.position();
  }  // destroyed with batches still queued
  EXPECT_EQ(saved, (LoaderPosition{0, static_cast<int64_t>(k)}));
  Loader l(d, o, saved, 2, 2);
  for (size_t i = k; i < all.size(); ++i) {
    auto b = l.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->epoch, all[i].epoch);
    EXPECT_EQ(b->index, all[i].index);
    EXPECT_EQ(b->input_ids, all[i].input_ids);
    EXPECT_EQ(b->cu_seqlens, all[i].cu_seqlens);
  }
  EXPECT_FALSE(l.next().has_value());
}

}  // namespace
}  // namespace qt
