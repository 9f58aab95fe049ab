// A run's output directory: one run at a time (an flock'ed lock file naming the holder's PID),
// a fresh run never mixes with an earlier one (refused unless it resumes or overwrites), and the
// step records after a resume are the ones of the resumed run only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qt {

// Held for the whole run; released (and the lock file removed) on destruction or process death.
class RunLock {
 public:
  // Throws naming the PID of the run that holds output_dir.
  explicit RunLock(const std::string& output_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// What an earlier run left in output_dir (final/, checkpoint-N/, metrics.jsonl, tb/ events...),
// one name each; empty when there is none.
std::vector<std::string> run_dir_outputs(const std::string& output_dir);
// --overwrite: removes what a run writes there (nothing else).
void run_dir_clear(const std::string& output_dir);

// JSON records of a metrics.jsonl ("" lines skipped; a torn last line, from a kill, is dropped).
std::vector<nlohmann::json> metrics_read(const std::string& path);
// Rewrites path keeping the records whose "step" is below first_step (resume: the steps after
// the checkpoint are run again and recorded then).
std::vector<nlohmann::json> metrics_truncate(const std::string& path, int64_t first_step);

}  // namespace qt
