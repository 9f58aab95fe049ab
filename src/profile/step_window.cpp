#include "profile/step_window.h"

#include <cstdio>
#include <utility>

#include "profile/profiled_backend.h"

namespace qt::profile {

StepWindow::StepWindow(ProfiledBackend* backend, int64_t first, int64_t last, std::string trace_path, int top)
    : backend_(backend), first_(first), last_(last), trace_path_(std::move(trace_path)), top_(top) {}

void StepWindow::begin(int64_t step) {
  if (backend_ == nullptr) return;
  backend_->profiler().set_enabled(step >= first_ && step <= last_);
  backend_->profiler().begin_step(step);
}

void StepWindow::end(int64_t step) {
  if (backend_ == nullptr) return;
  backend_->profiler().end_step();
  if (step >= last_) report();
}

void StepWindow::finish() {
  if (backend_ != nullptr && !backend_->profiler().step_stats().empty()) report();
}

void StepWindow::report() {
  if (reported_) return;
  reported_ = true;
  Profiler& p = backend_->profiler();
  p.set_enabled(false);
  std::printf("\n%s", p.report(top_).c_str());
  p.write_trace(trace_path_);
  std::printf("trace: %s (open in https://ui.perfetto.dev)\n\n", trace_path_.c_str());
  std::fflush(stdout);
}

}  // namespace qt::profile
