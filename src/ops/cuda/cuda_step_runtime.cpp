// CudaBackend's step runtime (ops/step_runtime.h): CapturedStep on a CUDA graph of the backend's
// stream (cuda_graph.h), FusedAdamW on the multi-tensor kernels (adamw.h).
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_graph.h"

namespace qt {
namespace {

class CudaCapturedStep final : public CapturedStep {
 public:
  explicit CudaCapturedStep(cudaStream_t stream) : stream_(stream) {}
  void capture(const std::function<void()>& enqueue) override { graph_.capture(stream_, enqueue); }
  void launch() override { graph_.launch(stream_); }
  bool ready() const override { return graph_.ready(); }
  int64_t kernel_nodes() const override { return graph_.kernel_nodes(); }
  int64_t copy_nodes() const override { return graph_.copy_nodes(); }
  int64_t total_nodes() const override { return graph_.total_nodes(); }

 private:
  cudaStream_t stream_;
  cuda::StepGraph graph_;
};

class CudaFusedAdamW final : public FusedAdamW {
 public:
  CudaFusedAdamW(CudaBackend& be, const std::vector<FusedAdamWTensor>& tensors) : be_(be) {
    std::vector<cuda::AdamWTensor> table;
    for (const FusedAdamWTensor& t : tensors) {
      const int64_t n = t.grad.numel();
      QT_CHECK(t.grad.dtype == DType::BF16 || t.grad.dtype == DType::F32,
               "fused AdamW: the gradient must be bf16 or f32 (", t.grad.describe(), ")");
      QT_CHECK(t.param.data == nullptr || (t.param.dtype == DType::BF16 && t.param.numel() == n),
               "fused AdamW: the working weights must be bf16 with the gradient's size (", t.param.describe(), ")");
      master_.push_back(be.alloc(DType::F32, t.grad.shape_vec()));
      m_.push_back(be.alloc(DType::F32, t.grad.shape_vec()));
      v_.push_back(be.alloc(DType::F32, t.grad.shape_vec()));
      table.push_back({master_.back().ptr<float>(), m_.back().ptr<float>(), v_.back().ptr<float>(), t.grad.data,
                       t.param.data, n, t.decay, t.grad.dtype == DType::F32, t.in_norm});
    }
    adamw_ = std::make_unique<cuda::AdamWMultiTensor>(table);
  }

  const Tensor& master(size_t i) const override { return master_.at(i); }
  const Tensor& m(size_t i) const override { return m_.at(i); }
  const Tensor& v(size_t i) const override { return v_.at(i); }

  double grad_norm(double max_norm) override {
    adamw_->grad_norm(max_norm, be_.stream());
    double norm_clip[2];
    CUDA_CHECK(cudaMemcpyAsync(norm_clip, adamw_->norm_clip(), sizeof norm_clip, cudaMemcpyDeviceToHost, be_.stream()));
    be_.synchronize();
    return norm_clip[0];
  }
  void update(double lr, const AdamWConfig& cfg, int64_t step) override {
    adamw_->update(lr, cfg.weight_decay, cfg, step, be_.stream());
  }
  void set_step(double lr, const AdamWConfig& cfg, int64_t step, double grad_mult) override {
    adamw_->set_step(lr, cfg.weight_decay, cfg, step, grad_mult);
  }
  void enqueue(double max_norm, double* host_norm) override {
    adamw_->enqueue(max_norm, be_.stream());
    CUDA_CHECK(cudaMemcpyAsync(host_norm, adamw_->norm_clip(), sizeof(double), cudaMemcpyDeviceToHost, be_.stream()));
  }
  void set_norm_reducer(std::function<void(const Tensor& sumsq)> reducer) override {
    const Device dev = be_.device();
    adamw_->set_sumsq_reducer([reducer = std::move(reducer), dev](double* sumsq, cudaStream_t) {
      reducer(Tensor(sumsq, DType::F64, {1}, dev));
    });
  }

 private:
  CudaBackend& be_;
  std::vector<Tensor> master_, m_, v_;
  std::unique_ptr<cuda::AdamWMultiTensor> adamw_;
};

}  // namespace

std::unique_ptr<CapturedStep> CudaBackend::make_captured_step() { return std::make_unique<CudaCapturedStep>(stream_); }

std::unique_ptr<FusedAdamW> CudaBackend::make_fused_adamw(const std::vector<FusedAdamWTensor>& tensors) {
  return std::make_unique<CudaFusedAdamW>(*this, tensors);
}

int64_t CudaBackend::device_memory_used_bytes() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b - free_b);
}

}  // namespace qt
