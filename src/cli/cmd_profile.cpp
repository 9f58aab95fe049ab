// qwentune profile --model DIR [--backend cpu|cuda] [--steps N] [--warmup N] [--tokens-per-batch N]
//                  [--top N] [--trace FILE.json] [--data FILE|DIR] [--seed N] [--precision bf16|fp8] [--fp8-lm-head B]    (backend auto: cuda if present)
// Runs training steps (forward + backward + optimizer, the trainer's arithmetic) on synthetic
// chat-like packed rows, or on --data packed like `train` does, with the model on a
// ProfiledBackend; prints the op table (sorted by device time), the per-layer table and per-step
// figures, and optionally writes a Chrome trace (open it in https://ui.perfetto.dev).
#include <cmath>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "data/data_job.h"
#include "data/packer.h"
#include "data/token_cache.h"
#include "model/hf_checkpoint.h"
#include "model/params.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "train/step_runner.h"
#include "profile/profiled_backend.h"
#include "text/tokenizer.h"

namespace qt::cli {
namespace {

struct ProfileJob {
  std::string model, backend = "cpu", trace, data, precision = "bf16";
  int64_t steps = 5, warmup = 1, tokens_per_batch = 1024, top = 20;
  uint64_t seed = 0;
  bool fp8_lm_head = true;  // = train.fp8_lm_head
};

std::vector<PackedRow> rows_from_data(const ProfileJob& job, int64_t vocab) {
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(job.model));
  DataOptions opts;
  opts.read.vocab_size = vocab;
  const TokenizeResult tr = tokenize_dataset({job.data}, tok, opts, "", 0);
  PackOptions pack;
  pack.tokens_per_batch = job.tokens_per_batch;
  pack.seed = job.seed;
  if (const auto pad = tok.token_to_id("<|endoftext|>")) pack.pad_id = *pad;
  const PackPlan plan = pack_plan(tr.data, pack, 0);
  QT_CHECK(!plan.bins.empty(), job.data, ": no trainable samples");
  std::vector<PackedRow> rows;
  for (const PackedBin& bin : plan.bins) {
    const Batch b = pack_materialize(tr.data, bin, pack);
    PackedRow r;
    r.input_ids = b.input_ids;
    r.targets = b.targets;
    r.positions = b.position_ids;
    r.cu_seqlens = b.cu_seqlens;
    rows.push_back(std::move(r));
    if (static_cast<int64_t>(rows.size()) >= job.warmup + job.steps) break;
  }
  return rows;
}

void run_profile(const ProfileJob& job) {
  std::unique_ptr<Backend> raw = make_backend(job.backend == "auto" ? default_backend_name() : job.backend);
  const HfModelDir dir = hf_load(job.model);
  const ModelConfig& cfg = dir.config;
  const std::vector<PackedRow> rows =
      job.data.empty() ? synthetic_chat_rows(cfg.vocab_size, job.tokens_per_batch, job.warmup + job.steps, job.seed)
                       : rows_from_data(job, cfg.vocab_size);
  ProfiledBackend be(*raw);
  Qwen35Model model(cfg, be, job.tokens_per_batch);
  model.set_precision(precision_from_name(job.precision), job.fp8_lm_head);
  model.load(dir);
  TrainStepRunner runner(model);
  profile::Profiler& prof = be.profiler();
  int64_t samples = 0;
  for (const PackedRow& r : rows) samples += static_cast<int64_t>(r.cu_seqlens.size()) - 1;
  std::printf("qwentune profile: %s (%lld parameters, %lld layers), backend %s, %lld tokens per row (%s, %.1f samples/row), "
              "%lld warmup + %lld profiled steps\n\n",
              job.model.c_str(), static_cast<long long>(param_count(cfg)), static_cast<long long>(cfg.num_hidden_layers),
              be.name(), static_cast<long long>(job.tokens_per_batch), job.data.empty() ? "synthetic chat-like rows" : job.data.c_str(),
              double(samples) / double(rows.size()), static_cast<long long>(job.warmup), static_cast<long long>(job.steps));
  std::fflush(stdout);
  double loss = 0;
  for (int64_t s = 1; s <= job.warmup + job.steps; ++s) {
    prof.set_enabled(s > job.warmup);
    prof.begin_step(s);
    loss = runner.step(rows[static_cast<size_t>(s - 1) % rows.size()]);
    prof.end_step();
  }
  QT_CHECK(std::isfinite(loss), "profile: the loss became ", loss);
  std::printf("%s", prof.report(static_cast<int>(job.top)).c_str());
  if (!job.trace.empty()) {
    prof.write_trace(job.trace);
    std::printf("\ntrace: %s (open in https://ui.perfetto.dev)\n", job.trace.c_str());
  }
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "Profile training steps: per-op and per-layer CPU/device time, Chrome trace");
  auto job = std::make_shared<ProfileJob>();
  cmd->add_option("--model", job->model, "HF model directory or hub id (Qwen/Qwen3.5-2B[@rev])")->required();
  cmd->add_option("--backend", job->backend, "cpu|cuda|auto")->capture_default_str();
  cmd->add_option("--steps", job->steps, "profiled training steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", job->warmup, "unprofiled steps first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--tokens-per-batch", job->tokens_per_batch, "tokens per packed row")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  cmd->add_option("--top", job->top, "ops in the table (0 = all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--trace", job->trace, "write a Chrome trace JSON (Perfetto) here");
  cmd->add_option("--data", job->data, "data file or directory (as `train` reads it) instead of synthetic rows");
  cmd->add_option("--precision", job->precision, "bf16, or fp8 projections (= train.precision)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--fp8-lm-head", job->fp8_lm_head, "with --precision fp8: the LM head in FP8 too (= train.fp8_lm_head)")
      ->capture_default_str();
  cmd->add_option("--seed", job->seed, "seed of the synthetic rows / packing")->capture_default_str();
  cmd->callback([=] { run_profile(*job); });
}

}  // namespace qt::cli
