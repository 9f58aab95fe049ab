// Tokenization of a dataset (multi-threaded) and its binary cache.
//
// The cache key is a 128-bit content hash of: every data file's bytes (in the order read), the
// tokenizer.json bytes, the chat template options (thinking, train_on), the read options that
// change the result (schema, skip_bad_rows, fix_utf8) and the cache format version. The cache file
// `<cache_dir>/tokens-<key>.bin` is reused when it exists and is intact; it is written atomically
// (temp file + rename). Layout (little-endian):
//   "QTTOKCv1" | u64 num_samples | u64 num_tokens | u64 rows | u64 bad_rows | u64 utf8_fixed |
//   i64 offsets[num_samples+1] | i32 input_ids[num_tokens] | i32 labels[num_tokens] | u64 checksum
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/packer.h"
#include "data/readers.h"
#include "text/chat_template.h"

namespace qt {

class Tokenizer;

struct DataOptions {
  ReadOptions read;
  ChatTemplateOptions chat;
};

struct TokenizeResult {
  TokenizedDataset data;
  ReadStats read_stats;   // from the read (or, on a cache hit, the counts stored in the cache)
  bool cache_hit = false;
  std::string cache_path;  // empty when no cache dir was given
  std::string key;         // 32 hex digits
};

// Reads `files` in order, renders and tokenizes all samples on `threads` threads (0 =
// qt::num_threads()). Pre-tokenized samples are checked against the tokenizer's vocabulary.
// cache_dir empty = no cache. Streams: rows are read, rendered and tokenized a chunk (8192 rows)
// at a time and only token ids are kept, so the set's text is never in memory at once; a progress
// line with rows/s goes to stderr (redrawn on a terminal, else every 10 s).
TokenizeResult tokenize_files(const std::vector<std::string>& files, const Tokenizer& tokenizer, const DataOptions& opts,
                              const std::string& cache_dir, int threads = 0);
// tokenize_files over resolve_data_files(paths) (files, directories, globs, hub ids; no split).
TokenizeResult tokenize_dataset(const std::vector<std::string>& paths, const Tokenizer& tokenizer,
                                const DataOptions& opts, const std::string& cache_dir, int threads = 0);

// The cache key alone (hashes the files; does not tokenize).
std::string token_cache_key(const std::vector<std::string>& data_files, const std::string& tokenizer_json_path,
                            const DataOptions& opts);

// Tokenizes already-read samples with any encoder (used by tokenize_dataset; handy in tests).
TokenizedDataset tokenize_samples(const std::vector<Sample>& samples, const ChatTemplateOptions& chat,
                                  const EncodeFn& encode, int threads = 0);

}  // namespace qt
