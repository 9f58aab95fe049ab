#include "profile/profiled_backend.h"

#ifdef QT_HAVE_CUDA
#include "profile/cuda_event_timer.h"
#endif

namespace qt {
namespace {

// Times one forwarded call while the profiler is active; otherwise a single flag test.
// `launches`: the op enqueues device work (a kernel); memory management and host transfers do not
// count as launches.
class OpRange {
 public:
  OpRange(profile::Profiler& p, const char* name, bool launches) {
    if (p.active()) {
      p_ = &p;
      event_ = p.op_begin(name, launches);
    }
  }
  ~OpRange() {
    if (p_ != nullptr) p_->op_end(event_);
  }
  OpRange(const OpRange&) = delete;
  OpRange& operator=(const OpRange&) = delete;

 private:
  profile::Profiler* p_ = nullptr;
  int event_ = -1;
};

std::unique_ptr<profile::DeviceTimer> event_timer_for(Backend& be) {
  if (dynamic_cast<profile::DeviceTimer*>(&be) != nullptr) return nullptr;
#ifdef QT_HAVE_CUDA
  return profile::make_cuda_event_timer(be);
#else
  return nullptr;
#endif
}

}  // namespace

ProfiledBackend::ProfiledBackend(Backend& inner)
    : inner_(inner),
      owned_timer_(event_timer_for(inner)),
      prof_(owned_timer_ ? owned_timer_.get() : dynamic_cast<profile::DeviceTimer*>(&inner), inner.name()) {}

ProfiledBackend::ProfiledBackend(Backend& inner, profile::DeviceTimer* timer)
    : inner_(inner), prof_(timer, inner.name()) {}

Tensor ProfiledBackend::alloc(DType dtype, const Shape& shape) {
  OpRange r(prof_, "alloc", false);
  return inner_.alloc(dtype, shape);
}

void ProfiledBackend::zero(const Tensor& t) {
  OpRange r(prof_, "zero", false);
  inner_.zero(t);
}

void ProfiledBackend::copy(const Tensor& dst, const Tensor& src) {
  OpRange r(prof_, "copy", false);
  inner_.copy(dst, src);
}

void ProfiledBackend::copy_from_host(const Tensor& dst, const void* src) {
  OpRange r(prof_, "copy_from_host", false);
  inner_.copy_from_host(dst, src);
}

void ProfiledBackend::copy_to_host(void* dst, const Tensor& src) {
  OpRange r(prof_, "copy_to_host", false);
  inner_.copy_to_host(dst, src);
}

void ProfiledBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  OpRange r(prof_, "add", true);
  inner_.add(out, a, b);
}

void ProfiledBackend::linear_forward(const Tensor& y, const Tensor& x, const Tensor& w) {
  OpRange r(prof_, "linear_forward", true);
  inner_.linear_forward(y, x, w);
}

void ProfiledBackend::lora_forward(const Tensor& y, const Tensor& t, const Tensor& x, const LoraArgs& lora) {
  OpRange r(prof_, "lora_forward", true);
  inner_.lora_forward(y, t, x, lora);
}

void ProfiledBackend::dropout(const Tensor& out, const Tensor& x, const DropoutArgs& d, bool accumulate) {
  OpRange r(prof_, "dropout", true);
  inner_.dropout(out, x, d, accumulate);
}

void ProfiledBackend::lora_backward(const Tensor& dx, const LoraGrads& grads, const Tensor& dt, const Tensor& dy,
                                    const Tensor& x, const Tensor& t, const LoraArgs& lora) {
  OpRange r(prof_, "lora_backward", true);
  inner_.lora_backward(dx, grads, dt, dy, x, t, lora);
}

void ProfiledBackend::linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, bool accumulate_dx, bool accumulate_dw) {
  OpRange r(prof_, "linear_backward", true);
  inner_.linear_backward(dx, dw, dy, x, w, accumulate_dx, accumulate_dw);
}

void ProfiledBackend::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  OpRange r(prof_, "embedding_forward", true);
  inner_.embedding_forward(out, table, ids);
}

void ProfiledBackend::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  OpRange r(prof_, "embedding_backward", true);
  inner_.embedding_backward(dtable, dout, ids);
}

void ProfiledBackend::add_rmsnorm_forward(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& x,
                                          const Tensor& r, const Tensor& w, double eps) {
  OpRange op(prof_, "add_rmsnorm_forward", true);
  inner_.add_rmsnorm_forward(h, y, rstd, x, r, w, eps);
}

void ProfiledBackend::rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                                      double eps) {
  OpRange r(prof_, "rmsnorm_forward", true);
  inner_.rmsnorm_forward(y, rstd, x, w, eps);
}

void ProfiledBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                       const Tensor& w, const Tensor& rstd, bool accumulate_dx) {
  OpRange r(prof_, "rmsnorm_backward", true);
  inner_.rmsnorm_backward(dx, dw, dy, x, w, rstd, accumulate_dx);
}

void ProfiledBackend::swiglu_forward(const Tensor& h, const Tensor& gate, const Tensor& up) {
  OpRange r(prof_, "swiglu_forward", true);
  inner_.swiglu_forward(h, gate, up);
}

void ProfiledBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dh, const Tensor& gate,
                                      const Tensor& up) {
  OpRange r(prof_, "swiglu_backward", true);
  inner_.swiglu_backward(dgate, dup, dh, gate, up);
}

void ProfiledBackend::conv1d_silu_forward(const Tensor& y, const Tensor& x, const Tensor& w, const SeqInfo& seqs) {
  OpRange r(prof_, "conv1d_silu_forward", true);
  inner_.conv1d_silu_forward(y, x, w, seqs);
}

void ProfiledBackend::conv1d_silu_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                           const Tensor& w, const SeqInfo& seqs) {
  OpRange r(prof_, "conv1d_silu_backward", true);
  inner_.conv1d_silu_backward(dx, dw, dy, x, w, seqs);
}

void ProfiledBackend::gdn_gates_forward(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                                        const Tensor& a_log, const Tensor& dt_bias) {
  OpRange r(prof_, "gdn_gates_forward", true);
  inner_.gdn_gates_forward(beta, g, b, a, a_log, dt_bias);
}

void ProfiledBackend::gdn_gates_backward(const Tensor& db, const Tensor& da, const Tensor& da_log,
                                         const Tensor& ddt_bias, const Tensor& dbeta, const Tensor& dg, const Tensor& b,
                                         const Tensor& a, const Tensor& a_log, const Tensor& dt_bias) {
  OpRange r(prof_, "gdn_gates_backward", true);
  inner_.gdn_gates_backward(db, da, da_log, ddt_bias, dbeta, dg, b, a, a_log, dt_bias);
}

void ProfiledBackend::gdn_forward(const Tensor& o, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                                  const GdnDims& dims, const SeqInfo& seqs, const Tensor& state, GdnKeep keep) {
  OpRange r(prof_, "gdn_forward", true);
  inner_.gdn_forward(o, qkv, g, beta, dims, seqs, state, keep);
}

void ProfiledBackend::gdn_backward(const Tensor& dqkv, const Tensor& dg, const Tensor& dbeta, const Tensor& d_o,
                                   const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnDims& dims,
                                   const SeqInfo& seqs, const Tensor& state, GdnKeep keep) {
  OpRange r(prof_, "gdn_backward", true);
  inner_.gdn_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, dims, seqs, state, keep);
}

void ProfiledBackend::gated_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& z,
                                            const Tensor& w, double eps) {
  OpRange r(prof_, "gated_rmsnorm_forward", true);
  inner_.gated_rmsnorm_forward(y, rstd, x, z, w, eps);
}

void ProfiledBackend::gated_rmsnorm_backward(const Tensor& dx, const Tensor& dz, const Tensor& dw, const Tensor& dy,
                                             const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& rstd) {
  OpRange r(prof_, "gated_rmsnorm_backward", true);
  inner_.gated_rmsnorm_backward(dx, dz, dw, dy, x, z, w, rstd);
}

void ProfiledBackend::attn_prep_forward(const Tensor& q, const Tensor& k, const Tensor& gate, const Tensor& q_rstd,
                                        const Tensor& k_rstd, const Tensor& qg, const Tensor& kr,
                                        const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& positions,
                                        const AttnDims& dims, double eps) {
  OpRange r(prof_, "attn_prep_forward", true);
  inner_.attn_prep_forward(q, k, gate, q_rstd, k_rstd, qg, kr, q_norm_w, k_norm_w, positions, dims, eps);
}

void ProfiledBackend::attn_prep_backward(const Tensor& dqg, const Tensor& dkr, const Tensor& dq_norm_w,
                                         const Tensor& dk_norm_w, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dgate, const Tensor& qg, const Tensor& kr,
                                         const Tensor& q_norm_w, const Tensor& k_norm_w, const Tensor& q_rstd,
                                         const Tensor& k_rstd, const Tensor& positions, const AttnDims& dims) {
  OpRange r(prof_, "attn_prep_backward", true);
  inner_.attn_prep_backward(dqg, dkr, dq_norm_w, dk_norm_w, dq, dk, dgate, qg, kr, q_norm_w, k_norm_w, q_rstd, k_rstd,
                            positions, dims);
}

void ProfiledBackend::attention_forward(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const AttnDims& dims, const SeqInfo& seqs) {
  OpRange r(prof_, "attention_forward", true);
  inner_.attention_forward(o, lse, q, k, v, dims, seqs);
}

void ProfiledBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& d_o,
                                         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                         const Tensor& lse, const AttnDims& dims, const SeqInfo& seqs) {
  OpRange r(prof_, "attention_backward", true);
  inner_.attention_backward(dq, dk, dv, d_o, q, k, v, o, lse, dims, seqs);
}

void ProfiledBackend::attn_gate_forward(const Tensor& y, const Tensor& o, const Tensor& gate) {
  OpRange r(prof_, "attn_gate_forward", true);
  inner_.attn_gate_forward(y, o, gate);
}

void ProfiledBackend::attn_gate_backward(const Tensor& d_o, const Tensor& dgate, const Tensor& dy, const Tensor& o,
                                         const Tensor& gate) {
  OpRange r(prof_, "attn_gate_backward", true);
  inner_.attn_gate_backward(d_o, dgate, dy, o, gate);
}

double ProfiledBackend::linear_cross_entropy(const Tensor& dhidden, const Tensor& dw, const Tensor& token_loss,
                                             const Tensor& hidden, const Tensor& w, const Tensor& targets,
                                             double grad_scale, bool accumulate_dw) {
  OpRange r(prof_, "linear_cross_entropy", true);
  return inner_.linear_cross_entropy(dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
}

void ProfiledBackend::linear_cross_entropy_to(const Tensor& loss_sum, const Tensor& dhidden, const Tensor& dw,
                                              const Tensor& token_loss, const Tensor& hidden, const Tensor& w,
                                              const Tensor& targets, double grad_scale, bool accumulate_dw) {
  OpRange r(prof_, "linear_cross_entropy", true);
  inner_.linear_cross_entropy_to(loss_sum, dhidden, dw, token_loss, hidden, w, targets, grad_scale, accumulate_dw);
}

namespace profile {

Profiler* attached_profiler(Backend& backend) {
  auto* p = dynamic_cast<ProfiledBackend*>(&backend);
  return p != nullptr ? &p->profiler() : nullptr;
}

Backend& unwrap_backend(Backend& backend) {
  Backend* b = &backend;
  while (auto* p = dynamic_cast<ProfiledBackend*>(b)) b = &p->inner();
  return *b;
}

}  // namespace profile
}  // namespace qt
