#include "ops/backend_factory.h"

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#ifdef QT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_backend.h"
#endif

namespace qt {

bool cuda_backend_built() {
#ifdef QT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string default_backend_name() {
#ifdef QT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return "cuda";
  cudaGetLastError();  // clear the "no device" error
#endif
  return "cpu";
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuBackend>();  // deterministic, nothing to set up
  if (name == "cuda") {
#ifdef QT_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      QT_FAIL("--backend cuda: no CUDA device is visible (HINT: use --backend cpu)");
    }
    return std::make_unique<CudaBackend>(options);
#else
    (void)options;
    QT_FAIL("--backend cuda: this build has no CUDA backend (nvcc/cuBLASLt were not found at configure time; "
            "HINT: install the CUDA toolkit and rebuild, or use --backend cpu)");
#endif
  }
  QT_FAIL("unknown backend '", name, "' (cpu or cuda)");
}

}  // namespace qt
