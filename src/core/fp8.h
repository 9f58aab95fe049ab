// FP8 E4M3 (the OCP "FN" variant Hopper's tensor cores take: 4 exponent bits, bias 7, 3 mantissa
// bits, no infinities, 0x7F / 0xFF NaN, largest finite 448, subnormal step 2^-9) on the host:
// float -> e4m3 rounds to nearest even and saturates to +-448 (as CUDA's __NV_SATFINITE), NaN stays
// NaN. The CPU reference of the fp8 ops uses these, so its codes match the device's bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

namespace qt {

inline constexpr float kFp8E4M3Max = 448.0f;

inline float fp8_e4m3_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m), -9);
  return sign * std::ldexp(1.0f + float(m) / 8.0f, e - 7);
}

inline uint8_t float_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a > kFp8E4M3Max) return sign | 0x7E;  // saturate (also +-inf)
  if (a < std::ldexp(1.0f, -6)) {            // subnormal: multiples of 2^-9
    const int m = int(std::nearbyint(std::ldexp(a, 9)));  // round half to even (default mode)
    return sign | uint8_t(m);                             // m == 8 is the smallest normal, 0x08
  }
  int e = 0;
  const float frac = std::frexp(a, &e);  // a = frac 2^e, frac in [0.5, 1)
  e -= 1;                                // a = (2 frac) 2^e, 2 frac in [1, 2)
  int m = int(std::nearbyint((2.0f * frac - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int field = e + 7;
  if (field > 15 || (field == 15 && m == 7)) return sign | 0x7E;
  return sign | uint8_t(field << 3) | uint8_t(m);
}

// Per-tensor current scaling: the factor that maps the tensor's amax onto 448 (1 for an all-zero
// tensor). Device and host compute it with the same IEEE float division.
inline float fp8_scale_for_amax(float amax) { return amax > 0.0f ? kFp8E4M3Max / amax : 1.0f; }

}  // namespace qt
