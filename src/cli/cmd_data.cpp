// qwentune data-stats --tokenizer PATH --data FILE|DIR [...]   one JSON object of dataset statistics
// qwentune prepare --config FILE.yaml                           tokenize + cache, packing statistics
//
// Both print rows/s and the peak host RSS (VmHWM) of the run; tokenizing streams (token_cache.h)
// and shows a progress line on stderr.
//
// prepare's YAML: `model`/`tokenizer` and the `data:` section of data/data_job.h (other top-level
// sections belong to the trainer).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "config/config_schema.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "data/data_job.h"
#include "data/packer.h"
#include "data/token_cache.h"
#include "text/tokenizer.h"

namespace qt::cli {
namespace {

namespace fs = std::filesystem;

nlohmann::ordered_json length_histogram(const TokenizedDataset& d) {
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < d.num_samples(); ++i) {
    const int64_t len = d.length(i);
    size_t b = 0;
    while ((int64_t{64} << b) <= len) ++b;  // bucket b: [64 << (b-1), 64 << b), bucket 0: [0, 64)
    if (counts.size() <= b) counts.resize(b + 1, 0);
    counts[b]++;
  }
  nlohmann::ordered_json h = nlohmann::ordered_json::array();
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t lo = b == 0 ? 0 : int64_t{64} << (b - 1), hi = (int64_t{64} << b) - 1;
    h.push_back({{"min", lo}, {"max", hi}, {"count", counts[b]}});
  }
  return h;
}

nlohmann::ordered_json run_job(const DataJob& job) {
  const std::string tok_path = resolve_tokenizer(job.tokenizer);
  QT_CHECK(fs::is_regular_file(tok_path), tok_path, ": tokenizer.json does not exist");
  const Tokenizer tok = Tokenizer::load(tok_path);
  if (job.opts.read.schema != DataSchema::Tokenized) check_chat_tokenizer(tok);
  const auto start = std::chrono::steady_clock::now();
  TokenizeResult r = tokenize_data_job(job, tok);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const TokenizedDataset eval = tokenize_eval_set(job, tok);
  const TokenizedDataset& d = r.data;

  PackOptions pack = job.pack;
  if (const auto pad = tok.token_to_id("<|endoftext|>")) pack.pad_id = *pad;
  pack.mode = PackMode::Packed;
  const PackPlan packed = pack_plan(d, pack, 0);
  pack.mode = PackMode::Padded;
  const PackPlan padded = pack_plan(d, pack, 0);

  int64_t trained = 0, max_len = 0;
  for (int32_t l : d.labels) trained += l != kIgnoreLabel;
  for (int64_t i = 0; i < d.num_samples(); ++i) max_len = std::max(max_len, d.length(i));

  nlohmann::ordered_json j;
  j["rows"] = r.read_stats.rows;
  j["conversations"] = d.num_samples();
  j["bad_rows"] = r.read_stats.bad_rows;
  if (!r.read_stats.bad_by_reason.empty()) j["bad_rows_by_reason"] = r.read_stats.bad_by_reason;
  if (!r.read_stats.bad_examples.empty()) j["bad_row_examples"] = r.read_stats.bad_examples;
  j["utf8_fixed_rows"] = r.read_stats.utf8_fixed;
  j["tokens"] = d.num_tokens();
  j["trained_tokens"] = trained;
  j["max_length"] = max_len;
  j["mean_length"] = d.num_samples() ? static_cast<double>(d.num_tokens()) / static_cast<double>(d.num_samples()) : 0.0;
  j["tokens_per_batch"] = pack.tokens_per_batch;
  j["batches_packed"] = packed.stats.batches;
  j["batches_padded"] = padded.stats.batches;
  j["fill_ratio"] = packed.stats.fill_ratio();
  j["fill_ratio_padded"] = padded.stats.fill_ratio();
  j["packed_tokens"] = packed.stats.tokens;
  j["trained_targets"] = packed.stats.trained_targets;
  j["overflow"] = overflow_name(pack.overflow);
  j["truncated"] = packed.stats.truncated;
  j["truncated_tokens"] = packed.stats.truncated_tokens;
  j["split"] = packed.stats.split;
  j["dropped_untrained"] = packed.stats.dropped_untrained;
  j["length_histogram"] = length_histogram(d);
  j["thinking"] = thinking_mode_name(job.opts.chat.thinking);
  j["train_on"] = train_on_name(job.opts.chat.train_on);
  if (!r.read_stats.schema_by_file.empty()) j["schema_by_file"] = r.read_stats.schema_by_file;
  if (!r.cache_path.empty()) {
    j["cache"] = {{"path", r.cache_path}, {"key", r.key}, {"hit", r.cache_hit}};
  }
  if (!job.eval_data.empty()) j["eval"] = {{"conversations", eval.num_samples()}, {"tokens", eval.num_tokens()}};
  j["seconds"] = seconds;  // read + tokenize (+ cache write), or the cache load on a hit
  j["rows_per_s"] = seconds > 0 ? static_cast<double>(r.read_stats.rows) / seconds : 0.0;
  j["peak_rss_gib"] = static_cast<double>(peak_rss_bytes()) / static_cast<double>(int64_t{1} << 30);
  if (r.read_stats.bad_rows > 0)
    log_warn(r.read_stats.bad_rows, " bad rows skipped (first: ", r.read_stats.bad_examples.front(), ")");
  return j;
}

DataJob job_from_yaml(const std::string& path) {
  const YAML::Node root = yaml_load_file(path);
  config_validate(root, ConfigSource{path, {}});
  return data_job_from_yaml(root, path);
}

}  // namespace

void add_data_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("data-stats", "Tokenize a dataset and print one JSON object of statistics");
    auto job = std::make_shared<DataJob>();
    auto schema = std::make_shared<std::string>("auto");
    auto train_on = std::make_shared<std::string>("assistant");
    auto thinking = std::make_shared<std::string>("on");
    auto overflow = std::make_shared<std::string>("truncate");
    job->pack.tokens_per_batch = 8192;
    cmd->add_option("--tokenizer", job->tokenizer, "tokenizer.json or a model directory holding one")->required();
    cmd->add_option("--data", job->data, "data file, directory, glob or hub data set id (*.jsonl, *.json, *.parquet); repeatable")->required();
    cmd->add_option("--split", job->split, "the split to read (e.g. train_sft) when the data holds several");
    cmd->add_option("--tokens-per-batch", job->pack.tokens_per_batch, "tokens per packed batch")->capture_default_str();
    cmd->add_option("--schema", *schema, "auto|ultrachat|sharegpt|alpaca|tokenized")->capture_default_str();
    cmd->add_option("--train-on", *train_on, "assistant|last_assistant|all")->capture_default_str();
    cmd->add_option("--thinking", *thinking, "on|off")->capture_default_str();
    cmd->add_option("--overflow", *overflow, "truncate|split (samples longer than a batch)")->capture_default_str();
    cmd->add_option("--shuffle-window", job->pack.shuffle_window, "samples per best-fit window")->capture_default_str();
    cmd->add_option("--seed", job->pack.seed, "shuffle seed")->capture_default_str();
    cmd->add_option("--cache-dir", job->cache_dir, "token cache directory (default: no cache)");
    cmd->add_option("--threads", job->threads, "tokenizer threads (0 = all)")->capture_default_str();
    cmd->add_flag("--skip-bad-rows", job->opts.read.skip_bad_rows, "count and skip bad rows instead of failing");
    cmd->add_flag("--fix-utf8", job->opts.read.fix_utf8, "replace invalid UTF-8 with U+FFFD instead of failing");
    cmd->callback([=] {
      job->opts.read.schema = data_schema_from_name(*schema);
      job->opts.chat.train_on = train_on_from_name(*train_on);
      job->opts.chat.thinking = thinking_mode_from_name(*thinking);
      job->pack.overflow = overflow_from_name(*overflow);
      job->cache = !job->cache_dir.empty();
      std::printf("%s\n", run_job(*job).dump(2).c_str());
    });
  }
  {
    auto* cmd = app.add_subcommand("prepare", "Tokenize and cache the dataset of a config; print packing statistics");
    auto config = std::make_shared<std::string>();
    cmd->add_option("--config", *config, "YAML config (model/tokenizer + data section)")->required();
    cmd->callback([=] {
      const DataJob job = job_from_yaml(*config);
      std::printf("%s\n", run_job(job).dump(2).c_str());
    });
  }
}

}  // namespace qt::cli
