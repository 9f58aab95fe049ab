// What `qwentune profile`, its tests and bench/bench_profiler_overhead run: synthetic chat-like
// packed rows and a training step with the trainer's arithmetic (forward + backward, global-norm clipping,
// AdamW on fp32 host master weights, parameters uploaded again).
#pragma once
#include <cstdint>
#include <string>
#include <memory>
#include <vector>

#include "model/qwen35.h"
#include "train/model_optimizer.h"

namespace qt {

// `count` packed rows of exactly tokens_per_row tokens, seeded. Samples mimic chat data: a length
// mix of short (32-256 tokens, 55%), medium (256-1024, 30%) and long (1024-4096, 15%) turns, cut
// to the row; the first 20-60% of each sample (the prompt) is not trained; ids uniform in
// [0, vocab).
std::vector<PackedRow> synthetic_chat_rows(int64_t vocab, int64_t tokens_per_row, int64_t count, uint64_t seed);

// Fills every parameter with transformers' initialization (model/init.h).
void init_model_random(Qwen35Model& model, uint64_t seed);

// One optimizer step per packed row, as the trainer does it (ModelOptimizer: host AdamW on the
// CPU backend, the fused device AdamW on CUDA).
class TrainStepRunner {
 public:
  explicit TrainStepRunner(Qwen35Model& model, AdamWConfig adamw = {}, double max_grad_norm = 1.0);
  // Returns the mean loss of the row. With a profiler attached, the optimizer runs in an
  // "optimizer" scope.
  double step(const PackedRow& row);

 private:
  Qwen35Model& model_;
  AdamWConfig adamw_;
  double max_grad_norm_;
  int64_t step_ = 0;
  std::unique_ptr<ModelOptimizer> optimizer_;
};

}  // namespace qt
