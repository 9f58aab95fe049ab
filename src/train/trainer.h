// Supervised fine-tuning loop: data -> packed rows -> forward/backward with gradient accumulation
// to a global batch measured in tokens (loss normalized by the global count of trained tokens) ->
// clipping -> AdamW on fp32 master weights -> schedule; progress line, JSONL metrics, eval loss on a
// held-out split, HF checkpoints (untouched tensors carried through).
//
// YAML (every key can be overridden with --set section.key=value):
//   model: DIR                # HF model directory to start from, or a hub id (Qwen/Qwen3.5-2B[@rev])
//   output_dir: DIR           # checkpoints (DIR/checkpoint-N, DIR/final) and metrics.jsonl
//   data: {...}               # see data/data_job.h
//   train:
//     backend: auto           # auto (cuda when a GPU is present) | cpu | cuda
//     lr: 1e-4                # peak learning rate
//     min_lr_ratio: 0.0       # final lr = min_lr_ratio * lr
//     schedule: cosine        # cosine|linear|constant
//     warmup_steps: 0
//     weight_decay: 0.0       # decoupled; only on matrices (not norms, A_log, dt_bias)
//     beta1: 0.9
//     beta2: 0.999
//     eps: 1e-8
//     max_grad_norm: 1.0      # 0 = no clipping
//     global_batch_tokens: 0  # tokens per optimizer step; 0 = one packed row
//     epochs: 1
//     max_steps: 0            # > 0 stops earlier
//     eval_fraction: 0.0      # held-out share of samples (seeded); not with data.eval_path
//     eval_every: 0           # steps; 0 = only at the end when there is an eval split
//     save_every: 0           # steps; 0 = only the final checkpoint
//     log_every: 1
//     seed: 0
//     save_dtype: auto        # auto (each tensor's dtype in the source) | bf16 | f32
//     resume: ""              # checkpoint dir or "auto" (newest checkpoint-N in output_dir)
//     cuda_graph: true        # CUDA: capture the step once and replay it (false = eager, as --no-graph)
//     deterministic: true     # CUDA: bitwise reproducible steps (attention dQ without atomics);
//                             # false: dQ by fp32 atomics (2B attention backward ~5 % faster)
//     activation_checkpointing: auto  # auto (from free device memory) | none | selective | full
// A checkpoint is an HF model directory plus optimizer.safetensors (fp32 master weights, m, v) and
// trainer_state.json (step, data-loader position); resuming continues exactly where it stopped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data_job.h"
#include "train/optimizer.h"
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
  bool cuda_graph = true;
  bool deterministic = true;
  std::string activation_checkpointing = "auto";
  // Steps first..last (1-based, inclusive) run on a ProfiledBackend: the op/layer tables are printed
  // after step `last` and the trace goes to output_dir/profile_trace.json. 0 = off. Set by
  // `train --profile-steps A:B`.
  int64_t profile_first = 0, profile_last = 0;
};

TrainConfig train_config_load(const std::string& path, const std::vector<std::string>& overrides);

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;
  double eval_loss = -1;  // < 0 when there is no eval split
  double tokens_per_second = 0;
  std::string final_dir;
};

TrainSummary train_run(const TrainConfig& cfg);

}  // namespace qt
