#include "test_util.h"

#include <unistd.h>

namespace qt::testing {

ScratchDir::ScratchDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path root = base ? base : std::filesystem::temp_directory_path();
  path_ = (root / ("qwentune-" + name + "-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScopedEnv::ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    ::setenv(name, value->c_str(), 1);
  } else {
    ::unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    ::setenv(name_, old_->c_str(), 1);
  } else {
    ::unsetenv(name_);
  }
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const qt::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qt::Error, nothing was thrown";
  return "";
}

std::string testdata_dir() { return QT_TESTDATA_DIR; }

}  // namespace qt::testing
