#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"
#include "data/loader.h"
#include "io/hf_checkpoint.h"
#include "io/mapped_file.h"
#include "model/qwen35.h"
#include "ops/backend_factory.h"
#include "profile/profile_run.h"
#include "profile/profiled_backend.h"
#include "text/tokenizer.h"
#include "train/model_optimizer.h"
#include "train/tensorboard.h"
#include "train/train_step.h"

namespace qt {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

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

struct Run {
  const TrainConfig& cfg;
  HfModelDir src;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ProfiledBackend> profiled;  // wraps backend when steps are profiled
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<ModelOptimizer> optimizer;

  explicit Run(const TrainConfig& c) : cfg(c), src(hf_load(c.model)), backend(make_backend(c.backend)) {}

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

  std::string save(const std::string& name, int64_t step, const LoaderPosition& pos) {
    const std::string dir = (fs::path(cfg.output_dir) / name).string();
    std::vector<TensorWriteSpec> specs;
    const auto& table = model->specs();
    // Host copies of the optimizer state: the weights are saved from the fp32 master.
    std::vector<std::vector<float>> master(table.size()), m(table.size()), v(table.size());
    for (size_t i = 0; i < table.size(); ++i) optimizer->get_state(i, master[i], m[i], v[i]);
    for (size_t i = 0; i < table.size(); ++i) {
      DType t = src.store.get(table[i].name).dtype;
      if (cfg.save_dtype != "auto") t = *dtype_from_user_name(cfg.save_dtype);
      const std::vector<float>* w = &master[i];
      specs.push_back({table[i].name, t, table[i].shape, [w, t](void* dst, size_t) {
                         tensor_from_f32(Tensor(dst, t, {static_cast<int64_t>(w->size())}), w->data());
                       }});
      if (table[i].role == ParamRole::EmbedTokens && src.config.tie_word_embeddings && src.lm_head_stored) {
        TensorWriteSpec head = specs.back();
        head.name = lm_head_name();
        specs.push_back(head);
      }
    }
    for (const SafetensorsEntry* e : src.passthrough_tensors()) specs.push_back(passthrough_spec(*e));
    HfSaveOptions opts;
    opts.copy_files_from = src.dir;
    nlohmann::ordered_json state = {{"step", step}, {"epoch", pos.epoch}, {"batch", pos.batch},
                                    {"source_model", cfg.model}};
    opts.extra_files["trainer_state.json"] = state.dump(2) + "\n";
    std::vector<TensorWriteSpec>& opt = opts.extra_tensor_files["optimizer"];
    for (size_t i = 0; i < table.size(); ++i) {
      for (const auto& [prefix, vec] : {std::pair<const char*, const std::vector<float>*>{"master.", &master[i]},
                                        {"m.", &m[i]}, {"v.", &v[i]}}) {
        const std::vector<float>* src_vec = vec;
        opt.push_back({prefix + table[i].name, DType::F32, table[i].shape,
                       [src_vec](void* dst, size_t n) { std::memcpy(dst, src_vec->data(), n); }});
      }
    }
    hf_save(dir, src.config.raw, specs, opts);  // runs the fills while master/m/v are alive
    return dir;
  }
};

}  // namespace

TrainConfig train_config_load(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root = yaml_load_file(path);
  yaml_apply_overrides(root, overrides);
  static const std::set<std::string> top = {"model", "tokenizer", "output_dir", "data", "train"};
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>();
    QT_CHECK(top.count(k), path, ":", kv.first.Mark().line + 1, ": unknown key '", k, "' (known: model, tokenizer, output_dir, data, train)");
  }
  TrainConfig c;
  const fs::path base = fs::path(path).parent_path();
  auto rel = [&](const std::string& p) { return fs::path(p).is_absolute() || base.empty() ? p : (base / p).string(); };
  QT_CHECK(root["model"], path, ": needs `model: DIR`");
  c.model = config_relative_path(path, root["model"].as<std::string>());
  c.output_dir = rel(root["output_dir"] ? root["output_dir"].as<std::string>() : std::string("out/run"));
  c.data = data_job_from_yaml(root, path);
  const YAML::Node t = root["train"];
  if (t) {
    QT_CHECK(t.IsMap(), path, ": `train:` must be a section");
    static const std::set<std::string> known = {
        "backend", "lr", "min_lr_ratio", "schedule", "warmup_steps", "weight_decay", "beta1", "beta2", "eps",
        "max_grad_norm", "global_batch_tokens", "epochs", "max_steps", "eval_fraction", "eval_every", "save_every",
        "log_every", "seed", "save_dtype", "resume", "cuda_graph", "deterministic", "activation_checkpointing"};
    for (const auto& kv : t) {
      const std::string k = kv.first.as<std::string>();
      QT_CHECK(known.count(k), path, ":", kv.first.Mark().line + 1, ": unknown key train.", k);
    }
  }
  c.backend = yaml_get<std::string>(t, "train", "backend", c.backend, path);
  c.adamw.lr = yaml_get<double>(t, "train", "lr", 1e-4, path);
  c.schedule.min_lr_ratio = yaml_get<double>(t, "train", "min_lr_ratio", 0.0, path);
  c.schedule_name = yaml_get<std::string>(t, "train", "schedule", "cosine", path);
  c.schedule.kind = lr_schedule_from_name(c.schedule_name);
  c.schedule.warmup_steps = yaml_get<int64_t>(t, "train", "warmup_steps", 0, path);
  c.adamw.weight_decay = yaml_get<double>(t, "train", "weight_decay", 0.0, path);
  c.adamw.beta1 = yaml_get<double>(t, "train", "beta1", 0.9, path);
  c.adamw.beta2 = yaml_get<double>(t, "train", "beta2", 0.999, path);
  c.adamw.eps = yaml_get<double>(t, "train", "eps", 1e-8, path);
  c.max_grad_norm = yaml_get<double>(t, "train", "max_grad_norm", 1.0, path);
  c.global_batch_tokens = yaml_get<int64_t>(t, "train", "global_batch_tokens", 0, path);
  c.epochs = yaml_get<int64_t>(t, "train", "epochs", 1, path);
  c.max_steps = yaml_get<int64_t>(t, "train", "max_steps", 0, path);
  c.eval_fraction = yaml_get<double>(t, "train", "eval_fraction", 0.0, path);
  c.eval_every = yaml_get<int64_t>(t, "train", "eval_every", 0, path);
  c.save_every = yaml_get<int64_t>(t, "train", "save_every", 0, path);
  c.log_every = yaml_get<int64_t>(t, "train", "log_every", 1, path);
  c.seed = yaml_get<uint64_t>(t, "train", "seed", 0, path);
  c.save_dtype = yaml_get<std::string>(t, "train", "save_dtype", "auto", path);
  c.resume = yaml_get<std::string>(t, "train", "resume", "", path);
  c.cuda_graph = yaml_get<bool>(t, "train", "cuda_graph", true, path);
  c.deterministic = yaml_get<bool>(t, "train", "deterministic", true, path);
  c.activation_checkpointing = yaml_get<std::string>(t, "train", "activation_checkpointing", "auto", path);
  QT_CHECK(c.activation_checkpointing == "auto" || checkpointing_from_name(c.activation_checkpointing), path,
           ": train.activation_checkpointing '", c.activation_checkpointing, "' is not auto, none, selective or full");
  if (!c.resume.empty() && c.resume != "auto") c.resume = rel(c.resume);
  QT_CHECK(c.adamw.lr > 0, path, ": train.lr must be positive");
  QT_CHECK(c.epochs > 0, path, ": train.epochs must be positive");
  QT_CHECK(c.eval_fraction >= 0 && c.eval_fraction < 1, path, ": train.eval_fraction must be in [0, 1)");
  QT_CHECK(c.eval_fraction == 0 || c.data.eval_data.empty(), path,
           ": train.eval_fraction and data.eval_path / data.eval_split both choose an eval set; use one");
  QT_CHECK(c.schedule.min_lr_ratio >= 0 && c.schedule.min_lr_ratio <= 1, path, ": train.min_lr_ratio must be in [0, 1]");
  QT_CHECK(c.save_dtype == "auto" || dtype_from_user_name(c.save_dtype), path, ": train.save_dtype '", c.save_dtype,
           "' is not auto, bf16, f16 or f32");
  if (c.backend == "auto") c.backend = default_backend_name();
  QT_CHECK(c.backend == "cpu" || c.backend == "cuda", path, ": train.backend '", c.backend,
           "' is not auto, cpu or cuda");
  return c;
}

TrainSummary train_run(const TrainConfig& cfg) {
  using clock = std::chrono::steady_clock;
  Run run(cfg);
  const ModelConfig& mc = run.src.config;
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(cfg.data.tokenizer));
  QT_CHECK(tok.vocab_size() <= mc.vocab_size, cfg.data.tokenizer, ": tokenizer has ", tok.vocab_size(),
           " tokens but the model's vocab_size is ", mc.vocab_size);
  TokenizeResult tr = tokenize_data_job(cfg.data, tok);
  TokenizedDataset train, eval;
  const int64_t samples_read = tr.data.num_samples();
  if (cfg.data.eval_data.empty()) {
    split_dataset(tr.data, cfg.eval_fraction, cfg.seed, train, eval);
  } else {  // data.eval_path / eval_split: a held-out set, never trained on
    train = std::move(tr.data);
    eval = tokenize_eval_set(cfg.data, tok);
  }
  QT_CHECK(train.num_samples() > 0, "no training samples left (", samples_read, " read, eval_fraction ",
           cfg.eval_fraction, ")");
  PackOptions pack = cfg.data.pack;
  pack.mode = PackMode::Packed;
  if (const auto pad = tok.token_to_id("<|endoftext|>")) pack.pad_id = *pad;

  int64_t total_batches = 0;
  int max_row_samples = 1;  // samples in the fullest row, for the static shape of the CUDA graph
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    const PackPlan plan = pack_plan(train, pack, e);
    total_batches += static_cast<int64_t>(plan.bins.size());
    for (const PackedBin& bin : plan.bins) max_row_samples = std::max(max_row_samples, static_cast<int>(bin.items.size()));
  }
  const int64_t accum = cfg.global_batch_tokens > 0
                            ? std::max<int64_t>(1, (cfg.global_batch_tokens + pack.tokens_per_batch - 1) / pack.tokens_per_batch)
                            : 1;
  int64_t total_steps = (total_batches + accum - 1) / accum;
  if (cfg.max_steps > 0) total_steps = std::min(total_steps, cfg.max_steps);
  LrScheduleConfig sched = cfg.schedule;
  sched.total_steps = total_steps;

  run.backend->set_deterministic(cfg.deterministic);
  if (cfg.profile_last > 0) run.profiled = std::make_unique<ProfiledBackend>(*run.backend);
  const int static_max_seqs = static_sample_bound(max_row_samples);
  const Checkpointing ckpt =
      resolve_checkpointing(cfg.activation_checkpointing, mc, *run.backend, pack.tokens_per_batch, static_max_seqs);
  run.model = std::make_unique<Qwen35Model>(mc, run.profiled ? *run.profiled : *run.backend, pack.tokens_per_batch,
                                            ckpt);
  run.model->load(run.src);
  run.optimizer = ModelOptimizer::create(*run.model, cfg.adamw);
  TrainStep stepper(*run.model, *run.optimizer, accum, static_max_seqs, cfg.cuda_graph);
  log_info("memory plan (", run.backend->name(), ", ", pack.tokens_per_batch, " tokens per row): ",
           run.model->memory_plan().describe());
  log_info("step: ", stepper.mode(), ", ", accum, " row(s) per step");
  const auto& table = run.model->specs();
  // Resume: optimizer state, step and loader position from a checkpoint.
  int64_t start_step = 1;
  LoaderPosition start_pos;
  std::string resume_dir = cfg.resume;
  if (resume_dir == "auto") {
    resume_dir.clear();
    int64_t best = -1;
    if (fs::is_directory(cfg.output_dir))
      for (const auto& de : fs::directory_iterator(cfg.output_dir)) {
        const std::string n = de.path().filename().string();
        if (n.rfind("checkpoint-", 0) == 0 && fs::exists(de.path() / "trainer_state.json")) {
          const int64_t k = std::atoll(n.c_str() + 11);
          if (k > best) { best = k; resume_dir = de.path().string(); }
        }
      }
    if (resume_dir.empty()) log_info("resume: auto found no checkpoint in ", cfg.output_dir, "; starting fresh");
  }
  if (!resume_dir.empty()) {
    const std::string state_path = (fs::path(resume_dir) / "trainer_state.json").string();
    nlohmann::json st;
    try {
      st = nlohmann::json::parse(read_text_file(state_path));
    } catch (const nlohmann::json::exception& e) {
      QT_FAIL(state_path, ": malformed JSON: ", e.what());
    }
    QT_CHECK(st.contains("step") && st.contains("epoch") && st.contains("batch"), state_path,
             ": needs step, epoch and batch");
    auto opt = SafetensorsFile::open((fs::path(resume_dir) / "optimizer.safetensors").string());
    for (size_t i = 0; i < table.size(); ++i) {
      std::vector<float> st_master(static_cast<size_t>(shape_numel(table[i].shape))), st_m(st_master.size()),
          st_v(st_master.size());
      for (auto& [prefix, vec] : {std::pair<const char*, std::vector<float>*>{"master.", &st_master},
                                  {"m.", &st_m}, {"v.", &st_v}}) {
        const SafetensorsEntry* e = opt->find(prefix + table[i].name);
        QT_CHECK(e != nullptr, opt->path(), ": missing optimizer tensor '", prefix, table[i].name, "'");
        QT_CHECK(e->dtype == DType::F32 && e->shape == table[i].shape, opt->path(), ": optimizer tensor '", prefix,
                 table[i].name, "' is ", dtype_name(e->dtype), shape_str(e->shape), ", expected F32",
                 shape_str(table[i].shape));
        std::memcpy(vec->data(), e->data, e->nbytes);
      }
      run.optimizer->set_state(i, st_master, st_m, st_v);
    }
    start_step = st["step"].get<int64_t>() + 1;
    start_pos = {st["epoch"].get<int64_t>(), st["batch"].get<int64_t>()};
    log_info("resume: ", resume_dir, " at step ", start_step, " (epoch ", start_pos.epoch, ", batch ", start_pos.batch, ")");
  }
  fs::create_directories(cfg.output_dir);
  std::ofstream metrics((fs::path(cfg.output_dir) / "metrics.jsonl").string(), std::ios::app);
  QT_CHECK(metrics.good(), cfg.output_dir, "/metrics.jsonl: cannot open for writing");
  log_info("train: ", train.num_samples(), " samples (", train.num_tokens(), " tokens), eval ", eval.num_samples(),
           " samples; ", total_batches, " packed rows of ", pack.tokens_per_batch, " tokens over ", cfg.epochs,
           " epoch(s); ", accum, " row(s) per step; ", total_steps, " steps", tr.cache_hit ? " (token cache hit)" : "");

  auto prev_int = std::signal(SIGINT, on_stop_signal);
  auto prev_term = std::signal(SIGTERM, on_stop_signal);
  struct Restore {
    decltype(prev_int) a, b;
    ~Restore() { std::signal(SIGINT, a); std::signal(SIGTERM, b); }
  } restore{prev_int, prev_term};
  g_stop_signal.store(0);

  Loader loader(train, pack, start_pos, cfg.epochs, 4);
  TrainSummary summary;
  TensorBoardWriter tb((fs::path(cfg.output_dir) / "tb").string());
  const bool on_gpu = std::string(run.backend->name()) == "cuda";
  const int64_t nparams = param_count(mc);
  const auto t0 = clock::now();
  int64_t tokens_done = 0;
  profile::StepWindow profile_window(run.profiled.get(), cfg.profile_first, cfg.profile_last,
                                     (fs::path(cfg.output_dir) / "profile_trace.json").string());
  for (int64_t step = start_step; step <= total_steps; ++step) {
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
    std::vector<PackedRow> rows;
    for (const Batch& b : batches) rows.push_back(to_row(b));
    const double lr = cfg.adamw.lr * lr_multiplier(sched, step);
    const StepResult sr = stepper.run(rows, lr, cfg.max_grad_norm, step);
    if (step == start_step) log_info("memory after the first step: ", stepper.memory_report());
    const double loss = sr.loss_sum / double(trained);
    const double norm = sr.grad_norm;
    profile_window.end(step);
    tokens_done += tokens;
    const double elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    const double tps = double(tokens_done) / std::max(elapsed, 1e-9);
    const double eta = elapsed / double(step - start_step + 1) * double(total_steps - step);
    if (step == start_step) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = step;
    nlohmann::ordered_json rec = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                  {"tokens", tokens}, {"trained_tokens", trained}, {"tok_s", tps},
                                  {"elapsed_s", elapsed}, {"host_ms", sr.host_ms}};
    if (on_gpu) {
      rec["graph"] = sr.replayed;
      if (sr.replayed) rec["kernels_per_step"] = stepper.graph_kernels();
    }
    const bool do_eval = eval.num_samples() > 0 && cfg.eval_every > 0 && step % cfg.eval_every == 0;
    if (do_eval) rec["eval_loss"] = summary.eval_loss = run.eval_loss(eval, pack);
    // MFU against the H200's measured bf16 matmul rate, on the GPU only (6 x params x tokens/s).
    const double mfu = on_gpu ? 6.0 * double(nparams) * tps / 790e12 : 0.0;
    if (on_gpu) rec["mfu"] = mfu;
    metrics << rec.dump() << "\n";
    metrics.flush();
    tb.scalar("train/loss", loss, step);
    tb.scalar("train/lr", lr, step);
    tb.scalar("train/grad_norm", norm, step);
    tb.scalar("perf/tokens_per_s", tps, step);
    if (on_gpu) tb.scalar("perf/mfu", mfu, step);
    if (do_eval) tb.scalar("eval/loss", summary.eval_loss, step);
    tb.flush();
    if (cfg.log_every > 0 && (step % cfg.log_every == 0 || step == total_steps || step == start_step)) {
      char gpu[96] = "";
      if (on_gpu) std::snprintf(gpu, sizeof gpu, " | MFU %.1f%% | mem %.1f GiB", 100 * mfu, stepper.device_memory_gib());
      std::printf("step %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s%s | ETA %s%s\n", (long long)step,
                  (long long)total_steps, loss, lr, norm, tps, gpu, format_duration(eta).c_str(),
                  do_eval ? (" | eval " + std::to_string(summary.eval_loss)).c_str() : "");
      std::fflush(stdout);
    }
    if (cfg.save_every > 0 && step % cfg.save_every == 0 && step < total_steps)
      log_info("saved ", run.save("checkpoint-" + std::to_string(step), step, loader.position()));
    if (int sig = g_stop_signal.load()) {
      const std::string dir = run.save("checkpoint-" + std::to_string(step), step, loader.position());
      log_warn("signal ", sig, ": saved ", dir, " and stopped at step ", step);
      summary.final_dir = dir;
      return summary;
    }
  }
  profile_window.finish();
  summary.tokens_per_second = double(tokens_done) / std::max(std::chrono::duration<double>(clock::now() - t0).count(), 1e-9);
  if (eval.num_samples() > 0) {
    summary.eval_loss = run.eval_loss(eval, pack);
    metrics << nlohmann::ordered_json({{"step", summary.steps}, {"eval_loss", summary.eval_loss}}).dump() << "\n";
    std::printf("eval loss %.4f\n", summary.eval_loss);
  }
  summary.final_dir = run.save("final", summary.steps, loader.position());
  std::printf("saved %s (%lld steps, loss %.4f -> %.4f, %.0f tok/s)\n", summary.final_dir.c_str(),
              (long long)summary.steps, summary.first_loss, summary.last_loss, summary.tokens_per_second);
  return summary;
}

}  // namespace qt
