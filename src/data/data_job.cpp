#include "data/data_job.h"

#include <filesystem>
#include <set>

#include "config/config_schema.h"
#include "core/error.h"
#include "core/log.h"
#include "data/data_files.h"
#include "io/hub_cache.h"
#include "text/tokenizer.h"

namespace qt {
namespace fs = std::filesystem;

std::string resolve_tokenizer(const std::string& p) {
  if (fs::is_directory(p)) return (fs::path(p) / "tokenizer.json").string();
  if (hub_looks_like_id(p)) return (fs::path(resolve_model_dir(p)) / "tokenizer.json").string();
  return p;
}

std::string config_relative_path(const std::string& config_file, const std::string& p) {
  const fs::path base = fs::path(config_file).parent_path();
  if (p.empty() || fs::path(p).is_absolute() || base.empty()) return p;
  const fs::path anchored = base / p;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(anchored, ec)) && hub_looks_like_id(p)) return p;
  return anchored.string();
}

namespace {

std::vector<std::string> string_or_list(const YAML::Node& n, const char* key, const std::string& path) {
  std::vector<std::string> out;
  try {
    if (n.IsSequence()) {
      for (const auto& p : n) out.push_back(p.as<std::string>());
    } else {
      out.push_back(n.as<std::string>());
    }
  } catch (const YAML::Exception& e) {
    QT_FAIL(path, ": data.", key, " (line ", n.Mark().line + 1, "): expected a path or a list of paths: ", e.what());
  }
  QT_CHECK(!out.empty(), path, ": data.", key, " is an empty list");
  for (auto& p : out) p = config_relative_path(path, p);
  return out;
}

std::string job_cache_dir(const DataJob& job) {
  if (!job.cache) return "";
  return job.cache_dir.empty() ? default_token_cache_dir(job.data) : job.cache_dir;
}

}  // namespace

TokenizeResult tokenize_data_job(const DataJob& job, const Tokenizer& tokenizer) {
  const std::vector<std::string> files = resolve_data_files(job.data, job.split);
  return tokenize_files(files, tokenizer, job.opts, job_cache_dir(job), job.threads);
}

TokenizedDataset tokenize_eval_set(const DataJob& job, const Tokenizer& tokenizer) {
  if (job.eval_data.empty()) return {};
  const std::vector<std::string> train = resolve_data_files(job.data, job.split);
  const std::vector<std::string> eval = resolve_data_files(job.eval_data, job.eval_split);
  std::set<std::string> train_set;
  std::error_code ec;
  for (const auto& f : train) train_set.insert(fs::weakly_canonical(f, ec).string());
  for (const auto& f : eval)
    QT_CHECK(!train_set.count(fs::weakly_canonical(f, ec).string()), f,
             ": is in both the training set and the eval set (data.eval_path / data.eval_split)");
  TokenizeResult r = tokenize_files(eval, tokenizer, job.opts, job_cache_dir(job), job.threads);
  log_info("eval set: ", r.data.num_samples(), " samples, ", r.data.num_tokens(), " tokens from ", eval.size(), " file(s)");
  return std::move(r.data);
}

DataJob data_job_from_yaml(const YAML::Node& root, const std::string& path) {
  DataJob job;
  if (root["tokenizer"] && !root["tokenizer"].IsNull()) {
    job.tokenizer = root["tokenizer"].as<std::string>();
  } else {
    QT_CHECK(root["model"], path, ": needs `model: DIR` or `tokenizer: PATH`");
    job.tokenizer = root["model"].as<std::string>();
  }
  const YAML::Node d = root["data"];
  QT_CHECK(d && d.IsMap(), path, ": needs a `data:` section");
  QT_CHECK(d["path"], path, ": needs data.path");
  job.data = string_or_list(d["path"], "path", path);
  job.split = config_get<std::string>(d, "data", "split", path);
  job.eval_split = config_get<std::string>(d, "data", "eval_split", path);
  if (d["eval_path"]) {
    job.eval_data = string_or_list(d["eval_path"], "eval_path", path);
  } else if (!job.eval_split.empty()) {
    job.eval_data = job.data;  // eval_split alone: another split of the same data set
  }
  QT_CHECK(job.eval_data.empty() || job.eval_data != job.data || job.eval_split != job.split, path,
           ": the eval set (data.eval_path / data.eval_split) is the training set; name another split or path");
  job.tokenizer = config_relative_path(path, job.tokenizer);
  job.opts.read.schema = data_schema_from_name(config_get<std::string>(d, "data", "schema", path));
  job.opts.chat.train_on = train_on_from_name(config_get<std::string>(d, "data", "train_on", path));
  job.opts.chat.thinking = thinking_mode_from_name(config_get<std::string>(d, "data", "thinking", path));
  job.opts.read.skip_bad_rows = config_get<bool>(d, "data", "skip_bad_rows", path);
  job.opts.read.fix_utf8 = config_get<bool>(d, "data", "fix_utf8", path);
  job.pack.tokens_per_batch = config_get<int64_t>(d, "data", "tokens_per_batch", path);
  job.pack.shuffle_window = config_get<int64_t>(d, "data", "shuffle_window", path);
  job.pack.seed = config_get<uint64_t>(d, "data", "seed", path);
  job.pack.overflow = overflow_from_name(config_get<std::string>(d, "data", "overflow", path));
  job.threads = config_get<int>(d, "data", "threads", path);
  QT_CHECK(job.pack.tokens_per_batch > 0, path, ": data.tokens_per_batch must be positive");
  if (d["cache_dir"]) job.cache_dir = config_relative_path(path, d["cache_dir"].as<std::string>());
  return job;
}

}  // namespace qt
