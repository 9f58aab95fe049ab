// Builds without MPI: the MPI communicator's entry points say so.
#include <memory>

#include "core/error.h"
#include "dist/communicator.h"

namespace qt {

bool mpi_built() { return false; }
void mpi_broadcast_bytes(void*, size_t, int) { QT_FAIL("this build has no MPI"); }
void mpi_abort_job(int) {}
std::unique_ptr<Communicator> make_mpi_communicator(const RankInfo&, Backend&, double) {
  QT_FAIL("this build has no MPI (HINT: install libopenmpi-dev and rebuild)");
}

}  // namespace qt
