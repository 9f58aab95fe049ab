#include "model/init.h"

#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/parallel.h"

namespace qt {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in (0, 1) from 53 random bits, never 0.
double uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void store(DType dtype, void* dst, int64_t i, float v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(dst)[i] = v; break;
    case DType::BF16: static_cast<bf16*>(dst)[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(dst)[i] = float_to_f16(v); break;
    default: QT_FAIL("init: unsupported dtype ", dtype_name(dtype));
  }
}

}  // namespace

void init_param(const ParamSpec& p, double std, uint64_t seed, DType dtype, void* dst) {
  const int64_t n = shape_numel(p.shape);
  const uint64_t key = splitmix64(seed ^ hash_name(p.name));
  switch (p.init) {
    case ParamInit::Zeros:
    case ParamInit::Ones: {
      const float v = p.init == ParamInit::Ones ? 1.0f : 0.0f;
      for (int64_t i = 0; i < n; ++i) store(dtype, dst, i, v);
      return;
    }
    case ParamInit::KaimingUniform: {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape.back()));
      for (int64_t i = 0; i < n; ++i)
        store(dtype, dst, i, static_cast<float>((2.0 * uniform01(splitmix64(key + static_cast<uint64_t>(i))) - 1.0) * bound));
      return;
    }
    case ParamInit::ALogUniform:
      for (int64_t i = 0; i < n; ++i) {
        const double u = uniform01(splitmix64(key + static_cast<uint64_t>(i)));
        store(dtype, dst, i, static_cast<float>(std::log(0.01 + u * (16.0 - 0.01))));
      }
      return;
    case ParamInit::Normal:
      // Box-Muller on pairs; pair k fills elements 2k and 2k+1.
      parallel_for(
          (n + 1) / 2,
          [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
              const uint64_t r = splitmix64(key + 2 * static_cast<uint64_t>(k));
              const double u1 = uniform01(r), u2 = uniform01(splitmix64(r ^ 0xd1b54a32d192ed03ull));
              const double rad = std * std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
              store(dtype, dst, 2 * k, static_cast<float>(rad * std::cos(th)));
              if (2 * k + 1 < n) store(dtype, dst, 2 * k + 1, static_cast<float>(rad * std::sin(th)));
            }
          },
          1 << 16);
      return;
  }
}

}  // namespace qt
