// TrainStep: one optimizer step over a step's packed rows (gradient accumulation), the same code
// for every caller (trainer, bench). On CUDA with the device optimizer the step has static shapes
// (rows padded to tokens_per_batch, cu_seqlens to a fixed sample bound) and needs no host
// synchronization until its end, so it is captured once as a CUDA graph and replayed with one
// launch per step; `graph = false` (--no-graph) runs the same enqueue eagerly. Elsewhere (CPU) it
// runs the plain forward/backward and the host optimizer.
//
// Loss normalization: rows are differentiated as plain loss sums; the optimizer multiplies the
// accumulated gradient by 1 / (trained tokens of the step) on the device (norm, clip, update),
// so a captured step needs no per-step constants beyond the staged learning rate and multiplier.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/qwen35.h"
#include "train/model_optimizer.h"

namespace qt {

struct StepResult {
  double loss_sum = 0;     // sum of per-token losses over trained targets
  int64_t trained = 0;     // trained targets of the step
  int64_t tokens = 0;      // real tokens of the step
  double grad_norm = 0;    // of the mean-loss gradient, before clipping
  double host_ms = 0;      // CPU time to stage and launch the step (before waiting for the GPU)
  bool replayed = false;   // ran as one CUDA-graph launch
};

// The static sample bound for rows of at most max_samples samples: one more for the padding
// sample, rounded up to 8.
inline int static_sample_bound(int max_samples) { return (max_samples + 1 + 7) / 8 * 8; }

// The activation checkpointing policy named by `policy` (auto|none|selective|full); auto asks
// choose_checkpointing for this backend's free memory. Logs the choice and its figures.
Checkpointing resolve_checkpointing(const std::string& policy, const ModelConfig& cfg, const Backend& backend,
                                    int64_t tokens_per_row, int max_seqs, int64_t trained_params = -1,
                                    int zero3_world = 0, Precision precision = Precision::BF16, bool fp8_head = true);

class TrainStep {
 public:
  // micro_batches: rows per step; max_seqs: bound on samples per row incl. the padding sample
  // (static_sample_bound); a step with a row needing more runs eagerly with exact shapes.
  // comm (optional): the job's ranks, for a sharded run: each rank steps its own rows and the
  // losses are summed over the ranks (the optimizer reduces the gradients).
  TrainStep(Qwen35Model& model, ModelOptimizer& opt, int64_t micro_batches, int max_seqs, bool graph,
            Communicator* comm = nullptr);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Zeroes the gradients, runs every row forward and backward, clips and applies AdamW at lr.
  // Throws naming the step (and the first bad tensor) on a non-finite loss or gradient norm.
  // global_trained: the step's trained targets over every rank's rows (-1: these rows' own, one rank).
  StepResult run(const std::vector<PackedRow>& rows, double lr, double max_grad_norm, int64_t step,
                 int64_t global_trained = -1);

  std::string mode() const;          // "cuda-graph", "eager (static shapes)" or "eager"
  // Two graphs at most: one for steps whose rows may have a sample the GDN kernels split
  // (Qwen35Model::staged_may_split), one for the rest; each captured on its kind's first replay.
  int64_t graph_kernels() const { return graph_kernels_; }  // kernel nodes of the last captured graph (0 before)
  int64_t graph_nodes() const { return graph_nodes_; }      // all nodes (kernels, copies, memsets)
  int64_t captures() const { return captures_; }
  // Device memory in use (GiB, whole device as cudaMemGetInfo sees it); 0 off the GPU.
  double device_memory_gib() const;
  // What comes on top of the model's memory plan: optimizer state, the backend's kernel
  // workspace (as grown so far), device memory in use. One line, for the log after a step.
  std::string memory_report() const;

 private:
  StepResult run_dynamic(const std::vector<PackedRow>& rows, double lr, double max_grad_norm, int64_t step,
                         int64_t global_trained);
  void enqueue_all(double max_grad_norm, bool may_split);

  Qwen35Model& model_;
  ModelOptimizer& opt_;
  Communicator* comm_ = nullptr;
  int64_t micro_;
  bool static_ = false, graph_ = false;
  // [may_split]: one eager static step of that kind ran (workspaces grown, GEMM plans cached)
  bool warmed_[2] = {false, false};
  int64_t captures_ = 0, graph_kernels_ = 0, graph_nodes_ = 0;
  double* host_results_ = nullptr;  // page-locked: loss sums [micro], then the gradient norm
  struct GraphState;
  std::unique_ptr<GraphState> gs_;
};

}  // namespace qt
