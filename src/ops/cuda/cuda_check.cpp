#include "ops/cuda/cuda_check.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qt::cuda {

void gpu_fail(const char* api, const char* stmt, int code, const char* what, const char* func, const char* file,
              int line) {
  throw_error(file, line, str(api, " error ", code, " (", what, ") in ", func, ": ", stmt));
}

const char* cublas_status_str(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

bool debug_sync_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QWENTUNE_DEBUG_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms > 0 ? sms : 1;
  }();
  return n;
}

void launch_check(const char* what, const char* func, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  // Debug sync is for eager runs only: synchronizing inside CUDA-graph capture would break it.
  if (e == cudaSuccess && debug_sync_enabled()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) gpu_fail("CUDA", what, static_cast<int>(e), cudaGetErrorString(e), func, file, line);
}

}  // namespace qt::cuda
