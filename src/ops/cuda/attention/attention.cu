// Varlen causal flash attention with GQA for the gated full-attention layers (docs/model_spec.md 3.3;
// docs/attention_kernels.md): the entry points of kernels.h, the workspace layout and the dispatch
// to this folder's kernel files. bf16 in and out, fp32 accumulation.
//   forward.cu      head dim 256: the forward on wgmma, warp-specialized (a TMA producer warpgroup),
//                   persistent
//   bwd_dq.cu       head dim 256: dQ on wgmma, warp-specialized, with the backward's preprocess
//   bwd_dkv.cu      head dim 256: dK / dV on wgmma, warp-specialized
//   mma_sync.cu     every head dim on mma.sync: the forward, dK / dV (with atomic dQ), the
//                   deterministic dQ
//   bwd_prepost.cu  the mma.sync backward's preprocess and atomic dQ's conversion; the split dK / dV sum
//   work_list.cu    the (sample, tile) work list every kernel's grid walks, heaviest tiles first
// Head dim 256 (Qwen3.5's) runs the wgmma kernels unless AttnArgs::mma_sync asks for the mma.sync
// ones, or the driver cannot encode the TMA loads' tensor maps (no cuTensorMapEncodeTiled); 64 and
// 128 always run on mma.sync. The backward at 256: dQ (which writes Dsum and lse2), then dK / dV and,
// with split CTAs, their sum; on mma.sync: the preprocess, dK / dV (and sum), then dQ by its own
// kernel (AttnArgs::deterministic) or the atomic accumulator's conversion.
#include <cuda.h>  // CUtensorMap (the encoder comes from the runtime's driver entry point)
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "ops/cuda/attention/attention_internal.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace qt::cuda {
namespace attn {
namespace {

// Workspace layout (bytes, 256-aligned pieces): tile table | dsum [Hq*T] f32 | lse2 [Hq*T] f32 |
// dq_acc [T*Hq*D] f32 | (splits > 1) splits x (dK, dV) f32 [T*Hkv*D] slices. The forward uses only
// the table.
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// CTAs per (kv head, key tile) in the backward. One CTA runs all group query heads over its key
// tile, so with few kv heads the grid is about one wave and the long samples' first key tiles
// (each group x n query tiles) set the time. Halving the group per CTA halves that critical path;
// the price is the f32 dK / dV slices and their sum. Only when the grid would otherwise fill at most
// two waves (2B: 2 kv heads x 128 key tiles on 132 SMs), never for 27B-like head counts.
int bwd_splits(const AttnArgs& a) {
  const int sms = sm_count();
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t ctas = static_cast<int64_t>(a.num_kv_heads) * ((a.total_tokens + 63) / 64);
  return group >= 4 && group % 2 == 0 && ctas <= 2 * sms ? 2 : 1;
}
size_t ws_dkv_bytes(const AttnArgs& a) {
  const int s = bwd_splits(a);
  return s == 1 ? 0
                : align256(sizeof(float) * 2 * s * static_cast<size_t>(a.total_tokens) *
                           static_cast<size_t>(a.num_kv_heads) * static_cast<size_t>(a.head_dim));
}
size_t ws_rows_bytes(const AttnArgs& a) {
  return align256(sizeof(float) * static_cast<size_t>(a.num_q_heads) * static_cast<size_t>(a.total_tokens));
}
size_t ws_dq_bytes(const AttnArgs& a) {
  return align256(sizeof(float) * static_cast<size_t>(a.total_tokens) * static_cast<size_t>(a.num_q_heads) *
                  static_cast<size_t>(a.head_dim));
}
size_t ws_table_bytes(const AttnArgs& a) { return align256(sizeof(int2) * static_cast<size_t>(tile_slots(a, 64) + 1)); }

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), or null when
// the driver lacks it: head dim 256 then runs on the mma.sync kernels.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();  // a failed lookup must not surface at the next launch check
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// TMA map of a row-major bf16 [rows, cols] tensor read in boxes of 64 columns x box_rows rows into
// 128-byte-swizzle panels (wgmma's layout); reads past `rows` return zeros.
CUtensorMap panel_map(const void* base, int64_t rows, int64_t cols, int box_rows, const char* name) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                          strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QT_CHECK(r == CUDA_SUCCESS, "attention forward: cuTensorMapEncodeTiled failed for ", name, " (", rows, " x ", cols,
           " bf16 at ", base, "; error ", static_cast<int>(r), ")");
  return m;
}

// The backward TMA kernels' maps at head dim 256: q and dO in boxes of q_rows rows, k and v of
// kWgBN.
BwdMaps bwd_maps(const void* q, const void* d_o, const void* k, const void* v, const AttnArgs& a, int q_rows) {
  const int64_t T = a.total_tokens, qcols = int64_t(a.num_q_heads) * kWgD, kcols = int64_t(a.num_kv_heads) * kWgD;
  return BwdMaps{panel_map(q, T, qcols, q_rows, "q"), panel_map(d_o, T, qcols, q_rows, "d_o"),
                 panel_map(k, T, kcols, kWgBN, "k"), panel_map(v, T, kcols, kWgBN, "v")};
}

// Head dim 256 on the warp-specialized wgmma kernels: unless the caller asks for mma.sync, or the
// driver cannot encode their TMA maps.
bool use_wgmma(const AttnArgs& a) { return !a.mma_sync && tensor_map_encoder() != nullptr; }

template <int D>
void launch_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                    void* workspace, cudaStream_t stream) {
  using Tr = FwdTraits<D>;
  static_assert(Tr::kBlockM >= 64, "the work-list workspace is sized for tiles of at least 64 rows");
  const int2* tiles = build_tile_table(workspace, a, Tr::kBlockM, false, stream);
  FwdParams p{static_cast<bf16*>(o), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
              static_cast<const bf16*>(v), a.cu_seqlens, tiles, a.total_tokens, a.num_q_heads, a.num_kv_heads,
              a.scale};
  if constexpr (D == kWgD) {
    if (use_wgmma(a)) {
      static_assert(Tr::kBlockM == kWgBM, "the wgmma forward uses the same work list tile");
      const int64_t T = a.total_tokens;
      const FwdMaps maps{panel_map(q, T, int64_t(a.num_q_heads) * D, kWgBM, "q"),
                         panel_map(k, T, int64_t(a.num_kv_heads) * D, kWgBN, "k"),
                         panel_map(v, T, int64_t(a.num_kv_heads) * D, kWgBN, "v")};
      launch_fwd_wgmma(p, maps, tile_slots(a, kWgBM), stream);
      return;
    }
  }
  launch_fwd_mma_sync<D>(dim3(a.num_q_heads, tile_slots(a, Tr::kBlockM)), p, stream);
}

template <int D>
void launch_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                     const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream) {
  using Tr = BwdTraits<D>;
  char* ws = static_cast<char*>(workspace) + ws_table_bytes(a);
  float* dsum = reinterpret_cast<float*>(ws);
  float* lse2 = reinterpret_cast<float*>(ws + ws_rows_bytes(a));
  float* dq_acc = reinterpret_cast<float*>(ws + 2 * ws_rows_bytes(a));
  float* dkv_part = reinterpret_cast<float*>(ws + 2 * ws_rows_bytes(a) + ws_dq_bytes(a));
  const int splits = bwd_splits(a);
  const int64_t rows = static_cast<int64_t>(a.total_tokens) * a.num_q_heads;
  if (rows == 0) return;
  // At head dim 256 the wgmma kernels serve both modes: their dQ has no atomics and is faster than
  // the atomic mma.sync path, so `deterministic` only matters on the mma.sync kernels.
  bool wgmma = false;
  if constexpr (D == kWgD) wgmma = use_wgmma(a);
  const bool dq_kernel = a.deterministic || wgmma;
  // dK / dV over the backward's work list (key tiles), then the split CTAs' sum.
  auto run_dkv = [&] {
    static_assert(Tr::kBlockN >= 64, "the work-list workspace is sized for tiles of at least 64 rows");
    const int2* tiles = build_tile_table(workspace, a, Tr::kBlockN, true, stream);
    BwdParams p{static_cast<bf16*>(dk), static_cast<bf16*>(dv), dkv_part, dq_acc, lse2, dsum,
                static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                static_cast<const bf16*>(v), a.cu_seqlens, tiles, a.total_tokens, a.num_q_heads, a.num_kv_heads,
                splits, a.scale};
    const dim3 grid(a.num_kv_heads * splits, tile_slots(a, Tr::kBlockN));
    if (wgmma) {
      static_assert(Tr::kBlockN == 64, "the wgmma dK / dV kernel uses the same key tiles");
      launch_bwd_dkv_wgmma(grid, p, bwd_maps(q, d_o, k, v, a, 64), stream);
    } else {
      launch_bwd_dkv_mma_sync<D>(grid, !a.deterministic, p, stream);
    }
    if (splits > 1)
      launch_bwd_dkv_sum(static_cast<bf16*>(dk), static_cast<bf16*>(dv), dkv_part,
                         static_cast<int64_t>(a.total_tokens) * a.num_kv_heads * D / 4, splits, stream);
  };
  // dQ by its own kernel over the forward's work list (query tiles of DqTraits::kBlockM); the
  // tables share the workspace, each built once the kernel before has read its own (same stream).
  auto run_dq = [&] {
    using Dq = DqTraits<D>;
    static_assert(Dq::kBlockM == kWgBM, "both dQ kernels use the forward's work list");
    const int2* qtiles = build_tile_table(workspace, a, Dq::kBlockM, false, stream);
    const DqParams dp{static_cast<bf16*>(dq), lse2, dsum, lse, static_cast<const bf16*>(o),
                      static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                      static_cast<const bf16*>(v), a.cu_seqlens, qtiles, a.total_tokens, a.num_q_heads,
                      a.num_kv_heads, a.scale};
    const dim3 dq_grid(a.num_q_heads, tile_slots(a, Dq::kBlockM));
    if (wgmma)
      launch_bwd_dq_wgmma(dq_grid, dp, bwd_maps(q, d_o, k, v, a, kWgBM), stream);
    else
      launch_bwd_dq_mma_sync<D>(dq_grid, dp, stream);
  };
  if (wgmma) {  // the wgmma dQ kernel writes Dsum and lse2 for the dK / dV kernel: no preprocess
    run_dq();
    run_dkv();
    return;
  }
  launch_bwd_pre<D>(dsum, lse2, dq_kernel ? nullptr : dq_acc, static_cast<const bf16*>(d_o),
                    static_cast<const bf16*>(o), lse, a.total_tokens, a.num_q_heads, stream);
  run_dkv();
  if (dq_kernel) {
    run_dq();
    return;
  }
  launch_bwd_post(static_cast<bf16*>(dq), dq_acc, rows * D / 8, a.scale, stream);
}

[[noreturn]] void bad_head_dim(int d) { QT_FAIL("attention: head_dim ", d, " is not supported (64, 128 or 256)"); }

}  // namespace
}  // namespace attn

size_t attention_workspace_bytes(const AttnArgs& a) {
  return attn::ws_table_bytes(a) + 2 * attn::ws_rows_bytes(a) + attn::ws_dq_bytes(a) + attn::ws_dkv_bytes(a);
}

void attention_forward(void* o, float* lse, const void* q, const void* k, const void* v, const AttnArgs& a,
                       void* workspace, cudaStream_t stream) {
  if (a.total_tokens == 0 || a.num_seqs == 0 || a.max_seqlen == 0) return;
  switch (a.head_dim) {
    case 64: return attn::launch_forward<64>(o, lse, q, k, v, a, workspace, stream);
    case 128: return attn::launch_forward<128>(o, lse, q, k, v, a, workspace, stream);
    case 256: return attn::launch_forward<256>(o, lse, q, k, v, a, workspace, stream);
    default: attn::bad_head_dim(a.head_dim);
  }
}

void attention_backward(void* dq, void* dk, void* dv, const void* d_o, const void* q, const void* k, const void* v,
                        const void* o, const float* lse, const AttnArgs& a, void* workspace, cudaStream_t stream) {
  if (a.total_tokens == 0 || a.num_seqs == 0 || a.max_seqlen == 0) return;
  switch (a.head_dim) {
    case 64: return attn::launch_backward<64>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    case 128: return attn::launch_backward<128>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    case 256: return attn::launch_backward<256>(dq, dk, dv, d_o, q, k, v, o, lse, a, workspace, stream);
    default: attn::bad_head_dim(a.head_dim);
  }
}

}  // namespace qt::cuda
