// CpuBackend: the fp32 reference implementation of qt::Backend, "the definition of correct" the
// CUDA kernels are checked against. Each method validates its tensors (dtype, shape, contiguity,
// device, sequence boundaries) and calls the float instantiation of the math in reference_ops.h.
// All float tensors are f32 (activations, weights, gradients, statistics); ids, targets,
// positions and cu_seqlens are i32 in host memory.
#pragma once
#include <memory>
#include <vector>

#include "ops/backend.h"

namespace qt {

class CpuBackend : public Backend {
 public:
  // Pins OpenBLAS to one thread: the model's GEMMs are small and BLAS's own spinning threads
  // fought with the op threads (3x slower training of the tiny model on 2 cores).
  CpuBackend();
  Device device() const override { return Device::cpu(); }
  const char* name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }

  // The ops of ops/backend_ops.def (the defaulted ones keep Backend's defaults). Tensors are
  // zero-initialized host memory owned by the backend until it is destroyed.
#define QT_OP(ret, name, params, args, launches) ret name params override;
#define QT_OP_DEFAULTED(ret, name, params, args, launches)
#include "ops/backend_ops.def"
  void* alloc_host(size_t bytes) override;
  void copy_to_host_async(void* dst, const Tensor& src) override { copy_to_host(dst, src); }
  void synchronize() override {}

  // Tokens per logits chunk in linear_cross_entropy; 0 (default) picks ~8M logits per chunk.
  void set_cross_entropy_chunk_rows(int64_t rows) { ce_chunk_rows_ = rows; }

 private:
  std::vector<std::unique_ptr<HostTensor>> allocations_;
  std::vector<std::unique_ptr<char[]>> host_blocks_;
  int64_t ce_chunk_rows_ = 0;
};

}  // namespace qt
