// qwentune init-model --preset NAME --out DIR [--seed N] [--dtype bf16|f32]
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/random_model_dir.h"

namespace qt::cli {

void add_init_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("init-model", "Write a randomly initialized HF model directory for a preset");
  auto preset = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(0);
  auto dtype = std::make_shared<std::string>("bf16");
  cmd->add_option("--preset", *preset, "tiny, 0.8b, 2b, 4b, 9b or 27b")->required();
  cmd->add_option("--out", *out, "output directory")->required();
  cmd->add_option("--seed", *seed, "random seed")->capture_default_str();
  cmd->add_option("--dtype", *dtype, "bf16, f16 or f32")->capture_default_str();
  cmd->callback([=] {
    auto t = dtype_from_user_name(*dtype);
    QT_CHECK(t.has_value(), "--dtype '", *dtype, "' is not one of bf16, f16, f32");
    const int64_t n = write_random_model_dir(*preset, *out, *seed, *t);
    std::printf("wrote %s (preset %s, %lld parameters)\n", out->c_str(), preset->c_str(), static_cast<long long>(n));
  });
}

}  // namespace qt::cli
