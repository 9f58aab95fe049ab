#include "core/error.h"

#include <cstring>

namespace qt {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  // Keep the location relative to the source tree so messages are stable across machines.
  const char* rel = std::strstr(file, "src/");
  if (rel == nullptr) rel = std::strstr(file, "tests/");
  throw Error(message, str(rel ? rel : file, ":", line));
}

}  // namespace qt
