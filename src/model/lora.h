// LoRA adapters on the linear projections (PEFT's LoRA): y = W x + scale * B (A x), W frozen,
// A [r, in] and B [out, r] trained; scale = alpha / r (rsLoRA: alpha / sqrt(r)). PEFT's init:
// A Kaiming-uniform, B zero, so training starts from the base model exactly. Adapter tensors are
// named as PEFT names them under its wrapper (`base_model.model.` + the base weight's name with
// `.weight` replaced by `.lora_A.weight` / `.lora_B.weight`); inside the engine the prefix is left
// off (lora_param_table).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/peft_adapter.h"
#include "model/config.h"
#include "model/params.h"

namespace qt {

struct LoraSpec {
  int64_t r = 16;
  double alpha = 32;
  bool rslora = false;
  double dropout = 0.0;  // on each adapter's input while training (PEFT's lora_dropout); 0 = none
  std::vector<std::string> targets;  // projection names (q_proj, in_proj_qkv, down_proj, ...)
  // Modules trained fully beside the adapters (PEFT's modules_to_save): every base weight whose
  // module path ends with one of these (PEFT's rule: "norm" names every norm, "lm_head" the head).
  std::vector<std::string> modules_to_save;
  double scale() const;
};

// Every linear projection by its checkpoint name: attention q/k/v/o_proj, Gated DeltaNet
// in_proj_qkv/z/a/b and out_proj, MLP gate/up/down_proj.
const std::vector<std::string>& lora_all_targets();
// The checkpoint name of a projection role ("q_proj"), or nullptr for other roles.
const char* projection_name(ParamRole role);
bool lora_targets(const LoraSpec& lora, ParamRole role);
// Throws naming the unknown target (with the known ones), a non-positive r or alpha.
void lora_validate(const LoraSpec& lora);

// The adapter tensors of a model, in the base table's order: for each targeted projection its A
// then its B (role and layer of the projection; init KaimingUniform / Zeros).
std::vector<ParamSpec> lora_param_table(const ModelConfig& cfg, const LoraSpec& lora);
// Indices into param_table(cfg) of the weights modules_to_save trains. Errors name an entry that
// matches no module, one that holds a LoRA target, and lm_head when it is tied to embed_tokens.
std::vector<size_t> lora_saved_modules(const ModelConfig& cfg, const LoraSpec& lora);
// The trainable table of a LoRA model: lora_param_table, then the saved modules' weights.
std::vector<ParamSpec> lora_trainable_table(const ModelConfig& cfg, const LoraSpec& lora);
// "model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj.lora_A.weight".
std::string lora_tensor_name(const std::string& base_weight_name, bool b);
// PEFT's key in adapter_model.safetensors for an engine adapter name, and back ("" if not one).
std::string peft_key(const std::string& adapter_name);
std::string peft_key_to_adapter_name(const std::string& key);

// W[out, in] += scale * B[out, r] A[r, in] (f32, on the host): the merged weight.
void lora_merge_into(std::vector<float>& w, const std::vector<float>& a, const std::vector<float>& b, int64_t out,
                     int64_t in, int64_t r, double scale);

// The spec of a PEFT adapter (target_modules may be "all-linear"); errors name the file.
LoraSpec lora_spec_from_peft(const PeftAdapter& adapter);
PeftLoraConfig lora_peft_config(const LoraSpec& lora, const std::string& base_model);
// The adapter's tensors by engine name (lora_param_table's order) as f32: every tensor the table
// names must be in the file with its shape, and every lora tensor of the file must be in the table.
std::vector<std::vector<float>> lora_read_adapter(const PeftAdapter& adapter, const std::vector<ParamSpec>& table);

// qwentune merge: the base directory with every adapted weight replaced by W + scale B A, in the
// base's dtypes, written atomically as a complete HF directory (the other tensors and files
// carried). Returns the number of merged weights.
int64_t lora_merge_dirs(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir,
                        bool force);

}  // namespace qt
