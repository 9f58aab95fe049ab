// qwentune init-model (--preset NAME | --config config.json) --out DIR [--tokenizer FILE] [--seed N]
//                    [--dtype bf16|f16|f32] [--force]
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "io/hub_cache.h"
#include "model/random_model_dir.h"

namespace qt::cli {

void add_init_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("init-model", "Write a randomly initialized HF model directory (a preset or any config.json)");
  auto o = std::make_shared<RandomModelOptions>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto* preset = cmd->add_option("--preset", o->preset, "tiny, 0.8b, 2b, 4b, 9b or 27b");
  auto* config = cmd->add_option("--config", o->config_json, "a Qwen3.5 config.json (e.g. a real model's, or its hub id) instead of a preset");
  preset->excludes(config);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json, a directory with one or a hub id, to put into the model directory");
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option("--dtype", *dtype, "bf16, f16 or f32")->capture_default_str();
  cmd->add_flag("--force", o->force, "write into a non-empty directory that is not a model directory (its files are kept)");
  cmd->callback([=] {
    QT_CHECK(!o->preset.empty() || !o->config_json.empty(), "init-model needs --preset NAME or --config config.json");
    auto t = dtype_from_user_name(*dtype);
    QT_CHECK(t.has_value(), "--dtype '", *dtype, "' is not one of bf16, f16, f32");
    o->dtype = *t;
    // A hub id (Qwen/Qwen3.5-27B) stands for its snapshot in the local hub cache (io/hub_cache.h).
    if (hub_looks_like_id(o->config_json)) o->config_json = resolve_model_dir(o->config_json) + "/config.json";
    if (hub_looks_like_id(o->tokenizer)) o->tokenizer = resolve_model_dir(o->tokenizer);
    const int64_t n = write_random_model_dir(*o);
    std::printf("wrote %s (%s, %lld parameters)\n", o->out.c_str(),
                o->preset.empty() ? o->config_json.c_str() : ("preset " + o->preset).c_str(), static_cast<long long>(n));
  });
}

}  // namespace qt::cli
