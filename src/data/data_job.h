// The data section shared by `prepare` and `train` configs: which files, which tokenizer, how to
// render, tokenize, cache and pack them.
//   model: DIR|ID              # tokenizer = DIR/tokenizer.json (or `tokenizer: PATH|DIR|ID`);
//                              # ID = a hub id (Qwen/Qwen3.5-2B[@rev]) from the local hub cache
//   data:
//     path: FILE|DIR|GLOB|ID   # or a list of them; relative paths are relative to the config;
//                              # see data/data_files.h (recursion, globs, hub ids, splits)
//     split: NAME              # e.g. train_sft: the files of one split (needed when there are several)
//     eval_path: FILE|DIR|GLOB|ID  # held-out eval set (or a list); never trained on; excludes
//                              # train.eval_fraction. Default with eval_split: the same path.
//     eval_split: NAME         # e.g. test_sft
//     schema: auto             # auto|ultrachat|sharegpt|alpaca|tokenized
//     train_on: assistant      # assistant|last_assistant|all
//     thinking: on             # on|off
//     tokens_per_batch: 8192
//     shuffle_window: 10000
//     seed: 0
//     overflow: truncate       # truncate|split
//     skip_bad_rows: false
//     fix_utf8: false
//     cache_dir: DIR           # default: .qwentune-cache next to the first data path, or where that
//                              # is not writable (and for hub ids) $XDG_CACHE_HOME/qwentune or
//                              # ~/.cache/qwentune
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
  std::string tokenizer;  // tokenizer.json, a model directory or a hub id (resolve_tokenizer at use)
  std::vector<std::string> data;       // specs for resolve_data_files; hub ids kept as written
  std::string split;                   // "" = the only split there is
  std::vector<std::string> eval_data;  // held-out eval set specs; empty = none
  std::string eval_split;
  DataOptions opts;
  PackOptions pack;
  std::string cache_dir;  // "" = default_token_cache_dir(data), decided when tokenizing
  bool cache = true;      // false: no token cache (data-stats without --cache-dir)
  int threads = 0;
};

// A tokenizer.json path: the path itself, DIR/tokenizer.json for a directory, or the snapshot's
// tokenizer.json for a hub model id (io/hub_cache.h).
std::string resolve_tokenizer(const std::string& path_or_dir);
// `p` of a config file anchored at the config's directory; absolute paths and hub ids (a string
// that is not a path there and looks like owner/name) stay as they are.
std::string config_relative_path(const std::string& config_file, const std::string& p);
// Resolves the job's files (split included) and cache directory, then tokenize_files.
TokenizeResult tokenize_data_job(const DataJob& job, const Tokenizer& tokenizer);
// The eval set (eval_data / eval_split) tokenized the same way, through the same cache; an empty
// set when the job has none. A file in both the training and the eval set is an error.
TokenizedDataset tokenize_eval_set(const DataJob& job, const Tokenizer& tokenizer);
// Reads `model`/`tokenizer` and the `data:` section of a parsed config (checked by config_validate,
// config/config_schema.h, which lists every key and its default); `path` names the file in errors
// and anchors relative paths.
DataJob data_job_from_yaml(const YAML::Node& root, const std::string& path);
}  // namespace qt
