// Hugging Face model directories: config.json + safetensors (single or sharded) + tokenizer files.
// Loading validates every tensor of the text model against the parameter table; tensors the text
// model does not use (model.visual.*, mtp.*, anything unknown) are kept and written back
// byte-for-byte on save.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace qt {

struct HfModelDir {
  std::string dir;
  ModelConfig config;
  TensorStore store;
  std::vector<ParamSpec> params;  // the text model's trainable tensors
  bool lm_head_stored = false;    // lm_head.weight is in the files (it may be, even when tied)

  const SafetensorsEntry& tensor(const ParamSpec& p) const { return store.get(p.name); }
  // Names in the files that are not text-model parameters (vision tower, MTP head, unknown).
  std::vector<const SafetensorsEntry*> passthrough_tensors() const;
};

// Loads and validates: a missing tensor, a shape that disagrees with config.json, or a
// non-floating dtype is an error naming the directory and the tensor. A hub id (Qwen/Qwen3.5-2B,
// io/hub_cache.h) loads its snapshot from the local hub cache; HfModelDir::dir is then that snapshot.
HfModelDir hf_load(const std::string& path_or_id);

struct HfSaveOptions {
  size_t max_shard_bytes = size_t{5} << 30;
  // The source model directory: its other files (tokenizer, chat template, README, LICENSE,
  // added_tokens.json, ...) are carried into the new directory; its weights and config are not.
  std::string copy_files_from;
  // Small files written into the directory as part of the same atomic save (name -> content).
  std::map<std::string, std::string> extra_files;
  // Further safetensors files in the same atomic save (base name -> tensors), e.g. optimizer state.
  std::map<std::string, std::vector<TensorWriteSpec>> extra_tensor_files;
  // An existing non-empty directory without config.json is refused unless `force`. Files in an
  // existing directory that the save does not write (a user's notes, say) are kept either way.
  bool force = false;
  // A file written last, so that a directory holding it is known complete (checkpoints).
  std::string completion_marker;
  // A directory (on the same filesystem) whose files, written by other processes, are moved into
  // the save before its marker (every rank's optimizer part); it is removed once empty.
  std::string move_files_from;
  // The weights were written by other processes into move_files_from (tensor -> file): `tensors`
  // must be empty, and the save writes <weights_base_name>.safetensors.index.json for them.
  std::map<std::string, std::string> weight_map;
  uint64_t weights_total_size = 0;
  // PEFT adapter directories: adapter_config.json and adapter_model.safetensors.
  std::string config_name = "config.json";
  std::string weights_base_name = "model";
};

// Writes a complete model directory atomically: everything goes to DIR.tmp-PID, which is renamed
// over DIR once complete (the previous DIR stays loadable until then, moved to DIR.old-PID for the
// swap). Refuses "/", the current directory and its parents. `tensors` are written as given;
// config_json is written as config.json. Saves never delete files they did not write.
void hf_save(const std::string& dir, const nlohmann::json& config_json, const std::vector<TensorWriteSpec>& tensors,
             const HfSaveOptions& options = {});

// Finishes or undoes saves into `parent` that a crash interrupted: a NAME.old-PID whose NAME is
// missing is moved back (the previous complete directory), one whose NAME exists gives back the
// user files it still holds and is removed, and every NAME.tmp-PID (never complete) is removed.
// Returns what it did, one line each. Call only while no other save into `parent` runs.
std::vector<std::string> hf_recover_interrupted_saves(const std::string& parent);

// Names a save writes itself (weights, indexes, config, trainer files): these are replaced when a
// directory is saved again; anything else in it is the user's and kept.
bool hf_is_saved_file_name(const std::string& name);

// A write spec that copies an existing tensor byte-for-byte.
TensorWriteSpec passthrough_spec(const SafetensorsEntry& e);

}  // namespace qt
