#include "model/params.h"

namespace qt {

const char* param_group_name(ParamGroup g) {
  static const char* names[] = {"embeddings", "gdn", "attention", "mlp", "norms", "other"};
  static_assert(sizeof(names) / sizeof(names[0]) == kParamGroupCount, "group names out of sync");
  return names[static_cast<int>(g)];
}

std::string lm_head_name() { return "lm_head.weight"; }

std::vector<ParamSpec> param_table(const ModelConfig& c) {
  std::vector<ParamSpec> t;
  const std::string& P = c.param_prefix;
  const int64_t H = c.hidden_size;
  auto add = [&](std::string name, Shape shape, ParamRole role, ParamGroup group, ParamInit init, int layer) {
    t.push_back(ParamSpec{std::move(name), std::move(shape), role, group, init, layer});
  };
  add(P + "embed_tokens.weight", {c.vocab_size, H}, ParamRole::EmbedTokens, ParamGroup::Embedding, ParamInit::Normal, -1);
  for (int l = 0; l < static_cast<int>(c.num_hidden_layers); ++l) {
    const std::string L = P + "layers." + std::to_string(l) + ".";
    add(L + "input_layernorm.weight", {H}, ParamRole::InputNorm, ParamGroup::Norm, ParamInit::Zeros, l);
    if (c.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet) {
      const std::string A = L + "linear_attn.";
      const int64_t hv = c.linear_num_value_heads;
      add(A + "in_proj_qkv.weight", {c.conv_dim(), H}, ParamRole::GdnInProjQkv, ParamGroup::GDN, ParamInit::Normal, l);
      add(A + "in_proj_z.weight", {c.value_dim(), H}, ParamRole::GdnInProjZ, ParamGroup::GDN, ParamInit::Normal, l);
      add(A + "in_proj_b.weight", {hv, H}, ParamRole::GdnInProjB, ParamGroup::GDN, ParamInit::Normal, l);
      add(A + "in_proj_a.weight", {hv, H}, ParamRole::GdnInProjA, ParamGroup::GDN, ParamInit::Normal, l);
      add(A + "conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}, ParamRole::GdnConv1d, ParamGroup::GDN,
          ParamInit::Normal, l);
      add(A + "dt_bias", {hv}, ParamRole::GdnDtBias, ParamGroup::GDN, ParamInit::Ones, l);
      add(A + "A_log", {hv}, ParamRole::GdnALog, ParamGroup::GDN, ParamInit::ALogUniform, l);
      add(A + "norm.weight", {c.linear_value_head_dim}, ParamRole::GdnNorm, ParamGroup::GDN, ParamInit::Ones, l);
      add(A + "out_proj.weight", {H, c.value_dim()}, ParamRole::GdnOutProj, ParamGroup::GDN, ParamInit::Normal, l);
    } else {
      const std::string A = L + "self_attn.";
      const int64_t D = c.head_dim;
      add(A + "q_proj.weight", {2 * c.num_attention_heads * D, H}, ParamRole::AttnQProj, ParamGroup::Attention,
          ParamInit::Normal, l);
      add(A + "k_proj.weight", {c.num_key_value_heads * D, H}, ParamRole::AttnKProj, ParamGroup::Attention,
          ParamInit::Normal, l);
      add(A + "v_proj.weight", {c.num_key_value_heads * D, H}, ParamRole::AttnVProj, ParamGroup::Attention,
          ParamInit::Normal, l);
      add(A + "o_proj.weight", {H, c.num_attention_heads * D}, ParamRole::AttnOProj, ParamGroup::Attention,
          ParamInit::Normal, l);
      add(A + "q_norm.weight", {D}, ParamRole::AttnQNorm, ParamGroup::Attention, ParamInit::Zeros, l);
      add(A + "k_norm.weight", {D}, ParamRole::AttnKNorm, ParamGroup::Attention, ParamInit::Zeros, l);
    }
    add(L + "post_attention_layernorm.weight", {H}, ParamRole::PostAttnNorm, ParamGroup::Norm, ParamInit::Zeros, l);
    add(L + "mlp.gate_proj.weight", {c.intermediate_size, H}, ParamRole::MlpGate, ParamGroup::MLP, ParamInit::Normal, l);
    add(L + "mlp.up_proj.weight", {c.intermediate_size, H}, ParamRole::MlpUp, ParamGroup::MLP, ParamInit::Normal, l);
    add(L + "mlp.down_proj.weight", {H, c.intermediate_size}, ParamRole::MlpDown, ParamGroup::MLP, ParamInit::Normal, l);
  }
  add(P + "norm.weight", {H}, ParamRole::FinalNorm, ParamGroup::Norm, ParamInit::Zeros, -1);
  if (!c.tie_word_embeddings)
    add(lm_head_name(), {c.vocab_size, H}, ParamRole::LmHead, ParamGroup::Embedding, ParamInit::Normal, -1);
  return t;
}

ParamGroup param_group_of_name(const std::string& name, const ModelConfig& c) {
  if (name == lm_head_name()) return ParamGroup::Embedding;
  if (name.rfind(c.param_prefix, 0) != 0) return ParamGroup::Other;
  const std::string rest = name.substr(c.param_prefix.size());
  if (rest.rfind("embed_tokens.", 0) == 0) return ParamGroup::Embedding;
  if (rest == "norm.weight") return ParamGroup::Norm;
  if (rest.rfind("layers.", 0) != 0) return ParamGroup::Other;
  if (rest.find(".linear_attn.") != std::string::npos) return ParamGroup::GDN;
  if (rest.find(".self_attn.") != std::string::npos) return ParamGroup::Attention;
  if (rest.find(".mlp.") != std::string::npos) return ParamGroup::MLP;
  if (rest.find("layernorm") != std::string::npos) return ParamGroup::Norm;
  return ParamGroup::Other;
}

int64_t param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& p : param_table(c)) n += shape_numel(p.shape);
  return n;
}

}  // namespace qt
