// bfloat16 storage type and conversions (round to nearest even; NaN stays NaN).
#pragma once
#include <cstdint>
#include <cstring>

namespace qt {

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// IEEE half <-> float, for f16 checkpoints.
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

}  // namespace qt
