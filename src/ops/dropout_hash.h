// The dropout mask shared by every backend: element i of stream `stream` under `seed` is kept when
// a 64-bit hash of (seed, stream, i) lands at or above p * 2^32, so the CPU reference and the CUDA
// kernel drop the same elements and a recompute (activation checkpointing, the backward) redraws
// the mask instead of storing it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define QT_DROPOUT_HD __host__ __device__ __forceinline__
#else
#define QT_DROPOUT_HD inline
#endif

namespace qt {

QT_DROPOUT_HD uint64_t dropout_mix(uint64_t z) {  // splitmix64's finalizer
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

QT_DROPOUT_HD bool dropout_keep(uint64_t seed, uint32_t stream, uint64_t i, uint32_t threshold) {
  return static_cast<uint32_t>(dropout_mix(seed ^ (static_cast<uint64_t>(stream) << 40) ^ dropout_mix(i)) >> 32) >=
         threshold;
}

// p in [0, 1) as the 32-bit threshold dropout_keep compares with.
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(p * 4294967296.0); }

}  // namespace qt
