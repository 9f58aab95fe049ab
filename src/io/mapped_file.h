// Read-only memory map of a whole file (zero-copy tensor views point into it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace qt {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whole file as a string, with a clear error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
// Write atomically: to PATH.tmp, then rename over PATH.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace qt
