#include "train/step_runner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/splitmix.h"
#include "model/init.h"
#include "profile/profiled_backend.h"

namespace qt {

std::vector<PackedRow> synthetic_chat_rows(int64_t vocab, int64_t tokens_per_row, int64_t count, uint64_t seed) {
  QT_CHECK(vocab > 0 && tokens_per_row >= 2 && count > 0, "synthetic rows: need vocab > 0, tokens_per_row >= 2, count > 0");
  SplitMix64 rng{seed * 0x2545f4914f6cdd1dull + 1};
  std::vector<PackedRow> rows(static_cast<size_t>(count));
  for (PackedRow& row : rows) {
    int64_t left = tokens_per_row;
    while (left > 0) {
      const double u = rng.uniform();
      int64_t len = u < 0.55 ? rng.range(32, 256) : u < 0.85 ? rng.range(256, 1024) : rng.range(1024, 4096);
      len = std::min(len, left);
      if (left - len == 1) ++len;  // no 1-token tail sample: it would train nothing
      const int64_t prompt = static_cast<int64_t>(static_cast<double>(len) * (0.2 + 0.4 * rng.uniform()));
      std::vector<int32_t> ids(static_cast<size_t>(len)), labels(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) {
        ids[static_cast<size_t>(i)] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
        labels[static_cast<size_t>(i)] = i < prompt ? -100 : ids[static_cast<size_t>(i)];
      }
      row.append_sample(ids, labels);
      left -= len;
    }
  }
  return rows;
}

void init_model_random(Qwen35Model& model, uint64_t seed) {
  const auto& specs = model.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<float> w(static_cast<size_t>(shape_numel(specs[i].shape)));
    init_param(specs[i], model.config().initializer_range, seed, DType::F32, w.data());
    model.set_param_f32(i, w);
  }
}

TrainStepRunner::TrainStepRunner(Qwen35Model& model, AdamWConfig adamw, double max_grad_norm)
    : model_(model), adamw_(adamw), max_grad_norm_(max_grad_norm), optimizer_(ModelOptimizer::create(model, adamw)) {}

double TrainStepRunner::step(const PackedRow& row) {
  ++step_;
  const int64_t trained = std::max<int64_t>(1, row.num_trained());
  model_.zero_grads();
  const LossResult r = model_.step(row, true, 1.0 / double(trained));
  profile::Scope scope(profile::attached_profiler(model_.backend()), "optimizer");
  optimizer_->step(adamw_.lr, max_grad_norm_, step_);
  return r.loss_sum / double(trained);
}

}  // namespace qt
