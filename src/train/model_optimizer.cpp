#include "train/model_optimizer.h"

#include <cmath>

#include "core/error.h"
#include "profile/profiled_backend.h"
#ifdef QT_HAVE_CUDA
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_backend.h"
#endif

namespace qt {
namespace {

// Host AdamW: state in host fp32 arrays; gradients copied to the host each step.
class HostOptimizer final : public ModelOptimizer {
 public:
  HostOptimizer(Qwen35Model& model, const AdamWConfig& cfg) : model_(model), cfg_(cfg) {
    for (size_t i = 0; i < model.specs().size(); ++i) {
      master_.push_back(model.param_f32(i));
      m_.emplace_back(master_.back().size(), 0.0f);
      v_.emplace_back(master_.back().size(), 0.0f);
    }
  }

  double step(double lr, double max_grad_norm, int64_t step) override {
    const auto& table = model_.specs();
    std::vector<std::vector<float>> grads(table.size());
    std::vector<const float*> ptrs;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < table.size(); ++i) {
      grads[i] = model_.grad_f32(i);
      for (float x : grads[i]) QT_CHECK(std::isfinite(x), "step ", step, ": gradient of ", table[i].name, " has NaN/inf");
      ptrs.push_back(grads[i].data());
      sizes.push_back(static_cast<int64_t>(grads[i].size()));
    }
    const double norm = global_grad_norm(ptrs, sizes);
    const double clip = clip_factor(norm, max_grad_norm);
    for (size_t i = 0; i < table.size(); ++i) {
      if (clip != 1.0)
        for (float& x : grads[i]) x = static_cast<float>(x * clip);
      const bool decay = param_decays(table[i]);
      adamw_update(master_[i].data(), grads[i].data(), m_[i].data(), v_[i].data(),
                   static_cast<int64_t>(master_[i].size()), lr, decay ? cfg_.weight_decay : 0.0, cfg_, step);
      model_.set_param_f32(i, master_[i]);
    }
    return norm;
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const auto& w : master_) n += static_cast<int64_t>(w.size());
    return 12 * n;
  }

  void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override {
    master = master_[i];
    m = m_[i];
    v = v_[i];
  }
  void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                 const std::vector<float>& v) override {
    master_[i] = master;
    m_[i] = m;
    v_[i] = v;
    model_.set_param_f32(i, master);
  }

 private:
  Qwen35Model& model_;
  AdamWConfig cfg_;
  std::vector<std::vector<float>> master_, m_, v_;
};

#ifdef QT_HAVE_CUDA
// Device AdamW: one fused multi-tensor kernel; the norm and clip factor stay on the device, and
// only the norm (one double) comes back to the host per step.
class DeviceOptimizer final : public ModelOptimizer {
 public:
  DeviceOptimizer(Qwen35Model& model, CudaBackend& be, const AdamWConfig& cfg) : model_(model), be_(be), cfg_(cfg) {
    std::vector<cuda::AdamWTensor> table;
    for (size_t i = 0; i < model.specs().size(); ++i) {
      const Tensor& p = model.param(i);
      const DType gt = model.grad(i).dtype;
      QT_CHECK(p.dtype == DType::BF16 && (gt == DType::BF16 || gt == DType::F32),
               "device AdamW expects bf16 weights and bf16 or f32 gradients");
      master_.push_back(be.alloc(DType::F32, p.shape_vec()));
      m_.push_back(be.alloc(DType::F32, p.shape_vec()));
      v_.push_back(be.alloc(DType::F32, p.shape_vec()));
      const std::vector<float> w = model.param_f32(i);
      be.copy_from_host(master_.back(), w.data());
      table.push_back({master_.back().ptr<float>(), m_.back().ptr<float>(), v_.back().ptr<float>(), model.grad(i).data,
                       p.data, p.numel(), param_decays(model.specs()[i]), gt == DType::F32});
    }
    adamw_ = std::make_unique<cuda::AdamWMultiTensor>(table);
  }

  double step(double lr, double max_grad_norm, int64_t step) override {
    adamw_->grad_norm(max_grad_norm, be_.stream());
    double norm_clip[2];
    QT_CHECK(cudaMemcpyAsync(norm_clip, adamw_->norm_clip(), sizeof norm_clip, cudaMemcpyDeviceToHost, be_.stream()) ==
                 cudaSuccess, "device AdamW: copying the gradient norm failed");
    be_.synchronize();
    if (!std::isfinite(norm_clip[0])) fail_non_finite_gradients(model_, step, norm_clip[0]);
    adamw_->update(lr, cfg_.weight_decay, cfg_, step, be_.stream());
    return norm_clip[0];
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const Tensor& t : master_) n += t.numel();
    return 12 * n;
  }

  bool supports_enqueue() const override { return true; }
  void set_step(double lr, int64_t step, double grad_mult) override {
    adamw_->set_step(lr, cfg_.weight_decay, cfg_, step, grad_mult);
  }
  void enqueue_step(double max_grad_norm, double* host_norm) override {
    adamw_->enqueue(max_grad_norm, be_.stream());
    QT_CHECK(cudaMemcpyAsync(host_norm, adamw_->norm_clip(), sizeof(double), cudaMemcpyDeviceToHost, be_.stream()) ==
                 cudaSuccess, "device AdamW: enqueueing the gradient-norm copy failed");
  }

  void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override {
    for (auto [dst, src] : {std::pair<std::vector<float>*, const Tensor*>{&master, &master_[i]}, {&m, &m_[i]}, {&v, &v_[i]}}) {
      dst->resize(static_cast<size_t>(src->numel()));
      be_.copy_to_host(dst->data(), *src);
    }
  }
  void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                 const std::vector<float>& v) override {
    be_.copy_from_host(master_[i], master.data());
    be_.copy_from_host(m_[i], m.data());
    be_.copy_from_host(v_[i], v.data());
    model_.set_param_f32(i, master);
  }

 private:
  Qwen35Model& model_;
  CudaBackend& be_;
  AdamWConfig cfg_;
  std::vector<Tensor> master_, m_, v_;
  std::unique_ptr<cuda::AdamWMultiTensor> adamw_;
};
#endif

}  // namespace

void ModelOptimizer::set_step(double, int64_t, double) {
  QT_FAIL("this optimizer has no sync-free step (it runs on the host)");
}
void ModelOptimizer::enqueue_step(double, double*) {
  QT_FAIL("this optimizer has no sync-free step (it runs on the host)");
}

void fail_non_finite_gradients(Qwen35Model& model, int64_t step, double norm) {
  for (size_t i = 0; i < model.specs().size(); ++i)
    for (float x : model.grad_f32(i))
      QT_CHECK(std::isfinite(x), "step ", step, ": gradient of ", model.specs()[i].name, " has NaN/inf");
  QT_FAIL("step ", step, ": gradient norm is ", norm);
}

std::unique_ptr<ModelOptimizer> ModelOptimizer::create(Qwen35Model& model, const AdamWConfig& cfg) {
#ifdef QT_HAVE_CUDA
  // The profiler may wrap the backend: look through it.
  if (auto* cuda_be = dynamic_cast<CudaBackend*>(&profile::unwrap_backend(model.backend())))
    return std::make_unique<DeviceOptimizer>(model, *cuda_be, cfg);
#endif
  return std::make_unique<HostOptimizer>(model, cfg);
}

}  // namespace qt
