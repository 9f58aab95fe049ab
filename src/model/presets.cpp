#include "model/presets.h"

#include "core/error.h"

namespace qt {
namespace {

struct RealShape {
  const char* name;
  int64_t hidden, layers, intermediate, q_heads, kv_heads, v_heads;
  bool tie;
};

// docs/model_spec.md section 7.
constexpr RealShape kReal[] = {
    {"0.8b", 1024, 24, 3584, 8, 2, 16, true},   {"2b", 2048, 24, 6144, 8, 2, 16, true},
    {"4b", 2560, 32, 9216, 16, 4, 32, true},    {"9b", 4096, 32, 12288, 16, 4, 32, false},
    {"27b", 5120, 64, 17408, 24, 4, 48, false},
};

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "0.8b", "2b", "4b", "9b", "27b"};
  return names;
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    // A few hundred thousand parameters: learns a small task on two CPU cores in about a minute,
    // yet keeps every structural feature (mixed layers, Hv = 2 Hk, GQA, partial RoPE).
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;  // the smallest head size the CUDA attention kernel instantiates
    c.linear_num_key_heads = 2;
    c.linear_num_value_heads = 4;
    c.linear_key_head_dim = 16;
    c.linear_value_head_dim = 16;
    c.rope_theta = 10000.0;
    c.max_position_embeddings = 4096;
    c.tie_word_embeddings = true;
    c.torch_dtype = "float32";
    // Two attention layers (LFLF): with so few layers, one attention layer at the very end
    // leaves too little depth to combine far-apart tokens (the GDN decay starts near e^-10).
    c.full_attention_interval = 2;
  } else {
    const RealShape* s = nullptr;
    for (const auto& r : kReal)
      if (name == r.name) s = &r;
    if (s == nullptr) {
      std::string known;
      for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
      QT_FAIL("unknown preset '", name, "' (known: ", known, ")");
    }
    c.vocab_size = 248320;
    c.hidden_size = s->hidden;
    c.intermediate_size = s->intermediate;
    c.num_hidden_layers = s->layers;
    c.num_attention_heads = s->q_heads;
    c.num_key_value_heads = s->kv_heads;
    c.head_dim = 256;
    c.linear_num_key_heads = 16;
    c.linear_num_value_heads = s->v_heads;
    c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128;
    c.rope_theta = 1e7;
    c.max_position_embeddings = 262144;
    c.tie_word_embeddings = s->tie;
    c.eos_token_id = 248044;
  }
  c.layer_types = default_layer_types(c.num_hidden_layers, c.full_attention_interval);
  c.validate("preset " + name);
  return c;
}

}  // namespace qt
