// FP8 E4M3 (the OCP "FN" variant Hopper's tensor cores take: 4 exponent bits, bias 7, 3 mantissa
// bits, no infinities, 0x7F / 0xFF NaN, largest finite 448, subnormal step 2^-9) on the host:
// float -> e4m3 rounds to nearest even and saturates to +-448 (as CUDA's __NV_SATFINITE), NaN stays
// NaN. The CPU reference of the fp8 ops uses these, so its codes match the device's bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

namespace qt {

inline constexpr float kFp8E4M3Max = 448.0f;

namespace fp8_detail {
// Round to nearest even onto a format of `man` mantissa bits and exponent bias `bias`, saturating
// to max_code (the largest finite code: above it lie NaN for e4m3, infinities and NaN for e5m2).
inline uint8_t encode(float f, int man, int bias, float max, uint8_t max_code, uint8_t nan_code) {
  if (std::isnan(f)) return nan_code;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a > max) return sign | max_code;  // saturate (also +-inf)
  if (a < std::ldexp(1.0f, 1 - bias)) {  // subnormal: multiples of 2^(1 - bias - man)
    const int m = int(std::nearbyint(std::ldexp(a, bias - 1 + man)));  // round half to even (default mode)
    return sign | uint8_t(m);  // m == 2^man is the smallest normal
  }
  int e = 0;
  const float frac = std::frexp(a, &e);  // a = frac 2^e, frac in [0.5, 1)
  e -= 1;                                // a = (2 frac) 2^e, 2 frac in [1, 2)
  int m = int(std::nearbyint((2.0f * frac - 1.0f) * float(1 << man)));
  if (m == 1 << man) {
    m = 0;
    ++e;
  }
  const int code = ((e + bias) << man) | m;
  return sign | uint8_t(code > max_code ? max_code : code);
}
}  // namespace fp8_detail

inline float fp8_e4m3_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m), -9);
  return sign * std::ldexp(1.0f + float(m) / 8.0f, e - 7);
}

inline uint8_t float_to_fp8_e4m3(float f) { return fp8_detail::encode(f, 3, 7, kFp8E4M3Max, 0x7E, 0x7F); }

// FP8 E5M2 (IEEE-like: 5 exponent bits, bias 15, 2 mantissa bits, subnormal step 2^-16, largest
// finite 57344; 0x7C infinity, 0x7D-0x7F NaN), the format of the LM head's logit gradients (their
// range matters more than their precision). float -> e5m2 rounds to nearest even, saturates to
// +-57344 (infinities too, as __NV_SATFINITE) and keeps NaN as 0x7F.
inline constexpr float kFp8E5M2Max = 57344.0f;

inline float fp8_e5m2_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 2) & 31, m = b & 3;
  if (e == 31) return m == 0 ? sign * INFINITY : std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m), -16);
  return sign * std::ldexp(1.0f + float(m) / 4.0f, e - 15);
}

inline uint8_t float_to_fp8_e5m2(float f) { return fp8_detail::encode(f, 2, 15, kFp8E5M2Max, 0x7B, 0x7F); }

// Per-tensor current scaling: the factor that maps the tensor's amax onto 448 (1 for an all-zero
// tensor). Device and host compute it with the same IEEE float division.
inline float fp8_scale_for_amax(float amax) { return amax > 0.0f ? kFp8E4M3Max / amax : 1.0f; }

}  // namespace qt
