// AdamW over every parameter of a Qwen35Model, wherever the model lives: on the host for the CPU
// backend (fp32 arrays, ops/cpu/adamw.h), on the device for CUDA (fp32 master, m, v in device
// memory; bf16 working weights written by the fused kernel). Both clip by the global gradient norm
// and stop on non-finite gradients naming the first bad tensor.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/qwen35.h"
#include "ops/cpu/adamw.h"

namespace qt {

class ModelOptimizer {
 public:
  // comm (several ranks, a ZeRO-3 model): the backend's fused AdamW over this rank's shards and the
  // replicated tensors, their gradients all-reduced and the norm summed over the ranks on the
  // backend's stream (capturable with NCCL); nullptr where the backend has none (the caller falls
  // back to ShardedOptimizer).
  static std::unique_ptr<ModelOptimizer> create(Qwen35Model& model, const AdamWConfig& cfg);
  static std::unique_ptr<ModelOptimizer> create_sharded_device(Qwen35Model& model, const AdamWConfig& cfg,
                                                               Communicator& comm);
  virtual ~ModelOptimizer() = default;

  // Clips to max_grad_norm (<= 0: no clipping) and applies one AdamW step at learning rate lr.
  // Returns the gradient norm before clipping. Throws naming the step and tensor on NaN/inf.
  virtual double step(double lr, double max_grad_norm, int64_t step) = 0;

  // Bytes of optimizer state (fp32 master, m, v), wherever it lives.
  virtual int64_t state_bytes() const = 0;

  // Sync-free step for captured (CUDA-graph) training; only the device optimizer has it.
  // set_step writes lr, the step number and the gradient multiplier (the update uses grad_mult *
  // gradient, e.g. 1 / trained tokens) to host staging; it is host-only, and the previous step
  // must have finished. enqueue_step enqueues norm, clipping and the update, which read the
  // staged values when they run, and a copy of the gradient norm to host_norm (memory from
  // Backend::alloc_host). A non-finite norm skips the update on the device.
  virtual bool supports_enqueue() const { return false; }
  virtual void set_step(double lr, int64_t step, double grad_mult);
  virtual void enqueue_step(double max_grad_norm, double* host_norm);

  // Host copies of (master, m, v) of parameter i, and restoring them (for checkpoints). set_state
  // also writes the working weights from the master.
  virtual void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) = 0;
  virtual void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                         const std::vector<float>& v) = 0;

  // Checkpoints that every rank writes its own part of (the sharded optimizers: nobody gathers m
  // and v). shards_state: this optimizer splits state over ranks. state_rows(i): the rows
  // [begin, end) of parameter i's dim 0 (of `rows`) this rank keeps; sharded false: the whole
  // tensor, the same on every rank (rank 0 saves it). get_local_state: host copies of those rows,
  // no collective. get_master: the whole fp32 master (a collective where sharded: the weights).
  struct StateRows {
    int64_t begin = 0, end = 0, rows = 0;
    bool sharded = false;
  };
  virtual bool shards_state() const { return false; }
  virtual StateRows state_rows(size_t i) const;
  virtual void get_local_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) {
    get_state(i, master, m, v);
  }
  virtual std::vector<float> get_master(size_t i) {
    std::vector<float> master, m, v;
    get_state(i, master, m, v);
    return master;
  }
  // A resume of a sharded optimizer: the whole master (the working weights come from it) and only
  // this rank's rows of m and v (state_rows(i)), so no rank reads or holds the others' moments.
  virtual void set_local_state(size_t i, const std::vector<float>& master, const std::vector<float>& m_rows,
                               const std::vector<float>& v_rows);
};

// Stops with the step and the first parameter whose gradient has a NaN/inf (host scan; rare path).
[[noreturn]] void fail_non_finite_gradients(Qwen35Model& model, int64_t step, double norm);

}  // namespace qt
