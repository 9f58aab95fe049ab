// Host-callable launchers of the CUDA attention kernels (attention/) and the wgmma conventions
// check, shared with CudaBackend (the Gated DeltaNet's are in gdn/gdn.h). Plain pointers and dims;
// every pointer is device memory; bf16 tensors are __nv_bfloat16 passed as void* so this header
// needs no CUDA headers beyond cudaStream_t. Launchers validate nothing (CudaBackend's entry points
// do) and never allocate: scratch comes from the caller's workspace (query its size first).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace qt::cuda {

// ---- causal varlen attention with GQA (semantics of Backend::attention_forward/backward) ----
struct AttnArgs {
  const int32_t* cu_seqlens;  // [num_seqs + 1] on the device
  int num_seqs;
  int max_seqlen;
  int total_tokens;
  int num_q_heads, num_kv_heads, head_dim;  // head_dim 64, 128 or 256
  float scale;                              // 1/sqrt(head_dim)
  // Backward: dQ summed over the key tiles in a fixed order by its own kernel (bitwise
  // reproducible, ~1.4x the backward's MMA work) instead of fp32 atomics. At head dim 256 on the
  // wgmma kernels (mma_sync off) dQ always comes from its own kernel, which is faster there.
  bool deterministic = false;
  // Head dim 256 on the mma.sync kernels instead of the warp-specialized wgmma ones (the forward
  // and the backward), for tests and A/B benchmarks; also the path taken when the driver has no
  // cuTensorMapEncodeTiled. Head dims 64 and 128 always run on mma.sync.
  bool mma_sync = false;
};
size_t attention_workspace_bytes(const AttnArgs& a);
// o, q [T, Hq, D] bf16; k, v [T, Hkv, D] bf16; lse f32 [Hq, T].
void attention_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                       void* workspace, cudaStream_t stream);
// dq [T, Hq, D], dk, dv [T, Hkv, D] bf16 (overwritten).
void attention_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                        const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream);

// ---- Hopper wgmma conventions check (wgmma_check.cu, wgmma.cuh) ----
// c [64, n] f32 = a [64, k] (bf16, row-major) times b, given as [n, k] (b_k_major) or [k, n], bf16
// row-major; n 64, 128 or 256, k a multiple of 64 up to 256; one warpgroup, b in 128-byte-swizzled shared
// memory, a there too (K-major, or M-major: wgmma's transposed A) or in registers. Pins the
// descriptor / fragment layouts of wgmma.cuh (tests/test_cuda_wgmma.cpp).
enum WgmmaA : int { kWgmmaASmemKMajor = 0, kWgmmaASmemMMajor = 1, kWgmmaARegisters = 2 };
void wgmma_gemm_check(float* c, const void* a, const void* b, int n, int k, bool b_k_major, WgmmaA a_form,
                      cudaStream_t stream);

}  // namespace qt::cuda
