// Supervised fine-tuning loop: data -> packed rows -> forward/backward with gradient accumulation
// to a global batch measured in tokens (loss normalized by the global count of trained tokens) ->
// clipping -> AdamW on fp32 master weights -> schedule; progress line, JSONL metrics, eval loss on a
// held-out split, HF checkpoints (untouched tensors carried through).
//
// Every key, its default, range and meaning: config/config_schema.cpp (`qwentune train
// --config C.yaml --print-config` prints them). The run's directory: train/run_dir.h (one run at a
// time, no mixing with an earlier run), checkpoints: train/checkpoint.h, what it leaves for a
// reader: train/report.h. Exit: train_run returns after a signal (SIGINT / SIGTERM) with the
// checkpoint saved and stop_signal set; the CLI then exits 128 + signal.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data_job.h"
#include "model/lora.h"
#include "ops/backend.h"
#include "ops/cpu/adamw.h"
#include "train/schedule.h"

namespace qt {

struct TrainConfig {
  std::string model;
  std::string output_dir = "out/run";
  DataJob data;
  std::string backend = "auto";
  AdamWConfig adamw;
  LrScheduleConfig schedule;
  std::string schedule_name = "cosine";
  double max_grad_norm = 1.0;
  int64_t global_batch_tokens = 0;
  int64_t epochs = 1;
  int64_t max_steps = 0;
  double eval_fraction = 0.0;
  int64_t eval_every = 0;
  int64_t save_every = 0;
  int64_t log_every = 1;
  uint64_t seed = 0;
  std::string save_dtype = "auto";
  // Checkpoint directory to resume from (its optimizer.safetensors and trainer_state.json), or
  // "auto" for the newest checkpoint-N under output_dir; empty = start fresh.
  std::string resume;
  int64_t save_total_limit = 0;  // keep the newest N checkpoint-N/ (0 = all)
  bool save_best = false;         // keep best/ = the weights of the lowest eval loss
  bool overwrite = false;         // a fresh run may replace an earlier run's outputs (--overwrite)
  bool cuda_graph = true;
  bool deterministic = true;
  BackendOptions cuda;  // train.cuda.* (deterministic above is copied into it at load)
  struct Dist {
    std::string zero = "auto";        // auto | 0 | 1 | 2 | 3
    std::string communicator = "auto";
    double timeout_s = 600;
    bool reduce_bf16 = false;
    bool reshard_after_forward = true;  // ZeRO-3
  } dist;
  std::string activation_checkpointing = "auto";
  std::string precision = "bf16";  // bf16 | fp8 (model/fp8_projections.h)
  bool fp8_lm_head = true;         // precision fp8: the LM head in FP8 too
  std::string method = "full";  // full | lora
  LoraSpec lora;                // train.method lora: the adapters (the lora: section)
  std::string lora_adapter;     // an existing PEFT adapter to continue from ("" = PEFT's init)
  // Steps first..last (1-based, inclusive) run on a ProfiledBackend: the op/layer tables are printed
  // after step `last` and the trace goes to output_dir/profile_trace.json. 0 = off. Set by
  // `train --profile-steps A:B`.
  int64_t profile_first = 0, profile_last = 0;
  // The resolved config (every key, paths absolute) as YAML, for --print-config and config.yaml.
  std::string resolved_yaml;
};

TrainConfig train_config_load(const std::string& path, const std::vector<std::string>& overrides);

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;
  double eval_loss = -1;  // < 0 when there is no eval split
  double tokens_per_second = 0;  // over training time (eval and save time excluded)
  std::string final_dir;
  int stop_signal = 0;  // SIGINT / SIGTERM that stopped the run after saving; 0 = ran to the end
};

TrainSummary train_run(const TrainConfig& cfg);

}  // namespace qt
