#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "io/peft_adapter.h"
#include "data/loader.h"
#include "dist/communicator.h"
#include "dist/launch_env.h"
#include "model/hf_checkpoint.h"
#include "io/hub_cache.h"
#include "io/mapped_file.h"
#include "model/flops.h"
#include "model/plan.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "profile/step_window.h"
#include "profile/profiled_backend.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/metrics_log.h"
#include "train/model_optimizer.h"
#include "train/report.h"
#include "train/run_dir.h"
#include "train/sharded_optimizer.h"
#include "train/tensorboard.h"
#include "train/train_step.h"

namespace qt {
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Splits samples into train / eval by a seeded hash of the sample index (stable under reordering
// of the config, independent of thread counts).
void split_dataset(const TokenizedDataset& all, double eval_fraction, uint64_t seed, TokenizedDataset& train,
                   TokenizedDataset& eval) {
  for (int64_t i = 0; i < all.num_samples(); ++i) {
    uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull ^ (seed * 0xbf58476d1ce4e5b9ull);
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    const double u = static_cast<double>(h >> 11) / 9007199254740992.0;
    const auto b = all.offsets[static_cast<size_t>(i)], e = all.offsets[static_cast<size_t>(i) + 1];
    const std::vector<int32_t> ids(all.input_ids.begin() + b, all.input_ids.begin() + e);
    const std::vector<int32_t> labels(all.labels.begin() + b, all.labels.begin() + e);
    (u < eval_fraction ? eval : train).add(ids, labels);
  }
}

PackedRow to_row(const Batch& b) {
  QT_CHECK(b.rows == 1, "trainer expects packed batches (one row)");
  PackedRow r;
  r.input_ids = b.input_ids;
  r.targets = b.targets;
  r.positions = b.position_ids;
  r.cu_seqlens = b.cu_seqlens;
  return r;
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

int64_t untrained_samples(const TokenizedDataset& d) {
  int64_t n = 0;
  for (int64_t i = 0; i < d.num_samples(); ++i) {
    bool any = false;
    for (int64_t t = d.offsets[size_t(i)]; t < d.offsets[size_t(i) + 1] && !any; ++t) any = d.labels[size_t(t)] != kIgnoreLabel;
    n += !any;
  }
  return n;
}

// The counts data-stats reports, for the train log and the error when nothing is left to train.
std::string data_report(const TokenizeResult& tr, const PackStats& st, int64_t untrained, const PackOptions& pack) {
  return str(tr.read_stats.rows, " rows read, ", tr.read_stats.bad_rows, " bad rows skipped, ", tr.data.num_samples(),
             " samples (", untrained, " with no trained token); packing at ", pack.tokens_per_batch,
             " tokens per row: ", st.truncated, " truncated (", st.truncated_tokens, " tokens cut), ", st.split,
             " split, ", st.dropped_untrained, " samples or pieces dropped with no trained token left, ",
             st.trained_targets, " trained tokens");
}

struct Run {
  const TrainConfig& cfg;
  RankInfo rank;  // this process in the job (rank 0 of 1 when no launcher started it)
  HfModelDir src;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  int zero = 0;  // the ZeRO stage this run uses
  std::unique_ptr<ProfiledBackend> profiled;  // wraps backend when steps are profiled
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<ModelOptimizer> optimizer;
  TrainerState state;  // step, loader position, fingerprint, best eval: what the next save records

  explicit Run(const TrainConfig& c, const RankInfo& r)
      : cfg(c), rank(r), src(hf_load(c.model)), backend(make_backend(c.backend, options_for(c, r))),
        comm(make_communicator(r, *backend, c.dist.communicator, c.dist.timeout_s)) {}
  bool first() const { return rank.rank == 0; }  // the rank that prints and writes the run's files

  // The rank's GPU is its local rank; ranks on the MPI communicator (host staging) may share GPUs
  // (local rank modulo the GPUs), NCCL needs one GPU per rank.
  static BackendOptions options_for(const TrainConfig& c, const RankInfo& r) {
    BackendOptions o = c.cuda;
    o.device = r.local_rank;
    o.share_devices = c.dist.communicator == "mpi";
    return o;
  }

  double eval_loss(const TokenizedDataset& eval, const PackOptions& pack) {
    const PackPlan plan = pack_plan(eval, pack, 0);
    double sum = 0;
    int64_t n = 0;
    for (const PackedBin& bin : plan.bins) {
      const LossResult r = model->step(to_row(pack_materialize(eval, bin, pack)), false, 1.0);
      sum += r.loss_sum;
      n += r.num_trained;
    }
    return n > 0 ? sum / double(n) : 0.0;
  }

  std::string save(const std::string& name, bool with_optimizer = true) {
    CheckpointWrite w;
    w.dir = (fs::path(cfg.output_dir) / name).string();
    w.source = &src;
    w.table = &model->specs();
    w.optimizer = optimizer.get();
    w.save_dtype = cfg.save_dtype;
    w.with_optimizer = with_optimizer;
    w.state = state;
    w.lora = model->lora();
    w.write = first();  // the others take part in gathering the sharded state
    w.comm = comm.get();
    return checkpoint_save(w);
  }
};

// The run's data: tokenized (or from the token cache), split into train / eval, packed into rows
// of the epochs the run reaches. Stops naming the counts when nothing is left to train on.
struct RunData {
  TokenizeResult tokenized;
  TokenizedDataset split_train, eval;
  bool eval_held_out = false;  // eval from data.eval_path / eval_split; train is all of tokenized
  PackOptions pack;
  int64_t accum = 1;           // rows per step
  int64_t total_batches = 0, planned_epochs = 0, total_steps = 0;
  int max_row_samples = 1;     // samples in the fullest row, for the static shape of the CUDA graph
  const TokenizedDataset& train() const { return eval_held_out ? tokenized.data : split_train; }
};

RunData prepare_data(const TrainConfig& cfg, const ModelConfig& mc) {
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(cfg.data.tokenizer));
  QT_CHECK(tok.vocab_size() <= mc.vocab_size, cfg.data.tokenizer, ": tokenizer has ", tok.vocab_size(),
           " tokens but the model's vocab_size is ", mc.vocab_size);
  if (cfg.data.opts.read.schema != DataSchema::Tokenized) check_chat_tokenizer(tok);
  RunData d;
  TokenizeResult& tr = d.tokenized;
  tr = tokenize_data_job(cfg.data, tok);
  if (cfg.data.eval_data.empty()) split_dataset(tr.data, cfg.eval_fraction, cfg.seed, d.split_train, d.eval);
  else d.eval = tokenize_eval_set(cfg.data, tok);  // data.eval_path / eval_split: held out, never trained on
  d.eval_held_out = !cfg.data.eval_data.empty();
  const TokenizedDataset& train = d.train();
  QT_CHECK(train.num_samples() > 0, "no training samples left (", tr.data.num_samples(), " read, eval_fraction ",
           cfg.eval_fraction, ")");
  PackOptions& pack = d.pack;
  pack = cfg.data.pack;
  pack.mode = PackMode::Packed;
  if (const auto pad = tok.token_to_id("<|endoftext|>")) pack.pad_id = *pad;

  d.accum = cfg.global_batch_tokens > 0
                            ? std::max<int64_t>(1, (cfg.global_batch_tokens + pack.tokens_per_batch - 1) / pack.tokens_per_batch)
                            : 1;
  // Plan only the epochs the run reaches: with max_steps, planning stops once it has the batches.
  const int64_t wanted_batches =
      cfg.max_steps > 0 ? cfg.max_steps * d.accum : std::numeric_limits<int64_t>::max();
  PackStats first_epoch;
  for (int64_t e = 0; e < cfg.epochs && d.total_batches < wanted_batches; ++e, ++d.planned_epochs) {
    const PackPlan plan = pack_plan(train, pack, e);
    if (e == 0) first_epoch = plan.stats;
    d.total_batches += static_cast<int64_t>(plan.bins.size());
    for (const PackedBin& bin : plan.bins)
      d.max_row_samples = std::max(d.max_row_samples, static_cast<int>(bin.items.size()));
    if (plan.bins.empty()) break;
  }
  const int64_t untrained = untrained_samples(tr.data);
  log_info("data: ", data_report(tr, first_epoch, untrained, pack));
  QT_CHECK(first_epoch.trained_targets > 0, "nothing to train on: ", data_report(tr, first_epoch, untrained, pack),
           ". Every trained token vanished: check the labels (all -100?), data.train_on, and whether the assistant turns "
           "fit in data.tokens_per_batch (or use data.overflow: split)");
  d.total_steps = (d.total_batches + d.accum - 1) / d.accum;
  if (cfg.max_steps > 0) d.total_steps = std::min(d.total_steps, cfg.max_steps);
  if (cfg.eval_every > 0 && d.eval.num_samples() == 0)
    log_warn("train.eval_every is ", cfg.eval_every, " but there is no eval split (train.eval_fraction is ",
             cfg.eval_fraction, "): no eval will run");
  return d;
}

// The ZeRO stage: one rank needs none (3 when asked: the same sharding machinery at world size 1);
// auto takes the smallest stage whose model states (bf16 weights, fp32 gradients, fp32 master +
// AdamW moments) fit in half the device's free memory.
int resolve_zero(const Run& run, const ModelConfig& mc) {
  const std::string& z = run.cfg.dist.zero;
  const int W = run.rank.world;
  if (z == "3") {
    QT_CHECK(run.cfg.method == "full", "dist.zero 3 shards full fine-tuning; LoRA keeps its frozen base on every rank "
             "(use dist.zero 0, 1 or 2)");
    QT_CHECK(!run.cfg.dist.reduce_bf16, "dist.reduce_dtype bf16 is not built for ZeRO-3; use f32");
    return 3;
  }
  if (W == 1) {
    if (z != "auto" && z != "0") log_info("dist.zero ", z, " at one rank: nothing to shard, the single-rank step runs");
    return 0;
  }
  const double n = double(param_count(mc));
  auto states = [&](int stage) {  // bytes a rank holds
    return (stage >= 3 ? 2 * n / W : 2 * n) + (stage >= 2 ? 4 * n / W : 4 * n) + (stage >= 1 ? 12 * n / W : 12 * n);
  };
  if (z != "auto") return std::stoi(z);
  const int64_t free_b = run.backend->free_memory_bytes();
  const int last = run.cfg.method == "full" ? 3 : 2;
  for (int stage = 0; stage <= last; ++stage)
    if (free_b < 0 || states(stage) <= 0.5 * double(free_b)) {
      log_info("dist.zero auto: stage ", stage, " (", states(stage) / double(1 << 30), " GiB of model states a rank",
               free_b < 0 ? ", host memory" : "", ")");
      return stage;
    }
  QT_FAIL("dist.zero auto: even ZeRO-", last, " needs ", states(last) / double(1 << 30), " GiB of model states a rank, "
          "more than half of the ", double(free_b) / double(1 << 30), " GiB free (use more ranks)");
}

// The model on the run's backend (profiled when steps are), loaded from the source model (and a
// LoRA adapter to continue), with its optimizer. Returns the checkpointing policy it runs.
Checkpointing build_model(Run& run, int64_t tokens_per_row, int static_max_seqs) {
  const TrainConfig& cfg = run.cfg;
  const ModelConfig& mc = run.src.config;
  run.backend->set_deterministic(cfg.deterministic);
  if (cfg.profile_last > 0) run.profiled = std::make_unique<ProfiledBackend>(*run.backend);
  const bool lora = cfg.method == "lora";
  int64_t adapter_params = 0;
  if (lora)
    for (const ParamSpec& p : lora_trainable_table(mc, cfg.lora)) adapter_params += shape_numel(p.shape);
  const Checkpointing ckpt = resolve_checkpointing(cfg.activation_checkpointing, mc, *run.backend, tokens_per_row,
                                                   static_max_seqs, lora ? adapter_params : -1,
                                                   run.zero == 3 ? run.rank.world : 0, precision_from_name(cfg.precision),
                                                   cfg.fp8_lm_head);
  Zero3Options zero3;
  zero3.comm = run.comm.get();
  zero3.reshard_after_forward = cfg.dist.reshard_after_forward;
  run.model = std::make_unique<Qwen35Model>(mc, run.profiled ? *run.profiled : *run.backend, tokens_per_row,
                                            ckpt, lora ? &cfg.lora : nullptr, run.zero == 3 ? &zero3 : nullptr);
  run.model->set_precision(precision_from_name(cfg.precision), cfg.fp8_lm_head);
  if (run.model->precision() == Precision::FP8)
    log_info("precision: fp8 projections (e4m3, per-tensor current scaling), LM head in ",
             run.model->fp8_head() ? "fp8" : cfg.fp8_lm_head ? "bf16 (V or H not a multiple of 16)" : "bf16", ", ",
             double(run.model->memory_plan().fp8) / double(1 << 20), " MiB of codes");
  if (run.zero == 3) {
    const WeightShards& ws = *run.model->weight_shards();
    log_info("ZeRO-3: this rank keeps ", double(ws.shard_bytes()) / double(1 << 20), " MiB of weight and gradient "
             "shards and ", double(ws.buffer_bytes()) / double(1 << 20), " MiB of layer buffers (weights ",
             cfg.dist.reshard_after_forward ? "gathered for each layer's forward and again for its backward"
                                            : "gathered once per step and kept", ")");
  }
  run.model->load(run.src, cfg.seed);
  if (lora) {
    log_info("lora: r ", cfg.lora.r, ", alpha ", cfg.lora.alpha, cfg.lora.rslora ? " (rslora)" : "", ", scale ",
             cfg.lora.scale(), ", ", run.model->num_adapter_tensors() / 2, " adapted projections, ",
             run.model->specs().size() - run.model->num_adapter_tensors(), " weights trained fully (modules_to_save), ",
             adapter_params,
             " trainable parameters (", 100.0 * double(adapter_params) / double(param_count(mc)), " % of the model)");
    if (!cfg.lora_adapter.empty()) {
      const PeftAdapter adapter = peft_adapter_open(cfg.lora_adapter);
      const LoraSpec found = lora_spec_from_peft(adapter);
      auto sorted = [](std::vector<std::string> v) {
        std::sort(v.begin(), v.end());
        return v;
      };
      if (found.dropout != cfg.lora.dropout)
        log_info("lora: the adapter was trained with dropout ", found.dropout, "; this run uses ", cfg.lora.dropout);
      QT_CHECK(found.r == cfg.lora.r && found.alpha == cfg.lora.alpha && found.rslora == cfg.lora.rslora &&
                   sorted(found.targets) == sorted(cfg.lora.targets) &&
                   sorted(found.modules_to_save) == sorted(cfg.lora.modules_to_save),
               cfg.lora_adapter, ": the adapter has r ", found.r, ", alpha ", found.alpha, ", ", found.targets.size(),
               " targets; the lora: section says r ", cfg.lora.r, ", alpha ", cfg.lora.alpha, ", ",
               cfg.lora.targets.size(), " targets (make them agree)");
      const auto weights = lora_read_adapter(adapter, run.model->specs());
      for (size_t i = 0; i < weights.size(); ++i) run.model->set_param_f32(i, weights[i]);
      log_info("lora: continuing from the adapter in ", cfg.lora_adapter);
    }
  }
  // One rank (ZeRO-3 included: its shards are the whole tensors) takes the backend's own optimizer.
  // Several ranks under ZeRO-3: the backend's fused AdamW over the shards where it has one (the
  // step then stays on the device: one captured graph with NCCL), else the host's.
  if (run.rank.distributed() && run.zero == 3)
    run.optimizer = ModelOptimizer::create_sharded_device(*run.model, cfg.adamw, *run.comm);
  if (run.optimizer) return ckpt;
  if (run.rank.distributed())
    run.optimizer = std::make_unique<ShardedOptimizer>(*run.model, cfg.adamw, *run.comm, run.zero, cfg.dist.reduce_bf16);
  else
    run.optimizer = ModelOptimizer::create(*run.model, cfg.adamw);
  return ckpt;
}

RunFingerprint fingerprint_of(const TrainConfig& cfg, const TokenizeResult& tr, const ModelConfig& mc) {
  RunFingerprint f;
  f.tokens_per_batch = cfg.data.pack.tokens_per_batch;
  f.global_batch_tokens = cfg.global_batch_tokens;
  f.thinking = thinking_mode_name(cfg.data.opts.chat.thinking);
  f.train_on = train_on_name(cfg.data.opts.chat.train_on);
  f.overflow = overflow_name(cfg.data.pack.overflow);
  f.schema = data_schema_name(cfg.data.opts.read.schema);
  f.pack_seed = cfg.data.pack.seed;
  f.shuffle_window = cfg.data.pack.shuffle_window;
  for (const auto& p : cfg.data.data) f.data_files.push_back(hub_looks_like_id(p) ? p : fs::absolute(p).lexically_normal().string());
  f.data_key = tr.key;
  f.tokenizer_hash = file_hash_hex(resolve_tokenizer(cfg.data.tokenizer));
  f.model_config = mc.raw;
  f.method = cfg.method;
  if (cfg.method == "lora")
    f.lora = {{"r", cfg.lora.r}, {"alpha", cfg.lora.alpha}, {"rslora", cfg.lora.rslora}, {"dropout", cfg.lora.dropout},
              {"targets", cfg.lora.targets},
              {"modules_to_save", cfg.lora.modules_to_save}};
  return f;
}

}  // namespace

TrainSummary train_run(const TrainConfig& cfg) {
  const auto t_start = clock_type::now();
  const RankInfo rank = launch_env();
  if (rank.rank != 0 && log_level() < LogLevel::Warn) set_log_level(LogLevel::Warn);  // the first rank reports
  Run run(cfg, rank);
  Communicator& comm = *run.comm;
  if (rank.distributed())
    log_info("dist: rank ", rank.rank, " of ", rank.world, " (", rank.launcher, ", local rank ", rank.local_rank,
             "), communicator ", comm.kind());
  // One run per output directory: the first rank holds and prepares it; the others learn from it
  // where the run starts.
  std::optional<RunLock> lock;
  std::string resume_dir;
  if (run.first()) {
    lock.emplace(cfg.output_dir);
    resume_dir = checkpoint_prepare_start(cfg.output_dir, cfg.resume, cfg.overwrite);
    write_text_file((fs::path(cfg.output_dir) / "config.yaml").string(), cfg.resolved_yaml);
  }
  comm.broadcast_host(resume_dir, 0);

  const ModelConfig& mc = run.src.config;
  if (!run.first()) comm.barrier();  // the first rank fills the token cache, the others then read it
  const RunData data = prepare_data(cfg, mc);
  if (run.first()) comm.barrier();
  const PackOptions& pack = data.pack;
  const TokenizedDataset& train = data.train();
  const TokenizedDataset& eval = data.eval;
  const int64_t accum = data.accum, total_batches = data.total_batches, total_steps = data.total_steps;
  LrScheduleConfig sched = cfg.schedule;
  sched.total_steps = total_steps;

  run.zero = resolve_zero(run, mc);
  QT_CHECK(accum % rank.world == 0, "train.global_batch_tokens ", cfg.global_batch_tokens, " makes ", accum,
           " rows of ", pack.tokens_per_batch, " tokens per step, which ", rank.world,
           " ranks cannot share evenly: make it a multiple of ", rank.world * pack.tokens_per_batch);
  const int static_max_seqs = static_sample_bound(data.max_row_samples);
  const Checkpointing ckpt = build_model(run, pack.tokens_per_batch, static_max_seqs);
  const bool on_gpu = std::string(run.backend->name()) == "cuda";
  const bool lora = cfg.method == "lora";
  TrainStep stepper(*run.model, *run.optimizer, accum / rank.world, static_max_seqs, cfg.cuda_graph,
                    rank.distributed() ? &comm : nullptr);
  log_info("memory plan (", run.backend->name(), ", ", pack.tokens_per_batch, " tokens per row): ",
           run.model->memory_plan().describe());
  {  // what `qwentune plan` predicts for this job on H200s, beside the allocation above
    PlanRequest preq;
    preq.gpus = rank.world;
    preq.zero = run.zero;
    preq.tokens_per_batch = pack.tokens_per_batch;
    preq.checkpointing = checkpointing_name(ckpt);
    if (lora) preq.lora = &cfg.lora;
    const Plan plan = plan_training(mc, preq);
    log_info("qwentune plan (--gpus ", rank.world, " --zero ", run.zero, "): ", double(plan.total_bytes) / double(1 << 30),
             " GiB per H200, ", plan.tokens_per_s, " tokens/s per GPU at ", 100 * preq.compute_efficiency,
             " % of the bf16 peak", rank.world > 1 ? str(", collectives at ", preq.busbw_gbs, " GB/s bus bandwidth") : "");
  }
  log_info("step: ", stepper.mode(), ", ", accum, " row(s) per step");

  // Resume: the checkpoint must come from this same run (fingerprint), then its optimizer state,
  // step and loader position; the step records after it are dropped (they are run again).
  const nlohmann::json fingerprint = fingerprint_of(cfg, data.tokenized, mc).to_json();
  int64_t start_step = 1;
  LoaderPosition start_pos;
  run.state.source_model = fs::absolute(run.src.dir).lexically_normal().string();  // a hub id's snapshot
  run.state.fingerprint = fingerprint;
  if (!resume_dir.empty()) {
    const ResumePoint rp = checkpoint_resume(resume_dir, fingerprint, run.model->specs(), *run.optimizer);
    start_step = rp.step;
    start_pos = rp.position;
    run.state.best_eval_loss = rp.best_eval_loss;
    run.state.best_step = rp.best_step;
    log_info("resume: ", resume_dir, " at step ", start_step, " (epoch ", start_pos.epoch, ", batch ", start_pos.batch, ")");
  }
  std::optional<MetricsLog> metrics;
  if (run.first()) metrics.emplace(cfg.output_dir, start_step);
  log_info("train: ", train.num_samples(), " samples (", train.num_tokens(), " tokens), eval ", eval.num_samples(),
           " samples; ", total_batches, " packed rows of ", pack.tokens_per_batch, " tokens over ", data.planned_epochs,
           " epoch(s); ", accum, " row(s) per step; ", total_steps, " steps", data.tokenized.cache_hit ? " (token cache hit)" : "");

  auto prev_int = std::signal(SIGINT, on_stop_signal);
  auto prev_term = std::signal(SIGTERM, on_stop_signal);
  struct Restore {
    decltype(prev_int) a, b;
    ~Restore() { std::signal(SIGINT, a); std::signal(SIGTERM, b); }
  } restore{prev_int, prev_term};
  g_stop_signal.store(0);

  Loader loader(train, pack, start_pos, data.planned_epochs, 4);
  TrainSummary summary;
  const int64_t nparams = param_count(mc);  // MFU counts the frozen base's forward and dX too: 6 N per token
  double train_s = 0, eval_s = 0, save_s = 0, mfu = 0;
  int64_t tokens_done = 0, last_eval_step = -1;
  auto summary_json = [&](const char* status) {
    nlohmann::ordered_json j = {{"status", status},
                                {"steps", summary.steps},
                                {"total_steps", total_steps},
                                {"first_loss", summary.first_loss},
                                {"last_loss", summary.last_loss}};
    if (summary.eval_loss >= 0) j["eval_loss"] = summary.eval_loss;
    if (run.state.best_eval_loss >= 0) j["best_eval_loss"] = run.state.best_eval_loss;
    j["tokens_per_s"] = summary.tokens_per_second;
    if (on_gpu) j["mfu"] = mfu;
    j["wall_time_s"] = seconds_since(t_start);
    j["train_time_s"] = train_s;
    j["eval_time_s"] = eval_s;
    j["save_time_s"] = save_s;
    if (on_gpu) j["peak_device_memory_gib"] = stepper.device_memory_gib();
    j["peak_host_memory_gib"] = double(peak_rss_bytes()) / double(1 << 30);
    j["final_dir"] = summary.final_dir;
    j["source_model"] = run.state.source_model;
    if (summary.stop_signal) j["stop_signal"] = summary.stop_signal;
    return j;
  };
  auto save_checkpoint = [&](const std::string& name, const char* status) {
    const auto t = clock_type::now();
    const std::string dir = run.save(name);
    if (run.first())
      for (const std::string& gone : checkpoint_prune(cfg.output_dir, cfg.save_total_limit, dir))
        log_info("save_total_limit ", cfg.save_total_limit, ": removed ", gone);
    if (!run.first()) return dir;
    const nlohmann::ordered_json sj = summary_json(status);
    write_run_summary(cfg.output_dir, sj);
    write_run_report(cfg.output_dir, metrics->records(), sj);
    save_s += seconds_since(t);
    return dir;
  };
  auto evaluate = [&](int64_t step) {
    const auto t = clock_type::now();
    summary.eval_loss = run.eval_loss(eval, pack);
    last_eval_step = step;
    if (cfg.save_best && (run.state.best_eval_loss < 0 || summary.eval_loss < run.state.best_eval_loss)) {
      run.state.best_eval_loss = summary.eval_loss;
      run.state.best_step = step;
      eval_s += seconds_since(t);
      const auto ts = clock_type::now();
      log_info("best eval loss ", summary.eval_loss, " at step ", step, ": saved ", run.save("best", false));
      save_s += seconds_since(ts);
      return;
    }
    eval_s += seconds_since(t);
  };

  profile::StepWindow profile_window(run.profiled.get(), cfg.profile_first, cfg.profile_last,
                                     (fs::path(cfg.output_dir) / "profile_trace.json").string());
  for (int64_t step = start_step; step <= total_steps; ++step) {
    const auto t_step = clock_type::now();
    std::vector<Batch> batches;
    for (int64_t a = 0; a < accum; ++a) {
      auto b = loader.next();
      if (!b) break;
      batches.push_back(std::move(*b));
    }
    if (batches.empty()) break;
    int64_t trained = 0, tokens = 0;
    for (const Batch& b : batches) {
      trained += b.num_targets;
      tokens += b.num_tokens;
    }
    if (trained == 0) {
      log_warn("step ", step, ": no trained tokens in its batches; skipped");
      continue;
    }
    profile_window.begin(step);
    // Every rank loads the step's rows (the same plan); rank r trains rows r, r + world, ...
    std::vector<PackedRow> rows;
    for (size_t i = 0; i < batches.size(); ++i)
      if (static_cast<int>(i % static_cast<size_t>(rank.world)) == rank.rank) rows.push_back(to_row(batches[i]));
    const double lr = cfg.adamw.lr * lr_multiplier(sched, step);
    const StepResult sr = stepper.run(rows, lr, cfg.max_grad_norm, step, rank.distributed() ? trained : -1);
    if (step == start_step) log_info("memory after the first step: ", stepper.memory_report());
    const double loss = sr.loss_sum / double(trained);
    const double norm = sr.grad_norm;
    profile_window.end(step);
    tokens_done += tokens;
    train_s += seconds_since(t_step);
    // Throughput and ETA count training time only; eval and save time are reported beside.
    const double tps = double(tokens_done) / std::max(train_s, 1e-9);
    const double eta = train_s / double(step - start_step + 1) * double(total_steps - step);
    if (step == start_step) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = step;
    summary.tokens_per_second = tps;
    run.state.step = step;
    run.state.position = loader.position();
    nlohmann::ordered_json rec = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                  {"tokens", tokens}, {"trained_tokens", trained}, {"tok_s", tps},
                                  {"elapsed_s", seconds_since(t_start)}, {"train_s", train_s},
                                  {"eval_s", eval_s}, {"save_s", save_s}, {"host_ms", sr.host_ms}};
    if (on_gpu) {
      rec["graph"] = sr.replayed;
      if (sr.replayed) rec["kernels_per_step"] = stepper.graph_kernels();
    }
    const bool do_eval = eval.num_samples() > 0 && cfg.eval_every > 0 && step % cfg.eval_every == 0;
    if (do_eval) {
      evaluate(step);
      rec["eval_loss"] = summary.eval_loss;
    }
    mfu = on_gpu ? dense_mfu(nparams, tps) : 0.0;
    if (on_gpu) rec["mfu"] = mfu;
    if (run.first()) metrics->write(rec);
    if (cfg.log_every > 0 && run.first() && (step % cfg.log_every == 0 || step == total_steps || step == start_step)) {
      char gpu[96] = "";
      if (on_gpu) std::snprintf(gpu, sizeof gpu, " | MFU %.1f%% | mem %.1f GiB", 100 * mfu, stepper.device_memory_gib());
      std::printf("step %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s%s | ETA %s%s\n", (long long)step,
                  (long long)total_steps, loss, lr, norm, tps, gpu, format_duration(eta).c_str(),
                  do_eval ? (" | eval " + std::to_string(summary.eval_loss)).c_str() : "");
      std::fflush(stdout);
    }
    int64_t stop = g_stop_signal.load();
    if (rank.distributed()) comm.all_reduce_max_host(&stop, 1);  // one rank's signal stops them all
    if (const int sig = static_cast<int>(stop)) {
      summary.stop_signal = sig;
      summary.final_dir = save_checkpoint("checkpoint-" + std::to_string(step), "stopped");
      log_warn("signal ", sig, " (", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "?", "): saved ",
               summary.final_dir, " and stopped at step ", step, "; resume with --set train.resume=auto");
      return summary;
    }
    if (cfg.save_every > 0 && step % cfg.save_every == 0 && step < total_steps)
      log_info("saved ", save_checkpoint("checkpoint-" + std::to_string(step), "running"));
  }
  profile_window.finish();
  if (eval.num_samples() > 0 && last_eval_step != summary.steps) {
    evaluate(summary.steps);
    if (run.first()) metrics->write({{"step", summary.steps}, {"eval_loss", summary.eval_loss}});
  }
  if (summary.eval_loss >= 0 && run.first()) std::printf("eval loss %.4f\n", summary.eval_loss);
  summary.final_dir = (fs::path(cfg.output_dir) / "final").string();
  save_checkpoint("final", "finished");
  if (run.first())
    std::printf("saved %s (%lld steps, loss %.4f -> %.4f, %.0f tok/s; train %s, eval %s, save %s)\n",
                summary.final_dir.c_str(), (long long)summary.steps, summary.first_loss, summary.last_loss,
                summary.tokens_per_second, format_duration(train_s).c_str(), format_duration(eval_s).c_str(),
                format_duration(save_s).c_str());
  return summary;
}

}  // namespace qt
