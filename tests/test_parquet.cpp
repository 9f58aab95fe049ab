// Parquet files written by pyarrow (tools/make_parquet_fixtures.py) must read back as exactly the
// rows of their JSONL twins. The fixture directory is required: a missing one FAILS unless
// QT_ALLOW_MISSING_TESTDATA=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/parquet.h"
#include "test_util.h"

namespace qt::testing {
namespace {

using json = nlohmann::json;

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

std::string fixture_dir() { return testdata_dir() + "/parquet"; }

bool missing_fixtures_allowed() {
  const char* allow = std::getenv("QT_ALLOW_MISSING_TESTDATA");
  return allow != nullptr && std::string(allow) == "1";
}

#define REQUIRE_FIXTURES()                                                                                       \
  do {                                                                                                           \
    if (!std::filesystem::exists(fixture_dir() + "/manifest.json")) {                                            \
      if (missing_fixtures_allowed()) GTEST_SKIP() << fixture_dir() << " missing (QT_ALLOW_MISSING_TESTDATA=1)";  \
      FAIL() << fixture_dir() << "/manifest.json is missing: run `python3 tools/make_parquet_fixtures.py` where " \
             << "pyarrow is installed and commit tests/testdata/parquet (or set QT_ALLOW_MISSING_TESTDATA=1)";  \
    }                                                                                                            \
  } while (0)

TEST(ParquetFixtures, EveryVariantMatchesItsJsonl) {
  REQUIRE_FIXTURES();
  const json manifest = json::parse(std::ifstream(fixture_dir() + "/manifest.json"));
  ASSERT_TRUE(manifest.contains("variants")) << manifest.dump();
  ASSERT_GE(manifest["variants"].size(), 5u);
  for (const json& v : manifest["variants"]) {
    const std::string path = fixture_dir() + "/" + v["parquet"].get<std::string>();
    SCOPED_TRACE(path);
    const std::vector<json> want = read_jsonl(fixture_dir() + "/" + v["jsonl"].get<std::string>());
    ASSERT_FALSE(want.empty());
    std::vector<json> got;
    parquet_read_rows(path, [&](const json& row, int64_t i) {
      EXPECT_EQ(i, static_cast<int64_t>(got.size()));
      got.push_back(row);
    });
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "row " << i << "\n got: " << got[i].dump().substr(0, 300)
                                 << "\nwant: " << want[i].dump().substr(0, 300);
    if (v.contains("row_groups") && !std::filesystem::is_directory(path)) {
      EXPECT_EQ(parquet_file_info(path).num_row_groups, v["row_groups"].get<int64_t>());
    }
  }
}

TEST(ParquetFixtures, UnsupportedFilesGiveClearErrors) {
  REQUIRE_FIXTURES();
  const json manifest = json::parse(std::ifstream(fixture_dir() + "/manifest.json"));
  if (!manifest.contains("unsupported")) return;
  for (const json& u : manifest["unsupported"]) {
    const std::string path = fixture_dir() + "/" + u["parquet"].get<std::string>();
    const std::string feature = u["error"].get<std::string>();
    EXPECT_ERROR_CONTAINS([&] { parquet_read_rows(path, [](const json&, int64_t) {}); }, path.c_str(), feature.c_str(),
                          "not supported");
  }
}

TEST(ParquetFixtures, ExpectedVariantsPresent) {
  REQUIRE_FIXTURES();
  for (const char* name : {"snappy_dict.parquet", "zstd_v2_rg7.parquet", "gzip_plain.parquet", "nulls.parquet",
                           "uncompressed.parquet", "ultrachat.jsonl", "nulls.jsonl"})
    EXPECT_TRUE(std::filesystem::exists(fixture_dir() + "/" + name)) << name;
  EXPECT_GE(parquet_file_info(fixture_dir() + "/zstd_v2_rg7.parquet").num_row_groups, 5);
}

TEST(ParquetFixtures, ProjectionMessagesOnly) {
  REQUIRE_FIXTURES();
  const std::vector<json> want = read_jsonl(fixture_dir() + "/ultrachat.jsonl");
  ParquetReadOptions opt;
  opt.columns = {"messages"};
  size_t n = 0;
  parquet_read_rows(fixture_dir() + "/snappy_dict.parquet", [&](const json& row, int64_t i) {
    ASSERT_LT(static_cast<size_t>(i), want.size());
    EXPECT_EQ(row, json({{"messages", want[static_cast<size_t>(i)]["messages"]}}));
    ++n;
  }, opt);
  EXPECT_EQ(n, want.size());
}

}  // namespace
}  // namespace qt::testing
