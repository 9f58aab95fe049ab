#include "io/peft_adapter.h"

#include <filesystem>

#include "core/error.h"
#include "io/mapped_file.h"

namespace qt {
namespace fs = std::filesystem;

nlohmann::ordered_json peft_adapter_config_json(const PeftLoraConfig& c) {
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", c.base_model},
          {"revision", nullptr},
          {"r", c.r},
          {"lora_alpha", c.alpha},
          {"lora_dropout", c.dropout},
          {"target_modules", c.target_modules},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", c.rslora},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"modules_to_save", c.modules_to_save.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(c.modules_to_save)},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::ordered_json::object()},
          {"alpha_pattern", nlohmann::ordered_json::object()},
          {"library_name", "qwentune"}};
}

PeftAdapter peft_adapter_open(const std::string& dir) {
  PeftAdapter a;
  a.dir = dir;
  QT_CHECK(fs::is_directory(dir), dir, ": adapter directory does not exist");
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  QT_CHECK(fs::is_regular_file(cfg_path), cfg_path, ": missing (a PEFT adapter directory needs adapter_config.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL(cfg_path, ": malformed JSON: ", e.what());
  }
  QT_CHECK(j.is_object(), cfg_path, ": expected a JSON object");
  const std::string type = j.value("peft_type", std::string());
  QT_CHECK(type == "LORA", cfg_path, ": peft_type is '", type, "', only LORA adapters are supported");
  try {
    a.config.r = j.at("r").get<int64_t>();
    a.config.alpha = j.value("lora_alpha", double(a.config.r));
    a.config.dropout = j.value("lora_dropout", 0.0);
    a.config.rslora = j.value("use_rslora", false);
    a.config.base_model = j.value("base_model_name_or_path", std::string());
    const auto& t = j.at("target_modules");
    if (t.is_string()) a.config.target_modules.push_back(t.get<std::string>());
    else a.config.target_modules = t.get<std::vector<std::string>>();
    if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
      a.config.modules_to_save = j["modules_to_save"].get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    QT_FAIL(cfg_path, ": ", e.what());
  }
  QT_CHECK(a.config.r > 0, cfg_path, ": r is ", a.config.r, ", must be positive");
  QT_CHECK(!j.value("use_dora", false), cfg_path, ": use_dora is true; DoRA adapters are not supported");
  QT_CHECK(j.value("bias", std::string("none")) == "none", cfg_path, ": bias is '", j.value("bias", std::string()),
           "'; only bias \"none\" is supported (Qwen3.5's projections have no bias)");
  QT_CHECK(!j.value("fan_in_fan_out", false), cfg_path, ": fan_in_fan_out is true; not used by Qwen3.5's nn.Linear layers");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    QT_CHECK(!j.contains(k) || j[k].is_null() || j[k].empty(), cfg_path, ": ", k,
             " is set; per-module ranks and alphas are not supported");
  for (const char* k : {"layers_to_transform"})
    QT_CHECK(!j.contains(k) || j[k].is_null() || j[k].empty(), cfg_path, ": ", k, " is set; not supported");
  const std::string w = (fs::path(dir) / "adapter_model.safetensors").string();
  QT_CHECK(fs::is_regular_file(w), w, ": missing (adapters saved as adapter_model.bin are not read; save with safetensors)");
  a.weights = SafetensorsFile::open(w);
  return a;
}

}  // namespace qt
