// qwentune bench --preset NAME [--backend auto|cpu|cuda] [--steps N] [--warmup N]
//                [--tokens-per-batch N] [--seed N]
// End-to-end training throughput on a random-init model: synthetic chat-like length mix packed
// into rows of exactly tokens_per_batch tokens, forward + backward + AdamW per step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/flops.h"
#include "model/init.h"
#include "model/presets.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "train/model_optimizer.h"
#ifdef QT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace qt::cli {
namespace {

// Chat-like sample lengths (log-normal around ~700 tokens, 32..3000), filling `total` exactly.
std::vector<int64_t> chat_like_lengths(int64_t total, std::mt19937_64& rng) {
  std::lognormal_distribution<double> dist(6.5, 0.6);
  std::vector<int64_t> out;
  for (int64_t left = total; left > 0;) {
    const int64_t n = std::min<int64_t>(left, std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 32, 3000));
    out.push_back(n);
    left -= n;
  }
  return out;
}

struct BenchArgs {
  std::string preset = "2b", backend = "auto";
  int64_t steps = 5, warmup = 2, tokens_per_batch = 8192;
  uint64_t seed = 0;
};

void run_bench(const BenchArgs& a) {
  const ModelConfig cfg = preset_config(a.preset);
  const std::string backend_name = a.backend == "auto" ? default_backend_name() : a.backend;
  auto be = make_backend(backend_name);
  Qwen35Model model(cfg, *be, a.tokens_per_batch);
  const auto t_init = std::chrono::steady_clock::now();
  for (size_t i = 0; i < model.specs().size(); ++i) {
    std::vector<float> w(static_cast<size_t>(shape_numel(model.specs()[i].shape)));
    init_param(model.specs()[i], cfg.initializer_range, a.seed, DType::F32, w.data());
    model.set_param_f32(i, w);
  }
  AdamWConfig adamw;
  adamw.lr = 1e-5;
  auto opt = ModelOptimizer::create(model, adamw);
  log_info("memory plan: ", model.memory_plan().describe());
  log_info("bench: ", a.preset, " on ", be->name(), ", ", param_count(cfg), " parameters, init ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count(), " s");
  std::mt19937_64 rng(a.seed);
  std::vector<double> times;
  double flops = 0, dense_flops = 0;
  int64_t trained = 0, tokens = 0;
  double loss = 0;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    const std::vector<int64_t> lens = chat_like_lengths(a.tokens_per_batch, rng);
    PackedRow row;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(std::min<int64_t>(cfg.vocab_size, 248000) - 1));
    for (int64_t n : lens) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (auto& x : ids) x = tok(rng);
      std::vector<int32_t> labels = ids;
      labels[0] = -100;
      row.append_sample(ids, labels);
    }
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grads();
    const LossResult r = model.step(row, true, 1.0 / double(row.num_trained()));
    opt->step(adamw.lr, 1.0, s + 1);  // synchronizes: it reads the gradient norm back
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss = r.loss_sum / double(r.num_trained);
    log_info("bench step ", s + 1, (s < a.warmup ? " (warmup)" : ""), ": ", dt, " s, loss ", loss);
    if (s < a.warmup) continue;
    times.push_back(dt);
    const StepFlops f = step_flops(cfg, lens);
    flops += f.total();
    dense_flops += f.dense;
    trained += r.num_trained;
    tokens += row.num_tokens();
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], total = [&] { double t = 0; for (double x : times) t += x; return t; }();
  const double peak = 790e12;  // measured bf16 dense matmul rate of the H200 (KINDS.md)
  nlohmann::ordered_json j;
  j["engine"] = "qwentune";
  j["preset"] = a.preset;
  j["backend"] = be->name();
  j["params"] = param_count(cfg);
  j["tokens_per_batch"] = a.tokens_per_batch;
  j["steps"] = a.steps;
  j["median_step_s"] = median;
  j["tokens_per_s"] = double(tokens) / total;
  j["trained_tokens_per_s"] = double(trained) / total;
  j["mfu_6nd"] = dense_flops / total / peak;
  j["mfu_with_mixers"] = flops / total / peak;
  j["graph"] = "none (eager launches)";
  j["plan_mib"] = {{"weights", double(model.memory_plan().weights) / (1 << 20)},
                   {"grads", double(model.memory_plan().grads) / (1 << 20)},
                   {"activations", double(model.memory_plan().activations) / (1 << 20)},
                   {"scratch", double(model.memory_plan().scratch) / (1 << 20)}};
  j["loss"] = loss;
#ifdef QT_HAVE_CUDA
  if (std::string(be->name()) == "cuda") {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    j["device_mem_used_gib"] = double(total_b - free_b) / double(1ull << 30);
  }
#endif
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "End-to-end training throughput on a random-init preset");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--preset", a->preset, "tiny, 0.8b, 2b, 4b, 9b, 27b")->capture_default_str();
  cmd->add_option("--backend", a->backend, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--steps", a->steps, "timed steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--tokens-per-batch", a->tokens_per_batch, "tokens per packed row")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "")->capture_default_str();
  cmd->callback([=] { run_bench(*a); });
}

}  // namespace qt::cli
