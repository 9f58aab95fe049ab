// Facts about the running process that logs and reports show.
#pragma once
#include <cstdint>

namespace qt {

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status); 0 when unknown.
int64_t peak_rss_bytes();

}  // namespace qt
