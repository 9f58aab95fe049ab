#include "train/checkpoint.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/log.h"
#include "dist/communicator.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
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

namespace {
// The HF weight tensors of table entries `pick` selects, from the host master copies (the tied
// lm_head copy beside the embedding where the source stored one).
std::vector<TensorWriteSpec> weight_specs(const CheckpointWrite& w, const std::vector<std::vector<float>>& master,
                                          const std::function<bool(size_t)>& pick) {
  const auto& table = *w.table;
  const ModelConfig& mc = w.source->config;
  std::vector<TensorWriteSpec> specs;
  for (size_t i = 0; i < table.size(); ++i) {
    if (!pick(i)) continue;
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
  return specs;
}

// A parallel save's weight files: each whole tensor goes to the rank with the fewest bytes so far
// (in table order, rank 0 starting with the passthrough tensors; every rank computes the same);
// the ranks that got any write model-k-of-K.safetensors, numbered in rank order.
struct WeightFiles {
  std::vector<int> owner;   // by table index
  std::vector<int> number;  // by rank: -1, or its file's 0-based number
  int files = 0;
  uint64_t total = 0;
  std::string name(int rank) const {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", number[size_t(rank)] + 1, files);
    return b;
  }
};
WeightFiles plan_weight_files(const CheckpointWrite& w, int world) {
  const auto& table = *w.table;
  const ModelConfig& mc = w.source->config;
  WeightFiles f;
  std::vector<uint64_t> load(static_cast<size_t>(world), 0);
  std::vector<bool> writes(static_cast<size_t>(world), false);
  for (const SafetensorsEntry* e : w.source->passthrough_tensors()) {
    load[0] += e->nbytes;
    writes[0] = true;  // rank 0's file carries them
  }
  for (size_t i = 0; i < table.size(); ++i) {
    uint64_t bytes = uint64_t(shape_numel(table[i].shape)) * dtype_size(save_dtype_of(w, table[i].name));
    if (table[i].role == ParamRole::EmbedTokens && mc.tie_word_embeddings && w.source->lm_head_stored) bytes *= 2;
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    f.owner.push_back(r);
    load[size_t(r)] += bytes;
    writes[size_t(r)] = true;
  }
  for (const uint64_t b : load) f.total += b;
  for (int r = 0; r < world; ++r) f.number.push_back(writes[size_t(r)] ? f.files++ : -1);
  return f;
}

// The checkpoint directory from the host copies (m and v empty when the optimizer's ranks wrote
// their parts into `parts`, which the save then moves in; weight_map non-null: so did the weights).
void write_checkpoint_dir(const CheckpointWrite& w, const std::vector<std::vector<float>>& master,
                          const std::vector<std::vector<float>>& m, const std::vector<std::vector<float>>& v,
                          const std::string& parts, const WeightFiles* weight_files = nullptr) {
  const auto& table = *w.table;
  const ModelConfig& mc = w.source->config;
  std::vector<TensorWriteSpec> specs;
  if (weight_files == nullptr) {
    specs = weight_specs(w, master, [](size_t) { return true; });
    if (!w.lora)
      for (const SafetensorsEntry* e : w.source->passthrough_tensors()) specs.push_back(passthrough_spec(*e));
  }
  HfSaveOptions opts;
  opts.copy_files_from = w.source->dir;
  opts.force = true;  // final/, checkpoint-N/: a user's files there are kept
  opts.completion_marker = kCheckpointMarker;
  opts.extra_files["trainer_state.json"] = state_json(w.state).dump(2) + "\n";
  opts.move_files_from = parts;
  if (weight_files != nullptr) {
    for (size_t i = 0; i < table.size(); ++i) {
      opts.weight_map[table[i].name] = weight_files->name(weight_files->owner[i]);
      if (table[i].role == ParamRole::EmbedTokens && mc.tie_word_embeddings && w.source->lm_head_stored)
        opts.weight_map[lm_head_name()] = weight_files->name(weight_files->owner[i]);
    }
    for (const SafetensorsEntry* e : w.source->passthrough_tensors()) opts.weight_map[e->name] = weight_files->name(0);
    opts.weights_total_size = weight_files->total;
  }
  if (w.with_optimizer && parts.empty()) {
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
    return;
  }
  hf_save(w.dir, mc.raw, specs, opts);  // runs the fills while master/m/v are alive
}
}  // namespace

std::string optimizer_part_name(int rank, int world) {
  char b[64];
  std::snprintf(b, sizeof b, "optimizer-rank-%05d-of-%05d", rank, world);
  return b;
}

namespace {
// Whether f is a file a parallel save's ranks write into checkpoint-N.parts/.
bool is_part_file(const fs::directory_entry& f) {
  const std::string n = f.path().filename().string();
  return f.is_regular_file() && (n.rfind("optimizer-rank-", 0) == 0 ||
                                 (n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos));
}

// Removes a parts directory that holds only part files (an interrupted save's); true when `dir` is
// gone (or never was), false when it holds anything else (left as it is).
bool clear_parts_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& f : fs::directory_iterator(dir, ec))
    if (!is_part_file(f)) return false;
  fs::remove_all(dir, ec);
  return !ec;
}

void check_disk_space(const CheckpointWrite& w, const fs::path& parent) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  struct statvfs vfs {};
  if (::statvfs(parent.c_str(), &vfs) != 0) return;
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize, need = checkpoint_bytes(w);
  QT_CHECK(avail >= need, w.dir, ": not enough free disk space for the checkpoint: it needs ", need, " bytes (",
           need >> 20, " MiB), ", avail, " bytes (", avail >> 20, " MiB) are free on ", parent.string(),
           "; the previous checkpoints are untouched");
}

// Every rank's ok (1) or failure (0), so that all of them stop together instead of one waiting
// at a barrier for a rank that threw.
void agree(Communicator& comm, bool ok, const std::string& what) {
  double v = ok ? 1.0 : 0.0;
  comm.all_reduce_host(&v, 1);
  QT_CHECK(v == double(comm.world()), what);
}

// This rank's rows of the optimizer state as optimizer-rank-R-of-W.safetensors in `dir`: the
// sharded tensors' rows ([end - begin, ...] with "rows.NAME" = "begin,end" in the metadata) and,
// on rank 0, the replicated tensors whole.
void write_optimizer_part(const std::string& dir, const std::vector<ParamSpec>& table, ModelOptimizer& opt,
                          int rank, int world) {
  std::vector<std::vector<float>> master(table.size()), m(table.size()), v(table.size());
  std::vector<TensorWriteSpec> specs;
  SafetensorsWriteOptions o;
  o.base_name = optimizer_part_name(rank, world);
  o.max_shard_bytes = SIZE_MAX;
  for (size_t i = 0; i < table.size(); ++i) {
    const ModelOptimizer::StateRows r = opt.state_rows(i);
    if (!r.sharded && rank != 0) continue;
    opt.get_local_state(i, master[i], m[i], v[i]);
    Shape shape = table[i].shape;
    const int64_t cols = r.rows > 0 ? shape_numel(shape) / r.rows : 0;
    if (!shape.empty()) shape[0] = r.end - r.begin;
    QT_CHECK(static_cast<int64_t>(master[i].size()) == (r.end - r.begin) * cols && m[i].size() == master[i].size() &&
                 v[i].size() == master[i].size(),
             "optimizer state of ", table[i].name, ": this rank holds ", master[i].size(), " values for rows [",
             r.begin, ", ", r.end, ")");
    o.metadata["rows." + table[i].name] = std::to_string(r.begin) + "," + std::to_string(r.end);
    for (const auto& [prefix, vec] : {std::pair<const char*, const std::vector<float>*>{"master.", &master[i]},
                                      {"m.", &m[i]}, {"v.", &v[i]}}) {
      const std::vector<float>* src = vec;
      specs.push_back({prefix + table[i].name, DType::F32, shape,
                       [src](void* dst, size_t n) { std::memcpy(dst, src->data(), n); }});
    }
  }
  o.metadata["world"] = std::to_string(world);
  write_safetensors(dir, specs, o);
}
}  // namespace

std::string checkpoint_save(const CheckpointWrite& w) {
  QT_CHECK(w.source && w.table && w.optimizer, "checkpoint_save: incomplete request for ", w.dir);
  const auto& table = *w.table;
  // A sharded optimizer's ranks write in parallel: each its rows of the optimizer state (nothing
  // gathers m and v) and its share of the whole weights (gathered one tensor at a time, kept by
  // the rank that writes it); rank 0 then moves their files into its atomic save. Otherwise the
  // state is gathered whole (a collective where sharded) and rank 0 writes everything.
  const bool parallel = !w.lora && w.optimizer->shards_state() && w.comm != nullptr && w.comm->world() > 1;
  const int rank = parallel ? w.comm->rank() : 0, world = parallel ? w.comm->world() : 1;
  const WeightFiles files = parallel ? plan_weight_files(w, world) : WeightFiles{};
  // Host copies of the fp32 master (the weights are saved from it) and, unless parallel, m and v.
  std::vector<std::vector<float>> master(table.size()), m(table.size()), v(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    if (parallel || !w.with_optimizer) {
      std::vector<float> whole = w.optimizer->get_master(i);
      if (parallel ? files.owner[i] == rank : w.write) master[i] = std::move(whole);
    } else if (w.write) {
      w.optimizer->get_state(i, master[i], m[i], v[i]);
    } else {
      std::vector<float> a, b, c;
      w.optimizer->get_state(i, a, b, c);
    }
  }
  const fs::path parent = fs::absolute(w.dir).parent_path();
  if (!parallel) {
    if (!w.write) return w.dir;
    check_disk_space(w, parent);
    write_checkpoint_dir(w, master, m, v, std::string());
    return w.dir;
  }
  const std::string parts = w.dir + ".parts";  // every rank's files, moved into the save by rank 0
  std::string err;
  if (rank == 0) {
    try {
      check_disk_space(w, parent);
      QT_CHECK(clear_parts_dir(parts), parts, ": exists and holds files other than a save's parts; move them away "
               "(the save writes every rank's files there)");
      std::error_code ec;
      fs::create_directories(parts, ec);
      QT_CHECK(!ec, parts, ": cannot create: ", ec.message());
    } catch (const Error& e) {
      err = e.what();
    }
  }
  agree(*w.comm, err.empty(), err.empty() ? w.dir + ": rank 0 could not prepare the checkpoint (its log names why)" : err);
  try {
    if (w.with_optimizer) write_optimizer_part(parts, table, *w.optimizer, rank, world);
    if (files.number[size_t(rank)] >= 0) {
      std::vector<TensorWriteSpec> specs = weight_specs(w, master, [&](size_t i) { return files.owner[i] == rank; });
      if (rank == 0)
        for (const SafetensorsEntry* e : w.source->passthrough_tensors()) specs.push_back(passthrough_spec(*e));
      SafetensorsWriteOptions o;
      o.base_name = files.name(rank).substr(0, files.name(rank).size() - std::string(".safetensors").size());
      o.max_shard_bytes = SIZE_MAX;
      o.parallel_fill = false;
      write_safetensors(parts, specs, o);
    }
  } catch (const Error& e) {
    err = e.what();
  }
  agree(*w.comm, err.empty(),
        err.empty() ? w.dir + ": another rank could not write its part of the checkpoint (its log names why)" : err);
  if (rank != 0) {
    agree(*w.comm, true, w.dir + ": rank 0 could not complete the checkpoint (its log names why)");
    return w.dir;
  }
  try {
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> names;
      if (w.with_optimizer) names.push_back(optimizer_part_name(r, world) + ".safetensors");
      if (files.number[size_t(r)] >= 0) names.push_back(files.name(r));
      for (const std::string& n : names)
        QT_CHECK(fs::is_regular_file(fs::path(parts) / n), (fs::path(parts) / n).string(), ": rank ", r,
                 " wrote it, but it is not there: output_dir must be on a filesystem every rank sees (a shared one "
                 "across nodes)");
    }
    write_checkpoint_dir(w, master, m, v, parts, &files);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(parts, ec);
    double failed = 0.0;  // the others stop too; this rank rethrows its own error
    w.comm->all_reduce_host(&failed, 1);
    throw;
  }
  agree(*w.comm, true, w.dir + ": rank 0 could not complete the checkpoint (its log names why)");
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

namespace {
// The optimizer-rank-R-of-W parts of a checkpoint written by W ranks, rank order; empty if none.
std::vector<std::shared_ptr<SafetensorsFile>> open_optimizer_parts(const std::string& dir) {
  int world = 0;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    int r = 0, w = 0;
    char tail[16] = {};
    const std::string n = de.path().filename().string();
    if (std::sscanf(n.c_str(), "optimizer-rank-%5d-of-%5d.%15s", &r, &w, tail) == 3 && std::string(tail) == "safetensors") {
      QT_CHECK(world == 0 || world == w, dir, ": optimizer parts of different world sizes (", world, " and ", w,
               "): remove the stray ones");
      world = w;
    }
  }
  std::vector<std::shared_ptr<SafetensorsFile>> parts;
  for (int r = 0; r < world; ++r) {
    const fs::path f = fs::path(dir) / (optimizer_part_name(r, world) + ".safetensors");
    QT_CHECK(fs::is_regular_file(f), f.string(), ": missing: the checkpoint's optimizer state was written by ", world,
             " ranks and needs every part");
    parts.push_back(SafetensorsFile::open(f.string()));
  }
  return parts;
}

// Parameter `p`'s master reassembled whole from the parts' row ranges, which must cover its rows
// exactly once, and m and v only for rows [lo, hi) (a sharded resume's own rows; all by default).
void assemble_from_parts(const std::vector<std::shared_ptr<SafetensorsFile>>& parts, const ParamSpec& p,
                         std::vector<float>& master, std::vector<float>& m, std::vector<float>& v, int64_t lo = 0,
                         int64_t hi = -1) {
  const int64_t rows = p.shape.empty() ? 1 : p.shape[0], numel = shape_numel(p.shape);
  const int64_t cols = rows > 0 ? numel / rows : 0;
  if (hi < 0) hi = rows;
  master.assign(static_cast<size_t>(numel), 0.0f);
  for (auto* x : {&m, &v}) x->assign(static_cast<size_t>((hi - lo) * cols), 0.0f);
  std::vector<std::pair<int64_t, int64_t>> got;
  for (const auto& f : parts) {
    const auto it = f->metadata().find("rows." + p.name);
    if (it == f->metadata().end()) continue;
    long long bl = -1, el = -1;
    const bool parsed = std::sscanf(it->second.c_str(), "%lld,%lld", &bl, &el) == 2;
    const int64_t b = bl, e = el;
    QT_CHECK(parsed && 0 <= b && b <= e && e <= rows, f->path(),
             ": rows of '", p.name, "' are '", it->second, "', expected begin,end within [0, ", rows, "]");
    Shape want = p.shape;
    if (!want.empty()) want[0] = e - b;
    for (auto& [prefix, vec] : {std::pair<const char*, std::vector<float>*>{"master.", &master}, {"m.", &m}, {"v.", &v}}) {
      const SafetensorsEntry* t = f->find(prefix + p.name);
      QT_CHECK(t != nullptr, f->path(), ": missing optimizer tensor '", prefix, p.name, "'");
      QT_CHECK(t->dtype == DType::F32 && t->shape == want, f->path(), ": optimizer tensor '", prefix, p.name, "' is ",
               dtype_name(t->dtype), shape_str(t->shape), ", expected F32", shape_str(want), " (rows ", b, "..", e, ")");
      const auto* src = reinterpret_cast<const float*>(t->data);
      if (vec == &master) {
        std::memcpy(vec->data() + b * cols, src, t->nbytes);
        continue;
      }
      const int64_t from = std::max(b, lo), to = std::min(e, hi);  // the rows of this part in [lo, hi)
      if (from < to)
        std::memcpy(vec->data() + (from - lo) * cols, src + (from - b) * cols, size_t((to - from) * cols) * 4);
    }
    got.push_back({b, e});
  }
  std::sort(got.begin(), got.end());
  int64_t at = 0;
  for (const auto& [b, e] : got) {
    QT_CHECK(b == at, parts.front()->path(), " and the other optimizer parts: rows ", at, "..", b, " of '", p.name,
             b > at ? "' are in no part" : "' are in two parts");
    at = e;
  }
  QT_CHECK(at == rows, parts.front()->path(), " and the other optimizer parts: rows ", at, "..", rows, " of '", p.name,
           "' are in no part");
}
}  // namespace

void checkpoint_load_optimizer(const std::string& dir, const std::vector<ParamSpec>& table, ModelOptimizer& opt) {
  const fs::path whole = fs::path(dir) / "optimizer.safetensors";
  if (!fs::exists(whole)) {
    const auto parts = open_optimizer_parts(dir);
    QT_CHECK(!parts.empty(), dir, ": no optimizer state (optimizer.safetensors, or optimizer-rank-R-of-W.safetensors "
             "parts): it was saved without it; resume needs a checkpoint saved with the optimizer");
    for (size_t i = 0; i < table.size(); ++i) {
      std::vector<float> master, m, v;
      if (opt.shards_state()) {  // this rank's rows of m and v only
        const ModelOptimizer::StateRows r = opt.state_rows(i);
        assemble_from_parts(parts, table[i], master, m, v, r.begin, r.end);
        opt.set_local_state(i, master, m, v);
      } else {
        assemble_from_parts(parts, table[i], master, m, v);
        opt.set_state(i, master, m, v);
      }
    }
    return;
  }
  auto file = SafetensorsFile::open(whole.string());
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
  // A sharded save that stopped before rank 0 moved the ranks' parts in leaves checkpoint-N.parts
  // (never complete): removed when it holds only optimizer parts, else left alone and named.
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (const auto& de : fs::directory_iterator(output_dir, ec)) {
    const std::string n = de.path().filename().string();
    if (de.is_directory() && n.size() > 6 && n.compare(n.size() - 6, 6, ".parts") == 0 &&
        checkpoint_step_of(n.substr(0, n.size() - 6)) >= 0)
      leftovers.push_back(de.path());
  }
  for (const fs::path& d : leftovers) {
    if (clear_parts_dir(d))
      log_warn("output_dir: removed ", d.filename().string(), ", the ranks' parts of a save that did not complete");
    else
      log_warn("output_dir: ", d.filename().string(), " holds files other than a save's parts; left as it is");
  }
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
