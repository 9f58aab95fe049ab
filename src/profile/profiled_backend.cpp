#include "profile/profiled_backend.h"

#ifdef QT_HAVE_CUDA
#include "profile/cuda_event_timer.h"
#endif

namespace qt {
namespace {

// Times one forwarded call while the profiler is active; otherwise a single flag test.
// `launches`: the op enqueues device work (a kernel); memory management and host transfers do not
// count as launches.
class OpRange {
 public:
  OpRange(profile::Profiler& p, const char* name, bool launches) {
    if (p.active()) {
      p_ = &p;
      event_ = p.op_begin(name, launches);
    }
  }
  ~OpRange() {
    if (p_ != nullptr) p_->op_end(event_);
  }
  OpRange(const OpRange&) = delete;
  OpRange& operator=(const OpRange&) = delete;

 private:
  profile::Profiler* p_ = nullptr;
  int event_ = -1;
};

std::unique_ptr<profile::DeviceTimer> event_timer_for(Backend& be) {
  if (dynamic_cast<profile::DeviceTimer*>(&be) != nullptr) return nullptr;
#ifdef QT_HAVE_CUDA
  return profile::make_cuda_event_timer(be);
#else
  return nullptr;
#endif
}

}  // namespace

ProfiledBackend::ProfiledBackend(Backend& inner)
    : inner_(inner),
      owned_timer_(event_timer_for(inner)),
      prof_(owned_timer_ ? owned_timer_.get() : dynamic_cast<profile::DeviceTimer*>(&inner), inner.name()) {}

ProfiledBackend::ProfiledBackend(Backend& inner, profile::DeviceTimer* timer)
    : inner_(inner), prof_(timer, inner.name()) {}

// Every op of ops/backend_ops.def: timed while the profiler is active, then forwarded.
#define QT_OP(ret, name, params, args, launches)   \
  ret ProfiledBackend::name params {               \
    OpRange range(prof_, #name, launches);         \
    return inner_.name args;                       \
  }
#include "ops/backend_ops.def"

namespace profile {

Profiler* attached_profiler(Backend& backend) {
  auto* p = dynamic_cast<ProfiledBackend*>(&backend);
  return p != nullptr ? &p->profiler() : nullptr;
}

Backend& unwrap_backend(Backend& backend) {
  Backend* b = &backend;
  while (auto* p = dynamic_cast<ProfiledBackend*>(b)) b = &p->inner();
  return *b;
}

}  // namespace profile
}  // namespace qt
