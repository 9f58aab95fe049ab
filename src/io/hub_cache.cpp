#include "io/hub_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace qt {
namespace {

namespace fs = std::filesystem;

std::string env_or_empty(const char* name) {
  const char* v = external_env(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t b = 0;
  while (b < s.size() && (s[b] == ' ' || s[b] == '\t')) ++b;
  return s.substr(b);
}

std::string fetch_hint(const std::string& repo, HubRepoType type) {
  const std::string kind = type == HubRepoType::Dataset ? " --repo-type dataset" : "";
  return str("fetch it with `huggingface-cli download ", repo, kind, "` (or `hf download ", repo, kind,
             "`), or set HF_HUB_CACHE / HF_HOME to the cache that holds it");
}

// Names of the entries of `dir` (files and folders), sorted; empty when it does not exist.
std::vector<std::string> entry_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return names;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_directory()) continue;  // refs/ may nest (refs/pr/1); snapshots are listed by the caller
    names.push_back(fs::relative(e.path(), dir).generic_string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

}  // namespace

bool hub_looks_like_id(const std::string& s) {
  if (s.empty() || s[0] == '/' || s[0] == '.' || s[0] == '~') return false;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(s, ec))) return false;
  const std::string repo = s.substr(0, s.find('@'));
  const size_t slash = repo.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == repo.size()) return false;
  if (repo.find('/', slash + 1) != std::string::npos) return false;
  if (s.find('@') != std::string::npos && s.find('@') + 1 == s.size()) return false;  // "owner/name@" has no revision
  // A data file's name (data/train.jsonl) is a path that is missing, not a repository.
  for (const char* ext : {".jsonl", ".json", ".parquet"}) {
    const std::string e(ext);
    if (repo.size() > e.size() && repo.compare(repo.size() - e.size(), e.size(), e) == 0) return false;
  }
  return std::none_of(repo.begin(), repo.end(), [](char c) { return c == ' ' || c == '\\' || c == '*' || c == '?'; });
}

std::string hub_cache_dir() {
  const std::string hub = env_or_empty("HF_HUB_CACHE");
  if (!hub.empty()) return hub;
  const std::string home = env_or_empty("HF_HOME");
  if (!home.empty()) return (fs::path(home) / "hub").string();
  const std::string user_home = env_or_empty("HOME");
  return (fs::path(user_home.empty() ? "/root" : user_home) / ".cache" / "huggingface" / "hub").string();
}

std::string hub_resolve(const std::string& id, HubRepoType type) {
  const size_t at = id.find('@');
  const std::string repo = id.substr(0, at);
  const std::string revision = at == std::string::npos ? "main" : id.substr(at + 1);
  const size_t slash = repo.find('/');
  QT_CHECK(slash != std::string::npos, id, ": not a hub id (expected owner/name or owner/name@revision)");
  const std::string folder = str(type == HubRepoType::Dataset ? "datasets--" : "models--", repo.substr(0, slash), "--",
                                 repo.substr(slash + 1));
  const fs::path root = fs::path(hub_cache_dir()) / folder;
  const char* what = type == HubRepoType::Dataset ? "data set" : "model";
  QT_CHECK(fs::is_directory(root), id, ": not an existing path, and the ", what, " is not in the Hugging Face hub cache (looked for ",
           root.string(), "); ", fetch_hint(repo, type));
  const fs::path snapshots = root / "snapshots";
  std::vector<std::string> snaps;
  std::error_code ec;
  if (fs::is_directory(snapshots, ec))
    for (const auto& e : fs::directory_iterator(snapshots, ec))
      if (e.is_directory()) snaps.push_back(e.path().filename().string());
  std::sort(snaps.begin(), snaps.end());

  std::string hash;
  const fs::path ref = root / "refs" / revision;
  if (fs::is_regular_file(ref)) {
    std::ifstream f(ref);
    std::string line;
    std::getline(f, line);
    hash = trim(line);
    QT_CHECK(!hash.empty(), ref.string(), ": empty ref file (expected the commit hash of revision '", revision, "')");
  } else {
    std::vector<std::string> matches;
    for (const auto& s : snaps)
      if (s.compare(0, revision.size(), revision) == 0) matches.push_back(s);
    QT_CHECK(matches.size() <= 1, id, ": revision '", revision, "' matches several snapshots in ", snapshots.string(), ": ",
             joined(matches));
    QT_CHECK(!matches.empty(), id, ": revision '", revision, "' is neither a ref (", (root / "refs").string(),
             ": ", joined(entry_names(root / "refs")), ") nor a snapshot (", snapshots.string(), ": ", joined(snaps),
             ") in the hub cache; ", fetch_hint(repo, type), (at == std::string::npos ? "" : str(" with --revision ", revision)));
    hash = matches.front();
  }
  const fs::path snap = snapshots / hash;
  QT_CHECK(fs::is_directory(snap), id, ": revision '", revision, "' points at snapshot ", hash, " but ", snap.string(),
           " does not exist (an interrupted download?); ", fetch_hint(repo, type));
  {
    // Once per id and snapshot: a command resolves its model for the weights and the tokenizer.
    static std::mutex mu;
    static std::set<std::string> logged;
    std::lock_guard<std::mutex> lock(mu);
    if (logged.insert(id + "\n" + snap.string()).second) log_info(id, ": hub cache snapshot ", snap.string());
  }
  return snap.string();
}

std::string resolve_model_dir(const std::string& path_or_id) {
  if (!hub_looks_like_id(path_or_id)) return path_or_id;
  return hub_resolve(path_or_id, HubRepoType::Model);
}

}  // namespace qt
