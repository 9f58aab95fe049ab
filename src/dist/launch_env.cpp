#include "dist/launch_env.h"

#include <cstdlib>

#include "core/env.h"
#include "core/error.h"

namespace qt {
namespace {

struct Group {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

// The launchers' variables, in the order they are tried. srun under mpirun (or the reverse) sets
// both: OpenMPI's own describe the processes it started.
constexpr Group kGroups[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
};

int parse_int(const char* name, const char* v, int lo) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  QT_CHECK(end != v && *end == '\0' && x >= lo && x <= (1 << 24), "launcher environment: ", name, " is '", v,
           "', expected an integer >= ", lo);
  return static_cast<int>(x);
}

}  // namespace

RankInfo launch_env_parse(const std::function<const char*(const char*)>& lookup) {
  RankInfo info;
  for (const Group& g : kGroups) {
    const char* rank = lookup(g.rank);
    const char* world = lookup(g.world);
    if (rank == nullptr || world == nullptr) continue;
    info.launcher = g.launcher;
    info.rank = parse_int(g.rank, rank, 0);
    info.world = parse_int(g.world, world, 1);
    QT_CHECK(info.rank < info.world, "launcher environment: ", g.rank, "=", info.rank, " is not below ", g.world, "=",
             info.world);
    const char* local = lookup(g.local_rank);
    info.local_rank = local ? parse_int(g.local_rank, local, 0) : info.rank;
    // SLURM_NTASKS_PER_NODE may read "4(x2)" on heterogeneous allocations: only a plain count is used.
    const char* lw = lookup(g.local_world);
    char* end = nullptr;
    const long lw_v = lw ? std::strtol(lw, &end, 10) : 0;
    info.local_world = lw && end != lw && *end == '\0' && lw_v >= 1 ? static_cast<int>(lw_v) : info.world;
    QT_CHECK(info.local_rank < info.local_world || !lw, "launcher environment: ", g.local_rank, "=", info.local_rank,
             " is not below ", g.local_world, "=", info.local_world);
    if (const char* a = lookup("MASTER_ADDR")) info.master_addr = a;
    if (const char* p = lookup("MASTER_PORT")) info.master_port = parse_int("MASTER_PORT", p, 1);
    return info;
  }
  return info;
}

RankInfo launch_env() {
  return launch_env_parse([](const char* name) -> const char* { return external_env(name); });
}

}  // namespace qt
