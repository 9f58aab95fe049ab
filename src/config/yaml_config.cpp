#include "config/yaml_config.h"

#include <filesystem>

namespace qt {
namespace fs = std::filesystem;

YAML::Node yaml_load_file(const std::string& path) {
  QT_CHECK(fs::exists(path), path, ": config file does not exist");
  QT_CHECK(fs::is_regular_file(path), path, ": config file is not a regular file");
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    QT_FAIL(path, ": malformed YAML: ", e.what());
  }
}

void yaml_apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides) {
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    QT_CHECK(eq != std::string::npos && eq > 0, "--set '", o, "': expected key=value (e.g. train.lr=1e-4)");
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    std::vector<std::string> parts;
    for (size_t b = 0; b <= key.size();) {
      size_t e = key.find('.', b);
      if (e == std::string::npos) e = key.size();
      QT_CHECK(e > b, "--set '", o, "': empty key part");
      parts.push_back(key.substr(b, e - b));
      b = e + 1;
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      QT_FAIL("--set '", o, "': value is not valid YAML: ", e.what());
    }
    // yaml-cpp nodes are handles: walk by reassigning a handle to each child.
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node child = chain.back()[parts[i]];
      if (!child.IsDefined() || child.IsNull()) {
        chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
        child = chain.back()[parts[i]];
      }
      QT_CHECK(child.IsMap(), "--set '", o, "': '", parts[i], "' is not a section");
      chain.push_back(child);
    }
    chain.back()[parts.back()] = parsed;
  }
}

}  // namespace qt
