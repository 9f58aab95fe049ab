// Dataset readers: files of chat conversations or pre-tokenized samples -> Sample records.
//
// Formats (by extension): .jsonl (one JSON object a line; blank lines ignored) and .json (one
// JSON array of objects, or JSON Lines if the file does not start with '['). Parsing is simdjson.
// Schemas (auto-detected per file from the first row's keys, or forced):
//   ultrachat  {"messages": [{"role": "system|user|assistant", "content": "...",
//               "reasoning_content"?: "..."}]}
//   sharegpt   {"conversations": [{"from": "system|human|gpt", "value": "..."}]}  (user/assistant
//               are accepted as from values too)
//   alpaca     {"instruction": "...", "input"?: "...", "output": "...", "system"?: "..."}:
//               user = instruction, plus "\n\n" + input when input is not empty; assistant = output
//   tokenized  {"input_ids": [...], "labels"?: [...]}: labels the same length as input_ids,
//               unshifted (transformers convention), -100 = ignored; absent = all trained
// Every error names FILE:LINE (the line where the row starts). With skip_bad_rows a bad row is
// counted (ReadStats) instead of stopping the read.
//
// Adding a format (the parquet reader): produce rows through make_chat_sample /
// make_tokenized_sample (they do all validation) and add the extension to read_samples and
// data_file_extensions (readers.cpp), or call register_sample_reader at start-up.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"

namespace qt {

enum class DataSchema { Auto, Ultrachat, ShareGpt, Alpaca, Tokenized };
DataSchema data_schema_from_name(const std::string& name);
const char* data_schema_name(DataSchema s);

struct Sample {
  std::string file;   // source file
  int64_t line = 0;   // 1-based line where the row starts (row number for formats without lines)
  bool pretokenized = false;
  std::vector<ChatMessage> messages;  // chat schemas
  std::vector<int32_t> input_ids;     // tokenized schema
  std::vector<int32_t> labels;        // tokenized schema; empty = every token trained
  std::string location() const { return file + ":" + std::to_string(line); }
};

struct ReadOptions {
  DataSchema schema = DataSchema::Auto;
  bool skip_bad_rows = false;  // count and report bad rows instead of failing
  bool fix_utf8 = false;       // replace invalid UTF-8 with U+FFFD instead of failing
  int64_t vocab_size = 0;      // > 0: pre-tokenized ids must be below it
};

struct ReadStats {
  int64_t rows = 0;          // rows seen (good + bad)
  int64_t samples = 0;       // rows returned
  int64_t bad_rows = 0;      // rows skipped (skip_bad_rows)
  int64_t utf8_fixed = 0;    // rows whose invalid UTF-8 was replaced (fix_utf8)
  std::map<std::string, int64_t> bad_by_reason;  // e.g. "malformed JSON" -> 3
  std::vector<std::string> bad_examples;         // first few full messages
  std::map<std::string, std::string> schema_by_file;
  void merge(const ReadStats& o);
};

// Thrown-or-counted error category of a bad row (the keys of ReadStats::bad_by_reason).
class RowError : public std::runtime_error {
 public:
  RowError(std::string reason, const std::string& message) : std::runtime_error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// Validated constructors shared by all formats. They throw RowError (message starts with
// "FILE:LINE: ") for: empty conversation, unknown role (role_names[i] as written in the file is
// mapped by the caller; pass the raw name to chat_role_from_any), no user turn, no assistant
// turn, system message not first; ids < 0 or >= vocab_size; labels length mismatch.
Sample make_chat_sample(std::string file, int64_t line, std::vector<ChatMessage> messages);
Sample make_tokenized_sample(std::string file, int64_t line, std::vector<int32_t> input_ids,
                             std::vector<int32_t> labels, int64_t vocab_size);
// Maps ultrachat/sharegpt role names (system, user, assistant, human, gpt) to a role.
std::optional<ChatRole> chat_role_from_any(std::string_view name);

// Reads one file. Throws qt::Error (FILE:LINE: ...) on the first bad row unless skip_bad_rows.
// A UTF-8 byte order mark at the start of a JSON / JSONL file is skipped.
std::vector<Sample> read_samples(const std::string& path, const ReadOptions& opts, ReadStats* stats = nullptr);
// fn(chunk, fraction): the next samples of the file in order (fn may move them away) and the share
// of the file read so far.
using SampleChunkFn = std::function<void(std::vector<Sample>& chunk, double fraction)>;
// read_samples in chunks of chunk_rows samples (the last one shorter; skipped bad rows make one
// shorter too), for sets larger than memory wants to hold as text: JSONL is read 16 MiB at a time
// and parquet row by row (only the schema's columns are decoded), so at most one block's or one
// chunk's text is held. A .json array file is read whole (its samples still come in chunks);
// registered readers deliver one chunk.
void read_samples_chunked(const std::string& path, const ReadOptions& opts, ReadStats* stats, int64_t chunk_rows,
                          const SampleChunkFn& fn);
// resolve_data_files({path}) (data/data_files.h): a file gives itself, a directory its data files
// (recursively, sorted), a glob its matches, a hub id its snapshot's files.
std::vector<std::string> list_data_files(const std::string& path);
// Reads each path (file, directory, glob or hub id) in order.
std::vector<Sample> read_dataset(const std::vector<std::string>& paths, const ReadOptions& opts, ReadStats* stats = nullptr);

using SampleReaderFn = std::function<std::vector<Sample>(const std::string& path, const ReadOptions&, ReadStats*)>;
// Plugs a reader in for an extension (".parquet"); list_data_files picks those files up too.
void register_sample_reader(const std::string& extension, SampleReaderFn fn);
std::vector<std::string> data_file_extensions();

// UTF-8 helpers: offset of the first invalid byte (npos if valid); copy with each maximal invalid
// subsequence replaced by U+FFFD.
size_t utf8_first_invalid(std::string_view s);
std::string utf8_replace_invalid(std::string_view s);

}  // namespace qt
