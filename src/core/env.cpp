#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qt {

const char* external_env(const char* name) {
  static const char* const kExact[] = {"HOME", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HF_HOME",
                                       "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT"};
  bool known = std::strncmp(name, "OMPI_COMM_WORLD_", 16) == 0 || std::strncmp(name, "SLURM_", 6) == 0;
  for (const char* k : kExact) known = known || std::strcmp(name, k) == 0;
  QT_CHECK(known, "external_env: '", name, "' is not a variable another tool defines (settings are config keys)");
  return std::getenv(name);
}

}  // namespace qt
