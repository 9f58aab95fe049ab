#include "text/chat_template.h"

#include "core/error.h"
#include "text/tokenizer.h"

namespace qt {
namespace {

// Decodes the code point that starts at s[i] (len set to its byte count); invalid bytes decode
// as themselves with length 1 so scanning never stalls.
uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  *len = n;
  return cp;
}

// Start of the code point that ends at s[end-1].
size_t prev_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  int back = 0;
  while (i > 0 && back < 3 && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) {
    --i;
    ++back;
  }
  return i;
}

// Python's str.isspace() set.
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Unicode White_Space (what the tokenizer's regex \s matches).
bool unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string_view lstrip_newlines(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] == '\n') ++i;
  return s.substr(i);
}

std::string_view rstrip_newlines(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == '\n') --n;
  return s.substr(0, n);
}

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

struct AssistantParts {
  std::string reasoning;
  std::string content;
};

// The template's reasoning extraction, applied to the already trimmed content.
AssistantParts split_assistant(const ChatMessage& m, std::string_view content) {
  AssistantParts p;
  if (m.reasoning_content) {
    p.reasoning = std::string(py_strip(*m.reasoning_content));
    p.content = std::string(content);
    return p;
  }
  const size_t first_close = content.find(kThinkClose);
  if (first_close == std::string_view::npos) {
    p.content = std::string(content);
    return p;
  }
  std::string_view before = rstrip_newlines(content.substr(0, first_close));
  const size_t last_open = before.rfind(kThinkOpen);
  if (last_open != std::string_view::npos) before = before.substr(last_open + kThinkOpen.size());
  p.reasoning = std::string(py_strip(lstrip_newlines(before)));
  const size_t last_close = content.rfind(kThinkClose);
  p.content = std::string(lstrip_newlines(content.substr(last_close + kThinkClose.size())));
  return p;
}

// Bytes of leading whitespace of `body` up to and including its last line break ('\r' or '\n'),
// 0 if the leading whitespace has none. The tokenizer's `\s*[\r\n]+` piece that starts at the
// preceding "\n" runs exactly that far, so the mask boundary must sit after it.
size_t leading_break_run(std::string_view body) {
  size_t i = 0, end = 0;
  while (i < body.size()) {
    size_t len = 1;
    const uint32_t cp = decode_at(body, i, &len);
    if (!unicode_space(cp)) break;
    i += len;
    if (cp == '\r' || cp == '\n') end = i;
  }
  return end;
}

class SegmentBuilder {
 public:
  void add(std::string_view text, bool trained) {
    if (text.empty()) return;
    if (!segs_.empty() && segs_.back().trained == trained) {
      segs_.back().text.append(text);
    } else {
      segs_.push_back({std::string(text), trained});
    }
  }
  std::vector<ChatSegment> take() { return std::move(segs_); }

 private:
  std::vector<ChatSegment> segs_;
};

}  // namespace

std::string_view py_strip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    size_t len = 1;
    if (!py_space(decode_at(s, b, &len))) break;
    b += len;
  }
  while (e > b) {
    const size_t start = prev_start(s, e);
    size_t len = 1;
    const uint32_t cp = decode_at(s, start, &len);
    if (start + len != e || !py_space(cp)) break;
    e = start;
  }
  return s.substr(b, e - b);
}

ThinkingMode thinking_mode_from_name(const std::string& name) {
  if (name == "on" || name == "true") return ThinkingMode::On;
  if (name == "off" || name == "false") return ThinkingMode::Off;
  QT_FAIL("thinking '", name, "' is not one of on, off");
}

TrainOn train_on_from_name(const std::string& name) {
  if (name == "assistant") return TrainOn::Assistant;
  if (name == "last_assistant") return TrainOn::LastAssistant;
  if (name == "all") return TrainOn::All;
  QT_FAIL("train_on '", name, "' is not one of assistant, last_assistant, all");
}

const char* thinking_mode_name(ThinkingMode m) { return m == ThinkingMode::On ? "on" : "off"; }

const char* train_on_name(TrainOn t) {
  switch (t) {
    case TrainOn::Assistant: return "assistant";
    case TrainOn::LastAssistant: return "last_assistant";
    case TrainOn::All: return "all";
  }
  return "?";
}

std::optional<ChatRole> chat_role_from_name(std::string_view name) {
  if (name == "system") return ChatRole::System;
  if (name == "user") return ChatRole::User;
  if (name == "assistant") return ChatRole::Assistant;
  return std::nullopt;
}

const char* chat_role_name(ChatRole r) {
  switch (r) {
    case ChatRole::System: return "system";
    case ChatRole::User: return "user";
    case ChatRole::Assistant: return "assistant";
  }
  return "?";
}

std::vector<ChatSegment> chat_render_segments(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts) {
  QT_CHECK(!messages.empty(), "empty conversation (no messages)");
  // Last real user query: tool results wrapped as user turns do not count (as the template).
  int64_t last_query = -1, last_assistant = -1;
  for (int64_t i = static_cast<int64_t>(messages.size()) - 1; i >= 0; --i) {
    const ChatMessage& m = messages[static_cast<size_t>(i)];
    if (m.role == ChatRole::Assistant && last_assistant < 0) last_assistant = i;
    if (m.role == ChatRole::User && last_query < 0) {
      const std::string_view c = py_strip(m.content);
      const bool tool_result = c.substr(0, 15) == "<tool_response>" && c.size() >= 16 &&
                               c.substr(c.size() - 16) == "</tool_response>";
      if (!tool_result) last_query = i;
    }
  }
  QT_CHECK(last_query >= 0, "no user query in the conversation (the Qwen3.5 template requires one)");

  const bool all = opts.train_on == TrainOn::All;
  SegmentBuilder out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string_view content = py_strip(m.content);
    if (m.role == ChatRole::System) {
      QT_CHECK(i == 0, "system message at position ", i, ": it must be the first message");
      out.add("<|im_start|>system\n", all);
      out.add(content, all);
      out.add("<|im_end|>\n", all);
    } else if (m.role == ChatRole::User) {
      out.add("<|im_start|>user\n", all);
      out.add(content, all);
      out.add("<|im_end|>\n", all);
    } else {
      const bool trained = all || opts.train_on == TrainOn::Assistant ||
                           (opts.train_on == TrainOn::LastAssistant && static_cast<int64_t>(i) == last_assistant);
      const AssistantParts parts = split_assistant(m, content);
      out.add("<|im_start|>assistant\n", all);
      if (static_cast<int64_t>(i) > last_query) {
        if (opts.thinking == ThinkingMode::On) {
          out.add("<think>\n" + parts.reasoning + "\n</think>\n\n", trained);
        } else {
          out.add("<think>\n\n</think>\n\n", all);
        }
      }
      std::string_view body = parts.content;
      // The preceding text ends in "\n"; leading whitespace through a line break joins its token.
      const bool body_after_prompt = !(static_cast<int64_t>(i) > last_query && opts.thinking == ThinkingMode::On);
      if (body_after_prompt && trained && !all) {
        const size_t k = leading_break_run(body);
        out.add(body.substr(0, k), false);
        body = body.substr(k);
      }
      out.add(body, trained);
      out.add("<|im_end|>", trained);
      out.add("\n", all);
    }
  }
  return out.take();
}

std::string chat_render(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts) {
  std::string s;
  for (const auto& seg : chat_render_segments(messages, opts)) s += seg.text;
  return s;
}

TokenizedChat chat_tokenize(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts, const EncodeFn& encode) {
  TokenizedChat t;
  for (const auto& seg : chat_render_segments(messages, opts)) {
    const std::vector<int32_t> ids = encode(seg.text);
    t.input_ids.insert(t.input_ids.end(), ids.begin(), ids.end());
    if (seg.trained) {
      t.labels.insert(t.labels.end(), ids.begin(), ids.end());
    } else {
      t.labels.insert(t.labels.end(), ids.size(), kIgnoreLabel);
    }
  }
  return t;
}

TokenizedChat chat_tokenize(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts,
                            const Tokenizer& tokenizer, bool fix_utf8) {
  return chat_tokenize(messages, opts, [&](std::string_view s) { return tokenizer.encode(s, fix_utf8); });
}

}  // namespace qt
