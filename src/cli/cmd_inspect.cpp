// qwentune inspect MODEL_DIR [--json]: config, layer kinds, parameter count and bytes by group.
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/hf_checkpoint.h"
#include "io/mapped_file.h"

namespace qt::cli {
namespace {

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

struct GroupStats {
  int64_t tensors = 0, params = 0, bytes = 0;
  std::set<std::string> dtypes;
};

// What the tokenizer.json in the directory is, in a few words (absent, placeholder, real).
nlohmann::json tokenizer_summary(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "tokenizer.json";
  nlohmann::json s = {{"present", std::filesystem::exists(path)}};
  if (!s["present"]) return s;
  nlohmann::json t;
  try {
    t = nlohmann::json::parse(read_text_file(path.string()));
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL(path.string(), ": malformed JSON: ", e.what());
  }
  const auto& model = t.value("model", nlohmann::json::object());
  s["type"] = model.value("type", "?");
  s["vocab"] = model.contains("vocab") ? model["vocab"].size() : 0;
  s["merges"] = model.contains("merges") ? model["merges"].size() : 0;
  s["added_tokens"] = t.contains("added_tokens") ? t["added_tokens"].size() : 0;
  s["placeholder"] = s["merges"].get<size_t>() == 0;
  return s;
}

void run_inspect(const std::string& dir, bool as_json) {
  HfModelDir m = hf_load(dir);
  const ModelConfig& c = m.config;
  std::map<ParamGroup, GroupStats> groups;
  int64_t text_params = 0;
  std::set<std::string> text_names;
  for (const auto& p : m.params) {
    text_params += shape_numel(p.shape);
    text_names.insert(p.name);
  }
  for (const SafetensorsEntry* e : m.store.tensors()) {
    GroupStats& g = groups[param_group_of_name(e->name, c)];
    g.tensors++;
    g.params += shape_numel(e->shape);
    g.bytes += static_cast<int64_t>(e->nbytes);
    g.dtypes.insert(dtype_name(e->dtype));
  }
  std::string kinds;
  for (auto k : c.layer_types) kinds += k == LayerKind::FullAttention ? 'F' : 'L';
  const auto tok = tokenizer_summary(m.dir);
  int64_t total_bytes = 0, stored_params = 0;
  for (const auto& [g, s] : groups) {
    total_bytes += s.bytes;
    stored_params += s.params;
  }

  if (as_json) {
    nlohmann::ordered_json j;
    j["dir"] = m.dir;
    j["architecture"] = c.architecture;
    j["layout"] = c.nested ? "qwen3_5 (text_config)" : "qwen3_5_text (flat)";
    j["param_prefix"] = c.param_prefix;
    j["config"] = nlohmann::json::parse(config_to_json(c).dump());
    nlohmann::ordered_json lt = nlohmann::ordered_json::array();
    for (auto k : c.layer_types) lt.push_back(layer_kind_name(k));
    j["layer_types"] = lt;
    j["num_linear_layers"] = c.num_linear_layers();
    j["num_full_layers"] = c.num_full_layers();
    j["parameters"] = text_params;
    j["stored_parameters"] = stored_params;
    j["stored_bytes"] = total_bytes;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["lm_head_stored"] = m.lm_head_stored;
    j["files"] = m.store.num_files();
    nlohmann::ordered_json gj = nlohmann::ordered_json::object();
    for (const auto& [g, s] : groups)
      gj[param_group_name(g)] = {{"tensors", s.tensors}, {"params", s.params}, {"bytes", s.bytes},
                                 {"dtypes", std::vector<std::string>(s.dtypes.begin(), s.dtypes.end())}};
    j["groups"] = gj;
    j["tokenizer"] = tok;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model        %s\n", m.dir.c_str());
  std::printf("architecture %s, layout %s, names %s*\n", c.architecture.c_str(),
              c.nested ? "qwen3_5 (text_config)" : "qwen3_5_text (flat)", c.param_prefix.c_str());
  std::printf("shape        vocab %lld, hidden %lld, intermediate %lld, layers %lld (%lld GDN + %lld full attention)\n",
              (long long)c.vocab_size, (long long)c.hidden_size, (long long)c.intermediate_size,
              (long long)c.num_hidden_layers, (long long)c.num_linear_layers(), (long long)c.num_full_layers());
  std::printf("attention    %lld query heads, %lld kv heads, head_dim %lld, rope theta %g, rotary dims %lld of %lld\n",
              (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim, c.rope_theta,
              (long long)c.rotary_dim(), (long long)c.head_dim);
  std::printf("gated delta  %lld key heads x %lld, %lld value heads x %lld, conv width %lld, conv_dim %lld\n",
              (long long)c.linear_num_key_heads, (long long)c.linear_key_head_dim, (long long)c.linear_num_value_heads,
              (long long)c.linear_value_head_dim, (long long)c.linear_conv_kernel_dim, (long long)c.conv_dim());
  std::printf("layer kinds  %s  (L = gated deltanet, F = full attention)\n", kinds.c_str());
  std::printf("embeddings   %s%s\n", c.tie_word_embeddings ? "tied" : "untied",
              c.tie_word_embeddings ? (m.lm_head_stored ? " (lm_head.weight also stored)" : " (lm_head.weight not stored)") : "");
  std::printf("parameters   %s (text model)\n", with_commas(text_params).c_str());
  std::printf("stored       %s tensors in %zu file(s), %s parameters, %s\n", with_commas((int64_t)m.store.tensors().size()).c_str(),
              m.store.num_files(), with_commas(stored_params).c_str(), human_bytes(static_cast<double>(total_bytes)).c_str());
  std::printf("\n%-12s %8s %16s %12s  %s\n", "group", "tensors", "params", "bytes", "dtypes");
  for (const auto& [g, s] : groups) {
    std::string dts;
    for (const auto& d : s.dtypes) dts += (dts.empty() ? "" : ",") + d;
    std::printf("%-12s %8lld %16s %12s  %s\n", param_group_name(g), (long long)s.tensors, with_commas(s.params).c_str(),
                human_bytes(static_cast<double>(s.bytes)).c_str(), dts.c_str());
  }
  if (!tok["present"]) {
    std::printf("\ntokenizer    none (no tokenizer.json)\n");
  } else {
    std::printf("\ntokenizer    %s, %zu vocab entries, %zu merges, %zu added tokens%s\n",
                tok["type"].get<std::string>().c_str(), tok["vocab"].get<size_t>(), tok["merges"].get<size_t>(),
                tok["added_tokens"].get<size_t>(),
                tok["placeholder"].get<bool>() ? "  [byte-level placeholder: not the real Qwen3.5 vocabulary]" : "");
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print a model directory's config, layers, parameters and dtypes");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("model_dir", *dir, "Hugging Face model directory or hub id (Qwen/Qwen3.5-2B[@rev])")->required();
  cmd->add_flag("--json", *as_json, "machine-readable output");
  cmd->callback([=] { run_inspect(*dir, *as_json); });
}

}  // namespace qt::cli
