// DeviceTimer for the CUDA backend: cudaEvents recorded on the backend's stream (one per mark,
// pooled and reused), resolved with cudaEventElapsedTime against the step's first mark. Compiled
// only in CUDA builds (QT_HAVE_CUDA).
#pragma once
#include <memory>

#include "ops/backend.h"
#include "profile/profiler.h"

namespace qt::profile {

// A timer on the stream of `backend` when it is the CUDA backend; nullptr otherwise (and always in
// a build without CUDA).
std::unique_ptr<DeviceTimer> make_cuda_event_timer(Backend& backend);

}  // namespace qt::profile
