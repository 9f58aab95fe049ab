// Every key of a `train` / `prepare` YAML config, listed once: its section, type, default, range
// or choices and a one-line meaning. config_validate checks a parsed config against the table
// (unknown keys, duplicated keys, types, ranges, NaN / inf), naming the file and line of the
// offending key, or the --set override that set it; config_to_yaml prints a config with every key
// (`train --print-config`, output_dir/config.yaml). The code that reads a key (data/data_job.cpp,
// train/trainer.cpp) takes the default from here too, through config_default.
#pragma once
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/yaml_config.h"

namespace qt {

enum class ConfigType { Str, StrList, Path, PathList, Bool, Int, Float };

struct ConfigKey {
  const char* section;   // "" = top level, else a dotted section path: "data", "train", "train.cuda", "lora"
  const char* name;
  ConfigType type;
  const char* def;       // the default as YAML text; nullptr = no default (required or optional, see help)
  const char* help;
  double lo = 0, hi = 0;  // numeric range (Int, Float) when lo < hi
  bool lo_open = false, hi_open = false;
  const char* choices = nullptr;  // Str: "a|b|c"
};

const std::vector<ConfigKey>& config_keys();
const ConfigKey* config_key(const std::string& section, const std::string& name);

// Where a config came from, for error messages: the file, and the overrides applied on top.
struct ConfigSource {
  std::string file;
  std::vector<std::string> overrides;  // "section.key=value" as given to --set
  // "FILE:LINE" for a key from the file, "--set 'train.lr=x'" for an overridden one.
  std::string where(const std::string& dotted_key, const YAML::Node& node) const;
};

// Checks a parsed config (overrides applied): unknown keys (with the known ones), duplicated keys
// (both lines), wrong types, values out of range or not among the choices, NaN and inf.
void config_validate(const YAML::Node& root, const ConfigSource& src);

// The config as YAML with every key of the table: its value (or the default), the default and
// the meaning as a comment. Keys without value or default are written as comments.
std::string config_to_yaml(const YAML::Node& root);

// The default of section.name parsed as T (the table is the one place defaults live).
template <typename T>
T config_default(const char* section, const char* name) {
  const ConfigKey* k = config_key(section, name);
  if (!k || !k->def || !*k->def) return T{};
  return YAML::Load(k->def).as<T>();
}

// section.key as T, or the table's default when absent.
template <typename T>
T config_get(const YAML::Node& section, const char* section_name, const char* key, const std::string& file) {
  return yaml_get<T>(section, section_name, key, config_default<T>(section_name, key), file);
}

}  // namespace qt
