#include "model/config.h"

#include "core/error.h"
#include "io/mapped_file.h"

namespace qt {
using json = nlohmann::json;

const char* layer_kind_name(LayerKind k) {
  return k == LayerKind::FullAttention ? "full_attention" : "linear_attention";
}

std::vector<LayerKind> default_layer_types(int64_t n, int64_t interval) {
  std::vector<LayerKind> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(interval > 0 && (i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::GatedDeltaNet);
  return out;
}

int64_t ModelConfig::num_full_layers() const {
  int64_t n = 0;
  for (auto k : layer_types) n += k == LayerKind::FullAttention;
  return n;
}

namespace {

// Typed field readers that name the file and key on a type mismatch.
struct Reader {
  const json& j;
  const std::string& source;
  const std::string prefix;  // "text_config." or ""

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t int_required(const char* key) const {
    QT_CHECK(has(key), source, ": config is missing required field '", prefix, key, "'");
    return int_value(key);
  }
  int64_t int_value(const char* key) const {
    const json& v = j[key];
    QT_CHECK(v.is_number_integer(), source, ": field '", prefix, key, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  void opt(const char* key, int64_t& out) const { if (has(key)) out = int_value(key); }
  void opt(const char* key, double& out) const {
    if (!has(key)) return;
    QT_CHECK(j[key].is_number(), source, ": field '", prefix, key, "' must be a number, got ", j[key].dump());
    out = j[key].get<double>();
  }
  void opt(const char* key, bool& out) const {
    if (!has(key)) return;
    QT_CHECK(j[key].is_boolean(), source, ": field '", prefix, key, "' must be true or false, got ", j[key].dump());
    out = j[key].get<bool>();
  }
  void opt(const char* key, std::string& out) const {
    if (!has(key)) return;
    QT_CHECK(j[key].is_string(), source, ": field '", prefix, key, "' must be a string, got ", j[key].dump());
    out = j[key].get<std::string>();
  }
  // eos/bos/pad may be an int or a list of ints (first one kept).
  void opt_token(const char* key, int64_t& out) const {
    if (!has(key)) return;
    const json& v = j[key];
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) out = v[0].get<int64_t>();
    else if (v.is_number_integer()) out = v.get<int64_t>();
    else QT_FAIL(source, ": field '", prefix, key, "' must be a token id, got ", v.dump());
  }
};

}  // namespace

ModelConfig config_from_json(const json& root, const std::string& source) {
  QT_CHECK(root.is_object(), source, ": config is not a JSON object");
  ModelConfig c;
  c.raw = root;
  std::string top_type;
  if (root.contains("model_type") && root["model_type"].is_string()) top_type = root["model_type"].get<std::string>();
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    c.architecture = root["architectures"][0].get<std::string>();
  const json* text = &root;
  if (top_type == "qwen3_5" || root.contains("text_config")) {
    QT_CHECK(root.contains("text_config") && root["text_config"].is_object(), source,
             ": model_type 'qwen3_5' needs a 'text_config' object");
    text = &root["text_config"];
    c.nested = true;
    c.param_prefix = "model.language_model.";
  } else {
    QT_CHECK(!top_type.empty(), source, ": config is missing required field 'model_type'");
  }
  Reader r{*text, source, c.nested ? "text_config." : ""};
  std::string text_type = c.nested ? "qwen3_5_text" : top_type;
  r.opt("model_type", text_type);
  if (text_type == "qwen3_5_moe_text" || top_type == "qwen3_5_moe")
    QT_FAIL(source, ": unsupported model_type '", top_type.empty() ? text_type : top_type,
            "': qwentune trains the dense Qwen3.5 models (qwen3_5 / qwen3_5_text); MoE is not supported yet");
  QT_CHECK(text_type == "qwen3_5_text" || text_type == "qwen3_5", source, ": unsupported model_type '",
           c.nested ? text_type : top_type, "' (qwentune supports qwen3_5 and qwen3_5_text)");
  c.model_type = "qwen3_5_text";

  c.vocab_size = r.int_required("vocab_size");
  c.hidden_size = r.int_required("hidden_size");
  c.intermediate_size = r.int_required("intermediate_size");
  c.num_hidden_layers = r.int_required("num_hidden_layers");
  c.num_attention_heads = r.int_required("num_attention_heads");
  c.num_key_value_heads = r.int_required("num_key_value_heads");
  r.opt("head_dim", c.head_dim);
  r.opt("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  r.opt("linear_key_head_dim", c.linear_key_head_dim);
  r.opt("linear_value_head_dim", c.linear_value_head_dim);
  r.opt("linear_num_key_heads", c.linear_num_key_heads);
  r.opt("linear_num_value_heads", c.linear_num_value_heads);
  r.opt("full_attention_interval", c.full_attention_interval);
  r.opt("hidden_act", c.hidden_act);
  r.opt("rms_norm_eps", c.rms_norm_eps);
  r.opt("attention_bias", c.attention_bias);
  r.opt("attention_dropout", c.attention_dropout);
  r.opt("attn_output_gate", c.attn_output_gate);
  r.opt("max_position_embeddings", c.max_position_embeddings);
  r.opt("initializer_range", c.initializer_range);
  r.opt("tie_word_embeddings", c.tie_word_embeddings);
  r.opt_token("eos_token_id", c.eos_token_id);
  r.opt_token("pad_token_id", c.pad_token_id);
  r.opt_token("bos_token_id", c.bos_token_id);
  if (r.has("dtype")) r.opt("dtype", c.torch_dtype);
  else r.opt("torch_dtype", c.torch_dtype);
  if (c.nested) {  // the top-level flag governs Qwen3_5ForConditionalGeneration's lm_head
    Reader top{root, source, ""};
    top.opt("tie_word_embeddings", c.tie_word_embeddings);
  }

  // RoPE: transformers 5 keeps it in rope_parameters; older files use rope_theta / rope_scaling.
  r.opt("rope_theta", c.rope_theta);
  r.opt("partial_rotary_factor", c.partial_rotary_factor);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rp = (*text)[key];
    QT_CHECK(rp.is_object(), source, ": field '", key, "' must be an object");
    Reader rr{rp, source, r.prefix + key + "."};
    rr.opt("rope_theta", c.rope_theta);
    rr.opt("partial_rotary_factor", c.partial_rotary_factor);
    rr.opt("mrope_interleaved", c.mrope_interleaved);
    std::string rope_type = "default";
    if (rr.has("rope_type")) rr.opt("rope_type", rope_type);
    else if (rr.has("type")) rr.opt("type", rope_type);
    QT_CHECK(rope_type == "default" || rope_type == "mrope", source, ": unsupported rope_type '", rope_type,
             "' (only the default RoPE of Qwen3.5 is implemented)");
    if (rr.has("mrope_section")) {
      QT_CHECK(rp["mrope_section"].is_array(), source, ": mrope_section must be a list");
      c.mrope_section.clear();
      for (const auto& v : rp["mrope_section"]) {
        QT_CHECK(v.is_number_integer(), source, ": mrope_section entries must be integers");
        c.mrope_section.push_back(v.get<int64_t>());
      }
    }
  }

  if (r.has("layer_types")) {
    const json& lt = (*text)["layer_types"];
    QT_CHECK(lt.is_array(), source, ": layer_types must be a list");
    for (size_t i = 0; i < lt.size(); ++i) {
      QT_CHECK(lt[i].is_string(), source, ": layer_types[", i, "] must be a string");
      const std::string s = lt[i].get<std::string>();
      if (s == "linear_attention") c.layer_types.push_back(LayerKind::GatedDeltaNet);
      else if (s == "full_attention") c.layer_types.push_back(LayerKind::FullAttention);
      else QT_FAIL(source, ": layer_types[", i, "] is '", s, "' (expected linear_attention or full_attention)");
    }
  } else {
    c.layer_types = default_layer_types(c.num_hidden_layers, c.full_attention_interval);
  }
  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](const char* name, int64_t v) { QT_CHECK(v > 0, source, ": ", name, " must be positive, got ", v); };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("linear_conv_kernel_dim", linear_conv_kernel_dim);
  positive("linear_key_head_dim", linear_key_head_dim);
  positive("linear_value_head_dim", linear_value_head_dim);
  positive("linear_num_key_heads", linear_num_key_heads);
  positive("linear_num_value_heads", linear_num_value_heads);
  QT_CHECK(static_cast<int64_t>(layer_types.size()) == num_hidden_layers, source, ": layer_types has ",
           layer_types.size(), " entries but num_hidden_layers is ", num_hidden_layers);
  QT_CHECK(num_attention_heads % num_key_value_heads == 0, source, ": num_attention_heads (", num_attention_heads,
           ") is not a multiple of num_key_value_heads (", num_key_value_heads, ")");
  QT_CHECK(linear_num_value_heads % linear_num_key_heads == 0, source, ": linear_num_value_heads (",
           linear_num_value_heads, ") is not a multiple of linear_num_key_heads (", linear_num_key_heads, ")");
  QT_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1, source, ": partial_rotary_factor ",
           partial_rotary_factor, " is outside (0, 1]");
  QT_CHECK(rotary_dim() % 2 == 0 && rotary_dim() > 0, source, ": rotary dimension ", rotary_dim(), " must be even");
  QT_CHECK(hidden_act == "silu", source, ": hidden_act '", hidden_act, "' is not supported (Qwen3.5 uses silu)");
  QT_CHECK(!attention_bias, source, ": attention_bias=true is not supported (Qwen3.5 has no biases)");
  QT_CHECK(rms_norm_eps > 0, source, ": rms_norm_eps must be positive");
  QT_CHECK(rope_theta > 0, source, ": rope_theta must be positive");
}

ModelConfig config_load(const std::string& path) {
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    QT_FAIL(path, ": malformed JSON: ", e.what());
  }
  return config_from_json(j, path);
}

nlohmann::ordered_json config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json t;
  if (!c.nested) {
    t["architectures"] = {"Qwen3_5ForCausalLM"};
    t["model_type"] = "qwen3_5_text";
  } else {
    t["model_type"] = "qwen3_5_text";
  }
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["intermediate_size"] = c.intermediate_size;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["head_dim"] = c.head_dim;
  t["hidden_act"] = c.hidden_act;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["initializer_range"] = c.initializer_range;
  t["attention_bias"] = c.attention_bias;
  t["attention_dropout"] = c.attention_dropout;
  t["attn_output_gate"] = c.attn_output_gate;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["full_attention_interval"] = c.full_attention_interval;
  nlohmann::ordered_json lt = nlohmann::ordered_json::array();
  for (auto k : c.layer_types) lt.push_back(layer_kind_name(k));
  t["layer_types"] = lt;
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.partial_rotary_factor},
                          {"mrope_section", c.mrope_section},
                          {"mrope_interleaved", c.mrope_interleaved}};
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.eos_token_id >= 0) t["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id >= 0) t["pad_token_id"] = c.pad_token_id;
  if (c.bos_token_id >= 0) t["bos_token_id"] = c.bos_token_id;
  t["use_cache"] = true;
  t["dtype"] = c.torch_dtype;
  if (!c.nested) return t;
  nlohmann::ordered_json root;
  root["architectures"] = {"Qwen3_5ForConditionalGeneration"};
  root["model_type"] = "qwen3_5";
  root["text_config"] = t;
  root["tie_word_embeddings"] = c.tie_word_embeddings;
  return root;
}

}  // namespace qt
