// config.json parsing in both layouts (configs mirror the real Qwen3.5 files), parameter tables
// and the config errors.
#include <gtest/gtest.h>

#include <fstream>

#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"
#include "test_util.h"

namespace qt {
namespace {

std::string cfg_path(const std::string& name) { return testing::testdata_dir() + "/configs/" + name; }

TEST(Config, Real08bNested) {
  ModelConfig c = config_load(cfg_path("qwen3.5-0.8b.json"));
  EXPECT_TRUE(c.nested);
  EXPECT_EQ(c.param_prefix, "model.language_model.");
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_full_layers(), 6);
  EXPECT_EQ(c.conv_dim(), 6144);  // docs/model_spec.md section 7
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_EQ(c.eos_token_id, 248044);
  for (int i = 0; i < 24; ++i)
    EXPECT_EQ(c.layer_types[static_cast<size_t>(i)], (i + 1) % 4 == 0 ? LayerKind::FullAttention : LayerKind::GatedDeltaNet);
}

TEST(Config, Real2bParameterCountMatchesTransformers) {
  ModelConfig nested = config_load(cfg_path("qwen3.5-2b.json"));
  ModelConfig flat = config_load(cfg_path("qwen3.5-2b-causallm.json"));
  EXPECT_FALSE(flat.nested);
  EXPECT_EQ(flat.param_prefix, "model.");
  // What transformers counts for the 2B text model with tied embeddings.
  EXPECT_EQ(param_count(nested), 1881825088);
  EXPECT_EQ(param_count(flat), 1881825088);
  EXPECT_EQ(param_count(preset_config("2b")), 1881825088);
}

TEST(Config, Real27bUntied) {
  ModelConfig c = config_load(cfg_path("qwen3.5-27b.json"));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.conv_dim(), 10240);
  EXPECT_EQ(c.linear_num_value_heads / c.linear_num_key_heads, 3);
  EXPECT_EQ(c.num_full_layers(), 16);
  auto table = param_table(c);
  EXPECT_EQ(table.back().name, "lm_head.weight");
  bool found_q = false;
  for (const auto& p : table)
    if (p.name == "model.language_model.layers.3.self_attn.q_proj.weight") {
      found_q = true;
      EXPECT_EQ(p.shape, (Shape{12288, 5120}));  // q and gate interleaved per head
    }
  EXPECT_TRUE(found_q);
}

TEST(Config, LegacyFlatRopeFieldsAndDefaultLayerTypes) {
  ModelConfig c = config_load(cfg_path("qwen3.5-0.8b-legacy-flat.json"));
  EXPECT_EQ(c.layer_types.size(), 24u);
  EXPECT_EQ(c.num_full_layers(), 6);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
}

TEST(Config, RoundTripThroughJson) {
  for (const auto& name : preset_names()) {
    ModelConfig a = preset_config(name);
    ModelConfig b = config_from_json(nlohmann::json::parse(config_to_json(a).dump()), name);
    EXPECT_EQ(param_table(a).size(), param_table(b).size()) << name;
    EXPECT_EQ(param_count(a), param_count(b)) << name;
    EXPECT_EQ(a.layer_types, b.layer_types) << name;
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << name;
    EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta) << name;
  }
}

TEST(Config, TableNamesAndGroups) {
  ModelConfig c = preset_config("tiny");
  for (const auto& p : param_table(c)) EXPECT_EQ(param_group_of_name(p.name, c), p.group) << p.name;
  EXPECT_EQ(param_group_of_name("model.visual.blocks.0.norm1.weight", c), ParamGroup::Other);
  EXPECT_EQ(param_group_of_name("mtp.fc.weight", c), ParamGroup::Other);
}

nlohmann::json load_json(const std::string& name) {
  std::ifstream in(cfg_path(name));
  return nlohmann::json::parse(in);
}

TEST(ConfigBadInput, MissingRequiredField) {
  auto j = load_json("qwen3.5-2b.json");
  j["text_config"].erase("hidden_size");
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "cfg.json", "missing required field",
                        "text_config.hidden_size");
  auto f = load_json("qwen3.5-2b-causallm.json");
  f.erase("num_hidden_layers");
  EXPECT_ERROR_CONTAINS([&] { config_from_json(f, "flat.json"); }, "flat.json", "'num_hidden_layers'");
}

TEST(ConfigBadInput, UnsupportedModelType) {
  auto j = load_json("qwen3.5-2b-causallm.json");
  j["model_type"] = "llama";
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "cfg.json", "unsupported model_type 'llama'");
  j["model_type"] = "qwen3_5_moe";
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "unsupported model_type 'qwen3_5_moe'", "MoE");
  j.erase("model_type");
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "'model_type'");
}

TEST(ConfigBadInput, InconsistentShapes) {
  auto j = load_json("qwen3.5-2b-causallm.json");
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "num_attention_heads (8)", "multiple");
  j = load_json("qwen3.5-2b-causallm.json");
  j["layer_types"].erase(0);
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "layer_types has 23 entries");
  j = load_json("qwen3.5-2b-causallm.json");
  j["layer_types"][2] = "mamba";
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "layer_types[2]", "mamba");
  j = load_json("qwen3.5-2b-causallm.json");
  j["hidden_size"] = "2048";
  EXPECT_ERROR_CONTAINS([&] { config_from_json(j, "cfg.json"); }, "'hidden_size' must be an integer");
}

TEST(ConfigBadInput, MalformedFile) {
  testing::ScratchDir dir("cfg-bad");
  std::ofstream(dir.file("config.json")) << "{\"model_type\": ";
  EXPECT_ERROR_CONTAINS([&] { config_load(dir.file("config.json")); }, "config.json", "malformed JSON");
  EXPECT_ERROR_CONTAINS([&] { config_load(dir.file("nope.json")); }, "nope.json", "cannot open");
}

TEST(Presets, UnknownPresetListsKnownOnes) {
  EXPECT_ERROR_CONTAINS([] { preset_config("3b"); }, "unknown preset '3b'", "tiny", "27b");
}

}  // namespace
}  // namespace qt
