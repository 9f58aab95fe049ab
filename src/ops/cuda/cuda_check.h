// Error checking for the CUDA backend: one generator macro (QT_GPU_CHECK_IMPL) defines CUDA_CHECK
// and CUBLAS_CHECK; both report the failing statement, function, file and line through one
// [[noreturn]] handler that throws qt::Error (library code never exits). QT_LAUNCH_CHECK() follows
// every kernel launch: it reports launch errors and, with QWENTUNE_DEBUG_SYNC=1 in the environment,
// synchronizes the device so an asynchronous fault names the launch that caused it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace qt::cuda {

[[noreturn]] void gpu_fail(const char* api, const char* stmt, int code, const char* what, const char* func,
                           const char* file, int line);
const char* cublas_status_str(cublasStatus_t s);
inline const char* cuda_status_str(cudaError_t e) { return cudaGetErrorString(e); }
// True when QWENTUNE_DEBUG_SYNC=1 (read once).
bool debug_sync_enabled();
void launch_check(const char* what, const char* func, const char* file, int line);
// Streaming multiprocessors of the current device (read once per process: one device type).
int sm_count();

}  // namespace qt::cuda

// Generator: `stmt` returns a status of the API's type; `ok` is the success value; `to_str` names it.
#define QT_GPU_CHECK_IMPL(api, stmt, ok, to_str)                                                      \
  do {                                                                                                \
    const auto qt_status_ = (stmt);                                                                   \
    if (qt_status_ != (ok))                                                                           \
      ::qt::cuda::gpu_fail(api, #stmt, static_cast<int>(qt_status_), to_str(qt_status_), __func__,    \
                           __FILE__, __LINE__);                                                       \
  } while (0)

#define CUDA_CHECK(stmt) QT_GPU_CHECK_IMPL("CUDA", stmt, cudaSuccess, ::qt::cuda::cuda_status_str)
#define CUBLAS_CHECK(stmt) QT_GPU_CHECK_IMPL("cuBLAS", stmt, CUBLAS_STATUS_SUCCESS, ::qt::cuda::cublas_status_str)
// After a kernel launch (a launcher's last line).
#define QT_LAUNCH_CHECK(what) ::qt::cuda::launch_check(what, __func__, __FILE__, __LINE__)
