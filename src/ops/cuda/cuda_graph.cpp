#include "ops/cuda/cuda_graph.h"

#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace qt::cuda {

StepGraph::~StepGraph() { reset(); }

void StepGraph::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
  kernels_ = copies_ = total_ = 0;
}

void StepGraph::capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  reset();
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();  // clear the (non-sticky) error an invalidated capture leaves behind
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
  QT_CHECK(graph_ != nullptr, "CUDA graph capture produced no graph");
  CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  // Upload the executable graph to the device now rather than inside the first replay.
  CUDA_CHECK(cudaGraphUpload(exec_, stream));
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph_, nodes.data(), &n));
  total_ = static_cast<int64_t>(n);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) ++kernels_;
    else if (type == cudaGraphNodeTypeMemcpy || type == cudaGraphNodeTypeMemset) ++copies_;
  }
}

void StepGraph::launch(cudaStream_t stream) {
  QT_CHECK(exec_ != nullptr, "StepGraph::launch: nothing captured");
  CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

}  // namespace qt::cuda
