#include "model/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/hub_cache.h"
#include "io/mapped_file.h"

namespace qt {
namespace fs = std::filesystem;

std::vector<const SafetensorsEntry*> HfModelDir::passthrough_tensors() const {
  std::set<std::string> used;
  for (const auto& p : params) used.insert(p.name);
  std::vector<const SafetensorsEntry*> out;
  for (const SafetensorsEntry* e : store.tensors())
    if (!used.count(e->name) && !(config.tie_word_embeddings && e->name == lm_head_name())) out.push_back(e);
  return out;
}

HfModelDir hf_load(const std::string& path_or_id) {
  const std::string dir = resolve_model_dir(path_or_id);
  HfModelDir m;
  m.dir = dir;
  const fs::path cfg_path = fs::path(dir) / "config.json";
  QT_CHECK(fs::is_directory(dir), dir, ": model directory does not exist");
  QT_CHECK(fs::exists(cfg_path), cfg_path.string(), ": missing (a Hugging Face model directory needs config.json)");
  m.config = config_load(cfg_path.string());
  m.store = TensorStore::open_dir(dir);
  m.params = param_table(m.config);
  for (const auto& p : m.params) {
    const SafetensorsEntry* e = m.store.find(p.name);
    if (e == nullptr && p.role == ParamRole::LmHead)
      QT_FAIL(dir, ": missing tensor '", p.name, "' (config.json says tie_word_embeddings=false)");
    QT_CHECK(e != nullptr, dir, ": missing tensor '", p.name, "'");
    QT_CHECK(e->shape == p.shape, e->file, ": tensor '", p.name, "' has shape ", shape_str(e->shape),
             " but config.json implies ", shape_str(p.shape));
    QT_CHECK(e->dtype == DType::F32 || e->dtype == DType::BF16 || e->dtype == DType::F16 || e->dtype == DType::F64,
             e->file, ": tensor '", p.name, "' has dtype ", dtype_name(e->dtype), ", expected a floating-point type");
  }
  const SafetensorsEntry* head = m.store.find(lm_head_name());
  m.lm_head_stored = head != nullptr;
  if (head != nullptr && m.config.tie_word_embeddings) {
    const Shape want = {m.config.vocab_size, m.config.hidden_size};
    QT_CHECK(head->shape == want, head->file, ": tensor 'lm_head.weight' has shape ", shape_str(head->shape),
             " but the tied embedding is ", shape_str(want));
  }
  return m;
}

TensorWriteSpec passthrough_spec(const SafetensorsEntry& e) {
  const SafetensorsEntry* src = &e;
  return TensorWriteSpec{e.name, e.dtype, e.shape, [src](void* dst, size_t nbytes) {
                           QT_CHECK(nbytes == src->nbytes, "passthrough size mismatch for ", src->name);
                           std::memcpy(dst, src->data, nbytes);
                         }};
}

bool hf_is_saved_file_name(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name == "config.json" || name == "adapter_config.json" || name == "trainer_state.json" ||
         name == ".qwentune-complete" ||
         ends_with(".safetensors") || ends_with(".safetensors.index.json");
}

namespace {

// Weight files of other formats: never carried from a source directory (they would describe the
// source's weights, not the saved ones).
bool is_foreign_weight_file(const std::string& name) {
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx"}) {
    const std::string e(ext);
    if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

// NAME.tmp-PID / NAME.old-PID -> (NAME, kind), for the save's own scratch directories.
bool parse_scratch_name(const std::string& n, std::string& base, std::string& kind) {
  for (const char* k : {".tmp-", ".old-"}) {
    const size_t at = n.rfind(k);
    if (at == std::string::npos || at == 0) continue;
    const std::string pid = n.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    base = n.substr(0, at);
    kind = std::string(k).substr(1, 3);
    return true;
  }
  return false;
}

// Moves the entries of `from` that `to` does not have and a save does not write into `to`.
void move_user_files(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(from, ec)) {
    const std::string n = de.path().filename().string();
    if (hf_is_saved_file_name(n) || fs::exists(to / n)) continue;
    fs::rename(de.path(), to / n, ec);
    QT_CHECK(!ec, (to / n).string(), ": cannot keep the existing file: ", ec.message());
  }
}

}  // namespace

std::vector<std::string> hf_recover_interrupted_saves(const std::string& parent) {
  std::vector<std::string> done;
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return done;
  std::vector<fs::path> entries;
  for (const auto& de : fs::directory_iterator(parent, ec))
    if (de.is_directory(ec)) entries.push_back(de.path());
  for (const fs::path& p : entries) {
    std::string base, kind;
    if (!parse_scratch_name(p.filename().string(), base, kind)) continue;
    const fs::path target = p.parent_path() / base;
    if (kind == "tmp") {
      fs::remove_all(p, ec);
      done.push_back("removed the incomplete save " + p.string());
    } else if (!fs::exists(target)) {
      fs::rename(p, target, ec);
      QT_CHECK(!ec, p.string(), ": cannot move the previous directory back to ", target.string(), ": ", ec.message());
      done.push_back("restored " + target.string() + " from " + p.string());
    } else {
      move_user_files(p, target);
      fs::remove_all(p, ec);
      done.push_back("finished the save of " + target.string() + " (removed " + p.string() + ")");
    }
  }
  return done;
}

void hf_save(const std::string& dir, const nlohmann::json& config_json, const std::vector<TensorWriteSpec>& tensors,
             const HfSaveOptions& options) {
  QT_CHECK(!dir.empty(), "hf_save: empty output directory");
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  QT_CHECK(target.has_relative_path(), dir, ": refusing to write a model directory at the file system root");
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec).lexically_normal();
  if (!ec) {
    const auto rel = cwd.lexically_relative(target);
    QT_CHECK(rel.empty() || *rel.begin() == "..", dir, ": refusing to write a model directory over the current directory or one of its parents");
  }
  QT_CHECK(!fs::exists(target) || fs::is_directory(target), target.string(), ": exists and is not a directory");
  if (fs::is_directory(target) && !options.force && !fs::exists(target / options.config_name)) {
    std::vector<std::string> names;
    for (const auto& de : fs::directory_iterator(target, ec)) names.push_back(de.path().filename().string());
    std::sort(names.begin(), names.end());
    if (!names.empty()) {
      std::string shown;
      for (size_t i = 0; i < names.size() && i < 3; ++i) shown += (i ? ", " : "") + names[i];
      QT_FAIL(target.string(), ": exists, is not empty (", names.size(), " entries: ", shown,
              names.size() > 3 ? ", ..." : "", ") and is not a model directory (no config.json); refusing to write "
              "into it. Choose another directory, or pass --force to write the model there (its files are kept)");
    }
  }
  fs::create_directories(target.parent_path(), ec);
  QT_CHECK(!ec, target.parent_path().string(), ": cannot create: ", ec.message());
  const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  QT_CHECK(!ec, tmp.string(), ": cannot create: ", ec.message());
  try {
    write_text_file((tmp / options.config_name).string(), config_json.dump(2) + "\n");
    SafetensorsWriteOptions wo;
    wo.max_shard_bytes = options.max_shard_bytes;
    wo.base_name = options.weights_base_name;
    wo.parallel_fill = false;  // fills parallelize internally where it pays (random init)
    if (options.weight_map.empty()) {
      write_safetensors(tmp.string(), tensors, wo);
    } else {
      QT_CHECK(tensors.empty(), "hf_save: weights given both as tensors and as files written elsewhere");
      nlohmann::ordered_json index = {{"metadata", {{"total_size", options.weights_total_size}}},
                                      {"weight_map", nlohmann::ordered_json::object()}};
      for (const auto& [name, file] : options.weight_map) index["weight_map"][name] = file;
      write_text_file((tmp / (options.weights_base_name + ".safetensors.index.json")).string(), index.dump(2) + "\n");
    }
    for (const auto& [base, specs] : options.extra_tensor_files) {
      SafetensorsWriteOptions eo;
      eo.base_name = base;
      eo.max_shard_bytes = SIZE_MAX;
      write_safetensors(tmp.string(), specs, eo);
    }
    for (const auto& [name, content] : options.extra_files) write_text_file((tmp / name).string(), content);
    if (!options.move_files_from.empty()) {
      for (const auto& de : fs::directory_iterator(options.move_files_from)) {
        const fs::path to = tmp / de.path().filename();
        QT_CHECK(de.is_regular_file() && !fs::exists(to), de.path().string(), ": cannot move into ", tmp.string(),
                 " (not a file, or the save wrote that name itself)");
        fs::rename(de.path(), to, ec);
        QT_CHECK(!ec, de.path().string(), ": move into ", tmp.string(), " failed: ", ec.message());
      }
      fs::remove(options.move_files_from, ec);
    }
    if (!options.copy_files_from.empty() && fs::is_directory(options.copy_files_from)) {
      for (const auto& de : fs::directory_iterator(options.copy_files_from)) {
        const std::string n = de.path().filename().string();
        if (!de.is_regular_file() || n.empty() || n[0] == '.' || hf_is_saved_file_name(n) || is_foreign_weight_file(n) ||
            fs::exists(tmp / n))
          continue;
        fs::copy_file(de.path(), tmp / n, ec);
        QT_CHECK(!ec, de.path().string(), ": copy into ", tmp.string(), " failed: ", ec.message());
      }
    }
    if (!options.completion_marker.empty()) {
      // The marker lists what this save wrote, so that pruning later removes exactly that.
      nlohmann::json written = nlohmann::json::array();
      std::vector<std::string> names;
      for (const auto& de : fs::directory_iterator(tmp)) names.push_back(de.path().filename().string());
      std::sort(names.begin(), names.end());
      for (const auto& n : names) written.push_back(n);
      write_text_file((tmp / options.completion_marker).string(), nlohmann::json({{"files", written}}).dump(1) + "\n");
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Swap in: the previous directory is moved aside, the new one renamed into place, then the
  // previous one's user files moved over; a crash in between is undone by hf_recover_interrupted_saves.
  const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
  const bool had_old = fs::exists(target);
  if (had_old) {
    fs::rename(target, old, ec);
    if (ec) fs::remove_all(tmp);
    QT_CHECK(!ec, target.string(), ": cannot move the previous directory aside: ", ec.message());
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string msg = ec.message();
    if (had_old) fs::rename(old, target, ec);
    fs::remove_all(tmp, ec);
    QT_FAIL(target.string(), ": cannot rename ", tmp.string(), " into place: ", msg);
  }
  if (had_old) {
    move_user_files(old, target);
    fs::remove_all(old, ec);
  }
}

}  // namespace qt
