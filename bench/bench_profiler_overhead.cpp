// bench_profiler_overhead [--steps N] [--tokens N] [--rounds N]
// The cost of the profiler: N training steps (forward + backward + optimizer) of the tiny preset on
// the CPU backend, three ways: the plain backend (what runs when no profiling is requested), the
// ProfiledBackend decorator with its profiler disabled, and enabled. The three run interleaved for
// several rounds (the machine is shared); the median time per step of each is compared. Prints
// one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
#include "ops/cpu/cpu_backend.h"
#include "train/step_runner.h"
#include "profile/profiled_backend.h"

namespace {

enum class Mode { Plain, Disabled, Enabled };

// Seconds per step over `steps` steps (after 2 warmup steps), on a fresh backend and model.
double time_steps(Mode mode, const std::vector<qt::PackedRow>& rows, int64_t steps, int64_t tokens) {
  qt::CpuBackend cpu;
  qt::ProfiledBackend profiled(cpu);
  qt::Backend& be = mode == Mode::Plain ? static_cast<qt::Backend&>(cpu) : profiled;
  qt::Qwen35Model model(qt::preset_config("tiny"), be, tokens);
  qt::init_model_random(model, 1);
  qt::TrainStepRunner runner(model);
  qt::profile::Profiler& prof = profiled.profiler();
  prof.set_enabled(mode == Mode::Enabled);
  for (int64_t s = 0; s < 2; ++s) runner.step(rows[static_cast<size_t>(s) % rows.size()]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    prof.begin_step(s + 1);
    runner.step(rows[static_cast<size_t>(s) % rows.size()]);
    prof.end_step();
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (mode == Mode::Enabled) QT_CHECK(static_cast<int64_t>(prof.step_stats().size()) == steps, "enabled run recorded no steps");
  if (mode == Mode::Disabled) QT_CHECK(prof.step_stats().empty() && prof.op_stats().empty(), "disabled run recorded");
  return dt / double(steps);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 20, tokens = 512, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_profiler_overhead [--steps N] [--tokens N] [--rounds N]\n");
      return 2;
    }
  }
  try {
    const std::vector<qt::PackedRow> rows = qt::synthetic_chat_rows(512, tokens, 8, 0);
    std::vector<double> plain, disabled, enabled;
    for (int64_t r = 0; r < rounds; ++r) {
      plain.push_back(time_steps(Mode::Plain, rows, steps, tokens));
      disabled.push_back(time_steps(Mode::Disabled, rows, steps, tokens));
      enabled.push_back(time_steps(Mode::Enabled, rows, steps, tokens));
    }
    const double p = median(plain), d = median(disabled), e = median(enabled);
    nlohmann::ordered_json out = {{"preset", "tiny"},
                                  {"backend", "cpu"},
                                  {"tokens_per_step", tokens},
                                  {"steps", steps},
                                  {"rounds", rounds},
                                  {"ms_per_step_plain", p * 1e3},
                                  {"ms_per_step_decorator_disabled", d * 1e3},
                                  {"ms_per_step_decorator_enabled", e * 1e3},
                                  {"ratio_disabled_vs_plain", d / p},
                                  {"ratio_enabled_vs_plain", e / p}};
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_profiler_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
