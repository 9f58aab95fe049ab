// splitmix64: a small, portable generator, so that seeded plans (packing shuffles, synthetic rows)
// are identical across standard libraries (std::shuffle and the std distributions are
// implementation-defined).
#pragma once
#include <cstdint>

namespace qt {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (Lemire's multiply; the bias is below 2^-64 * n, irrelevant here).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [lo, hi] (modulo; the bias is irrelevant at these ranges).
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1)); }
};

}  // namespace qt
