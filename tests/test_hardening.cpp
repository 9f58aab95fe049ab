// Nothing lost, nothing silent: saves that refuse to clobber, checkpoints that are complete or
// ignored, one run per output directory, resume that checks what it resumes, configs whose every
// numeric key is range-checked, and the files a run leaves for a reader.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config_schema.h"
#include "model/hf_checkpoint.h"
#include "io/mapped_file.h"
#include "model/generate.h"
#include "model/random_model_dir.h"
#include "ops/cpu/cpu_backend.h"
#include "test_util.h"
#include "text/bpe_builder.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/run_dir.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace qt {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// A tiny model, an addition data set and a config for them (as test_trainer.cpp's, smaller).
std::string make_run(const ScratchDir& dir, const std::string& train_keys) {
  if (!fs::exists(dir.file("init/config.json"))) write_random_model_dir("tiny", dir.file("init"), 5, DType::F32);
  std::ofstream data(dir.file("train.jsonl"));
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 6; ++b)
      data << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << a << "+" << b
           << "?\"}, {\"role\": \"assistant\", \"content\": \"" << a + b << "\"}]}\n";
  write(dir.file("train.yaml"), "model: init\noutput_dir: run\ndata:\n  path: train.jsonl\n  thinking: off\n"
                                "  tokens_per_batch: 128\ntrain:\n  lr: 3.0e-3\n  log_every: 0\n" + train_keys);
  return dir.file("train.yaml");
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& records, const char* key) {
  std::vector<int64_t> out;
  for (const auto& r : records)
    if (r.contains(key)) out.push_back(r["step"].get<int64_t>());
  return out;
}

// ---- 1. saves never delete what they did not write -----------------------------------------------

TEST(SafeSave, InitModelRefusesANonModelDirectoryAndForceKeepsItsFiles) {
  ScratchDir dir("safe-init");
  write(dir.file("work/notes.txt"), "mine");
  EXPECT_ERROR_CONTAINS([&] { write_random_model_dir("tiny", dir.file("work"), 0, DType::F32); }, "work",
                        "not a model directory", "notes.txt", "--force");
  EXPECT_EQ(read_text_file(dir.file("work/notes.txt")), "mine");
  RandomModelOptions o;
  o.preset = "tiny";
  o.out = dir.file("work");
  o.force = true;
  write_random_model_dir(o);
  EXPECT_EQ(read_text_file(dir.file("work/notes.txt")), "mine");
  EXPECT_NO_THROW(hf_load(dir.file("work")));
  // A model directory is replaced in place, the user's file kept, no scratch directory left.
  write_random_model_dir("tiny", dir.file("work"), 1, DType::F32);
  EXPECT_EQ(read_text_file(dir.file("work/notes.txt")), "mine");
  for (const auto& de : fs::directory_iterator(dir.path()))
    EXPECT_EQ(de.path().filename().string().find(".tmp-"), std::string::npos) << de.path();
}

TEST(SafeSave, RefusesTheRootAndTheCurrentDirectory) {
  ScratchDir dir("safe-root");
  EXPECT_ERROR_CONTAINS([&] { write_random_model_dir("tiny", "/", 0, DType::F32); }, "root");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_ERROR_CONTAINS([&] { write_random_model_dir("tiny", ".", 0, DType::F32); }, "current directory");
  EXPECT_ERROR_CONTAINS([&] { write_random_model_dir("tiny", "..", 0, DType::F32); }, "current directory");
  fs::current_path(cwd);
  EXPECT_FALSE(fs::exists("/.tmp-" + std::to_string(::getpid())));
}

TEST(SafeSave, InterruptedSwapIsUndoneOrFinished) {
  ScratchDir dir("safe-recover");
  write_random_model_dir("tiny", dir.file("out/checkpoint-2"), 0, DType::F32);
  // A crash after moving the previous directory aside, before the new one was renamed in.
  fs::rename(dir.file("out/checkpoint-2"), dir.file("out/checkpoint-2.old-99"));
  fs::create_directories(dir.file("out/checkpoint-4.tmp-98"));
  const auto done = hf_recover_interrupted_saves(dir.file("out"));
  EXPECT_EQ(done.size(), 2u);
  EXPECT_NO_THROW(hf_load(dir.file("out/checkpoint-2")));
  EXPECT_FALSE(fs::exists(dir.file("out/checkpoint-4.tmp-98")));
}

// ---- 3. auto-resume takes complete checkpoints only; records hold each step once ---------------

TEST(Checkpoints, AutoResumeSkipsHalfWrittenAndForeignNames) {
  ScratchDir dir("ckpt-names");
  train_run(train_config_load(make_run(dir, "  max_steps: 4\n  save_every: 2\n"), {}));
  ASSERT_TRUE(checkpoint_is_complete(dir.file("run/checkpoint-2")));
  // What kill -9 mid-save leaves, and names that only look like checkpoints.
  fs::copy(dir.file("run/checkpoint-2"), dir.file("run/checkpoint-9.tmp-1234"));
  fs::copy(dir.file("run/checkpoint-2"), dir.file("run/checkpoint-7"));
  fs::remove(dir.file("run/checkpoint-7/.qwentune-complete"));
  fs::copy(dir.file("run/checkpoint-2"), dir.file("run/checkpoint-8x"));
  EXPECT_EQ(fs::path(checkpoint_find_latest(dir.file("run"))).filename(), "checkpoint-2");
  EXPECT_ERROR_CONTAINS([&] { checkpoint_read_state(dir.file("run/checkpoint-7")); }, "not a complete checkpoint");
}

TEST(Checkpoints, ResumeRecordsEachStepOnceInMetricsAndTensorBoard) {
  ScratchDir dir("ckpt-records");
  const std::string cfg = make_run(dir, "  max_steps: 6\n  save_every: 2\n  eval_fraction: 0.2\n  eval_every: 3\n");
  train_run(train_config_load(cfg, {}));
  // Resume from the step-4 checkpoint (as after a crash at step 5): steps 5, 6 run again.
  fs::remove_all(dir.file("run/final"));
  fs::remove_all(dir.file("run/checkpoint-6"));
  const TrainSummary s = train_run(train_config_load(cfg, {"train.resume=auto"}));
  EXPECT_EQ(s.steps, 6);
  const auto records = metrics_read(dir.file("run/metrics.jsonl"));
  EXPECT_EQ(steps_of(records, "loss"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(steps_of(records, "eval_loss"), (std::vector<int64_t>{3, 6}));  // the final eval is not recorded twice
  int files = 0;
  std::map<int64_t, int> loss_steps;
  for (const auto& de : fs::directory_iterator(dir.file("run/tb"))) {
    ++files;
    for (const auto& sc : tensorboard_read_scalars(de.path().string()))
      if (sc.tag == "train/loss") loss_steps[sc.step]++;
  }
  EXPECT_EQ(files, 1);
  ASSERT_EQ(loss_steps.size(), 6u);
  for (const auto& [step, n] : loss_steps) EXPECT_EQ(n, 1) << "step " << step;
}

TEST(Checkpoints, TensorBoardFileNamesNeverCollide) {
  ScratchDir dir("tb-names");
  TensorBoardWriter a(dir.file("tb")), b(dir.file("tb"));
  EXPECT_NE(a.path(), b.path());
}

// ---- 4. one run per output directory --------------------------------------------------------------

TEST(RunDir, SecondRunIsRefusedNamingThePid) {
  ScratchDir dir("run-lock");
  RunLock held(dir.file("out"));
  const std::string pid = "PID " + std::to_string(::getpid());
  EXPECT_ERROR_CONTAINS([&] { RunLock second(dir.file("out")); }, "another qwentune run", pid.c_str());
}

TEST(RunDir, FreshRunIntoAFinishedRunIsRefusedUnlessOverwrite) {
  ScratchDir dir("run-fresh");
  const std::string cfg = make_run(dir, "  max_steps: 2\n");
  train_run(train_config_load(cfg, {}));
  const std::string before = read_text_file(dir.file("run/metrics.jsonl"));
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {})); }, "holds an earlier run", "final", "--overwrite");
  EXPECT_EQ(read_text_file(dir.file("run/metrics.jsonl")), before);
  write(dir.file("run/mine.txt"), "kept");
  TrainConfig c = train_config_load(cfg, {});
  c.overwrite = true;
  train_run(c);
  EXPECT_EQ(steps_of(metrics_read(dir.file("run/metrics.jsonl")), "loss"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(read_text_file(dir.file("run/mine.txt")), "kept");
}

// ---- 5. a signal saves and reports itself ------------------------------------------------------------

TEST(Signals, SigtermSavesACheckpointAndSaysSo) {
  ScratchDir dir("signal");
  const std::string cfg = make_run(dir, "  max_steps: 100000\n  epochs: 100000\n");
  std::thread killer([&] {
    for (int i = 0; i < 600 && !fs::exists(dir.file("run/metrics.jsonl")); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(::getpid(), SIGTERM);
  });
  const TrainSummary s = train_run(train_config_load(cfg, {}));
  killer.join();
  EXPECT_EQ(s.stop_signal, SIGTERM);
  EXPECT_LT(s.steps, 100000);
  EXPECT_TRUE(checkpoint_is_complete(s.final_dir)) << s.final_dir;
  const auto summary = nlohmann::json::parse(read_text_file(dir.file("run/summary.json")));
  EXPECT_EQ(summary["status"], "stopped");
}

// ---- 6. resume checks what it resumes ------------------------------------------------------------------

TEST(Checkpoints, ResumeWithChangedSettingsNamesTheDifference) {
  ScratchDir dir("ckpt-fingerprint");
  const std::string cfg = make_run(dir, "  max_steps: 2\n  save_every: 1\n");
  train_run(train_config_load(cfg, {}));
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"train.resume=auto", "data.tokens_per_batch=256"})); },
                        "cannot resume", "data.tokens_per_batch: 128 in the checkpoint, 256 now");
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"train.resume=auto", "data.thinking=on"})); },
                        "data.thinking");
  std::ofstream(dir.file("train.jsonl"), std::ios::app)
      << "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1?\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n";
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"train.resume=auto"})); }, "contents of the data files changed");
  write_random_model_dir("tiny", dir.file("other"), 5, DType::F32);
  nlohmann::json c = nlohmann::json::parse(read_text_file(dir.file("other/config.json")));
  EXPECT_TRUE(fingerprint_differences(nlohmann::json::object(), {{"x", 1}}).size() == 1);
  const nlohmann::json saved = {{"model config.json", {{"hidden_size", 64}}}}, now = {{"model config.json", {{"hidden_size", 96}}}};
  EXPECT_EQ(fingerprint_differences(saved, now).at(0), "model config.json: hidden_size is 64 in the checkpoint, 96 now");
}

// ---- 7. every numeric key is range-checked; duplicated keys; generate's options ------------------------

TEST(ConfigRanges, OutOfRangeValuesAreErrorsNamingTheKey) {
  ScratchDir dir("cfg-ranges");
  const std::string cfg = make_run(dir, "");
  for (const char* bad : {"train.beta1=1.5", "train.eps=0", "train.eps=-1", "train.weight_decay=-10",
                          "train.max_grad_norm=.nan", "train.max_grad_norm=-1", "train.warmup_steps=-5",
                          "train.max_steps=-1", "data.threads=-3", "data.threads=100000", "train.lr=.inf",
                          "train.epochs=0", "train.save_total_limit=-1", "data.tokens_per_batch=0", "train.epochs=1e18"}) {
    const std::string key = std::string(bad).substr(0, std::string(bad).find('=')), where = "--set '" + std::string(bad) + "'";
    EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {bad}); }, where.c_str(), key.c_str());
  }
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.beta1=1.5"}); }, "must be in [0, 1)");
}

TEST(ConfigRanges, DuplicatedKeyNamesBothLines) {
  ScratchDir dir("cfg-dup");
  make_run(dir, "");
  write(dir.file("dup.yaml"), "model: init\ndata:\n  path: train.jsonl\ntrain:\n  lr: 1.0e-3\n  epochs: 2\n  lr: 2.0e-3\n");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(dir.file("dup.yaml"), {}); }, "dup.yaml:7", "duplicated key 'train.lr'",
                        "first set on line 5");
  write(dir.file("typo.yaml"), "model: init\ndata:\n  path: train.jsonl\ntrain:\n  lrate: 1\n");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(dir.file("typo.yaml"), {}); }, "typo.yaml:5", "unknown key train.lrate",
                        "known: backend, lr");
}

// train.cuda is a section inside train: its keys are read, checked (range, unknown key, not a
// section) and written back by --print-config under `  cuda:`.
TEST(ConfigRanges, NestedCudaSection) {
  ScratchDir dir("cfg-cuda");
  const std::string cfg = make_run(dir, "  cuda:\n    gemm_candidates: 8\n    arena_mib: 64\n");
  const TrainConfig c = train_config_load(cfg, {"train.cuda.gemm_tune=false"});
  EXPECT_EQ(c.cuda.gemm_candidates, 8);
  EXPECT_EQ(c.cuda.arena_mib, 64);
  EXPECT_FALSE(c.cuda.gemm_tune);
  EXPECT_TRUE(c.cuda.deterministic);
  EXPECT_NE(c.resolved_yaml.find("\n  cuda:\n    gemm_tune: false"), std::string::npos) << c.resolved_yaml;
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.cuda.gemm_candidates=65"}); },
                        "--set 'train.cuda.gemm_candidates=65'", "must be in [1, 64]");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.cuda.gemm_tunes=1"}); }, "unknown key train.cuda.gemm_tunes",
                        "known: gemm_tune, gemm_candidates, arena_mib");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.cuda=3"}); }, "`cuda:` must be a section of keys");
  write(dir.file("resolved.yaml"), c.resolved_yaml);
  EXPECT_EQ(train_config_load(dir.file("resolved.yaml"), {}).cuda.gemm_candidates, 8);
  const TrainConfig defaults = train_config_load(make_run(dir, ""), {});
  EXPECT_TRUE(defaults.cuda.gemm_tune);
  EXPECT_EQ(defaults.cuda.gemm_candidates, 32);
  EXPECT_EQ(defaults.cuda.arena_mib, 1024);
}

TEST(ConfigRanges, PrintConfigListsEveryKeyAndReloads) {
  ScratchDir dir("cfg-print");
  const TrainConfig c = train_config_load(make_run(dir, "  max_steps: 3\n"), {"train.lr=5e-4"});
  for (const ConfigKey& k : config_keys())
    EXPECT_NE(c.resolved_yaml.find(std::string(k.name) + ":"), std::string::npos) << k.name;
  EXPECT_NE(c.resolved_yaml.find("lr: 5e-4"), std::string::npos) << c.resolved_yaml;
  EXPECT_NE(c.resolved_yaml.find("default: 1.0e-4"), std::string::npos);
  write(dir.file("elsewhere/resolved.yaml"), c.resolved_yaml);
  const TrainConfig again = train_config_load(dir.file("elsewhere/resolved.yaml"), {});
  EXPECT_EQ(again.model, fs::absolute(c.model).lexically_normal().string());
  EXPECT_DOUBLE_EQ(again.adamw.lr, 5e-4);
  EXPECT_EQ(again.max_steps, 3);
  EXPECT_EQ(again.resolved_yaml, c.resolved_yaml);
}

TEST(Generate, RejectsBadOptionsAndNeverSamplesMaskedIds) {
  const ModelConfig mc = [] {
    ScratchDir d("gen-model");
    write_random_model_dir("tiny", d.file("m"), 3, DType::F32);
    return hf_load(d.file("m")).config;
  }();
  CpuBackend be;
  Qwen35Model model(mc, be, 1);
  GenerateOptions o;
  o.temperature = -1;
  EXPECT_ERROR_CONTAINS([&] { generate(model, {1, 2}, o); }, "temperature");
  o.temperature = std::nan("");
  EXPECT_ERROR_CONTAINS([&] { generate(model, {1, 2}, o); }, "temperature");
  o.temperature = 1.0;
  o.top_k = -1;
  EXPECT_ERROR_CONTAINS([&] { generate(model, {1, 2}, o); }, "top_k");
  o.top_k = 0;
  o.max_new_tokens = 40;
  o.allowed_ids.assign(static_cast<size_t>(mc.vocab_size), false);
  for (int i = 10; i < 20; ++i) o.allowed_ids[size_t(i)] = true;
  const GenerateResult r = generate(model, {1, 2, 3}, o);
  EXPECT_EQ(r.ids.size(), 40u);
  EXPECT_EQ(r.stop_reason, "max_new_tokens");
  for (int32_t id : r.ids) EXPECT_TRUE(id >= 10 && id < 20) << id;
}

// ---- 8. a huge epoch count with max_steps does not plan every epoch ------------------------------------

TEST(TrainerLimits, HugeEpochsWithMaxStepsStartsAtOnce) {
  ScratchDir dir("epochs-huge");
  const auto t0 = std::chrono::steady_clock::now();
  const TrainSummary s = train_run(train_config_load(make_run(dir, "  epochs: 1000000\n  max_steps: 2\n"), {}));
  EXPECT_EQ(s.steps, 2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
}

// ---- 10, 11. nothing to train on; a tokenizer without ChatML --------------------------------------------

TEST(TrainerData, NoTrainedTokenLeftIsAnErrorWithCounts) {
  ScratchDir dir("no-trained");
  const std::string cfg = make_run(dir, "");
  std::ofstream(dir.file("tok.jsonl")) << "{\"input_ids\": [5, 6, 7], \"labels\": [-100, -100, -100]}\n"
                                       << "{\"input_ids\": [8, 9], \"labels\": [-100, -100]}\n";
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"data.path=tok.jsonl", "data.schema=tokenized"})); },
                        "nothing to train on", "2 samples (2 with no trained token)");
  EXPECT_FALSE(fs::exists(dir.file("run/final")));
}

TEST(TrainerData, TokenizerWithoutChatMlMarkersIsRefused) {
  ScratchDir dir("no-chatml");
  const std::string cfg = make_run(dir, "");
  write(dir.file("plain/tokenizer.json"), bpe_tokenizer_json({}, {}, kQwen35SplitRegex).dump());
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"tokenizer=plain"})); }, "plain/tokenizer.json",
                        "no added token '<|im_start|>'");
}

// ---- 12. NaN weights are named at load --------------------------------------------------------------------

TEST(TrainerData, NanWeightsAreReportedAtLoad) {
  ScratchDir dir("nan-weights");
  write_random_model_dir("tiny", dir.file("m"), 1, DType::F32);
  HfModelDir m = hf_load(dir.file("m"));
  const SafetensorsEntry& e = m.store.get("model.norm.weight");
  const std::string file = e.file, name = e.name;
  m = HfModelDir{};  // unmap before writing into the file
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  // The tensor's bytes: after the 8-byte header length and the header, at its data offset.
  uint64_t hl = 0;
  f.read(reinterpret_cast<char*>(&hl), 8);
  const std::string header(hl, '\0');
  f.read(const_cast<char*>(header.data()), static_cast<std::streamsize>(hl));
  const auto j = nlohmann::json::parse(header);
  const uint64_t begin = j[name]["data_offsets"][0].get<uint64_t>() + 8 + hl;
  const float nan = std::nanf("");
  f.seekp(static_cast<std::streamoff>(begin + 4 * 3));
  f.write(reinterpret_cast<const char*>(&nan), 4);
  f.close();
  HfModelDir bad = hf_load(dir.file("m"));
  CpuBackend be;
  Qwen35Model model(bad.config, be, 16);
  EXPECT_ERROR_CONTAINS([&] { model.load(bad); }, "model.norm.weight", "holds NaN", "element 3");
}

// ---- 13, 15, 16, 18. records, retention, summary, carried files --------------------------------------------

TEST(RunOutputs, LimitBestSummaryReportAndCarriedFiles) {
  ScratchDir dir("run-outputs");
  write_random_model_dir("tiny", dir.file("init"), 5, DType::F32);
  write(dir.file("init/README.md"), "# model card\n");
  write(dir.file("init/LICENSE"), "apache-2.0\n");
  write(dir.file("init/added_tokens.json"), "{}\n");
  const std::string cfg = make_run(dir, "  max_steps: 8\n  save_every: 2\n  save_total_limit: 2\n  save_best: true\n"
                                        "  eval_fraction: 0.2\n  eval_every: 2\n");
  const TrainSummary s = train_run(train_config_load(cfg, {}));
  std::vector<std::string> kept;
  for (const auto& p : checkpoint_list(dir.file("run"))) kept.push_back(fs::path(p).filename().string());
  EXPECT_EQ(kept, (std::vector<std::string>{"checkpoint-4", "checkpoint-6"}));
  EXPECT_FALSE(fs::exists(dir.file("run/checkpoint-2"))) << [&] { std::string l; for (const auto& de : fs::directory_iterator(dir.file("run/checkpoint-2"))) l += de.path().filename().string() + " "; return l; }();
  for (const char* f : {"README.md", "LICENSE", "added_tokens.json", "tokenizer.json"})
    EXPECT_TRUE(fs::exists(s.final_dir + "/" + f)) << f;
  const auto state = nlohmann::json::parse(read_text_file(s.final_dir + "/trainer_state.json"));
  EXPECT_EQ(state["source_model"], fs::absolute(dir.file("init")).lexically_normal().string());
  ASSERT_TRUE(fs::exists(dir.file("run/best/config.json")));
  double best = 1e30;
  for (const auto& r : metrics_read(dir.file("run/metrics.jsonl")))
    if (r.contains("eval_loss")) best = std::min(best, r["eval_loss"].get<double>());
  const auto best_state = nlohmann::json::parse(read_text_file(dir.file("run/best/trainer_state.json")));
  EXPECT_DOUBLE_EQ(best_state["best_eval_loss"].get<double>(), best);
  const auto summary = nlohmann::json::parse(read_text_file(dir.file("run/summary.json")));
  for (const char* k : {"steps", "first_loss", "last_loss", "eval_loss", "tokens_per_s", "wall_time_s", "train_time_s",
                        "eval_time_s", "save_time_s", "peak_host_memory_gib", "final_dir"})
    EXPECT_TRUE(summary.contains(k)) << k;
  EXPECT_EQ(summary["status"], "finished");
  EXPECT_EQ(summary["steps"], 8);
  EXPECT_EQ(summary["final_dir"], s.final_dir);
  // Throughput counts training time only.
  int64_t tokens = 0;
  double train_s = 0, tok_s = 0;
  for (const auto& r : metrics_read(dir.file("run/metrics.jsonl")))
    if (r.contains("loss")) {
      tokens += r["tokens"].get<int64_t>();
      train_s = r["train_s"].get<double>();
      tok_s = r["tok_s"].get<double>();
    }
  EXPECT_NEAR(tok_s, double(tokens) / train_s, 1e-6 * tok_s);
  const std::string html = read_text_file(dir.file("run/report.html"));
  EXPECT_NE(html.find("\"eval_loss\""), std::string::npos);
  EXPECT_EQ(html.find("http"), html.find("http://www.w3.org/2000/svg"));  // no network reference but the SVG namespace
  EXPECT_TRUE(fs::exists(dir.file("run/config.yaml")));
}

TEST(InitModel, ConfigAndTokenizerOptions) {
  ScratchDir dir("init-config");
  write_random_model_dir("tiny", dir.file("tiny"), 0, DType::F32);
  nlohmann::json c = nlohmann::json::parse(read_text_file(dir.file("tiny/config.json")));
  c["vocab_size"] = c["vocab_size"].get<int64_t>() + 64;  // as real checkpoints: more rows than tokens
  write(dir.file("big.json"), c.dump(2));
  RandomModelOptions o;
  o.config_json = dir.file("big.json");
  o.tokenizer = dir.file("tiny/tokenizer.json");
  o.out = dir.file("m");
  write_random_model_dir(o);
  const HfModelDir m = hf_load(dir.file("m"));
  EXPECT_EQ(m.config.vocab_size, c["vocab_size"].get<int64_t>());
  EXPECT_EQ(read_text_file(dir.file("m/tokenizer.json")), read_text_file(dir.file("tiny/tokenizer.json")));
  c["vocab_size"] = 300;
  write(dir.file("small.json"), c.dump(2));
  o.config_json = dir.file("small.json");
  o.out = dir.file("m2");
  EXPECT_ERROR_CONTAINS([&] { write_random_model_dir(o); }, "tokenizer has", "vocab_size 300");
}

}  // namespace
}  // namespace qt
