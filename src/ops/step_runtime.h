// What a training step asks of a backend beyond its ops, so that train/ never needs to know which
// backend it runs on: capturing a whole step once and replaying it (CUDA graphs), and an AdamW that
// runs where the weights live without a host round trip per tensor. A backend without them
// returns nullptr from Backend::make_captured_step / make_fused_adamw, and the step runs eagerly
// with the host optimizer (ops/cpu/adamw.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/adamw_config.h"

namespace qt {

// A sequence of the backend's stream work captured once and replayed by one launch. Anything that
// synchronizes or allocates must have run once eagerly before the capture.
class CapturedStep {
 public:
  virtual ~CapturedStep() = default;
  // Captures what enqueue() puts on the backend's stream (replacing any earlier capture). If enqueue
  // throws, the capture is discarded before the exception propagates.
  virtual void capture(const std::function<void()>& enqueue) = 0;
  virtual void launch() = 0;
  virtual bool ready() const = 0;
  // Node counts of the captured work, by kind.
  virtual int64_t kernel_nodes() const = 0;
  virtual int64_t copy_nodes() const = 0;  // copies and memsets
  virtual int64_t total_nodes() const = 0;
};

// One parameter of a fused AdamW: its gradient (bf16 or f32) and working weights (bf16, written from
// the master after each update; may be empty: master only).
struct FusedAdamWTensor {
  Tensor grad;
  Tensor param;
  bool decay = true;  // weight decay applies (matrices) or not (norms, A_log, dt_bias)
  bool in_norm = true;  // counted in the gradient norm (a sharded job counts a replicated tensor on one rank)
};

// AdamW over a fixed table of tensors on the backend's stream; bit-exact with ops/cpu/adamw.h's
// adamw_update on the clipped gradient. It owns each tensor's fp32 master, m and v (zeros at first;
// the caller writes the master) in the backend's memory. The global norm and clip factor stay on
// the device.
class FusedAdamW {
 public:
  virtual ~FusedAdamW() = default;
  virtual const Tensor& master(size_t i) const = 0;
  virtual const Tensor& m(size_t i) const = 0;
  virtual const Tensor& v(size_t i) const = 0;
  // Eager form: the gradient norm before clipping (waits for it), then the update clipped to
  // max_norm (<= 0: no clipping) by the factor computed on the device.
  virtual double grad_norm(double max_norm) = 0;
  virtual void update(double lr, const AdamWConfig& cfg, int64_t step) = 0;
  // Capturable form. set_step stages lr, the step and the gradient multiplier (every gradient is
  // taken as grad_mult * g) on the host; the previous step must have finished. enqueue enqueues
  // norm, clip and update reading the staged values when they run, and a copy of the norm to
  // host_norm (memory from Backend::alloc_host). A non-finite norm skips the update.
  virtual void set_step(double lr, const AdamWConfig& cfg, int64_t step, double grad_mult) = 0;
  virtual void enqueue(double max_norm, double* host_norm) = 0;
  // Sharded jobs: sums the local sum of squares (an f64 [1] tensor in the backend's memory) over
  // the ranks, on the backend's stream, before the norm and clip factor are taken from it.
  virtual void set_norm_reducer(std::function<void(const Tensor& sumsq)> reducer) = 0;
};

}  // namespace qt
