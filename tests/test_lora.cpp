// LoRA (model/lora.h): the op's backward against finite differences, the model's adapter
// gradients against finite differences of the whole loss, training that starts exactly at the
// base model, PEFT's file layout, continuing from an adapter, and merge = adapter model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "io/mapped_file.h"
#include "io/peft_adapter.h"
#include "model/lora.h"
#include "model/qwen35.h"
#include "model/random_model_dir.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/reference_ops.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace qt {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

std::vector<double> rnd(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// Small random B (PEFT starts it at zero, which would leave A's gradient zero).
void give_b_values(Qwen35Model& m) {
  std::mt19937_64 rng(5);
  for (size_t i = 1; i < m.num_adapter_tensors(); i += 2) {
    auto v = rnd(rng, shape_numel(m.specs()[i].shape));
    std::vector<float> f(v.begin(), v.end());
    for (auto& x : f) x *= 0.05f;
    m.set_param_f32(i, f);
  }
}

TEST(LoraOp, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(7);
  const int64_t T = 5, N = 6, K = 7, r = 3;
  const double scale = 1.7;
  auto x = rnd(rng, T * K), a = rnd(rng, r * K), b = rnd(rng, N * r), R = rnd(rng, T * N);
  auto loss = [&] {
    std::vector<double> y(static_cast<size_t>(T * N), 0.0), t(static_cast<size_t>(T * r));
    ref::lora_forward(y.data(), t.data(), x.data(), a.data(), b.data(), T, N, K, r, scale);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * R[i];
    return s;
  };
  std::vector<double> y(static_cast<size_t>(T * N), 0.0), t(static_cast<size_t>(T * r)), dt(t.size());
  ref::lora_forward(y.data(), t.data(), x.data(), a.data(), b.data(), T, N, K, r, scale);
  std::vector<double> dx(x.size(), 0.0), da(a.size(), 5.0), db(b.size(), 5.0);  // written over (accumulate false)
  ref::lora_backward(dx.data(), da.data(), db.data(), dt.data(), R.data(), x.data(), t.data(), a.data(), b.data(), T, N,
                     K, r, scale, false);
  for (auto [name, v, g] : {std::tuple<const char*, std::vector<double>*, std::vector<double>*>{"x", &x, &dx},
                            {"A", &a, &da}, {"B", &b, &db}}) {
    double worst = 0, mx = 0;
    for (size_t i = 0; i < v->size(); ++i) {
      const double s = (*v)[i];
      (*v)[i] = s + 1e-6;
      const double lp = loss();
      (*v)[i] = s - 1e-6;
      const double lm = loss();
      (*v)[i] = s;
      worst = std::max(worst, std::abs((lp - lm) / 2e-6 - (*g)[i]) / std::max(1.0, std::abs((*g)[i])));
      mx = std::max(mx, std::abs((*g)[i]));
    }
    EXPECT_LT(worst, 1e-6) << name;
    EXPECT_GT(mx, 1e-2) << name << ": gradient (near) zero";
  }
}

TEST(LoraOp, DropoutKeepsOneMinusPScaledAndRedrawsTheSameMask) {
  CpuBackend be;
  const int64_t n = 200000;
  Tensor x = be.alloc(DType::F32, {n}), a = be.alloc(DType::F32, {n}), b = be.alloc(DType::F32, {n});
  Tensor seed = be.alloc(DType::I32, {2});
  const int32_t sv[2] = {12345, -7};
  be.copy_from_host(seed, sv);
  for (int64_t i = 0; i < n; ++i) x.ptr<float>()[i] = 1.0f + float(i % 7);
  be.dropout(a, x, {seed, 3, 0.25}, false);
  be.dropout(b, x, {seed, 3, 0.25}, false);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = a.ptr<float>()[i];
    ASSERT_EQ(v, b.ptr<float>()[i]) << "the same seed and stream must draw the same mask";
    if (v != 0) {
      ++kept;
      ASSERT_FLOAT_EQ(v, x.ptr<float>()[i] / 0.75f);
    }
  }
  EXPECT_NEAR(double(kept) / double(n), 0.75, 0.005);
  be.dropout(b, x, {seed, 4, 0.25}, false);  // another stream: another mask
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i) same += (a.ptr<float>()[i] != 0) == (b.ptr<float>()[i] != 0);
  EXPECT_LT(double(same) / double(n), 0.7);
  be.dropout(b, x, {seed, 3, 0.25}, true);  // accumulate: b (stream 4's) + stream 3's
  be.dropout(a, x, {seed, 4, 0.25}, true);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(a.ptr<float>()[i], b.ptr<float>()[i]);
  EXPECT_ERROR_CONTAINS([&] { be.dropout(a, x, {seed, 3, 1.0}, false); }, "dropout", "p 1");
}

// A tiny model with LoRA on every projection: starts at the base model's loss (B = 0), and every
// adapter gradient equals the finite difference of the packed row's loss.
TEST(LoraModel, StartsAtTheBaseAndGradientsMatchFiniteDifferences) {
  ScratchDir dir("lora-model");
  write_random_model_dir("tiny", dir.file("m"), 3, DType::F32);
  const HfModelDir src = hf_load(dir.file("m"));
  PackedRow row;
  row.append_sample({5, 9, 14, 3, 22, 7, 8}, {-100, -100, 14, 3, 22, 7, 8});
  row.append_sample({31, 4, 12, 6, 40}, {-100, 4, 12, 6, 40});
  CpuBackend be;
  Qwen35Model base(src.config, be, row.num_tokens());
  base.load(src);
  const double base_loss = base.step(row, false, 1.0).loss_sum;
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.targets = lora_all_targets();
  lora.modules_to_save = {"post_attention_layernorm", "model.norm"};  // trained fully beside the adapters
  Qwen35Model m(src.config, be, row.num_tokens(), Checkpointing::None, &lora);
  m.load(src, 11);
  EXPECT_EQ(m.num_adapter_tensors(), 2 * (2 * 8 + 2 * 7u));  // A and B on 2 GDN x 8 and 2 attention x 7 projections
  EXPECT_EQ(m.specs().size(), m.num_adapter_tensors() + 4 + 1);  // 4 post-attention norms, the final norm
  EXPECT_DOUBLE_EQ(m.step(row, false, 1.0).loss_sum, base_loss);        // B = 0: exactly the base
  // Give B values so A's gradient is not zero, then compare with central differences (f32 model:
  // a step of 1e-2 and a loose tolerance, checked on a few elements of every adapter tensor).
  give_b_values(m);
  m.zero_grads();
  m.step(row, true, 1.0);
  size_t large = 0;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const std::vector<float> g = m.grad_f32(i);
    float gmax = 0;
    for (float x : g) gmax = std::max(gmax, std::abs(x));
    EXPECT_GT(gmax, 0.0f) << m.specs()[i].name << ": gradient zero";
    large += gmax > 1e-4f;  // the gate projections' (in_proj_a) are small in a random tiny model
    std::vector<float> w = m.param_f32(i);
    for (size_t k : {size_t(0), w.size() / 2, w.size() - 1}) {
      const float s = w[k];
      w[k] = s + 1e-2f;
      m.set_param_f32(i, w);
      const double lp = m.step(row, false, 1.0).loss_sum;
      w[k] = s - 1e-2f;
      m.set_param_f32(i, w);
      const double lm = m.step(row, false, 1.0).loss_sum;
      w[k] = s;
      m.set_param_f32(i, w);
      const double fd = (lp - lm) / 2e-2;
      EXPECT_NEAR(g[k], fd, 2e-3 + 2e-2 * std::abs(fd)) << m.specs()[i].name << "[" << k << "]";
    }
  }
  EXPECT_GE(large, m.specs().size() - 4);
}

std::string make_lora_run(const ScratchDir& dir, const std::string& extra) {
  write_random_model_dir("tiny", dir.file("init"), 5, DType::F32);
  std::ofstream data(dir.file("train.jsonl"));
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 6; ++b)
      data << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << a << "+" << b
           << "?\"}, {\"role\": \"assistant\", \"content\": \"" << a + b << "\"}]}\n";
  std::ofstream(dir.file("train.yaml")) << "model: init\noutput_dir: run\ndata:\n  path: train.jsonl\n  thinking: off\n"
                                        << "  tokens_per_batch: 128\ntrain:\n  method: lora\n  lr: 1.0e-2\n  log_every: 0\n"
                                        << "  max_steps: 6\n  save_every: 3\nlora:\n  r: 4\n  alpha: 8\n" << extra;
  return dir.file("train.yaml");
}

TEST(LoraTrain, WritesAPeftAdapterThatResumesAndMerges) {
  ScratchDir dir("lora-train");
  const std::string cfg = make_lora_run(dir, "");
  const TrainSummary s = train_run(train_config_load(cfg, {}));
  EXPECT_LT(s.last_loss, s.first_loss);
  // PEFT's layout: adapter_config.json + adapter_model.safetensors with PEFT's key names, f32.
  const auto ac = nlohmann::json::parse(read_text_file(s.final_dir + "/adapter_config.json"));
  EXPECT_EQ(ac["peft_type"], "LORA");
  EXPECT_EQ(ac["task_type"], "CAUSAL_LM");
  EXPECT_EQ(ac["r"], 4);
  EXPECT_EQ(ac["lora_alpha"], 8.0);
  EXPECT_EQ(ac["target_modules"].size(), 12u);
  EXPECT_EQ(ac["lora_dropout"], 0.0);
  EXPECT_EQ(ac["base_model_name_or_path"], fs::absolute(dir.file("init")).lexically_normal().string());
  EXPECT_FALSE(fs::exists(s.final_dir + "/config.json"));
  EXPECT_FALSE(fs::exists(s.final_dir + "/model.safetensors"));
  auto st = SafetensorsFile::open(s.final_dir + "/adapter_model.safetensors");
  const SafetensorsEntry* qa = st->find("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  ASSERT_NE(qa, nullptr);
  EXPECT_EQ(qa->dtype, DType::F32);
  EXPECT_EQ(qa->shape[0], 4);
  ASSERT_NE(st->find("base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_B.weight"), nullptr);
  for (const auto& e : st->tensors()) EXPECT_NE(e.name.find(".lora_"), std::string::npos) << e.name;
  // Optimizer state holds the adapters only (18 bytes a parameter of the base are not spent).
  auto opt = SafetensorsFile::open(s.final_dir + "/optimizer.safetensors");
  EXPECT_EQ(opt->tensors().size(), 3 * st->tensors().size());

  // Resume from checkpoint-3 continues exactly.
  fs::create_directories(dir.file("resumed"));
  const TrainSummary r = train_run(
      train_config_load(cfg, {"output_dir=resumed", "train.resume=" + dir.file("run/checkpoint-3")}));
  EXPECT_DOUBLE_EQ(r.last_loss, s.last_loss);

  // The merged directory computes what base + adapter compute.
  EXPECT_EQ(lora_merge_dirs(dir.file("init"), s.final_dir, dir.file("merged"), false), 2 * 8 + 2 * 7);
  const HfModelDir base = hf_load(dir.file("init")), merged = hf_load(dir.file("merged"));
  const PeftAdapter adapter = peft_adapter_open(s.final_dir);
  const LoraSpec lora = lora_spec_from_peft(adapter);
  PackedRow row;
  row.append_sample({5, 9, 14, 3, 22, 7, 8}, {-100, -100, 14, 3, 22, 7, 8});
  CpuBackend be;
  Qwen35Model with_adapter(base.config, be, row.num_tokens(), Checkpointing::None, &lora);
  with_adapter.load(base);
  const auto w = lora_read_adapter(adapter, with_adapter.specs());
  for (size_t i = 0; i < w.size(); ++i) with_adapter.set_param_f32(i, w[i]);
  Qwen35Model full(merged.config, be, row.num_tokens());
  full.load(merged);
  const std::vector<float> la = with_adapter.logits(row), lm = full.logits(row);
  double err = 0, ref = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    err = std::max(err, double(std::abs(la[i] - lm[i])));
    ref = std::max(ref, double(std::abs(la[i])));
  }
  EXPECT_LT(err, 1e-4 * ref) << "merged logits differ from the adapter model's";

  // Continuing from the adapter (lora.adapter) starts from its weights: the first loss is the last one's neighbour.
  fs::create_directories(dir.file("cont"));
  const TrainSummary c = train_run(train_config_load(
      cfg, {"output_dir=cont", "lora.adapter=" + s.final_dir, "train.max_steps=1", "train.save_every=0"}));
  EXPECT_LT(c.first_loss, s.first_loss);
}

// Golden parity with PEFT (tools/make_lora_fixtures.py, fp32, each sample run alone there): the
// packed row's mean loss and every adapter gradient of an adapter PEFT saved.
class LoraGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraGolden, LossAndAdapterGradientsMatchPeft) {
  const std::string g = testing::testdata_dir() + "/golden/" + GetParam();
  const auto meta = nlohmann::json::parse(read_text_file(g + "/golden.json"));
  const std::string base_dir = testing::testdata_dir() + "/golden/" + meta["base"].get<std::string>();
  const auto base_meta = nlohmann::json::parse(read_text_file(base_dir + "/golden.json"));
  PackedRow row;
  for (const auto& s : base_meta["samples"])
    row.append_sample(s["input_ids"].get<std::vector<int32_t>>(), s["labels"].get<std::vector<int32_t>>());
  const HfModelDir base = hf_load(base_dir);
  const PeftAdapter adapter = peft_adapter_open(g);
  const LoraSpec lora = lora_spec_from_peft(adapter);
  EXPECT_EQ(lora.rslora, meta["use_rslora"].get<bool>());
  if (meta.contains("modules_to_save") && !meta["modules_to_save"].is_null()) {
    EXPECT_EQ(lora.modules_to_save.size(), meta["modules_to_save"].size());
  }
  CpuBackend be;
  Qwen35Model m(base.config, be, row.num_tokens(), Checkpointing::None, &lora);
  m.load(base);
  const auto w = lora_read_adapter(adapter, m.specs());
  for (size_t i = 0; i < w.size(); ++i) m.set_param_f32(i, w[i]);
  m.zero_grads();
  const double trained = double(row.num_trained());
  const double loss = m.step(row, true, 1.0 / trained).loss_sum / trained;
  const double want = meta["mean_loss"].get<double>();
  EXPECT_NEAR(loss, want, 1e-4 * want);
  auto ref = SafetensorsFile::open(g + "/golden.safetensors");
  ASSERT_EQ(ref->tensors().size(), m.specs().size());
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const SafetensorsEntry* e = ref->find("grad." + peft_key(m.specs()[i].name));
    ASSERT_NE(e, nullptr) << m.specs()[i].name;
    const std::vector<float> want_g = tensor_to_f32(e->view()), got = m.grad_f32(i);
    double num = 0, den = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      num += (double(got[k]) - want_g[k]) * (double(got[k]) - want_g[k]);
      den += double(want_g[k]) * want_g[k];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-3) << m.specs()[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraGolden,
                         ::testing::Values("lora_untied", "lora_tied_rslora", "lora_untied_modules_to_save"));

// With dropout the training loss depends on the step's masks; for a fixed step they are fixed, so
// the adapters' gradients are again the finite differences of that loss (checkpointing full
// redraws the masks in its recompute: the same gradients).
TEST(LoraModel, DropoutGradientsMatchFiniteDifferencesAndRecompute) {
  ScratchDir dir("lora-dropout");
  write_random_model_dir("tiny", dir.file("m"), 3, DType::F32);
  const HfModelDir src = hf_load(dir.file("m"));
  PackedRow row;
  row.append_sample({5, 9, 14, 3, 22, 7, 8, 40, 2}, {-100, -100, 14, 3, 22, 7, 8, 40, 2});
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.dropout = 0.3;
  lora.targets = {"q_proj", "in_proj_qkv", "out_proj", "gate_proj", "down_proj"};
  CpuBackend be;
  std::vector<std::vector<float>> grads[2];
  for (Checkpointing ck : {Checkpointing::None, Checkpointing::Full}) {
    Qwen35Model m(src.config, be, row.num_tokens(), ck, &lora);
    m.load(src, 11);
    give_b_values(m);
    auto train_loss = [&] {  // a training pass (dropout on) at step 7's masks
      m.set_dropout_step(7);
      m.zero_grads();
      return m.step(row, true, 1.0).loss_sum;
    };
    const double with_dropout = train_loss();
    auto& g = grads[ck == Checkpointing::Full];
    for (size_t i = 0; i < m.specs().size(); ++i) g.push_back(m.grad_f32(i));
    EXPECT_NE(with_dropout, m.step(row, false, 1.0).loss_sum) << "eval (no dropout) equals the training loss";
    if (ck == Checkpointing::Full) continue;
    for (size_t i = 0; i < m.specs().size(); ++i) {
      std::vector<float> w = m.param_f32(i);
      for (size_t k : {size_t(0), w.size() / 2, w.size() - 1}) {
        const float s0 = w[k];
        w[k] = s0 + 1e-2f;
        m.set_param_f32(i, w);
        const double lp = train_loss();
        w[k] = s0 - 1e-2f;
        m.set_param_f32(i, w);
        const double lm = train_loss();
        w[k] = s0;
        m.set_param_f32(i, w);
        const double fd = (lp - lm) / 2e-2;
        EXPECT_NEAR(g[i][k], fd, 2e-3 + 2e-2 * std::abs(fd)) << m.specs()[i].name << "[" << k << "]";
      }
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    for (size_t k = 0; k < grads[0][i].size(); ++k)
      ASSERT_NEAR(grads[0][i][k], grads[1][i][k], 1e-5 + 1e-4 * std::abs(grads[0][i][k])) << i;
}

TEST(LoraTrain, ModulesToSaveAreTrainedSavedAndMerged) {
  ScratchDir dir("lora-mts");
  const std::string cfg = make_lora_run(dir, "  modules_to_save: [model.norm, input_layernorm]\n  dropout: 0.1\n");
  const TrainSummary s = train_run(train_config_load(cfg, {}));
  const auto ac = nlohmann::json::parse(read_text_file(s.final_dir + "/adapter_config.json"));
  EXPECT_EQ(ac["modules_to_save"], nlohmann::json({"model.norm", "input_layernorm"}));
  EXPECT_DOUBLE_EQ(ac["lora_dropout"].get<double>(), 0.1);
  EXPECT_LT(s.last_loss, s.first_loss);
  auto st = SafetensorsFile::open(s.final_dir + "/adapter_model.safetensors");
  const SafetensorsEntry* norm = st->find("base_model.model.model.norm.weight");
  ASSERT_NE(norm, nullptr);
  ASSERT_NE(st->find("base_model.model.model.layers.3.input_layernorm.weight"), nullptr);
  const HfModelDir base = hf_load(dir.file("init"));
  const std::vector<float> before = tensor_to_f32(base.store.get("model.norm.weight").view()), after = tensor_to_f32(norm->view());
  double moved = 0;
  for (size_t i = 0; i < before.size(); ++i) moved = std::max(moved, double(std::abs(after[i] - before[i])));
  EXPECT_GT(moved, 1e-4) << "the final norm was not trained";
  // merge writes the trained norm in place of the base's.
  lora_merge_dirs(dir.file("init"), s.final_dir, dir.file("merged"), false);
  const std::vector<float> merged = tensor_to_f32(hf_load(dir.file("merged")).store.get("model.norm.weight").view());
  for (size_t i = 0; i < merged.size(); ++i) EXPECT_FLOAT_EQ(merged[i], after[i]);
  // Names that match nothing, or a module holding adapted projections, are errors.
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"lora.modules_to_save=[nope]", "output_dir=o2"})); },
                        "nope", "matches no module");
  EXPECT_ERROR_CONTAINS([&] { train_run(train_config_load(cfg, {"lora.modules_to_save=[self_attn]", "output_dir=o3"})); },
                        "self_attn", "holds");
}

TEST(LoraTrain, BadAdaptersAndSettingsAreNamed) {
  ScratchDir dir("lora-bad");
  const std::string cfg = make_lora_run(dir, "");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"lora.dropout=1.0"}); }, "lora.dropout", "[0, 1)");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"lora.targets=[qkv]"}); }, "lora.targets", "qkv");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(cfg, {"lora.r=0"}); }, "lora.r");
  fs::create_directories(dir.file("ad"));
  std::ofstream(dir.file("ad/adapter_config.json")) << R"({"peft_type": "IA3", "r": 4})";
  EXPECT_ERROR_CONTAINS([&] { peft_adapter_open(dir.file("ad")); }, "adapter_config.json", "IA3");
  std::ofstream(dir.file("ad/adapter_config.json")) << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": true})";
  EXPECT_ERROR_CONTAINS([&] { peft_adapter_open(dir.file("ad")); }, "DoRA");
  std::ofstream(dir.file("ad/adapter_config.json")) << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})";
  EXPECT_ERROR_CONTAINS([&] { peft_adapter_open(dir.file("ad")); }, "adapter_model.safetensors", "missing");
}

}  // namespace
}  // namespace qt
