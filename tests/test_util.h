// Helpers shared by the unit tests: scratch directories and error-message matching.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "core/error.h"

namespace qt::testing {

// A fresh directory under the build tree's temp area, removed at scope exit.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name);
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Sets (or, with nullopt, unsets) an environment variable for the scope; restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Runs fn and returns the qt::Error message it throws; fails the test if it does not throw.
std::string error_of(const std::function<void()>& fn);

// Directory holding tests/testdata.
std::string testdata_dir();

}  // namespace qt::testing

// EXPECT that fn throws qt::Error whose message contains every one of the given substrings.
#define EXPECT_ERROR_CONTAINS(fn, ...)                                                    \
  do {                                                                                    \
    const std::string msg_ = ::qt::testing::error_of(fn);                                 \
    for (const char* part_ : {__VA_ARGS__})                                               \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "message: " << msg_ << "\nmissing: " << part_; \
  } while (0)
