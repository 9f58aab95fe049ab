// Qwen3.5 ChatML rendering of system/user/assistant conversations, with the loss mask.
//
// The rendering is the official Qwen3.5 chat template (docs/model_spec.md section 8) restricted to
// those three roles (no tools, no images):
//   - an optional system message, first only: `<|im_start|>system\n{content|trim}<|im_end|>\n`;
//   - user: `<|im_start|>user\n{content|trim}<|im_end|>\n`;
//   - assistant: reasoning comes from `reasoning_content` when given, else from splitting the
//     content on `</think>` (the template's exact split/strip rules). Turns after the last user
//     query render `<|im_start|>assistant\n<think>\n{reasoning|trim}\n</think>\n\n{content}<|im_end|>\n`
//     (empty reasoning gives `<think>\n\n</think>\n\n`); earlier turns drop the reasoning:
//     `<|im_start|>assistant\n{content}<|im_end|>\n`.
//
// thinking (what the model learns about the think block of the turns after the last user query):
//   - On (default): exactly the official rendering; the think block, with its reasoning (or
//     empty), belongs to the assistant's answer and is trained like the rest of the content. Use it
//     to fine-tune a model that is run with enable_thinking=true.
//   - Off: reasoning is dropped from every turn, the turns after the last user query get the empty
//     block `<think>\n\n</think>\n\n`, which is exactly what the official template's generation
//     prompt holds with enable_thinking=false, so it is part of the prompt and is NOT trained; only
//     the content and `<|im_end|>` are. Use it to fine-tune a model that is run with
//     enable_thinking=false. For data without reasoning the rendered text is the same as with On;
//     only the mask of the empty think block differs.
//
// train_on:
//   - Assistant (default): every assistant turn's tokens after `<|im_start|>assistant\n` and its
//     closing `<|im_end|>` are trained; the "\n" after it and all other turns are not.
//   - LastAssistant: the same, for the last assistant turn only.
//   - All: every token of the rendering is trained.
// Labels follow the transformers convention: same length as the ids, unshifted, -100 = ignored.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qt {

class Tokenizer;

constexpr int32_t kIgnoreLabel = -100;

enum class ChatRole { System, User, Assistant };

struct ChatMessage {
  ChatRole role = ChatRole::User;
  std::string content;
  std::optional<std::string> reasoning_content;  // present: used instead of splitting content
};

enum class ThinkingMode { On, Off };
enum class TrainOn { Assistant, LastAssistant, All };

struct ChatTemplateOptions {
  ThinkingMode thinking = ThinkingMode::On;
  TrainOn train_on = TrainOn::Assistant;
};

// Parse/print option values as the CLI and YAML spell them ("on"/"off", "assistant"/...).
ThinkingMode thinking_mode_from_name(const std::string& name);
TrainOn train_on_from_name(const std::string& name);
const char* thinking_mode_name(ThinkingMode m);
const char* train_on_name(TrainOn t);
std::optional<ChatRole> chat_role_from_name(std::string_view name);
const char* chat_role_name(ChatRole r);

// One piece of the rendered text and whether its tokens are trained. Segment boundaries always
// sit next to a special token or after `<|im_start|>assistant\n`, so tokenizing the segments one
// by one gives the same ids as tokenizing the whole text.
struct ChatSegment {
  std::string text;
  bool trained = false;
};

// Throws qt::Error when the template would (no user query, system message not first) or when
// there is nothing to render.
std::vector<ChatSegment> chat_render_segments(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts);
// The whole rendered text (concatenation of the segments).
std::string chat_render(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts);

struct TokenizedChat {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length; kIgnoreLabel where not trained
};

using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;
TokenizedChat chat_tokenize(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts, const EncodeFn& encode);
TokenizedChat chat_tokenize(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts,
                            const Tokenizer& tokenizer, bool fix_utf8 = false);

// Python str.strip() with no argument (what Jinja's |trim does): Unicode whitespace at both ends.
std::string_view py_strip(std::string_view s);

}  // namespace qt
