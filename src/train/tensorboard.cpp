#include "train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
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
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  const std::string stem = "events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host +
                           "." + std::to_string(::getpid());
  // O_EXCL with a counter: two writers (runs started in the same second) never share a file.
  for (int n = 0; f_ == nullptr; ++n) {
    path_ = (std::filesystem::path(dir) / (stem + "." + std::to_string(n) + ".qwentune")).string();
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      QT_CHECK(errno == EEXIST && n < 1000, path_, ": cannot create: ", std::strerror(errno));
      continue;
    }
    f_ = ::fdopen(fd, "wb");
    QT_CHECK(f_ != nullptr, path_, ": cannot open: ", std::strerror(errno));
  }
  const std::string version = "brain.Event:2";
  write_record(event(now_seconds(), 0, &version, nullptr));
}

std::vector<std::string> tensorboard_remove_event_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return removed;
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = de.path().filename().string();
    const std::string suffix = ".qwentune";
    if (n.rfind("events.out.tfevents.", 0) == 0 && n.size() > suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      std::filesystem::remove(de.path(), ec);
      removed.push_back(de.path().string());
    }
  }
  return removed;
}

std::vector<TensorBoardScalar> tensorboard_read_scalars(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  QT_CHECK(f != nullptr, path, ": cannot open");
  std::string bytes;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.append(buf, n);
  std::fclose(f);
  auto varint = [](const std::string& s, size_t& i) {
    uint64_t v = 0;
    for (int shift = 0; i < s.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(s[i++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  std::vector<TensorBoardScalar> out;
  for (size_t pos = 0; pos + 16 <= bytes.size();) {
    uint64_t len;
    std::memcpy(&len, bytes.data() + pos, 8);
    QT_CHECK(pos + 16 + len <= bytes.size(), path, ": truncated record at byte ", pos);
    const std::string data = bytes.substr(pos + 12, len);
    pos += 16 + len;
    int64_t step = 0;
    std::string summary;
    for (size_t i = 0; i < data.size();) {
      const uint64_t key = varint(data, i);
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (wire == 1) i += 8;
      else if (wire == 5) i += 4;
      else if (wire == 0) {
        const uint64_t v = varint(data, i);
        if (field == 2) step = static_cast<int64_t>(v);
      } else if (wire == 2) {
        const uint64_t n = varint(data, i);
        if (field == 5) summary = data.substr(i, n);
        i += n;
      } else break;
    }
    // Summary{1: Value{1: tag, 2: simple_value}}
    for (size_t j = 0; j < summary.size();) {
      const uint64_t key = varint(summary, j);
      const uint64_t n = varint(summary, j);
      if ((key >> 3) != 1) { j += n; continue; }
      const std::string value = summary.substr(j, n);
      j += n;
      TensorBoardScalar sc;
      sc.step = step;
      for (size_t k = 0; k < value.size();) {
        const uint64_t vk = varint(value, k);
        if ((vk & 7) == 2) {
          const uint64_t tl = varint(value, k);
          if ((vk >> 3) == 1) sc.tag = value.substr(k, tl);
          k += tl;
        } else if ((vk & 7) == 5) {
          float x;
          std::memcpy(&x, value.data() + k, 4);
          sc.value = x;
          k += 4;
        } else break;
      }
      out.push_back(sc);
    }
  }
  return out;
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
