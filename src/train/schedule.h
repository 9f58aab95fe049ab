// Learning-rate schedules: linear warmup, then cosine, linear or constant decay to min_lr_ratio*lr.
#pragma once
#include <cstdint>
#include <string>

namespace qt {

enum class LrSchedule { Cosine, Linear, Constant };
LrSchedule lr_schedule_from_name(const std::string& name);  // throws on unknown names

struct LrScheduleConfig {
  LrSchedule kind = LrSchedule::Cosine;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;
};

// Multiplier of the peak lr at optimizer step `step` (1-based).
double lr_multiplier(const LrScheduleConfig& cfg, int64_t step);

}  // namespace qt
