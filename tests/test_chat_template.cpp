// Chat template rendering (Qwen3.5 ChatML), the loss mask, and segment-wise tokenization.
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "text/bpe_builder.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace qt {
namespace {

using Msgs = std::vector<ChatMessage>;

ChatMessage sys(std::string c) { return {ChatRole::System, std::move(c), std::nullopt}; }
ChatMessage user(std::string c) { return {ChatRole::User, std::move(c), std::nullopt}; }
ChatMessage asst(std::string c) { return {ChatRole::Assistant, std::move(c), std::nullopt}; }
ChatMessage asst_r(std::string c, std::string r) { return {ChatRole::Assistant, std::move(c), std::move(r)}; }

ChatTemplateOptions opts(ThinkingMode t, TrainOn on = TrainOn::Assistant) { return {t, on}; }

// One id per byte: the trained bytes can be read back from the labels.
std::vector<int32_t> byte_ids(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

std::string trained_text(const Msgs& m, const ChatTemplateOptions& o) {
  const TokenizedChat t = chat_tokenize(m, o, byte_ids);
  EXPECT_EQ(t.input_ids.size(), t.labels.size());
  std::string s;
  bool prev = false;
  for (size_t i = 0; i < t.labels.size(); ++i) {
    const bool on = t.labels[i] != kIgnoreLabel;
    if (on) {
      EXPECT_EQ(t.labels[i], t.input_ids[i]);
      if (!prev && !s.empty()) s += '|';  // marks a gap between trained spans
      s += static_cast<char>(t.labels[i]);
    }
    prev = on;
  }
  return s;
}

TEST(ChatTemplate, SingleTurn) {
  const Msgs m = {user("Hello"), asst("Hi there!")};
  const std::string want =
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi there!<|im_end|>\n";
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::On)), want);
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::Off)), want);
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::On)), "<think>\n\n</think>\n\nHi there!<|im_end|>");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::Off)), "Hi there!<|im_end|>");
}

TEST(ChatTemplate, WithSystemAndTrim) {
  const Msgs m = {sys("  You are helpful.\n"), user("\tWhat is 2+2? \n"), asst("\n 4 \n")};
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::On)),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n");
  // Unicode whitespace (NBSP, ideographic space) is trimmed like Python's str.strip().
  EXPECT_EQ(py_strip("\xc2\xa0 x y\xe3\x80\x80"), "x y");
  EXPECT_EQ(py_strip(" \n "), "");
}

TEST(ChatTemplate, MultiTurnDropsEarlierReasoning) {
  const Msgs m = {user("Q1"), asst("<think>\nr1\n</think>\n\nA1"), user("Q2"), asst_r("A2", "\n r2 \n")};
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::On)),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n");
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::Off)),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::On)), "A1<|im_end|>|<think>\nr2\n</think>\n\nA2<|im_end|>");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::Off)), "A1<|im_end|>|A2<|im_end|>");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::Off, TrainOn::LastAssistant)), "A2<|im_end|>");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::On, TrainOn::All)), chat_render(m, opts(ThinkingMode::On)));
}

TEST(ChatTemplate, ReasoningSplitFromContent) {
  // The template's split: before the first </think>, after the last <think>; content after the last </think>.
  const Msgs m = {user("Why?"), asst("<think>\n\nBecause physics.\n\n</think>\n\nRayleigh scattering.")};
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::On)),
            "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\nBecause physics.\n</think>\n\n"
            "Rayleigh scattering.<|im_end|>\n");
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::Off)),
            "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nRayleigh scattering.<|im_end|>\n");
  // reasoning_content given: the content is not split.
  const Msgs r = {user("x"), asst_r("a</think>b", "r")};
  EXPECT_EQ(chat_render(r, opts(ThinkingMode::On)),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na</think>b<|im_end|>\n");
}

TEST(ChatTemplate, AssistantTurnsAfterLastQueryAllGetThinkBlocks) {
  const Msgs m = {user("go"), asst("step 1"), asst("step 2")};
  EXPECT_EQ(chat_render(m, opts(ThinkingMode::On)),
            "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nstep 1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nstep 2<|im_end|>\n");
  EXPECT_EQ(trained_text(m, opts(ThinkingMode::Off, TrainOn::LastAssistant)), "step 2<|im_end|>");
}

TEST(ChatTemplate, Errors) {
  EXPECT_ERROR_CONTAINS([] { chat_render({}, {}); }, "empty conversation");
  EXPECT_ERROR_CONTAINS([] { chat_render({asst("a")}, {}); }, "no user query");
  EXPECT_ERROR_CONTAINS([] { chat_render({user("u"), sys("s"), asst("a")}, {}); }, "system message at position 1");
  EXPECT_ERROR_CONTAINS([] { thinking_mode_from_name("maybe"); }, "thinking 'maybe'");
  EXPECT_ERROR_CONTAINS([] { train_on_from_name("users"); }, "train_on 'users'");
}

// Conversations whose segment boundaries are worth checking against whole-string tokenization.
std::vector<Msgs> tricky_conversations() {
  return {
      {user("Hello"), asst("Hi there!")},
      {sys("Be brief."), user("What is 2+2?"), asst("4"), user("and 3+3?"), asst("6, because 3 + 3 = 6.")},
      {user("Q"), asst("<think>plan</think>\n\n  indented answer")},
      {user("Q"), asst("<think>plan</think>\r\n\r\nCRLF answer\r\n")},
      {user("Q"), asst("<think>plan</think> \t\n  \nwhitespace run")},
      {user("Q1"), asst("<think>a</think>\r\nfirst"), user("Q2"), asst("<think>b</think>\r\n\r\nsecond")},
      {user("literal <|im_start|> and <think> tags"), asst("echo <|im_end|> done")},
      {user("中文问题：天空为什么是蓝色的？"), asst("因为瑞利散射。👩‍👩‍👧 e\xcc\x81")},
      {user("code"), asst("```python\ndef f(x):\n    return x  # 123\n```")},
      {user("empty answer"), asst("")},
  };
}

void expect_segments_match_whole(const Tokenizer& tok) {
  for (const auto& m : tricky_conversations()) {
    for (ThinkingMode t : {ThinkingMode::On, ThinkingMode::Off}) {
      for (TrainOn on : {TrainOn::Assistant, TrainOn::LastAssistant, TrainOn::All}) {
        const ChatTemplateOptions o{t, on};
        const TokenizedChat seg = chat_tokenize(m, o, tok);
        const std::vector<int32_t> whole = tok.encode(chat_render(m, o));
        EXPECT_EQ(seg.input_ids, whole) << "thinking " << thinking_mode_name(t) << " train_on " << train_on_name(on)
                                        << " text:\n" << chat_render(m, o);
        int64_t trained = 0;
        for (int32_t l : seg.labels) trained += l != kIgnoreLabel;
        EXPECT_GT(trained, 0);
      }
    }
  }
}

TEST(ChatTemplate, SegmentsTokenizeLikeWholeStringBuiltTokenizer) {
  testing::ScratchDir dir("chat-bpe");
  const std::string corpus =
      "Hello there! What is 2+2? The answer is 4, because 3 + 3 = 6.\r\n indented answer\n first second "
      "中文问题 天空为什么是蓝色的 def f(x): return x  # 123 whitespace run CRLF answer plan echo done ";
  const auto merges = bpe_train_merges(corpus, 300);
  const auto added = qwen_added_tokens(static_cast<int64_t>(256 + merges.size()));
  {
    std::ofstream f(dir.file("tokenizer.json"));
    f << bpe_tokenizer_json(merges, added, kQwen35SplitRegex).dump(1);
  }
  const Tokenizer tok = Tokenizer::load(dir.file("tokenizer.json"));
  expect_segments_match_whole(tok);
}

TEST(ChatTemplate, SegmentsTokenizeLikeWholeStringQwen3Tokenizer) {
  const std::string path = testing::testdata_dir() + "/../../.cache/testdata/qwen3/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path << " (scripts/fetch_test_data.sh fetches it)";
  const Tokenizer tok = Tokenizer::load(path);
  expect_segments_match_whole(tok);
  // Special tokens of the rendering are single ids.
  const TokenizedChat t = chat_tokenize({user("Hi"), asst("Yo")}, {}, tok);
  EXPECT_EQ(t.input_ids.front(), *tok.token_to_id("<|im_start|>"));
}

}  // namespace
}  // namespace qt
