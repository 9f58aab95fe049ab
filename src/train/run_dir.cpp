#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/mapped_file.h"
#include "train/checkpoint.h"

namespace qt {
namespace fs = std::filesystem;

namespace {
constexpr const char* kLockName = ".qwentune.lock";

bool is_run_output(const std::string& n) {
  return n == "final" || n == "best" || n == "metrics.jsonl" || n == "tb" || n == "summary.json" ||
         n == "report.html" || n == "config.yaml" || n == "profile_trace.json" || checkpoint_step_of(n) >= 0;
}
}  // namespace

RunLock::RunLock(const std::string& output_dir) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  QT_CHECK(!ec, output_dir, ": cannot create the output directory: ", ec.message());
  path_ = (fs::path(output_dir) / kLockName).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  QT_CHECK(fd_ >= 0, path_, ": cannot create the run lock: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
    QT_CHECK(err != EWOULDBLOCK, output_dir, ": another qwentune run (PID ", pid.substr(0, pid.find('\n')),
             ") is using this output directory; wait for it to end or choose another output_dir");
    QT_FAIL(path_, ": cannot lock: ", std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The lock holds without the PID in it; only the message of a second run loses the PID.
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

std::vector<std::string> run_dir_outputs(const std::string& output_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& de : fs::directory_iterator(output_dir, ec)) {
    const std::string n = de.path().filename().string();
    if (is_run_output(n)) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void run_dir_clear(const std::string& output_dir) {
  for (const std::string& n : run_dir_outputs(output_dir)) {
    std::error_code ec;
    fs::remove_all(fs::path(output_dir) / n, ec);
    QT_CHECK(!ec, (fs::path(output_dir) / n).string(), ": cannot remove (--overwrite): ", ec.message());
  }
}

std::vector<nlohmann::json> metrics_read(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      // A line torn by a kill mid-write: later lines would be from a later run, so stop here.
      break;
    }
  }
  return out;
}

std::vector<nlohmann::json> metrics_truncate(const std::string& path, int64_t first_step) {
  std::vector<nlohmann::json> kept;
  if (!fs::exists(path)) return kept;
  std::string text;
  for (nlohmann::json& r : metrics_read(path)) {
    if (r.value("step", int64_t{0}) >= first_step) continue;
    text += r.dump() + "\n";
    kept.push_back(std::move(r));
  }
  write_text_file(path, text);
  return kept;
}

}  // namespace qt
