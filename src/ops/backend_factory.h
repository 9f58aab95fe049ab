// Backend by name: "cpu" (fp32 reference) or "cuda" (bf16 fused kernels; only in CUDA builds).
#pragma once
#include <memory>
#include <string>

#include "ops/backend.h"

namespace qt {

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});
bool cuda_backend_built();
// "cuda" when the build has it and a device is present, else "cpu".
std::string default_backend_name();

}  // namespace qt
