// train_config_load: the YAML config of `qwentune train`, checked against config/config_schema
// (types, ranges, unknown and duplicated keys) and read into a TrainConfig.
#include <filesystem>

#include "config/config_schema.h"
#include "core/error.h"
#include "core/log.h"
#include "data/data_job.h"
#include "io/hub_cache.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "train/trainer.h"

namespace qt {
namespace fs = std::filesystem;

TrainConfig train_config_load(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root = yaml_load_file(path);
  yaml_apply_overrides(root, overrides);
  const ConfigSource src{path, overrides};
  config_validate(root, src);
  TrainConfig c;
  const fs::path base = fs::path(path).parent_path();
  auto rel = [&](const std::string& p) { return fs::path(p).is_absolute() || base.empty() ? p : (base / p).string(); };
  QT_CHECK(root["model"] && !root["model"].IsNull(), path, ": needs `model: DIR` (the model to fine-tune)");
  c.model = config_relative_path(path, root["model"].as<std::string>());  // a hub id stays an id
  c.output_dir = rel(config_get<std::string>(root, "", "output_dir", path));
  c.data = data_job_from_yaml(root, path);
  const YAML::Node t = root["train"];
  auto get_s = [&](const char* k) { return config_get<std::string>(t, "train", k, path); };
  auto get_d = [&](const char* k) { return config_get<double>(t, "train", k, path); };
  auto get_i = [&](const char* k) { return config_get<int64_t>(t, "train", k, path); };
  auto get_b = [&](const char* k) { return config_get<bool>(t, "train", k, path); };
  c.backend = get_s("backend");
  c.adamw.lr = get_d("lr");
  c.schedule.min_lr_ratio = get_d("min_lr_ratio");
  c.schedule_name = get_s("schedule");
  c.schedule.kind = lr_schedule_from_name(c.schedule_name);
  c.schedule.warmup_steps = get_i("warmup_steps");
  c.adamw.weight_decay = get_d("weight_decay");
  c.adamw.beta1 = get_d("beta1");
  c.adamw.beta2 = get_d("beta2");
  c.adamw.eps = get_d("eps");
  c.max_grad_norm = get_d("max_grad_norm");
  c.global_batch_tokens = get_i("global_batch_tokens");
  c.epochs = get_i("epochs");
  c.max_steps = get_i("max_steps");
  c.eval_fraction = get_d("eval_fraction");
  c.eval_every = get_i("eval_every");
  c.save_every = get_i("save_every");
  c.save_total_limit = get_i("save_total_limit");
  c.save_best = get_b("save_best");
  c.log_every = get_i("log_every");
  c.seed = config_get<uint64_t>(t, "train", "seed", path);
  c.save_dtype = get_s("save_dtype");
  c.resume = get_s("resume");
  c.cuda_graph = get_b("cuda_graph");
  c.deterministic = get_b("deterministic");
  const YAML::Node tc = t && t.IsMap() ? t["cuda"] : YAML::Node();
  c.cuda.gemm_tune = config_get<bool>(tc, "train.cuda", "gemm_tune", path);
  c.cuda.gemm_candidates = config_get<int>(tc, "train.cuda", "gemm_candidates", path);
  c.cuda.arena_mib = config_get<int64_t>(tc, "train.cuda", "arena_mib", path);
  c.cuda.deterministic = c.deterministic;
  const YAML::Node d = root["dist"];
  c.dist.zero = config_get<std::string>(d, "dist", "zero", path);
  c.dist.communicator = config_get<std::string>(d, "dist", "communicator", path);
  c.dist.timeout_s = config_get<double>(d, "dist", "timeout_s", path);
  c.dist.reduce_bf16 = config_get<std::string>(d, "dist", "reduce_dtype", path) == "bf16";
  c.dist.reshard_after_forward = config_get<bool>(d, "dist", "reshard_after_forward", path);
  c.activation_checkpointing = get_s("activation_checkpointing");
  c.precision = get_s("precision");
  c.fp8_lm_head = get_b("fp8_lm_head");
  c.method = get_s("method");
  const YAML::Node lo = root["lora"];
  if (c.method == "lora") {
    c.lora.r = config_get<int64_t>(lo, "lora", "r", path);
    c.lora.alpha = config_get<double>(lo, "lora", "alpha", path);
    c.lora.rslora = config_get<bool>(lo, "lora", "rslora", path);
    c.lora.dropout = config_get<double>(lo, "lora", "dropout", path);
    c.lora.targets = config_get<std::vector<std::string>>(lo, "lora", "targets", path);
    c.lora.modules_to_save = config_get<std::vector<std::string>>(lo, "lora", "modules_to_save", path);
    lora_validate(c.lora);
    const std::string adapter = config_get<std::string>(lo, "lora", "adapter", path);
    if (!adapter.empty()) c.lora_adapter = rel(adapter);
  } else {
    // A lora: section that says more than the defaults (a resolved config lists them all) is
    // probably meant: say that it is not used.
    if (lo && lo.IsMap())
      for (const auto& kv : lo) {
        const ConfigKey* k = config_key("lora", kv.first.as<std::string>());
        if (k && !kv.second.IsNull() && (!k->def || YAML::Dump(kv.second) != YAML::Dump(YAML::Load(k->def)))) {
          log_warn(path, ": lora.", k->name, " is set but train.method is '", c.method,
                   "': the lora: section is not used (set train.method: lora to train adapters)");
          break;
        }
      }
  }
  if (!c.resume.empty() && c.resume != "auto") c.resume = rel(c.resume);
  if (c.backend == "auto") c.backend = default_backend_name();
  QT_CHECK(c.backend == "cpu" || c.backend == "cuda", path, ": train.backend '", c.backend, "' is not auto, cpu or cuda");
  QT_CHECK(c.eval_fraction == 0 || c.data.eval_data.empty(), path,
           ": train.eval_fraction and data.eval_path / data.eval_split both choose an eval set; use one");
  QT_CHECK(!c.save_best || c.eval_fraction > 0 || !c.data.eval_data.empty(), path,
           ": train.save_best needs an eval set (train.eval_fraction > 0 or data.eval_path / eval_split) to rank "
           "checkpoints by eval loss");

  // The resolved config: every key, paths absolute, for --print-config and output_dir/config.yaml.
  // Hub ids are kept as written (they resolve where they are used).
  auto absolute = [](const std::string& p) { return hub_looks_like_id(p) ? p : fs::absolute(p).lexically_normal().string(); };
  YAML::Node resolved = YAML::Clone(root);
  resolved["model"] = absolute(c.model);
  resolved["output_dir"] = absolute(c.output_dir);
  if (resolved["tokenizer"]) resolved["tokenizer"] = absolute(c.data.tokenizer);
  auto path_list = [&](const std::vector<std::string>& specs) {
    YAML::Node paths(YAML::NodeType::Sequence);
    for (const auto& p : specs) paths.push_back(absolute(p));
    return paths.size() == 1 ? paths[0] : paths;
  };
  resolved["data"]["path"] = path_list(c.data.data);
  if (resolved["data"]["eval_path"]) resolved["data"]["eval_path"] = path_list(c.data.eval_data);
  if (!c.data.cache_dir.empty()) resolved["data"]["cache_dir"] = absolute(c.data.cache_dir);
  if (!c.resume.empty() && c.resume != "auto") resolved["train"]["resume"] = fs::absolute(c.resume).string();
  resolved["train"]["backend"] = c.backend;
  if (!c.lora_adapter.empty()) resolved["lora"]["adapter"] = fs::absolute(c.lora_adapter).lexically_normal().string();
  c.resolved_yaml = config_to_yaml(resolved);
  return c;
}

}  // namespace qt
