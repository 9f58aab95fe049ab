#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace qt {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("QWENTUNE_LOG");
  if (v == nullptr) return LogLevel::Info;
  if (std::strcmp(v, "debug") == 0) return LogLevel::Debug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::Warn;
  if (std::strcmp(v, "error") == 0) return LogLevel::Error;
  return LogLevel::Info;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

void log_write(LogLevel level, const std::string& message) {
  static std::mutex mu;
  static const char* tags[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[qwentune %s] %s\n", tags[static_cast<int>(level)], message.c_str());
}

}  // namespace qt
