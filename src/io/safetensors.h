// safetensors: reader (mmap, zero-copy views, every header field validated) and a sharded writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data region; offsets are relative to the data region and must tile it exactly.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace qt {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path of the file that holds it, for messages

  // A CPU view over the mapped bytes. The view is read-only in spirit: the mapping is private.
  Tensor view() const { return Tensor(const_cast<uint8_t*>(data), dtype, shape); }
};

class SafetensorsFile {
 public:
  // Opens and validates; throws qt::Error naming the file and the problem.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::unique_ptr<MappedFile> file_;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes come from fill(dst), called once with nbytes of destination.
struct TensorWriteSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::function<void(void* dst, size_t nbytes)> fill;
};

struct SafetensorsWriteOptions {
  size_t max_shard_bytes = size_t{5} << 30;  // HF's customary 5 GiB shards
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::string base_name = "model";           // model.safetensors / model-0000i-of-0000n.safetensors
  bool parallel_fill = true;                 // call fill() for several tensors at once
};

// Writes DIR/model.safetensors, or shards plus DIR/model.safetensors.index.json when the tensors
// exceed max_shard_bytes. Each file is written to a temporary name and renamed when complete.
// Returns the file names written (relative to dir).
std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<TensorWriteSpec>& tensors,
                                           const SafetensorsWriteOptions& options = {});

// Every tensor of a model directory across its shards (single file, index.json, or *.safetensors).
class TensorStore {
 public:
  static TensorStore open_dir(const std::string& dir);

  const SafetensorsEntry* find(const std::string& name) const;
  const SafetensorsEntry& get(const std::string& name) const;  // throws "missing tensor NAME in DIR"
  const std::vector<const SafetensorsEntry*>& tensors() const { return order_; }
  const std::string& dir() const { return dir_; }
  size_t num_files() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<const SafetensorsEntry*> order_;
  std::map<std::string, const SafetensorsEntry*> by_name_;
};

}  // namespace qt
