#include "ops/cuda/cuda_arena.h"

#include <algorithm>
#include <cstring>

#include "ops/cuda/cuda_check.h"

namespace qt::cuda {

DeviceArena::~DeviceArena() {
  for (auto& b : blocks_) cudaFree(b.base);
  for (void* p : dedicated_) cudaFree(p);
  for (void* h : host_blocks_) cudaFreeHost(h);
}

void* DeviceArena::alloc(size_t bytes, cudaStream_t stream) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded > block_bytes_ / 4) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, rounded));
    dedicated_.push_back(p);
    dedicated_bytes_ += rounded;
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    return p;
  }
  while (block_index_ < blocks_.size() && block_used_ + rounded > blocks_[block_index_].size) {
    ++block_index_;
    block_used_ = 0;
  }
  if (block_index_ == blocks_.size()) {
    Block b{nullptr, std::max(block_bytes_, rounded)};
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, b.size));
    b.base = static_cast<char*>(p);
    blocks_.push_back(b);
    block_used_ = 0;
  }
  char* p = blocks_[block_index_].base + block_used_;
  block_used_ += rounded;
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));  // zero-filled, like the CPU backend
  return p;
}

void* DeviceArena::alloc_host(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
  std::memset(p, 0, std::max<size_t>(bytes, 1));
  host_blocks_.push_back(p);
  return p;
}

void DeviceArena::reset() {
  for (void* p : dedicated_) cudaFree(p);
  dedicated_.clear();
  dedicated_bytes_ = 0;
  block_index_ = 0;
  block_used_ = 0;
}

size_t DeviceArena::reserved_bytes() const {
  size_t n = dedicated_bytes_;
  for (const auto& b : blocks_) n += b.size;
  return n;
}

}  // namespace qt::cuda
