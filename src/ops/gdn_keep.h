// What a Gated DeltaNet forward keeps for its backward (Backend::gdn_forward / gdn_backward with a
// state buffer; the CUDA kernels' qt::cuda::gdn_forward / gdn_backward).
#pragma once

namespace qt {

enum class GdnKeep : int {
  // Everything the backward reuses (the chunk plan, the gates' cumsum G, T = (I + A)^-1, the q / k L2
  // row scales, the chunk states h and D): the backward runs no forward stage. The largest.
  States,
  // Prep's results and the chunk plan: G, T and the row scales, what flash-linear-attention's
  // forward saves (docs/gdn_kernels.md section 6). The backward recomputes the chunk states (the forward scan), not
  // the plan or the triangular solve. About a seventh of States at dk = dv = 128.
  Prep,
};

}  // namespace qt
