#include "profile/cuda_event_timer.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_backend.h"

namespace qt::profile {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  QT_CHECK(e == cudaSuccess, "profiler: ", what, ": ", cudaGetErrorString(e));
}

class CudaEventTimer final : public DeviceTimer {
 public:
  explicit CudaEventTimer(cudaStream_t stream) : stream_(stream) {}
  ~CudaEventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  int device_mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    cuda_ok(cudaEventRecord(events_[used_], stream_), "cudaEventRecord");
    return static_cast<int>(used_++);
  }

  std::vector<int64_t> device_resolve() override {
    std::vector<int64_t> t(used_, 0);
    if (used_ == 0) return t;
    cuda_ok(cudaEventSynchronize(events_[used_ - 1]), "cudaEventSynchronize");
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, events_[0], events_[i]), "cudaEventElapsedTime");
      t[i] = static_cast<int64_t>(std::llround(static_cast<double>(ms) * 1e6));
    }
    used_ = 0;
    return t;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<DeviceTimer> make_cuda_event_timer(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return nullptr;
  return std::make_unique<CudaEventTimer>(cuda->stream());
}

}  // namespace qt::profile
