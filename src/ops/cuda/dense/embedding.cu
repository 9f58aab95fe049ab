// CudaBackend kernels: embedding gather (forward) and its deterministic backward (a stable radix sort
// of (id, token) pairs, then one fp32 sum per distinct id in token order).
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dense/dense_common.cuh"
#include "ops/cuda/ops_launch.h"

namespace qt::cuda {

namespace {

// One thread per VEC columns of one token row. Out-of-range ids produce a zero row (the entry
// cannot check device ids without a sync; the CPU reference rejects them).
template <int VEC>
__global__ void embedding_fwd_kernel(bf16* out, const bf16* table, const int32_t* ids, int64_t T, int64_t hvec,
                                     int64_t V) {
  const int64_t total = T * hvec;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hvec, c = i % hvec;
    const int32_t id = ids[t];
    float v[VEC];
    if (id >= 0 && id < V) {
      load_vec<VEC>(v, table + int64_t(id) * hvec * VEC, c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = 0.0f;
    }
    store_vec<VEC>(out + t * hvec * VEC, c, v);
  }
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// Block i handles sorted position i when it starts a run of equal ids: sums the run's dout rows in
// token order (fp32) and adds the sum once into dtable.
__global__ void embedding_bwd_kernel(void* dtable, bool dtable_f32, const bf16* dout, const uint32_t* keys,
                                     const int32_t* tokens, int64_t T, int64_t H, int64_t V) {
  const int64_t i = blockIdx.x;
  const uint32_t key = keys[i];
  if ((i > 0 && keys[i - 1] == key) || key >= static_cast<uint64_t>(V)) return;
  int64_t end = i + 1;
  while (end < T && keys[end] == key) ++end;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = i; j < end; ++j) acc += to_f(dout[int64_t(tokens[j]) * H + c]);
    dev::acc_store(dtable, dtable_f32, int64_t(key) * H + c, acc);
  }
}

size_t sort_temp_bytes(int64_t T) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<int>(T)));
  return bytes;
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

}  // namespace

void launch_embedding_forward(void* out, const void* table, const int32_t* ids, int64_t T, int64_t H, int64_t V,
                              cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  if (H % 8 == 0 && aligned16(out) && aligned16(table)) {
    embedding_fwd_kernel<8><<<grid_for(T * H / 8, kThreads), kThreads, 0, s>>>(
        static_cast<bf16*>(out), static_cast<const bf16*>(table), ids, T, H / 8, V);
  } else {
    embedding_fwd_kernel<1><<<grid_for(T * H, kThreads), kThreads, 0, s>>>(
        static_cast<bf16*>(out), static_cast<const bf16*>(table), ids, T, H, V);
  }
  QT_LAUNCH_CHECK("embedding_forward");
}

size_t embedding_backward_workspace_bytes(int64_t T) {
  if (T <= 0) return 0;
  return 3 * align256(sizeof(int32_t) * size_t(T)) + align256(sort_temp_bytes(T));
}

void launch_embedding_backward(void* dtable, bool dtable_f32, const void* dout, const int32_t* ids, int64_t T,
                               int64_t H, int64_t V, void* ws, size_t ws_bytes, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  char* p = static_cast<char*>(ws);
  const size_t n4 = align256(sizeof(int32_t) * size_t(T));
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(p);
  int32_t* tok_in = reinterpret_cast<int32_t*>(p + n4);
  int32_t* tok_out = reinterpret_cast<int32_t*>(p + 2 * n4);
  void* temp = p + 3 * n4;
  size_t temp_bytes = ws_bytes - 3 * n4;
  iota_kernel<<<grid_for(T, kThreads), kThreads, 0, s>>>(tok_in, T);
  QT_LAUNCH_CHECK("embedding_backward (iota)");
  int end_bit = 1;
  while (end_bit < 32 && (int64_t(1) << end_bit) < V) ++end_bit;
  // Stable LSD radix sort: equal ids keep token order, so every run is summed in token order.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, reinterpret_cast<const uint32_t*>(ids), keys_out,
                                             tok_in, tok_out, static_cast<int>(T), 0, end_bit, s));
  embedding_bwd_kernel<<<static_cast<unsigned>(T), 128, 0, s>>>(dtable, dtable_f32, static_cast<const bf16*>(dout),
                                                                keys_out, tok_out, T, H, V);
  QT_LAUNCH_CHECK("embedding_backward");
}

}  // namespace qt::cuda
