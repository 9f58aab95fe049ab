// YAML config files: loading with clear errors, `--set section.key=value` overrides, typed reads.
// The keys themselves (types, defaults, ranges, comments) are listed once in config/config_schema.h.
#pragma once
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/error.h"

namespace qt {

// section.key of a parsed config as T, or def when absent; a type error names file, key and line.
// Configs checked by config_validate (config_schema.h) never reach the error.
template <typename T>
T yaml_get(const YAML::Node& section, const char* section_name, const char* key, const T& def,
           const std::string& file) {
  if (!section || !section[key] || section[key].IsNull()) return def;
  try {
    return section[key].as<T>();
  } catch (const YAML::Exception& e) {
    QT_FAIL(file, ": ", section_name, ".", key, " (line ", section[key].Mark().line + 1, "): ", e.what());
  }
}
// Loads a YAML file with a clear error on malformed input.
YAML::Node yaml_load_file(const std::string& path);
// Applies "a.b.c=value" overrides to a YAML tree (the value parsed as YAML: numbers, bools, lists).
void yaml_apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides);

}  // namespace qt
