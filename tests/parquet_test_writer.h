// A small parquet writer for the reader's tests, independent of pyarrow: PLAIN and dictionary
// (RLE_DICTIONARY / PLAIN_DICTIONARY) pages, data page v1 and v2 headers, UNCOMPRESSED / SNAPPY /
// GZIP / ZSTD, nested LIST (3-level) / MAP / struct / bare repeated fields and nulls, shredded
// from JSON rows. Knobs for writing deliberately broken or unsupported files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt::testing {

struct PqNode {
  std::string name;
  int repetition = 1;  // 0 required, 1 optional, 2 repeated
  int type = -1;       // parquet physical type for leaves (0 BOOLEAN .. 7 FIXED_LEN_BYTE_ARRAY), -1 group
  int converted = -1;  // ConvertedType: 0 UTF8, 1 MAP, 3 LIST
  std::vector<PqNode> children;
};

// Helpers for common nodes.
PqNode pq_string(const std::string& name, int repetition = 1);
PqNode pq_leaf(const std::string& name, int type, int repetition = 1);
PqNode pq_struct(const std::string& name, std::vector<PqNode> children, int repetition = 1);
// pyarrow's 3-level list: name (LIST, repetition) -> "list" (repeated group) -> "element".
PqNode pq_list(const std::string& name, PqNode element, int repetition = 1);
// MAP: name (MAP) -> "key_value" (repeated group) -> key (required UTF8), value.
PqNode pq_map(const std::string& name, PqNode value, int repetition = 1);
// The ultrachat_200k schema: prompt, prompt_id (string), messages list<struct<content, role>>.
PqNode pq_ultrachat_schema();
// n varied ultrachat rows (multi-turn, unicode, empty strings, one long message).
std::vector<nlohmann::json> pq_ultrachat_rows(int n);

struct PqWriteOptions {
  int codec = 0;               // 0 UNCOMPRESSED, 1 SNAPPY, 2 GZIP, 6 ZSTD; other numbers: bytes stored raw
  int page_version = 1;        // 1: DataPageHeader, 2: DataPageHeaderV2
  bool dictionary = false;     // dictionary-encode every non-boolean leaf
  bool plain_dictionary = false;  // v1: call the data encoding PLAIN_DICTIONARY (2) instead of RLE_DICTIONARY (8)
  int64_t rows_per_group = int64_t{1} << 40;
  int64_t values_per_page = int64_t{1} << 40;  // level entries per data page (cut at record starts)
  // Broken/unsupported variants.
  std::string override_column;   // dotted leaf path the next two knobs apply to ("" = all leaves)
  int value_encoding_override = -1;  // data page encoding number written in headers
  bool corrupt_page_start = false;   // flip the first byte of every page body
  int uncompressed_size_delta = 0;   // added to every page header's uncompressed size
};

// The whole file as bytes.
std::string pq_write(const PqNode& root, const std::vector<nlohmann::json>& rows, const PqWriteOptions& opt = {});
void pq_write_file(const std::string& path, const PqNode& root, const std::vector<nlohmann::json>& rows,
                   const PqWriteOptions& opt = {});

}  // namespace qt::testing
