// Where a data set's files are: every `data.path` entry (and `--data` argument) goes through
// resolve_data_files, so files, directories, globs, hub ids and splits mean the same everywhere.
//
// A spec is one of
//   FILE                  read as it is (any name)
//   DIR                   its data files (data_file_extensions()), searched recursively in sorted
//                         order; hidden files and folders (.qwentune-cache, .git) are skipped
//   GLOB                  `data/train_sft-*.parquet`: *, ? and [...] in any path component (glob(3));
//                         matched folders are searched as DIR, matched files of other types dropped
//   owner/name[@rev]      a data set in the Hugging Face hub cache (io/hub_cache.h), searched as DIR
// Splits follow Hugging Face's file naming. Inside a DIR / GLOB, a file belongs to split NAME when
// its name is NAME-00000-of-00003*.ext (a shard), NAME.ext, or it lies in a NAME/ folder.
// `split` selects those files (explicit FILE specs are read whatever split is chosen); without it, a DIR holding more than one split is an error that
// lists them (only shard names and the usual names train, test, validation, valid, val, dev, eval
// count as splits when nothing is selected, so a folder of unrelated files still reads as one
// set). A split that is not there is an error that lists the splits that are.
#pragma once
#include <string>
#include <vector>

namespace qt {

// The data files of `specs`, in order (each spec's files sorted); duplicates dropped.
std::vector<std::string> resolve_data_files(const std::vector<std::string>& specs, const std::string& split = "");

// The split that a file inside a data directory belongs to by name (`relative_path` from the
// directory); "" when its name says none. See above for which names count.
std::string data_file_split(const std::string& relative_path);

// True when the file at `relative_path` belongs to split `name` (shard name, NAME.ext or a NAME/ folder).
bool data_file_in_split(const std::string& relative_path, const std::string& name);

// The default token cache directory for `specs`: `.qwentune-cache` next to the first data path
// (inside it for a directory) when that place is writable, else $XDG_CACHE_HOME/qwentune, else
// ~/.cache/qwentune (also for data sets from the hub cache). Logs where the cache goes when it is
// not next to the data.
std::string default_token_cache_dir(const std::vector<std::string>& specs);

// True when a file can be created in `dir` (created if missing); tried, not read off permission
// bits, so it is right for read-only mounts and for root.
bool dir_is_writable(const std::string& dir);

}  // namespace qt
