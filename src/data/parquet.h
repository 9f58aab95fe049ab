// Apache Parquet reader for chat datasets (Hugging Face shards such as ultrachat_200k).
//
// Self-contained: footer + Thrift compact metadata, row groups, data pages v1 and v2, dictionary
// pages, PLAIN / PLAIN_DICTIONARY / RLE_DICTIONARY (and RLE booleans), RLE/bit-packed levels,
// nested columns (LIST in its 3-level and legacy 2-level forms, MAP, structs, bare repeated
// fields) and nulls. Codecs: UNCOMPRESSED, SNAPPY, GZIP, ZSTD. Physical types: BOOLEAN, INT32,
// INT64, FLOAT, DOUBLE, BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY. Anything else (DELTA_* encodings,
// LZ4/BROTLI/LZO, INT96, encrypted files, external column chunks) is a qt::Error naming the file,
// the column and the feature.
//
// Rows come out as nlohmann::json objects, so a parquet row and a JSONL row go through the same
// conversion code. Mapping:
//   BYTE_ARRAY / FIXED_LEN_BYTE_ARRAY -> string (bytes as stored; UTF-8 is not validated)
//   INT32 / INT64 -> integer (DATE/TIMESTAMP/DECIMAL annotations are not applied: raw integers)
//   FLOAT / DOUBLE -> number, BOOLEAN -> bool, null -> null
//   struct -> object, LIST / repeated field -> array,
//   MAP -> object when every key is a string, else array of {"key":..,"value":..}
// e.g. an ultrachat row is {"prompt": "...", "prompt_id": "...",
//                           "messages": [{"content": "...", "role": "user"}, ...]}.
//
// Files are memory-mapped and decoded one row group at a time (memory ~ one decompressed row
// group of the projected columns). Every offset, length and count read from the file is checked
// against the buffer it indexes; corrupt input throws qt::Error, never reads out of bounds.
// Limits (qt::Error beyond them): 1 GiB per decompressed page, 2^24 values per page.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace qt {

struct ParquetReadOptions {
  // Top-level columns to decode (e.g. {"messages"}); empty = all. Rows then hold only these keys.
  // Naming a column the file does not have is an error. Unprojected columns are never decoded,
  // so an unsupported feature in them does not matter.
  std::vector<std::string> columns;
  // Stop after this many rows in total (across shards); < 0 = all.
  int64_t max_rows = -1;
};

// fn(row, row_index): row is a JSON object (see the mapping above); row_index counts from 0 and
// continues across the shards of a directory. Exceptions thrown by fn propagate.
using ParquetRowFn = std::function<void(const nlohmann::json& row, int64_t row_index)>;

// Reads every row of `path`: a .parquet file, or a directory whose *.parquet files (not
// recursive) are read in sorted name order. Rows are delivered in file order.
void parquet_read_rows(const std::string& path, const ParquetRowFn& fn, const ParquetReadOptions& options = {});

// The same over bytes in memory (tests, fuzzing). `name` stands for the file in error messages.
// Returns the number of rows delivered.
int64_t parquet_read_rows_from_memory(const uint8_t* data, size_t size, const std::string& name,
                                      const ParquetRowFn& fn, const ParquetReadOptions& options = {},
                                      int64_t first_row_index = 0);

// The files parquet_read_rows would read for `path` (a file: itself; a directory: its sorted
// *.parquet files; none is an error).
std::vector<std::string> parquet_list_files(const std::string& path);

// True when `path` names a parquet file by extension (".parquet", case-insensitive).
bool parquet_has_extension(const std::string& path);

// JSON text of a value with strings written byte for byte: quotes, backslashes and control
// characters are escaped, every other byte (invalid UTF-8 included) is copied, so a JSON parser
// that validates UTF-8 sees exactly what a JSONL twin of the data would hold. (nlohmann's dump()
// throws on invalid UTF-8 instead.)
void parquet_append_json_text(const nlohmann::json& value, std::string* out);

// The rows of `path` (file or directory, as parquet_read_rows) as JSON Lines: row i (0-based,
// counting across shards) on line i + 1. This is how the data pipeline reads parquet: the text
// goes through the same row parser as a .jsonl file, so both give identical samples.
std::string parquet_to_jsonl(const std::string& path, const ParquetReadOptions& options = {});

struct ParquetFileInfo {
  int64_t num_rows = 0;
  int64_t num_row_groups = 0;
  std::vector<std::string> columns;  // top-level column names, in schema order
  std::string schema;                // one line per schema node, indented ("messages: optional group LIST")
  std::string created_by;
};
// Footer metadata only (no pages are read).
ParquetFileInfo parquet_file_info(const std::string& path);

}  // namespace qt
