// The parameter table of the Qwen3.5 text model: exact HF names and shapes (docs/model_spec.md
// section 2), with a role the model code dispatches on, a reporting group and the init rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace qt {

enum class ParamGroup { Embedding, GDN, Attention, MLP, Norm, Other };
constexpr int kParamGroupCount = 6;
const char* param_group_name(ParamGroup g);

enum class ParamRole {
  EmbedTokens, LmHead, FinalNorm,
  InputNorm, PostAttnNorm, MlpGate, MlpUp, MlpDown,
  GdnInProjQkv, GdnInProjZ, GdnInProjB, GdnInProjA, GdnConv1d, GdnDtBias, GdnALog, GdnNorm, GdnOutProj,
  AttnQProj, AttnKProj, AttnVProj, AttnOProj, AttnQNorm, AttnKNorm,
};

// How transformers initializes the tensor (Qwen3_5PreTrainedModel._init_weights).
// KaimingUniform: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), torch's kaiming_uniform_(a=sqrt(5)) as PEFT
// initializes lora_A.
enum class ParamInit { Normal, Zeros, Ones, ALogUniform, KaimingUniform };

struct ParamSpec {
  std::string name;  // full HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  ParamRole role;
  ParamGroup group;
  ParamInit init;
  int layer = -1;  // -1 for embeddings and the final norm
};

// Trainable tensors of the text model in a stable order. lm_head.weight is listed only when the
// embeddings are untied (tied: the model reads the embedding matrix for both).
std::vector<ParamSpec> param_table(const ModelConfig& cfg);
// Group of any checkpoint name (text-model names by the table's rules; vision/mtp/unknown: Other).
ParamGroup param_group_of_name(const std::string& name, const ModelConfig& cfg);
int64_t param_count(const ModelConfig& cfg);
// AdamW's decoupled weight decay applies to matrices only, not to norms, A_log or dt_bias.
inline bool param_decays(const ParamSpec& p) { return p.shape.size() >= 2; }
std::string lm_head_name();  // "lm_head.weight" in both layouts

}  // namespace qt
