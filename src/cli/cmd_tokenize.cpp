// qwentune tokenize --tokenizer PATH [--threads N] [--fix-utf8]
// Reads JSONL {"text": "..."} from stdin and writes one JSON array of token ids per line, in input
// order, with no special tokens added. Lines are read in batches and encoded on N threads.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/data_job.h"
#include "text/tokenizer.h"

namespace qt::cli {
namespace {

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  out += '[';
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    const int n = std::snprintf(buf, sizeof buf, "%d", static_cast<int>(ids[i]));
    out.append(buf, static_cast<size_t>(n));
  }
  out += "]\n";
}

// Encodes one JSONL line; throws qt::Error "stdin:LINE: ..." when it is not {"text": string}.
std::string encode_line(const Tokenizer& tok, const std::string& raw, int64_t line_no, bool fix_utf8,
                        std::vector<int32_t>& ids) {
  const std::string fixed = fix_utf8 ? Tokenizer::fix_utf8(raw) : std::string();
  const std::string& line = fix_utf8 ? fixed : raw;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL("stdin:", line_no, ": malformed JSON: ", e.what());
  }
  QT_CHECK(j.is_object(), "stdin:", line_no, ": expected a JSON object {\"text\": ...}");
  auto it = j.find("text");
  QT_CHECK(it != j.end(), "stdin:", line_no, ": no \"text\" field");
  QT_CHECK(it->is_string(), "stdin:", line_no, ": \"text\" is not a string");
  ids.clear();
  try {
    tok.encode_append(it->get_ref<const std::string&>(), ids, fix_utf8);
  } catch (const Error& e) {
    QT_FAIL("stdin:", line_no, ": ", e.what());
  }
  std::string out;
  append_ids(out, ids);
  return out;
}

void run_tokenize(const std::string& path, int threads, bool fix_utf8) {
  const Tokenizer tok = Tokenizer::load(path);
  if (threads > 0) set_num_threads(threads);
  const int workers = num_threads();
  constexpr size_t kBatchLines = 8192;
  constexpr size_t kBatchBytes = size_t{16} << 20;
  std::ios::sync_with_stdio(false);
  std::vector<std::string> lines, outputs, errors;
  int64_t first_line = 1;
  std::string line;
  bool eof = false;
  while (!eof) {
    lines.clear();
    size_t bytes = 0;
    while (lines.size() < kBatchLines && bytes < kBatchBytes) {
      if (!std::getline(std::cin, line)) {
        eof = true;
        break;
      }
      bytes += line.size();
      lines.push_back(std::move(line));
    }
    if (lines.empty()) break;
    outputs.assign(lines.size(), std::string());
    errors.assign(lines.size(), std::string());
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    parallel_for(
        workers,
        [&](int64_t, int64_t) {
          std::vector<int32_t> ids;
          for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < lines.size();) {
            try {
              outputs[i] = encode_line(tok, lines[i], first_line + static_cast<int64_t>(i), fix_utf8, ids);
            } catch (const Error& e) {
              errors[i] = e.what();
              failed = true;
            }
          }
        },
        1);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!errors[i].empty()) {  // the first bad line of the batch; earlier lines are written
        std::fflush(stdout);
        QT_FAIL(errors[i]);
      }
      std::fwrite(outputs[i].data(), 1, outputs[i].size(), stdout);
    }
    first_line += static_cast<int64_t>(lines.size());
  }
  std::fflush(stdout);
  QT_CHECK(!std::ferror(stdout), "error writing to stdout");
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Tokenize JSONL {\"text\": ...} lines from stdin into JSON id arrays");
  auto path = std::make_shared<std::string>();
  auto threads = std::make_shared<int>(0);
  auto fix = std::make_shared<bool>(false);
  cmd->add_option("--tokenizer", *path, "tokenizer.json, a model directory or a hub id")->required();
  cmd->add_option("--threads", *threads, "worker threads (default: QWENTUNE_THREADS or all cores)");
  cmd->add_flag("--fix-utf8", *fix, "replace invalid UTF-8 with U+FFFD instead of failing");
  cmd->callback([=] { run_tokenize(resolve_tokenizer(*path), *threads, *fix); });
}

}  // namespace qt::cli
