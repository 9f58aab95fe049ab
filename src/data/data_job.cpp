#include "data/data_job.h"

#include <filesystem>
#include <set>

#include "core/error.h"

namespace qt {
namespace fs = std::filesystem;


std::string resolve_tokenizer(const std::string& p) {
  if (fs::is_directory(p)) return (fs::path(p) / "tokenizer.json").string();
  return p;
}

YAML::Node yaml_load_file(const std::string& path) {
  QT_CHECK(fs::is_regular_file(path), path, ": config file does not exist");
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    QT_FAIL(path, ": malformed YAML: ", e.what());
  }
}

void yaml_apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    QT_CHECK(eq != std::string::npos && eq > 0, "--set '", o, "': expected key=value (e.g. train.lr=1e-4)");
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    std::vector<std::string> parts;
    for (size_t b = 0; b <= key.size();) {
      size_t e = key.find('.', b);
      if (e == std::string::npos) e = key.size();
      QT_CHECK(e > b, "--set '", o, "': empty key part");
      parts.push_back(key.substr(b, e - b));
      b = e + 1;
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      QT_FAIL("--set '", o, "': value is not valid YAML: ", e.what());
    }
    // yaml-cpp nodes are handles: walk by reassigning a handle to each child.
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node child = chain.back()[parts[i]];
      if (!child.IsDefined() || child.IsNull()) {
        chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
        child = chain.back()[parts[i]];
      }
      QT_CHECK(child.IsMap(), "--set '", o, "': '", parts[i], "' is not a section");
      chain.push_back(child);
    }
    chain.back()[parts.back()] = parsed;
  }
}

DataJob data_job_from_yaml(const YAML::Node& root, const std::string& path) {
  DataJob job;
  if (root["tokenizer"]) {
    job.tokenizer = root["tokenizer"].as<std::string>();
  } else {
    QT_CHECK(root["model"], path, ": needs `model: DIR` or `tokenizer: PATH`");
    job.tokenizer = root["model"].as<std::string>();
  }
  const YAML::Node d = root["data"];
  QT_CHECK(d && d.IsMap(), path, ": needs a `data:` section");
  static const std::set<std::string> known = {"path", "schema", "train_on", "thinking", "tokens_per_batch",
                                              "shuffle_window", "seed", "overflow", "skip_bad_rows", "fix_utf8",
                                              "cache_dir", "threads"};
  for (const auto& kv : d) {
    const std::string k = kv.first.as<std::string>();
    QT_CHECK(known.count(k), path, ":", kv.first.Mark().line + 1, ": unknown key data.", k);
  }
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
  job.opts.read.schema = data_schema_from_name(yaml_get<std::string>(d, "data", "schema", "auto", path));
  job.opts.chat.train_on = train_on_from_name(yaml_get<std::string>(d, "data", "train_on", "assistant", path));
  job.opts.chat.thinking = thinking_mode_from_name(yaml_get<std::string>(d, "data", "thinking", "on", path));
  job.opts.read.skip_bad_rows = yaml_get<bool>(d, "data", "skip_bad_rows", false, path);
  job.opts.read.fix_utf8 = yaml_get<bool>(d, "data", "fix_utf8", false, path);
  job.pack.tokens_per_batch = yaml_get<int64_t>(d, "data", "tokens_per_batch", 8192, path);
  job.pack.shuffle_window = yaml_get<int64_t>(d, "data", "shuffle_window", 10000, path);
  job.pack.seed = yaml_get<uint64_t>(d, "data", "seed", 0, path);
  job.pack.overflow = overflow_from_name(yaml_get<std::string>(d, "data", "overflow", "truncate", path));
  job.threads = yaml_get<int>(d, "data", "threads", 0, path);
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
