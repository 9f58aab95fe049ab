// The MPI communicator (OpenMPI): host tensors directly, device tensors through host staging (which
// synchronizes the backend: eager steps only). A watchdog ends this rank with an error naming the
// collective when one has not finished within the timeout (a rank died or stopped answering);
// mpirun then ends the others.
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "ops/backend.h"

namespace qt {

bool mpi_built() { return true; }

namespace {

// bf16 sums with fp32 arithmetic (MPI has no bf16 type).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

// MPI for the process: initialized once, finalized at exit (mpirun counts a rank that exits
// without MPI_Finalize as failed).
struct MpiRuntime {
  MPI_Op bf16_op = MPI_OP_NULL;
  MpiRuntime() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      QT_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
               "MPI_Init_thread failed");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Op_create(&bf16_sum, 1, &bf16_op);
  }
  static MpiRuntime& get() {
    static MpiRuntime rt;
    return rt;
  }
};

// Ends the process when the collective it guards has run past the deadline.
class Watchdog {
 public:
  Watchdog(int rank, double timeout_s) : rank_(rank), timeout_(timeout_s) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void begin(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    op_ = op;
    deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(timeout_));
    cv_.notify_all();
  }
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    op_ = nullptr;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!quit_) {
      if (op_ == nullptr) {
        cv_.wait(lock);
        continue;
      }
      if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && op_ != nullptr &&
          std::chrono::steady_clock::now() >= deadline_) {
        std::fprintf(stderr,
                     "[qwentune error] rank %d: %s did not finish within dist.timeout_s = %g s: another rank died or "
                     "stopped answering; ending the job\n",
                     rank_, op_, timeout_);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }
  int rank_;
  double timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  const char* op_ = nullptr;
  std::chrono::steady_clock::time_point deadline_;
  bool quit_ = false;
  std::thread thread_;
};

MPI_Datatype mpi_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    default: QT_FAIL(op, ": dtype ", dtype_name(t), " is not supported by the MPI communicator");
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const RankInfo& info, Backend& be, double timeout_s)
      : Communicator(info), be_(be), rt_(MpiRuntime::get()), dog_(info.rank, timeout_s) {
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    QT_CHECK(rank == info.rank && world == info.world, "MPI sees rank ", rank, " of ", world, " but the launcher said ",
             info.rank, " of ", info.world);
  }
  const char* kind() const override { return "mpi"; }

  void all_gather(const Tensor& out, const Tensor& in) override {
    QT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * world(), "all_gather: out ", out.describe(),
             " must hold world (", world(), ") times in ", in.describe());
    Staged o(be_, out, false), i(be_, in, true);
    run("MPI_Allgather", [&] { return MPI_Allgather(i.ptr(), count(in), mpi_type(in.dtype, "all_gather"), o.ptr(), count(in),
                                           mpi_type(in.dtype, "all_gather"), MPI_COMM_WORLD); });
    o.done();
  }
  void reduce_scatter(const Tensor& out, const Tensor& in) override {
    QT_CHECK(out.dtype == in.dtype && in.numel() == out.numel() * world(), "reduce_scatter: in ", in.describe(),
             " must hold world (", world(), ") times out ", out.describe());
    Staged o(be_, out, false), i(be_, in, true);
    run("MPI_Reduce_scatter_block", [&] { return MPI_Reduce_scatter_block(i.ptr(), o.ptr(), count(out), sum_type(out.dtype),
                                                                 sum_op(out.dtype), MPI_COMM_WORLD); });
    o.done();
  }
  void all_reduce(const Tensor& t) override {
    Staged s(be_, t, true);
    run("MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, s.ptr(), count(t), sum_type(t.dtype), sum_op(t.dtype),
                                           MPI_COMM_WORLD); });
    s.done();
  }
  void broadcast(const Tensor& t, int root) override {
    Staged s(be_, t, true);
    run("MPI_Bcast", [&] { return MPI_Bcast(s.ptr(), count(t) * static_cast<int>(dtype_size(t.dtype)), MPI_BYTE, root,
                                   MPI_COMM_WORLD); });
    s.done();
  }
  void all_reduce_host(double* v, int n) override {
    run("MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); });
  }
  void all_reduce_max_host(int64_t* v, int n) override {
    run("MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD); });
  }
  void broadcast_host(std::string& bytes, int root) override {
    int64_t n = static_cast<int64_t>(bytes.size());
    run("MPI_Bcast", [&] { return MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD); });
    bytes.resize(static_cast<size_t>(n));
    if (n > 0) run("MPI_Bcast", [&] { return MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD); });
  }
  void barrier() override { run("MPI_Barrier", [&] { return MPI_Barrier(MPI_COMM_WORLD); }); }

 private:
  // A tensor as host memory for MPI: itself on the CPU, a host copy of a device tensor (read in
  // first when `read`, written back by done()).
  class Staged {
   public:
    Staged(Backend& be, const Tensor& t, bool read) : be_(be), t_(t), device_(t.device.kind == DeviceKind::CUDA) {
      if (!device_) return;
      host_.resize(t.nbytes());
      if (read) be_.copy_to_host(host_.data(), t_);
    }
    void* ptr() { return device_ ? static_cast<void*>(host_.data()) : t_.data; }
    void done() {
      if (device_) be_.copy_from_host(t_, host_.data());
    }

   private:
    Backend& be_;
    Tensor t_;
    bool device_;
    std::vector<uint8_t> host_;
  };
  static int count(const Tensor& t) {
    QT_CHECK(t.numel() <= (int64_t(1) << 31) - 1, "MPI collective on ", t.describe(), ": over 2^31 elements");
    return static_cast<int>(t.numel());
  }
  MPI_Datatype sum_type(DType t) const {
    QT_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16, "MPI sum of ", dtype_name(t),
             ": only f32, f64 and bf16 are summed");
    return t == DType::F32 ? MPI_FLOAT : t == DType::F64 ? MPI_DOUBLE : MPI_UINT16_T;
  }
  MPI_Op sum_op(DType t) const { return t == DType::BF16 ? rt_.bf16_op : MPI_SUM; }
  // Runs one MPI call under the watchdog and turns its error code into an error naming it.
  template <typename F>
  void run(const char* op, F&& call) {
    dog_.begin(op);
    const int rc = call();
    dog_.end();
    check(op, rc);
  }
  void check(const char* op, int rc) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    QT_FAIL("rank ", rank(), ": ", op, " failed: ", std::string(msg, static_cast<size_t>(len)));
  }
  Backend& be_;
  MpiRuntime& rt_;
  Watchdog dog_;
};

}  // namespace

void mpi_broadcast_bytes(void* data, size_t bytes, int root) {
  MpiRuntime::get();
  QT_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD) == MPI_SUCCESS,
           "MPI_Bcast of ", bytes, " bytes from rank ", root, " failed");
}

void mpi_abort_job(int code) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Communicator> make_mpi_communicator(const RankInfo& info, Backend& backend, double timeout_s) {
  return std::make_unique<MpiCommunicator>(info, backend, timeout_s);
}

}  // namespace qt
