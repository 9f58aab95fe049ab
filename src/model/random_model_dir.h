// A complete, randomly initialized HF model directory for a preset: config.json (loadable by
// transformers as Qwen3_5ForCausalLM), model.safetensors with transformers' init, tokenizer.json
// and tokenizer_config.json. Returns the parameter count.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace qt {

int64_t write_random_model_dir(const std::string& preset, const std::string& out, uint64_t seed, DType dtype);

}  // namespace qt
