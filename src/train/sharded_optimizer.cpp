#include "train/sharded_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/error.h"

namespace qt {
namespace {

Tensor host_view(std::vector<float>& v) {
  return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, Device::cpu());
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(Qwen35Model& model, const AdamWConfig& cfg, Communicator& comm, int zero_stage,
                                   bool reduce_bf16)
    : model_(model), cfg_(cfg), comm_(comm), zero_(zero_stage), reduce_bf16_(reduce_bf16) {
  QT_CHECK(zero_stage >= 0 && zero_stage <= 3, "ShardedOptimizer: ZeRO stage ", zero_stage, " (0 to 3)");
  QT_CHECK(zero_stage != 3 || model.weight_shards() != nullptr, "ShardedOptimizer: ZeRO-3 needs a model built with it");
  QT_CHECK(zero_stage != 3 || !reduce_bf16, "dist.reduce_dtype bf16 is not built for ZeRO-3 (its gradients are "
           "reduce-scattered in fp32 layer by layer); use f32");
  const int W = comm.world(), r = comm.rank();
  for (size_t i = 0; i < model.specs().size(); ++i) {
    const ParamSpec& p = model.specs()[i];
    Slot s;
    const int64_t n = shape_numel(p.shape);
    s.rows = p.shape.empty() ? 1 : p.shape[0];
    s.cols = s.rows > 0 ? n / s.rows : 0;
    s.decay = param_decays(p);
    const std::vector<float> w = model.param_f32(i);
    if (zero_stage == 0 || !zero_shards(p)) {
      s.begin = 0;
      s.end = s.rows;
      s.master = w;
    } else {
      s.rows_per_rank = (s.rows + W - 1) / W;
      s.begin = std::min(s.rows, int64_t(r) * s.rows_per_rank);
      s.end = std::min(s.rows, s.begin + s.rows_per_rank);
      s.master.assign(w.begin() + s.begin * s.cols, w.begin() + s.end * s.cols);
    }
    s.m.assign(s.master.size(), 0.0f);
    s.v.assign(s.master.size(), 0.0f);
    slots_.push_back(std::move(s));
  }
}

void ShardedOptimizer::reduce(std::vector<float>& g) {
  if (!reduce_bf16_) {
    comm_.all_reduce(host_view(g));
    return;
  }
  std::vector<bf16> b(g.size());
  for (size_t k = 0; k < g.size(); ++k) b[k] = float_to_bf16(g[k]);
  comm_.all_reduce(Tensor(b.data(), DType::BF16, {static_cast<int64_t>(b.size())}, Device::cpu()));
  for (size_t k = 0; k < g.size(); ++k) g[k] = bf16_to_float(b[k]);
}

std::vector<float> ShardedOptimizer::gather(const Slot& s, const std::vector<float>& mine) {
  const int W = comm_.world();
  const size_t stride = static_cast<size_t>(s.rows_per_rank * s.cols);
  std::vector<float> padded(stride, 0.0f), all(stride * static_cast<size_t>(W));
  std::copy(mine.begin(), mine.end(), padded.begin());
  comm_.all_gather(host_view(all), host_view(padded));
  all.resize(static_cast<size_t>(s.rows * s.cols));
  return all;
}

double ShardedOptimizer::step(double lr, double max_grad_norm, int64_t step) {
  const int W = comm_.world();
  const auto& table = model_.specs();
  // 1. This rank's rows of the summed gradient of every tensor (the whole of a replicated one).
  std::vector<std::vector<float>> grads(table.size());
  double sq = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    Slot& s = slots_[i];
    if (sharded(s) && zero_ == 3) {  // summed over the ranks by the model's backward already
      grads[i] = model_.optimizer_grad_f32(i);
      for (float x : grads[i]) sq += double(x) * double(x);
      continue;
    }
    std::vector<float> g = model_.grad_f32(i);
    if (sharded(s) && zero_ == 2) {
      const size_t stride = static_cast<size_t>(s.rows_per_rank * s.cols);
      g.resize(stride * static_cast<size_t>(W), 0.0f);  // each rank's range padded to the stride
      std::vector<float> mine(stride);
      if (reduce_bf16_) {
        std::vector<bf16> gb(g.size()), mb(stride);
        for (size_t k = 0; k < g.size(); ++k) gb[k] = float_to_bf16(g[k]);
        comm_.reduce_scatter(Tensor(mb.data(), DType::BF16, {static_cast<int64_t>(stride)}, Device::cpu()),
                             Tensor(gb.data(), DType::BF16, {static_cast<int64_t>(gb.size())}, Device::cpu()));
        for (size_t k = 0; k < stride; ++k) mine[k] = bf16_to_float(mb[k]);
      } else {
        comm_.reduce_scatter(host_view(mine), host_view(g));
      }
      mine.resize(s.master.size());
      grads[i] = std::move(mine);
    } else {
      reduce(g);
      if (sharded(s)) grads[i].assign(g.begin() + s.begin * s.cols, g.begin() + s.end * s.cols);
      else grads[i] = std::move(g);
    }
    // The norm counts each row once: a rank's own rows, and the replicated tensors on rank 0.
    if (sharded(s) || comm_.rank() == 0)
      for (float x : grads[i]) sq += double(x) * double(x);
  }
  comm_.all_reduce_host(&sq, 1);
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) {
    for (size_t i = 0; i < table.size(); ++i)
      for (float x : grads[i]) QT_CHECK(std::isfinite(x), "step ", step, ": gradient of ", table[i].name, " has NaN/inf");
    QT_FAIL("step ", step, ": gradient norm is ", norm);
  }
  const double clip = clip_factor(norm, max_grad_norm);
  // 2. AdamW on this rank's rows, 3. the new weights gathered whole.
  for (size_t i = 0; i < table.size(); ++i) {
    Slot& s = slots_[i];
    std::vector<float>& g = grads[i];
    if (clip != 1.0)
      for (float& x : g) x = static_cast<float>(x * clip);
    if (!s.master.empty())
      adamw_update(s.master.data(), g.data(), s.m.data(), s.v.data(), static_cast<int64_t>(s.master.size()), lr,
                   s.decay ? cfg_.weight_decay : 0.0, cfg_, step);
    if (sharded(s) && zero_ == 3) model_.set_optimizer_param_f32(i, s.master);
    else model_.set_param_f32(i, sharded(s) ? gather(s, s.master) : s.master);
  }
  return norm;
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += static_cast<int64_t>(s.master.size());
  return 12 * n;
}

void ShardedOptimizer::get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) {
  Slot& s = slots_.at(i);
  if (!sharded(s)) {
    master = s.master;
    m = s.m;
    v = s.v;
    return;
  }
  master = gather(s, s.master);
  m = gather(s, s.m);
  v = gather(s, s.v);
}

void ShardedOptimizer::set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                                 const std::vector<float>& v) {
  Slot& s = slots_.at(i);
  const size_t n = static_cast<size_t>(s.rows * s.cols);
  QT_CHECK(master.size() == n && m.size() == n && v.size() == n, "optimizer state of ", model_.specs()[i].name,
           ": ", master.size(), " values, expected ", n);
  const auto b = static_cast<std::ptrdiff_t>(s.begin * s.cols), e = static_cast<std::ptrdiff_t>(s.end * s.cols);
  s.master.assign(master.begin() + b, master.begin() + e);
  s.m.assign(m.begin() + b, m.begin() + e);
  s.v.assign(v.begin() + b, v.begin() + e);
  model_.set_param_f32(i, master);
}

bool ShardedOptimizer::shards_state() const {
  for (const Slot& s : slots_)
    if (sharded(s)) return true;
  return false;
}

ModelOptimizer::StateRows ShardedOptimizer::state_rows(size_t i) const {
  const Slot& s = slots_.at(i);
  return sharded(s) ? StateRows{s.begin, s.end, s.rows, true} : StateRows{0, s.rows, s.rows, false};
}

void ShardedOptimizer::get_local_state(size_t i, std::vector<float>& master, std::vector<float>& m,
                                       std::vector<float>& v) {
  const Slot& s = slots_.at(i);
  master = s.master;
  m = s.m;
  v = s.v;
}

std::vector<float> ShardedOptimizer::get_master(size_t i) {
  Slot& s = slots_.at(i);
  return sharded(s) ? gather(s, s.master) : s.master;
}

void ShardedOptimizer::set_local_state(size_t i, const std::vector<float>& master, const std::vector<float>& m_rows,
                                       const std::vector<float>& v_rows) {
  Slot& s = slots_.at(i);
  const size_t n = static_cast<size_t>((s.end - s.begin) * s.cols);
  QT_CHECK(master.size() == static_cast<size_t>(s.rows * s.cols) && m_rows.size() == n && v_rows.size() == n,
           "optimizer state of ", model_.specs()[i].name, ": ", m_rows.size(), " values for this rank's rows, expected ",
           n);
  s.master.assign(master.begin() + static_cast<std::ptrdiff_t>(s.begin * s.cols),
                  master.begin() + static_cast<std::ptrdiff_t>(s.end * s.cols));
  s.m = m_rows;
  s.v = v_rows;
  model_.set_param_f32(i, master);
}

}  // namespace qt
