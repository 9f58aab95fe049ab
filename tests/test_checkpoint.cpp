// HF model directories: init-model output loads back identical; passthrough tensors survive a
// save byte-for-byte; tied lm_head present or absent; missing / misshapen tensors are errors.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/hf_checkpoint.h"
#include "model/init.h"
#include "model/presets.h"
#include "model/random_model_dir.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/model_optimizer.h"

namespace qt {
namespace {

using testing::ScratchDir;

TEST(Checkpoint, InitModelLoadsBackWithIdenticalTensors) {
  ScratchDir dir("ckpt-init");
  const std::string out = dir.file("tiny");
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t n = write_random_model_dir("tiny", out, 7, dt);
    HfModelDir m = hf_load(out);
    EXPECT_EQ(n, param_count(m.config));
    EXPECT_TRUE(m.config.tie_word_embeddings);
    EXPECT_FALSE(m.lm_head_stored);
    EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
    EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer_config.json"));
    for (const auto& p : m.params) {
      const SafetensorsEntry& e = m.tensor(p);
      std::vector<uint8_t> expect(e.nbytes);
      init_param(p, m.config.initializer_range, 7, e.dtype, expect.data());
      EXPECT_EQ(std::memcmp(expect.data(), e.data, e.nbytes), 0) << p.name;
    }
  }
}

TEST(Checkpoint, InitIsDeterministicAndSeeded) {
  ScratchDir dir("ckpt-seed");
  write_random_model_dir("tiny", dir.file("a"), 1, DType::F32);
  write_random_model_dir("tiny", dir.file("b"), 1, DType::F32);
  write_random_model_dir("tiny", dir.file("c"), 2, DType::F32);
  HfModelDir a = hf_load(dir.file("a")), b = hf_load(dir.file("b")), c = hf_load(dir.file("c"));
  const auto& ea = a.store.get("model.layers.0.mlp.up_proj.weight");
  const auto& eb = b.store.get("model.layers.0.mlp.up_proj.weight");
  const auto& ec = c.store.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(std::memcmp(ea.data, eb.data, ea.nbytes), 0);
  EXPECT_NE(std::memcmp(ea.data, ec.data, ea.nbytes), 0);
  // Normal(0, 0.02): check the sample moments of a 12k-element tensor.
  auto v = tensor_to_f32(ea.view());
  double mean = 0, sq = 0;
  for (float x : v) { mean += x; sq += double(x) * x; }
  mean /= double(v.size());
  const double sd = std::sqrt(sq / double(v.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.001);
  // Norm init rules: (1+w) norms zero, gated norm ones, A_log = log U(0.01, 16).
  auto zeros = tensor_to_f32(a.store.get("model.layers.0.input_layernorm.weight").view());
  for (float x : zeros) EXPECT_EQ(x, 0.0f);
  auto ones = tensor_to_f32(a.store.get("model.layers.0.linear_attn.norm.weight").view());
  for (float x : ones) EXPECT_EQ(x, 1.0f);
  auto alog = tensor_to_f32(a.store.get("model.layers.0.linear_attn.A_log").view());
  for (float x : alog) { EXPECT_GE(x, std::log(0.01f)); EXPECT_LE(x, std::log(16.0f)); }
}

// Builds a "multimodal" checkpoint from a tiny one: nested config, language_model names,
// vision and MTP tensors, optionally a stored lm_head.
void make_nested(const std::string& src_dir, const std::string& out, bool store_lm_head, bool sharded) {
  HfModelDir src = hf_load(src_dir);
  ModelConfig c = src.config;
  c.nested = true;
  c.param_prefix = "model.language_model.";
  auto table = param_table(c);
  std::vector<TensorWriteSpec> specs;
  for (size_t i = 0; i < table.size(); ++i) {
    TensorWriteSpec s = passthrough_spec(src.tensor(src.params[i]));
    s.name = table[i].name;
    specs.push_back(s);
  }
  static std::vector<uint8_t> vis(3 * 8 * 2, 0x5a), mtp(64 * 4, 0xa5);
  specs.push_back({"model.visual.patch_embed.proj.weight", DType::BF16, {3, 8}, [](void* d, size_t n) { std::memcpy(d, vis.data(), n); }});
  specs.push_back({"mtp.fc.weight", DType::F32, {8, 8}, [](void* d, size_t n) { std::memcpy(d, mtp.data(), n); }});
  if (store_lm_head) {
    TensorWriteSpec s = passthrough_spec(src.store.get("model.embed_tokens.weight"));
    s.name = "lm_head.weight";
    specs.push_back(s);
  }
  HfSaveOptions o;
  if (sharded) o.max_shard_bytes = 64 << 10;
  hf_save(out, config_to_json(c), specs, o);
}

TEST(Checkpoint, NestedLayoutPassthroughSurvivesSaveByteForByte) {
  ScratchDir dir("ckpt-nested");
  write_random_model_dir("tiny", dir.file("tiny"), 3, DType::BF16);
  for (bool lm_head : {false, true}) {
    make_nested(dir.file("tiny"), dir.file("mm"), lm_head, /*sharded=*/true);
    HfModelDir m = hf_load(dir.file("mm"));
    EXPECT_TRUE(m.config.nested);
    EXPECT_GT(m.store.num_files(), 1u);
    EXPECT_EQ(m.lm_head_stored, lm_head);
    auto pass = m.passthrough_tensors();
    ASSERT_EQ(pass.size(), 2u);  // lm_head (tied) is not passthrough: it is the embedding
    // Save again: trained tensors and passthrough copied, and compare every byte.
    std::vector<TensorWriteSpec> specs;
    for (const auto* e : m.store.tensors()) specs.push_back(passthrough_spec(*e));
    hf_save(dir.file("mm2"), m.config.raw, specs);
    HfModelDir m2 = hf_load(dir.file("mm2"));
    ASSERT_EQ(m2.store.tensors().size(), m.store.tensors().size());
    for (const auto* e : m.store.tensors()) {
      const auto& e2 = m2.store.get(e->name);
      ASSERT_EQ(e2.nbytes, e->nbytes);
      EXPECT_EQ(std::memcmp(e2.data, e->data, e->nbytes), 0) << e->name;
      EXPECT_EQ(e2.dtype, e->dtype);
    }
    EXPECT_EQ(m2.config.raw, m.config.raw);
  }
}

TEST(CheckpointBadInput, MissingTensorAndWrongShape) {
  ScratchDir dir("ckpt-bad");
  write_random_model_dir("tiny", dir.file("tiny"), 3, DType::F32);
  HfModelDir src = hf_load(dir.file("tiny"));
  std::vector<TensorWriteSpec> specs;
  for (const auto* e : src.store.tensors())
    if (e->name != "model.layers.2.linear_attn.A_log") specs.push_back(passthrough_spec(*e));
  hf_save(dir.file("missing"), src.config.raw, specs);
  EXPECT_ERROR_CONTAINS([&] { hf_load(dir.file("missing")); }, "missing", "model.layers.2.linear_attn.A_log");

  auto cfg = src.config.raw;
  cfg["intermediate_size"] = 200;
  hf_save(dir.file("shape"), cfg, [&] {
    std::vector<TensorWriteSpec> all;
    for (const auto* e : src.store.tensors()) all.push_back(passthrough_spec(*e));
    return all;
  }());
  EXPECT_ERROR_CONTAINS([&] { hf_load(dir.file("shape")); }, "model.layers.0.mlp.gate_proj.weight", "[192, 64]",
                        "[200, 64]");

  cfg = src.config.raw;
  cfg["tie_word_embeddings"] = false;
  hf_save(dir.file("untied"), cfg, [&] {
    std::vector<TensorWriteSpec> all;
    for (const auto* e : src.store.tensors()) all.push_back(passthrough_spec(*e));
    return all;
  }());
  EXPECT_ERROR_CONTAINS([&] { hf_load(dir.file("untied")); }, "lm_head.weight", "tie_word_embeddings=false");
  EXPECT_ERROR_CONTAINS([&] { hf_load(dir.file("nothing-here")); }, "nothing-here", "does not exist");
}

TEST(Checkpoint, SaveIsAtomicOverAnExistingDirectory) {
  ScratchDir dir("ckpt-atomic");
  write_random_model_dir("tiny", dir.file("m"), 1, DType::F32);
  // A failing fill must leave the previous directory untouched.
  HfModelDir m = hf_load(dir.file("m"));
  std::vector<TensorWriteSpec> specs;
  for (const auto* e : m.store.tensors()) specs.push_back(passthrough_spec(*e));
  specs.push_back({"boom", DType::F32, {1}, [](void*, size_t) { QT_FAIL("simulated failure while saving"); }});
  EXPECT_ERROR_CONTAINS([&] { hf_save(dir.file("m"), m.config.raw, specs); }, "simulated failure");
  HfModelDir again = hf_load(dir.file("m"));
  EXPECT_EQ(again.store.tensors().size(), m.store.tensors().size());
  for (const auto& de : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(de.path().filename().string().find(".tmp"), std::string::npos) << de.path();
}

// Records what a checkpoint restores (checkpoint_load_optimizer's only use of the optimizer).
class RecordingOptimizer final : public ModelOptimizer {
 public:
  double step(double, double, int64_t) override { return 0; }
  int64_t state_bytes() const override { return 0; }
  void get_state(size_t, std::vector<float>&, std::vector<float>&, std::vector<float>&) override {}
  void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                 const std::vector<float>& v) override {
    got.resize(std::max(got.size(), i + 1));
    got[i] = {master, m, v};
  }
  std::vector<std::array<std::vector<float>, 3>> got;
};

// The per-rank optimizer parts of a sharded run (optimizer-rank-R-of-W.safetensors): reassembled
// whole from their row ranges; a missing part, rows in two parts or in none, and a part of another
// shape are refused naming the file and tensor.
TEST(CheckpointOptimizerParts, ReassembleAndRefuseBadParts) {
  ScratchDir dir("ckpt-parts");
  const std::vector<ParamSpec> table = {{"a", {5, 3}, ParamRole::EmbedTokens, ParamGroup::Embedding, ParamInit::Normal},
                                        {"b", {4}, ParamRole::FinalNorm, ParamGroup::Norm, ParamInit::Ones}};
  auto value = [](const std::string& which, const std::string& name, int64_t i) {
    return float(which.size()) * 100.0f + float(name[0]) + 0.01f * float(i);
  };
  // rank r's rows [b, e) of "a" (and "b" whole from rank 0).
  auto write_part = [&](const std::string& ck, int rank, int world, int64_t b, int64_t e, int64_t cols = 3) {
    std::vector<TensorWriteSpec> specs;
    SafetensorsWriteOptions o;
    o.base_name = optimizer_part_name(rank, world);
    o.metadata["rows.a"] = std::to_string(b) + "," + std::to_string(e);
    if (rank == 0) o.metadata["rows.b"] = "0,4";
    for (const std::string which : {"master.", "m.", "v."}) {
      specs.push_back({which + "a", DType::F32, {e - b, cols}, [=](void* dst, size_t) {
                         for (int64_t i = 0; i < (e - b) * cols; ++i)
                           static_cast<float*>(dst)[i] = value(which, "a", b * 3 + i);
                       }});
      if (rank == 0)
        specs.push_back({which + "b", DType::F32, {4}, [=](void* dst, size_t) {
                           for (int64_t i = 0; i < 4; ++i) static_cast<float*>(dst)[i] = value(which, "b", i);
                         }});
    }
    write_safetensors(ck, specs, o);
  };
  const std::string ck = dir.file("checkpoint-3");
  std::filesystem::create_directories(ck);
  RecordingOptimizer opt;
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "no optimizer state");
  write_part(ck, 0, 2, 0, 3);
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "optimizer-rank-00001-of-00002.safetensors",
                        "missing", "2 ranks");
  write_part(ck, 1, 2, 3, 5);
  checkpoint_load_optimizer(ck, table, opt);
  ASSERT_EQ(opt.got.size(), 2u);
  const char* which[] = {"master.", "m.", "v."};
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(opt.got[0][k].size(), 15u);
    for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(opt.got[0][k][size_t(i)], value(which[k], "a", i)) << which[k] << i;
    ASSERT_EQ(opt.got[1][k].size(), 4u);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(opt.got[1][k][size_t(i)], value(which[k], "b", i)) << which[k] << i;
  }
  write_part(ck, 1, 2, 2, 5);  // rows 2..3 in both parts
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "rows 3..2 of 'a'", "two parts");
  write_part(ck, 1, 2, 4, 5);  // row 3 in neither
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "rows 3..4 of 'a'", "no part");
  write_part(ck, 1, 2, 3, 5, 2);  // [2, 2] where [2, 3] belongs
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "optimizer-rank-00001-of-00002.safetensors",
                        "'master.a'", "expected F32[2, 3]");
  write_part(ck, 1, 2, 3, 5);
  write_part(ck, 0, 3, 0, 5);  // a stray part of another world size
  EXPECT_ERROR_CONTAINS([&] { checkpoint_load_optimizer(ck, table, opt); }, "different world sizes");
}

// A sharded save that died before rank 0 moved the parts in leaves checkpoint-N.parts: the next
// start removes it when it holds only optimizer parts, and never touches one holding anything else.
TEST(CheckpointOptimizerParts, LeftoverPartsOfAnInterruptedSave) {
  ScratchDir dir("ckpt-leftover");
  const std::string out = dir.file("run");
  std::filesystem::create_directories(out + "/checkpoint-4.parts");
  std::filesystem::create_directories(out + "/checkpoint-5.parts");
  std::ofstream(out + "/checkpoint-4.parts/optimizer-rank-00001-of-00002.safetensors") << "partial";
  std::ofstream(out + "/checkpoint-4.parts/model-00002-of-00002.safetensors") << "partial";
  std::ofstream(out + "/checkpoint-5.parts/notes.txt") << "a user's";
  try {
    checkpoint_prepare_start(out, "auto", false);
  } catch (const Error&) {  // the kept directory may count as an earlier run's output: not at issue here
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-4.parts"));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-5.parts/notes.txt"));
}

}  // namespace
}  // namespace qt
