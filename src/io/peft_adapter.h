// PEFT LoRA adapter directories, as PEFT writes and reads them: adapter_config.json
// (peft_type LORA, r, lora_alpha, target_modules, base_model_name_or_path, use_rslora, ...) and
// adapter_model.safetensors with keys like
// `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` (A [r, in], B [out, r]).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace qt {

struct PeftLoraConfig {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0;
  bool rslora = false;
  std::vector<std::string> target_modules;
  std::vector<std::string> modules_to_save;  // trained fully, saved under base_model.model.<name>
  std::string base_model;  // base_model_name_or_path
};

// adapter_config.json's content for a LoRA adapter on a causal LM.
nlohmann::ordered_json peft_adapter_config_json(const PeftLoraConfig& c);

struct PeftAdapter {
  std::string dir;
  PeftLoraConfig config;
  std::shared_ptr<SafetensorsFile> weights;
};
// Opens and checks an adapter directory; errors name the file and the key (not a LoRA adapter,
// a DoRA / bias / layer-pattern adapter this engine cannot represent, a missing weights file).
PeftAdapter peft_adapter_open(const std::string& dir);

}  // namespace qt
