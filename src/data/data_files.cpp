#include "data/data_files.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "data/readers.h"
#include "io/hub_cache.h"

namespace qt {
namespace {

namespace fs = std::filesystem;

// A data file and its path relative to the directory (or glob base) it was found under.
struct FoundFile {
  std::string path;
  std::string relative;
};

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool is_data_file(const fs::path& p) {
  std::string ext = p.extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto exts = data_file_extensions();
  return std::find(exts.begin(), exts.end(), ext) != exts.end();
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

const char* file_type_name(fs::file_type t) {
  switch (t) {
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block: return "a block device";
    case fs::file_type::character: return "a character device";
    default: return "not a plain file";
  }
}

void check_readable_kind(const std::string& spec) {
  const fs::file_status st = fs::status(spec);
  QT_CHECK(fs::is_regular_file(st) || fs::is_directory(st), spec, ": data path is not a regular file or directory (it is ",
           file_type_name(st.type()), ")");
}

// `p` below `base`, lexically: hub snapshots hold symlinks into blobs/, which must not be followed.
std::string relative_to(const fs::path& p, const fs::path& base) {
  if (base.empty()) return p.generic_string();
  return p.lexically_normal().lexically_relative(base.lexically_normal()).generic_string();
}

// Data files under `dir`, recursively, hidden entries skipped, sorted by relative path.
std::vector<FoundFile> list_directory(const fs::path& dir, const fs::path& base) {
  std::vector<FoundFile> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  QT_CHECK(!ec, dir.string(), ": cannot list the data directory: ", ec.message());
  for (; it != end; it.increment(ec)) {
    QT_CHECK(!ec, dir.string(), ": cannot list the data directory: ", ec.message());
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && is_data_file(it->path()))
      out.push_back({it->path().string(), relative_to(it->path(), base)});
  }
  std::sort(out.begin(), out.end(), [](const FoundFile& a, const FoundFile& b) { return a.relative < b.relative; });
  return out;
}

// The folder a glob's matches are relative to: the components before the first one with a glob char.
fs::path glob_base(const std::string& pattern) {
  fs::path base;
  for (const auto& part : fs::path(pattern).parent_path()) {
    if (has_glob_chars(part.string())) break;
    base /= part;
  }
  return base;  // empty: relative to the working directory
}

std::vector<FoundFile> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> matches;
  if (rc == 0 && g.gl_pathc > 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) matches.push_back(g.gl_pathv[i]);
  ::globfree(&g);
  QT_CHECK(rc == 0 || rc == GLOB_NOMATCH, pattern, ": cannot expand the glob (glob error ", rc, ")");
  QT_CHECK(!matches.empty(), pattern, ": the glob matches no files");
  std::sort(matches.begin(), matches.end());
  const fs::path base = glob_base(pattern);
  std::vector<FoundFile> out;
  for (const auto& m : matches) {
    if (fs::is_directory(m)) {
      for (auto& f : list_directory(m, base.empty() ? fs::path(m) : base)) out.push_back(std::move(f));
    } else if (fs::is_regular_file(m) && is_data_file(m)) {
      out.push_back({m, relative_to(m, base)});
    }
  }
  QT_CHECK(!out.empty(), pattern, ": the glob matches no data files (*.jsonl, *.json, *.parquet)");
  return out;
}

std::string joined(const std::set<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The shard name of a file stem NAME-00000-of-00003[-suffix], "" when it is not a shard.
std::string shard_name(const std::string& stem) {
  for (size_t of = stem.find("-of-"); of != std::string::npos; of = stem.find("-of-", of + 1)) {
    size_t b = of;
    while (b > 0 && std::isdigit(static_cast<unsigned char>(stem[b - 1]))) --b;
    size_t e = of + 4;
    while (e < stem.size() && std::isdigit(static_cast<unsigned char>(stem[e]))) ++e;
    if (b == of || e == of + 4 || b < 2 || stem[b - 1] != '-') continue;
    if (e != stem.size() && stem[e] != '-' && stem[e] != '.' && stem[e] != '_') continue;
    return stem.substr(0, b - 1);
  }
  return "";
}

bool usual_split_name(const std::string& s) {
  static const std::set<std::string> names = {"train", "test", "validation", "valid", "val", "dev", "eval"};
  return names.count(s) > 0;
}

// Picks the files of one split (or checks that there is at most one) among a directory's files.
std::vector<FoundFile> select_split(std::vector<FoundFile> files, const std::string& split, const std::string& where) {
  std::set<std::string> found;
  for (const auto& f : files) {
    const std::string s = data_file_split(f.relative);
    if (!s.empty()) found.insert(s);
  }
  if (split.empty()) {
    QT_CHECK(found.size() <= 1, where, ": holds several splits (", joined(found),
             "); choose one with data.split (e.g. `split: ", *found.begin(), "`) or --split, or name the files");
    return files;
  }
  std::vector<FoundFile> picked;
  for (auto& f : files)
    if (data_file_in_split(f.relative, split)) picked.push_back(std::move(f));
  QT_CHECK(!picked.empty(), where, ": no split '", split, "'; splits found: ",
           found.empty() ? std::string("none (no split-named files or folders)") : joined(found));
  return picked;
}

std::string user_cache_dir() {
  const char* xdg = external_env("XDG_CACHE_HOME");
  if (xdg && *xdg) return (fs::path(xdg) / "qwentune").string();
  const char* home = external_env("HOME");
  return ((home && *home ? fs::path(home) / ".cache" : fs::temp_directory_path()) / "qwentune").string();
}

}  // namespace

std::string data_file_split(const std::string& relative_path) {
  const fs::path p(relative_path);
  const std::string shard = shard_name(p.stem().string());
  if (!shard.empty()) return shard;
  for (const auto& part : p.parent_path())
    if (usual_split_name(part.string())) return part.string();
  return usual_split_name(p.stem().string()) ? p.stem().string() : "";
}

bool data_file_in_split(const std::string& relative_path, const std::string& name) {
  const fs::path p(relative_path);
  const std::string shard = shard_name(p.stem().string());
  if (!shard.empty()) return shard == name;
  if (p.stem().string() == name) return true;
  for (const auto& part : p.parent_path())
    if (part.string() == name) return true;
  return false;
}

std::vector<std::string> resolve_data_files(const std::vector<std::string>& specs, const std::string& split) {
  QT_CHECK(!specs.empty(), "no data path given");
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& spec : specs) {
    std::vector<FoundFile> files;
    std::error_code ec;
    if (fs::exists(spec, ec)) {
      check_readable_kind(spec);
      if (!fs::is_directory(spec)) {
        files.push_back({spec, fs::path(spec).filename().string()});
      } else {
        files = list_directory(spec, spec);
        QT_CHECK(!files.empty(), spec, ": no data files (*.jsonl, *.json, *.parquet) in the directory or below it");
        files = select_split(std::move(files), split, spec);
      }
    } else if (fs::is_symlink(fs::symlink_status(spec, ec))) {
      QT_FAIL(spec, ": data path is a broken symbolic link (to ", fs::read_symlink(spec, ec).string(), ")");
    } else if (has_glob_chars(spec)) {
      files = select_split(expand_glob(spec), split, spec);
    } else if (hub_looks_like_id(spec)) {
      const std::string dir = hub_resolve(spec, HubRepoType::Dataset);
      files = list_directory(dir, dir);
      QT_CHECK(!files.empty(), spec, ": no data files (*.jsonl, *.json, *.parquet) in the snapshot ", dir);
      files = select_split(std::move(files), split, spec);
    } else {
      QT_FAIL(spec, ": data path does not exist");
    }
    for (auto& f : files) {
      if (seen.insert(fs::weakly_canonical(f.path, ec).string()).second) {
        out.push_back(std::move(f.path));
      } else {
        log_warn(f.path, ": listed twice in the data paths; read once");
      }
    }
  }
  return out;
}

bool dir_is_writable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) return false;
  const fs::path probe = fs::path(dir) / (".qwentune-write-test-" + std::to_string(::getpid()));
  bool ok;
  {
    std::ofstream f(probe);
    ok = f.good() && (f << "x") && f.flush().good();
  }
  fs::remove(probe, ec);
  return ok;
}

std::string default_token_cache_dir(const std::vector<std::string>& specs) {
  QT_CHECK(!specs.empty(), "no data path given");
  const std::string& first = specs.front();
  std::error_code ec;
  fs::path anchor;
  if (fs::is_directory(first, ec)) {
    anchor = first;
  } else if (fs::exists(first, ec)) {
    anchor = fs::path(first).has_parent_path() ? fs::path(first).parent_path() : fs::path(".");
  } else if (has_glob_chars(first)) {
    anchor = glob_base(first);
    if (anchor.empty()) anchor = ".";
  }
  if (!anchor.empty()) {
    const std::string next_to_data = (anchor / ".qwentune-cache").string();
    if (dir_is_writable(next_to_data)) return next_to_data;
    const std::string fallback = user_cache_dir();
    log_info("token cache: ", next_to_data, " is not writable; using ", fallback);
    return fallback;
  }
  const std::string fallback = user_cache_dir();
  log_info("token cache: ", fallback, " (", first, " is not a local path)");
  return fallback;
}

}  // namespace qt
