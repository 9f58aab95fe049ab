#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "model/hf_checkpoint.h"

namespace qt {

double LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

const std::vector<std::string>& lora_all_targets() {
  static const std::vector<std::string> all = {"q_proj",    "k_proj",    "v_proj",    "o_proj",
                                               "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
                                               "out_proj",  "gate_proj", "up_proj",   "down_proj"};
  return all;
}

const char* projection_name(ParamRole role) {
  switch (role) {
    case ParamRole::AttnQProj: return "q_proj";
    case ParamRole::AttnKProj: return "k_proj";
    case ParamRole::AttnVProj: return "v_proj";
    case ParamRole::AttnOProj: return "o_proj";
    case ParamRole::GdnInProjQkv: return "in_proj_qkv";
    case ParamRole::GdnInProjZ: return "in_proj_z";
    case ParamRole::GdnInProjA: return "in_proj_a";
    case ParamRole::GdnInProjB: return "in_proj_b";
    case ParamRole::GdnOutProj: return "out_proj";
    case ParamRole::MlpGate: return "gate_proj";
    case ParamRole::MlpUp: return "up_proj";
    case ParamRole::MlpDown: return "down_proj";
    default: return nullptr;
  }
}

bool lora_targets(const LoraSpec& lora, ParamRole role) {
  const char* n = projection_name(role);
  if (!n) return false;
  for (const auto& t : lora.targets)
    if (t == n) return true;
  return false;
}

void lora_validate(const LoraSpec& lora) {
  QT_CHECK(lora.r > 0, "lora.r is ", lora.r, ", must be positive");
  QT_CHECK(lora.alpha > 0 && std::isfinite(lora.alpha), "lora.alpha is ", lora.alpha, ", must be a positive number");
  QT_CHECK(lora.dropout >= 0 && lora.dropout < 1, "lora.dropout is ", lora.dropout, ", must be in [0, 1)");
  QT_CHECK(!lora.targets.empty(), "lora.targets is empty: name at least one projection");
  for (const auto& t : lora.targets) {
    bool known = false;
    for (const auto& k : lora_all_targets()) known |= k == t;
    if (!known) {
      std::string list;
      for (const auto& k : lora_all_targets()) list += (list.empty() ? "" : ", ") + k;
      QT_FAIL("lora.targets: '", t, "' is not a linear projection of Qwen3.5 (known: ", list, ")");
    }
  }
}

std::string lora_tensor_name(const std::string& base, bool b) {
  const std::string suffix = ".weight";
  QT_CHECK(base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0,
           "lora_tensor_name: '", base, "' is not a weight name");
  return base.substr(0, base.size() - suffix.size()) + (b ? ".lora_B.weight" : ".lora_A.weight");
}

std::vector<ParamSpec> lora_param_table(const ModelConfig& cfg, const LoraSpec& lora) {
  std::vector<ParamSpec> out;
  for (const ParamSpec& p : param_table(cfg)) {
    if (!lora_targets(lora, p.role)) continue;
    const int64_t rows = p.shape[0], cols = p.shape[1];
    out.push_back({lora_tensor_name(p.name, false), {lora.r, cols}, p.role, p.group, ParamInit::KaimingUniform, p.layer});
    out.push_back({lora_tensor_name(p.name, true), {rows, lora.r}, p.role, p.group, ParamInit::Zeros, p.layer});
  }
  return out;
}

namespace {
// The module a weight belongs to: its name without the last component (".weight").
std::string module_of(const std::string& name) { return name.substr(0, name.rfind('.')); }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::vector<size_t> lora_saved_modules(const ModelConfig& cfg, const LoraSpec& lora) {
  const std::vector<ParamSpec> table = param_table(cfg);
  std::vector<size_t> out;
  for (const std::string& m : lora.modules_to_save) {
    QT_CHECK(!m.empty(), "lora.modules_to_save: empty name");
    if (m == "lm_head" && cfg.tie_word_embeddings)
      QT_FAIL("lora.modules_to_save: lm_head is tied to embed_tokens in this model; name embed_tokens");
    bool found = false;
    for (size_t i = 0; i < table.size(); ++i) {
      const std::string mod = module_of(table[i].name);
      // Every enclosing module of the weight: a match above its own module names a container
      // (a whole layer or mixer), which PEFT would train whole, adapted projections included.
      for (std::string anc = module_of(mod); anc.find('.') != std::string::npos; anc = module_of(anc))
        QT_CHECK(!ends_with(anc, m), "lora.modules_to_save: '", m, "' names ", anc, ", a module that holds ",
                 table[i].name, " (and LoRA targets); name leaf modules (norms, embed_tokens, lm_head, conv1d)");
      if (!ends_with(mod, m) || !ends_with(table[i].name, ".weight")) continue;
      QT_CHECK(!lora_targets(lora, table[i].role), "lora.modules_to_save: '", m, "' names ", mod,
               ", which is also a LoRA target (lora.targets)");
      if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
      found = true;
    }
    QT_CHECK(found, "lora.modules_to_save: '", m, "' matches no module of the model (e.g. embed_tokens, lm_head, norm, "
             "input_layernorm, conv1d)");
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ParamSpec> lora_trainable_table(const ModelConfig& cfg, const LoraSpec& lora) {
  std::vector<ParamSpec> t = lora_param_table(cfg, lora);
  const std::vector<ParamSpec> base = param_table(cfg);
  for (size_t i : lora_saved_modules(cfg, lora)) t.push_back(base[i]);
  return t;
}

std::string peft_key(const std::string& name) { return "base_model.model." + name; }

std::string peft_key_to_adapter_name(const std::string& key) {
  const std::string prefix = "base_model.model.";
  if (key.compare(0, prefix.size(), prefix) != 0) return "";
  std::string rest = key.substr(prefix.size());
  // PEFT also writes keys with the adapter name ("...lora_A.default.weight") in some versions.
  for (const char* ab : {".lora_A.default.weight", ".lora_B.default.weight"}) {
    const std::string s(ab);
    if (rest.size() > s.size() && rest.compare(rest.size() - s.size(), s.size(), s) == 0)
      rest = rest.substr(0, rest.size() - s.size()) + (s[6] == 'A' ? ".lora_A.weight" : ".lora_B.weight");
  }
  return rest;
}

}  // namespace qt

namespace qt {

void lora_merge_into(std::vector<float>& w, const std::vector<float>& a, const std::vector<float>& b, int64_t out,
                     int64_t in, int64_t r, double scale) {
  QT_CHECK(static_cast<int64_t>(w.size()) == out * in && static_cast<int64_t>(a.size()) == r * in &&
               static_cast<int64_t>(b.size()) == out * r,
           "lora_merge_into: sizes ", w.size(), ", ", a.size(), ", ", b.size(), " do not fit [", out, ", ", in, "] r ", r);
  parallel_for(out, [&](int64_t o0, int64_t o1) {
    std::vector<double> row(static_cast<size_t>(in));
    for (int64_t o = o0; o < o1; ++o) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t k = 0; k < r; ++k) {
        const double bk = b[size_t(o * r + k)];
        const float* ak = a.data() + k * in;
        for (int64_t i = 0; i < in; ++i) row[size_t(i)] += bk * ak[i];
      }
      for (int64_t i = 0; i < in; ++i) w[size_t(o * in + i)] += static_cast<float>(scale * row[size_t(i)]);
    }
  });
}

LoraSpec lora_spec_from_peft(const PeftAdapter& adapter) {
  LoraSpec s;
  s.r = adapter.config.r;
  s.alpha = adapter.config.alpha;
  s.rslora = adapter.config.rslora;
  s.dropout = adapter.config.dropout;
  s.modules_to_save = adapter.config.modules_to_save;
  const std::string cfg = adapter.dir + "/adapter_config.json";
  for (const auto& t : adapter.config.target_modules) {
    if (t == "all-linear") {
      s.targets = lora_all_targets();
      break;
    }
    bool known = false;
    for (const auto& k : lora_all_targets()) known |= k == t;
    QT_CHECK(known, cfg, ": target_modules has '", t, "', which is not a linear projection of Qwen3.5's text model");
    s.targets.push_back(t);
  }
  lora_validate(s);
  return s;
}

PeftLoraConfig lora_peft_config(const LoraSpec& lora, const std::string& base_model) {
  PeftLoraConfig c;
  c.r = lora.r;
  c.alpha = lora.alpha;
  c.rslora = lora.rslora;
  c.dropout = lora.dropout;
  c.target_modules = lora.targets;
  c.modules_to_save = lora.modules_to_save;
  c.base_model = base_model;
  return c;
}

std::vector<std::vector<float>> lora_read_adapter(const PeftAdapter& adapter, const std::vector<ParamSpec>& table) {
  std::vector<std::vector<float>> out;
  std::set<std::string> wanted;
  for (const ParamSpec& p : table) {
    wanted.insert(p.name);
    const SafetensorsEntry* e = adapter.weights->find(peft_key(p.name));
    if (!e) {
      const std::string alt = peft_key(p.name.substr(0, p.name.size() - 7) + ".default.weight");
      e = adapter.weights->find(alt);
    }
    QT_CHECK(e != nullptr, adapter.weights->path(), ": missing adapter tensor '", peft_key(p.name), "'");
    QT_CHECK(e->shape == p.shape, e->file, ": tensor '", e->name, "' has shape ", shape_str(e->shape), ", expected ",
             shape_str(p.shape), " (r = ", p.name.find("lora_A") != std::string::npos ? p.shape[0] : p.shape[1], ")");
    out.push_back(tensor_to_f32(e->view()));
    for (float v : out.back())
      QT_CHECK(std::isfinite(v), e->file, ": tensor '", e->name, "' holds NaN or inf");
  }
  for (const SafetensorsEntry& e : adapter.weights->tensors()) {
    const std::string name = peft_key_to_adapter_name(e.name);
    QT_CHECK(!name.empty() && wanted.count(name), adapter.weights->path(), ": tensor '", e.name,
             "' is not an adapter of this model and target_modules (wrong base model, or modules_to_save, which is not "
             "supported)");
  }
  return out;
}

int64_t lora_merge_dirs(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir,
                        bool force) {
  const HfModelDir base = hf_load(base_dir);
  const PeftAdapter adapter = peft_adapter_open(adapter_dir);
  const LoraSpec lora = lora_spec_from_peft(adapter);
  const std::vector<ParamSpec> table = lora_trainable_table(base.config, lora);
  const size_t n_adapter = lora_param_table(base.config, lora).size();
  const std::vector<std::vector<float>> weights = lora_read_adapter(adapter, table);
  std::map<std::string, size_t> saved;  // base weight name -> index of its trained copy in table
  for (size_t i = n_adapter; i < table.size(); ++i) saved[table[i].name] = i;
  std::map<std::string, size_t> adapted;  // base weight name -> index of its A in table
  for (size_t i = 0; i < n_adapter; i += 2) {
    const std::string& n = table[i].name;
    adapted[n.substr(0, n.size() - std::string(".lora_A.weight").size()) + ".weight"] = i;
  }
  // Merged weights are computed in f32 and stored in the base tensor's dtype; the rest is copied.
  std::vector<std::vector<float>> merged;
  merged.reserve(adapted.size());
  std::vector<TensorWriteSpec> specs;
  for (const SafetensorsEntry* e : base.store.tensors()) {
    auto it = adapted.find(e->name);
    if (auto sv = saved.find(e->name); sv != saved.end()) {  // modules_to_save: the trained weight
      const std::vector<float>* w = &weights[sv->second];
      const DType t = e->dtype;
      specs.push_back({e->name, t, e->shape, [w, t](void* dst, size_t) {
                         tensor_from_f32(Tensor(dst, t, {static_cast<int64_t>(w->size())}), w->data());
                       }});
      continue;
    }
    if (it == adapted.end()) {
      specs.push_back(passthrough_spec(*e));
      continue;
    }
    const size_t a = it->second;
    merged.push_back(tensor_to_f32(e->view()));
    lora_merge_into(merged.back(), weights[a], weights[a + 1], table[a + 1].shape[0], table[a].shape[1], lora.r,
                    lora.scale());
    const std::vector<float>* w = &merged.back();
    const DType t = e->dtype;
    specs.push_back({e->name, t, e->shape, [w, t](void* dst, size_t) {
                       tensor_from_f32(Tensor(dst, t, {static_cast<int64_t>(w->size())}), w->data());
                     }});
  }
  HfSaveOptions opts;
  opts.copy_files_from = base.dir;  // resolved (a hub id names a snapshot)
  opts.force = force;
  hf_save(out_dir, base.config.raw, specs, opts);
  return static_cast<int64_t>(adapted.size() + saved.size());
}

}  // namespace qt
