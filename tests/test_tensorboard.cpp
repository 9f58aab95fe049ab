// TensorBoard event files: CRC32C known answer, TFRecord framing and the scalar protobufs read back.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "test_util.h"
#include "train/tensorboard.h"

namespace qt {
namespace {

uint64_t varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s.at(i++));
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

TEST(TensorBoard, Crc32cKnownAnswer) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C check value
}

TEST(TensorBoard, ScalarsReadBack) {
  testing::ScratchDir dir("tb");
  std::string path;
  {
    TensorBoardWriter w(dir.path() + "/tb");
    w.scalar("train/loss", 2.5, 1);
    w.scalar("train/lr", 1e-3, 2);
    path = w.path();
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<int64_t> steps;
  int records = 0;
  while (pos < bytes.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    ASSERT_EQ(len_crc, tfrecord_mask(crc32c(&len, 8)));
    const std::string data = bytes.substr(pos + 12, len);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    ASSERT_EQ(data_crc, tfrecord_mask(crc32c(data.data(), data.size())));
    pos += 16 + len;
    ++records;
    // Event: 1 wall_time (fixed64), 2 step (varint), 3 file_version, 5 summary.
    size_t i = 0;
    int64_t step = -1;
    while (i < data.size()) {
      const uint64_t key = varint(data, i);
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (wire == 1) {
        i += 8;
      } else if (wire == 0) {
        const uint64_t v = varint(data, i);
        if (field == 2) step = static_cast<int64_t>(v);
      } else if (wire == 2) {
        const uint64_t n = varint(data, i);
        const std::string sub = data.substr(i, n);
        i += n;
        if (field == 5) {  // Summary{1: Value{1: tag, 2: simple_value}}
          size_t j = 0;
          varint(sub, j);
          const uint64_t vlen = varint(sub, j);
          const std::string value = sub.substr(j, vlen);
          size_t k = 0;
          varint(value, k);
          const uint64_t tlen = varint(value, k);
          const std::string tag = value.substr(k, tlen);
          k += tlen;
          EXPECT_EQ(varint(value, k), (2u << 3) | 5u);
          float f;
          std::memcpy(&f, value.data() + k, 4);
          scalars.emplace_back(tag, f);
          steps.push_back(step);
        }
      } else {
        FAIL() << "unexpected wire type " << wire;
      }
    }
  }
  EXPECT_EQ(records, 3);  // file_version + 2 scalars
  ASSERT_EQ(scalars.size(), 2u);
  EXPECT_EQ(scalars[0].first, "train/loss");
  EXPECT_FLOAT_EQ(scalars[0].second, 2.5f);
  EXPECT_EQ(scalars[1].first, "train/lr");
  EXPECT_FLOAT_EQ(scalars[1].second, 1e-3f);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace qt
