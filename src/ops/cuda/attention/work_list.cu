// The attention kernels' work list (docs/attention_kernels.md section 2): attn_tile_table_kernel
// lists every (sample, tile) of the packed row, heaviest first across all samples (a forward query
// tile i costs i + 1 key tiles; a backward key tile j of an n-tile sample costs n - j query tiles).
// Each kernel's grid is (heads, slots) with slots the bound T / tile + num_seqs (tile_slots), so one
// launch serves every sample, the grid depends only on T and the sample bound (static for CUDA
// graphs: padded zero-length samples add no work), and long samples' heavy tiles start first
// instead of trailing.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ops_device.cuh"

namespace qt::cuda::attn {
namespace {

// table[slot] = (sample, tile) for every tile of every sample, sorted by cost, heaviest first
// (counting sort over a clamped cost key; order within a key is arbitrary and harmless, since
// every tile's result is independent of when it runs); slots past the tile count get sample -1.
// One block: each thread owns a run of samples.
constexpr int kTableThreads = 1024, kCostKeys = 2048;
__global__ void __launch_bounds__(kTableThreads) attn_tile_table_kernel(int2* table, const int32_t* cu, int num_seqs,
                                                                        int tile, int slots, int backward) {
  __shared__ int count[kCostKeys];
  __shared__ int scan[kTableThreads];
  const int tid = threadIdx.x;
  for (int k = tid; k < kCostKeys; k += kTableThreads) count[k] = 0;
  __syncthreads();
  const int per = (num_seqs + kTableThreads - 1) / kTableThreads;
  const int s0 = min(num_seqs, tid * per), s1 = min(num_seqs, s0 + per);
  auto key_of = [&](int i, int n) { return min(kCostKeys - 1, backward ? n - i : i + 1); };
  for (int s = s0; s < s1; ++s) {
    const int n = (cu[s + 1] - cu[s] + tile - 1) / tile;
    for (int i = 0; i < n; ++i) atomicAdd(&count[key_of(i, n)], 1);
  }
  __syncthreads();
  // Exclusive offsets in descending key order: thread t sums keys [hi_t - 1 .. lo_t] (its band).
  constexpr int kPer = kCostKeys / kTableThreads;
  int band = 0;
  for (int j = 0; j < kPer; ++j) band += count[kCostKeys - 1 - (tid * kPer + j)];
  scan[tid] = band;
  dev::block_inclusive_scan(scan);
  const int total = scan[kTableThreads - 1];
  int run = scan[tid] - band;
  __syncthreads();  // every thread has read its band's counts: turn them into offsets
  for (int j = 0; j < kPer; ++j) {
    const int k = kCostKeys - 1 - (tid * kPer + j);
    const int c = count[k];
    count[k] = run;
    run += c;
  }
  __syncthreads();
  for (int s = s0; s < s1; ++s) {
    const int n = (cu[s + 1] - cu[s] + tile - 1) / tile;
    for (int i = 0; i < n; ++i) table[atomicAdd(&count[key_of(i, n)], 1)] = make_int2(s, i);
  }
  for (int i = total + tid; i < slots; i += kTableThreads) table[i] = make_int2(-1, 0);
}

}  // namespace

const int2* build_tile_table(void* workspace, const AttnArgs& a, int tile, bool backward, cudaStream_t stream) {
  int2* table = static_cast<int2*>(workspace);
  attn_tile_table_kernel<<<1, kTableThreads, 0, stream>>>(table, a.cu_seqlens, a.num_seqs, tile, tile_slots(a, tile),
                                                          backward ? 1 : 0);
  QT_LAUNCH_CHECK("attn_tile_table_kernel");
  return table;
}

}  // namespace qt::cuda::attn
