// ProfiledBackend: a Backend decorator that forwards every call to the wrapped backend and, while
// its profiler is inside a profiled step, times the call (profile/profiler.h). The model is
// written once against Backend, so the same model code is profiled on any backend.
//
// Cost: when no profiling is requested the model runs on the raw backend (no decorator at all);
// a decorator whose profiler is disabled adds one flag test per op call; see
// bench/bench_profiler_overhead.cpp.
#pragma once
#include <memory>
#include <string>

#include "ops/backend.h"
#include "profile/profiler.h"

namespace qt {

class ProfiledBackend final : public Backend {
 public:
  // Device timestamps: the wrapped backend's own DeviceTimer when it implements one (dynamic_cast),
  // else cudaEvents on the CUDA backend's stream (CUDA builds), else none (device time = CPU time).
  explicit ProfiledBackend(Backend& inner);
  // Explicit timer (nullptr: device time = CPU time).
  ProfiledBackend(Backend& inner, profile::DeviceTimer* timer);

  Backend& inner() { return inner_; }
  profile::Profiler& profiler() { return prof_; }
  const profile::Profiler& profiler() const { return prof_; }

  Device device() const override { return inner_.device(); }
  const char* name() const override { return inner_.name(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }

  // Every op of ops/backend_ops.def, timed and forwarded (profiled_backend.cpp).
#define QT_OP(ret, name, params, args, launches) ret name params override;
#include "ops/backend_ops.def"
  void* alloc_host(size_t bytes) override { return inner_.alloc_host(bytes); }
  void copy_to_host_async(void* dst, const Tensor& src) override { inner_.copy_to_host_async(dst, src); }
  void synchronize() override { inner_.synchronize(); }
  int64_t free_memory_bytes() const override { return inner_.free_memory_bytes(); }
  void set_loss_chunk_budget(int64_t bytes) override { inner_.set_loss_chunk_budget(bytes); }
  int64_t gdn_state_bytes(const GdnDims& dims, int64_t tokens, int num_seqs, GdnKeep keep) const override {
    return inner_.gdn_state_bytes(dims, tokens, num_seqs, keep);
  }
  bool gdn_prefers_prep(const GdnDims& dims) const override { return inner_.gdn_prefers_prep(dims); }
  int gdn_split_seqlen(const GdnDims& dims, int64_t tokens, int num_seqs) const override {
    return inner_.gdn_split_seqlen(dims, tokens, num_seqs);
  }
  void set_deterministic(bool on) override { inner_.set_deterministic(on); }
  std::unique_ptr<CapturedStep> make_captured_step() override { return inner_.make_captured_step(); }
  std::unique_ptr<FusedAdamW> make_fused_adamw(const std::vector<FusedAdamWTensor>& tensors) override {
    return inner_.make_fused_adamw(tensors);
  }
  uint64_t workspace_generation() const override { return inner_.workspace_generation(); }
  int64_t workspace_bytes() const override { return inner_.workspace_bytes(); }
  int64_t device_memory_used_bytes() const override { return inner_.device_memory_used_bytes(); }

 private:
  Backend& inner_;
  std::unique_ptr<profile::DeviceTimer> owned_timer_;
  profile::Profiler prof_;
};

namespace profile {

// The profiler of a ProfiledBackend, or nullptr for any other backend (the model asks this once at
// construction; a null profiler makes its scopes free).
Profiler* attached_profiler(Backend& backend);
// The backend under any ProfiledBackend wrappers, for code that needs the concrete backend (the
// profiler's CUDA event timer).
Backend& unwrap_backend(Backend& backend);

}  // namespace profile
}  // namespace qt
