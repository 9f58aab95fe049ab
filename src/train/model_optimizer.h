// AdamW over every parameter of a Qwen35Model, wherever the model lives: on the host for the CPU
// backend (fp32 arrays, train/optimizer.h), on the device for CUDA (fp32 master, m, v in device
// memory; bf16 working weights written by the fused kernel). Both clip by the global gradient norm
// and stop on non-finite gradients naming the first bad tensor.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/qwen35.h"
#include "train/optimizer.h"

namespace qt {

class ModelOptimizer {
 public:
  static std::unique_ptr<ModelOptimizer> create(Qwen35Model& model, const AdamWConfig& cfg);
  virtual ~ModelOptimizer() = default;

  // Clips to max_grad_norm (<= 0: no clipping) and applies one AdamW step at learning rate lr.
  // Returns the gradient norm before clipping. Throws naming the step and tensor on NaN/inf.
  virtual double step(double lr, double max_grad_norm, int64_t step) = 0;

  // Host copies of (master, m, v) of parameter i, and restoring them (for checkpoints). set_state
  // also writes the working weights from the master.
  virtual void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) = 0;
  virtual void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                         const std::vector<float>& v) = 0;
};

}  // namespace qt
