// qwentune bench --preset NAME [--backend auto|cpu|cuda] [--steps N] [--warmup N]
//                [--tokens-per-batch N] [--seed N] [--no-graph] [--checkpointing auto|none|selective|full]
//                [--precision bf16|fp8] [--fp8-lm-head true|false]
//                [--lengths chat|whole-row]
// End-to-end training throughput on a random-init model: synthetic chat-like length mix (or, with
// --lengths whole-row, one sample per row: long-context fine-tuning) packed into rows of exactly
// tokens_per_batch tokens, forward + backward + AdamW per step, run by the
// trainer's TrainStep (on CUDA: one CUDA-graph launch per step after the first).
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
#include "dist/communicator.h"
#include "model/presets.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "train/model_optimizer.h"
#include "train/train_step.h"

namespace qt::cli {
namespace {

struct BenchArgs {
  std::string preset = "2b", backend = "auto";
  int64_t steps = 5, warmup = 2, tokens_per_batch = 8192;
  uint64_t seed = 0;
  bool no_graph = false;
  bool no_gemm_tune = false;  // = train.cuda.gemm_tune: false
  std::string checkpointing = "auto";
  std::string precision = "bf16";  // = train.precision
  bool fp8_lm_head = true;         // = train.fp8_lm_head
  std::string lengths = "chat";
  std::string method = "full";  // full | lora (lora_r, all projections, alpha = 2 r)
  int64_t lora_r = 16;
  double lora_dropout = 0.0;
  int zero = 0;                  // 3: ZeRO-3's sharding machinery at world size 1 (its overhead)
  bool keep_gathered = false;    // ZeRO-3 with dist.reshard_after_forward: false
};

void run_bench(const BenchArgs& a) {
  const ModelConfig cfg = preset_config(a.preset);
  const std::string backend_name = a.backend == "auto" ? default_backend_name() : a.backend;
  BackendOptions opts;
  opts.gemm_tune = !a.no_gemm_tune;
  auto be = make_backend(backend_name, opts);
  // Rows first: their sample counts bound the static shape (and the kept GDN state).
  std::mt19937_64 rng(a.seed);
  std::vector<PackedRow> rows;
  std::vector<std::vector<int64_t>> row_lens;
  int max_samples = 1;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    row_lens.push_back(a.lengths == "whole-row" ? std::vector<int64_t>{a.tokens_per_batch}
                                                : chat_like_lengths(a.tokens_per_batch, rng));
    PackedRow row;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(std::min<int64_t>(cfg.vocab_size, 248000) - 1));
    for (int64_t n : row_lens.back()) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (auto& x : ids) x = tok(rng);
      std::vector<int32_t> labels = ids;
      labels[0] = -100;
      row.append_sample(ids, labels);
    }
    max_samples = std::max(max_samples, static_cast<int>(row_lens.back().size()));
    rows.push_back(std::move(row));
  }
  const int static_max_seqs = static_sample_bound(max_samples);
  const bool lora = a.method == "lora";
  LoraSpec spec;
  spec.r = a.lora_r;
  spec.alpha = 2.0 * double(a.lora_r);
  spec.targets = lora_all_targets();
  spec.dropout = a.lora_dropout;
  int64_t adapter_params = 0;
  if (lora)
    for (const ParamSpec& p : lora_param_table(cfg, spec)) adapter_params += shape_numel(p.shape);
  const Checkpointing ckpt = resolve_checkpointing(a.checkpointing, cfg, *be, a.tokens_per_batch, static_max_seqs,
                                                   lora ? adapter_params : -1, a.zero == 3 ? 1 : 0,
                                                   precision_from_name(a.precision), a.fp8_lm_head);
  QT_CHECK(a.zero == 0 || a.zero == 3, "bench --zero ", a.zero, ": 0 or 3 (one rank)");
  QT_CHECK(a.zero == 0 || !lora, "bench --zero 3 shards full fine-tuning (not --method lora)");
  const std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, *be, "auto", 600);
  Zero3Options zero3;
  zero3.comm = comm.get();
  zero3.reshard_after_forward = !a.keep_gathered;
  Qwen35Model model(cfg, *be, a.tokens_per_batch, ckpt, lora ? &spec : nullptr, a.zero == 3 ? &zero3 : nullptr);
  model.set_precision(precision_from_name(a.precision), a.fp8_lm_head);
  const auto t_init = std::chrono::steady_clock::now();
  for (size_t i = 0; i < model.base_specs().size(); ++i) {
    std::vector<float> w(static_cast<size_t>(shape_numel(model.base_specs()[i].shape)));
    init_param(model.base_specs()[i], cfg.initializer_range, a.seed, DType::F32, w.data());
    model.set_base_param_f32(i, w);
  }
  if (lora)
    for (size_t i = 0; i < model.specs().size(); ++i) {
      std::vector<float> w(static_cast<size_t>(shape_numel(model.specs()[i].shape)));
      // B gets small random values (PEFT starts it at zero) so the bench's numbers are those of
      // a run in progress; the work per step is the same.
      ParamSpec p = model.specs()[i];
      if (p.init == ParamInit::Zeros) p.init = ParamInit::KaimingUniform;
      init_param(p, 0.0, a.seed + 1, DType::F32, w.data());
      model.set_param_f32(i, w);
    }
  AdamWConfig adamw;
  adamw.lr = 1e-5;
  auto opt = ModelOptimizer::create(model, adamw);
  log_info("bench: ", a.preset, " on ", be->name(), ", ", param_count(cfg), " parameters, init ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count(), " s");
  TrainStep stepper(model, *opt, 1, static_max_seqs, !a.no_graph);
  log_info("memory plan: ", model.memory_plan().describe());
  std::vector<double> times, host_ms;
  double flops = 0, dense_flops = 0;
  int64_t trained = 0, tokens = 0;
  double loss = 0;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = stepper.run({rows[static_cast<size_t>(s)]}, adamw.lr, 1.0, s + 1);  // waits for the GPU
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss = r.loss_sum / double(r.trained);
    log_info("bench step ", s + 1, (s < a.warmup ? " (warmup)" : ""), ": ", dt, " s, loss ", loss,
             r.replayed ? " (graph replay)" : "", ", host ", r.host_ms, " ms");
    if (s == 0) log_info("memory after the first step: ", stepper.memory_report());
    if (s < a.warmup) continue;
    times.push_back(dt);
    host_ms.push_back(r.host_ms);
    StepFlops f = step_flops(cfg, row_lens[static_cast<size_t>(s)]);
    if (lora) {
      // Frozen base: forward 2N and backward dX 2N per token, no dW; the adapters 6 per parameter
      // (forward 2, backward dB, dt, dA, dX 4). Recomputation is not counted, as for full SFT.
      const double tok = double(r.tokens);
      f.dense = 4.0 * double(param_count(cfg)) * tok + 6.0 * double(adapter_params) * tok;
    }
    flops += f.total();
    dense_flops += f.dense;
    trained += r.trained;
    tokens += r.tokens;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], total = [&] { double t = 0; for (double x : times) t += x; return t; }();
  const double peak = kPeakBf16FlopsPerSecond;
  nlohmann::ordered_json j;
  j["engine"] = "qwentune";
  j["preset"] = a.preset;
  j["backend"] = be->name();
  j["params"] = param_count(cfg);
  j["method"] = a.method;
  j["zero"] = a.zero;
  if (a.zero == 3) j["reshard_after_forward"] = !a.keep_gathered;
  if (lora) {
    j["lora_r"] = a.lora_r;
    j["lora_dropout"] = a.lora_dropout;
    j["trainable_params"] = adapter_params;
  }
  j["tokens_per_batch"] = a.tokens_per_batch;
  j["lengths"] = a.lengths;
  j["steps"] = a.steps;
  j["median_step_s"] = median;
  j["tokens_per_s"] = double(tokens) / total;
  j["trained_tokens_per_s"] = double(trained) / total;
  j[lora ? "mfu_dense" : "mfu_6nd"] = dense_flops / total / peak;
  j["mfu_with_mixers"] = flops / total / peak;
  j["checkpointing"] = checkpointing_name(ckpt);
  j["precision"] = precision_name(model.precision());
  j["fp8_lm_head"] = model.fp8_head();
  j["step_mode"] = stepper.mode();
  j["graph_captures"] = stepper.captures();
  j["kernels_per_step"] = stepper.graph_kernels();  // kernel nodes of the captured graph (0: eager)
  j["graph_nodes"] = stepper.graph_nodes();
  j["launches_per_step"] = stepper.captures() > 0 ? 1 : -1;  // -1: eager (one launch per kernel)
  std::sort(host_ms.begin(), host_ms.end());
  j["host_ms_per_step"] = host_ms.empty() ? 0.0 : host_ms[host_ms.size() / 2];
  j["plan_mib"] = {{"weights", double(model.memory_plan().weights) / (1 << 20)},
                   {"grads", double(model.memory_plan().grads) / (1 << 20)},
                   {"activations", double(model.memory_plan().activations) / (1 << 20)},
                   {"scratch", double(model.memory_plan().scratch) / (1 << 20)},
                   {"gdn_state", double(model.memory_plan().mixer_state) / (1 << 20)}};
  j["gdn_kept"] = model.memory_plan().mixer_kept;
  j["loss"] = loss;
  if (std::string(be->name()) == "cuda") j["device_mem_used_gib"] = stepper.device_memory_gib();
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
  cmd->add_option("--lengths", a->lengths, "sample lengths: chat (a chat-like mix) or whole-row (one sample per row)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chat", "whole-row"}));
  cmd->add_flag("--no-graph", a->no_graph, "CUDA: launch every kernel eagerly instead of replaying a captured graph");
  cmd->add_flag("--no-gemm-tune", a->no_gemm_tune, "CUDA: keep cuBLASLt's first heuristic per GEMM shape (= train.cuda.gemm_tune: false)");
  cmd->add_option("--checkpointing", a->checkpointing, "activation checkpointing: auto, none, selective, full")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "selective", "full"}));
  cmd->add_option("--precision", a->precision, "bf16, or fp8 projections (= train.precision)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--fp8-lm-head", a->fp8_lm_head, "with --precision fp8: the LM head in FP8 too (= train.fp8_lm_head)")
      ->capture_default_str();
  cmd->add_option("--method", a->method, "full fine-tuning or LoRA on every projection (frozen base)")
      ->capture_default_str()
      ->check(CLI::IsMember({"full", "lora"}));
  cmd->add_option("--zero", a->zero, "0, or 3: ZeRO-3's gathers and reduce-scatters at one rank (their cost)")
      ->capture_default_str();
  cmd->add_flag("--keep-gathered", a->keep_gathered, "ZeRO-3: gather each layer once per step (dist.reshard_after_forward: false)");
  cmd->add_option("--lora-r", a->lora_r, "LoRA rank (alpha = 2 r)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--lora-dropout", a->lora_dropout, "LoRA dropout on the adapters' inputs")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->callback([=] { run_bench(*a); });
}

}  // namespace qt::cli
