// safetensors round trips and every malformed-file case the reader must reject with a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "core/bf16.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace qt {
namespace {

using testing::ScratchDir;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Owned {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

std::vector<TensorWriteSpec> specs_of(const std::vector<Owned>& ts) {
  std::vector<TensorWriteSpec> out;
  for (const auto& t : ts)
    out.push_back({t.name, t.dtype, t.shape, [&t](void* dst, size_t n) {
                     ASSERT_EQ(n, t.bytes.size());
                     std::memcpy(dst, t.bytes.data(), n);
                   }});
  return out;
}

std::vector<Owned> sample_tensors() {
  std::vector<Owned> ts;
  // bf16 from random floats (including negative zero, inf and NaN payloads via raw bytes).
  Owned a{"model.embed_tokens.weight", DType::BF16, {37, 13}, {}};
  std::vector<float> f(37 * 13);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (auto& x : f) x = nd(rng);
  f[0] = -0.0f;
  f[1] = INFINITY;
  a.bytes.resize(f.size() * 2);
  for (size_t i = 0; i < f.size(); ++i) {
    bf16 b = float_to_bf16(f[i]);
    std::memcpy(&a.bytes[i * 2], &b, 2);
  }
  ts.push_back(a);
  ts.push_back({"model.norm.weight", DType::F32, {13}, random_bytes(13 * 4, 2)});
  ts.push_back({"scalar", DType::F32, {}, random_bytes(4, 3)});
  ts.push_back({"empty", DType::F32, {0, 5}, {}});
  ts.push_back({"model.visual.blocks.0.attn.qkv.bias", DType::F16, {7}, random_bytes(14, 4)});
  ts.push_back({"mtp.fc.weight", DType::BF16, {3, 5, 2}, random_bytes(60, 5)});
  ts.push_back({"ids", DType::I64, {4}, random_bytes(32, 6)});
  ts.push_back({"mask", DType::U8, {9}, random_bytes(9, 7)});
  return ts;
}

void expect_same(const SafetensorsEntry& e, const Owned& t) {
  EXPECT_EQ(e.dtype, t.dtype) << t.name;
  EXPECT_EQ(e.shape, t.shape) << t.name;
  ASSERT_EQ(e.nbytes, t.bytes.size()) << t.name;
  EXPECT_EQ(std::memcmp(e.data, t.bytes.data(), e.nbytes), 0) << t.name << " bytes differ";
}

TEST(Safetensors, SingleFileRoundTripIsBitExact) {
  ScratchDir dir("st-single");
  auto ts = sample_tensors();
  SafetensorsWriteOptions opt;
  opt.metadata["note"] = "qwentune test";
  auto names = write_safetensors(dir.path(), specs_of(ts), opt);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0], "model.safetensors");
  auto f = SafetensorsFile::open(dir.file("model.safetensors"));
  ASSERT_EQ(f->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const SafetensorsEntry* e = f->find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    expect_same(*e, t);
  }
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "qwentune test");
  // File order follows the write order.
  EXPECT_EQ(f->tensors()[0].name, "model.embed_tokens.weight");
}

TEST(Safetensors, ShardedRoundTripWritesIndex) {
  ScratchDir dir("st-sharded");
  auto ts = sample_tensors();
  SafetensorsWriteOptions opt;
  opt.max_shard_bytes = 600;  // forces shards; the 962-byte tensor gets one alone
  auto names = write_safetensors(dir.path(), specs_of(ts), opt);
  ASSERT_EQ(names.size(), 3u);  // two shards + index
  EXPECT_EQ(names.back(), "model.safetensors.index.json");
  EXPECT_EQ(names[0], "model-00001-of-0000" + std::to_string(names.size() - 1) + ".safetensors");
  auto store = TensorStore::open_dir(dir.path());
  EXPECT_EQ(store.num_files(), names.size() - 1);
  ASSERT_EQ(store.tensors().size(), ts.size());
  for (const auto& t : ts) expect_same(store.get(t.name), t);
  // Rewriting as one file removes the stale index so the loader sees the new file only.
  write_safetensors(dir.path(), specs_of(ts));
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
}

TEST(Safetensors, HeaderIsAlignedAndReadableByTheSpec) {
  ScratchDir dir("st-align");
  auto ts = sample_tensors();
  write_safetensors(dir.path(), specs_of(ts));
  std::ifstream in(dir.file("model.safetensors"), std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_EQ(header.front(), '{');
}

// ---- malformed files -----------------------------------------------------------------------------

void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t len_override = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  std::string data(data_bytes, '\x11');
  out << data;
}

TEST(SafetensorsBadInput, TruncatedFile) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "truncated");
}

TEST(SafetensorsBadInput, HeaderLengthPastEnd) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, "{}", 0, 4096);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "header length 4096", "past the end");
}

TEST(SafetensorsBadInput, MalformedHeaderJson) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, "{\"a\": {\"dtype\": \"F32\",", 0);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "malformed header JSON");
}

TEST(SafetensorsBadInput, OverlappingOffsets) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "'b'", "overlap");
}

TEST(SafetensorsBadInput, OutOfRangeOffsets) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "'a'", "past the data region");
}

TEST(SafetensorsBadInput, GapAndTrailingBytes) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "gap");
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "trailing bytes");
}

TEST(SafetensorsBadInput, UnknownDtype) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "'a'", "unknown dtype 'F12'");
}

TEST(SafetensorsBadInput, ShapeByteCountMismatch) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})", 8);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "t.safetensors", "'w'", "needs 12 bytes", "span 8");
}

TEST(SafetensorsBadInput, BadFieldTypes) {
  ScratchDir dir("st-bad");
  const std::string p = dir.file("t.safetensors");
  write_raw(p, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "'w'", "non-negative");
  write_raw(p, R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "'w'", "data_offsets");
  write_raw(p, R"([1,2,3])", 0);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "not an object");
  write_raw(p, R"({"__metadata__":{"format":3}})", 0);
  EXPECT_ERROR_CONTAINS([&] { SafetensorsFile::open(p); }, "__metadata__");
}

TEST(SafetensorsBadInput, MissingTensorInStore) {
  ScratchDir dir("st-bad");
  auto ts = sample_tensors();
  write_safetensors(dir.path(), specs_of(ts));
  auto store = TensorStore::open_dir(dir.path());
  EXPECT_ERROR_CONTAINS([&] { store.get("model.layers.0.mlp.up_proj.weight"); }, "missing tensor",
                        "model.layers.0.mlp.up_proj.weight");
}

TEST(SafetensorsBadInput, DuplicateTensorAcrossShards) {
  ScratchDir dir("st-bad");
  std::vector<Owned> a = {{"x", DType::F32, {2}, random_bytes(8, 1)}};
  SafetensorsWriteOptions o1;
  o1.base_name = "part-a";
  write_safetensors(dir.path(), specs_of(a), o1);
  o1.base_name = "part-b";
  write_safetensors(dir.path(), specs_of(a), o1);
  EXPECT_ERROR_CONTAINS([&] { TensorStore::open_dir(dir.path()); }, "'x'", "two shards", "part-a.safetensors",
                        "part-b.safetensors");
}

TEST(SafetensorsBadInput, IndexNamesMissingShardOrTensor) {
  ScratchDir dir("st-bad");
  auto ts = sample_tensors();
  SafetensorsWriteOptions opt;
  opt.max_shard_bytes = 600;
  const auto names = write_safetensors(dir.path(), specs_of(ts), opt);
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata":{},"weight_map":{"ghost":"model-00009-of-00009.safetensors"}})";
  EXPECT_ERROR_CONTAINS([&] { TensorStore::open_dir(dir.path()); }, "model-00009-of-00009.safetensors", "does not exist");
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata":{},"weight_map":{"ghost":")" << names[0] << R"("}})";
  EXPECT_ERROR_CONTAINS([&] { TensorStore::open_dir(dir.path()); }, "'ghost'", "does not contain it");
}

TEST(Bf16, RoundToNearestEvenAndNaN) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.01171875f)), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

}  // namespace
}  // namespace qt
