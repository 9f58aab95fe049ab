#include "train/tensorboard.h"

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace qt {
namespace {

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 is little-endian, as protobuf's fixed types are
  s.append(b, sizeof(T));
}

void put_bytes_field(std::string& s, int field, const std::string& bytes) {
  put_varint(s, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(s, bytes.size());
  s += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event(double wall_time, int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  put_varint(e, (1 << 3) | 1);  // wall_time: double
  put_fixed(e, wall_time);
  put_varint(e, 2 << 3);  // step: int64 varint
  put_varint(e, static_cast<uint64_t>(step));
  if (file_version) put_bytes_field(e, 3, *file_version);
  if (summary) put_bytes_field(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  QT_CHECK(!ec, dir, ": cannot create: ", ec.message());
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + ".qwentune"))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  QT_CHECK(f_ != nullptr, path_, ": cannot create");
  const std::string version = "brain.Event:2";
  write_record(event(now_seconds(), 0, &version, nullptr));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  const uint64_t len = data.size();
  put_fixed(rec, len);
  put_fixed(rec, tfrecord_mask(crc32c(&len, 8)));
  rec += data;
  put_fixed(rec, tfrecord_mask(crc32c(data.data(), data.size())));
  QT_CHECK(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size(), path_, ": write failed");
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, (2 << 3) | 5);  // simple_value: float (fixed32)
  put_fixed(v, static_cast<float>(value));
  std::string summary;
  put_bytes_field(summary, 1, v);
  write_record(event(now_seconds(), step, nullptr, &summary));
}

void TensorBoardWriter::flush() { std::fflush(f_); }

}  // namespace qt
