// StepGraph: a sequence of stream work captured once as a CUDA graph and replayed by one launch.
// Capture runs in relaxed mode, so the host-side CUDA calls the captured code makes between its
// launches (cudaFuncSetAttribute, cuBLASLt's cached plans) are allowed; anything that would
// synchronize or allocate must have happened before (run the same code once eagerly first).
#pragma once
#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

namespace qt::cuda {

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Captures what enqueue() puts on stream and instantiates it (replacing any previous graph).
  // If enqueue throws, the capture is ended and discarded before the exception propagates.
  void capture(cudaStream_t stream, const std::function<void()>& enqueue);
  void launch(cudaStream_t stream);
  bool ready() const { return exec_ != nullptr; }
  void reset();

  // Node counts of the captured graph, by kind.
  int64_t kernel_nodes() const { return kernels_; }
  int64_t copy_nodes() const { return copies_; }   // memcpy + memset
  int64_t total_nodes() const { return total_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  int64_t kernels_ = 0, copies_ = 0, total_ = 0;
};

}  // namespace qt::cuda
