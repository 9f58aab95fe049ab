// Distributed training on CPU ranks: the launcher environments, and real `mpirun -np N qwentune
// train` jobs of the tiny model checked against one rank (losses per step, final weights) for ZeRO
// 0 to 3 at 2 and 4 ranks, and a resume that moves from 2 to 4 to 1 ranks on the same curve.
// The jobs need mpirun and an MPI build (skipped otherwise); oversubscription lets 4 ranks share
// CI's 2 cores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "dist/launch_env.h"
#include "io/safetensors.h"
#include "model/random_model_dir.h"
#include "test_util.h"

namespace qt {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

RankInfo parse(const std::map<std::string, std::string>& env) {
  return launch_env_parse([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, ReadsEachLauncher) {
  const RankInfo none = parse({});
  EXPECT_EQ(none.launcher, "none");
  EXPECT_EQ(none.world, 1);
  EXPECT_FALSE(none.distributed());

  const RankInfo ompi = parse({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(ompi.launcher, "mpirun");
  EXPECT_EQ(ompi.rank, 3);
  EXPECT_EQ(ompi.world, 8);
  EXPECT_EQ(ompi.local_rank, 1);
  EXPECT_EQ(ompi.local_world, 2);

  const RankInfo slurm = parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "5"},
                                {"SLURM_NTASKS_PER_NODE", "8(x2)"}});
  EXPECT_EQ(slurm.launcher, "srun");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world, 16);
  EXPECT_EQ(slurm.local_rank, 5);

  const RankInfo torch = parse({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(torch.launcher, "torchrun");
  EXPECT_EQ(torch.rank, 1);
  EXPECT_EQ(torch.world, 4);
  EXPECT_EQ(torch.master_addr, "10.0.0.7");
  EXPECT_EQ(torch.master_port, 29500);

  // mpirun inside a Slurm allocation: OpenMPI's own variables describe the processes it started.
  const RankInfo both = parse({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(both.launcher, "mpirun");
  EXPECT_EQ(both.rank, 2);
}

TEST(LaunchEnv, BadValuesAreNamed) {
  EXPECT_ERROR_CONTAINS([] { parse({{"RANK", "4"}, {"WORLD_SIZE", "4"}}); }, "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_ERROR_CONTAINS([] { parse({{"RANK", "x"}, {"WORLD_SIZE", "4"}}); }, "RANK is 'x'");
  EXPECT_ERROR_CONTAINS([] { parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}); }, "SLURM_NTASKS is '0'");
  EXPECT_ERROR_CONTAINS([] { parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "port"}}); },
                        "MASTER_PORT is 'port'");
}

// ---- real jobs -----------------------------------------------------------------------------------

bool have_mpirun() { return mpi_built() && std::system("command -v mpirun > /dev/null 2>&1") == 0; }

// A tiny model, 96 chat samples and a config of 4-row (512-token) steps: 1, 2 and 4 ranks share a
// step evenly.
struct Job {
  ScratchDir dir{"dist"};
  Job() {
    write_random_model_dir("tiny", dir.file("init"), 5, DType::F32);
    std::ofstream data(dir.file("train.jsonl"));
    for (int a = 0; a < 12; ++a)
      for (int b = 0; b < 8; ++b)
        data << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << a << "+" << b
             << "?\"}, {\"role\": \"assistant\", \"content\": \"" << a + b << "\"}]}\n";
    std::ofstream(dir.file("train.yaml"))
        << "model: init\ndata:\n  path: train.jsonl\n  thinking: off\n  tokens_per_batch: 128\ntrain:\n"
           "  backend: cpu\n  lr: 3.0e-3\n  log_every: 0\n  max_steps: 4\n  global_batch_tokens: 512\n";
  }
  // Runs `qwentune train` on `ranks` ranks (1: without mpirun) into output_dir `out`; returns the
  // exit status, the output in *log.
  int launch(int ranks, const std::string& out, const std::string& sets, std::string* log) const {
    std::string cmd = "cd '" + dir.path() + "' && ";
    if (ranks > 1) cmd += "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(ranks) + " ";
    cmd += std::string(QT_QWENTUNE_BIN) + " train --config train.yaml --set output_dir=" + out + " " + sets + " > '" +
           out + ".log' 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream in(dir.file(out + ".log"));
    *log = cmd + "\n" + std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return rc;
  }
  void run(int ranks, const std::string& out, const std::string& sets = "") const {
    std::string log;
    ASSERT_EQ(launch(ranks, out, sets, &log), 0) << log;
  }
  std::map<int64_t, double> losses(const std::string& out) const {
    std::map<int64_t, double> by_step;
    std::ifstream in(dir.file(out + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) by_step[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return by_step;
  }
};

void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                        const std::string& what) {
  ASSERT_FALSE(got.empty()) << what;
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(want.count(step)) << what << ": step " << step << " is not in the reference";
    EXPECT_NEAR(loss, want.at(step), 2e-5 * std::fabs(want.at(step))) << what << " step " << step;
  }
}

// Every weight of two final/ directories within fp32 summation-order noise.
void expect_same_weights(const std::string& a, const std::string& b) {
  const TensorStore x = TensorStore::open_dir(a), y = TensorStore::open_dir(b);
  ASSERT_EQ(x.tensors().size(), y.tensors().size());
  for (const SafetensorsEntry* e : x.tensors()) {
    const SafetensorsEntry& f = y.get(e->name);
    ASSERT_EQ(e->dtype, DType::F32) << e->name;
    ASSERT_EQ(e->nbytes, f.nbytes) << e->name;
    const auto* p = reinterpret_cast<const float*>(e->data);
    const auto* q = reinterpret_cast<const float*>(f.data);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < e->nbytes / 4; ++i) {
      worst = std::max(worst, std::fabs(double(p[i]) - q[i]));
      scale = std::max(scale, std::fabs(double(p[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale + 1e-6) << e->name << " differs by " << worst;
  }
}

TEST(Dist, ZeroStagesMatchOneRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  job.run(1, "one");
  const auto want = job.losses("one");
  ASSERT_EQ(want.size(), 4u);
  for (int ranks : {2, 4})
    for (int zero : {0, 1, 2, 3}) {
      const std::string out = "w" + std::to_string(ranks) + "z" + std::to_string(zero);
      SCOPED_TRACE(out);
      job.run(ranks, out, "--set dist.zero=" + std::to_string(zero));
      expect_same_losses(job.losses(out), want, out);
      expect_same_weights(job.dir.file("one/final"), job.dir.file(out + "/final"));
    }
  // ZeRO-3 keeping the gathered layers through the step, and at one rank (the same machinery).
  for (const auto& [ranks, sets] : std::vector<std::pair<int, std::string>>{
           {2, "--set dist.zero=3 --set dist.reshard_after_forward=false"}, {1, "--set dist.zero=3"}}) {
    const std::string out = "z3r" + std::to_string(ranks);
    SCOPED_TRACE(out + " " + sets);
    job.run(ranks, out, sets);
    expect_same_losses(job.losses(out), want, out);
    expect_same_weights(job.dir.file("one/final"), job.dir.file(out + "/final"));
  }
  // Gradients summed in bf16 follow the same curve, a little off.
  job.run(2, "bf16", "--set dist.zero=2 --set dist.reduce_dtype=bf16");
  const auto bf = job.losses("bf16");
  ASSERT_EQ(bf.size(), 4u);
  for (const auto& [step, loss] : bf) EXPECT_NEAR(loss, want.at(step), 2e-2 * want.at(step)) << step;
}

// Untied embeddings: the LM head is a group of its own, gathered for the loss into the buffer the
// embedding used, and its gradient reduced right after the loss's backward.
TEST(Dist, Zero3WithUntiedHeadMatchesOneRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  {
    std::ifstream in(job.dir.file("init/config.json"));
    nlohmann::json c = nlohmann::json::parse(in);
    c["tie_word_embeddings"] = false;
    std::ofstream(job.dir.file("untied.json")) << c.dump(2);
  }
  RandomModelOptions o;
  o.config_json = job.dir.file("untied.json");
  o.out = job.dir.file("untied");
  o.seed = 5;
  o.dtype = DType::F32;
  write_random_model_dir(o);
  job.run(1, "one", "--set model=untied");
  const auto want = job.losses("one");
  ASSERT_EQ(want.size(), 4u);
  for (int ranks : {2, 4}) {
    const std::string out = "z3w" + std::to_string(ranks);
    job.run(ranks, out, "--set model=untied --set dist.zero=3");
    expect_same_losses(job.losses(out), want, out);
    expect_same_weights(job.dir.file("one/final"), job.dir.file(out + "/final"));
  }
}

// train.precision fp8 through the trainer: ZeRO-3 over 2 ranks (each layer's codes written at its
// use from the gathered weights) follows the single-rank fp8 run, which follows fp32's loss within
// fp8's rounding.
TEST(Dist, Fp8Zero3MatchesOneRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  job.run(1, "one");
  job.run(1, "fp8", "--set train.precision=fp8");
  const auto want = job.losses("one"), fp8 = job.losses("fp8");
  ASSERT_EQ(fp8.size(), 4u);
  for (const auto& [step, loss] : fp8) {
    EXPECT_NE(loss, want.at(step)) << step;
    EXPECT_NEAR(loss, want.at(step), 1e-2 * want.at(step)) << step;
  }
  job.run(2, "fp8z3", "--set train.precision=fp8 --set dist.zero=3");
  const auto z3 = job.losses("fp8z3");
  ASSERT_EQ(z3.size(), 4u);
  for (const auto& [step, loss] : z3) EXPECT_NEAR(loss, fp8.at(step), 1e-3 * fp8.at(step)) << step;
}

// A checkpoint written by 2 ranks resumes on 4, whose checkpoint resumes on 1: the losses and the
// final weights are those of the uninterrupted single-rank run. Each rank writes its own part of
// the sharded optimizer state; a 2-rank ZeRO-3 checkpoint resumes on 1 rank too.
TEST(Dist, ResumeAcrossWorldSizes) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  job.run(1, "one");
  const auto want = job.losses("one");
  job.run(2, "two", "--set dist.zero=2 --set train.save_every=1");
  // Each rank wrote its own rows of the sharded state (nothing gathered m and v), listed in the
  // completion marker; the single-file form is only for unsharded optimizers.
  for (const char* part : {"optimizer-rank-00000-of-00002.safetensors", "optimizer-rank-00001-of-00002.safetensors"}) {
    EXPECT_TRUE(fs::is_regular_file(job.dir.file(std::string("two/checkpoint-1/") + part))) << part;
    std::ifstream marker(job.dir.file("two/checkpoint-1/.qwentune-complete"));
    const std::string listed((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
    EXPECT_NE(listed.find(part), std::string::npos) << listed;
  }
  EXPECT_FALSE(fs::exists(job.dir.file("two/checkpoint-1/optimizer.safetensors")));
  // The weights too: each rank wrote its share of whole tensors, indexed by model.safetensors.index.json.
  EXPECT_TRUE(fs::is_regular_file(job.dir.file("two/checkpoint-1/model-00002-of-00002.safetensors")));
  EXPECT_TRUE(fs::is_regular_file(job.dir.file("two/checkpoint-1/model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(job.dir.file("two/checkpoint-1/model.safetensors")));
  EXPECT_FALSE(fs::exists(job.dir.file("two/checkpoint-1.parts")));
  fs::create_directories(job.dir.file("four"));
  fs::copy(job.dir.file("two/checkpoint-1"), job.dir.file("four/checkpoint-1"), fs::copy_options::recursive);
  job.run(4, "four", "--set dist.zero=1 --set train.save_every=1 --set train.resume=auto");
  fs::create_directories(job.dir.file("back"));
  fs::copy(job.dir.file("four/checkpoint-2"), job.dir.file("back/checkpoint-2"), fs::copy_options::recursive);
  EXPECT_TRUE(fs::is_regular_file(job.dir.file("four/checkpoint-2/optimizer-rank-00003-of-00004.safetensors")));
  job.run(1, "back", "--set train.resume=auto");
  const auto four = job.losses("four"), back = job.losses("back");
  EXPECT_EQ(four.begin()->first, 2);
  EXPECT_EQ(back.begin()->first, 3);
  expect_same_losses(four, want, "4 ranks from the 2-rank checkpoint");
  expect_same_losses(back, want, "1 rank from the 4-rank checkpoint");
  expect_same_weights(job.dir.file("one/final"), job.dir.file("back/final"));
  // final/ written by 4 ranks in parallel (one file each) is the single-rank one.
  EXPECT_TRUE(fs::is_regular_file(job.dir.file("four/final/model-00004-of-00004.safetensors")));
  expect_same_weights(job.dir.file("one/final"), job.dir.file("four/final"));
  // ZeRO-3 (the model's own weight shards) writes its parts the same way and resumes on 1 rank.
  job.run(2, "z3", "--set dist.zero=3 --set train.save_every=1");
  EXPECT_TRUE(fs::is_regular_file(job.dir.file("z3/checkpoint-2/optimizer-rank-00001-of-00002.safetensors")));
  fs::create_directories(job.dir.file("z3back"));
  fs::copy(job.dir.file("z3/checkpoint-2"), job.dir.file("z3back/checkpoint-2"), fs::copy_options::recursive);
  job.run(1, "z3back", "--set train.resume=auto");
  expect_same_losses(job.losses("z3back"), want, "1 rank from the 2-rank ZeRO-3 checkpoint");
}

// A parallel save that cannot start (its parts directory holds a user's file) stops every rank
// with rank 0's error instead of leaving the others waiting, and deletes nothing.
TEST(Dist, ParallelSaveFailureStopsEveryRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  fs::create_directories(job.dir.file("stuck/checkpoint-1.parts"));
  std::ofstream(job.dir.file("stuck/checkpoint-1.parts/keep.txt")) << "a user's";
  std::string log;
  EXPECT_NE(job.launch(2, "stuck", "--set dist.zero=2 --set train.save_every=1 --set dist.timeout_s=60", &log), 0) << log;
  EXPECT_NE(log.find("move them away"), std::string::npos) << log;  // the save's error, not the start's warning
  EXPECT_TRUE(fs::exists(job.dir.file("stuck/checkpoint-1.parts/keep.txt")));
  EXPECT_FALSE(fs::exists(job.dir.file("stuck/checkpoint-1")));
}

// What cannot work is said before anything runs.
TEST(Dist, UnsupportedCombinationsAreErrors) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun / MPI build";
  Job job;
  std::string log;
  EXPECT_NE(job.launch(3, "uneven", "", &log), 0);
  EXPECT_NE(log.find("3 ranks cannot share evenly: make it a multiple of 384"), std::string::npos) << log;
  EXPECT_NE(job.launch(2, "z3lora", "--set dist.zero=3 --set train.method=lora", &log), 0);
  EXPECT_NE(log.find("dist.zero 3 shards full fine-tuning"), std::string::npos) << log;
  EXPECT_NE(job.launch(2, "z3bf16", "--set dist.zero=3 --set dist.reduce_dtype=bf16", &log), 0);
  EXPECT_NE(log.find("dist.reduce_dtype bf16 is not built for ZeRO-3"), std::string::npos) << log;
}

}  // namespace
}  // namespace qt
