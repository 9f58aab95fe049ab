// The data section shared by `prepare` and `train` configs: which files, which tokenizer, how to
// render, tokenize, cache and pack them.
//   model: DIR                 # tokenizer = DIR/tokenizer.json (or `tokenizer: PATH`)
//   data:
//     path: FILE|DIR           # or a list of them; relative paths are relative to the config
//     schema: auto             # auto|ultrachat|sharegpt|alpaca|tokenized
//     train_on: assistant      # assistant|last_assistant|all
//     thinking: on             # on|off
//     tokens_per_batch: 8192
//     shuffle_window: 10000
//     seed: 0
//     overflow: truncate       # truncate|split
//     skip_bad_rows: false
//     fix_utf8: false
//     cache_dir: DIR           # default: .qwentune-cache next to the first data path
//     threads: 0               # 0 = all cores (QWENTUNE_THREADS)
#pragma once
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/yaml_config.h"
#include "core/error.h"

#include "data/packer.h"
#include "data/token_cache.h"

namespace qt {

struct DataJob {
  std::string tokenizer;  // tokenizer.json path (resolved)
  std::vector<std::string> data;
  DataOptions opts;
  PackOptions pack;
  std::string cache_dir;
  int threads = 0;
};

// A tokenizer.json path, or a directory holding one.
std::string resolve_tokenizer(const std::string& path_or_dir);
// Reads `model`/`tokenizer` and the `data:` section of a parsed config (checked by config_validate,
// config/config_schema.h, which lists every key and its default); `path` names the file in errors
// and anchors relative paths.
DataJob data_job_from_yaml(const YAML::Node& root, const std::string& path);
}  // namespace qt
