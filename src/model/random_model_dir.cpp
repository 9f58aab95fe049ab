// Random model directories for presets (init-model).
#include "model/random_model_dir.h"

#include <unistd.h>

#include <filesystem>

#include "core/log.h"
#include "model/hf_checkpoint.h"
#include "io/mapped_file.h"
#include "model/init.h"
#include "model/presets.h"
#include "text/bpe_builder.h"
#include "text/tokenizer.h"

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

int64_t write_random_model_dir(const RandomModelOptions& o) {
  QT_CHECK(o.preset.empty() != o.config_json.empty(), "init-model: give exactly one of --preset and --config");
  ModelConfig cfg = o.config_json.empty() ? preset_config(o.preset) : config_load(o.config_json);
  const std::string what = o.config_json.empty() ? "preset " + o.preset : o.config_json;
  const DType dtype = o.dtype;
  QT_CHECK(dtype == DType::BF16 || dtype == DType::F32 || dtype == DType::F16, "init-model: dtype ", dtype_name(dtype),
           " is not one of bf16, f16, f32");
  cfg.torch_dtype = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";

  std::vector<ParamSpec> params = param_table(cfg);
  std::vector<TensorWriteSpec> specs;
  const uint64_t seed = o.seed;
  for (const ParamSpec& p : params) {
    // A_log and dt_bias are kept in fp32 like the real checkpoints' mamba_ssm_dtype.
    const DType t = (p.role == ParamRole::GdnALog || p.role == ParamRole::GdnDtBias) ? DType::F32 : dtype;
    const double std = cfg.initializer_range;
    specs.push_back({p.name, t, p.shape, [p, std, seed, t](void* dst, size_t) { init_param(p, std, seed, t, dst); }});
  }
  int64_t nparams = 0;
  for (const auto& p : params) nparams += shape_numel(p.shape);
  log_info("init-model: ", what, ", ", nparams, " parameters, ", cfg.torch_dtype, " -> ", o.out);

  // The tokenizer files go through a staging directory outside the output's parent, which is
  // never left behind (hf_save copies them in).
  std::error_code ec;
  const std::filesystem::path staging =
      std::filesystem::temp_directory_path() / ("qwentune-init-" + std::to_string(::getpid()) + "-" + std::to_string(seed));
  std::filesystem::remove_all(staging, ec);
  std::filesystem::create_directories(staging);
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() { std::error_code e; std::filesystem::remove_all(p, e); }
  } cleanup{staging};
  if (!o.tokenizer.empty()) {
    const std::filesystem::path tok_path = std::filesystem::is_directory(o.tokenizer)
                                               ? std::filesystem::path(o.tokenizer) / "tokenizer.json"
                                               : std::filesystem::path(o.tokenizer);
    const Tokenizer tok = Tokenizer::load(tok_path.string());
    QT_CHECK(tok.vocab_size() <= cfg.vocab_size, tok_path.string(), ": the tokenizer has ", tok.vocab_size(),
             " tokens (ids 0..", tok.vocab_size() - 1, ") but ", what, " has vocab_size ", cfg.vocab_size,
             ": its ids would index past the embedding");
    std::filesystem::copy_file(tok_path, staging / "tokenizer.json");
    for (const char* side : {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}) {
      const auto p = tok_path.parent_path() / side;
      if (std::filesystem::is_regular_file(p)) std::filesystem::copy_file(p, staging / side);
    }
    if (auto id = tok.token_to_id("<|im_end|>")) cfg.eos_token_id = *id;
    if (auto id = tok.token_to_id("<|endoftext|>")) cfg.pad_token_id = *id;
  } else {
    // Tiny gets a small learned vocabulary; other shapes a byte-level placeholder with the
    // Qwen3.5 special tokens at their real ids (or at the top of a smaller vocabulary).
    const int64_t n_special = 26;
    QT_CHECK(cfg.vocab_size >= 256 + n_special, what, ": vocab_size ", cfg.vocab_size,
             " is too small for the placeholder tokenizer (256 bytes + ", n_special, " special tokens); pass --tokenizer");
    std::vector<AddedToken> added;
    std::vector<std::pair<std::string, std::string>> merges;
    if (o.preset == "tiny") {
      added = qwen_added_tokens(cfg.vocab_size - n_special);
      merges = bpe_train_merges(kTinyCorpus, static_cast<int>(cfg.vocab_size - n_special - 256));
    } else {
      added = qwen_added_tokens(cfg.vocab_size >= 248044 + n_special ? 248044 : cfg.vocab_size - n_special);
    }
    cfg.eos_token_id = added[2].id;  // <|im_end|> ends a chat turn
    cfg.pad_token_id = added[0].id;
    write_text_file((staging / "tokenizer.json").string(), bpe_tokenizer_json(merges, added, kQwen35SplitRegex).dump(1) + "\n");
    write_text_file((staging / "tokenizer_config.json").string(),
                    bpe_tokenizer_config_json(added, cfg.max_position_embeddings).dump(2) + "\n");
  }
  HfSaveOptions so;
  so.copy_files_from = staging.string();
  so.force = o.force;
  hf_save(o.out, config_to_json(cfg), specs, so);
  return nparams;
}

int64_t write_random_model_dir(const std::string& preset, const std::string& out, uint64_t seed, DType dtype) {
  RandomModelOptions o;
  o.preset = preset;
  o.out = out;
  o.seed = seed;
  o.dtype = dtype;
  return write_random_model_dir(o);
}

}  // namespace qt
