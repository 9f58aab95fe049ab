// qwentune plan: per-GPU memory and a step-time estimate for training a model on N GPUs with a
// ZeRO stage, before any GPU is touched. Memory: bf16 weights, fp32 gradients, fp32 master + m + v
// (each sharded by the stage: 1 the optimizer state, 2 also the gradients, 3 also the weights, which
// then need two gathered layer buffers and a reduce-scatter bucket), the activations of the
// checkpointing policy (activation_bytes, plus the gated delta rule's kept forward state under
// none), gradient scratch and a 4 GiB workspace reserve. Time: the step's FLOPs (model/flops.h, a
// chat-like length mix) at a stated compute efficiency, and ZeRO's collective bytes at a stated bus
// bandwidth, overlapped (the design prefetches one layer ahead): step = max(compute, communication).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/lora.h"
#include "model/qwen35.h"

namespace qt {

struct PlanRequest {
  int gpus = 1;
  int zero = -1;                   // 0..3; -1 = the smallest stage that fits gpu_mem_gib
  int64_t tokens_per_batch = 8192;  // per GPU
  std::string checkpointing = "auto";  // auto = the cheapest policy that fits
  const LoraSpec* lora = nullptr;  // LoRA: only the adapters carry gradients and optimizer state
  double busbw_gbs = 370;          // all-gather / reduce-scatter bus bandwidth (8 x H100/H200 NVLink ring)
  double compute_efficiency = 0.6;  // of the bf16 peak the GEMM-dominated step reaches (one H200: ~60 %)
  double gpu_mem_gib = 139;        // what "fits" means for auto choices (an H200's usable memory)
};

struct PlanPart {
  const char* name;
  int64_t bytes;
};

struct Plan {
  int zero = 0;
  Checkpointing checkpointing = Checkpointing::None;
  std::vector<PlanPart> parts;  // per GPU
  int64_t total_bytes = 0;
  bool fits_80 = false, fits_141 = false;
  double flops = 0, compute_s = 0, comm_bytes = 0, comm_s = 0, step_s = 0, tokens_per_s = 0, mfu = 0;
  std::string why;  // how zero and checkpointing were chosen
};

Plan plan_training(const ModelConfig& cfg, const PlanRequest& req);
nlohmann::ordered_json plan_json(const Plan& p, const PlanRequest& req);
std::string plan_table(const Plan& p, const PlanRequest& req);

}  // namespace qt
