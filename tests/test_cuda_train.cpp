// The training step on the GPU (TrainStep): a captured CUDA graph replays what the eager static
// step computes, the static (padded) step matches the plain one, and a non-finite gradient stops
// the step naming the tensor without touching the weights. GTEST_SKIP without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include <cuda_runtime_api.h>

#include "core/bf16.h"
#include "dist/communicator.h"
#include "model/init.h"
#include "model/presets.h"
#include "model/qwen35.h"
#include "ops/cuda/cuda_backend.h"
#include "test_util.h"
#include "train/model_optimizer.h"
#include "train/train_step.h"

namespace qt {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Rows of these sample lengths, random tokens, the first target of each sample ignored.
std::vector<PackedRow> rows_of(const ModelConfig& cfg, const std::vector<std::vector<int64_t>>& lens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<PackedRow> rows;
  for (const auto& row_lens : lens) {
    PackedRow row;
    for (int64_t n : row_lens) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (auto& x : ids) x = tok(rng);
      std::vector<int32_t> labels = ids;
      labels[0] = -100;
      row.append_sample(ids, labels);
    }
    rows.push_back(row);
  }
  return rows;
}

// Rows of T tokens at most, odd sample lengths (1- and 2-token samples included).
std::vector<PackedRow> make_rows(const ModelConfig& cfg, int count, int64_t T, uint64_t seed) {
  std::vector<std::vector<int64_t>> lens;
  for (int r = 0; r < count; ++r) {
    lens.emplace_back();
    int64_t total = 0;
    const int64_t want[] = {1, 2, 37, 130, 65, 3, 200 + 17 * r};
    for (int64_t n : want) {
      if (total + n > T - 5) break;  // leave a gap: the static step pads it
      lens.back().push_back(n);
      total += n;
    }
  }
  return rows_of(cfg, lens, seed);
}

// Every trainable tensor at its init, seed 7.
void init_weights(Qwen35Model& model, const ModelConfig& cfg) {
  for (size_t i = 0; i < model.specs().size(); ++i) {
    std::vector<float> w(static_cast<size_t>(shape_numel(model.specs()[i].shape)));
    init_param(model.specs()[i], cfg.initializer_range, 7, DType::F32, w.data());
    model.set_param_f32(i, w);
  }
}

struct Rig {
  ModelConfig cfg;
  CudaBackend be;
  Qwen35Model model;
  std::unique_ptr<ModelOptimizer> opt;
  explicit Rig(int64_t T, Checkpointing ckpt = Checkpointing::None, ModelConfig c = preset_config("tiny"),
               Precision precision = Precision::BF16)
      : cfg(std::move(c)), model(cfg, be, T, ckpt) {
    model.set_precision(precision);
    init_weights(model, cfg);
    AdamWConfig a;
    a.lr = 1e-3;
    a.weight_decay = 0.1;
    opt = ModelOptimizer::create(model, a);
  }
};

TEST(CudaTrainStep, GraphReplayMatchesEagerStaticSteps) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  Rig graph_rig(T), eager_rig(T);
  TrainStep graph(graph_rig.model, *graph_rig.opt, 2, 16, true);
  TrainStep eager(eager_rig.model, *eager_rig.opt, 2, 16, false);
  EXPECT_EQ(graph.mode(), "cuda-graph");
  EXPECT_EQ(eager.mode(), "eager (static shapes)");
  const std::vector<PackedRow> rows = make_rows(graph_rig.cfg, 8, T, 1);
  for (int s = 0; s < 4; ++s) {
    const std::vector<PackedRow> step_rows = {rows[2 * s], rows[2 * s + 1]};
    const StepResult a = graph.run(step_rows, 1e-3, 1.0, s + 1);
    const StepResult b = eager.run(step_rows, 1e-3, 1.0, s + 1);
    EXPECT_EQ(a.replayed, s > 0) << "step " << s + 1;
    EXPECT_FALSE(b.replayed);
    EXPECT_EQ(a.trained, b.trained);
    // Same kernels; attention's dQ atomics may round differently between runs.
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 2e-4 * std::abs(b.loss_sum)) << "step " << s + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 2e-3 * b.grad_norm) << "step " << s + 1;
  }
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_GT(graph.graph_kernels(), 50);
  for (size_t i = 0; i < graph_rig.model.specs().size(); ++i) {
    const std::vector<float> a = graph_rig.model.param_f32(i), b = eager_rig.model.param_f32(i);
    double num = 0, den = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      num += (double(a[j]) - b[j]) * (double(a[j]) - b[j]);
      den += double(b[j]) * b[j];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 2e-3) << graph_rig.model.specs()[i].name;
  }
}

// Rows with a sample long enough for the GDN's split and rows without one run different kernels
// (the split's ticket walk, or the unsplit scans): the step keeps one graph for each kind, and
// both replay what the eager static step computes. The tiny model with Qwen3.5's GDN head dims
// (128), whose kernels can split.
TEST(CudaTrainStep, OneGraphPerSplitKind) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 4096;
  ModelConfig cfg = preset_config("tiny");
  cfg.linear_key_head_dim = cfg.linear_value_head_dim = 128;
  Rig graph_rig(T, Checkpointing::None, cfg), eager_rig(T, Checkpointing::None, cfg);
  const GdnDims gd{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                   cfg.linear_value_head_dim};
  const int split_from = graph_rig.be.gdn_split_seqlen(gd, T, 16);
  ASSERT_GT(split_from, 600) << "the rows below assume the split starts above 600 tokens";
  ASSERT_LT(split_from, 3000) << "the rows below assume a 3000-token sample may split";
  TrainStep graph(graph_rig.model, *graph_rig.opt, 1, 16, true);
  TrainStep eager(eager_rig.model, *eager_rig.opt, 1, 16, false);
  // Short rows: every sample and the padding (4096 - 3540 = 556) below 600 tokens. The long one's
  // 3000-token sample splits (tests/test_gdn_plan.cpp).
  const std::vector<int64_t> shorter = {1, 2, 37, 500, 600, 600, 600, 600, 600}, longer = {3, 3000, 900, 65};
  const std::vector<PackedRow> rows = rows_of(cfg, {shorter, longer, shorter, longer, shorter, longer}, 9);
  const bool replays[6] = {false, false, true, true, true, true};  // each kind's first step runs eagerly
  for (int s = 0; s < 6; ++s) {
    const StepResult a = graph.run({rows[s]}, 1e-3, 1.0, s + 1);
    const StepResult b = eager.run({rows[s]}, 1e-3, 1.0, s + 1);
    EXPECT_EQ(a.replayed, replays[s]) << "step " << s + 1;
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 2e-4 * std::abs(b.loss_sum)) << "step " << s + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 2e-3 * b.grad_norm) << "step " << s + 1;
  }
  EXPECT_EQ(graph.captures(), 2);
}

// Recompute inside a captured graph: full and selective checkpointing follow the same losses.
// With the deterministic attention backward (the default) nothing in the step depends on timing:
// graph replay and eager steps from the same start give the same bits (loss, grad norm, weights),
// which is what makes a resumed GPU run equal the uninterrupted one.
TEST(CudaTrainStep, DeterministicGraphAndEagerStepsAreBitEqual) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  Rig graph_rig(T), eager_rig(T);
  graph_rig.be.set_deterministic(true);
  eager_rig.be.set_deterministic(true);
  ASSERT_NE(std::count(graph_rig.cfg.layer_types.begin(), graph_rig.cfg.layer_types.end(), LayerKind::FullAttention), 0)
      << "the tiny preset has no attention layer to test";
  TrainStep graph(graph_rig.model, *graph_rig.opt, 2, 16, true);
  TrainStep eager(eager_rig.model, *eager_rig.opt, 2, 16, false);
  const std::vector<PackedRow> rows = make_rows(graph_rig.cfg, 8, T, 3);
  for (int s = 0; s < 4; ++s) {
    const std::vector<PackedRow> step_rows = {rows[2 * s], rows[2 * s + 1]};
    const StepResult a = graph.run(step_rows, 1e-3, 1.0, s + 1);
    const StepResult b = eager.run(step_rows, 1e-3, 1.0, s + 1);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << s + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s + 1;
  }
  for (size_t i = 0; i < graph_rig.model.specs().size(); ++i)
    EXPECT_TRUE(graph_rig.model.param_f32(i) == eager_rig.model.param_f32(i)) << graph_rig.model.specs()[i].name;
}

// ZeRO-3 at world size 1 (the local communicator's copies, and NCCL with one rank) runs the same
// kernels on the same values as the unsharded step: gathers and reduce-scatters are exact copies,
// a later micro-batch's gradient is added in fp32 as the GEMM's accumulation would. Both buffer
// schemes, under a captured graph, with full checkpointing (the backward gathers each layer again).
TEST(CudaTrainStep, Zero3AtOneRankMatchesTheUnshardedStep) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  struct Case {
    const char* comm;
    bool reshard;
    Checkpointing ckpt;
  };
  std::vector<Case> cases = {{"auto", true, Checkpointing::None}, {"auto", false, Checkpointing::None},
                             {"auto", true, Checkpointing::Full}};
  if (nccl_built()) cases.push_back({"nccl", true, Checkpointing::Selective});
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.comm) + (c.reshard ? " reshard" : " keep") + " " + checkpointing_name(c.ckpt));
    Rig ref(T, c.ckpt);
    ref.be.set_deterministic(true);
    CudaBackend be;
    be.set_deterministic(true);
    const std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, be, c.comm, 60);
    Zero3Options z;
    z.comm = comm.get();
    z.reshard_after_forward = c.reshard;
    Qwen35Model model(ref.cfg, be, T, c.ckpt, nullptr, &z);
    ASSERT_NE(model.weight_shards(), nullptr);
    int sharded = 0;
    for (size_t i = 0; i < model.specs().size(); ++i) {
      sharded += model.weight_shards()->sharded(i);
      std::vector<float> w(static_cast<size_t>(shape_numel(model.specs()[i].shape)));
      init_param(model.specs()[i], ref.cfg.initializer_range, 7, DType::F32, w.data());
      model.set_param_f32(i, w);
    }
    ASSERT_GT(sharded, 2);
    AdamWConfig a;
    a.lr = 1e-3;
    a.weight_decay = 0.1;
    auto opt = ModelOptimizer::create(model, a);
    ASSERT_TRUE(opt->supports_enqueue());
    TrainStep want(ref.model, *ref.opt, 2, 16, true), got(model, *opt, 2, 16, true);
    const std::vector<PackedRow> rows = make_rows(ref.cfg, 8, T, 5);
    for (int s = 0; s < 4; ++s) {
      const std::vector<PackedRow> step_rows = {rows[2 * s], rows[2 * s + 1]};
      const StepResult x = want.run(step_rows, 1e-3, 1.0, s + 1), y = got.run(step_rows, 1e-3, 1.0, s + 1);
      EXPECT_EQ(y.replayed, s > 0);
      EXPECT_NEAR(y.loss_sum, x.loss_sum, 1e-6 * std::abs(x.loss_sum)) << "step " << s + 1;
      EXPECT_NEAR(y.grad_norm, x.grad_norm, 1e-5 * x.grad_norm) << "step " << s + 1;
    }
    for (size_t i = 0; i < model.specs().size(); ++i) {
      const std::vector<float> p = model.param_f32(i), q = ref.model.param_f32(i);
      ASSERT_EQ(p.size(), q.size());
      double worst = 0, scale = 0;
      for (size_t j = 0; j < p.size(); ++j) {
        worst = std::max(worst, std::fabs(double(p[j]) - q[j]));
        scale = std::max(scale, std::fabs(double(q[j])));
      }
      EXPECT_LE(worst, std::ldexp(scale, -8)) << model.specs()[i].name;  // one bf16 rounding step at most
    }
  }
}

// train.precision fp8 under the captured step: the loss and gradient norm follow bf16's within
// fp8's rounding but are not bf16's; the graph re-quantizes the changed weights every step (it
// matches the eager static step, which does so on the host's word); ZeRO-3 at one rank, whose
// codes are written at each layer's use (and before a full recompute's GEMMs), matches the
// unsharded fp8 step.
TEST(CudaTrainStep, Fp8StepsTrackBf16UnderGraph) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  const ModelConfig tiny = preset_config("tiny");
  Rig bf(T), f8(T, Checkpointing::None, tiny, Precision::FP8), f8_eager(T, Checkpointing::None, tiny, Precision::FP8);
  TrainStep a(bf.model, *bf.opt, 2, 16, true), b(f8.model, *f8.opt, 2, 16, true), c(f8_eager.model, *f8_eager.opt, 2, 16, false);
  const std::vector<PackedRow> rows = make_rows(tiny, 12, T, 9);
  for (int s = 0; s < 6; ++s) {
    const std::vector<PackedRow> step_rows = {rows[2 * s], rows[2 * s + 1]};
    const StepResult ra = a.run(step_rows, 1e-3, 1.0, s + 1), rb = b.run(step_rows, 1e-3, 1.0, s + 1),
                     rc = c.run(step_rows, 1e-3, 1.0, s + 1);
    EXPECT_EQ(rb.replayed, s > 0);
    EXPECT_NE(rb.loss_sum, ra.loss_sum) << "step " << s + 1;
    EXPECT_NEAR(rb.loss_sum, ra.loss_sum, 0.01 * ra.loss_sum) << "step " << s + 1;
    EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 0.1 * ra.grad_norm) << "step " << s + 1;
    EXPECT_NEAR(rc.loss_sum, rb.loss_sum, 2e-4 * rb.loss_sum) << "step " << s + 1;
    EXPECT_NEAR(rc.grad_norm, rb.grad_norm, 2e-3 * rb.grad_norm) << "step " << s + 1;
  }
  EXPECT_GT(f8.model.memory_plan().fp8, 0);
  for (const Checkpointing ck : {Checkpointing::None, Checkpointing::Full}) {
    SCOPED_TRACE(checkpointing_name(ck));
    Rig ref(T, ck, tiny, Precision::FP8);
    ref.be.set_deterministic(true);
    CudaBackend be;
    be.set_deterministic(true);
    const std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, be, "auto", 60);
    Zero3Options z;
    z.comm = comm.get();
    Qwen35Model model(tiny, be, T, ck, nullptr, &z);
    model.set_precision(Precision::FP8);
    EXPECT_LT(model.memory_plan().fp8, ref.model.memory_plan().fp8);  // one layer's codes per role
    init_weights(model, tiny);
    AdamWConfig ac;
    ac.lr = 1e-3;
    ac.weight_decay = 0.1;
    auto opt = ModelOptimizer::create(model, ac);
    TrainStep want(ref.model, *ref.opt, 2, 16, true), got(model, *opt, 2, 16, true);
    for (int s = 0; s < 3; ++s) {
      const std::vector<PackedRow> step_rows = {rows[2 * s], rows[2 * s + 1]};
      const StepResult x = want.run(step_rows, 1e-3, 1.0, s + 1), y = got.run(step_rows, 1e-3, 1.0, s + 1);
      EXPECT_NEAR(y.loss_sum, x.loss_sum, 1e-6 * x.loss_sum) << "step " << s + 1;
      EXPECT_NEAR(y.grad_norm, x.grad_norm, 1e-5 * x.grad_norm) << "step " << s + 1;
    }
  }
}

TEST(CudaTrainStep, CheckpointingPoliciesTrackNoneUnderGraph) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  Rig none(T), sel(T, Checkpointing::Selective), full(T, Checkpointing::Full);
  TrainStep a(none.model, *none.opt, 1, 16, true), b(sel.model, *sel.opt, 1, 16, true),
      c(full.model, *full.opt, 1, 16, true);
  const std::vector<PackedRow> rows = make_rows(none.cfg, 3, T, 4);
  for (int s = 0; s < 3; ++s) {
    const StepResult ra = a.run({rows[s]}, 1e-3, 1.0, s + 1), rb = b.run({rows[s]}, 1e-3, 1.0, s + 1),
                     rc = c.run({rows[s]}, 1e-3, 1.0, s + 1);
    EXPECT_NEAR(rb.loss_sum, ra.loss_sum, 2e-4 * std::abs(ra.loss_sum)) << "step " << s + 1;
    EXPECT_NEAR(rc.loss_sum, ra.loss_sum, 2e-4 * std::abs(ra.loss_sum)) << "step " << s + 1;
    EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 2e-3 * ra.grad_norm) << "step " << s + 1;
    EXPECT_NEAR(rc.grad_norm, ra.grad_norm, 2e-3 * ra.grad_norm) << "step " << s + 1;
  }
  EXPECT_EQ(c.captures(), 1);
  EXPECT_GT(c.graph_kernels(), a.graph_kernels());  // the recompute is in the graph
}

// At Qwen3.5's GDN head dims (128) checkpointing keeps prep's results of each GDN layer (selective,
// one buffer per layer) or of the layer being recomputed (full, one buffer shared by all), and the
// backward reads them instead of running prep again; at these head dims none keeps them too (the
// fp16 backward from them is faster than the one from kept chunk states). Selective and full run
// the same kernels on the same values (the plain forward, the backward from prep's results, which
// tests/test_cuda_gdn.cpp finds bit-equal to recomputing them), so their steps are bit-equal: a
// layer of full reading another layer's T from the shared buffer would not be. None recomputes no
// activations, so it is held to the policies' usual tolerance.
TEST(CudaTrainStep, CheckpointingKeepsPrepResultsAtRealHeadDims) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 1024;
  ModelConfig cfg = preset_config("tiny");
  cfg.linear_key_head_dim = cfg.linear_value_head_dim = 128;
  const int64_t n_gdn = std::count(cfg.layer_types.begin(), cfg.layer_types.end(), LayerKind::GatedDeltaNet);
  ASSERT_GT(n_gdn, 1) << "the shared buffer needs two GDN layers to be tested";
  Rig none(T, Checkpointing::None, cfg), sel(T, Checkpointing::Selective, cfg), full(T, Checkpointing::Full, cfg);
  TrainStep a(none.model, *none.opt, 1, 16, true), b(sel.model, *sel.opt, 1, 16, true),
      c(full.model, *full.opt, 1, 16, true);
  const GdnDims gd{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                   cfg.linear_value_head_dim};
  const int64_t prep = none.be.gdn_state_bytes(gd, T, 16, GdnKeep::Prep);
  ASSERT_GT(prep, 0);
  ASSERT_TRUE(none.be.gdn_prefers_prep(gd));
  ASSERT_LT(prep, none.be.gdn_state_bytes(gd, T, 16, GdnKeep::States));
  EXPECT_EQ(none.model.memory_plan().mixer_state, n_gdn * prep);
  EXPECT_EQ(sel.model.memory_plan().mixer_state, n_gdn * prep);
  EXPECT_EQ(full.model.memory_plan().mixer_state, prep);
  EXPECT_STREQ(none.model.memory_plan().mixer_kept, "prep's results");
  EXPECT_STREQ(sel.model.memory_plan().mixer_kept, "prep's results");
  EXPECT_NE(sel.model.memory_plan().describe().find("(prep's results)"), std::string::npos);
  const std::vector<PackedRow> rows = make_rows(cfg, 3, T, 6);
  for (int s = 0; s < 3; ++s) {
    const StepResult ra = a.run({rows[s]}, 1e-3, 1.0, s + 1), rb = b.run({rows[s]}, 1e-3, 1.0, s + 1),
                     rc = c.run({rows[s]}, 1e-3, 1.0, s + 1);
    EXPECT_EQ(rc.loss_sum, rb.loss_sum) << "step " << s + 1;
    EXPECT_EQ(rc.grad_norm, rb.grad_norm) << "step " << s + 1;
    EXPECT_NEAR(rb.loss_sum, ra.loss_sum, 2e-4 * std::abs(ra.loss_sum)) << "step " << s + 1;
    EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 2e-3 * ra.grad_norm) << "step " << s + 1;
  }
  for (size_t i = 0; i < sel.model.specs().size(); ++i)
    EXPECT_TRUE(sel.model.param_f32(i) == full.model.param_f32(i)) << sel.model.specs()[i].name;
}

// The backward reading the forward's kept GDN state computes exactly what it computes when it
// recomputes that state (same kernels, same precision); prep's results alone too (where the
// mma.sync scans run, as at these head dims, that part is empty and the backward recomputes prep).
TEST(CudaTrainStep, KeptGdnStateBackwardIsBitEqualToRecompute) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  CudaBackend be;
  const GdnDims d{2, 4, 32, 48};
  const int64_t T = 301, C = d.conv_dim(), Hv = d.num_v_heads;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), gate(-0.2f, -0.001f), b01(0.05f, 0.95f);
  auto upload = [&](DType dt, const Shape& shape, auto gen) {
    HostTensor h(dt, shape);
    std::vector<float> v(static_cast<size_t>(h.t.numel()));
    for (float& x : v) x = gen();
    tensor_from_f32(h.t, v.data());
    Tensor t = be.alloc(dt, shape);
    be.copy_from_host(t, h.t.data);
    return t;
  };
  const Tensor qkv = upload(DType::BF16, {T, C}, [&] { return u(rng); });
  const Tensor g = upload(DType::F32, {T, Hv}, [&] { return gate(rng); });
  const Tensor beta = upload(DType::F32, {T, Hv}, [&] { return b01(rng); });
  const Tensor d_o = upload(DType::BF16, {T, Hv, d.v_head_dim}, [&] { return u(rng); });
  const std::vector<int32_t> cu = {0, 1, 3, 130, 301, 301};  // a 1- and 2-token sample, a padded empty one
  Tensor cu_dev = be.alloc(DType::I32, {6});
  be.copy_from_host(cu_dev, cu.data());
  SeqInfo seqs{cu_dev, 5, 171, static_cast<int>(T)};
  const Tensor state = be.alloc(DType::U8, {be.gdn_state_bytes(d, T, 5, GdnKeep::States)});
  EXPECT_EQ(be.gdn_state_bytes(d, T, 5, GdnKeep::Prep), 0);
  EXPECT_FALSE(be.gdn_prefers_prep(d));  // the mma.sync kernels: none keeps the chunk states here
  const Tensor o = be.alloc(DType::BF16, {T, Hv, d.v_head_dim});
  Tensor dq[3], dg[3], db[3];
  for (int k = 0; k < 3; ++k) {
    dq[k] = be.alloc(DType::BF16, {T, C});
    dg[k] = be.alloc(DType::F32, {T, Hv});
    db[k] = be.alloc(DType::F32, {T, Hv});
  }
  be.gdn_forward(o, qkv, g, beta, d, seqs, state, GdnKeep::States);
  be.gdn_backward(dq[0], dg[0], db[0], d_o, qkv, g, beta, d, seqs, state, GdnKeep::States);
  be.gdn_backward(dq[1], dg[1], db[1], d_o, qkv, g, beta, d, seqs, Tensor(), GdnKeep::States);
  be.gdn_forward(o, qkv, g, beta, d, seqs, Tensor(), GdnKeep::Prep);
  be.gdn_backward(dq[2], dg[2], db[2], d_o, qkv, g, beta, d, seqs, Tensor(), GdnKeep::Prep);
  for (const auto& [a, b, name] : {std::tuple{dq[0], dq[1], "dqkv"}, {dg[0], dg[1], "dg"}, {db[0], db[1], "dbeta"},
                                   {dq[2], dq[1], "dqkv (prep)"}, {dg[2], dg[1], "dg (prep)"},
                                   {db[2], db[1], "dbeta (prep)"}}) {
    std::vector<char> ha(a.nbytes()), hb(b.nbytes());
    be.copy_to_host(ha.data(), a);
    be.copy_to_host(hb.data(), b);
    EXPECT_EQ(ha, hb) << name;
  }
  const Tensor small = be.alloc(DType::U8, {16});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o, qkv, g, beta, d, seqs, small, GdnKeep::States); }, "gdn_forward", "state",
                        "keeping the chunk states");
  // At dk = dv = 128 prep's part is kept, and a buffer too small for it is refused by name.
  const GdnDims real{2, 4, 128, 128};
  const int64_t prep = be.gdn_state_bytes(real, T, 5, GdnKeep::Prep);
  EXPECT_GT(prep, 16);
  EXPECT_LT(prep * 4, be.gdn_state_bytes(real, T, 5, GdnKeep::States));
  const Tensor qkv_r = be.alloc(DType::BF16, {T, real.conv_dim()}), g_r = be.alloc(DType::F32, {T, 4}),
               b_r = be.alloc(DType::F32, {T, 4}), o_r = be.alloc(DType::BF16, {T, 4, 128});
  EXPECT_ERROR_CONTAINS([&] { be.gdn_forward(o_r, qkv_r, g_r, b_r, real, seqs, small, GdnKeep::Prep); }, "gdn_forward",
                        "state", "keeping prep's results");
}

TEST(CudaTrainStep, StaticStepMatchesPlainStep) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 512;
  Rig rig(T);
  const std::vector<PackedRow> rows = make_rows(rig.cfg, 1, T, 2);
  // Static shape first: the plain step then also keeps the GDN state (3xTF32 forward), so the two
  // differ only by the padding and the shapes the GEMMs see.
  rig.model.set_static_shape(24, 1);
  rig.model.zero_grads();
  const LossResult plain = rig.model.step(rows[0], true, 1.0);
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < rig.model.specs().size(); ++i) grads.push_back(rig.model.grad_f32(i));
  rig.model.zero_grads();
  rig.model.stage(rows[0], 0);
  rig.model.enqueue_step(0, true, 1.0);
  double sum = 0;
  rig.be.copy_to_host(&sum, rig.model.static_loss_sums());
  EXPECT_NEAR(sum, plain.loss_sum, 1e-4 * std::abs(plain.loss_sum));
  for (size_t i = 0; i < rig.model.specs().size(); ++i) {
    const std::vector<float> g = rig.model.grad_f32(i);
    double num = 0, den = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      num += (double(g[j]) - grads[i][j]) * (double(g[j]) - grads[i][j]);
      den += double(grads[i][j]) * grads[i][j];
    }
    // bf16 activations: a GEMM over 512 instead of 438 rows may round differently. (With the
    // plain step's GDN forward in TF32 against the static one's 3xTF32 this reached 2.1 %.)
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-2) << rig.model.specs()[i].name;
  }
}

TEST(CudaTrainStep, NonFiniteGradientStopsNamingTensorAndKeepsWeights) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t T = 256;
  Rig rig(T);
  TrainStep step(rig.model, *rig.opt, 1, 16, true);
  const std::vector<PackedRow> rows = make_rows(rig.cfg, 3, T, 3);
  step.run({rows[0]}, 1e-3, 1.0, 1);
  step.run({rows[1]}, 1e-3, 1.0, 2);  // captured and replayed
  // Poison one weight: its gradients, and everything downstream, become NaN.
  size_t k = 0;
  while (rig.model.specs()[k].name.find("mlp.down_proj") == std::string::npos) ++k;
  std::vector<float> w = rig.model.param_f32(k);
  w[5] = std::nanf("");
  rig.model.set_param_f32(k, w);
  std::vector<std::vector<float>> before;
  for (size_t i = 0; i < rig.model.specs().size(); ++i) before.push_back(rig.model.param_f32(i));
  EXPECT_ERROR_CONTAINS([&] { step.run({rows[2]}, 1e-3, 1.0, 3); }, "step 3", "has NaN/inf");
  for (size_t i = 0; i < rig.model.specs().size(); ++i) {
    const std::vector<float> after = rig.model.param_f32(i);
    for (size_t j = 0; j < after.size(); ++j) {
      if (std::isnan(after[j]) && std::isnan(before[i][j])) continue;
      ASSERT_EQ(after[j], before[i][j]) << rig.model.specs()[i].name << "[" << j << "] changed";
    }
  }
}

}  // namespace
}  // namespace qt
