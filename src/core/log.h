// Minimal leveled logging to stderr. Level from QWENTUNE_LOG=debug|info|warn|error (default info).
#pragma once
#include <string>

#include "core/error.h"

namespace qt {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, const std::string& message);

template <typename... Args>
void log_debug(Args&&... a) { if (log_level() <= LogLevel::Debug) log_write(LogLevel::Debug, str(std::forward<Args>(a)...)); }
template <typename... Args>
void log_info(Args&&... a) { if (log_level() <= LogLevel::Info) log_write(LogLevel::Info, str(std::forward<Args>(a)...)); }
template <typename... Args>
void log_warn(Args&&... a) { if (log_level() <= LogLevel::Warn) log_write(LogLevel::Warn, str(std::forward<Args>(a)...)); }

}  // namespace qt
