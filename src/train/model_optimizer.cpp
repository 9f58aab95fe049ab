#include "train/model_optimizer.h"

#include <cmath>

#include "core/error.h"

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

// The backend's fused AdamW (the weights' device): fp32 master, m and v in the backend's memory;
// the norm and clip factor stay there, only the norm (one double) comes back per step.
class DeviceOptimizer final : public ModelOptimizer {
 public:
  // nullptr where the backend has no fused AdamW.
  // comm: a sharded (ZeRO-3) job of several ranks; nullptr: one rank.
  static std::unique_ptr<ModelOptimizer> try_create(Qwen35Model& model, const AdamWConfig& cfg, Communicator* comm) {
    const WeightShards* ws = model.weight_shards();
    QT_CHECK(comm == nullptr || ws != nullptr, "the sharded device optimizer needs a ZeRO-3 model");
    std::vector<FusedAdamWTensor> table;
    for (size_t i = 0; i < model.specs().size(); ++i) {
      const bool sharded = ws != nullptr && ws->sharded(i);
      // A replicated tensor's gradient is the same on every rank once all-reduced: counted on one.
      const bool in_norm = comm == nullptr || sharded || comm->rank() == 0;
      table.push_back({model.optimizer_grad(i), model.optimizer_param(i), param_decays(model.specs()[i]), in_norm});
    }
    std::unique_ptr<FusedAdamW> adamw = model.backend().make_fused_adamw(table);
    if (!adamw) return nullptr;
    if (comm != nullptr) adamw->set_norm_reducer([comm](const Tensor& sumsq) { comm->all_reduce(sumsq); });
    auto opt = std::unique_ptr<DeviceOptimizer>(new DeviceOptimizer(model, cfg, std::move(adamw), table.size(), comm));
    for (size_t i = 0; i < table.size(); ++i) {
      const std::vector<float> w = model.param_f32(i);  // gathered whole (a collective under ZeRO-3)
      opt->write_rows(opt->adamw_->master(i), i, w);
    }
    return opt;
  }

  double step(double lr, double max_grad_norm, int64_t step) override {
    reduce_replicated();
    const double norm = adamw_->grad_norm(max_grad_norm);
    if (!std::isfinite(norm)) fail_non_finite_gradients(model_, step, norm);
    adamw_->update(lr, cfg_, step);
    return norm;
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (size_t i = 0; i < count_; ++i) n += adamw_->master(i).numel();
    return 12 * n;
  }

  bool supports_enqueue() const override { return true; }
  void set_step(double lr, int64_t step, double grad_mult) override { adamw_->set_step(lr, cfg_, step, grad_mult); }
  void enqueue_step(double max_grad_norm, double* host_norm) override {
    reduce_replicated();
    adamw_->enqueue(max_grad_norm, host_norm);
  }

  // Whole tensors on every rank (a sharded job gathers each rank's rows: a collective).
  void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override {
    for (auto [dst, src] : {std::pair<std::vector<float>*, const Tensor*>{&master, &adamw_->master(i)},
                            {&m, &adamw_->m(i)}, {&v, &adamw_->v(i)}})
      *dst = read_rows(*src, i);
  }
  void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                 const std::vector<float>& v) override {
    write_rows(adamw_->master(i), i, master);
    write_rows(adamw_->m(i), i, m);
    write_rows(adamw_->v(i), i, v);
    model_.set_param_f32(i, master);
  }

  bool shards_state() const override { return comm_ != nullptr && model_.weight_shards() != nullptr; }
  StateRows state_rows(size_t i) const override {
    const int64_t rows = model_.specs()[i].shape.empty() ? 1 : model_.specs()[i].shape[0];
    if (!sharded(i)) return {0, rows, rows, false};
    const ShardLayout& L = model_.weight_shards()->layout(i);
    return {L.begin, L.end, L.rows, true};
  }
  void get_local_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override {
    for (auto [dst, src] : {std::pair<std::vector<float>*, const Tensor*>{&master, &adamw_->master(i)},
                            {&m, &adamw_->m(i)}, {&v, &adamw_->v(i)}}) {
      dst->resize(static_cast<size_t>(src->numel()));
      model_.backend().copy_to_host(dst->data(), *src);
    }
  }
  std::vector<float> get_master(size_t i) override { return read_rows(adamw_->master(i), i); }
  void set_local_state(size_t i, const std::vector<float>& master, const std::vector<float>& m_rows,
                       const std::vector<float>& v_rows) override {
    write_rows(adamw_->master(i), i, master);
    for (auto [dst, src] : {std::pair<const Tensor*, const std::vector<float>*>{&adamw_->m(i), &m_rows},
                            {&adamw_->v(i), &v_rows}}) {
      QT_CHECK(static_cast<int64_t>(src->size()) == dst->numel(), "optimizer state of ", model_.specs()[i].name,
               ": ", src->size(), " values for this rank's rows, expected ", dst->numel());
      model_.backend().copy_from_host(*dst, src->data());
    }
    model_.set_param_f32(i, master);
  }

 private:
  DeviceOptimizer(Qwen35Model& model, const AdamWConfig& cfg, std::unique_ptr<FusedAdamW> adamw, size_t count,
                  Communicator* comm)
      : model_(model), cfg_(cfg), adamw_(std::move(adamw)), count_(count), comm_(comm) {}

  bool sharded(size_t i) const { return model_.weight_shards() != nullptr && model_.weight_shards()->sharded(i); }
  void reduce_replicated() {
    if (comm_ != nullptr) comm_->all_reduce(model_.replicated_grads());
  }
  // This rank's part of a whole tensor into a device state tensor, and the whole tensor back.
  void write_rows(const Tensor& dst, size_t i, const std::vector<float>& whole) {
    if (!sharded(i)) {
      QT_CHECK(static_cast<int64_t>(whole.size()) == dst.numel(), "optimizer state of ", model_.specs()[i].name, ": ",
               whole.size(), " values, expected ", dst.numel());
      model_.backend().copy_from_host(dst, whole.data());
      return;
    }
    const ShardLayout& L = model_.weight_shards()->layout(i);
    QT_CHECK(static_cast<int64_t>(whole.size()) == L.rows * L.cols, "optimizer state of ", model_.specs()[i].name,
             ": ", whole.size(), " values, expected ", L.rows * L.cols);
    model_.backend().copy_from_host(dst, whole.data() + L.begin * L.cols);
  }
  std::vector<float> read_rows(const Tensor& src, size_t i) {
    std::vector<float> mine(static_cast<size_t>(src.numel()));
    model_.backend().copy_to_host(mine.data(), src);
    if (!sharded(i) || comm_ == nullptr) return mine;
    // The model's shards and this state share the communicator and the row layout.
    return model_.weight_shards()->gather_whole_host(i, mine);
  }

  Qwen35Model& model_;
  AdamWConfig cfg_;
  std::unique_ptr<FusedAdamW> adamw_;
  size_t count_;
  Communicator* comm_ = nullptr;
};

}  // namespace

ModelOptimizer::StateRows ModelOptimizer::state_rows(size_t) const {
  QT_FAIL("this optimizer keeps whole tensors: its state has no per-rank rows");
}
void ModelOptimizer::set_local_state(size_t, const std::vector<float>&, const std::vector<float>&,
                                     const std::vector<float>&) {
  QT_FAIL("this optimizer keeps whole tensors: restore it with set_state");
}

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
  // The backend's fused AdamW where it has one (a profiling decorator forwards to the backend it
  // wraps), else the host reference.
  if (std::unique_ptr<ModelOptimizer> device = DeviceOptimizer::try_create(model, cfg, nullptr)) return device;
  return std::make_unique<HostOptimizer>(model, cfg);
}

std::unique_ptr<ModelOptimizer> ModelOptimizer::create_sharded_device(Qwen35Model& model, const AdamWConfig& cfg,
                                                                      Communicator& comm) {
  return DeviceOptimizer::try_create(model, cfg, &comm);
}

}  // namespace qt
