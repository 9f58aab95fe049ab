// Parquet reader; see parquet.h for the contract. Layout of this file:
//   metadata structs + Thrift parsing (FileMetaData, SchemaElement, RowGroup, ColumnChunk,
//   ColumnMetaData, PageHeader), schema tree, decompression, RLE/bit-packed and PLAIN decoding,
//   column-chunk decoding into (rep, def, value) triples, record assembly into JSON.
#include "data/parquet.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "data/thrift_compact.h"
#include "io/mapped_file.h"

namespace qt {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxPageBytes = int64_t{1} << 30;
constexpr int64_t kMaxPageValues = int64_t{1} << 24;
constexpr int64_t kMaxLeafEntries = int64_t{1} << 27;  // level entries per column chunk
constexpr int kMaxSchemaDepth = 32;

// ---- enums (parquet.thrift) --------------------------------------------------------------------

enum PhysType { kBoolean = 0, kInt32 = 1, kInt64 = 2, kInt96 = 3, kFloat = 4, kDouble = 5, kByteArray = 6, kFixedLenByteArray = 7 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum Converted { kConvUtf8 = 0, kConvMap = 1, kConvMapKeyValue = 2, kConvList = 3 };
enum LogicalId { kLogicalString = 1, kLogicalMap = 2, kLogicalList = 3 };
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kRleDictionary = 8 };
enum Codec { kUncompressed = 0, kSnappy = 1, kGzip = 2, kZstd = 6 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

const char* phys_name(int t) {
  static const char* names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? names[t] : "unknown type";
}
std::string encoding_name(int e) {
  static const char* names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
                                "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? names[e] : str("encoding #", e);
}
std::string codec_name(int c) {
  static const char* names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? names[c] : str("codec #", c);
}

// ---- metadata ----------------------------------------------------------------------------------

struct SchemaNode {
  std::string name;
  std::string path;  // dotted from the root's children ("messages.list.element.content")
  int type = -1;     // physical type for leaves, -1 for groups
  int type_length = 0;
  int repetition = kRequired;
  int converted = -1;
  int logical = 0;  // LogicalType union member id, 0 = none
  int num_children = -1;
  std::vector<int> children;
  int max_def = 0, max_rep = 0;
  int leaf = -1;                     // leaf column index, leaves only
  int first_leaf = 0, end_leaf = 0;  // leaf columns under this node: [first_leaf, end_leaf)
  bool is_leaf() const { return type >= 0; }
};

struct ColumnChunkMeta {
  int type = -1;
  int codec = -1;
  int64_t num_values = -1;
  int64_t total_compressed_size = -1;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;
};

struct RowGroupMeta {
  int64_t num_rows = -1;
  std::vector<ColumnChunkMeta> columns;
};

struct FileMeta {
  int64_t num_rows = -1;
  std::vector<SchemaNode> nodes;  // nodes[0] is the root
  std::vector<int> leaves;        // node index of each leaf column
  std::vector<RowGroupMeta> row_groups;
  std::string created_by;
};

struct PageHeader {
  int type = -1;
  int64_t uncompressed_size = -1, compressed_size = -1;
  // v1 data page / dictionary page / v2 data page (num_values and encoding shared)
  bool has_data = false, has_dict = false, has_v2 = false;
  int64_t num_values = -1;
  int encoding = -1;
  int def_encoding = -1, rep_encoding = -1;  // v1
  int64_t def_len = -1, rep_len = -1;        // v2
  bool is_compressed = true;                 // v2
};

#define QT_FIELD_LOOP(r)   \
  (r).begin_struct();      \
  int16_t fid;             \
  ThriftType ft;           \
  while ((r).next_field(&fid, &ft))

int logical_type_id(ThriftReader& r) {
  int id = 0;
  QT_FIELD_LOOP(r) {
    if (id == 0) id = fid;
    r.skip(ft);
  }
  r.end_struct();
  return id;
}

struct RawSchemaElement {
  int type = -1, type_length = 0, repetition = -1, converted = -1, logical = 0, num_children = -1;
  std::string name;
  bool has_name = false;
};

RawSchemaElement parse_schema_element(ThriftReader& r) {
  RawSchemaElement e;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 1: e.type = r.read_i32(ft, "SchemaElement.type"); break;
      case 2: e.type_length = r.read_i32(ft, "SchemaElement.type_length"); break;
      case 3: e.repetition = r.read_i32(ft, "SchemaElement.repetition_type"); break;
      case 4: e.name = std::string(r.read_binary(ft, "SchemaElement.name")); e.has_name = true; break;
      case 5: e.num_children = r.read_i32(ft, "SchemaElement.num_children"); break;
      case 6: e.converted = r.read_i32(ft, "SchemaElement.converted_type"); break;
      case 10:
        if (ft != ThriftType::Struct) r.fail("field 'SchemaElement.logicalType' is not a struct");
        e.logical = logical_type_id(r);
        break;
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (!e.has_name) r.fail("SchemaElement without a name");
  return e;
}

ColumnChunkMeta parse_column_meta(ThriftReader& r) {
  ColumnChunkMeta c;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 1: c.type = r.read_i32(ft, "ColumnMetaData.type"); break;
      case 4: c.codec = r.read_i32(ft, "ColumnMetaData.codec"); break;
      case 5: c.num_values = r.read_i64(ft, "ColumnMetaData.num_values"); break;
      case 7: c.total_compressed_size = r.read_i64(ft, "ColumnMetaData.total_compressed_size"); break;
      case 9: c.data_page_offset = r.read_i64(ft, "ColumnMetaData.data_page_offset"); break;
      case 11: c.dictionary_page_offset = r.read_i64(ft, "ColumnMetaData.dictionary_page_offset"); break;
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (c.type < 0 || c.codec < 0 || c.num_values < 0 || c.total_compressed_size < 0 || c.data_page_offset < 0)
    r.fail("ColumnMetaData lacks a required field or has a negative size/offset");
  return c;
}

ColumnChunkMeta parse_column_chunk(ThriftReader& r) {
  ColumnChunkMeta c;
  bool has_meta = false;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 1:
        r.read_binary(ft, "ColumnChunk.file_path");
        r.fail("column chunks stored in another file (ColumnChunk.file_path) are not supported");
      case 3:
        if (ft != ThriftType::Struct) r.fail("field 'ColumnChunk.meta_data' is not a struct");
        c = parse_column_meta(r);
        has_meta = true;
        break;
      case 8:
      case 9: r.fail("encrypted column chunks are not supported");
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (!has_meta) r.fail("ColumnChunk without meta_data");
  return c;
}

RowGroupMeta parse_row_group(ThriftReader& r) {
  RowGroupMeta g;
  bool has_columns = false;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 1: {
        ThriftType et;
        int64_t n;
        r.read_list_header(ft, "RowGroup.columns", &et, &n);
        if (et != ThriftType::Struct) r.fail("RowGroup.columns is not a list of structs");
        for (int64_t i = 0; i < n; ++i) g.columns.push_back(parse_column_chunk(r));
        has_columns = true;
        break;
      }
      case 3: g.num_rows = r.read_i64(ft, "RowGroup.num_rows"); break;
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (!has_columns || g.num_rows < 0) r.fail("RowGroup lacks columns or num_rows");
  return g;
}

PageHeader parse_page_header(ThriftReader& r) {
  PageHeader h;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 1: h.type = r.read_i32(ft, "PageHeader.type"); break;
      case 2: h.uncompressed_size = r.read_i32(ft, "PageHeader.uncompressed_page_size"); break;
      case 3: h.compressed_size = r.read_i32(ft, "PageHeader.compressed_page_size"); break;
      case 5:
      case 7:
      case 8: {
        if (ft != ThriftType::Struct) r.fail("page sub-header is not a struct");
        if (fid == 5) h.has_data = true;
        if (fid == 7) h.has_dict = true;
        if (fid == 8) h.has_v2 = true;
        r.begin_struct();
        int16_t sid;
        ThriftType st;
        while (r.next_field(&sid, &st)) {
          if (sid == 1) {
            h.num_values = r.read_i32(st, "num_values");
          } else if (fid == 5 && sid == 2) {
            h.encoding = r.read_i32(st, "DataPageHeader.encoding");
          } else if (fid == 5 && sid == 3) {
            h.def_encoding = r.read_i32(st, "DataPageHeader.definition_level_encoding");
          } else if (fid == 5 && sid == 4) {
            h.rep_encoding = r.read_i32(st, "DataPageHeader.repetition_level_encoding");
          } else if (fid == 7 && sid == 2) {
            h.encoding = r.read_i32(st, "DictionaryPageHeader.encoding");
          } else if (fid == 8 && sid == 4) {
            h.encoding = r.read_i32(st, "DataPageHeaderV2.encoding");
          } else if (fid == 8 && sid == 5) {
            h.def_len = r.read_i32(st, "DataPageHeaderV2.definition_levels_byte_length");
          } else if (fid == 8 && sid == 6) {
            h.rep_len = r.read_i32(st, "DataPageHeaderV2.repetition_levels_byte_length");
          } else if (fid == 8 && sid == 7) {
            h.is_compressed = r.read_bool(st, "DataPageHeaderV2.is_compressed");
          } else {
            r.skip(st);
          }
        }
        r.end_struct();
        break;
      }
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (h.type < 0 || h.uncompressed_size < 0 || h.compressed_size < 0)
    r.fail("PageHeader lacks type or sizes, or has a negative size");
  return h;
}

// Builds the schema tree from the flat depth-first element list.
void build_schema(const std::vector<RawSchemaElement>& raw, size_t* next, int parent, int depth, FileMeta* m,
                  const std::string& file) {
  QT_CHECK(*next < raw.size(), file, ": corrupt schema: a group claims more children than the schema has elements");
  QT_CHECK(depth <= kMaxSchemaDepth, file, ": schema nested deeper than ", kMaxSchemaDepth, " levels");
  const RawSchemaElement& e = raw[(*next)++];
  int idx = static_cast<int>(m->nodes.size());
  m->nodes.emplace_back();
  {
    SchemaNode& n = m->nodes.back();
    n.name = e.name;
    n.type_length = e.type_length;
    n.converted = e.converted;
    n.logical = e.logical;
    n.num_children = e.num_children;
    if (parent < 0) {
      n.repetition = kRequired;  // the root's repetition is meaningless
    } else {
      QT_CHECK(e.repetition >= 0 && e.repetition <= 2, file, ": schema element '", e.name,
               "' has invalid or missing repetition_type ", e.repetition);
      const SchemaNode& p = m->nodes[static_cast<size_t>(parent)];
      n.repetition = e.repetition;
      n.path = p.path.empty() ? e.name : p.path + "." + e.name;
      n.max_def = p.max_def + (e.repetition != kRequired ? 1 : 0);
      n.max_rep = p.max_rep + (e.repetition == kRepeated ? 1 : 0);
    }
    bool group = parent < 0 || e.num_children > 0;
    if (group) {
      QT_CHECK(e.num_children > 0, file, ": schema group '", e.name, "' has no children");
      QT_CHECK(static_cast<size_t>(e.num_children) <= raw.size() - *next, file, ": corrupt schema: group '", e.name,
               "' claims ", e.num_children, " children but only ", raw.size() - *next, " elements follow");
    } else {
      QT_CHECK(e.type >= 0 && e.type <= 7, file, ": schema leaf '", n.path, "' has invalid or missing type ", e.type);
      n.type = e.type;
      n.leaf = static_cast<int>(m->leaves.size());
      m->leaves.push_back(idx);
    }
    n.first_leaf = static_cast<int>(m->leaves.size()) - (group ? 0 : 1);
  }
  if (e.num_children > 0 || parent < 0) {
    for (int i = 0; i < e.num_children; ++i) {
      int child = static_cast<int>(m->nodes.size());
      build_schema(raw, next, idx, depth + 1, m, file);
      m->nodes[static_cast<size_t>(idx)].children.push_back(child);
    }
  }
  m->nodes[static_cast<size_t>(idx)].end_leaf = static_cast<int>(m->leaves.size());
}

FileMeta parse_file_meta(const uint8_t* begin, const uint8_t* end, const std::string& file) {
  ThriftReader r(begin, end, file + ": footer");
  FileMeta m;
  std::vector<RawSchemaElement> raw;
  bool has_schema = false, has_row_groups = false;
  QT_FIELD_LOOP(r) {
    switch (fid) {
      case 2: {
        ThriftType et;
        int64_t n;
        r.read_list_header(ft, "FileMetaData.schema", &et, &n);
        if (et != ThriftType::Struct) r.fail("FileMetaData.schema is not a list of structs");
        for (int64_t i = 0; i < n; ++i) raw.push_back(parse_schema_element(r));
        has_schema = true;
        break;
      }
      case 3: m.num_rows = r.read_i64(ft, "FileMetaData.num_rows"); break;
      case 4: {
        ThriftType et;
        int64_t n;
        r.read_list_header(ft, "FileMetaData.row_groups", &et, &n);
        if (et != ThriftType::Struct) r.fail("FileMetaData.row_groups is not a list of structs");
        for (int64_t i = 0; i < n; ++i) m.row_groups.push_back(parse_row_group(r));
        has_row_groups = true;
        break;
      }
      case 6: m.created_by = std::string(r.read_binary(ft, "FileMetaData.created_by")); break;
      case 8: r.fail("encrypted parquet files are not supported (FileMetaData.encryption_algorithm is set)");
      default: r.skip(ft);
    }
  }
  r.end_struct();
  if (!has_schema || raw.empty()) r.fail("FileMetaData has no schema");
  if (!has_row_groups || m.num_rows < 0) r.fail("FileMetaData lacks row_groups or num_rows");
  size_t next = 0;
  build_schema(raw, &next, -1, 0, &m, file);
  QT_CHECK(next == raw.size(), file, ": corrupt schema: ", raw.size(), " elements but the tree uses ", next);
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    const RowGroupMeta& rg = m.row_groups[g];
    QT_CHECK(rg.columns.size() == m.leaves.size(), file, ": row group ", g, " has ", rg.columns.size(),
             " column chunks but the schema has ", m.leaves.size(), " leaf columns");
    for (size_t c = 0; c < rg.columns.size(); ++c) {
      const SchemaNode& leaf = m.nodes[static_cast<size_t>(m.leaves[c])];
      QT_CHECK(rg.columns[c].type == leaf.type, file, ": column '", leaf.path, "' is ", phys_name(leaf.type),
               " in the schema but ", phys_name(rg.columns[c].type), " in row group ", g);
    }
  }
  return m;
}

// ---- decompression ----------------------------------------------------------------------------

struct Buffers {
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  uint8_t* alloc(size_t n) {
    owned.emplace_back(new uint8_t[n == 0 ? 1 : n]);
    return owned.back().get();
  }
};

// Returns the decompressed bytes (exactly `expected` of them); may point at `src` when stored.
const uint8_t* decompress(int codec, const uint8_t* src, size_t n, int64_t expected, Buffers* bufs, const std::string& ctx) {
  QT_CHECK(expected >= 0 && expected <= kMaxPageBytes, ctx, ": page of ", expected, " bytes exceeds the reader's limit");
  size_t want = static_cast<size_t>(expected);
  switch (codec) {
    case kUncompressed:
      QT_CHECK(n == want, ctx, ": corrupt page: uncompressed page stores ", n, " bytes but its header says ", want);
      return src;
    case kSnappy: {
      size_t len = 0;
      QT_CHECK(snappy::GetUncompressedLength(reinterpret_cast<const char*>(src), n, &len), ctx,
               ": corrupt page: bad SNAPPY header");
      QT_CHECK(len == want, ctx, ": corrupt page: SNAPPY data holds ", len, " bytes but the page header says ", want);
      uint8_t* dst = bufs->alloc(want);
      QT_CHECK(snappy::RawUncompress(reinterpret_cast<const char*>(src), n, reinterpret_cast<char*>(dst)), ctx,
               ": corrupt page: SNAPPY decompression failed");
      return dst;
    }
    case kZstd: {
      unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
      QT_CHECK(fcs != ZSTD_CONTENTSIZE_ERROR, ctx, ": corrupt page: bad ZSTD frame header");
      QT_CHECK(fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == want, ctx, ": corrupt page: ZSTD frame holds ", fcs,
               " bytes but the page header says ", want);
      uint8_t* dst = bufs->alloc(want);
      size_t got = ZSTD_decompress(dst, want, src, n);
      QT_CHECK(!ZSTD_isError(got), ctx, ": corrupt page: ZSTD decompression failed: ", ZSTD_getErrorName(got));
      QT_CHECK(got == want, ctx, ": corrupt page: ZSTD produced ", got, " bytes, the page header says ", want);
      return dst;
    }
    case kGzip: {
      // deflate cannot expand more than ~1032:1; a larger claim is corrupt.
      QT_CHECK(want <= n * 1100 + 1024, ctx, ": corrupt page: GZIP page claims ", want, " bytes from ", n);
      uint8_t* dst = bufs->alloc(want);
      z_stream zs{};
      QT_CHECK(inflateInit2(&zs, 15 + 32) == Z_OK, ctx, ": zlib init failed");
      zs.next_in = const_cast<Bytef*>(src);
      zs.avail_in = static_cast<uInt>(n);
      zs.next_out = dst;
      zs.avail_out = static_cast<uInt>(want);
      int rc;
      for (;;) {
        rc = inflate(&zs, Z_FINISH);
        // Concatenated gzip members: start the next one.
        if (rc == Z_STREAM_END && zs.avail_in > 0 && zs.avail_out > 0) {
          if (inflateReset(&zs) != Z_OK) break;
          continue;
        }
        break;
      }
      std::string msg = zs.msg ? zs.msg : "";
      size_t got = want - zs.avail_out;
      inflateEnd(&zs);
      QT_CHECK(rc == Z_STREAM_END, ctx, ": corrupt page: GZIP decompression failed",
               msg.empty() ? std::string(" (data ends early or is larger than the page header says)") : ": " + msg);
      QT_CHECK(got == want, ctx, ": corrupt page: GZIP produced ", got, " bytes, the page header says ", want);
      return dst;
    }
    default:
      QT_FAIL(ctx, ": compression codec ", codec_name(codec),
              " is not supported (supported: UNCOMPRESSED, SNAPPY, GZIP, ZSTD)");
  }
}

// ---- level / value decoding -------------------------------------------------------------------

uint64_t read_uleb(const uint8_t*& p, const uint8_t* end, const std::string& ctx) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    QT_CHECK(p < end, ctx, ": corrupt page: RLE run header runs past the end");
    uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  QT_FAIL(ctx, ": corrupt page: RLE run header longer than 10 bytes");
}

// RLE / bit-packed hybrid: decodes exactly `count` values of `bw` bits from [p, end) into out.
void rle_decode(const uint8_t* p, const uint8_t* end, int bw, int64_t count, std::vector<uint32_t>* out,
                const std::string& ctx) {
  QT_CHECK(bw >= 0 && bw <= 32, ctx, ": corrupt page: bit width ", bw, " out of range");
  out->clear();
  out->reserve(static_cast<size_t>(std::min<int64_t>(count, 1 << 16)));
  const size_t value_bytes = static_cast<size_t>((bw + 7) / 8);
  const uint64_t mask = bw == 32 ? 0xffffffffull : ((1ull << bw) - 1);
  int64_t left = count;
  while (left > 0) {
    uint64_t header = read_uleb(p, end, ctx);
    uint64_t run = header >> 1;
    if (header & 1) {  // bit-packed: run groups of 8 values
      uint64_t avail_bytes = static_cast<uint64_t>(end - p);
      if (bw > 0) QT_CHECK(run <= avail_bytes, ctx, ": corrupt page: bit-packed run of ", run, " groups runs past the end");
      const uint64_t want = static_cast<uint64_t>(left);
      uint64_t nvals = run >= want ? want : std::min<uint64_t>(run * 8, want);
      uint64_t need_bytes = (nvals * static_cast<uint64_t>(bw) + 7) / 8;
      QT_CHECK(need_bytes <= avail_bytes, ctx, ": corrupt page: bit-packed run runs past the end");
      for (uint64_t j = 0; j < nvals; ++j) {
        uint64_t bit = j * static_cast<uint64_t>(bw);
        uint64_t v = 0;
        size_t byte = static_cast<size_t>(bit >> 3);
        int shift = static_cast<int>(bit & 7);
        int have = 0;
        for (int k = 0; have < bw + shift; ++k, have += 8) {
          if (byte + static_cast<size_t>(k) >= avail_bytes) break;
          v |= static_cast<uint64_t>(p[byte + static_cast<size_t>(k)]) << (8 * k);
        }
        out->push_back(static_cast<uint32_t>((v >> shift) & mask));
      }
      uint64_t run_bytes = run * static_cast<uint64_t>(bw);
      p += std::min<uint64_t>(run_bytes, avail_bytes);
      left -= static_cast<int64_t>(nvals);
    } else {  // RLE: run copies of one value
      QT_CHECK(static_cast<size_t>(end - p) >= value_bytes, ctx, ": corrupt page: RLE value runs past the end");
      uint64_t v = 0;
      for (size_t k = 0; k < value_bytes; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
      p += value_bytes;
      QT_CHECK((v & ~mask) == 0, ctx, ": corrupt page: RLE value ", v, " wider than ", bw, " bits");
      uint64_t n = std::min<uint64_t>(run, static_cast<uint64_t>(left));
      out->insert(out->end(), static_cast<size_t>(n), static_cast<uint32_t>(v));
      left -= static_cast<int64_t>(n);
    }
  }
}

int bit_width(int max_level) {
  int bw = 0;
  while ((1 << bw) <= max_level) ++bw;
  return bw;
}

// Decoded values of one leaf (non-null only), in one of four representations by physical type.
struct Values {
  std::vector<std::string_view> s;  // BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY
  std::vector<int64_t> i;           // INT32, INT64
  std::vector<double> d;            // FLOAT, DOUBLE
  std::vector<uint8_t> b;           // BOOLEAN
  size_t size(int type) const {
    switch (type) {
      case kBoolean: return b.size();
      case kInt32:
      case kInt64: return i.size();
      case kFloat:
      case kDouble: return d.size();
      default: return s.size();
    }
  }
  void append(const Values& dict, int type, uint32_t k) {
    switch (type) {
      case kBoolean: b.push_back(dict.b[k]); break;
      case kInt32:
      case kInt64: i.push_back(dict.i[k]); break;
      case kFloat:
      case kDouble: d.push_back(dict.d[k]); break;
      default: s.push_back(dict.s[k]);
    }
  }
};

void plain_decode(const SchemaNode& leaf, const uint8_t* p, size_t n, int64_t count, Values* out, const std::string& ctx) {
  const uint64_t c = static_cast<uint64_t>(count);
  auto need = [&](uint64_t width) {
    QT_CHECK(width == 0 || c <= n / width, ctx, ": corrupt page: ", count, " PLAIN ", phys_name(leaf.type),
             " values need more than the ", n, " bytes in the page");
  };
  switch (leaf.type) {
    case kBoolean:
      QT_CHECK((c + 7) / 8 <= n, ctx, ": corrupt page: ", count, " PLAIN booleans need more than ", n, " bytes");
      for (uint64_t j = 0; j < c; ++j) out->b.push_back((p[j >> 3] >> (j & 7)) & 1);
      return;
    case kInt32:
      need(4);
      for (uint64_t j = 0; j < c; ++j) {
        int32_t v;
        std::memcpy(&v, p + 4 * j, 4);
        out->i.push_back(v);
      }
      return;
    case kInt64:
      need(8);
      for (uint64_t j = 0; j < c; ++j) {
        int64_t v;
        std::memcpy(&v, p + 8 * j, 8);
        out->i.push_back(v);
      }
      return;
    case kFloat:
      need(4);
      for (uint64_t j = 0; j < c; ++j) {
        float v;
        std::memcpy(&v, p + 4 * j, 4);
        out->d.push_back(v);
      }
      return;
    case kDouble:
      need(8);
      for (uint64_t j = 0; j < c; ++j) {
        double v;
        std::memcpy(&v, p + 8 * j, 8);
        out->d.push_back(v);
      }
      return;
    case kByteArray: {
      need(4);
      size_t pos = 0;
      for (uint64_t j = 0; j < c; ++j) {
        QT_CHECK(n - pos >= 4, ctx, ": corrupt page: BYTE_ARRAY value ", j, " of ", count, " runs past the end");
        uint32_t len;
        std::memcpy(&len, p + pos, 4);
        pos += 4;
        QT_CHECK(len <= n - pos, ctx, ": corrupt page: BYTE_ARRAY value of ", len, " bytes runs past the end");
        out->s.emplace_back(reinterpret_cast<const char*>(p + pos), len);
        pos += len;
      }
      return;
    }
    case kFixedLenByteArray: {
      QT_CHECK(leaf.type_length >= 0, ctx, ": FIXED_LEN_BYTE_ARRAY with negative type_length");
      const uint64_t w = static_cast<uint64_t>(leaf.type_length);
      need(w);
      for (uint64_t j = 0; j < c; ++j) out->s.emplace_back(reinterpret_cast<const char*>(p + w * j), static_cast<size_t>(w));
      return;
    }
    default:
      QT_FAIL(ctx, ": physical type ", phys_name(leaf.type), " is not supported");
  }
}

// ---- column chunk decoding --------------------------------------------------------------------

struct LeafData {
  std::vector<uint8_t> rep, def;  // one entry per level (max level <= kMaxSchemaDepth fits a byte)
  Values values;
  Buffers buffers;
};

struct FileView {
  const uint8_t* data;
  size_t size;
  size_t data_end;  // start of the footer: pages live in [4, data_end)
  std::string name;
};

void decode_levels(const uint8_t* p, const uint8_t* end, int max_level, int64_t count, std::vector<uint8_t>* out,
                   std::vector<uint32_t>* tmp, const std::string& ctx, const char* which) {
  rle_decode(p, end, bit_width(max_level), count, tmp, ctx);
  for (uint32_t v : *tmp) {
    QT_CHECK(v <= static_cast<uint32_t>(max_level), ctx, ": corrupt page: ", which, " level ", v, " exceeds the maximum ", max_level);
    out->push_back(static_cast<uint8_t>(v));
  }
}

// Decodes the values of one data page (after its levels): `count` non-null values.
void decode_page_values(const SchemaNode& leaf, int encoding, const uint8_t* p, size_t n, int64_t count,
                        const Values* dict, bool has_dict, Values* out, std::vector<uint32_t>* tmp, const std::string& ctx) {
  switch (encoding) {
    case kPlain: plain_decode(leaf, p, n, count, out, ctx); return;
    case kPlainDictionary:
    case kRleDictionary: {
      QT_CHECK(has_dict, ctx, ": corrupt column: dictionary-encoded page without a dictionary page");
      if (count == 0) return;
      QT_CHECK(n >= 1, ctx, ": corrupt page: dictionary indices lack their bit width");
      rle_decode(p + 1, p + n, p[0], count, tmp, ctx);
      const size_t dict_size = dict->size(leaf.type);
      for (uint32_t k : *tmp) {
        QT_CHECK(k < dict_size, ctx, ": corrupt page: dictionary index ", k, " out of range (dictionary has ", dict_size, " entries)");
        out->append(*dict, leaf.type, k);
      }
      return;
    }
    case kRle:
      if (leaf.type == kBoolean) {  // length-prefixed RLE, bit width 1
        QT_CHECK(n >= 4, ctx, ": corrupt page: RLE booleans lack their length");
        uint32_t len;
        std::memcpy(&len, p, 4);
        QT_CHECK(len <= n - 4, ctx, ": corrupt page: RLE boolean length ", len, " runs past the end");
        rle_decode(p + 4, p + 4 + len, 1, count, tmp, ctx);
        for (uint32_t v : *tmp) out->b.push_back(static_cast<uint8_t>(v));
        return;
      }
      [[fallthrough]];
    default:
      QT_FAIL(ctx, ": value encoding ", encoding_name(encoding), " is not supported for ", phys_name(leaf.type),
              " (supported: PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY)");
  }
}

void decode_column_chunk(const FileView& f, const SchemaNode& leaf, const ColumnChunkMeta& cc, int64_t rg_rows,
                         int rg_index, LeafData* out) {
  const std::string ctx = str(f.name, ": column '", leaf.path, "' (row group ", rg_index, ")");
  QT_CHECK(leaf.type != kInt96, ctx, ": physical type INT96 (legacy timestamps) is not supported");
  int64_t start = cc.data_page_offset;
  if (cc.dictionary_page_offset > 0 && cc.dictionary_page_offset < start) start = cc.dictionary_page_offset;
  QT_CHECK(start >= 4 && static_cast<uint64_t>(start) <= f.data_end, ctx, ": corrupt metadata: column chunk offset ", start,
           " is outside the data area [4, ", f.data_end, ")");
  QT_CHECK(static_cast<uint64_t>(cc.total_compressed_size) <= f.data_end - static_cast<uint64_t>(start), ctx,
           ": corrupt metadata: column chunk of ", cc.total_compressed_size, " bytes at offset ", start,
           " runs past the data area (", f.data_end, " bytes)");
  const uint8_t* pos = f.data + start;
  const uint8_t* end = pos + cc.total_compressed_size;
  const int64_t max_entries = leaf.max_rep == 0 ? rg_rows : kMaxLeafEntries;
  QT_CHECK(cc.num_values <= max_entries, ctx, ": corrupt metadata: column chunk claims ", cc.num_values,
           " values (row group has ", rg_rows, " rows)");

  Values dict;
  bool has_dict = false;
  int64_t seen = 0;
  int page = 0;
  std::vector<uint32_t> tmp;
  while (seen < cc.num_values) {
    const std::string pctx = str(ctx, " page ", page);
    QT_CHECK(pos < end, ctx, ": corrupt column chunk: pages end after ", seen, " of ", cc.num_values, " values");
    ThriftReader r(pos, end, pctx + " header");
    PageHeader h = parse_page_header(r);
    pos += r.offset();
    QT_CHECK(h.compressed_size <= end - pos, pctx, ": corrupt page: compressed size ", h.compressed_size,
             " runs past the column chunk (", end - pos, " bytes left)");
    const uint8_t* body = pos;
    const size_t body_n = static_cast<size_t>(h.compressed_size);
    pos += h.compressed_size;
    ++page;

    if (h.type == kIndexPage) continue;
    if (h.type == kDictionaryPage) {
      QT_CHECK(h.has_dict && h.num_values >= 0, pctx, ": corrupt page: dictionary page without a valid DictionaryPageHeader");
      QT_CHECK(!has_dict && seen == 0, pctx, ": corrupt column: a second dictionary page, or one after data pages");
      QT_CHECK(h.encoding == kPlain || h.encoding == kPlainDictionary, pctx, ": dictionary page encoding ",
               encoding_name(h.encoding), " is not supported");
      QT_CHECK(h.num_values <= kMaxPageValues, pctx, ": dictionary of ", h.num_values, " entries exceeds the reader's limit");
      const uint8_t* d = decompress(cc.codec, body, body_n, h.uncompressed_size, &out->buffers, pctx);
      plain_decode(leaf, d, static_cast<size_t>(h.uncompressed_size), h.num_values, &dict, pctx);
      has_dict = true;
      continue;
    }
    QT_CHECK(h.type == kDataPage || h.type == kDataPageV2, pctx, ": page type ", h.type, " is not supported");
    const bool v2 = h.type == kDataPageV2;
    QT_CHECK(v2 ? h.has_v2 : h.has_data, pctx, ": corrupt page: data page without its ", v2 ? "DataPageHeaderV2" : "DataPageHeader");
    QT_CHECK(h.num_values >= 0 && h.encoding >= 0, pctx, ": corrupt page: data page header lacks num_values or encoding");
    QT_CHECK(h.num_values <= kMaxPageValues, pctx, ": page of ", h.num_values, " values exceeds the reader's limit of ", kMaxPageValues);
    QT_CHECK(h.num_values <= cc.num_values - seen, pctx, ": corrupt page: ", h.num_values,
             " values overflow the column chunk's ", cc.num_values);
    const int64_t nv = h.num_values;
    const size_t level_start = out->def.size();

    const uint8_t* vals;
    size_t vals_n;
    if (!v2) {
      const uint8_t* p = decompress(cc.codec, body, body_n, h.uncompressed_size, &out->buffers, pctx);
      const uint8_t* pend = p + h.uncompressed_size;
      auto levels = [&](int max_level, int enc, std::vector<uint8_t>* dst, const char* which) {
        if (max_level == 0) {
          dst->insert(dst->end(), static_cast<size_t>(nv), 0);
          return;
        }
        QT_CHECK(enc == kRle, pctx, ": ", which, " level encoding ", encoding_name(enc), " is not supported (only RLE)");
        QT_CHECK(pend - p >= 4, pctx, ": corrupt page: ", which, " levels lack their length");
        uint32_t len;
        std::memcpy(&len, p, 4);
        p += 4;
        QT_CHECK(len <= static_cast<uint64_t>(pend - p), pctx, ": corrupt page: ", which, " levels of ", len, " bytes run past the page");
        decode_levels(p, p + len, max_level, nv, dst, &tmp, pctx, which);
        p += len;
      };
      levels(leaf.max_rep, h.rep_encoding, &out->rep, "repetition");
      levels(leaf.max_def, h.def_encoding, &out->def, "definition");
      vals = p;
      vals_n = static_cast<size_t>(pend - p);
    } else {
      QT_CHECK(h.def_len >= 0 && h.rep_len >= 0, pctx, ": corrupt page: DataPageHeaderV2 lacks level lengths");
      QT_CHECK(static_cast<uint64_t>(h.def_len) + static_cast<uint64_t>(h.rep_len) <= body_n, pctx,
               ": corrupt page: level lengths exceed the page");
      QT_CHECK(h.def_len + h.rep_len <= h.uncompressed_size, pctx, ": corrupt page: level lengths exceed the uncompressed size");
      const uint8_t* p = body;
      if (leaf.max_rep > 0) decode_levels(p, p + h.rep_len, leaf.max_rep, nv, &out->rep, &tmp, pctx, "repetition");
      else out->rep.insert(out->rep.end(), static_cast<size_t>(nv), 0);
      p += h.rep_len;
      if (leaf.max_def > 0) decode_levels(p, p + h.def_len, leaf.max_def, nv, &out->def, &tmp, pctx, "definition");
      else out->def.insert(out->def.end(), static_cast<size_t>(nv), 0);
      p += h.def_len;
      const size_t comp_n = body_n - static_cast<size_t>(h.def_len + h.rep_len);
      const int64_t raw_n = h.uncompressed_size - h.def_len - h.rep_len;
      if (h.is_compressed && cc.codec != kUncompressed && !(comp_n == 0 && raw_n == 0)) {
        vals = decompress(cc.codec, p, comp_n, raw_n, &out->buffers, pctx);
      } else {
        QT_CHECK(static_cast<int64_t>(comp_n) == raw_n, pctx, ": corrupt page: uncompressed values hold ", comp_n,
                 " bytes but the header says ", raw_n);
        vals = p;
      }
      vals_n = static_cast<size_t>(raw_n);
    }
    int64_t non_null = 0;
    for (size_t k = level_start; k < out->def.size(); ++k) non_null += out->def[k] == leaf.max_def;
    decode_page_values(leaf, h.encoding, vals, vals_n, non_null, &dict, has_dict, &out->values, &tmp, pctx);
    seen += nv;
  }
  QT_CHECK(out->rep.size() == out->def.size() && out->values.size(leaf.type) <= out->def.size(), ctx,
           ": internal error: level/value counts disagree");
}

// ---- record assembly --------------------------------------------------------------------------

class Assembler {
 public:
  Assembler(const FileMeta& m, std::vector<LeafData>& leaves, const std::string& ctx)
      : m_(m), leaves_(leaves), lvl_(leaves.size(), 0), val_(leaves.size(), 0), ctx_(ctx) {}

  // Fills `row` with the projected top-level columns of the next record.
  void next_record(const std::vector<int>& top, json* row) {
    for (int t : top) {
      const SchemaNode& n = node(t);
      for (int l = n.first_leaf; l < n.end_leaf; ++l) {
        QT_CHECK(lvl_[l] < data(l).def.size(), ctx_, ": corrupt data: column '", leaf_node(l).path, "' has fewer records than the row group");
        QT_CHECK(data(l).rep[lvl_[l]] == 0, ctx_, ": corrupt data: column '", leaf_node(l).path, "' does not start a record where expected");
      }
      (*row)[n.name] = n.repetition == kRepeated ? list_of(t, false) : value_of(t);
    }
  }

  void check_consumed(const std::vector<int>& top) const {
    for (int t : top) {
      const SchemaNode& n = node(t);
      for (int l = n.first_leaf; l < n.end_leaf; ++l)
        QT_CHECK(lvl_[l] == data(l).def.size() && val_[l] == data(l).values.size(leaf_node(l).type), ctx_,
                 ": corrupt data: column '", leaf_node(l).path, "' holds more values than the row group's rows");
    }
  }

 private:
  const SchemaNode& node(int i) const { return m_.nodes[static_cast<size_t>(i)]; }
  const SchemaNode& leaf_node(int l) const { return node(m_.leaves[static_cast<size_t>(l)]); }
  LeafData& data(int l) const { return leaves_[static_cast<size_t>(l)]; }

  // Definition / repetition level of the next entry of node's first leaf.
  int peek_def(const SchemaNode& n) const {
    int l = n.first_leaf;
    QT_CHECK(lvl_[l] < data(l).def.size(), ctx_, ": corrupt data: column '", leaf_node(l).path, "' ends early");
    return data(l).def[lvl_[l]];
  }

  // Consumes one entry from every leaf under n (a null or empty list at or above n).
  void consume_empty(const SchemaNode& n) {
    int d0 = peek_def(n);
    for (int l = n.first_leaf; l < n.end_leaf; ++l) {
      QT_CHECK(lvl_[l] < data(l).def.size() && data(l).def[lvl_[l]] == d0, ctx_,
               ": corrupt data: columns under '", n.path, "' disagree on definition levels");
      ++lvl_[l];
    }
  }

  json value_of(int i) {
    const SchemaNode& n = node(i);
    if (n.repetition == kOptional && peek_def(n) < n.max_def) {
      consume_empty(n);
      return nullptr;
    }
    return instance_of(i);
  }

  json leaf_value(const SchemaNode& n) {
    const int l = n.leaf;
    LeafData& d = data(l);
    QT_CHECK(lvl_[l] < d.def.size(), ctx_, ": corrupt data: column '", n.path, "' ends early");
    int def = d.def[lvl_[l]];
    if (def < n.max_def) {  // null below an optional ancestor that the driver column saw as present
      QT_FAIL(ctx_, ": corrupt data: column '", n.path, "' has definition level ", def, " where ", n.max_def, " is required");
    }
    ++lvl_[l];
    size_t k = val_[l]++;
    QT_CHECK(k < d.values.size(n.type), ctx_, ": corrupt data: column '", n.path, "' has fewer values than its levels need");
    switch (n.type) {
      case kBoolean: return d.values.b[k] != 0;
      case kInt32:
      case kInt64: return d.values.i[k];
      case kFloat:
      case kDouble: return d.values.d[k];
      default: return std::string(d.values.s[k]);
    }
  }

  bool is_list(const SchemaNode& n) const {
    return (n.converted == kConvList || n.logical == kLogicalList) && n.children.size() == 1 &&
           node(n.children[0]).repetition == kRepeated;
  }
  bool is_map(const SchemaNode& n) const {
    return (n.converted == kConvMap || n.converted == kConvMapKeyValue || n.logical == kLogicalMap) &&
           n.children.size() == 1 && node(n.children[0]).repetition == kRepeated;
  }

  // The value of node i, known to be present (its definition level is reached).
  json instance_of(int i) {
    const SchemaNode& n = node(i);
    if (n.is_leaf()) return leaf_value(n);
    if (is_list(n)) {
      const SchemaNode& rep = node(n.children[0]);
      // Backward-compatibility rules of the LIST spec: the repeated field is the element itself
      // when it is a primitive, a multi-field group, or named "array" / "<list>_tuple".
      bool rep_is_element = rep.is_leaf() || rep.children.size() != 1 || rep.name == "array" || rep.name == n.name + "_tuple";
      return list_of(n.children[0], !rep_is_element);
    }
    if (is_map(n)) {
      json kvs = list_of(n.children[0], false);
      bool string_keys = true;
      for (const json& kv : kvs) string_keys = string_keys && kv.is_object() && kv.contains("key") && kv["key"].is_string();
      if (!string_keys) return kvs;
      json obj = json::object();
      for (const json& kv : kvs) obj[kv["key"].get<std::string>()] = kv.contains("value") ? kv["value"] : json(nullptr);
      return obj;
    }
    json obj = json::object();
    for (int c : n.children) {
      const SchemaNode& ch = node(c);
      obj[ch.name] = ch.repetition == kRepeated ? list_of(c, false) : value_of(c);
    }
    return obj;
  }

  // All instances of repeated node r within the current parent instance. unwrap: each element
  // is the value of r's single child (3-level LIST) instead of r itself.
  json list_of(int r, bool unwrap) {
    const SchemaNode& n = node(r);
    json arr = json::array();
    if (peek_def(n) < n.max_def) {
      consume_empty(n);
      return arr;
    }
    const int driver = n.first_leaf;
    for (;;) {
      const size_t before = lvl_[driver];
      arr.push_back(unwrap ? (node(n.children[0]).repetition == kRepeated ? list_of(n.children[0], false) : value_of(n.children[0]))
                           : instance_of(r));
      QT_CHECK(lvl_[driver] > before, ctx_, ": internal error: list assembly made no progress");
      const LeafData& d = data(driver);
      if (lvl_[driver] >= d.rep.size()) break;
      int rep = d.rep[lvl_[driver]];
      if (rep < n.max_rep) break;
      QT_CHECK(rep == n.max_rep, ctx_, ": corrupt data: column '", leaf_node(driver).path, "' has repetition level ", rep,
               " where at most ", n.max_rep, " is possible");
      QT_CHECK(d.def[lvl_[driver]] >= n.max_def, ctx_, ": corrupt data: column '", leaf_node(driver).path,
               "' repeats an undefined element");
    }
    return arr;
  }

  const FileMeta& m_;
  std::vector<LeafData>& leaves_;
  std::vector<size_t> lvl_, val_;
  std::string ctx_;
};

// ---- file --------------------------------------------------------------------------------------

FileView open_view(const uint8_t* data, size_t size, const std::string& name, FileMeta* meta) {
  QT_CHECK(size >= 12, name, ": not a parquet file: only ", size, " bytes (truncated?)");
  QT_CHECK(std::memcmp(data + size - 4, "PARE", 4) != 0, name, ": encrypted parquet files are not supported");
  QT_CHECK(std::memcmp(data, "PAR1", 4) == 0, name, ": not a parquet file: missing PAR1 magic at the start");
  QT_CHECK(std::memcmp(data + size - 4, "PAR1", 4) == 0, name,
           ": not a parquet file or truncated: missing PAR1 magic at the end");
  uint32_t footer_len;
  std::memcpy(&footer_len, data + size - 8, 4);
  QT_CHECK(footer_len <= size - 12, name, ": corrupt or truncated parquet file: footer length ", footer_len,
           " exceeds the file size ", size);
  FileView f{data, size, size - 8 - footer_len, name};
  *meta = parse_file_meta(data + f.data_end, data + size - 8, name);
  return f;
}

std::vector<int> projection(const FileMeta& m, const ParquetReadOptions& opt, const std::string& name) {
  const SchemaNode& root = m.nodes[0];
  std::vector<int> top;
  if (opt.columns.empty()) return root.children;
  for (const std::string& c : opt.columns) {
    int found = -1;
    for (int ch : root.children)
      if (m.nodes[static_cast<size_t>(ch)].name == c) found = ch;
    if (found < 0) {
      std::string have;
      for (int ch : root.children) have += (have.empty() ? "" : ", ") + m.nodes[static_cast<size_t>(ch)].name;
      QT_FAIL(name, ": no column '", c, "' (columns: ", have, ")");
    }
    if (std::find(top.begin(), top.end(), found) == top.end()) top.push_back(found);
  }
  return top;
}

int64_t read_rows(const FileView& f, const FileMeta& m, const ParquetRowFn& fn, const ParquetReadOptions& opt,
                  int64_t first_row_index) {
  const std::vector<int> top = projection(m, opt, f.name);
  int64_t row_index = first_row_index;
  int64_t delivered = 0;
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    if (opt.max_rows >= 0 && row_index >= opt.max_rows) break;
    const RowGroupMeta& rg = m.row_groups[g];
    if (rg.num_rows == 0) continue;
    std::vector<LeafData> leaves(m.leaves.size());
    for (int t : top) {
      const SchemaNode& n = m.nodes[static_cast<size_t>(t)];
      for (int l = n.first_leaf; l < n.end_leaf; ++l)
        decode_column_chunk(f, m.nodes[static_cast<size_t>(m.leaves[static_cast<size_t>(l)])], rg.columns[static_cast<size_t>(l)],
                            rg.num_rows, static_cast<int>(g), &leaves[static_cast<size_t>(l)]);
    }
    Assembler a(m, leaves, str(f.name, ": row group ", g));
    for (int64_t r = 0; r < rg.num_rows; ++r) {
      if (opt.max_rows >= 0 && row_index >= opt.max_rows) return delivered;
      json row = json::object();
      a.next_record(top, &row);
      fn(row, row_index++);
      ++delivered;
    }
    a.check_consumed(top);
  }
  return delivered;
}

void describe_schema(const FileMeta& m, int i, int depth, std::string* out) {
  const SchemaNode& n = m.nodes[static_cast<size_t>(i)];
  static const char* reps[] = {"required", "optional", "repeated"};
  if (depth > 0) {
    *out += std::string(static_cast<size_t>(2 * (depth - 1)), ' ') + n.name + ": " + reps[n.repetition] + " " +
            (n.is_leaf() ? phys_name(n.type) : "group");
    if (n.converted == kConvUtf8 || n.logical == kLogicalString) *out += " STRING";
    if (n.converted == kConvList || n.logical == kLogicalList) *out += " LIST";
    if (n.converted == kConvMap || n.logical == kLogicalMap) *out += " MAP";
    *out += "\n";
  }
  for (int c : n.children) describe_schema(m, c, depth + 1, out);
}

}  // namespace

// ---- public API --------------------------------------------------------------------------------

bool parquet_has_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".parquet";
}

std::vector<std::string> parquet_list_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    QT_CHECK(fs::exists(path, ec), path, ": does not exist");
    return {path};
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file(ec) && parquet_has_extension(e.path().string())) files.push_back(e.path().string());
  }
  QT_CHECK(!ec, path, ": cannot list directory: ", ec.message());
  QT_CHECK(!files.empty(), path, ": directory holds no .parquet files");
  std::sort(files.begin(), files.end());
  return files;
}

int64_t parquet_read_rows_from_memory(const uint8_t* data, size_t size, const std::string& name, const ParquetRowFn& fn,
                                      const ParquetReadOptions& options, int64_t first_row_index) {
  FileMeta meta;
  FileView f = open_view(data, size, name, &meta);
  return read_rows(f, meta, fn, options, first_row_index);
}

void parquet_read_rows(const std::string& path, const ParquetRowFn& fn, const ParquetReadOptions& options) {
  int64_t row_index = 0;
  for (const std::string& file : parquet_list_files(path)) {
    if (options.max_rows >= 0 && row_index >= options.max_rows) break;
    MappedFile mf(file);
    row_index += parquet_read_rows_from_memory(mf.data(), mf.size(), file, fn, options, row_index);
  }
}

namespace {
void append_json_string(const std::string& s, std::string* out) {
  static const char hex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          *out += "\\u00";
          out->push_back(hex[c >> 4]);
          out->push_back(hex[c & 15]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}
}  // namespace

void parquet_append_json_text(const json& v, std::string* out) {
  switch (v.type()) {
    case json::value_t::string: append_json_string(v.get_ref<const std::string&>(), out); return;
    case json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const json& e : v) {
        if (!first) out->push_back(',');
        first = false;
        parquet_append_json_text(e, out);
      }
      out->push_back(']');
      return;
    }
    case json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out->push_back(',');
        first = false;
        append_json_string(it.key(), out);
        out->push_back(':');
        parquet_append_json_text(it.value(), out);
      }
      out->push_back('}');
      return;
    }
    default: *out += v.dump(); return;  // null, bool, numbers (non-finite floats become null)
  }
}

std::string parquet_to_jsonl(const std::string& path, const ParquetReadOptions& options) {
  std::string out;
  parquet_read_rows(path, [&](const json& row, int64_t) {
    parquet_append_json_text(row, &out);
    out.push_back('\n');
  }, options);
  return out;
}

ParquetFileInfo parquet_file_info(const std::string& path) {
  MappedFile mf(path);
  FileMeta meta;
  open_view(mf.data(), mf.size(), path, &meta);
  ParquetFileInfo info;
  info.num_rows = meta.num_rows;
  info.num_row_groups = static_cast<int64_t>(meta.row_groups.size());
  for (int c : meta.nodes[0].children) info.columns.push_back(meta.nodes[static_cast<size_t>(c)].name);
  describe_schema(meta, 0, 0, &info.schema);
  info.created_by = meta.created_by;
  return info;
}

}  // namespace qt
