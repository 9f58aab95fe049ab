// The training loop (the CPU backend unless a test says cuda): the loss falls, checkpoints load as
// HF directories, and a run stopped and resumed from a checkpoint continues exactly as the
// uninterrupted run, on the CPU and (where a GPU is present) on CUDA.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "model/random_model_dir.h"
#include "ops/backend_factory.h"
#include "test_util.h"
#include "train/trainer.h"

namespace qt {
namespace {

using testing::ScratchDir;

// A small addition data set in the ultrachat schema and a config for it.
std::string make_run(const ScratchDir& dir, int64_t max_steps, int64_t save_every, const std::string& out) {
  write_random_model_dir("tiny", dir.file("init"), 5, DType::F32);
  std::ofstream data(dir.file("train.jsonl"));
  for (int r = 0; r < 3; ++r)
    for (int a = 0; a < 10; ++a)
      for (int b = 0; b < 10; ++b)
        data << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << a << "+" << b
             << "?\"}, {\"role\": \"assistant\", \"content\": \"" << a + b << "\"}]}\n";
  std::ofstream cfg(dir.file("train.yaml"));
  cfg << "model: init\noutput_dir: " << out << "\ndata:\n  path: train.jsonl\n  thinking: off\n"
      << "  tokens_per_batch: 256\ntrain:\n  lr: 3.0e-3\n  warmup_steps: 2\n  global_batch_tokens: 512\n"
      << "  max_steps: " << max_steps << "\n  save_every: " << save_every << "\n  log_every: 0\n"
      << "  eval_fraction: 0.1\n  eval_every: 3\n";
  return dir.file("train.yaml");
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Trainer, LossFallsAndCheckpointIsAnHfDirectory) {
  ScratchDir dir("trainer-basic");
  const TrainSummary s = train_run(train_config_load(make_run(dir, 12, 0, "run"), {}));
  EXPECT_EQ(s.steps, 12);
  EXPECT_LT(s.last_loss, s.first_loss * 0.8) << "first " << s.first_loss << " last " << s.last_loss;
  EXPECT_GT(s.eval_loss, 0.0);
  HfModelDir m = hf_load(s.final_dir);
  EXPECT_EQ(m.config.num_hidden_layers, 4);
  EXPECT_TRUE(std::filesystem::exists(s.final_dir + "/tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(s.final_dir + "/optimizer.safetensors"));
  const auto metrics = read_metrics(dir.file("run/metrics.jsonl"));
  ASSERT_GE(metrics.size(), 12u);
  EXPECT_TRUE(metrics[2].contains("eval_loss"));  // eval_every: 3
  bool tb_events = false;
  for (const auto& de : std::filesystem::directory_iterator(dir.file("run/tb")))
    tb_events |= de.path().filename().string().rfind("events.out.tfevents.", 0) == 0 && de.file_size() > 100;
  EXPECT_TRUE(tb_events) << "no TensorBoard event file with scalars in run/tb";
}

// Runs 8 steps with a checkpoint at step 4, resumes a second run from it and checks that steps 5..8
// give the same losses and final weights bit for bit.
void check_resume_is_exact(const std::string& backend) {
  ScratchDir dir("trainer-resume-" + backend);
  const std::string cfg = make_run(dir, 8, 4, "full");
  const TrainSummary full = train_run(train_config_load(cfg, {"train.backend=" + backend}));
  ASSERT_TRUE(std::filesystem::exists(dir.file("full/checkpoint-4/trainer_state.json")));
  // Second run: same config, resumed from the step-4 checkpoint of the first, into another dir.
  std::filesystem::create_directories(dir.file("resumed"));
  const TrainSummary resumed = train_run(train_config_load(
      cfg, {"train.backend=" + backend, "output_dir=resumed", "train.resume=" + dir.file("full/checkpoint-4")}));
  EXPECT_EQ(resumed.steps, full.steps);
  const auto a = read_metrics(dir.file("full/metrics.jsonl")), b = read_metrics(dir.file("resumed/metrics.jsonl"));
  std::map<int64_t, double> loss_full, loss_resumed;
  for (const auto& r : a) if (r.contains("loss")) loss_full[r["step"].get<int64_t>()] = r["loss"].get<double>();
  for (const auto& r : b) if (r.contains("loss")) loss_resumed[r["step"].get<int64_t>()] = r["loss"].get<double>();
  ASSERT_EQ(loss_resumed.size(), 4u);
  for (const auto& [step, loss] : loss_resumed) {
    ASSERT_TRUE(loss_full.count(step));
    EXPECT_EQ(loss, loss_full[step]) << "step " << step;  // bit-identical: same data, same math
  }
  HfModelDir x = hf_load(full.final_dir), y = hf_load(resumed.final_dir);
  for (const auto& p : x.params) {
    const auto& ex = x.tensor(p);
    const auto& ey = y.store.get(p.name);
    ASSERT_EQ(ex.nbytes, ey.nbytes);
    EXPECT_EQ(std::memcmp(ex.data, ey.data, ex.nbytes), 0) << p.name;
  }
}

TEST(Trainer, ResumeContinuesExactlyAsTheUninterruptedRun) { check_resume_is_exact("cpu"); }

// The same on the GPU: exact only because the attention backward is deterministic by default
// (train.deterministic; with fp32 dQ atomics the resumed losses differ in the last bits).
TEST(Trainer, CudaResumeContinuesExactlyAsTheUninterruptedRun) {
  if (default_backend_name() != "cuda") GTEST_SKIP() << "no CUDA device (or no CUDA backend in this build)";
  check_resume_is_exact("cuda");
}

TEST(TrainerBadInput, ConfigErrorsNameTheKey) {
  ScratchDir dir("trainer-bad");
  const std::string cfg = make_run(dir, 2, 0, "run");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.lr_typo=1"}); }, "unknown key train.lr_typo");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.lr=-1"}); }, "--set 'train.lr=-1'", "train.lr is -1, must be in (0, 10]");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.schedule=exp"}); }, "train.schedule is 'exp'", "cosine|linear|constant");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"nonsense"}); }, "expected key=value");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.backend=tpu"}); }, "train.backend is 'tpu'");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"train.deterministic=maybe"}); }, "train.deterministic");
  EXPECT_FALSE(train_config_load(cfg, {"train.deterministic=false"}).deterministic);
  EXPECT_TRUE(train_config_load(cfg, {}).deterministic);  // on by default: exact resume on the GPU too
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"train.resume=" + dir.file("nope")})); }, "nope");
}

}  // namespace
}  // namespace qt
