#include "data/readers.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <simdjson.h>

#include "core/error.h"
#include "core/log.h"
#include <nlohmann/json.hpp>

#include "data/data_files.h"
#include "data/parquet.h"

namespace qt {
namespace {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

constexpr size_t kMaxBadExamples = 5;

// A row's text inside the file buffer and the 1-based line it starts on.
struct Row {
  std::string_view text;
  int64_t line;
};

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

// Printable excerpt of a row for error messages: at most 80 bytes, control/invalid bytes escaped.
std::string snippet(std::string_view s) {
  std::string out;
  const size_t n = std::min<size_t>(s.size(), 80);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x80) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

// The non-blank lines of buf; the first one is line `first_line` of the file.
std::vector<Row> split_lines(std::string_view buf, int64_t first_line = 1) {
  std::vector<Row> rows;
  size_t pos = 0;
  int64_t line = first_line;
  while (pos < buf.size()) {
    size_t nl = buf.find('\n', pos);
    if (nl == std::string_view::npos) nl = buf.size();
    std::string_view text = buf.substr(pos, nl - pos);
    if (!blank(text)) rows.push_back({text, line});
    pos = nl + 1;
    ++line;
  }
  return rows;
}

// Splits a top-level JSON array into its element texts (each parsed on its own later, so a
// malformed element is reported with its own line). Structural errors of the array itself throw.
std::vector<Row> split_json_array(std::string_view buf, const std::string& file) {
  std::vector<Row> rows;
  size_t i = 0;
  int64_t line = 1;
  auto skip_ws = [&] {
    while (i < buf.size() && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n')) {
      if (buf[i] == '\n') ++line;
      ++i;
    }
  };
  skip_ws();
  QT_CHECK(i < buf.size() && buf[i] == '[', file, ":", line, ": expected a JSON array of rows");
  ++i;
  skip_ws();
  if (i < buf.size() && buf[i] == ']') {
    ++i;
  } else {
    for (;;) {
      skip_ws();
      QT_CHECK(i < buf.size(), file, ":", line, ": unterminated JSON array (missing ']')");
      const size_t start = i;
      const int64_t start_line = line;
      int depth = 0;
      bool in_string = false, done = false;
      for (; i < buf.size(); ++i) {
        const char c = buf[i];
        if (c == '\n') ++line;
        if (in_string) {
          if (c == '\\') {
            ++i;
          } else if (c == '"') {
            in_string = false;
          }
          continue;
        }
        if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if ((c == '}' || c == ']') && depth > 0) {
          --depth;
        } else if ((c == ',' || c == ']') && depth == 0) {
          done = true;
          break;
        }
      }
      QT_CHECK(done, file, ":", start_line, ": unterminated JSON array (missing ']'): ", snippet(buf.substr(start)));
      size_t end = i;
      while (end > start && std::isspace(static_cast<unsigned char>(buf[end - 1]))) --end;
      rows.push_back({buf.substr(start, end - start), start_line});
      const char sep = buf[i++];
      if (sep == ']') break;
    }
  }
  skip_ws();
  QT_CHECK(i >= buf.size(), file, ":", line, ": unexpected text after the JSON array: ", snippet(buf.substr(i)));
  return rows;
}

[[noreturn]] void row_fail(const char* reason, const std::string& file, int64_t line, const std::string& what) {
  throw RowError(reason, str(file, ":", line, ": ", what));
}

struct RowCtx {
  const std::string& file;
  int64_t line;
};

std::string get_string_field(dom::object obj, std::string_view key, const RowCtx& ctx, const std::string& where, bool required) {
  dom::element el;
  if (obj.at_key(key).get(el) != simdjson::SUCCESS || el.is_null()) {
    if (required) row_fail("missing field", ctx.file, ctx.line, str(where, "missing string field '", key, "'"));
    return "";
  }
  std::string_view sv;
  if (el.get_string().get(sv) != simdjson::SUCCESS)
    row_fail("bad field", ctx.file, ctx.line, str(where, "field '", key, "' is not a string"));
  return std::string(sv);
}

std::vector<ChatMessage> parse_turns(dom::object obj, const char* list_key, const char* role_key, const char* text_key,
                                     const RowCtx& ctx) {
  dom::element list_el;
  if (obj.at_key(list_key).get(list_el) != simdjson::SUCCESS)
    row_fail("missing field", ctx.file, ctx.line, str("missing field '", list_key, "'"));
  dom::array list;
  if (list_el.get_array().get(list) != simdjson::SUCCESS)
    row_fail("bad field", ctx.file, ctx.line, str("field '", list_key, "' is not an array"));
  std::vector<ChatMessage> turns;
  size_t idx = 0;
  for (dom::element m : list) {
    const std::string where = str(list_key, "[", idx, "]: ");
    dom::object mo;
    if (m.get_object().get(mo) != simdjson::SUCCESS) row_fail("bad field", ctx.file, ctx.line, where + "not an object");
    const std::string role_name = get_string_field(mo, role_key, ctx, where, true);
    const auto role = chat_role_from_any(role_name);
    if (!role)
      row_fail("unknown role", ctx.file, ctx.line,
               str(where, "unknown role '", role_name, "' (expected system, user, assistant; or human, gpt)"));
    ChatMessage cm;
    cm.role = *role;
    cm.content = get_string_field(mo, text_key, ctx, where, true);
    dom::element rc;
    if (mo.at_key("reasoning_content").get(rc) == simdjson::SUCCESS && !rc.is_null()) {
      std::string_view sv;
      if (rc.get_string().get(sv) != simdjson::SUCCESS)
        row_fail("bad field", ctx.file, ctx.line, where + "field 'reasoning_content' is not a string");
      cm.reasoning_content = std::string(sv);
    }
    turns.push_back(std::move(cm));
    ++idx;
  }
  return turns;
}

std::vector<int32_t> parse_int_array(dom::element el, const char* key, const RowCtx& ctx) {
  dom::array arr;
  if (el.get_array().get(arr) != simdjson::SUCCESS)
    row_fail("bad field", ctx.file, ctx.line, str("field '", key, "' is not an array of integers"));
  std::vector<int32_t> out;
  out.reserve(arr.size());
  size_t idx = 0;
  for (dom::element v : arr) {
    int64_t x;
    if (v.get_int64().get(x) != simdjson::SUCCESS || x < INT32_MIN || x > INT32_MAX)
      row_fail("bad field", ctx.file, ctx.line, str(key, "[", idx, "] is not a 32-bit integer"));
    out.push_back(static_cast<int32_t>(x));
    ++idx;
  }
  return out;
}

DataSchema detect_schema(dom::object obj, const RowCtx& ctx) {
  dom::element el;
  if (obj.at_key("messages").get(el) == simdjson::SUCCESS) return DataSchema::Ultrachat;
  if (obj.at_key("conversations").get(el) == simdjson::SUCCESS) return DataSchema::ShareGpt;
  if (obj.at_key("input_ids").get(el) == simdjson::SUCCESS) return DataSchema::Tokenized;
  if (obj.at_key("instruction").get(el) == simdjson::SUCCESS) return DataSchema::Alpaca;
  std::string keys;
  for (auto kv : obj) keys += (keys.empty() ? "" : ", ") + std::string(kv.key);
  row_fail("unknown schema", ctx.file, ctx.line,
           str("cannot detect the schema from keys [", keys,
               "]: expected 'messages' (ultrachat), 'conversations' (sharegpt), 'instruction'/'output' (alpaca) "
               "or 'input_ids' (tokenized)"));
}

Sample parse_row(dom::parser& parser, std::string_view text, const RowCtx& ctx, DataSchema* schema,
                 const ReadOptions& opts, bool* fixed) {
  std::string repaired;
  const size_t bad = utf8_first_invalid(text);
  if (bad != std::string_view::npos) {
    if (!opts.fix_utf8)
      row_fail("invalid UTF-8", ctx.file, ctx.line,
               str("invalid UTF-8 at byte ", bad, " of the row (--fix-utf8 replaces it with U+FFFD): ",
                   snippet(text.substr(bad >= 20 ? bad - 20 : 0))));
    repaired = utf8_replace_invalid(text);
    *fixed = true;
  }
  dom::element doc;
  const auto err = repaired.empty() ? parser.parse(text.data(), text.size(), false).get(doc)
                                    : parser.parse(repaired.data(), repaired.size(), true).get(doc);
  if (err != simdjson::SUCCESS)
    row_fail("malformed JSON", ctx.file, ctx.line, str("malformed JSON (", simdjson::error_message(err), "): ", snippet(text)));
  dom::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS)
    row_fail("malformed JSON", ctx.file, ctx.line, str("row is not a JSON object: ", snippet(text)));
  if (*schema == DataSchema::Auto) *schema = detect_schema(obj, ctx);

  switch (*schema) {
    case DataSchema::Ultrachat:
      return make_chat_sample(ctx.file, ctx.line, parse_turns(obj, "messages", "role", "content", ctx));
    case DataSchema::ShareGpt:
      return make_chat_sample(ctx.file, ctx.line, parse_turns(obj, "conversations", "from", "value", ctx));
    case DataSchema::Alpaca: {
      std::vector<ChatMessage> msgs;
      const std::string system = get_string_field(obj, "system", ctx, "", false);
      if (!system.empty()) msgs.push_back({ChatRole::System, system, std::nullopt});
      std::string user = get_string_field(obj, "instruction", ctx, "", true);
      const std::string input = get_string_field(obj, "input", ctx, "", false);
      if (!input.empty()) user += "\n\n" + input;
      msgs.push_back({ChatRole::User, user, std::nullopt});
      msgs.push_back({ChatRole::Assistant, get_string_field(obj, "output", ctx, "", true), std::nullopt});
      return make_chat_sample(ctx.file, ctx.line, std::move(msgs));
    }
    case DataSchema::Tokenized: {
      dom::element ids_el, labels_el;
      if (obj.at_key("input_ids").get(ids_el) != simdjson::SUCCESS)
        row_fail("missing field", ctx.file, ctx.line, "missing field 'input_ids'");
      std::vector<int32_t> ids = parse_int_array(ids_el, "input_ids", ctx), labels;
      if (obj.at_key("labels").get(labels_el) == simdjson::SUCCESS && !labels_el.is_null())
        labels = parse_int_array(labels_el, "labels", ctx);
      return make_tokenized_sample(ctx.file, ctx.line, std::move(ids), std::move(labels), opts.vocab_size);
    }
    case DataSchema::Auto: break;
  }
  QT_FAIL("unreachable schema");
}

// Parses rows into `out`; *schema carries the detected schema from chunk to chunk of a file.
void read_json_rows(const std::string& path, const std::vector<Row>& rows, const ReadOptions& opts, DataSchema* schema,
                    ReadStats* stats, std::vector<Sample>* out) {
  dom::parser parser;
  out->reserve(out->size() + rows.size());
  for (const Row& row : rows) {
    stats->rows++;
    bool fixed = false;
    try {
      out->push_back(parse_row(parser, row.text, RowCtx{path, row.line}, schema, opts, &fixed));
      stats->samples++;
      if (fixed) stats->utf8_fixed++;
    } catch (const RowError& e) {
      if (!opts.skip_bad_rows) throw_error(__FILE__, __LINE__, e.what());
      stats->bad_rows++;
      stats->bad_by_reason[e.reason()]++;
      if (stats->bad_examples.size() < kMaxBadExamples) stats->bad_examples.push_back(e.what());
    }
  }
}

// Keeps SIMDJSON_PADDING readable bytes after buf's end (rows are parsed in place).
void pad_for_simdjson(std::string* buf) {
  const size_t n = buf->size();
  if (buf->capacity() >= n + simdjson::SIMDJSON_PADDING) return;
  buf->resize(n + simdjson::SIMDJSON_PADDING, '\0');
  buf->resize(n);
}

constexpr char kUtf8Bom[] = "\xef\xbb\xbf";

// Hands parsed samples to fn whenever chunk_rows have gathered (and once at the end).
class ChunkSink {
 public:
  ChunkSink(const std::string& path, const ReadOptions& opts, ReadStats* stats, int64_t chunk_rows,
            const SampleChunkFn& fn)
      : path_(path), opts_(opts), stats_(stats), chunk_rows_(std::max<int64_t>(1, chunk_rows)), fn_(fn),
        schema_(opts.schema) {}
  // rows: the next rows of the file; fraction: the share of the file read once they are done.
  void add(const std::vector<Row>& rows, double fraction) {
    const double from = fraction_;
    for (size_t b = 0; b < rows.size(); b += static_cast<size_t>(chunk_rows_)) {
      const size_t e = std::min(rows.size(), b + static_cast<size_t>(chunk_rows_));
      read_json_rows(path_, std::vector<Row>(rows.begin() + static_cast<std::ptrdiff_t>(b), rows.begin() + static_cast<std::ptrdiff_t>(e)),
                     opts_, &schema_, stats_, &chunk_);
      fraction_ = from + (fraction - from) * static_cast<double>(e) / static_cast<double>(rows.size());
      flush();
    }
    fraction_ = fraction;
  }
  void finish(double fraction) {
    fraction_ = fraction;
    flush();
    stats_->schema_by_file[path_] = data_schema_name(schema_);
  }
  DataSchema schema() const { return schema_; }

 private:
  void flush() {
    if (chunk_.empty()) return;
    fn_(chunk_, fraction_);
    chunk_.clear();
  }
  const std::string& path_;
  const ReadOptions& opts_;
  ReadStats* stats_;
  int64_t chunk_rows_;
  const SampleChunkFn& fn_;
  DataSchema schema_;
  std::vector<Sample> chunk_;
  double fraction_ = 0;
};

// The parquet columns a schema reads (only those the file has), so the rest is never decoded;
// empty = all columns (auto-detection then sees every key, as for JSON).
std::vector<std::string> parquet_columns_for(const std::vector<std::string>& have, DataSchema schema) {
  auto has = [&](const char* c) { return std::find(have.begin(), have.end(), c) != have.end(); };
  if (schema == DataSchema::Auto) {
    if (has("messages")) schema = DataSchema::Ultrachat;
    else if (has("conversations")) schema = DataSchema::ShareGpt;
    else if (has("input_ids")) schema = DataSchema::Tokenized;
    else if (has("instruction")) schema = DataSchema::Alpaca;
    else return {};
  }
  std::vector<const char*> want;
  switch (schema) {
    case DataSchema::Ultrachat: want = {"messages"}; break;
    case DataSchema::ShareGpt: want = {"conversations"}; break;
    case DataSchema::Tokenized: want = {"input_ids", "labels"}; break;
    case DataSchema::Alpaca: want = {"instruction", "input", "output", "system"}; break;
    case DataSchema::Auto: break;
  }
  std::vector<std::string> cols;
  for (const char* c : want)
    if (has(c)) cols.push_back(c);
  return cols;
}

void read_parquet_chunked(const std::string& path, ChunkSink& sink, int64_t chunk_rows) {
  const ParquetFileInfo info = parquet_file_info(path);
  ParquetReadOptions po;
  po.columns = parquet_columns_for(info.columns, sink.schema());
  const int64_t total = std::max<int64_t>(1, info.num_rows);
  std::string text;
  int64_t first_row = 0, pending = 0;
  auto flush = [&](int64_t rows_done) {
    pad_for_simdjson(&text);
    sink.add(split_lines(text, first_row + 1), static_cast<double>(rows_done) / static_cast<double>(total));
    text.clear();
    first_row = rows_done;
    pending = 0;
  };
  // Rows become JSON Lines (row i on line i + 1) and go through the same row parser as JSONL.
  parquet_read_rows(path, [&](const nlohmann::json& row, int64_t index) {
    parquet_append_json_text(row, &text);
    text.push_back('\n');
    if (++pending >= chunk_rows) flush(index + 1);
  }, po);
  if (pending > 0) flush(first_row + pending);
}

// JSON Lines a block at a time; a JSON array file (first non-blank byte '[') is read whole.
void read_json_chunked(const std::string& path, ChunkSink& sink) {
  std::ifstream f(path, std::ios::binary);
  QT_CHECK(f.good(), path, ": cannot open data file");
  const double size = std::max<double>(1.0, static_cast<double>(fs::file_size(path)));
  constexpr size_t kBlock = size_t{16} << 20;
  std::string buf;
  int64_t line = 1;
  double consumed = 0;
  bool first = true;
  for (;;) {
    const size_t old = buf.size();
    buf.resize(old + kBlock + simdjson::SIMDJSON_PADDING);
    f.read(&buf[old], static_cast<std::streamsize>(kBlock));
    const size_t got = static_cast<size_t>(f.gcount());
    buf.resize(old + got);
    const bool eof = got < kBlock;
    if (first) {
      first = false;
      if (buf.compare(0, 3, kUtf8Bom) == 0) {
        buf.erase(0, 3);  // a UTF-8 byte order mark is not part of the first row
        consumed += 3;
      }
      size_t b = 0;
      while (b < buf.size() && std::isspace(static_cast<unsigned char>(buf[b]))) ++b;
      if (b < buf.size() && buf[b] == '[') {
        buf.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        pad_for_simdjson(&buf);
        sink.add(split_json_array(buf, path), 1.0);
        sink.finish(1.0);
        return;
      }
    }
    size_t end = buf.size();
    if (!eof) {
      const size_t nl = buf.rfind('\n');
      end = nl == std::string::npos ? 0 : nl + 1;
    }
    const std::string_view view(buf.data(), end);
    consumed += static_cast<double>(end);
    sink.add(split_lines(view, line), std::min(1.0, consumed / size));
    line += std::count(view.begin(), view.end(), '\n');
    buf.erase(0, end);
    if (eof) break;
  }
  sink.finish(1.0);
}

std::string lower_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, SampleReaderFn>& registry() {
  static std::map<std::string, SampleReaderFn> r;
  return r;
}

}  // namespace

DataSchema data_schema_from_name(const std::string& name) {
  if (name == "auto") return DataSchema::Auto;
  if (name == "ultrachat" || name == "messages") return DataSchema::Ultrachat;
  if (name == "sharegpt") return DataSchema::ShareGpt;
  if (name == "alpaca") return DataSchema::Alpaca;
  if (name == "tokenized" || name == "pretokenized") return DataSchema::Tokenized;
  QT_FAIL("schema '", name, "' is not one of auto, ultrachat, sharegpt, alpaca, tokenized");
}

const char* data_schema_name(DataSchema s) {
  switch (s) {
    case DataSchema::Auto: return "auto";
    case DataSchema::Ultrachat: return "ultrachat";
    case DataSchema::ShareGpt: return "sharegpt";
    case DataSchema::Alpaca: return "alpaca";
    case DataSchema::Tokenized: return "tokenized";
  }
  return "?";
}

void ReadStats::merge(const ReadStats& o) {
  rows += o.rows;
  samples += o.samples;
  bad_rows += o.bad_rows;
  utf8_fixed += o.utf8_fixed;
  for (const auto& kv : o.bad_by_reason) bad_by_reason[kv.first] += kv.second;
  for (const auto& e : o.bad_examples)
    if (bad_examples.size() < kMaxBadExamples) bad_examples.push_back(e);
  for (const auto& kv : o.schema_by_file) schema_by_file[kv.first] = kv.second;
}

std::optional<ChatRole> chat_role_from_any(std::string_view name) {
  if (name == "human") return ChatRole::User;
  if (name == "gpt") return ChatRole::Assistant;
  return chat_role_from_name(name);
}

Sample make_chat_sample(std::string file, int64_t line, std::vector<ChatMessage> messages) {
  if (messages.empty()) row_fail("empty conversation", file, line, "empty conversation (no messages)");
  bool user = false, assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == ChatRole::System && i != 0)
      row_fail("system not first", file, line, str("message ", i, " is a system message; only the first message may be"));
    user |= messages[i].role == ChatRole::User;
    assistant |= messages[i].role == ChatRole::Assistant;
  }
  if (!user) row_fail("no user turn", file, line, "conversation has no user turn");
  if (!assistant) row_fail("no assistant turn", file, line, "conversation has no assistant turn (nothing to train on)");
  Sample s;
  s.file = std::move(file);
  s.line = line;
  s.messages = std::move(messages);
  return s;
}

Sample make_tokenized_sample(std::string file, int64_t line, std::vector<int32_t> input_ids, std::vector<int32_t> labels,
                             int64_t vocab_size) {
  if (input_ids.empty()) row_fail("empty conversation", file, line, "input_ids is empty");
  if (!labels.empty() && labels.size() != input_ids.size())
    row_fail("bad field", file, line,
             str("labels has ", labels.size(), " entries but input_ids has ", input_ids.size(),
                 " (labels are unshifted, one per input id)"));
  for (size_t i = 0; i < input_ids.size(); ++i) {
    const int32_t id = input_ids[i];
    if (id < 0 || (vocab_size > 0 && id >= vocab_size))
      row_fail("id out of vocabulary", file, line,
               str("input_ids[", i, "] = ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const int32_t id = labels[i];
    if (id != kIgnoreLabel && (id < 0 || (vocab_size > 0 && id >= vocab_size)))
      row_fail("id out of vocabulary", file, line,
               str("labels[", i, "] = ", id, " is neither -100 nor inside the vocabulary [0, ", vocab_size, ")"));
  }
  Sample s;
  s.file = std::move(file);
  s.line = line;
  s.pretokenized = true;
  s.input_ids = std::move(input_ids);
  s.labels = std::move(labels);
  return s;
}

void read_samples_chunked(const std::string& path, const ReadOptions& opts, ReadStats* stats, int64_t chunk_rows,
                          const SampleChunkFn& fn) {
  ReadStats local;
  ReadStats* st = stats ? stats : &local;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  QT_CHECK(fs::exists(status), path, ": data file does not exist");
  QT_CHECK(fs::is_regular_file(status), path, ": data file is not a regular file or directory",
           status.type() == fs::file_type::fifo ? " (it is a FIFO)" : status.type() == fs::file_type::socket ? " (it is a socket)" : "");
  const std::string ext = lower_extension(path);
  {
    std::unique_lock<std::mutex> lock(registry_mutex());
    auto it = registry().find(ext);
    if (it != registry().end()) {
      SampleReaderFn reader = it->second;
      lock.unlock();
      std::vector<Sample> all = reader(path, opts, st);
      if (!all.empty()) fn(all, 1.0);
      return;
    }
  }
  QT_CHECK(ext == ".jsonl" || ext == ".json" || ext == ".parquet", path, ": unknown data file extension '", ext,
           "' (expected .jsonl, .json or .parquet", registry().empty() ? "" : " or a registered one", ")");
  ChunkSink sink(path, opts, st, chunk_rows, fn);
  if (ext == ".parquet") {
    read_parquet_chunked(path, sink, std::max<int64_t>(1, chunk_rows));
    sink.finish(1.0);
  } else {
    read_json_chunked(path, sink);
  }
}

std::vector<Sample> read_samples(const std::string& path, const ReadOptions& opts, ReadStats* stats) {
  std::vector<Sample> all;
  read_samples_chunked(path, opts, stats, int64_t{1} << 40, [&](std::vector<Sample>& chunk, double) {
    if (all.empty()) {
      all = std::move(chunk);
    } else {
      all.insert(all.end(), std::make_move_iterator(chunk.begin()), std::make_move_iterator(chunk.end()));
    }
  });
  return all;
}

void register_sample_reader(const std::string& extension, SampleReaderFn fn) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[extension] = std::move(fn);
}

std::vector<std::string> data_file_extensions() {
  std::vector<std::string> exts = {".jsonl", ".json", ".parquet"};
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& kv : registry()) exts.push_back(kv.first);
  return exts;
}

std::vector<std::string> list_data_files(const std::string& path) { return resolve_data_files({path}); }

std::vector<Sample> read_dataset(const std::vector<std::string>& paths, const ReadOptions& opts, ReadStats* stats) {
  std::vector<Sample> all;
  for (const auto& f : resolve_data_files(paths)) {
    auto part = read_samples(f, opts, stats);
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

size_t utf8_first_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + len > n) return i;
    const auto c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_replace_invalid(std::string_view s) {
  static const char kReplacement[] = "\xef\xbf\xbd";
  std::string out;
  out.reserve(s.size() + 8);
  while (!s.empty()) {
    const size_t bad = utf8_first_invalid(s);
    if (bad == std::string_view::npos) {
      out.append(s);
      break;
    }
    out.append(s.substr(0, bad));
    // Skip the maximal prefix of a valid sequence (at least one byte), replaced by one U+FFFD.
    const auto c = static_cast<unsigned char>(s[bad]);
    size_t skip = 1;
    if (c >= 0xc2 && c <= 0xf4) {
      const size_t len = c <= 0xdf ? 2 : c <= 0xef ? 3 : 4;
      unsigned char lo = 0x80, hi = 0xbf;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
      size_t k = 1;
      while (k < len && bad + k < s.size()) {
        const auto ck = static_cast<unsigned char>(s[bad + k]);
        const bool ok = k == 1 ? (ck >= lo && ck <= hi) : (ck & 0xc0) == 0x80;
        if (!ok) break;
        ++k;
      }
      skip = k;
    }
    out.append(kReplacement, 3);
    s = s.substr(bad + skip);
  }
  return out;
}

}  // namespace qt
