#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qt {

LrSchedule lr_schedule_from_name(const std::string& name) {
  if (name == "cosine") return LrSchedule::Cosine;
  if (name == "linear") return LrSchedule::Linear;
  if (name == "constant") return LrSchedule::Constant;
  QT_FAIL("unknown lr schedule '", name, "' (cosine, linear or constant)");
}

double lr_multiplier(const LrScheduleConfig& cfg, int64_t step) {
  if (cfg.warmup_steps > 0 && step <= cfg.warmup_steps) return static_cast<double>(step) / static_cast<double>(cfg.warmup_steps);
  if (cfg.kind == LrSchedule::Constant) return 1.0;
  const int64_t decay_steps = std::max<int64_t>(1, cfg.total_steps - cfg.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - cfg.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double shape = cfg.kind == LrSchedule::Cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape;
}

}  // namespace qt
