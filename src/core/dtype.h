// Element types. The first six are the engine's compute/storage types; the rest exist so that
// checkpoint tensors the engine does not train (vision tower, MTP head) round-trip untouched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace qt {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, F64, I8, I16, U16, U32, U64, Bool, F8E4M3, F8E5M2 };
constexpr int kDTypeCount = 15;

size_t dtype_size(DType t);
// Name as safetensors spells it ("F32", "BF16", ...).
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(const std::string& name);
// Lower-case user-facing names ("f32", "bf16", "f16").
std::optional<DType> dtype_from_user_name(const std::string& name);

}  // namespace qt
