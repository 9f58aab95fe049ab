// Tokenizer tests. Tiny tokenizers built by bpe_builder cover the engine without fixtures; the real
// Qwen3 tokenizer.json (scripts/fetch_test_data.sh) covers known answers and the HF golden ids
// written by tools/make_tokenizer_goldens.py. Missing fixtures fail the test unless
// QT_ALLOW_MISSING_TESTDATA=1 (local runs without npm or goldens).
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "text/bpe_builder.h"
#include "text/tokenizer.h"

namespace qt {
namespace {

using Ids = std::vector<int32_t>;
using json = nlohmann::ordered_json;

bool allow_missing() {
  const char* v = std::getenv("QT_ALLOW_MISSING_TESTDATA");
  return v && std::string(v) == "1";
}

bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

std::string qwen3_tokenizer_path() {
  if (const char* v = std::getenv("QT_QWEN3_TOKENIZER")) return v;
  return std::string(QT_CACHE_TESTDATA_DIR) + "/qwen3/tokenizer.json";
}

// Fails (or skips with QT_ALLOW_MISSING_TESTDATA=1) when a fixture file is absent.
#define REQUIRE_FIXTURE(path, how)                                                          \
  do {                                                                                      \
    if (!file_exists(path)) {                                                               \
      if (allow_missing()) GTEST_SKIP() << (path) << " missing (QT_ALLOW_MISSING_TESTDATA=1)"; \
      FAIL() << (path) << " is missing: " << how;                                           \
    }                                                                                       \
  } while (0)

const char* const kFetchHint = "run scripts/fetch_test_data.sh (or set QT_ALLOW_MISSING_TESTDATA=1 to skip)";
const char* const kGoldenHint =
    "run tools/make_tokenizer_goldens.py where HF `tokenizers` is installed (see the script's header), "
    "or set QT_ALLOW_MISSING_TESTDATA=1 to skip";

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::load(qwen3_tokenizer_path());
  return tok;
}

std::vector<std::string> read_corpus() {
  std::ifstream in(testing::testdata_dir() + "/tokenizer/corpus.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return out;
}

std::vector<Ids> read_ids(const std::string& path) {
  std::ifstream in(path);
  std::vector<Ids> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).get<Ids>());
  return out;
}

const char* const kTrainText =
    "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox runs. hello world, hello there! "
    "it's 2024 and we're tokenizing text: tokens, tokenizer, tokenization.\n\n  indented line\ttab\r\n";

// Tiny byte-level BPE tokenizer.json; `edit` may change the JSON before it is written.
std::string write_tiny(const testing::ScratchDir& dir, const std::function<void(json&)>& edit = {},
                       const std::string& regex = kQwen35SplitRegex) {
  const auto merges = bpe_train_merges(kTrainText, 80);
  json j = bpe_tokenizer_json(merges, qwen_added_tokens(1000), regex);
  if (edit) edit(j);
  const std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << j.dump();
  return path;
}

// Adds an added token with the given flags.
void add_token(json& j, int64_t id, const std::string& content, bool lstrip, bool rstrip, bool single_word,
               bool normalized) {
  j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
                               {"rstrip", rstrip}, {"normalized", normalized}, {"special", !normalized}});
}

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- tiny tokenizers ----

TEST(TokenizerTiny, RoundTripsText) {
  testing::ScratchDir dir("tok_tiny_roundtrip");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  for (const std::string t : {"", "a", "the quick brown fox", "hello world, hello there!", "  spaces  and\ttabs\r\n",
                              "中文 and 日本語", "emoji 👨‍👩‍👧 ok", "digits 1234567890", "\xc3\xa9t\xc3\xa9"}) {
    const Ids ids = tok.encode(t);
    EXPECT_EQ(tok.decode(ids), t) << t;
    for (int32_t id : ids) EXPECT_LT(id, tok.vocab_size());
  }
  // Merges apply: a frequent word is fewer tokens than bytes.
  EXPECT_LT(tok.encode(" the").size(), 4u);
  EXPECT_EQ(tok.vocab_size(), 1026);
}

TEST(TokenizerTiny, ByteLevelSymbolsAndTokenToId) {
  testing::ScratchDir dir("tok_tiny_symbols");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  const auto& alpha = byte_level_alphabet();
  // Byte symbols are ids 0..255 in bpe_builder's vocabulary order.
  EXPECT_EQ(tok.token_to_id(alpha['A']), std::optional<int32_t>('A'));
  EXPECT_EQ(tok.encode("A"), Ids{*tok.token_to_id(alpha['A'])});
  EXPECT_EQ(tok.encode(" "), Ids{*tok.token_to_id(alpha[' '])});
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), std::optional<int32_t>(1002));
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.decode({*tok.token_to_id(alpha[0xe4]), *tok.token_to_id(alpha[0xb8]), *tok.token_to_id(alpha[0xad])}),
            "中");
}

TEST(TokenizerTiny, AddedTokensSplitTheText) {
  testing::ScratchDir dir("tok_tiny_added");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  const int32_t start = 1001, end = 1002, think = 1024;
  EXPECT_EQ(tok.encode("<|im_start|>"), Ids{start});
  EXPECT_EQ(tok.encode("<|im_start|>user\nhi<|im_end|>\n"),
            cat({{start}, tok.encode("user\nhi"), {end}, tok.encode("\n")}));
  EXPECT_EQ(tok.encode("a<think>b"), cat({tok.encode("a"), {think}, tok.encode("b")}));
  EXPECT_EQ(tok.encode("x <think> y"), cat({tok.encode("x "), {think}, tok.encode(" y")}));
  EXPECT_EQ(tok.encode("<|im_start|><|im_end|>"), (Ids{start, end}));
  // Partial or differently cased tokens are plain text.
  for (int32_t id : tok.encode("<|IM_END|> <|im_end")) EXPECT_LT(id, 1000);
  EXPECT_EQ(tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>")), "<|im_start|>user\nhi<|im_end|>");
}

TEST(TokenizerTiny, AddedTokensLeftmostThenLongest) {
  testing::ScratchDir dir("tok_tiny_longest");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir, [](json& j) {
    add_token(j, 2000, "<x>", false, false, false, false);
    add_token(j, 2001, "<x>y", false, false, false, false);
    add_token(j, 2002, "ab", false, false, false, false);
    add_token(j, 2003, "bcd", false, false, false, false);
  }));
  testing::ScratchDir plain_dir("tok_tiny_longest_plain");
  const Tokenizer plain = Tokenizer::load(write_tiny(plain_dir));
  EXPECT_EQ(tok.encode("<x>yz"), cat({{2001}, plain.encode("z")}));
  EXPECT_EQ(tok.encode("<x>z"), cat({{2000}, plain.encode("z")}));
  EXPECT_EQ(tok.encode("abcd"), cat({{2002}, plain.encode("cd")}));  // leftmost wins over longer
  EXPECT_EQ(tok.encode("xbcd"), cat({plain.encode("x"), {2003}}));
}

TEST(TokenizerTiny, AddedTokenStripAndSingleWordFlags) {
  testing::ScratchDir dir("tok_tiny_flags");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir, [](json& j) {
    add_token(j, 2000, "<l>", true, false, false, false);
    add_token(j, 2001, "<r>", false, true, false, false);
    add_token(j, 2002, "<w>", false, false, true, false);
  }));
  testing::ScratchDir plain_dir("tok_tiny_flags_plain");
  const Tokenizer plain = Tokenizer::load(write_tiny(plain_dir));
  EXPECT_EQ(tok.encode("a   <l>b"), cat({plain.encode("a"), {2000}, plain.encode("b")}));
  EXPECT_EQ(tok.encode("a<r> \t b"), cat({plain.encode("a"), {2001}, plain.encode("b")}));
  EXPECT_EQ(tok.encode("a <r>\n"), cat({plain.encode("a "), {2001}}));
  EXPECT_EQ(tok.encode("x <w> y"), cat({plain.encode("x "), {2002}, plain.encode(" y")}));
  EXPECT_EQ(tok.encode("<w>"), Ids{2002});
  EXPECT_EQ(tok.encode("x<w> y"), plain.encode("x<w> y"));  // glued to a word: not a match
  EXPECT_EQ(tok.encode("x <w>y"), plain.encode("x <w>y"));
}

TEST(TokenizerTiny, NormalizedAddedTokensMatchAfterNfc) {
  testing::ScratchDir dir("tok_tiny_norm_added");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir, [](json& j) {
    add_token(j, 2000, "caf\xc3\xa9", false, false, false, true);  // "café", NFC
  }));
  // "cafe" + U+0301 normalizes to "café" and then matches the normalized added token.
  EXPECT_EQ(tok.encode("le cafe\xcc\x81!"), cat({tok.encode("le "), {2000}, tok.encode("!")}));
}

TEST(TokenizerTiny, NfcNormalizes) {
  testing::ScratchDir dir("tok_tiny_nfc");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  EXPECT_EQ(tok.encode("e\xcc\x81"), tok.encode("\xc3\xa9"));
  EXPECT_EQ(tok.encode("Vie\xcc\x82\xcc\xa3t"), tok.encode("Vi\xe1\xbb\x87t"));
  EXPECT_EQ(tok.encode("\xe2\x84\xab"), tok.encode("\xc3\x85"));  // Angstrom sign -> A with ring
  EXPECT_NE(tok.encode("\xef\xac\x81"), tok.encode("fi"));          // NFC keeps the ligature
  EXPECT_EQ(tok.decode(tok.encode("e\xcc\x81")), "\xc3\xa9");
}

TEST(TokenizerTiny, InvalidUtf8) {
  testing::ScratchDir dir("tok_tiny_utf8");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  EXPECT_ERROR_CONTAINS([&] { tok.encode("ab\xff" "cd"); }, "invalid UTF-8", "byte offset 2");
  EXPECT_ERROR_CONTAINS([&] { tok.encode("\xed\xa0\x80"); }, "byte offset 0");      // surrogate
  EXPECT_ERROR_CONTAINS([&] { tok.encode("xy\xc0\xaf"); }, "byte offset 2");        // overlong
  EXPECT_ERROR_CONTAINS([&] { tok.encode("abc\xe4\xb8"); }, "byte offset 3");       // truncated
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(tok.encode("ab\xff" "cd", true), tok.encode("ab" + fffd + "cd"));
  // One U+FFFD per maximal ill-formed subsequence, as Rust's from_utf8_lossy.
  EXPECT_EQ(Tokenizer::fix_utf8("\xe4\xb8x"), fffd + "x");
  EXPECT_EQ(Tokenizer::fix_utf8("\xc0\xaf"), fffd + fffd);
  EXPECT_EQ(Tokenizer::fix_utf8("\xf0\x9f\x98"), fffd);
  EXPECT_EQ(Tokenizer::fix_utf8("ok \xf0\x9f\x98\x80"), "ok \xf0\x9f\x98\x80");
  // Decoding a lone byte of a multi-byte character gives U+FFFD.
  const auto& alpha = byte_level_alphabet();
  EXPECT_EQ(tok.decode({*tok.token_to_id(alpha['a']), *tok.token_to_id(alpha[0xe4])}), "a" + fffd);
  EXPECT_ERROR_CONTAINS([&] { tok.decode({5000}); }, "id 5000");
}

TEST(TokenizerTiny, LongWordsAndWhitespaceRuns) {
  testing::ScratchDir dir("tok_tiny_long");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  for (const std::string& t : {std::string(20000, ' '), std::string(5000, 'a'), std::string(3000, '\n'),
                              std::string(100, ' ') + "x" + std::string(100, '\t')}) {
    EXPECT_EQ(tok.decode(tok.encode(t)), t);
    EXPECT_EQ(tok.encode(t), tok.encode(t));  // cached path agrees with the first run
  }
}

TEST(TokenizerTiny, ByteLevelWithGpt2Regex) {
  testing::ScratchDir dir("tok_tiny_gpt2");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir, [](json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  }));
  // GPT-2's regex keeps digit runs together where the Qwen one splits them.
  const auto& alpha = byte_level_alphabet();
  EXPECT_EQ(tok.decode(tok.encode("it's 2024, hello world")), "it's 2024, hello world");
  testing::ScratchDir dir2("tok_tiny_gpt2_prefix");
  const Tokenizer pre = Tokenizer::load(write_tiny(dir2, [](json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  }));
  EXPECT_EQ(pre.encode("hello"), tok.encode(" hello"));
  EXPECT_EQ(pre.encode("a")[0], *tok.token_to_id(alpha[' ']));
}

TEST(TokenizerTiny, UnsupportedFeaturesNameFileAndFeature) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model type 'WordPiece'"},
      {"lowercase", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer 'Lowercase'"},
      {"whitespace", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer 'Whitespace'"},
      {"bytefallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"behavior", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "Split behavior 'Removed'"},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder 'WordPiece'"},
      {"regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }, "does not compile"},
      {"merge", [](json& j) { j["model"]["merges"].push_back(json::array({"zzz", "q"})); }, "not in the vocabulary"},
  };
  for (const auto& c : cases) {
    testing::ScratchDir dir(std::string("tok_unsupported_") + c.name);
    const std::string path = write_tiny(dir, c.edit);
    EXPECT_ERROR_CONTAINS([&] { Tokenizer::load(path); }, path.c_str(), c.expect);
  }
  EXPECT_ERROR_CONTAINS([] { Tokenizer::load("/nonexistent/tokenizer.json"); }, "/nonexistent/tokenizer.json");
}

TEST(TokenizerTiny, MergesAsStringsEqualMergesAsPairs) {
  testing::ScratchDir a("tok_merges_pairs"), b("tok_merges_strings");
  const Tokenizer pairs = Tokenizer::load(write_tiny(a));
  const Tokenizer strings = Tokenizer::load(write_tiny(b, [](json& j) {
    json ms = json::array();
    for (const auto& m : j["model"]["merges"]) ms.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    j["model"]["merges"] = ms;
  }));
  EXPECT_EQ(pairs.encode(kTrainText), strings.encode(kTrainText));
}

TEST(TokenizerTiny, ThreadsAgree) {
  testing::ScratchDir dir("tok_tiny_threads");
  const Tokenizer tok = Tokenizer::load(write_tiny(dir));
  const auto corpus = read_corpus();
  std::vector<Ids> want;
  for (const auto& t : corpus) want.push_back(tok.encode(t));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < corpus.size(); ++i)
          if (tok.encode(corpus[(i + static_cast<size_t>(w) * 37) % corpus.size()]) != want[(i + static_cast<size_t>(w) * 37) % corpus.size()]) ++bad[static_cast<size_t>(w)];
    });
  for (auto& t : threads) t.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

// ---- the real Qwen3 tokenizer ----

TEST(TokenizerQwen3, KnownAnswers) {
  REQUIRE_FIXTURE(qwen3_tokenizer_path(), kFetchHint);
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{9707, 11, 1879, 0}));
  EXPECT_EQ(tok.encode("<|im_start|>user\n"), (Ids{151644, 872, 198}));
  EXPECT_EQ(tok.encode("<|im_start|>assistant\n"), (Ids{151644, 77091, 198}));
  EXPECT_EQ(tok.encode("<|im_end|>"), Ids{151645});
  EXPECT_EQ(tok.encode("<|endoftext|>"), Ids{151643});
  EXPECT_EQ(tok.encode("\n\n"), Ids{271});
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.token_to_id("<think>"), std::optional<int32_t>(151667));
  EXPECT_EQ(tok.decode({9707, 11, 1879, 0}), "Hello, world!");
}

TEST(TokenizerQwen3, MatchesHfGoldens) {
  REQUIRE_FIXTURE(qwen3_tokenizer_path(), kFetchHint);
  const std::string golden = testing::testdata_dir() + "/tokenizer/qwen3_golden_ids.jsonl";
  REQUIRE_FIXTURE(golden, kGoldenHint);
  const auto corpus = read_corpus();
  const auto want = read_ids(golden);
  ASSERT_EQ(corpus.size(), want.size()) << "goldens are stale: rerun tools/make_tokenizer_goldens.py";
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const Ids got = qwen3().encode(corpus[i]);
    if (got != want[i] && ++mismatches <= 10)
      ADD_FAILURE() << "corpus line " << i + 1 << " " << nlohmann::json(corpus[i]).dump() << "\n  got  "
                    << nlohmann::json(got).dump() << "\n  want " << nlohmann::json(want[i]).dump();
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TokenizerQwen3, Qwen35RegexMatchesHfGoldens) {
  REQUIRE_FIXTURE(qwen3_tokenizer_path(), kFetchHint);
  const std::string golden = testing::testdata_dir() + "/tokenizer/qwen35regex_golden_ids.jsonl";
  REQUIRE_FIXTURE(golden, kGoldenHint);
  // The same variant file the golden script writes: the Split regex swapped for Qwen3.5's.
  std::ifstream in(qwen3_tokenizer_path());
  auto j = nlohmann::ordered_json::parse(in);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen35SplitRegex;
  testing::ScratchDir dir("tok_qwen35_regex");
  std::ofstream(dir.file("tokenizer.json")) << j.dump();
  const Tokenizer tok = Tokenizer::load(dir.file("tokenizer.json"));
  const auto corpus = read_corpus();
  const auto want = read_ids(golden);
  ASSERT_EQ(corpus.size(), want.size()) << "goldens are stale: rerun tools/make_tokenizer_goldens.py";
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const Ids got = tok.encode(corpus[i]);
    if (got != want[i] && ++mismatches <= 10)
      ADD_FAILURE() << "corpus line " << i + 1 << " " << nlohmann::json(corpus[i]).dump() << "\n  got  "
                    << nlohmann::json(got).dump() << "\n  want " << nlohmann::json(want[i]).dump();
  }
  EXPECT_EQ(mismatches, 0);
  // The two regexes differ on marks: U+0301 joins the letters after it only with the Qwen3.5 one.
  EXPECT_NE(tok.encode("\xcc\x81!I"), qwen3().encode("\xcc\x81!I"));
}

TEST(TokenizerQwen3, DecodeRoundTripsCorpus) {
  REQUIRE_FIXTURE(qwen3_tokenizer_path(), kFetchHint);
  for (const auto& t : read_corpus()) {
    const Ids ids = qwen3().encode(t);
    const std::string back = qwen3().decode(ids);
    EXPECT_EQ(qwen3().encode(back), ids) << t;  // decode gives the NFC text, which encodes the same
    bool ascii = true;
    for (unsigned char c : t) ascii &= c < 0x80;
    if (ascii) {
      EXPECT_EQ(back, t);
    }
  }
}

}  // namespace
}  // namespace qt
