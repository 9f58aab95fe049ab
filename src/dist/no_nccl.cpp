// Builds without NCCL (no CUDA): the NCCL communicator's entry points say so.
#include <memory>

#include "core/error.h"
#include "dist/communicator.h"

namespace qt {

bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo&, Backend&, double) {
  QT_FAIL("this build has no NCCL (it comes with the CUDA build)");
}

}  // namespace qt
