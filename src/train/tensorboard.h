// TensorBoard scalar event files (events.out.tfevents.*), written directly: TFRecord framing
// (length, masked CRC32C of the length, the Event protobuf, masked CRC32C of the data) around
// hand-encoded Event{wall_time, step, summary{value{tag, simple_value}}} messages.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace qt {

class TensorBoardWriter {
 public:
  // Creates DIR (if needed) and DIR/events.out.tfevents.<unix time>.<host>.<pid>.<n>.qwentune, a
  // name no other writer has (created exclusively).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Removes the event files qwentune wrote in DIR (a resumed run writes its history again, so that
// TensorBoard shows each step once). Returns the paths removed.
std::vector<std::string> tensorboard_remove_event_files(const std::string& dir);

struct TensorBoardScalar {
  std::string tag;
  double value = 0;
  int64_t step = 0;
};
// Every scalar of an event file, in file order (for tests and tools).
std::vector<TensorBoardScalar> tensorboard_read_scalars(const std::string& path);

// CRC32C (Castagnoli) and TFRecord's masking, exposed for the tests.
uint32_t crc32c(const void* data, size_t n);
uint32_t tfrecord_mask(uint32_t crc);

}  // namespace qt
