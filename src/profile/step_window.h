// `train --profile-steps A:B`: profiles steps first..last of a run (1-based, inclusive), then prints
// the tables to stdout and writes the Chrome trace. A null backend (no profiling asked) makes every
// call a no-op.
#pragma once
#include <cstdint>
#include <string>

namespace qt {
class ProfiledBackend;
}

namespace qt::profile {

class StepWindow {
 public:
  StepWindow(ProfiledBackend* backend, int64_t first, int64_t last, std::string trace_path, int top = 20);
  void begin(int64_t step);  // call before the step's first op
  void end(int64_t step);    // after its optimizer update; reports after step `last`
  void finish();             // the run ended before `last`: reports the steps profiled so far

 private:
  void report();
  ProfiledBackend* backend_;
  int64_t first_, last_;
  std::string trace_path_;
  int top_;
  bool reported_ = false;
};

}  // namespace qt::profile
