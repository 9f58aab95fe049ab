// One error family for the whole engine. Library code never exits: it throws qt::Error with a
// message that names the file, line, tensor or field that is wrong; the CLI prints it and returns
// a non-zero status. Internal invariants use the same path so nothing aborts without a message.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qt {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string where) : std::runtime_error(std::move(message)), where_(std::move(where)) {}
  // Source location of the check that fired ("src/io/safetensors.cpp:120"), for bug reports.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace qt

// QT_CHECK(cond, parts...): throw qt::Error(parts...) unless cond holds.
#define QT_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) ::qt::throw_error(__FILE__, __LINE__, ::qt::str(__VA_ARGS__)); \
  } while (0)
#define QT_FAIL(...) ::qt::throw_error(__FILE__, __LINE__, ::qt::str(__VA_ARGS__))
