// Helpers every dense kernel file (dense/*.cu) shares: the bf16 load / store names, the block
// size of the grid-stride kernels, and the two constants the RMSNorm and attn_prep kernels share.
// Each file's kernels and helpers live in an anonymous namespace, as this header's do.
#pragma once
#include <cstdint>

#include "ops/cuda/ops_device.cuh"

namespace qt::cuda {
namespace {

using dev::bf16;
using dev::load_vec;
using dev::store_vec;
using dev::to_bf;
using dev::to_f;

constexpr int kThreads = 256;  // block size of the grid-stride kernels

// RMSNorm (rmsnorm*.cu) and attn_prep (attention_prep.cu): warps of a forward block, and the most
// blocks (partial dw rows) a backward uses.
constexpr int kFwdWarps = 8;
constexpr int64_t kMaxPartialBlocks = 1024;

}  // namespace
}  // namespace qt::cuda
