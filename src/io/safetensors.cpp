#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"

namespace qt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int64_t checked_numel(const Shape& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    QT_CHECK(d >= 0, where, ": negative dimension");
    QT_CHECK(d == 0 || n <= INT64_MAX / d, where, ": shape overflows");
    n *= d;
  }
  return n;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto out = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  out->file_ = std::make_unique<MappedFile>(path);
  const uint8_t* base = out->file_->data();
  const size_t size = out->file_->size();
  QT_CHECK(size >= 8, path, ": truncated safetensors file (", size, " bytes, need at least 8 for the header length)");
  const uint64_t header_len = read_u64_le(base);
  QT_CHECK(header_len <= size - 8, path, ": header length ", header_len, " runs past the end of the file (",
           size, " bytes)");
  QT_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len, " exceeds the 100 MiB limit");
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(hdr, hdr + header_len);
  } catch (const json::exception& e) {
    QT_FAIL(path, ": malformed header JSON: ", e.what());
  }
  QT_CHECK(header.is_object(), path, ": header JSON is not an object");
  const uint8_t* data_region = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      QT_CHECK(v.is_object(), path, ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        QT_CHECK(m.value().is_string(), path, ": __metadata__ value for '", m.key(), "' is not a string");
        out->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    QT_CHECK(v.is_object(), where, ": entry is not an object");
    QT_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, ": missing or non-string 'dtype'");
    QT_CHECK(v.contains("shape") && v["shape"].is_array(), where, ": missing or non-array 'shape'");
    QT_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, where,
             ": 'data_offsets' must be [begin, end]");
    const std::string dt = v["dtype"].get<std::string>();
    auto dtype = dtype_from_name(dt);
    QT_CHECK(dtype.has_value(), where, ": unknown dtype '", dt, "'");
    Shape shape;
    for (const auto& d : v["shape"]) {
      QT_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
               ": shape entries must be non-negative integers");
      shape.push_back(d.get<int64_t>());
    }
    QT_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), where, ": rank ", shape.size(), " is above ", kMaxDims);
    for (const auto& o : v["data_offsets"])
      QT_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), where,
               ": data_offsets must be non-negative integers");
    const uint64_t begin = v["data_offsets"][0].get<uint64_t>(), end = v["data_offsets"][1].get<uint64_t>();
    QT_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end, "] are reversed");
    QT_CHECK(end <= data_size, where, ": data_offsets [", begin, ", ", end, "] run past the data region (",
             data_size, " bytes)");
    const uint64_t expect = static_cast<uint64_t>(checked_numel(shape, where)) * dtype_size(*dtype);
    QT_CHECK(end - begin == expect, where, ": shape ", shape_str(shape), " of ", dt, " needs ", expect,
             " bytes but data_offsets span ", end - begin);
    SafetensorsEntry e;
    e.name = name;
    e.dtype = *dtype;
    e.shape = shape;
    e.data = data_region + begin;
    e.nbytes = static_cast<size_t>(expect);
    e.file = path;
    spans.push_back({begin, end, out->tensors_.size()});
    out->tensors_.push_back(std::move(e));
  }
  // Offsets must tile the data region: no overlap, no gap, nothing left over (as the reference
  // implementation requires), so a corrupt header cannot alias two tensors.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Span& s : spans) {
    const auto& name = out->tensors_[s.index].name;
    QT_CHECK(s.begin >= cursor, path, ": tensor '", name, "' data_offsets [", s.begin, ", ", s.end,
             "] overlap the previous tensor (which ends at ", cursor, ")");
    QT_CHECK(s.begin == cursor, path, ": gap in the data region before tensor '", name, "' (bytes ", cursor, "..",
             s.begin, " belong to no tensor)");
    cursor = s.end;
  }
  QT_CHECK(cursor == data_size, path, ": data region has ", data_size - cursor,
           " trailing bytes that belong to no tensor (truncated header or corrupt file)");
  // Keep file order = offset order, which is how writers lay tensors out.
  std::vector<SafetensorsEntry> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(out->tensors_[s.index]));
  out->tensors_ = std::move(ordered);
  for (size_t i = 0; i < out->tensors_.size(); ++i) out->index_[out->tensors_[i].name] = i;
  return out;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- writer ------------------------------------------------------------------------------------

namespace {

void write_one_file(const std::string& path, const std::vector<const TensorWriteSpec*>& specs,
                    const SafetensorsWriteOptions& options) {
  ordered_json header = ordered_json::object();
  if (!options.metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : options.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::vector<uint64_t> offsets;
  uint64_t cursor = 0;
  for (const TensorWriteSpec* s : specs) {
    const uint64_t nbytes = static_cast<uint64_t>(shape_numel(s->shape)) * dtype_size(s->dtype);
    header[s->name] = {{"dtype", dtype_name(s->dtype)}, {"shape", s->shape}, {"data_offsets", {cursor, cursor + nbytes}}};
    offsets.push_back(cursor);
    cursor += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data region to 8 bytes
  const uint64_t total = 8 + text.size() + cursor;

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  QT_CHECK(fd >= 0, tmp, ": cannot create: ", std::strerror(errno));
  // Reserve every block before mapping: a store through a map into a hole that the disk cannot
  // back raises SIGBUS, while posix_fallocate fails cleanly with ENOSPC.
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); rc != 0) {
    ::close(fd);
    std::remove(tmp.c_str());
    if (rc == ENOSPC || rc == EDQUOT) {
      struct statvfs vfs {};
      const uint64_t avail = ::statvfs(fs::path(path).parent_path().c_str(), &vfs) == 0
                                 ? static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize
                                 : 0;
      QT_FAIL(path, ": no space left on device: the file needs ", total, " bytes, ", avail, " are free");
    }
    QT_FAIL(tmp, ": cannot reserve ", total, " bytes: ", std::strerror(rc));
  }
  void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  QT_CHECK(map != MAP_FAILED, tmp, ": mmap for writing failed: ", std::strerror(err));
  uint8_t* base = static_cast<uint8_t*>(map);
  uint64_t hl = text.size();
  for (int i = 0; i < 8; ++i) base[i] = static_cast<uint8_t>(hl >> (8 * i));
  std::memcpy(base + 8, text.data(), text.size());
  uint8_t* data = base + 8 + text.size();
  auto fill = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TensorWriteSpec* s = specs[static_cast<size_t>(i)];
      const size_t nbytes = static_cast<size_t>(shape_numel(s->shape)) * dtype_size(s->dtype);
      s->fill(data + offsets[static_cast<size_t>(i)], nbytes);
    }
  };
  try {
    if (options.parallel_fill)
      parallel_for(static_cast<int64_t>(specs.size()), fill);
    else
      fill(0, static_cast<int64_t>(specs.size()));
  } catch (...) {
    ::munmap(map, total);
    std::remove(tmp.c_str());
    throw;
  }
  int sync_rc = ::msync(map, total, MS_SYNC);
  const int sync_err = errno;
  ::munmap(map, total);
  if (sync_rc != 0) std::remove(tmp.c_str());
  QT_CHECK(sync_rc == 0, tmp, ": flushing to disk failed: ", std::strerror(sync_err));
  QT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename failed: ", std::strerror(errno));
}

}  // namespace

std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<TensorWriteSpec>& tensors,
                                           const SafetensorsWriteOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  QT_CHECK(!ec, dir, ": cannot create directory: ", ec.message());
  std::map<std::string, int> seen;
  for (const auto& t : tensors) QT_CHECK(seen[t.name]++ == 0, "write_safetensors: duplicate tensor name '", t.name, "'");

  // Greedy sharding in the given order: a tensor starts a new shard when it would overflow the
  // current one (a single oversized tensor gets a shard of its own).
  std::vector<std::vector<const TensorWriteSpec*>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& t : tensors) {
    const uint64_t nb = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (!shards.back().empty() && shard_bytes + nb > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += nb;
    total_bytes += nb;
  }
  std::vector<std::string> names;
  if (shards.size() == 1) {
    names.push_back(options.base_name + ".safetensors");
  } else {
    for (size_t i = 0; i < shards.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      names.push_back(options.base_name + buf);
    }
  }
  for (size_t i = 0; i < shards.size(); ++i) write_one_file((fs::path(dir) / names[i]).string(), shards[i], options);
  const std::string index_path = (fs::path(dir) / (options.base_name + ".safetensors.index.json")).string();
  if (shards.size() > 1) {
    ordered_json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", ordered_json::object()}};
    for (size_t i = 0; i < shards.size(); ++i)
      for (const TensorWriteSpec* s : shards[i]) index["weight_map"][s->name] = names[i];
    write_text_file(index_path, index.dump(2) + "\n");
    names.push_back(options.base_name + ".safetensors.index.json");
  } else {
    fs::remove(index_path, ec);  // a stale index from an earlier sharded save would shadow the new file
  }
  return names;
}

// ---- multi-file store --------------------------------------------------------------------------

TensorStore TensorStore::open_dir(const std::string& dir) {
  TensorStore store;
  store.dir_ = dir;
  QT_CHECK(fs::is_directory(dir), dir, ": not a directory");
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> weight_map;  // tensor -> file, when an index exists
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    json index;
    try {
      index = json::parse(read_text_file(index_path.string()));
    } catch (const json::exception& e) {
      QT_FAIL(index_path.string(), ": malformed JSON: ", e.what());
    }
    QT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path.string(),
             ": missing 'weight_map' object");
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      QT_CHECK(it.value().is_string(), index_path.string(), ": weight_map entry '", it.key(), "' is not a file name");
      weight_map[it.key()] = it.value().get<std::string>();
      if (std::find(files.begin(), files.end(), it.value().get<std::string>()) == files.end())
        files.push_back(it.value().get<std::string>());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::exists(single_path)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& de : fs::directory_iterator(dir))
      if (de.path().extension() == ".safetensors") files.push_back(de.path().filename().string());
    std::sort(files.begin(), files.end());
  }
  QT_CHECK(!files.empty(), dir, ": no safetensors files (expected model.safetensors or model.safetensors.index.json)");
  for (const auto& f : files) {
    const fs::path p = fs::path(dir) / f;
    QT_CHECK(fs::exists(p), p.string(), ": shard listed in the index does not exist");
    store.files_.push_back(SafetensorsFile::open(p.string()));
  }
  for (const auto& file : store.files_) {
    for (const auto& e : file->tensors()) {
      auto [it, inserted] = store.by_name_.emplace(e.name, &e);
      QT_CHECK(inserted, "tensor '", e.name, "' appears in two shards: ", it->second->file, " and ", e.file);
      store.order_.push_back(&e);
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = store.by_name_.find(name);
    QT_CHECK(it != store.by_name_.end(), index_path.string(), ": tensor '", name, "' is listed in ", file,
             " but that shard does not contain it");
    QT_CHECK(fs::path(it->second->file).filename() == file, index_path.string(), ": tensor '", name,
             "' is listed in ", file, " but found in ", it->second->file);
  }
  return store;
}

const SafetensorsEntry* TensorStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const SafetensorsEntry& TensorStore::get(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  QT_CHECK(e != nullptr, dir_, ": missing tensor '", name, "'");
  return *e;
}

}  // namespace qt
