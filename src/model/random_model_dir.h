// A complete, randomly initialized HF model directory for a preset: config.json (loadable by
// transformers as Qwen3_5ForCausalLM), model.safetensors with transformers' init, tokenizer.json
// and tokenizer_config.json. Returns the parameter count. An existing non-empty directory that is
// not a model directory is refused unless `force` (hf_save keeps the files found there).
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace qt {

struct RandomModelOptions {
  std::string preset;       // tiny, 0.8b, 2b, 4b, 9b, 27b; or
  std::string config_json;  // any valid Qwen3.5 text config.json (a real model's, at any size)
  std::string tokenizer;    // tokenizer.json (or a directory holding one) to put in; its vocabulary
                            // must fit the config's vocab_size. Empty: the preset's own
  std::string out;
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  bool force = false;       // write into a non-empty directory that is not a model directory
};

int64_t write_random_model_dir(const RandomModelOptions& options);
int64_t write_random_model_dir(const std::string& preset, const std::string& out, uint64_t seed, DType dtype);

}  // namespace qt
