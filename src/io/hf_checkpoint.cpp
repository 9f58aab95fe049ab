#include "io/hf_checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/hub_cache.h"
#include "io/mapped_file.h"

namespace qt {
namespace fs = std::filesystem;

const std::vector<std::string>& hf_side_files() {
  static const std::vector<std::string> files = {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
      "chat_template.jinja", "vocab.json", "merges.txt", "preprocessor_config.json", "video_preprocessor_config.json"};
  return files;
}

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

void hf_save(const std::string& dir, const nlohmann::json& config_json, const std::vector<TensorWriteSpec>& tensors,
             const HfSaveOptions& options) {
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  QT_CHECK(!ec, target.parent_path().string(), ": cannot create: ", ec.message());
  QT_CHECK(!fs::exists(target) || fs::is_directory(target), target.string(), ": exists and is not a directory");
  const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  QT_CHECK(!ec, tmp.string(), ": cannot create: ", ec.message());
  try {
    write_text_file((tmp / "config.json").string(), config_json.dump(2) + "\n");
    SafetensorsWriteOptions wo;
    wo.max_shard_bytes = options.max_shard_bytes;
    wo.parallel_fill = false;  // fills parallelize internally where it pays (random init)
    write_safetensors(tmp.string(), tensors, wo);
    for (const auto& [name, content] : options.extra_files) write_text_file((tmp / name).string(), content);
    for (const auto& [base, specs] : options.extra_tensor_files) {
      SafetensorsWriteOptions eo;
      eo.base_name = base;
      eo.max_shard_bytes = SIZE_MAX;
      write_safetensors(tmp.string(), specs, eo);
    }
    if (!options.copy_files_from.empty()) {
      for (const auto& f : hf_side_files()) {
        const fs::path src = fs::path(options.copy_files_from) / f;
        if (fs::exists(src) && !fs::exists(tmp / f)) {
          fs::copy_file(src, tmp / f, ec);
          QT_CHECK(!ec, src.string(), ": copy failed: ", ec.message());
        }
      }
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Swap in: the old directory (if any) is removed only after the new one is complete.
  const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
  if (fs::exists(target)) {
    fs::rename(target, old, ec);
    QT_CHECK(!ec, target.string(), ": cannot move the previous directory aside: ", ec.message());
  }
  fs::rename(tmp, target, ec);
  QT_CHECK(!ec, target.string(), ": cannot rename ", tmp.string(), " into place: ", ec.message());
  fs::remove_all(old, ec);
}

}  // namespace qt
