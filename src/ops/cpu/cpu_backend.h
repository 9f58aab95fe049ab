// CpuBackend: the fp32 reference implementation of qt::Backend, "the definition of correct" the
// CUDA kernels are checked against. Each method validates its tensors (dtype, shape, contiguity,
// device, sequence boundaries) and calls the float instantiation of the math in reference_ops.h.
// All float tensors are f32 (activations, weights, gradients, statistics); ids, targets,
// positions and cu_seqlens are i32 in host memory.
#pragma once
#include <memory>
#include <vector>

#include "ops/backend.h"

namespace qt {

class CpuBackend : public Backend {
 public:
  // Pins OpenBLAS to one thread: the model's GEMMs are small and BLAS's own spinning threads
  // fought with the op threads (3x slower training of the tiny model on 2 cores).
  CpuBackend();
  Device device() const override { return Device::cpu(); }
  const char* name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }

  // Zero-initialized host memory owned by the backend until it is destroyed.
  Tensor alloc(DType dtype, const Shape& shape) override;
  void* alloc_host(size_t bytes) override;
  void copy_to_host_async(void* dst, const Tensor& src) override { copy_to_host(dst, src); }
  void synchronize() override {}
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

  // Tokens per logits chunk in linear_cross_entropy; 0 (default) picks ~8M logits per chunk.
  void set_cross_entropy_chunk_rows(int64_t rows) { ce_chunk_rows_ = rows; }

 private:
  std::vector<std::unique_ptr<HostTensor>> allocations_;
  std::vector<std::unique_ptr<char[]>> host_blocks_;
  int64_t ce_chunk_rows_ = 0;
};

}  // namespace qt
