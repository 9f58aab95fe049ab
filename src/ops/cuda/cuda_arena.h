// DeviceArena: the CUDA backend's tensor memory. alloc() bump-allocates zero-filled, 256-byte
// aligned regions from blocks of block_bytes (one cudaMalloc per block); a request above a quarter
// block gets a cudaMalloc of its own, since placed in a block it would strand the block's tail (up
// to a third of the GDN states' memory at 4B). reset() hands every region back at once (blocks are
// kept for reuse, the dedicated allocations freed). Page-locked host buffers live here too.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace qt::cuda {

class DeviceArena {
 public:
  explicit DeviceArena(size_t block_bytes) : block_bytes_(block_bytes) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  static constexpr size_t kAlign = 256;
  // A zero-filled region of at least `bytes` (rounded up to kAlign); the memset is enqueued on `stream`.
  void* alloc(size_t bytes, cudaStream_t stream);
  void* alloc_host(size_t bytes);  // cudaHostAlloc, zero-filled; freed with the arena
  void reset();                    // the caller has synchronized the stream
  size_t reserved_bytes() const;   // blocks plus dedicated allocations

 private:
  struct Block {
    char* base;
    size_t size;
  };
  std::vector<Block> blocks_;
  std::vector<void*> host_blocks_;
  std::vector<void*> dedicated_;  // requests larger than a quarter block, one cudaMalloc each
  size_t dedicated_bytes_ = 0;
  size_t block_index_ = 0, block_used_ = 0;
  size_t block_bytes_ = 0;
};

}  // namespace qt::cuda
