// qwentune plan (--preset NAME | --model DIR) [--gpus N] [--zero auto|0..3] [--tokens-per-batch T]
//               [--checkpointing auto|none|selective|full] [--method full|lora] [--busbw GB/s] [--json]
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/hf_checkpoint.h"
#include "model/plan.h"
#include "model/presets.h"

namespace qt::cli {

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Per-GPU memory and a step-time estimate for a model, GPU count and ZeRO stage");
  auto preset = std::make_shared<std::string>(), model = std::make_shared<std::string>();
  auto zero = std::make_shared<std::string>("auto"), method = std::make_shared<std::string>("full");
  auto req = std::make_shared<PlanRequest>();
  auto json = std::make_shared<bool>(false);
  auto lora_r = std::make_shared<int64_t>(16);
  auto* p = cmd->add_option("--preset", *preset, "tiny, 0.8b, 2b, 4b, 9b, 27b");
  auto* m = cmd->add_option("--model", *model, "an HF model directory or hub id (its config.json)");
  p->excludes(m);
  cmd->add_option("--gpus", req->gpus, "GPUs")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--zero", *zero, "auto (the smallest stage that fits) or 0, 1, 2, 3")->capture_default_str()
      ->check(CLI::IsMember({"auto", "0", "1", "2", "3"}));
  cmd->add_option("--tokens-per-batch", req->tokens_per_batch, "tokens per packed row per GPU")->capture_default_str();
  cmd->add_option("--checkpointing", req->checkpointing, "auto, none, selective, full")->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "selective", "full"}));
  cmd->add_option("--method", *method, "full or lora (r 16, alpha 32, every projection)")->capture_default_str()
      ->check(CLI::IsMember({"full", "lora"}));
  cmd->add_option("--lora-r", *lora_r, "LoRA rank")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--busbw", req->busbw_gbs, "collective bus bandwidth, GB/s")->capture_default_str();
  cmd->add_option("--efficiency", req->compute_efficiency, "fraction of the bf16 peak the step's compute reaches")
      ->capture_default_str();
  cmd->add_option("--gpu-mem-gib", req->gpu_mem_gib, "memory per GPU the auto choices must fit")->capture_default_str();
  cmd->add_flag("--json", *json, "one JSON object instead of the table");
  cmd->callback([=] {
    QT_CHECK(!preset->empty() || !model->empty(), "plan needs --preset NAME or --model DIR");
    const ModelConfig cfg = preset->empty() ? hf_load(*model).config : preset_config(*preset);
    PlanRequest r = *req;
    r.zero = *zero == "auto" ? -1 : std::stoi(*zero);
    LoraSpec lora;
    lora.r = *lora_r;
    lora.alpha = 2.0 * double(*lora_r);
    lora.targets = lora_all_targets();
    if (*method == "lora") r.lora = &lora;
    const Plan plan = plan_training(cfg, r);
    if (*json) std::printf("%s\n", plan_json(plan, r).dump().c_str());
    else std::fputs(plan_table(plan, r).c_str(), stdout);
  });
}

}  // namespace qt::cli
