// Named model shapes: "tiny" for CPU tests and the demo, and the real Qwen3.5 text shapes
// (docs/model_spec.md section 7).
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace qt {

ModelConfig preset_config(const std::string& name);  // throws on an unknown name, listing the known ones
const std::vector<std::string>& preset_names();

}  // namespace qt
