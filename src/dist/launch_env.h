// Where this process sits in a job, from its launcher's environment: mpirun (OpenMPI's
// OMPI_COMM_WORLD_*), srun (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID) or torchrun (RANK /
// WORLD_SIZE / LOCAL_RANK with MASTER_ADDR / MASTER_PORT). A process no launcher started is rank 0
// of 1. The GPU a rank drives is its local rank.
#pragma once
#include <functional>
#include <string>

namespace qt {

struct RankInfo {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string launcher = "none";  // none | mpirun | srun | torchrun
  std::string master_addr;        // torchrun's rendezvous (NCCL's bootstrap without MPI)
  int master_port = 0;
  bool distributed() const { return world > 1; }
};

// Reads the variables through `lookup` (nullptr for an unset one): the launcher that set a
// complete group wins in the order OpenMPI, Slurm, torchrun. An inconsistent group (rank outside
// the world, a non-number) is an error naming the variable and its value.
RankInfo launch_env_parse(const std::function<const char*(const char*)>& lookup);
// The same from this process's environment.
RankInfo launch_env();

}  // namespace qt
