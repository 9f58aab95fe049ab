// Random model directories for presets (init-model).
#include "model/random_model_dir.h"

#include <filesystem>

#include "core/log.h"
#include "io/hf_checkpoint.h"
#include "io/mapped_file.h"
#include "model/init.h"
#include "model/presets.h"
#include "text/bpe_builder.h"

namespace qt {
namespace {

// Text the tiny tokenizer learns its merges from: chat words and the demo's arithmetic phrasing.
const char* const kTinyCorpus =
    "user assistant system What is the sum of these numbers? The answer is . Please add the two numbers. "
    "Reverse the letters of the word. The reversed word is . Hello, how are you? I am fine, thank you. "
    "Here is the result: Let me think about this. You are a helpful assistant. Compute the following. "
    "the quick brown fox jumps over the lazy dog. question answer calculate plus minus equals result word "
    "letters reverse sum add number numbers the a an of to in is are was were be this that with for on as";

}  // namespace

int64_t write_random_model_dir(const std::string& preset, const std::string& out, uint64_t seed, DType dtype) {
  ModelConfig cfg = preset_config(preset);
  QT_CHECK(dtype == DType::BF16 || dtype == DType::F32 || dtype == DType::F16, "init-model: dtype ", dtype_name(dtype),
           " is not one of bf16, f16, f32");
  cfg.torch_dtype = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";

  std::vector<ParamSpec> params = param_table(cfg);
  std::vector<TensorWriteSpec> specs;
  for (const ParamSpec& p : params) {
    // A_log and dt_bias are kept in fp32 like the real checkpoints' mamba_ssm_dtype.
    const DType t = (p.role == ParamRole::GdnALog || p.role == ParamRole::GdnDtBias) ? DType::F32 : dtype;
    const double std = cfg.initializer_range;
    specs.push_back({p.name, t, p.shape, [p, std, seed, t](void* dst, size_t) { init_param(p, std, seed, t, dst); }});
  }
  int64_t nparams = 0;
  for (const auto& p : params) nparams += shape_numel(p.shape);
  log_info("init-model: preset ", preset, ", ", nparams, " parameters, ", cfg.torch_dtype, " -> ", out);

  // Tokenizer: tiny gets a small learned vocabulary; real shapes get a byte-level placeholder with
  // the Qwen3.5 special tokens at their real ids (the real tokenizer.json is not redistributable here).
  std::vector<AddedToken> added;
  std::vector<std::pair<std::string, std::string>> merges;
  if (preset == "tiny") {
    added = qwen_added_tokens(cfg.vocab_size - 26);
    merges = bpe_train_merges(kTinyCorpus, static_cast<int>(cfg.vocab_size - 26 - 256));
  } else {
    added = qwen_added_tokens(248044);
  }
  cfg.eos_token_id = added[2].id;  // <|im_end|> ends a chat turn
  cfg.pad_token_id = added[0].id;

  const std::string staging = out + ".tokenizer-staging";
  std::filesystem::create_directories(staging);
  write_text_file(staging + "/tokenizer.json", bpe_tokenizer_json(merges, added, kQwen35SplitRegex).dump(1) + "\n");
  write_text_file(staging + "/tokenizer_config.json",
                  bpe_tokenizer_config_json(added, cfg.max_position_embeddings).dump(2) + "\n");
  HfSaveOptions so;
  so.copy_files_from = staging;
  try {
    hf_save(out, config_to_json(cfg), specs, so);
  } catch (...) {
    std::filesystem::remove_all(staging);
    throw;
  }
  std::filesystem::remove_all(staging);
  return nparams;
}


}  // namespace qt
