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

  Tensor alloc(DType dtype, const Shape& shape) override;
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
  void zero(const Tensor& t) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;

  void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) override;
  void lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) override;
  void dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) override;
  void lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy, const Tensor& x,
                     const Tensor& t, const LoraArgs& lora) override;
  void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       bool accumulate_dx, bool accumulate_dw) override;
  void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override;
  void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) override;
  void add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& r,
                           const Tensor& w, double eps) override;
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& rstd, bool accumulate_dx) override;
  void swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                       const Tensor& up) override;

  void conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) override;
  void conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const SeqInfo& seqs) override;
  void gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a, const Tensor& a_log,
                         const Tensor& dt_bias) override;
  void gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log, const Tensor& ddt_bias,
                          const Tensor& dbeta, const Tensor& dg, const Tensor& b, const Tensor& a, const Tensor& a_log,
                          const Tensor& dt_bias) override;
  void gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                   const SeqInfo& seqs, const Tensor& state, GdnKeep keep) override;
  void gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o, const Tensor& qkv,
                    const Tensor& g, const Tensor& beta, const GdnDims& dims, const SeqInfo& seqs,
                    const Tensor& state, GdnKeep keep) override;
  void gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w,
                             double eps) override;
  void gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& z, const Tensor& w, const Tensor& rstd) override;

  void attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                         const Tensor& k_rstd, const Tensor& qg, const Tensor& kr, const Tensor& q_norm_w,
                         const Tensor& k_norm_w, const Tensor& positions, const AttnDims& dims, double eps) override;
  void attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w, const Tensor& dk_norm_w,
                          const Tensor& dq, const Tensor& dk, const Tensor& dgate, const Tensor& qg, const Tensor& kr,
                          const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& q_rstd, const Tensor& k_rstd,
                          const Tensor& positions, const AttnDims& dims) override;
  void attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttnDims& dims, const SeqInfo& seqs) override;
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const AttnDims& dims,
                          const SeqInfo& seqs) override;
  void attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) override;
  void attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                          const Tensor& gate) override;

  double linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss, const Tensor& hidden,
                              const Tensor& w, const Tensor& targets, double grad_scale, bool accumulate_dw) override;
  void linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                               const Tensor& token_loss, const Tensor& hidden, const Tensor& w, const Tensor& targets,
                               double grad_scale, bool accumulate_dw) override;

 private:
  Backend& inner_;
  std::unique_ptr<profile::DeviceTimer> owned_timer_;
  profile::Profiler prof_;
};

namespace profile {

// The profiler of a ProfiledBackend, or nullptr for any other backend (the model asks this once at
// construction; a null profiler makes its scopes free).
Profiler* attached_profiler(Backend& backend);
// The backend under any ProfiledBackend wrappers, for code that needs the concrete backend (e.g. a
// dynamic_cast<CudaBackend*> that picks the fused device optimizer).
Backend& unwrap_backend(Backend& backend);

}  // namespace profile
}  // namespace qt
