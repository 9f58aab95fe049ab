#include "data/data_job.h"

#include <filesystem>

#include "config/config_schema.h"
#include "core/error.h"

namespace qt {
namespace fs = std::filesystem;


std::string resolve_tokenizer(const std::string& p) {
  if (fs::is_directory(p)) return (fs::path(p) / "tokenizer.json").string();
  return p;
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
  if (d["path"].IsSequence()) {
    for (const auto& p : d["path"]) job.data.push_back(p.as<std::string>());
  } else {
    job.data.push_back(d["path"].as<std::string>());
  }
  const fs::path base = fs::path(path).parent_path();
  auto rel = [&](const std::string& p) { return fs::path(p).is_absolute() || base.empty() ? p : (base / p).string(); };
  for (auto& p : job.data) p = rel(p);
  job.tokenizer = resolve_tokenizer(rel(job.tokenizer));
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
  if (d["cache_dir"]) {
    job.cache_dir = rel(d["cache_dir"].as<std::string>());
  } else {
    const fs::path first(job.data.front());
    job.cache_dir = ((fs::is_directory(first) ? first : first.parent_path()) / ".qwentune-cache").string();
  }
  return job;
}

}  // namespace qt
