// ModelConfig: every field of the Qwen3.5 text config (docs/model_spec.md section 1) plus the
// per-layer kinds, parsed from an HF config.json in either layout:
//   Qwen3_5ForConditionalGeneration (model_type qwen3_5): text fields under "text_config",
//     parameters named "model.language_model.*";
//   Qwen3_5ForCausalLM (model_type qwen3_5_text): flat fields, parameters named "model.*".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt {

enum class LayerKind { GatedDeltaNet, FullAttention };
const char* layer_kind_name(LayerKind k);  // HF spelling: "linear_attention" / "full_attention"

struct ModelConfig {
  // Layout
  std::string model_type = "qwen3_5_text";  // of the text config
  std::string architecture = "Qwen3_5ForCausalLM";
  bool nested = false;                       // text_config inside a qwen3_5 multimodal config
  std::string param_prefix = "model.";       // "model." or "model.language_model."

  // Shapes
  int64_t vocab_size = 248320;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 12288;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 256;
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  int64_t full_attention_interval = 4;
  std::vector<LayerKind> layer_types;

  // Numerics
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  std::vector<int64_t> mrope_section = {11, 11, 10};
  bool mrope_interleaved = true;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool attn_output_gate = true;
  int64_t max_position_embeddings = 262144;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "bfloat16";
  int64_t eos_token_id = -1;  // -1 when absent
  int64_t pad_token_id = -1;
  int64_t bos_token_id = -1;

  // The config.json this was read from (kept so a save writes it back unchanged).
  nlohmann::json raw;

  // Derived sizes
  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  int64_t num_full_layers() const;
  int64_t num_linear_layers() const { return num_hidden_layers - num_full_layers(); }

  // Throws qt::Error naming `source` and the field when something is inconsistent.
  void validate(const std::string& source) const;
};

// Parse config.json text/JSON. `source` names the file in error messages.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
ModelConfig config_load(const std::string& config_json_path);
// The config.json that transformers loads (flat qwen3_5_text layout when !cfg.nested).
nlohmann::ordered_json config_to_json(const ModelConfig& cfg);
// Default layer_types for n layers: full attention when (i + 1) % interval == 0.
std::vector<LayerKind> default_layer_types(int64_t n, int64_t interval);

}  // namespace qt
