// Collectives between the ranks of a job, on the tensors of this rank's backend: sums in fp32 (or
// bf16 with fp32 arithmetic), in an order that is fixed for a given world size. Every rank must
// issue the same collectives in the same order (the caller's contract, as in MPI and NCCL).
//
// Backends: Nccl (GPU tensors, enqueued on the backend's stream, so a captured step may hold them)
// and Mpi (host tensors of CPU ranks; a GPU rank's tensors go through host staging, which
// synchronizes, so only eager steps). A job of one rank gets the Local communicator: every
// collective is the identity. make_communicator picks by the backend and `kind`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/launch_env.h"

namespace qt {

class Backend;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* kind() const = 0;  // "local", "mpi", "nccl"
  virtual bool capturable() const { return false; }  // may run inside a captured (CUDA-graph) step
  int rank() const { return info_.rank; }
  int world() const { return info_.world; }
  const RankInfo& info() const { return info_; }

  // out [world * n] = the ranks' `in` [n] in rank order (same dtype).
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;
  // out [n] = the sum over ranks of their in[rank * n .. (rank + 1) * n) (f32 or bf16).
  virtual void reduce_scatter(const Tensor& out, const Tensor& in) = 0;
  // t = the sum over ranks of t (f32, f64 or bf16), in place.
  virtual void all_reduce(const Tensor& t) = 0;
  // t = root's t.
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Host values: v[0..n) summed over ranks (double); the maximum (int64); root's bytes (resized).
  virtual void all_reduce_host(double* v, int n) = 0;
  virtual void all_reduce_max_host(int64_t* v, int n) = 0;
  virtual void broadcast_host(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;

 protected:
  explicit Communicator(const RankInfo& info) : info_(info) {}
  RankInfo info_;
};

// kind: "auto" (local for one rank; nccl for a CUDA backend; mpi for the CPU), "nccl" or "mpi".
// timeout_s: a collective that has not finished by then ends the job with an error naming this
// rank and the collective (a rank died or stopped answering).
std::unique_ptr<Communicator> make_communicator(const RankInfo& info, Backend& backend, const std::string& kind,
                                                double timeout_s);
// Whether this build has the MPI / NCCL communicators.
bool mpi_built();
bool nccl_built();
// Ends every rank of an MPI job (a rank that fails must not leave the others waiting in a
// collective); nothing where MPI is not running.
void mpi_abort_job(int code);

}  // namespace qt
