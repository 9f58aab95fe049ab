// bench_tokenizer --tokenizer PATH --corpus FILE [--repeat-mb 20] [--seconds 5] [--threads N]
// Tokenizes the corpus (JSONL {"text": ...} lines, repeated in memory to about repeat-mb MB, the
// same document list tools/make_tokenizer_goldens.py times HF `tokenizers` on) for a fixed time,
// with 1 thread and with N threads (default: all cores). Prints one JSON object.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  int threads;
  double seconds;
  int64_t tokens, bytes, passes;
  double first_pass_seconds;
};

// Passes over docs on `threads` threads until `seconds` have elapsed (at least one pass).
Run run(const qt::Tokenizer& tok, const std::vector<std::string>& docs, int threads, double seconds) {
  Run r{threads, 0, 0, 0, 0, 0};
  const auto t0 = Clock::now();
  for (;;) {
    std::atomic<size_t> next{0};
    std::atomic<int64_t> tokens{0}, bytes{0};
    auto work = [&] {
      std::vector<int32_t> ids;
      int64_t t = 0, b = 0;
      for (size_t i; (i = next.fetch_add(16)) < docs.size();) {
        for (size_t k = i; k < std::min(docs.size(), i + 16); ++k) {
          ids.clear();
          tok.encode_append(docs[k], ids);
          t += static_cast<int64_t>(ids.size());
          b += static_cast<int64_t>(docs[k].size());
        }
      }
      tokens += t;
      bytes += b;
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < threads; ++w) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    r.tokens += tokens;
    r.bytes += bytes;
    ++r.passes;
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.passes == 1) r.first_pass_seconds = el;
    if (el >= seconds) {
      r.seconds = el;
      return r;
    }
  }
}

nlohmann::json to_json(const Run& r) {
  return {{"threads", r.threads},
          {"seconds", r.seconds},
          {"passes", r.passes},
          {"tokens", r.tokens},
          {"tokens_per_s", r.tokens / r.seconds},
          {"mb_per_s", r.bytes / r.seconds / 1e6},
          {"first_pass_tokens_per_s", (r.tokens / r.passes) / r.first_pass_seconds}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer, corpus;
  double repeat_mb = 20, seconds = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_tokenizer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer") tokenizer = val();
    else if (a == "--corpus") corpus = val();
    else if (a == "--repeat-mb") repeat_mb = std::atof(val().c_str());
    else if (a == "--seconds") seconds = std::atof(val().c_str());
    else if (a == "--threads") threads = std::atoi(val().c_str());
    else {
      std::fprintf(stderr, "usage: bench_tokenizer --tokenizer PATH --corpus FILE.jsonl [--repeat-mb 20] [--seconds 5] [--threads N]\n");
      return 2;
    }
  }
  if (tokenizer.empty() || corpus.empty()) {
    std::fprintf(stderr, "bench_tokenizer: --tokenizer and --corpus are required\n");
    return 2;
  }
  try {
    const auto t0 = Clock::now();
    const qt::Tokenizer tok = qt::Tokenizer::load(tokenizer);
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::ifstream in(corpus);
    QT_CHECK(in, corpus, ": cannot open");
    std::vector<std::string> base;
    size_t base_bytes = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      base.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      base_bytes += base.back().size();
    }
    QT_CHECK(base_bytes > 0, corpus, ": no text");
    std::vector<std::string> docs;
    size_t bytes = 0;
    while (bytes < repeat_mb * 1e6 || docs.empty())
      for (const auto& d : base) {
        docs.push_back(d);
        bytes += d.size();
      }
    nlohmann::json out = {{"engine", "qwentune"},
                          {"tokenizer", tokenizer},
                          {"docs", docs.size()},
                          {"corpus_mb", bytes / 1e6},
                          {"load_seconds", load_s},
                          {"single_thread", to_json(run(tok, docs, 1, seconds))}};
    if (threads > 1) out["multi_thread"] = to_json(run(tok, docs, threads, seconds));
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
