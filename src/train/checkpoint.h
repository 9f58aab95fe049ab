// Training checkpoints: an HF model directory (weights from the fp32 master) plus the optimizer
// state (master, m, v): optimizer.safetensors, or where the optimizer shards it over ranks one
// optimizer-rank-R-of-W.safetensors per rank holding that rank's rows (nothing gathers m and v;
// a resume on any number of ranks reassembles them), trainer_state.json (step, loader position, the run's
// fingerprint, the source model as an absolute path) and .qwentune-complete, written last. Only
// `checkpoint-<digits>` directories holding that marker count as checkpoints: a save killed
// half-way is never resumed from. The fingerprint records what a resume must not change (rows,
// data, tokenizer, template, model); a resume that changes one is an error naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "model/hf_checkpoint.h"
#include "model/lora.h"
#include "model/params.h"

namespace qt {

class Communicator;
class ModelOptimizer;

inline constexpr const char* kCheckpointMarker = ".qwentune-complete";

// What a resumed run must share with the run that wrote the checkpoint.
struct RunFingerprint {
  int64_t tokens_per_batch = 0;
  int64_t global_batch_tokens = 0;
  std::string thinking, train_on, overflow, schema;
  uint64_t pack_seed = 0;
  int64_t shuffle_window = 0;
  std::vector<std::string> data_files;  // as resolved, absolute
  std::string data_key;                 // content hash of data + tokenizer + template (token cache key)
  std::string tokenizer_hash;           // of tokenizer.json's bytes
  nlohmann::json model_config;          // the source model's config.json
  std::string method;                   // full | lora
  nlohmann::json lora;                  // r, alpha, rslora, targets (LoRA)

  nlohmann::json to_json() const;
};
// Every difference between a checkpoint's fingerprint and the current run's, one line each
// ("data.tokens_per_batch: 256 in the checkpoint, 512 now"); empty when they agree.
std::vector<std::string> fingerprint_differences(const nlohmann::json& saved, const nlohmann::json& now);
// 64-bit FNV-1a of a file's bytes as 16 hex digits.
std::string file_hash_hex(const std::string& path);

struct TrainerState {
  int64_t step = 0;
  LoaderPosition position;
  std::string source_model;   // absolute path of the model the run started from
  nlohmann::json fingerprint;
  double best_eval_loss = -1;  // < 0: none yet
  int64_t best_step = 0;
};

struct CheckpointWrite {
  std::string dir;
  const HfModelDir* source = nullptr;         // config, dtypes, passthrough tensors, side files
  const std::vector<ParamSpec>* table = nullptr;
  ModelOptimizer* optimizer = nullptr;
  std::string save_dtype = "auto";            // auto | bf16 | f16 | f32
  bool with_optimizer = true;
  TrainerState state;
  // LoRA: the trainable table holds adapters; the directory is a PEFT adapter (adapter_config.json,
  // adapter_model.safetensors with PEFT's keys) instead of a model directory.
  const LoraSpec* lora = nullptr;
  // false: only take part in gathering the optimizer state (get_state is collective in a sharded
  // run) and write nothing: every rank but the first.
  bool write = true;
  // A sharded optimizer (ModelOptimizer::shards_state): every rank writes its own part of the
  // state, coordinated over comm (rank 0 is the one with `write`).
  Communicator* comm = nullptr;
};
// optimizer-rank-00003-of-00008: the base name of a rank's part of the optimizer state.
std::string optimizer_part_name(int rank, int world);

// Bytes a checkpoint takes on disk (weights in their save dtypes, optimizer state, passthrough).
uint64_t checkpoint_bytes(const CheckpointWrite& w);
// Writes it atomically after checking the disk has room (an error names the directory, the bytes
// needed and the bytes free). Returns the directory.
std::string checkpoint_save(const CheckpointWrite& w);

bool checkpoint_is_complete(const std::string& dir);
// Step number of a `checkpoint-<digits>` name, or -1.
int64_t checkpoint_step_of(const std::string& name);
// The newest complete checkpoint-N under output_dir, or "" when there is none.
std::string checkpoint_find_latest(const std::string& output_dir);
// Complete checkpoint-N directories under output_dir, oldest first.
std::vector<std::string> checkpoint_list(const std::string& output_dir);
// Removes the oldest complete checkpoint-N beyond the newest `keep` (never `protect`); returns them.
std::vector<std::string> checkpoint_prune(const std::string& output_dir, int64_t keep, const std::string& protect);

TrainerState checkpoint_read_state(const std::string& dir);

// Where a run starts (the run's output_dir locked by the caller): finishes or undoes interrupted
// saves, then returns the checkpoint to resume from ("" = fresh): `resume` itself, or for "auto"
// the newest complete checkpoint-N. A fresh run into an earlier run's outputs is refused unless
// `overwrite` (which removes only run outputs).
std::string checkpoint_prepare_start(const std::string& output_dir, const std::string& resume, bool overwrite);

// A resume's starting point, read from a checkpoint whose fingerprint must equal `fingerprint`
// (else an error lists every difference); the optimizer state is restored into `opt`.
struct ResumePoint {
  int64_t step = 1;  // the first step to run
  LoaderPosition position;
  double best_eval_loss = -1;
  int64_t best_step = 0;
};
ResumePoint checkpoint_resume(const std::string& dir, const nlohmann::json& fingerprint,
                              const std::vector<ParamSpec>& table, ModelOptimizer& opt);
// Restores master, m, v of every parameter of `table` from dir/optimizer.safetensors.
void checkpoint_load_optimizer(const std::string& dir, const std::vector<ParamSpec>& table, ModelOptimizer& opt);

}  // namespace qt
