// Parquet reader tests against files from tests/parquet_test_writer (no pyarrow needed):
// round trips over codecs x page versions x dictionary x row-group/page splits, every supported
// physical type and nesting, projection, shard directories, bad files and a mutation fuzz loop.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/parquet.h"
#include "data/thrift_compact.h"
#include "parquet_test_writer.h"
#include "test_util.h"

namespace qt::testing {
namespace {

using json = nlohmann::json;

std::vector<json> read_mem(const std::string& bytes, const ParquetReadOptions& opt = {}) {
  std::vector<json> rows;
  int64_t expect = 0;
  parquet_read_rows_from_memory(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem.parquet",
      [&](const json& row, int64_t i) {
        EXPECT_EQ(i, expect++);
        rows.push_back(row);
      },
      opt);
  return rows;
}

void expect_rows_equal(const std::vector<json>& got, const std::vector<json>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      ADD_FAILURE() << "row " << i << "\n got: " << got[i].dump().substr(0, 400) << "\nwant: " << want[i].dump().substr(0, 400);
      return;
    }
  }
}

PqNode types_schema() {
  PqNode tags{"tags", 2, 6, 0, {}};  // bare repeated leaf
  return pq_struct("schema",
                   {pq_leaf("b", 0), pq_leaf("i32", 1), pq_leaf("i64", 2, 0), pq_leaf("f", 4), pq_leaf("d", 5),
                    pq_string("s", 0), tags, pq_list("nums", pq_leaf("x", 2)), pq_list("nested", pq_list("x", pq_string("y"))),
                    pq_struct("st", {pq_leaf("a", 1), pq_struct("inner", {pq_string("z")})}),
                    pq_map("m", pq_leaf("v", 1))},
                   0);
}

std::vector<json> types_rows(int n) {
  std::vector<json> rows;
  for (int i = 0; i < n; ++i) {
    json r;
    r["b"] = i % 4 == 3 ? json(nullptr) : json(i % 3 == 0);
    r["i32"] = i % 5 == 2 ? json(nullptr) : json(i * 1000 - 7000);
    r["i64"] = int64_t{1} << (i % 62);
    r["f"] = i % 7 == 1 ? json(nullptr) : json(static_cast<double>(i) * 0.25f - 2.5f);
    r["d"] = i % 6 == 5 ? json(nullptr) : json(i * 1.125 - 1e10);
    r["s"] = i % 8 == 0 ? std::string() : "s" + std::to_string(i % 5);
    r["tags"] = json::array();
    for (int k = 0; k < i % 4; ++k) r["tags"].push_back("t" + std::to_string(k));
    if (i % 9 == 3) r["nums"] = nullptr;
    else {
      r["nums"] = json::array();
      for (int k = 0; k < i % 5; ++k) r["nums"].push_back(k == 1 ? json(nullptr) : json(i * 10 + k));
    }
    if (i % 10 == 7) r["nested"] = nullptr;
    else r["nested"] = json::array({json::array({"a", nullptr}), json::array(), nullptr, json::array({"b" + std::to_string(i)})});
    if (i % 4 == 1) r["nested"] = json::array();
    if (i % 5 == 4) r["st"] = nullptr;
    else r["st"] = {{"a", i % 3 == 0 ? json(nullptr) : json(i)}, {"inner", i % 2 ? json(nullptr) : json{{"z", i % 4 ? json("zz") : json(nullptr)}}}};
    if (i % 6 == 2) r["m"] = nullptr;
    else {
      r["m"] = json::object();
      for (int k = 0; k < i % 3; ++k) r["m"]["k" + std::to_string(k)] = k == 1 ? json(nullptr) : json(k + i);
    }
    rows.push_back(r);
  }
  return rows;
}

struct Variant {
  const char* name;
  PqWriteOptions opt;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (int codec : {0, 1, 2, 6})
    for (int version : {1, 2})
      for (bool dict : {false, true})
        for (int split : {0, 1}) {
          PqWriteOptions o;
          o.codec = codec;
          o.page_version = version;
          o.dictionary = dict;
          o.plain_dictionary = dict && codec == 1;
          if (split) {
            o.rows_per_group = 7;
            o.values_per_page = 5;
          }
          v.push_back({"", o});
        }
  return v;
}

std::string describe(const PqWriteOptions& o) {
  return str("codec=", o.codec, " v", o.page_version, " dict=", o.dictionary, " rows_per_group=", o.rows_per_group,
             " values_per_page=", o.values_per_page);
}

TEST(ParquetReader, UltrachatRoundTripAllVariants) {
  const std::vector<json> rows = pq_ultrachat_rows(40);
  for (const Variant& v : variants()) {
    SCOPED_TRACE(describe(v.opt));
    expect_rows_equal(read_mem(pq_write(pq_ultrachat_schema(), rows, v.opt)), rows);
  }
}

TEST(ParquetReader, AllTypesNullsAndNestingAllVariants) {
  const std::vector<json> rows = types_rows(45);
  for (const Variant& v : variants()) {
    SCOPED_TRACE(describe(v.opt));
    expect_rows_equal(read_mem(pq_write(types_schema(), rows, v.opt)), rows);
  }
}

TEST(ParquetReader, UltrachatRowShape) {
  const std::vector<json> rows = read_mem(pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(3)));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(rows[0]["prompt"].is_string());
  ASSERT_TRUE(rows[0]["messages"].is_array());
  EXPECT_EQ(rows[0]["messages"][0]["role"], "system");
  EXPECT_EQ(rows[0]["messages"][1]["role"], "user");
  EXPECT_EQ(rows[0]["messages"][1]["content"], rows[0]["prompt"]);
}

TEST(ParquetReader, Projection) {
  const std::vector<json> rows = pq_ultrachat_rows(10);
  const std::string bytes = pq_write(pq_ultrachat_schema(), rows, {});
  ParquetReadOptions opt;
  opt.columns = {"messages"};
  std::vector<json> got = read_mem(bytes, opt);
  ASSERT_EQ(got.size(), rows.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], json({{"messages", rows[i]["messages"]}}));
  opt.columns = {"nope"};
  EXPECT_ERROR_CONTAINS([&] { read_mem(bytes, opt); }, "mem.parquet", "no column 'nope'", "prompt_id");
}

TEST(ParquetReader, ProjectionSkipsUnsupportedColumns) {
  PqWriteOptions o;
  o.override_column = "prompt";
  o.value_encoding_override = 5;  // DELTA_BINARY_PACKED
  const std::string bytes = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(5), o);
  EXPECT_ERROR_CONTAINS([&] { read_mem(bytes); }, "mem.parquet", "column 'prompt'", "DELTA_BINARY_PACKED", "not supported");
  ParquetReadOptions opt;
  opt.columns = {"prompt_id", "messages"};
  EXPECT_EQ(read_mem(bytes, opt).size(), 5u);
}

TEST(ParquetReader, MaxRows) {
  PqWriteOptions o;
  o.rows_per_group = 4;
  const std::string bytes = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(20), o);
  ParquetReadOptions opt;
  opt.max_rows = 6;
  EXPECT_EQ(read_mem(bytes, opt).size(), 6u);
}

TEST(ParquetReader, DirectoryOfShardsSortedWithContinuousRowIndex) {
  ScratchDir dir("parquet-shards");
  const std::vector<json> rows = pq_ultrachat_rows(30);
  PqWriteOptions o;
  o.codec = 6;
  for (int s : {2, 0, 1}) {
    std::vector<json> part(rows.begin() + s * 10, rows.begin() + s * 10 + 10);
    pq_write_file(dir.file("train-0000" + std::to_string(s) + "-of-00003.parquet"), pq_ultrachat_schema(), part, o);
  }
  { std::ofstream(dir.file("README.md")) << "not parquet"; }
  std::vector<json> got;
  parquet_read_rows(dir.path(), [&](const json& r, int64_t i) {
    EXPECT_EQ(i, static_cast<int64_t>(got.size()));
    got.push_back(r);
  });
  expect_rows_equal(got, rows);
  EXPECT_EQ(parquet_list_files(dir.path()).size(), 3u);
  ParquetReadOptions opt;
  opt.max_rows = 15;
  int64_t n = 0;
  parquet_read_rows(dir.path(), [&](const json&, int64_t) { ++n; }, opt);
  EXPECT_EQ(n, 15);

  ParquetFileInfo info = parquet_file_info(dir.file("train-00001-of-00003.parquet"));
  EXPECT_EQ(info.num_rows, 10);
  EXPECT_EQ(info.columns, (std::vector<std::string>{"prompt", "prompt_id", "messages"}));
  EXPECT_NE(info.schema.find("messages: optional group LIST"), std::string::npos) << info.schema;

  ScratchDir empty("parquet-empty");
  EXPECT_ERROR_CONTAINS([&] { parquet_read_rows(empty.path(), [](const json&, int64_t) {}); }, "no .parquet files");
  EXPECT_ERROR_CONTAINS([&] { parquet_read_rows(empty.file("missing.parquet"), [](const json&, int64_t) {}); }, "does not exist");
  EXPECT_TRUE(parquet_has_extension("a/b.PARQUET"));
  EXPECT_FALSE(parquet_has_extension("a/b.jsonl"));
}

// ---- bad files -------------------------------------------------------------------------------

std::string good_file(int codec = 1, int version = 1, bool dict = true) {
  PqWriteOptions o;
  o.codec = codec;
  o.page_version = version;
  o.dictionary = dict;
  return pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(12), o);
}

TEST(ParquetBadFile, Truncated) {
  const std::string f = good_file();
  for (size_t len : {size_t{0}, size_t{3}, size_t{11}, f.size() / 2, f.size() - 1, f.size() - 5})
    EXPECT_ERROR_CONTAINS([&] { read_mem(f.substr(0, len)); }, "mem.parquet");
  EXPECT_ERROR_CONTAINS([&] { read_mem(f.substr(0, 5)); }, "mem.parquet", "truncated");
  EXPECT_ERROR_CONTAINS([&] { read_mem(f.substr(0, f.size() - 1)); }, "mem.parquet", "PAR1");
  // Truncated in the middle but with a valid tail: the footer then points past the data.
  std::string cut = f.substr(0, 40) + f.substr(f.size() - 8);
  EXPECT_ERROR_CONTAINS([&] { read_mem(cut); }, "mem.parquet", "footer length");
}

TEST(ParquetBadFile, WrongMagic) {
  std::string f = good_file();
  f[0] = 'X';
  EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "PAR1 magic at the start");
  f = good_file();
  f[f.size() - 1] = 'X';
  EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "PAR1 magic at the end");
  f = good_file();
  f[f.size() - 1] = 'E';
  EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "encrypted");
  EXPECT_ERROR_CONTAINS([&] { read_mem(std::string("{\"prompt\": \"this is jsonl\"}\n")); }, "not a parquet file");
}

TEST(ParquetBadFile, CorruptPageBytes) {
  for (int codec : {1, 2, 6}) {
    for (int version : {1, 2}) {
      SCOPED_TRACE(str("codec ", codec, " v", version));
      PqWriteOptions o;
      o.codec = codec;
      o.page_version = version;
      o.corrupt_page_start = true;
      o.override_column = "prompt_id";
      const std::string f = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(12), o);
      EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "column 'prompt_id'", "corrupt page");
    }
  }
}

TEST(ParquetBadFile, WrongPageSizes) {
  for (int codec : {0, 1, 2, 6}) {
    for (int delta : {-1, 1, 100000}) {
      SCOPED_TRACE(str("codec ", codec, " delta ", delta));
      PqWriteOptions o;
      o.codec = codec;
      o.uncompressed_size_delta = delta;
      o.override_column = "messages.list.element.role";
      const std::string f = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(12), o);
      EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "column 'messages.list.element.role'");
    }
  }
}

TEST(ParquetBadFile, UnsupportedCodecsAndEncodings) {
  for (auto [codec, name] : {std::pair<int, const char*>{5, "LZ4"}, {4, "BROTLI"}, {3, "LZO"}, {7, "LZ4_RAW"}}) {
    PqWriteOptions o;
    o.codec = codec;
    const std::string f = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(4), o);
    EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "column 'prompt'", name, "not supported");
  }
  for (auto [enc, name] : {std::pair<int, const char*>{6, "DELTA_LENGTH_BYTE_ARRAY"}, {7, "DELTA_BYTE_ARRAY"}, {9, "BYTE_STREAM_SPLIT"}}) {
    PqWriteOptions o;
    o.value_encoding_override = enc;
    o.override_column = "messages.list.element.content";
    const std::string f = pq_write(pq_ultrachat_schema(), pq_ultrachat_rows(4), o);
    EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "mem.parquet", "column 'messages.list.element.content'", name, "not supported");
  }
  // INT96 (legacy timestamps).
  const std::string f = pq_write(pq_struct("schema", {pq_leaf("ts", 3)}, 0), {json{{"ts", nullptr}}});
  EXPECT_ERROR_CONTAINS([&] { read_mem(f); }, "column 'ts'", "INT96");
}

// Wraps a hand-built footer into a file.
std::string with_footer(const std::string& footer) {
  std::string f = "PAR1" + footer;
  uint32_t n = static_cast<uint32_t>(footer.size());
  f.append(reinterpret_cast<const char*>(&n), 4);
  return f + "PAR1";
}

TEST(ParquetBadFile, BadThriftMetadata) {
  // Random bytes as the footer.
  std::mt19937 rng(7);
  for (int t = 0; t < 200; ++t) {
    std::string junk(1 + rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(junk)); }, "mem.parquet");
  }
  // Field type mismatch: num_rows as a string.
  {
    ThriftWriter w;
    w.begin_struct();
    w.field_i32(1, 1);
    w.field_binary(3, "many");
    w.end_struct();
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(w.bytes())); }, "mem.parquet: footer", "FileMetaData.num_rows",
                          "has type binary");
  }
  // Huge list length.
  {
    ThriftWriter w;
    w.begin_struct();
    w.field_i32(1, 1);
    w.field_header(2, ThriftType::List);
    w.bytes().push_back(static_cast<char>(0xf0 | static_cast<int>(ThriftType::Struct)));
    w.raw_varint(uint64_t{1} << 40);
    w.end_struct();
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(w.bytes())); }, "FileMetaData.schema", "claims 1099511627776 elements");
  }
  // Huge string length.
  {
    ThriftWriter w;
    w.begin_struct();
    w.field_header(6, ThriftType::Binary);
    w.raw_varint(uint64_t{1} << 62);
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(w.bytes())); }, "runs past the end");
  }
  // Deeply nested unknown structs.
  {
    std::string deep;
    for (int i = 0; i < 5000; ++i) deep.push_back(static_cast<char>(0x1c));  // field delta 1, struct
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(deep)); }, "nested too deeply");
  }
  // Schema claiming more children than it has.
  {
    ThriftWriter w;
    w.begin_struct();
    w.field_i32(1, 1);
    w.field_list_begin(2, ThriftType::Struct, 1);
    w.list_struct_begin();
    w.field_binary(4, "schema");
    w.field_i32(5, 1000000);
    w.end_struct();
    w.field_i64(3, 0);
    w.field_list_begin(4, ThriftType::Struct, 0);
    w.end_struct();
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(w.bytes())); }, "schema", "claims 1000000 children");
  }
  // Metadata missing required fields.
  {
    ThriftWriter w;
    w.begin_struct();
    w.field_i32(1, 1);
    w.end_struct();
    EXPECT_ERROR_CONTAINS([&] { read_mem(with_footer(w.bytes())); }, "no schema");
  }
}

// ---- fuzzing ---------------------------------------------------------------------------------

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

// Mutates valid files and reads them: only qt::Error may come out (crashes and sanitizer reports
// show up as test failures). QT_PARQUET_FUZZ_ITERS / QT_PARQUET_FUZZ_SECONDS / QT_PARQUET_FUZZ_SEED
// make longer local runs.
TEST(ParquetFuzz, MutationLoopOnlyThrowsQtError) {
  std::vector<std::string> seeds;
  const std::vector<json> rows = pq_ultrachat_rows(10);
  for (int codec : {0, 1, 2, 6})
    for (int version : {1, 2}) {
      PqWriteOptions o;
      o.codec = codec;
      o.page_version = version;
      o.dictionary = (codec + version) % 2 == 0;
      o.rows_per_group = 4;
      o.values_per_page = 6;
      seeds.push_back(pq_write(pq_ultrachat_schema(), rows, o));
    }
  {
    PqWriteOptions o;
    o.dictionary = true;
    o.page_version = 2;
    o.values_per_page = 8;
    seeds.push_back(pq_write(types_schema(), types_rows(12), o));
    o.page_version = 1;
    o.dictionary = false;
    seeds.push_back(pq_write(types_schema(), types_rows(12), o));
  }
  const int64_t iters = env_int("QT_PARQUET_FUZZ_ITERS", 20000);
  const double seconds = static_cast<double>(env_int("QT_PARQUET_FUZZ_SECONDS", 10));
  std::mt19937_64 rng(static_cast<uint64_t>(env_int("QT_PARQUET_FUZZ_SEED", 12345)));
  const auto t0 = std::chrono::steady_clock::now();
  int64_t done = 0, errors = 0, ok = 0;
  for (; done < iters; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) break;
    std::string f = seeds[rng() % seeds.size()];
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut && !f.empty(); ++m) {
      // Half the mutations hit the footer, where a single byte changes the most structure.
      uint32_t flen = 0;
      std::memcpy(&flen, f.data() + (f.size() >= 8 ? f.size() - 8 : 0), f.size() >= 8 ? 4 : 0);
      size_t lo = 0;
      if (rng() % 2 && f.size() >= 12 && flen <= f.size() - 12) lo = f.size() - 8 - flen;
      size_t pos = lo + rng() % (f.size() - lo);
      switch (rng() % 8) {
        case 0: f[pos] = static_cast<char>(f[pos] ^ (1 << (rng() % 8))); break;
        case 1: f[pos] = static_cast<char>(rng()); break;
        case 2: {
          static const unsigned char special[] = {0x00, 0x01, 0x0f, 0x10, 0x7f, 0x80, 0xff, 0xfe, 0x19, 0x1c};
          f[pos] = static_cast<char>(special[rng() % sizeof special]);
          break;
        }
        case 3: f.resize(pos); break;
        case 4: f.erase(pos, 1 + rng() % 16); break;
        case 5: f.insert(pos, std::string(1 + rng() % 8, static_cast<char>(rng()))); break;
        case 6: {  // overwrite 4 bytes with a big little-endian number
          uint32_t v = static_cast<uint32_t>(rng()) | 0x40000000u;
          for (int k = 0; k < 4 && pos + static_cast<size_t>(k) < f.size(); ++k) f[pos + static_cast<size_t>(k)] = static_cast<char>(v >> (8 * k));
          break;
        }
        case 7: {  // copy a slice over another place
          size_t src = rng() % f.size();
          size_t len = std::min<size_t>({1 + rng() % 32, f.size() - src, f.size() - pos});
          std::string slice = f.substr(src, len);
          f.replace(pos, len, slice);
          break;
        }
      }
    }
    try {
      parquet_read_rows_from_memory(reinterpret_cast<const uint8_t*>(f.data()), f.size(), "fuzz.parquet",
                                    [](const json& row, int64_t) { (void)row.dump(-1, ' ', false, json::error_handler_t::replace); });
      ++ok;
    } catch (const qt::Error&) {
      ++errors;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << done << ": non-qt exception: " << e.what();
    }
  }
  std::printf("[ParquetFuzz] %lld mutations: %lld rejected with qt::Error, %lld read\n", static_cast<long long>(done),
              static_cast<long long>(errors), static_cast<long long>(ok));
  EXPECT_GT(done, 100);
}

}  // namespace
}  // namespace qt::testing

namespace qt::testing {
namespace {

TEST(ParquetReader, JsonTextKeepsBytesAndParsesBack) {
  json v = {{"s", std::string("q\"b\\n\nt\tc\x01\x1f end \xc3\xa9")}, {"n", nullptr}, {"i", -42}, {"d", 0.5},
            {"b", true}, {"a", json::array({1, "x", json::object()})}};
  std::string text;
  parquet_append_json_text(v, &text);
  EXPECT_EQ(json::parse(text), v);
  // Invalid UTF-8 is copied, not replaced or rejected.
  std::string bad;
  parquet_append_json_text(json(std::string("a\xff" "b")), &bad);
  EXPECT_EQ(bad, "\"a\xff" "b\"");
}

TEST(ParquetReader, ToJsonlOneRowPerLine) {
  ScratchDir dir("parquet-jsonl");
  const std::vector<json> rows = pq_ultrachat_rows(9);
  pq_write_file(dir.file("a.parquet"), pq_ultrachat_schema(), rows);
  const std::string text = parquet_to_jsonl(dir.file("a.parquet"));
  size_t pos = 0, line = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    ASSERT_LT(line, rows.size());
    EXPECT_EQ(json::parse(text.substr(pos, nl - pos)), rows[line]);
    pos = nl + 1;
    ++line;
  }
  EXPECT_EQ(line, rows.size());
}

}  // namespace
}  // namespace qt::testing

#include "data/readers.h"

namespace qt::testing {
namespace {

// The data pipeline reads a .parquet file (and directories holding one) into the same samples as
// its JSONL twin.
TEST(ParquetReader, DataPipelineReadsParquetLikeJsonl) {
  ScratchDir dir("parquet-pipeline");
  std::vector<json> rows = pq_ultrachat_rows(25);
  rows[3]["messages"] = json::array();  // a bad row (empty conversation) in both files
  PqWriteOptions o;
  o.codec = 1;
  o.dictionary = true;
  o.rows_per_group = 7;
  pq_write_file(dir.file("train.parquet"), pq_ultrachat_schema(), rows, o);
  {
    std::ofstream out(dir.file("train.jsonl"));
    for (const json& r : rows) out << r.dump() << "\n";
  }
  ReadOptions ro;
  ro.skip_bad_rows = true;
  ReadStats sp, sj;
  const std::vector<Sample> a = read_samples(dir.file("train.parquet"), ro, &sp);
  const std::vector<Sample> b = read_samples(dir.file("train.jsonl"), ro, &sj);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.size(), rows.size() - 1);
  EXPECT_EQ(sp.bad_rows, 1);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].line, b[i].line);  // parquet: 1-based row number
    ASSERT_EQ(a[i].messages.size(), b[i].messages.size());
    for (size_t k = 0; k < a[i].messages.size(); ++k) {
      EXPECT_EQ(a[i].messages[k].role, b[i].messages[k].role);
      EXPECT_EQ(a[i].messages[k].content, b[i].messages[k].content);
    }
  }
  EXPECT_EQ(list_data_files(dir.path()).size(), 2u);
}

}  // namespace
}  // namespace qt::testing
