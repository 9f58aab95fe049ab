#include "train/checkpoint.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "io/mapped_file.h"
#include "train/model_optimizer.h"
#include "train/run_dir.h"

namespace qt {
namespace fs = std::filesystem;

nlohmann::json RunFingerprint::to_json() const {
  return {{"data.tokens_per_batch", tokens_per_batch},
          {"train.global_batch_tokens", global_batch_tokens},
          {"data.thinking", thinking},
          {"data.train_on", train_on},
          {"data.overflow", overflow},
          {"data.schema", schema},
          {"data.seed", pack_seed},
          {"data.shuffle_window", shuffle_window},
          {"data.path", data_files},
          {"data contents", data_key},
          {"tokenizer", tokenizer_hash},
          {"model config.json", model_config},
          {"train.method", method},
          {"lora", lora}};
}

std::vector<std::string> fingerprint_differences(const nlohmann::json& saved, const nlohmann::json& now) {
  std::vector<std::string> out;
  if (!saved.is_object()) return {"the checkpoint has no run fingerprint (written by an older qwentune)"};
  auto shown = [](const nlohmann::json& v) {
    std::string s = v.dump();
    return s.size() > 120 ? s.substr(0, 117) + "..." : s;
  };
  for (const auto& [key, value] : now.items()) {
    if (!saved.contains(key)) {
      out.push_back(key + ": not recorded in the checkpoint");
      continue;
    }
    const nlohmann::json& old = saved[key];
    if (old == value) continue;
    if (key == "model config.json" && old.is_object() && value.is_object()) {
      for (const auto& [k, v] : value.items())
        if (!old.contains(k) || old[k] != v)
          out.push_back("model config.json: " + k + " is " + (old.contains(k) ? shown(old[k]) : "absent") +
                        " in the checkpoint, " + shown(v) + " now");
      for (const auto& [k, v] : old.items())
        if (!value.contains(k)) out.push_back("model config.json: " + k + " is " + shown(v) + " in the checkpoint, absent now");
      continue;
    }
    if (key == "data contents") {
      // Only report it when nothing more specific explains it.
      if (saved.value("data.path", nlohmann::json()) == now.value("data.path", nlohmann::json()) &&
          saved.value("tokenizer", nlohmann::json()) == now.value("tokenizer", nlohmann::json()))
        out.push_back("data: the contents of the data files changed since the checkpoint was written");
      continue;
    }
    out.push_back(key + ": " + shown(old) + " in the checkpoint, " + shown(value) + " now");
  }
  return out;
}

std::string file_hash_hex(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QT_CHECK(f.good(), path, ": cannot open for hashing");
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 16);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < f.gcount(); ++i) h = (h ^ static_cast<unsigned char>(buf[size_t(i)])) * 0x100000001b3ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

namespace {

DType save_dtype_of(const CheckpointWrite& w, const std::string& name) {
  if (w.save_dtype != "auto") return *dtype_from_user_name(w.save_dtype);
  if (w.lora) return DType::F32;  // adapters: f32, as PEFT keeps and saves them
  return w.source->store.get(name).dtype;
}

nlohmann::ordered_json state_json(const TrainerState& s) {
  nlohmann::ordered_json j = {{"step", s.step}, {"epoch", s.position.epoch}, {"batch", s.position.batch},
                              {"source_model", s.source_model}, {"fingerprint", s.fingerprint}};
  if (s.best_eval_loss >= 0) {
    j["best_eval_loss"] = s.best_eval_loss;
    j["best_step"] = s.best_step;
  }
  return j;
}

}  // namespace

uint64_t checkpoint_bytes(const CheckpointWrite& w) {
  uint64_t bytes = 1 << 20;  // config, trainer state, headers
  for (const ParamSpec& p : *w.table) {
    const uint64_t n = static_cast<uint64_t>(shape_numel(p.shape));
    bytes += n * dtype_size(save_dtype_of(w, p.name));
    if (w.with_optimizer) bytes += 3 * 4 * n;
  }
  if (!w.lora)
    for (const SafetensorsEntry* e : w.source->passthrough_tensors()) bytes += e->nbytes;
  std::error_code ec;
  if (fs::is_directory(w.source->dir))
    for (const auto& de : fs::directory_iterator(w.source->dir, ec))
      if (de.is_regular_file(ec) && !hf_is_saved_file_name(de.path().filename().string())) bytes += de.file_size(ec);
  return bytes;
}

std::string checkpoint_save(const CheckpointWrite& w) {
  QT_CHECK(w.source && w.table && w.optimizer, "checkpoint_save: incomplete request for ", w.dir);
  const auto& table = *w.table;
  // Host copies of the optimizer state (gathered from every rank's shards in a sharded run): the
  // weights are saved from the fp32 master.
  std::vector<std::vector<float>> master(table.size()), m(table.size()), v(table.size());
  if (!w.write) {  // take part in the gathers, keep nothing
    std::vector<float> a, b, c;
    for (size_t i = 0; i < table.size(); ++i) w.optimizer->get_state(i, a, b, c);
    return w.dir;
  }
  for (size_t i = 0; i < table.size(); ++i) w.optimizer->get_state(i, master[i], m[i], v[i]);
  const fs::path parent = fs::absolute(w.dir).parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  struct statvfs vfs {};
  if (::statvfs(parent.c_str(), &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize, need = checkpoint_bytes(w);
    QT_CHECK(avail >= need, w.dir, ": not enough free disk space for the checkpoint: it needs ", need, " bytes (",
             need >> 20, " MiB), ", avail, " bytes (", avail >> 20, " MiB) are free on ", parent.string(),
             "; the previous checkpoints are untouched");
  }
  const ModelConfig& mc = w.source->config;
  std::vector<TensorWriteSpec> specs;
  for (size_t i = 0; i < table.size(); ++i) {
    const DType t = save_dtype_of(w, table[i].name);
    const std::vector<float>* src = &master[i];
    specs.push_back({w.lora ? peft_key(table[i].name) : table[i].name, t, table[i].shape, [src, t](void* dst, size_t) {
                       tensor_from_f32(Tensor(dst, t, {static_cast<int64_t>(src->size())}), src->data());
                     }});
    if (!w.lora && table[i].role == ParamRole::EmbedTokens && mc.tie_word_embeddings && w.source->lm_head_stored) {
      TensorWriteSpec head = specs.back();
      head.name = lm_head_name();
      specs.push_back(head);
    }
  }
  if (!w.lora)
    for (const SafetensorsEntry* e : w.source->passthrough_tensors()) specs.push_back(passthrough_spec(*e));
  HfSaveOptions opts;
  opts.copy_files_from = w.source->dir;
  opts.force = true;  // final/, checkpoint-N/: a user's files there are kept
  opts.completion_marker = kCheckpointMarker;
  opts.extra_files["trainer_state.json"] = state_json(w.state).dump(2) + "\n";
  if (w.with_optimizer) {
    std::vector<TensorWriteSpec>& opt = opts.extra_tensor_files["optimizer"];
    for (size_t i = 0; i < table.size(); ++i) {
      for (const auto& [prefix, vec] : {std::pair<const char*, const std::vector<float>*>{"master.", &master[i]},
                                        {"m.", &m[i]}, {"v.", &v[i]}}) {
        const std::vector<float>* src = vec;
        opt.push_back({prefix + table[i].name, DType::F32, table[i].shape,
                       [src](void* dst, size_t n) { std::memcpy(dst, src->data(), n); }});
      }
    }
  }
  if (w.lora) {
    opts.config_name = "adapter_config.json";
    opts.weights_base_name = "adapter_model";
    opts.max_shard_bytes = SIZE_MAX;
    const nlohmann::json cfg = nlohmann::json::parse(peft_adapter_config_json(lora_peft_config(*w.lora, w.state.source_model)).dump());
    hf_save(w.dir, cfg, specs, opts);
    return w.dir;
  }
  hf_save(w.dir, mc.raw, specs, opts);  // runs the fills while master/m/v are alive
  return w.dir;
}

bool checkpoint_is_complete(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / kCheckpointMarker) && fs::is_regular_file(fs::path(dir) / "trainer_state.json");
}

int64_t checkpoint_step_of(const std::string& name) {
  static const std::string prefix = "checkpoint-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<std::string> checkpoint_list(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (fs::is_directory(output_dir, ec))
    for (const auto& de : fs::directory_iterator(output_dir, ec)) {
      const int64_t k = checkpoint_step_of(de.path().filename().string());
      if (k >= 0 && de.is_directory(ec) && checkpoint_is_complete(de.path().string())) found.emplace_back(k, de.path().string());
    }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string checkpoint_find_latest(const std::string& output_dir) {
  const auto all = checkpoint_list(output_dir);
  return all.empty() ? "" : all.back();
}

std::vector<std::string> checkpoint_prune(const std::string& output_dir, int64_t keep, const std::string& protect) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  auto all = checkpoint_list(output_dir);
  const fs::path prot = protect.empty() ? fs::path() : fs::absolute(protect).lexically_normal();
  while (static_cast<int64_t>(all.size()) > keep) {
    const std::string victim = all.front();
    all.erase(all.begin());
    if (!prot.empty() && fs::absolute(victim).lexically_normal() == prot) continue;
    // Only what the save wrote goes (the marker lists it); a user's files in it stay.
    std::error_code ec;
    std::vector<std::string> written;
    try {
      const nlohmann::json marker = nlohmann::json::parse(read_text_file((fs::path(victim) / kCheckpointMarker).string()));
      for (const auto& n : marker.at("files")) written.push_back(n.get<std::string>());
    } catch (const std::exception&) {
      for (const auto& de : fs::directory_iterator(victim, ec))
        if (hf_is_saved_file_name(de.path().filename().string())) written.push_back(de.path().filename().string());
    }
    fs::remove(fs::path(victim) / kCheckpointMarker, ec);  // first: a half-pruned one is never resumed
    for (const auto& n : written)
      if (n.find('/') == std::string::npos && n != ".." && n != ".") fs::remove(fs::path(victim) / n, ec);
    if (fs::is_empty(victim, ec)) fs::remove(victim, ec);
    removed.push_back(victim);
  }
  return removed;
}

TrainerState checkpoint_read_state(const std::string& dir) {
  const std::string path = (fs::path(dir) / "trainer_state.json").string();
  QT_CHECK(checkpoint_is_complete(dir), dir, ": not a complete checkpoint (no ", kCheckpointMarker,
           " marker: the save did not finish, or the directory is not a qwentune checkpoint)");
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL(path, ": malformed JSON: ", e.what());
  }
  QT_CHECK(st.is_object() && st.contains("step") && st.contains("epoch") && st.contains("batch"), path,
           ": needs step, epoch and batch");
  TrainerState s;
  try {
    s.step = st["step"].get<int64_t>();
    s.position = {st["epoch"].get<int64_t>(), st["batch"].get<int64_t>()};
    s.source_model = st.value("source_model", std::string());
    if (st.contains("fingerprint")) s.fingerprint = st["fingerprint"];
    s.best_eval_loss = st.value("best_eval_loss", -1.0);
    s.best_step = st.value("best_step", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL(path, ": ", e.what());
  }
  return s;
}

void checkpoint_load_optimizer(const std::string& dir, const std::vector<ParamSpec>& table, ModelOptimizer& opt) {
  auto file = SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
  for (size_t i = 0; i < table.size(); ++i) {
    std::vector<float> master(static_cast<size_t>(shape_numel(table[i].shape))), m(master.size()), v(master.size());
    for (auto& [prefix, vec] : {std::pair<const char*, std::vector<float>*>{"master.", &master}, {"m.", &m}, {"v.", &v}}) {
      const SafetensorsEntry* e = file->find(prefix + table[i].name);
      QT_CHECK(e != nullptr, file->path(), ": missing optimizer tensor '", prefix, table[i].name, "'");
      QT_CHECK(e->dtype == DType::F32 && e->shape == table[i].shape, file->path(), ": optimizer tensor '", prefix,
               table[i].name, "' is ", dtype_name(e->dtype), shape_str(e->shape), ", expected F32",
               shape_str(table[i].shape));
      std::memcpy(vec->data(), e->data, e->nbytes);
    }
    opt.set_state(i, master, m, v);
  }
}

std::string checkpoint_prepare_start(const std::string& output_dir, const std::string& resume, bool overwrite) {
  for (const std::string& line : hf_recover_interrupted_saves(output_dir)) log_warn("output_dir: ", line);
  std::string dir = resume;
  if (dir == "auto") {
    dir = checkpoint_find_latest(output_dir);
    if (dir.empty()) log_info("resume: auto found no complete checkpoint in ", output_dir, "; starting fresh");
  }
  if (!dir.empty()) {
    QT_CHECK(fs::is_directory(dir), dir, ": checkpoint to resume from does not exist");
    return dir;
  }
  std::vector<std::string> earlier;
  for (const std::string& n : run_dir_outputs(output_dir))
    if (n != "config.yaml") earlier.push_back(n);
  if (earlier.empty()) return dir;
  if (overwrite) {
    log_warn(output_dir, ": --overwrite: removing the earlier run's outputs");
    run_dir_clear(output_dir);
    return dir;
  }
  std::string list;
  for (size_t i = 0; i < earlier.size() && i < 6; ++i) list += (i ? ", " : "") + earlier[i];
  QT_FAIL(output_dir, ": holds an earlier run (", list, earlier.size() > 6 ? ", ..." : "",
          ") and this run would start fresh; resume it (--set train.resume=auto), pass --overwrite to replace it, "
          "or choose another output_dir");
}

ResumePoint checkpoint_resume(const std::string& dir, const nlohmann::json& fingerprint,
                              const std::vector<ParamSpec>& table, ModelOptimizer& opt) {
  const TrainerState st = checkpoint_read_state(dir);
  const std::vector<std::string> diffs = fingerprint_differences(st.fingerprint, fingerprint);
  if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += "\n  " + d;
    QT_FAIL(dir, ": cannot resume: this run differs from the one that wrote the checkpoint:", list,
            "\n(start a new run in another output_dir, or restore the old settings)");
  }
  checkpoint_load_optimizer(dir, table, opt);
  ResumePoint rp;
  rp.step = st.step + 1;
  rp.position = st.position;
  rp.best_eval_loss = st.best_eval_loss;
  rp.best_step = st.best_step;
  return rp;
}

}  // namespace qt
