// The NCCL communicator: device tensors, every collective enqueued on the CUDA backend's stream (so
// a captured step holds them). Bootstrap: the unique id broadcast over MPI when mpirun or srun
// started the ranks, else NCCL's own rendezvous at MASTER_ADDR:MASTER_PORT (torchrun). Host-side
// waits poll the stream and the communicator's async error until dist.timeout_s, then abort the
// communicator and stop naming this rank and the collective.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/communicator.h"
#include "ops/cuda/cuda_backend.h"

namespace qt {

bool nccl_built() { return true; }
void mpi_broadcast_bytes(void* data, size_t bytes, int root);  // mpi_communicator.cpp

namespace {

#define NCCL_CALL(op, stmt)                                                                             \
  do {                                                                                                  \
    const ncclResult_t r_ = (stmt);                                                                     \
    QT_CHECK(r_ == ncclSuccess || r_ == ncclInProgress, "rank ", rank(), ": ", op, " failed: ",          \
             ncclGetErrorString(r_), " (", ncclGetLastError(comm_), ")");                                 \
  } while (0)

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    default: QT_FAIL(op, ": dtype ", dtype_name(t), " is not supported by the NCCL communicator");
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const RankInfo& info, CudaBackend& be, double timeout_s)
      : Communicator(info), be_(be), stream_(be.stream()), timeout_s_(timeout_s) {
    ncclUniqueId id{};
    if (info.world == 1) {
      QT_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
    } else if (info.launcher == "mpirun" || info.launcher == "srun") {
      if (info.rank == 0) QT_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
      mpi_broadcast_bytes(&id, sizeof id, 0);
    } else {
      QT_CHECK(!info.master_addr.empty() && info.master_port > 0, "rank ", info.rank,
               ": NCCL's rendezvous needs MASTER_ADDR and MASTER_PORT (torchrun sets them)");
      // NCCL's own bootstrap: rank 0 listens at NCCL_COMM_ID, the others connect there.
      const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
      ::setenv("NCCL_COMM_ID", where.c_str(), 1);
      QT_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed for NCCL_COMM_ID ", where);
    }
    const ncclResult_t r = ncclCommInitRank(&comm_, info.world, id, info.rank);
    QT_CHECK(r == ncclSuccess, "rank ", info.rank, ": ncclCommInitRank (", info.world, " ranks) failed: ",
             ncclGetErrorString(r));
    QT_CHECK(cudaMalloc(&host_stage_, kHostStage) == cudaSuccess, "NCCL communicator: staging buffer");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    cudaFree(host_stage_);
  }
  const char* kind() const override { return "nccl"; }
  bool capturable() const override { return true; }

  void all_gather(const Tensor& out, const Tensor& in) override {
    QT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * world(), "all_gather: out ", out.describe(),
             " must hold world (", world(), ") times in ", in.describe());
    Staged o(*this, out, false), i(*this, in, true);
    NCCL_CALL("ncclAllGather", ncclAllGather(i.ptr(), o.ptr(), static_cast<size_t>(in.numel()),
                                             nccl_type(in.dtype, "all_gather"), comm_, stream_));
    o.done("ncclAllGather");
  }
  void reduce_scatter(const Tensor& out, const Tensor& in) override {
    QT_CHECK(out.dtype == in.dtype && in.numel() == out.numel() * world(), "reduce_scatter: in ", in.describe(),
             " must hold world (", world(), ") times out ", out.describe());
    Staged o(*this, out, false), i(*this, in, true);
    NCCL_CALL("ncclReduceScatter", ncclReduceScatter(i.ptr(), o.ptr(), static_cast<size_t>(out.numel()),
                                                     nccl_type(out.dtype, "reduce_scatter"), ncclSum, comm_, stream_));
    o.done("ncclReduceScatter");
  }
  void all_reduce(const Tensor& t) override {
    Staged s(*this, t, true);
    NCCL_CALL("ncclAllReduce", ncclAllReduce(s.ptr(), s.ptr(), static_cast<size_t>(t.numel()),
                                             nccl_type(t.dtype, "all_reduce"), ncclSum, comm_, stream_));
    s.done("ncclAllReduce");
  }
  void broadcast(const Tensor& t, int root) override {
    Staged s(*this, t, true);
    NCCL_CALL("ncclBroadcast", ncclBroadcast(s.ptr(), s.ptr(), t.nbytes(), ncclUint8, root, comm_, stream_));
    s.done("ncclBroadcast");
  }
  void all_reduce_host(double* v, int n) override {
    host_collective("ncclAllReduce (host values)", v, sizeof(double) * size_t(n), [&](void* d) {
      return ncclAllReduce(d, d, size_t(n), ncclFloat64, ncclSum, comm_, stream_);
    });
  }
  void all_reduce_max_host(int64_t* v, int n) override {
    host_collective("ncclAllReduce (host max)", v, sizeof(int64_t) * size_t(n), [&](void* d) {
      return ncclAllReduce(d, d, size_t(n), ncclInt64, ncclMax, comm_, stream_);
    });
  }
  void broadcast_host(std::string& bytes, int root) override {
    int64_t n = static_cast<int64_t>(bytes.size());
    host_collective("ncclBroadcast (size)", &n, sizeof n,
                    [&](void* d) { return ncclBroadcast(d, d, sizeof n, ncclUint8, root, comm_, stream_); });
    bytes.resize(static_cast<size_t>(n));
    for (size_t at = 0; at < bytes.size(); at += kHostStage) {
      const size_t len = std::min(kHostStage, bytes.size() - at);
      host_collective("ncclBroadcast (bytes)", bytes.data() + at, len,
                      [&](void* d) { return ncclBroadcast(d, d, len, ncclUint8, root, comm_, stream_); });
    }
  }
  void barrier() override {
    int64_t one = 1;
    all_reduce_max_host(&one, 1);
  }

 private:
  static constexpr size_t kHostStage = 1 << 20;
  // A tensor as device memory for NCCL: itself on the GPU; a host tensor (the eager sharded
  // optimizer's) copied through a device buffer, waited for in done().
  class Staged {
   public:
    Staged(NcclCommunicator& c, const Tensor& t, bool read) : c_(c), t_(t), host_(t.device.kind != DeviceKind::CUDA) {
      if (!host_) return;
      QT_CHECK(cudaMalloc(&dev_, std::max<size_t>(1, t.nbytes())) == cudaSuccess, "NCCL staging of ", t.describe());
      if (read) QT_CHECK(cudaMemcpyAsync(dev_, t.data, t.nbytes(), cudaMemcpyHostToDevice, c_.stream_) == cudaSuccess,
                         "NCCL staging of ", t.describe());
    }
    ~Staged() {
      if (dev_ != nullptr) cudaFree(dev_);
    }
    void* ptr() { return host_ ? dev_ : t_.data; }
    void done(const char* op) {
      if (!host_) return;
      QT_CHECK(cudaMemcpyAsync(t_.data, dev_, t_.nbytes(), cudaMemcpyDeviceToHost, c_.stream_) == cudaSuccess, op,
               ": copy back");
      c_.wait(op);
    }

   private:
    NcclCommunicator& c_;
    Tensor t_;
    bool host_;
    void* dev_ = nullptr;
  };
  template <typename F>
  void host_collective(const char* op, void* host, size_t bytes, F&& call) {
    QT_CHECK(bytes <= kHostStage, op, ": ", bytes, " bytes exceed the staging buffer");
    QT_CHECK(cudaMemcpyAsync(host_stage_, host, bytes, cudaMemcpyHostToDevice, stream_) == cudaSuccess, op, ": copy in");
    NCCL_CALL(op, call(host_stage_));
    QT_CHECK(cudaMemcpyAsync(host, host_stage_, bytes, cudaMemcpyDeviceToHost, stream_) == cudaSuccess, op, ": copy out");
    wait(op);
  }
  // Waits for the stream, polling NCCL's async error, until the timeout.
  void wait(const char* op) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      QT_CHECK(q == cudaErrorNotReady, "rank ", rank(), ": ", op, ": ", cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        QT_FAIL("rank ", rank(), ": ", op, " failed: ", ncclGetErrorString(async), " (another rank died?)");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        QT_FAIL("rank ", rank(), ": ", op, " did not finish within dist.timeout_s = ", timeout_s_,
                " s: another rank died or stopped answering");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  CudaBackend& be_;
  cudaStream_t stream_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  void* host_stage_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, Backend& backend, double timeout_s) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);  // make_communicator checked the device kind
  QT_CHECK(cuda != nullptr, "the NCCL communicator needs the CUDA backend itself (not a wrapper)");
  return std::make_unique<NcclCommunicator>(info, *cuda, timeout_s);
}

}  // namespace qt
