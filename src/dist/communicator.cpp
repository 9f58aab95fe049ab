#include "dist/communicator.h"

#include <cstring>

#include "core/error.h"
#include "ops/backend.h"

namespace qt {

std::unique_ptr<Communicator> make_mpi_communicator(const RankInfo& info, Backend& backend, double timeout_s);
std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, Backend& backend, double timeout_s);

namespace {

// One rank: every collective is the identity (a gather or scatter copies).
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(const RankInfo& info, Backend& be) : Communicator(info), be_(be) {}
  const char* kind() const override { return "local"; }
  bool capturable() const override { return true; }
  void all_gather(const Tensor& out, const Tensor& in) override { copy_same(out, in, "all_gather"); }
  void reduce_scatter(const Tensor& out, const Tensor& in) override { copy_same(out, in, "reduce_scatter"); }
  void all_reduce(const Tensor&) override {}
  void broadcast(const Tensor&, int) override {}
  void all_reduce_host(double*, int) override {}
  void all_reduce_max_host(int64_t*, int) override {}
  void broadcast_host(std::string&, int) override {}
  void barrier() override {}

 private:
  void copy_same(const Tensor& out, const Tensor& in, const char* op) {
    QT_CHECK(out.numel() == in.numel() && out.dtype == in.dtype, op, ": out ", out.describe(), " and in ",
             in.describe(), " differ at world size 1");
    if (out.data != in.data) be_.copy(out, Tensor(in.data, in.dtype, out.shape_vec(), in.device));
  }
  Backend& be_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const RankInfo& info, Backend& backend, const std::string& kind,
                                                double timeout_s) {
  QT_CHECK(kind == "auto" || kind == "mpi" || kind == "nccl", "dist.communicator is '", kind,
           "', expected auto, mpi or nccl");
  const bool cuda = backend.device().kind == DeviceKind::CUDA;
  if (kind == "auto" && !info.distributed()) return std::make_unique<LocalCommunicator>(info, backend);
  const std::string pick = kind == "auto" ? (cuda ? "nccl" : "mpi") : kind;
  if (pick == "nccl") {
    QT_CHECK(cuda, "dist.communicator nccl needs the CUDA backend (this rank runs on ", backend.name(), ")");
    QT_CHECK(nccl_built(), "dist.communicator nccl: this build has no NCCL (HINT: dist.communicator: mpi)");
    return make_nccl_communicator(info, backend, timeout_s);
  }
  QT_CHECK(mpi_built(), "dist.communicator mpi: this build has no MPI (HINT: install libopenmpi-dev and rebuild)");
  QT_CHECK(info.launcher == "mpirun" || info.launcher == "srun" || !info.distributed(),
           "dist.communicator mpi needs ranks started by mpirun or srun (this one: ", info.launcher,
           "); under torchrun use nccl");
  return make_mpi_communicator(info, backend, timeout_s);
}

}  // namespace qt
