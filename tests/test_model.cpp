// The CPU reference model against transformers (golden fixtures made by tools/make_fixtures.py)
// and the packing-isolation property: a packed row computes exactly what its samples compute alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "model/init.h"
#include "model/presets.h"
#include "model/qwen35.h"
#include "ops/cpu/cpu_backend.h"
#include "test_util.h"

namespace qt {
namespace {

struct Golden {
  HfModelDir dir;
  nlohmann::json meta;
  std::shared_ptr<SafetensorsFile> tensors;
  std::vector<std::vector<int32_t>> ids, labels;
};

Golden load_golden(const std::string& name) {
  Golden g;
  const std::string d = testing::testdata_dir() + "/golden/" + name;
  g.dir = hf_load(d);
  std::ifstream in(d + "/golden.json");
  g.meta = nlohmann::json::parse(in);
  g.tensors = SafetensorsFile::open(d + "/golden.safetensors");
  for (const auto& s : g.meta["samples"]) {
    g.ids.push_back(s["input_ids"].get<std::vector<int32_t>>());
    g.labels.push_back(s["labels"].get<std::vector<int32_t>>());
  }
  return g;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

class GoldenParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenParity, PackedBatchMatchesTransformersPerSample) {
  Golden g = load_golden(GetParam());
  CpuBackend be;
  PackedRow row;
  for (size_t i = 0; i < g.ids.size(); ++i) row.append_sample(g.ids[i], g.labels[i]);
  Qwen35Model model(g.dir.config, be, row.num_tokens());
  model.load(g.dir);
  model.zero_grads();
  const int64_t n = row.num_trained();
  int64_t fixture_trained = 0;
  for (const auto& c : g.meta["trained_counts"]) fixture_trained += c.get<int64_t>();
  ASSERT_EQ(n, fixture_trained);
  std::vector<float> token_loss;
  LossResult r = model.step(row, /*backward=*/true, 1.0 / double(n), &token_loss);
  const double mean = r.loss_sum / double(r.num_trained);
  const double want = g.meta["mean_loss"].get<double>();
  EXPECT_LT(std::abs(mean - want) / want, 1e-4) << "mean loss " << mean << " vs transformers " << want;

  // Per-sample loss sums from the per-token losses of the packed row.
  for (size_t s = 0; s < g.ids.size(); ++s) {
    double sum = 0;
    for (int32_t t = row.cu_seqlens[s]; t < row.cu_seqlens[s + 1]; ++t) sum += token_loss[static_cast<size_t>(t)];
    const double ref = g.meta["loss_sums"][s].get<double>();
    EXPECT_NEAR(sum, ref, 1e-4 * std::max(1.0, std::abs(ref))) << "sample " << s;
  }
  // Every parameter gradient within 1e-3 relative (norm of difference over norm).
  const auto names = g.meta["param_names"].get<std::vector<std::string>>();
  size_t checked = 0;
  for (size_t i = 0; i < model.specs().size(); ++i) {
    const SafetensorsEntry* ref = g.tensors->find("grad." + model.specs()[i].name);
    ASSERT_NE(ref, nullptr) << "fixture lacks the gradient of " << model.specs()[i].name;
    const double d = rel_diff(model.grad_f32(i), tensor_to_f32(ref->view()));
    EXPECT_LT(d, 1e-3) << model.specs()[i].name << " gradient relative difference " << d;
    ++checked;
  }
  EXPECT_EQ(checked, names.size());

  // Logits of every sample, read from the packed row.
  const std::vector<float> logits = model.logits(row);
  const int64_t V = g.dir.config.vocab_size;
  for (size_t s = 0; s < g.ids.size(); ++s) {
    const SafetensorsEntry* ref = g.tensors->find("logits." + std::to_string(s));
    ASSERT_NE(ref, nullptr);
    std::vector<float> ours(logits.begin() + row.cu_seqlens[s] * V, logits.begin() + row.cu_seqlens[s + 1] * V);
    EXPECT_LT(rel_diff(ours, tensor_to_f32(ref->view())), 1e-5) << "logits of sample " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Model, GoldenParity, ::testing::Values("tiny_tied", "tiny_untied"));

TEST(ModelIsolation, PackedRowEqualsSumOfSamplesAlone) {
  Golden g = load_golden("tiny_untied");  // lengths 1, 2, 3, 63, 64, 65, 130
  CpuBackend be;
  PackedRow packed;
  for (size_t i = 0; i < g.ids.size(); ++i) packed.append_sample(g.ids[i], g.labels[i]);
  Qwen35Model model(g.dir.config, be, packed.num_tokens());
  model.load(g.dir);

  model.zero_grads();
  const LossResult rp = model.step(packed, true, 1.0);
  std::vector<std::vector<float>> grads_packed;
  for (size_t i = 0; i < model.specs().size(); ++i) grads_packed.push_back(model.grad_f32(i));

  model.zero_grads();
  double loss_alone = 0;
  int64_t trained_alone = 0;
  for (size_t i = 0; i < g.ids.size(); ++i) {
    PackedRow one;
    one.append_sample(g.ids[i], g.labels[i]);
    const LossResult r = model.step(one, true, 1.0);  // gradients accumulate across samples
    loss_alone += r.loss_sum;
    trained_alone += r.num_trained;
  }
  EXPECT_EQ(rp.num_trained, trained_alone);
  EXPECT_NEAR(rp.loss_sum, loss_alone, 1e-5 * std::abs(loss_alone));
  // fp32 sums taken in a different order (one GEMM over the row vs one per sample) differ by
  // ~2e-5 here; any leak across samples moves gradients by >1e-2 (see LeakWouldBeDetected).
  for (size_t i = 0; i < model.specs().size(); ++i)
    EXPECT_LT(rel_diff(grads_packed[i], model.grad_f32(i)), 1e-4) << model.specs()[i].name;
}

TEST(ModelIsolation, LeakWouldBeDetected) {
  // Guard against a vacuous isolation test: joining two samples into ONE sequence must change the
  // second sample's losses (its state would then see the first sample).
  Golden g = load_golden("tiny_tied");
  CpuBackend be;
  PackedRow two, joined;
  two.append_sample(g.ids[3], g.labels[3]);
  two.append_sample(g.ids[4], g.labels[4]);
  std::vector<int32_t> ids = g.ids[3], labels = g.labels[3];
  ids.insert(ids.end(), g.ids[4].begin(), g.ids[4].end());
  labels.insert(labels.end(), g.labels[4].begin(), g.labels[4].end());
  joined.append_sample(ids, labels);
  Qwen35Model model(g.dir.config, be, joined.num_tokens());
  model.load(g.dir);
  std::vector<float> a, b;
  model.step(two, false, 1.0, &a);
  model.step(joined, false, 1.0, &b);
  double diff = 0;
  for (size_t t = g.ids[3].size() + 1; t + 1 < a.size(); ++t) diff += std::abs(a[t] - b[t]);
  EXPECT_GT(diff, 1e-3);
}

// The static-shape path (CUDA graphs) pads a row to max_tokens with one ignored sample and
// cu_seqlens to max_seqs + 1 with zero-length samples; neither may change the loss or a gradient.
TEST(ModelStaticShape, PaddedStagedStepEqualsPlainStep) {
  Golden g = load_golden("tiny_untied");  // lengths 1, 2, 3, 63, 64, 65, 130
  CpuBackend be;
  PackedRow row;
  for (size_t i = 0; i < g.ids.size(); ++i) row.append_sample(g.ids[i], g.labels[i]);
  Qwen35Model model(g.dir.config, be, row.num_tokens() + 37);
  model.load(g.dir);
  model.set_static_shape(16, 2);
  EXPECT_EQ(model.static_seqs_needed(row), static_cast<int>(g.ids.size()) + 1);

  model.zero_grads();
  const LossResult plain = model.step(row, true, 0.5);
  std::vector<std::vector<float>> grads_plain;
  for (size_t i = 0; i < model.specs().size(); ++i) grads_plain.push_back(model.grad_f32(i));

  model.zero_grads();
  model.stage(row, 1);
  model.enqueue_step(1, true, 0.5);
  be.synchronize();
  double sums[2] = {0, 0};
  be.copy_to_host(sums, model.static_loss_sums());
  EXPECT_NEAR(sums[1], plain.loss_sum, 1e-5 * std::abs(plain.loss_sum));
  EXPECT_EQ(sums[0], 0.0);  // slot 0 untouched
  for (size_t i = 0; i < model.specs().size(); ++i)
    EXPECT_LT(rel_diff(model.grad_f32(i), grads_plain[i]), 1e-4) << model.specs()[i].name;

  // Bad input: a row needing more samples than the bound, an unknown slot.
  PackedRow many;
  for (int i = 0; i < 16; ++i) many.append_sample({1, 2}, {1, 2});
  EXPECT_ERROR_CONTAINS([&] { model.stage(many, 0); }, "17 samples", "static 16");
  EXPECT_ERROR_CONTAINS([&] { model.stage(row, 2); }, "slot 2 of 2");
}

// A backend whose GDN would split samples of 100 tokens or more (the CUDA backend's answer depends
// on the GPU and the shape; the CPU reference never splits).
class SplitFromHundred : public CpuBackend {
 public:
  int gdn_split_seqlen(const GdnDims&, int64_t, int) const override { return 100; }
};

// Static steps pass a max_seqlen bound the GDN plans by: the whole row where a staged sample (the
// padding one included) may split, else just below the split, which must still bound every sample
// (the CPU reference checks it). A step enqueued as short while a long row is staged is refused.
TEST(ModelStaticShape, SplitKindOfStagedRows) {
  Golden g = load_golden("tiny_untied");  // lengths 1, 2, 3, 63, 64, 65, 130
  SplitFromHundred be;
  PackedRow with_130, short_only;
  for (size_t i = 0; i < g.ids.size(); ++i) {
    with_130.append_sample(g.ids[i], g.labels[i]);
    if (g.ids[i].size() < 100) short_only.append_sample(g.ids[i], g.labels[i]);
  }
  ASSERT_EQ(with_130.num_tokens(), short_only.num_tokens() + 130);
  // Room for the long row and 37 more: the short row's padding sample is 167 tokens.
  Qwen35Model model(g.dir.config, be, with_130.num_tokens() + 37);
  model.load(g.dir);
  model.set_static_shape(16, 2);
  model.stage(with_130, 0);
  EXPECT_TRUE(model.staged_may_split(1));
  model.stage(short_only, 0);
  EXPECT_TRUE(model.staged_may_split(1)) << "the 167-token padding sample may split";

  PackedRow short_full = short_only;  // 288 tokens: the padding sample is 77
  short_full.append_sample(std::vector<int32_t>(90, 5), std::vector<int32_t>(90, 5));
  model.stage(short_full, 1);
  EXPECT_TRUE(model.staged_may_split(2)) << "slot 0 still holds the row with the long padding";
  model.stage(short_full, 0);
  EXPECT_FALSE(model.staged_may_split(2));

  // The short kind's bound (99) runs the same loss as the exact shapes.
  model.zero_grads();
  const LossResult plain = model.step(short_full, true, 0.5);
  model.zero_grads();
  model.enqueue_step(1, true, 0.5, false);
  be.synchronize();
  double sums[2] = {0, 0};
  be.copy_to_host(sums, model.static_loss_sums());
  EXPECT_NEAR(sums[1], plain.loss_sum, 1e-5 * std::abs(plain.loss_sum));

  model.stage(with_130, 0);
  EXPECT_ERROR_CONTAINS([&] { model.enqueue_step(0, true, 0.5, false); }, "130-token sample", "from 100 tokens");
}

// Checkpointing trades memory for recompute; the gradients must not notice (the CPU reference is
// deterministic, so the recomputed activations are the same floats).
TEST(ModelCheckpointing, SelectiveAndFullEqualNone) {
  Golden g = load_golden("tiny_untied");
  CpuBackend be;
  PackedRow row;
  for (size_t i = 0; i < g.ids.size(); ++i) row.append_sample(g.ids[i], g.labels[i]);
  std::vector<std::vector<float>> ref;
  double ref_loss = 0;
  int64_t prev_bytes = -1;
  for (Checkpointing c : {Checkpointing::None, Checkpointing::Selective, Checkpointing::Full}) {
    Qwen35Model model(g.dir.config, be, row.num_tokens(), c);
    model.load(g.dir);
    EXPECT_EQ(model.memory_plan().activations, activation_bytes(g.dir.config, DType::F32, row.num_tokens(), c));
    if (prev_bytes >= 0) {
      EXPECT_LT(model.memory_plan().activations, prev_bytes) << checkpointing_name(c);
    }
    prev_bytes = model.memory_plan().activations;
    model.zero_grads();
    const LossResult r = model.step(row, true, 1.0);
    if (c == Checkpointing::None) {
      ref_loss = r.loss_sum;
      for (size_t i = 0; i < model.specs().size(); ++i) ref.push_back(model.grad_f32(i));
      continue;
    }
    EXPECT_EQ(r.loss_sum, ref_loss) << checkpointing_name(c);
    for (size_t i = 0; i < model.specs().size(); ++i)
      EXPECT_LT(rel_diff(model.grad_f32(i), ref[i]), 1e-6) << checkpointing_name(c) << " " << model.specs()[i].name;
  }
  EXPECT_EQ(choose_checkpointing(g.dir.config, be, 8192, 64), Checkpointing::None);  // host memory: no budget
  // From explicit budgets: the first policy that fits; a clear error when none does.
  const ModelConfig& cfg = g.dir.config;
  const int64_t T = 4096, state = int64_t(64) << 20, mib = int64_t(1) << 20;
  std::string why;
  EXPECT_EQ(choose_checkpointing_within(cfg, DType::BF16, T, state, int64_t(1) << 50, &why), Checkpointing::None);
  // The requirement of none, as reported (MiB, rounded down), gives the part shared by all three.
  const int64_t need_none = std::stoll(why.substr(why.find("none needs ") + 11)) * mib;
  const int64_t fixed = need_none - activation_bytes(cfg, DType::BF16, T, Checkpointing::None) - state;
  EXPECT_GT(fixed, (int64_t(4) << 30) - mib);  // at least the 4 GiB reserve
  const int64_t sel = fixed + activation_bytes(cfg, DType::BF16, T, Checkpointing::Selective);
  const int64_t full = fixed + activation_bytes(cfg, DType::BF16, T, Checkpointing::Full);
  EXPECT_EQ(choose_checkpointing_within(cfg, DType::BF16, T, state, sel + 2 * mib), Checkpointing::Selective);
  {  // fp8 counts its codes: where bf16 just fits none, fp8 takes the policy that fits with them.
    const int64_t none_fp8 = need_none + 2 * mib + fp8_codes_bytes(cfg, T, Checkpointing::None, false, false);
    EXPECT_GT(fp8_codes_bytes(cfg, T, Checkpointing::None, false, false),
              fp8_codes_bytes(cfg, T, Checkpointing::Full, false, false));  // the kept input codes
    EXPECT_EQ(choose_checkpointing_within(cfg, DType::BF16, T, state, need_none + 2 * mib), Checkpointing::None);
    EXPECT_NE(choose_checkpointing_within(cfg, DType::BF16, T, state, need_none + 2 * mib, nullptr, -1, 0,
                                          Precision::FP8),
              Checkpointing::None);
    EXPECT_EQ(choose_checkpointing_within(cfg, DType::BF16, T, state, none_fp8, nullptr, -1, 0, Precision::FP8),
              Checkpointing::None);
    // The FP8 head adds its weight codes, its input's and the transposed logit gradient, and the
    // policy counts them only where the head runs fp8.
    const int64_t no_head = fp8_codes_bytes(cfg, T, Checkpointing::None, false, false, false);
    const int64_t head = fp8_codes_bytes(cfg, T, Checkpointing::None, false, false, true);
    if (fp8_head_eligible(cfg)) {
      EXPECT_GE(head - no_head, 2 * cfg.vocab_size * cfg.hidden_size + cfg.vocab_size * T);
      // The policy's figures count them: the none requirement with and without the head (in MiB,
      // rounded down) differ by the head's bytes.
      auto none_mib = [&](bool with_head) {
        std::string w;
        choose_checkpointing_within(cfg, DType::BF16, T, state, int64_t(1) << 50, &w, -1, 0, Precision::FP8, with_head);
        return std::stoll(w.substr(w.find("none needs ") + 11));
      };
      EXPECT_NEAR(double(none_mib(true) - none_mib(false)), double(head - no_head) / double(mib), 1.0);
      EXPECT_GT(none_mib(true), none_mib(false));
    }
  }
  EXPECT_EQ(choose_checkpointing_within(cfg, DType::BF16, T, state, full + 2 * mib), Checkpointing::Full);
  EXPECT_ERROR_CONTAINS([&] { choose_checkpointing_within(cfg, DType::BF16, T, state, full - 2 * mib); },
                        "does not fit on this device", "full needs", "MiB free");
  // What each policy keeps of the GDN forward: none prep's part where the backend prefers it and the
  // chunk states elsewhere, per layer (its plan); selective prep's part per layer, full one shared;
  // those two only where the 4 GiB reserve stays free. The CPU reference keeps neither.
  const int64_t n_gdn = std::count(cfg.layer_types.begin(), cfg.layer_types.end(), LayerKind::GatedDeltaNet);
  ASSERT_GT(n_gdn, 1);
  EXPECT_EQ(gdn_keep_for(Checkpointing::None, true), GdnKeep::Prep);
  EXPECT_EQ(gdn_keep_for(Checkpointing::None, false), GdnKeep::States);
  for (const bool prefers : {true, false}) {
    EXPECT_EQ(gdn_keep_for(Checkpointing::Selective, prefers), GdnKeep::Prep);
    EXPECT_EQ(gdn_keep_for(Checkpointing::Full, prefers), GdnKeep::Prep);
  }
  EXPECT_FALSE(CpuBackend().gdn_prefers_prep({16, 32, 128, 128}));
  EXPECT_EQ(gdn_kept_bytes(Checkpointing::None, n_gdn, state), n_gdn * state);
  EXPECT_EQ(gdn_kept_bytes(Checkpointing::Selective, n_gdn, 9 * mib), n_gdn * 9 * mib);
  EXPECT_EQ(gdn_kept_bytes(Checkpointing::Full, n_gdn, 9 * mib), 9 * mib);
  EXPECT_EQ(gdn_kept_bytes(Checkpointing::Full, 0, 9 * mib), 0);
  EXPECT_TRUE(gdn_keep_fits(100 * mib, (int64_t(4) << 30) + 100 * mib));
  EXPECT_FALSE(gdn_keep_fits(100 * mib, (int64_t(4) << 30) + 99 * mib));
  EXPECT_TRUE(gdn_keep_fits(100 * mib, -1));  // no device budget (host memory)
  EXPECT_EQ(checkpointing_from_name("selective"), Checkpointing::Selective);
  EXPECT_FALSE(checkpointing_from_name("some"));
}

TEST(ModelBadInput, RowErrorsNameThePosition) {
  Golden g = load_golden("tiny_tied");
  CpuBackend be;
  Qwen35Model model(g.dir.config, be, 8);
  PackedRow row;
  row.append_sample({1, 2, 300}, {1, 2, 3});
  EXPECT_ERROR_CONTAINS([&] { model.step(row, false, 1.0); }, "token id 300", "position 2");
  PackedRow big;
  big.append_sample(std::vector<int32_t>(9, 1), std::vector<int32_t>(9, 1));
  EXPECT_ERROR_CONTAINS([&] { model.step(big, false, 1.0); }, "9 tokens", "planned 8");
  EXPECT_ERROR_CONTAINS([&] { row.append_sample({1}, {1, 2}); }, "2 labels for 1 tokens");
}

// train.precision fp8 on the CPU reference (its fp8 ops encode exactly as the device): the step
// follows the fp32 one within fp8's rounding yet is not it (the projections really run on codes);
// checkpointing recomputes the same codes; a second micro-batch accumulates the same products;
// projection widths off the 16-multiple layouts are refused by name. The tiny preset at its own
// init (the golden fixtures' large random weights make the model chaotic: any rounding decorrelates
// its gradients), rows of odd lengths (the wgrad pads the tokens to 16).
TEST(ModelPrecision, Fp8StepTracksFp32) {
  CpuBackend be;
  const ModelConfig cfg = preset_config("tiny");
  std::mt19937_64 rng(3);
  PackedRow row;
  for (int n : {37, 100, 2, 63}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
    std::vector<int32_t> labels = ids;
    labels[0] = -100;
    row.append_sample(ids, labels);
  }
  ASSERT_NE(row.num_tokens() % 16, 0) << "the wgrad's token padding goes untested";
  // head: train.fp8_lm_head (the tiny vocabulary, 512 x 64, takes the FP8 head).
  auto run = [&](Precision p, Checkpointing c, int micro, std::vector<std::vector<float>>* grads, bool head = true) {
    Qwen35Model model(cfg, be, row.num_tokens(), c);
    model.set_precision(p, head);
    EXPECT_EQ(model.precision(), p);
    EXPECT_EQ(model.fp8_head(), p == Precision::FP8 && head);
    EXPECT_EQ(model.memory_plan().fp8,
              p == Precision::FP8 ? fp8_codes_bytes(cfg, row.num_tokens(), c, false, false, head) : 0);
    EXPECT_EQ(model.memory_plan().fp8 > 0, p == Precision::FP8);
    for (size_t i = 0; i < model.specs().size(); ++i) {
      std::vector<float> w(static_cast<size_t>(shape_numel(model.specs()[i].shape)));
      init_param(model.specs()[i], cfg.initializer_range, 7, DType::F32, w.data());
      model.set_param_f32(i, w);
    }
    model.zero_grads();
    double loss = 0;
    for (int m = 0; m < micro; ++m) loss += model.step(row, true, 1.0).loss_sum;
    for (size_t i = 0; i < model.specs().size(); ++i) grads->push_back(model.grad_f32(i));
    return loss;
  };
  std::vector<std::vector<float>> ref, fp8, fp8_full, fp8_two, fp8_bf16_head;
  const double l_ref = run(Precision::BF16, Checkpointing::None, 1, &ref);
  const double l_fp8 = run(Precision::FP8, Checkpointing::None, 1, &fp8);
  const double l_bf16_head = run(Precision::FP8, Checkpointing::None, 1, &fp8_bf16_head, false);
  // Both recipes within fp8's rounding of the fp32 step, neither equal to it nor to each other.
  auto tracks = [&](const char* what, double l, const std::vector<std::vector<float>>& got) {
    SCOPED_TRACE(what);
    EXPECT_NE(l, l_ref);
    EXPECT_NEAR(l, l_ref, 0.005 * l_ref);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double dot = 0, a = 0, b = 0;
      for (size_t k = 0; k < ref[i].size(); ++k) {
        dot += double(got[i][k]) * ref[i][k];
        a += double(got[i][k]) * got[i][k];
        b += double(ref[i][k]) * ref[i][k];
        num += (double(got[i][k]) - ref[i][k]) * (double(got[i][k]) - ref[i][k]);
      }
      den += b;
      EXPECT_GT(dot / std::sqrt(a * b), 0.98) << "gradient " << i << ": cosine to the fp32 one";
    }
    const double all = std::sqrt(num / den);
    EXPECT_GT(all, 1e-3);  // not the fp32 step
    EXPECT_LT(all, 0.15);  // but within fp8's rounding of it (about 3.5 % a GEMM)
    return all;
  };
  const double e_fp8 = tracks("fp8 head", l_fp8, fp8), e_bf16_head = tracks("bf16 head", l_bf16_head, fp8_bf16_head);
  EXPECT_NE(l_fp8, l_bf16_head);
  EXPECT_NE(e_fp8, e_bf16_head);
  const double l_full = run(Precision::FP8, Checkpointing::Full, 1, &fp8_full);
  EXPECT_EQ(l_full, l_fp8);
  for (size_t i = 0; i < fp8.size(); ++i) EXPECT_EQ(fp8_full[i], fp8[i]) << i;
  const double l_two = run(Precision::FP8, Checkpointing::Selective, 2, &fp8_two);
  EXPECT_EQ(l_two, 2 * l_fp8);
  for (size_t i = 0; i < fp8.size(); ++i) {
    std::vector<float> twice = fp8[i];
    for (float& v : twice) v *= 2;
    EXPECT_LT(rel_diff(fp8_two[i], twice), 1e-6) << i;
  }
  ModelConfig odd = cfg;
  odd.intermediate_size = 88;
  Qwen35Model m(odd, be, 8);
  EXPECT_ERROR_CONTAINS([&] { m.set_precision(Precision::FP8); }, "mlp.gate_proj.weight [88, 64]", "multiple of 16");
  // A vocabulary off the FP8 layouts keeps the bf16 head (the projections still run fp8).
  ModelConfig odd_vocab = cfg;
  odd_vocab.vocab_size = 500;
  Qwen35Model mv(odd_vocab, be, 8);
  mv.set_precision(Precision::FP8);
  EXPECT_EQ(mv.precision(), Precision::FP8);
  EXPECT_FALSE(mv.fp8_head());
  EXPECT_EQ(mv.memory_plan().fp8, fp8_codes_bytes(odd_vocab, 8, Checkpointing::None, false, false, false));
  EXPECT_EQ(precision_from_name("fp8"), Precision::FP8);
  EXPECT_ERROR_CONTAINS([&] { precision_from_name("fp16"); }, "train.precision 'fp16'", "bf16 or fp8");
}

// The fp8 input plumbing (model/fp8_projections.h) on the CPU reference: an amax folded in by the
// producer (a tap) and the transposed codes the forward keeps give the same products as the passes
// they replace; a tap taken twice, a tap read unfilled and kept codes of another tensor are refused.
TEST(ModelPrecision, Fp8TapsAndKeptCodesMatchThePasses) {
  CpuBackend be;
  const int64_t T = 21, N = 16, K = 32;
  Fp8Projections f(be, T);
  const int id = f.add(N, K);
  const int slot = f.add_slot(K);
  f.allocate();
  std::mt19937_64 rng(5);
  auto filled = [&](const Shape& s) {
    Tensor t = be.alloc(DType::F32, s);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(rng);
    return t;
  };
  auto values = [](const Tensor& t) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel()); };
  const Tensor w = filled({N, K}), x = filled({T, K}), x2 = filled({T, K}), dy = filled({T, N});
  f.quantize_weight(id, w);
  auto amax_of = [](const Tensor& t) {
    float a = 0;
    for (int64_t i = 0; i < t.numel(); ++i) a = std::max(a, std::fabs(t.ptr<float>()[i]));
    return a;
  };
  const Tensor y_pass = be.alloc(DType::F32, {T, N}), y_tap = be.alloc(DType::F32, {T, N});
  f.forward(y_pass, x, id, {});
  f.forget_inputs();
  const Tensor word = f.tap(Fp8Tap::Act);
  EXPECT_ERROR_CONTAINS([&] { f.tap(Fp8Tap::Act); }, "amax of act", "taken again");
  *word.ptr<float>() = 123.0f;  // a pass that failed before its quantize
  f.reset_taps();
  EXPECT_FALSE(f.tap_pending(Fp8Tap::Act));
  EXPECT_EQ(*word.ptr<float>(), 0.0f);
  EXPECT_EQ(f.tap(Fp8Tap::Act).data, word.data);
  *word.ptr<float>() = amax_of(x);  // what the producer's amax output leaves
  f.forward(y_tap, x, id, {Fp8Tap::Act, slot, true});
  EXPECT_FALSE(f.tap_pending(Fp8Tap::Act));
  EXPECT_EQ(*word.ptr<float>(), 0.0f) << "the quantize resets the word for the next producer";
  EXPECT_EQ(values(y_tap), values(y_pass));
  f.forget_inputs();
  EXPECT_ERROR_CONTAINS([&] { f.forward(y_tap, x2, id, {Fp8Tap::Dup, -1, false}); }, "amax of dup",
                        "no op has folded in");
  // The wgrad from the kept codes equals the one that quantizes x again; another x is refused.
  const Tensor dw_kept = be.alloc(DType::F32, {N, K}), dw_pass = be.alloc(DType::F32, {N, K});
  const Tensor dx = be.alloc(DType::F32, {T, K});
  f.backward(dx, dw_kept, dy, x, id, false, false, Fp8Tap::None, slot);
  f.backward(dx, dw_pass, dy, x, id, false, false, Fp8Tap::None, -1);
  EXPECT_EQ(values(dw_kept), values(dw_pass));
  EXPECT_ERROR_CONTAINS([&] { f.backward(dx, dw_kept, dy, x2, id, false, false, Fp8Tap::None, slot); },
                        "kept codes of its input were not written from");
  // A forward that does not keep them (an eval pass) leaves none to read.
  f.forget_inputs();
  f.forward(y_tap, x, id, {Fp8Tap::None, slot, false});
  EXPECT_ERROR_CONTAINS([&] { f.backward(dx, dw_kept, dy, x, id, false, false, Fp8Tap::None, slot); },
                        "kept codes");
}

}  // namespace
}  // namespace qt
