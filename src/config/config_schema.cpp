#include "config/config_schema.h"

#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"

namespace qt {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxInt = 9.0e18;

using T = ConfigType;

// Helpers that keep the table one line a key.
ConfigKey str(const char* s, const char* n, const char* def, const char* help, const char* choices = nullptr) {
  ConfigKey k{s, n, T::Str, def, help};
  k.choices = choices;
  return k;
}
ConfigKey path(const char* s, const char* n, T t, const char* def, const char* help) { return ConfigKey{s, n, t, def, help}; }
ConfigKey flag(const char* s, const char* n, const char* def, const char* help) { return ConfigKey{s, n, T::Bool, def, help}; }
ConfigKey num(const char* s, const char* n, T t, const char* def, double lo, double hi, const char* help,
              bool lo_open = false, bool hi_open = false) {
  ConfigKey k{s, n, t, def, help, lo, hi};
  k.lo_open = lo_open;
  k.hi_open = hi_open;
  return k;
}

std::string type_name(const ConfigKey& k) {
  switch (k.type) {
    case T::Str: return k.choices ? std::string(k.choices) : "a string";
    case T::StrList: return k.choices ? "a list of " + std::string(k.choices) : "a list of strings";
    case T::Path: return "a path";
    case T::PathList: return "a path or a list of paths";
    case T::Bool: return "true or false";
    case T::Int: return "an integer";
    case T::Float: return "a number";
  }
  return "";
}

std::string range_text(const ConfigKey& k) {
  if (!(k.lo < k.hi)) return "";
  std::ostringstream os;
  os << (k.lo_open ? "(" : "[") << k.lo << ", ";
  if (k.hi == kInf || k.hi >= kMaxInt) os << "inf)";
  else os << k.hi << (k.hi_open ? ")" : "]");
  return os.str();
}

bool in_choices(const char* choices, const std::string& v) {
  std::string c(choices);
  size_t b = 0;
  while (b <= c.size()) {
    size_t e = c.find('|', b);
    if (e == std::string::npos) e = c.size();
    if (c.compare(b, e - b, v) == 0 && e - b == v.size()) return true;
    b = e + 1;
  }
  return false;
}

void check_duplicates(const YAML::Node& map, const ConfigSource& src, const std::string& prefix) {
  std::map<std::string, int> first_line;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) continue;
    const std::string k = kv.first.Scalar();
    const int line = kv.first.Mark().line + 1;
    auto [it, fresh] = first_line.emplace(k, line);
    QT_CHECK(fresh, src.file, ":", line, ": duplicated key '", prefix, k, "' (first set on line ", it->second, ")");
    if (kv.second.IsMap()) check_duplicates(kv.second, src, prefix + k + ".");
  }
}

void check_value(const ConfigKey& k, const YAML::Node& v, const ConfigSource& src) {
  const std::string dotted = *k.section ? std::string(k.section) + "." + k.name : std::string(k.name);
  auto fail = [&](const std::string& what) {
    QT_FAIL(src.where(dotted, v), ": ", dotted, " ", what);
  };
  if (v.IsNull()) return;  // `key:` with no value = the default
  switch (k.type) {
    case T::Str:
    case T::Path: {
      if (!v.IsScalar()) fail("must be " + type_name(k));
      if (k.type == T::Path && v.Scalar().empty()) fail("must not be empty");
      if (k.choices && !in_choices(k.choices, v.Scalar())) fail("is '" + v.Scalar() + "', expected one of " + k.choices);
      return;
    }
    case T::StrList: {
      if (!v.IsSequence()) fail("must be " + type_name(k) + ", e.g. [a, b]");
      for (const auto& e : v) {
        if (!e.IsScalar() || e.Scalar().empty()) fail("entries must be non-empty strings");
        if (k.choices && !in_choices(k.choices, e.Scalar()))
          fail("has '" + e.Scalar() + "', expected entries among " + k.choices);
      }
      return;
    }
    case T::PathList: {
      if (v.IsScalar()) {
        if (v.Scalar().empty()) fail("must not be empty");
        return;
      }
      if (!v.IsSequence() || v.size() == 0) fail("must be " + type_name(k) + " (not empty)");
      for (const auto& e : v)
        if (!e.IsScalar() || e.Scalar().empty()) fail("entries must be non-empty paths");
      return;
    }
    case T::Bool: {
      bool b;
      if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b)) fail("is '" + (v.IsScalar() ? v.Scalar() : "?") + "', expected true or false");
      return;
    }
    case T::Int:
    case T::Float: {
      double x = 0;
      if (!v.IsScalar()) fail("must be " + type_name(k));
      if (k.type == T::Int) {
        int64_t i;
        if (!YAML::convert<int64_t>::decode(v, i)) fail("is '" + v.Scalar() + "', expected an integer");
        x = static_cast<double>(i);
      } else {
        if (!YAML::convert<double>::decode(v, x)) fail("is '" + v.Scalar() + "', expected a number");
        if (!std::isfinite(x)) fail("is '" + v.Scalar() + "', expected a finite number");
      }
      if (k.lo < k.hi) {
        const bool ok = (k.lo_open ? x > k.lo : x >= k.lo) && (k.hi_open ? x < k.hi : x <= k.hi);
        if (!ok) fail("is " + v.Scalar() + ", must be in " + range_text(k));
      }
      return;
    }
  }
}

void emit_value(YAML::Emitter& e, const YAML::Node& v) {
  if (v.IsSequence()) {
    e << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) e << x.Scalar();
    e << YAML::EndSeq;
  } else {
    e << v;
  }
}


// The sections of the table in order ("" first): a section is any dotted path a key names, and
// every prefix of it is a section too (train.cuda makes train one).
std::vector<std::string> table_sections();

bool is_section(const std::string& s) {
  for (const std::string& x : table_sections())
    if (x == s) return true;
  return false;
}
std::vector<std::string> section_parts(const std::string& section) {
  std::vector<std::string> parts;
  for (size_t b = 0; !section.empty() && b <= section.size();) {
    size_t e = section.find('.', b);
    if (e == std::string::npos) e = section.size();
    parts.push_back(section.substr(b, e - b));
    b = e + 1;
  }
  return parts;
}
// The node of section parts[i..] under n (const lookups only: yaml-cpp's non-const operator[]
// inserts, and Node assignment rebinds shared content), or a null node.
YAML::Node find_section(const YAML::Node& n, const std::vector<std::string>& parts, size_t i) {
  if (i == parts.size()) return n;
  if (!n.IsDefined() || !n.IsMap()) return YAML::Node();
  return find_section(n[parts[i]], parts, i + 1);
}
std::string join_key(const std::string& section, const std::string& name) {
  return section.empty() ? name : section + "." + name;
}
// The keys and sub-sections of `section`, for "unknown key" messages.
std::string known_in(const std::string& section) {
  std::string list;
  for (const ConfigKey& k : config_keys())
    if (section == k.section) list += (list.empty() ? "" : ", ") + std::string(k.name);
  for (const std::string& sub : table_sections()) {
    const size_t dot = sub.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : sub.substr(0, dot);
    if (!sub.empty() && parent == section) list += (list.empty() ? "" : ", ") + sub.substr(dot + 1) + ":";
  }
  return list;
}

void validate_section(const YAML::Node& map, const std::string& section, const ConfigSource& src) {
  for (const auto& kv : map) {
    const std::string name = kv.first.as<std::string>();
    const std::string dotted = join_key(section, name);
    if (is_section(dotted)) {
      QT_CHECK(kv.second.IsMap() || kv.second.IsNull(), src.where(dotted, kv.first), ": `", name,
               ":` must be a section of keys (", known_in(dotted), ")");
      if (kv.second.IsMap()) validate_section(kv.second, dotted, src);
      continue;
    }
    const ConfigKey* key = config_key(section, name);
    QT_CHECK(key, src.where(dotted, kv.first), ": unknown key ", dotted, " (known: ", known_in(section), ")");
    check_value(*key, kv.second, src);
  }
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = {
      path("", "model", T::Path, nullptr, "HF model directory (or hub id) to start from; required by train"),
      path("", "tokenizer", T::Path, nullptr, "tokenizer.json, a directory holding one or a hub id; default: the model's"),
      path("", "output_dir", T::Path, "out/run", "checkpoint-N/, final/, metrics.jsonl, tb/, config.yaml, summary.json, report.html"),
      // data: which files, how to render, tokenize, cache and pack them (data/data_job.h)
      path("data", "path", T::PathList, nullptr,
           "data files, directories (recursive), globs or a hub data set id (JSONL, JSON, parquet); required"),
      str("data", "split", "", "the split to read (e.g. train_sft) when the data holds several (HF file naming)"),
      path("data", "eval_path", T::PathList, nullptr,
           "held-out eval set, never trained on (not with train.eval_fraction); default with eval_split: data.path"),
      str("data", "eval_split", "", "the eval set's split (e.g. test_sft)"),
      str("data", "schema", "auto", "row format", "auto|ultrachat|sharegpt|alpaca|tokenized"),
      str("data", "train_on", "assistant", "which tokens are trained", "assistant|last_assistant|all"),
      str("data", "thinking", "on", "Qwen3.5 template: keep reasoning blocks (on) or empty think blocks (off)", "on|off"),
      num("data", "tokens_per_batch", T::Int, "8192", 16, 1 << 24, "tokens per packed row"),
      num("data", "shuffle_window", T::Int, "10000", 0, kMaxInt, "samples shuffled together before packing (0 = file order)"),
      num("data", "seed", T::Int, "0", 0, kMaxInt, "packing shuffle seed"),
      str("data", "overflow", "truncate", "samples longer than a row", "truncate|split"),
      flag("data", "skip_bad_rows", "false", "count and skip malformed rows instead of failing"),
      flag("data", "fix_utf8", "false", "replace invalid UTF-8 with U+FFFD instead of failing"),
      path("data", "cache_dir", T::Path, nullptr,
           "token cache; default: .qwentune-cache next to the first data path, else $XDG_CACHE_HOME/qwentune or "
           "~/.cache/qwentune (not writable there, or hub data)"),
      num("data", "threads", T::Int, "0", 0, 4096, "tokenizer threads (0 = all cores)"),
      // train: the optimizer, schedule, loop, checkpoints (train/trainer.h)
      str("train", "backend", "auto", "auto = cuda when a GPU is present", "auto|cpu|cuda"),
      num("train", "lr", T::Float, "1.0e-4", 0, 10, "peak learning rate", true),
      num("train", "min_lr_ratio", T::Float, "0.0", 0, 1, "final lr = min_lr_ratio * lr"),
      str("train", "schedule", "cosine", "learning-rate schedule after warm-up", "cosine|linear|constant"),
      num("train", "warmup_steps", T::Int, "0", 0, kMaxInt, "linear warm-up steps"),
      num("train", "weight_decay", T::Float, "0.0", 0, 10, "decoupled weight decay, on matrices only"),
      num("train", "beta1", T::Float, "0.9", 0, 1, "AdamW beta1", false, true),
      num("train", "beta2", T::Float, "0.999", 0, 1, "AdamW beta2", false, true),
      num("train", "eps", T::Float, "1.0e-8", 0, 1, "AdamW epsilon", true),
      num("train", "max_grad_norm", T::Float, "1.0", 0, kInf, "clip the global gradient norm (0 = no clipping)"),
      num("train", "global_batch_tokens", T::Int, "0", 0, kMaxInt, "tokens per optimizer step (0 = one packed row)"),
      num("train", "epochs", T::Int, "1", 1, 1e6, "passes over the data"),
      num("train", "max_steps", T::Int, "0", 0, kMaxInt, "stop after this many steps (0 = no limit)"),
      num("train", "eval_fraction", T::Float, "0.0", 0, 1, "held-out share of samples for eval (seeded)", false, true),
      num("train", "eval_every", T::Int, "0", 0, kMaxInt, "eval every N steps (0 = only at the end)"),
      num("train", "save_every", T::Int, "0", 0, kMaxInt, "checkpoint every N steps (0 = only final/)"),
      num("train", "save_total_limit", T::Int, "0", 0, kMaxInt, "keep only the newest N checkpoint-N/ (0 = keep all)"),
      flag("train", "save_best", "false", "also keep best/: the checkpoint with the lowest eval loss"),
      num("train", "log_every", T::Int, "1", 0, kMaxInt, "progress line every N steps (0 = first and last only)"),
      num("train", "seed", T::Int, "0", 0, kMaxInt, "eval split seed"),
      str("train", "save_dtype", "auto", "dtype of saved weights (auto = the source's)", "auto|bf16|f16|f32"),
      str("train", "resume", "", "checkpoint directory, or auto (newest complete checkpoint in output_dir)"),
      flag("train", "cuda_graph", "true", "CUDA: capture the step once and replay it"),
      flag("train", "deterministic", "true", "CUDA: bitwise reproducible steps"),
      str("train", "activation_checkpointing", "auto", "auto = from free device memory", "auto|none|selective|full"),
      str("train", "precision", "bf16",
          "bf16, or fp8: the decoder projections' GEMMs in e4m3 with per-tensor scaling (docs/fp8.md; Hopper)",
          "bf16|fp8"),
      flag("train", "fp8_lm_head", "true",
           "precision fp8: the LM head's GEMMs in FP8 too (e4m3 operands, e5m2 logit gradients; docs/fp8.md)"),
      str("train", "method", "full", "full fine-tuning, or LoRA adapters on a frozen base (the lora: section)", "full|lora"),
      // train.cuda: the CUDA backend's runtime (ops/cuda/cuda_backend.h)
      flag("train.cuda", "gemm_tune", "true",
           "time cuBLASLt's candidate algorithms per GEMM shape once, keep the fastest bit-identical one"),
      num("train.cuda", "gemm_candidates", T::Int, "32", 1, 64, "candidates timed per GEMM shape"),
      num("train.cuda", "arena_mib", T::Int, "1024", 16, 1 << 20, "device arena block size (MiB)"),
      // dist: several ranks (mpirun, srun, torchrun; dist/launch_env.h)
      str("dist", "zero", "auto", "ZeRO stage: 0 replicates, 1 shards optimizer state, 2 also gradients, 3 also the "
          "weights, gathered per layer (auto = the smallest that fits; 1 rank: 0)", "auto|0|1|2|3"),
      flag("dist", "reshard_after_forward", "true",
           "ZeRO-3: free each layer's gathered weights after its forward and gather them again for its backward "
           "(false: keep every layer whole from the step's first forward to its end)"),
      str("dist", "communicator", "auto", "auto = nccl on GPUs, mpi on CPU ranks (mpi on GPUs stages through the host)",
          "auto|mpi|nccl"),
      num("dist", "timeout_s", T::Float, "600", 1, 1e6, "a collective unfinished after this ends the job naming the rank"),
      str("dist", "reduce_dtype", "f32", "dtype gradients are summed in over the ranks", "f32|bf16"),
      // lora: PEFT's LoRA (model/lora.h), used when train.method is lora
      num("lora", "r", T::Int, "16", 1, 4096, "adapter rank"),
      num("lora", "alpha", T::Float, "32", 0, 1e6, "scale = alpha / r (rslora: alpha / sqrt(r))", true),
      num("lora", "dropout", T::Float, "0.0", 0, 1, "dropout on each adapter's input while training (PEFT's lora_dropout)",
          false, true),
      flag("lora", "rslora", "false", "rank-stabilized scale alpha / sqrt(r)"),
      ConfigKey{"lora", "targets", T::StrList,
                "[q_proj, k_proj, v_proj, o_proj, in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, out_proj, gate_proj, up_proj, down_proj]",
                "projections that get adapters, by checkpoint name", 0, 0, false, false,
                "q_proj|k_proj|v_proj|o_proj|in_proj_qkv|in_proj_z|in_proj_a|in_proj_b|out_proj|gate_proj|up_proj|down_proj"},
      ConfigKey{"lora", "modules_to_save", T::StrList, "[]",
                "modules trained fully beside the adapters (PEFT's rule: module paths ending so, e.g. norm, lm_head)"},
      path("lora", "adapter", T::Path, nullptr, "an existing PEFT LoRA adapter directory to continue training from"),
  };
  return keys;
}

const ConfigKey* config_key(const std::string& section, const std::string& name) {
  for (const ConfigKey& k : config_keys())
    if (section == k.section && name == k.name) return &k;
  return nullptr;
}

namespace {
std::vector<std::string> table_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> out{""};
    for (const ConfigKey& k : config_keys()) {
      const std::string s = k.section;
      for (size_t dot = s.find('.');; dot = s.find('.', dot + 1)) {
        const std::string prefix = s.substr(0, dot);  // npos: the whole section
        bool seen = false;
        for (const std::string& x : out) seen = seen || x == prefix;
        if (!seen) out.push_back(prefix);
        if (dot == std::string::npos) break;
      }
    }
    return out;
  }();
  return sections;
}
}  // namespace

std::string ConfigSource::where(const std::string& dotted_key, const YAML::Node& node) const {
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it)
    if (it->compare(0, dotted_key.size() + 1, dotted_key + "=") == 0) return "--set '" + *it + "'";
  if (node.Mark().line >= 0) return file + ":" + std::to_string(node.Mark().line + 1);
  return file;
}

void config_validate(const YAML::Node& root, const ConfigSource& src) {
  QT_CHECK(root.IsDefined() && !root.IsNull(), src.file, ": the config is empty");
  QT_CHECK(root.IsMap(), src.file, ": the config must be a mapping of keys (model, data, train, ...)");
  check_duplicates(root, src, "");
  validate_section(root, "", src);
}

std::string config_to_yaml(const YAML::Node& root) {
  std::ostringstream out;
  out << "# qwentune config: every key with its value; comments give the meaning and the default.\n";
  std::vector<std::string> open;  // the parts of the section being written
  for (const ConfigKey& k : config_keys()) {
    const std::vector<std::string> parts = section_parts(k.section);
    // Open the parts of this key's section the previous one did not (train -> train.cuda opens
    // only cuda:).
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    for (size_t i = common; i < parts.size(); ++i) out << std::string(2 * i, ' ') << parts[i] << ":\n";
    open = parts;
    const std::string indent(2 * parts.size(), ' ');
    // Const lookups: a missing key yields an invalid node (only IsDefined may be asked of it).
    const YAML::Node sec = find_section(root, parts, 0);
    const YAML::Node found = sec.IsDefined() && sec.IsMap() ? sec[k.name] : YAML::Node();
    const bool given = found.IsDefined() && !found.IsNull();
    std::string comment = k.help;
    if (k.type == T::Int || k.type == T::Float) {
      const std::string r = range_text(k);
      if (!r.empty()) comment += "; " + r;
    }
    if (k.choices) comment += "; " + std::string(k.choices);
    if (k.def) comment += std::string("; default: ") + (*k.def ? k.def : "\"\"");
    if (!given && !k.def) {
      out << indent << "# " << k.name << ":  # " << comment << "\n";
      continue;
    }
    const YAML::Node v = given ? found : YAML::Load(*k.def ? k.def : "\"\"");
    YAML::Emitter e;
    emit_value(e, v);
    std::string line = indent + k.name + ": " + e.c_str();
    if (line.size() < 40) line.resize(40, ' ');
    out << line << "  # " << comment << "\n";
  }
  return out.str();
}

}  // namespace qt
