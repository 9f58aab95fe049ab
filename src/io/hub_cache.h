// Hugging Face hub ids resolved through the local hub cache; nothing is downloaded.
//
// `Qwen/Qwen3.5-27B` or `HuggingFaceH4/ultrachat_200k@REV` names a repository in the cache that
// huggingface-cli / hf download fill:
//   $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
//     models--Qwen--Qwen3.5-27B/refs/main            the default revision's commit hash
//     models--Qwen--Qwen3.5-27B/snapshots/<hash>/    the files of that revision
//     datasets--HuggingFaceH4--ultrachat_200k/...    data sets likewise
// REV is a branch or tag (a file under refs/) or a snapshot hash (or a unique prefix of one);
// without it, refs/main. A string is an id only when it is not an existing path and looks like
// owner/name: exactly one '/', not starting with '/', '.' or '~', not ending in .jsonl, .json or
// .parquet (a data file's name).
#pragma once
#include <string>

namespace qt {

enum class HubRepoType { Model, Dataset };

// True when `s` is not an existing path and has the shape of a hub id (owner/name[@rev]).
bool hub_looks_like_id(const std::string& s);
// The hub cache directory ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub); it need not exist.
std::string hub_cache_dir();
// The snapshot directory of `id` (owner/name[@rev]) in the hub cache. A missing repository or
// revision is a qt::Error that says where it looked and how to fetch it. Logs the snapshot chosen.
std::string hub_resolve(const std::string& id, HubRepoType type);
// A model directory: `path_or_id` itself when it is not a hub id, else its snapshot directory.
std::string resolve_model_dir(const std::string& path_or_id);

}  // namespace qt
