// The built-in profiler: per-op and per-layer timing of training steps, a framework-style table and
// a Chrome trace (viewable in Perfetto / chrome://tracing).
//
// How it is fed:
//   * ProfiledBackend (profile/profiled_backend.h) wraps any Backend and reports every op call
//     (op_begin/op_end) while a profiled step is open;
//   * the model and the trainer name what is running with RAII scopes,
//       profile::Scope s(prof, "layer", 3, "linear_attention");
//     a null `prof` (no profiler attached: the default) makes a scope a single pointer test;
//   * the caller brackets each profiled step with begin_step()/end_step().
//
// Times: CPU time is the wall time of the call on the calling thread (for an asynchronous device
// backend that is the launch/enqueue cost). Device time comes from a DeviceTimer that the wrapped
// backend implements (CUDA: cudaEvent pairs recorded on its stream around each op, resolved at
// step end); a backend without one (the CPU reference) runs its ops synchronously, so there the
// device time of an op is its CPU time.
//
// With QT_HAVE_CUDA the profiler also opens NVTX ranges per op and per scope, so Nsight Systems
// shows the same names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qt::profile {

// Device timestamps for a backend whose ops run asynchronously on a stream. ProfiledBackend finds
// it by dynamic_cast on the wrapped backend (so a CUDA backend implements both interfaces), or it
// can be passed explicitly.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // Enqueues a timestamp on the backend's stream behind all work submitted so far, without
  // synchronizing; returns its index among the marks since the last resolve (0, 1, ...).
  virtual int device_mark() = 0;
  // Waits until every mark has been reached and returns their times in nanoseconds (any origin,
  // one clock), in mark order; then forgets them.
  virtual std::vector<int64_t> device_resolve() = 0;
};

class Profiler {
 public:
  // One recorded interval: a step, a scope (phase or layer) or an op call.
  enum class Kind : uint8_t { Step, Scope, Op };
  struct Event {
    Kind kind = Kind::Op;
    bool launches = false;         // op: enqueues device work (counted as a kernel launch)
    bool has_device = false;       // device interval known (a scope holding no op has none)
    const char* name = "";         // string literal: op name, scope name
    const char* tag = nullptr;     // scope tag (e.g. the layer kind)
    int index = -1;                // scope index (a scope with index >= 0 is a layer-like scope)
    int parent = -1;               // enclosing event in the same step (-1 for the step)
    int layer = -1;                // index of the innermost layer-like scope around it, -1 if none
    int layer_scope = -1;          // that scope's event (in the same step)
    const char* phase = nullptr;   // name of the innermost other scope ("forward", "backward", ...)
    int64_t step = 0;
    int64_t cpu_begin_ns = 0, cpu_end_ns = 0;  // on the profiler's clock
    int64_t dev_begin_ns = 0, dev_end_ns = 0;  // device time mapped onto the profiler's clock
    int mark_begin = -1, mark_end = -1;        // DeviceTimer marks (with a timer)
  };

  struct OpStat {
    std::string name;
    int64_t calls = 0;
    int64_t cpu_ns = 0, dev_ns = 0;
  };
  struct LayerStat {
    int layer = -1;
    std::string name, tag;  // scope name and tag ("layer", "linear_attention")
    int64_t calls = 0;
    int64_t cpu_ns = 0, dev_ns = 0;
    int64_t dev_forward_ns = 0, dev_backward_ns = 0;  // ops under "forward" / "backward" scopes
  };
  struct StepStat {
    int64_t step = 0;
    int64_t cpu_ns = 0;          // wall time of the step
    int64_t dev_busy_ns = 0;     // sum of op device intervals
    int64_t dev_span_ns = 0;     // device time from the step's first to its last mark (CPU: cpu_ns)
    int64_t launches = 0;        // op calls that enqueue device work (0 on the CPU backend)
    int64_t ops = 0;             // op calls
    double dev_idle_fraction() const {
      return dev_span_ns > 0 ? 1.0 - static_cast<double>(dev_busy_ns) / static_cast<double>(dev_span_ns) : 0.0;
    }
  };

  explicit Profiler(DeviceTimer* timer = nullptr, std::string device_label = "cpu");
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Off by default. Takes effect at the next begin_step().
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // True inside a profiled step: only then are ops and scopes recorded.
  bool active() const { return active_; }
  bool has_device_timer() const { return timer_ != nullptr; }
  const std::string& device_label() const { return device_label_; }
  // Steps whose events are kept for the trace (statistics cover every profiled step).
  void set_max_trace_steps(int64_t n) { max_trace_steps_ = n; }

  void begin_step(int64_t step);  // no-op unless enabled
  void end_step();                // resolves device times, aggregates, keeps the trace events
  void clear();                   // forgets every statistic and event

  // Called by ProfiledBackend and Scope while active(). Names must be string literals (or
  // otherwise outlive the profiler).
  int op_begin(const char* name, bool launches);
  void op_end(int event);
  void scope_begin(const char* name, int index, const char* tag);
  void scope_end();

  // Results.
  std::vector<OpStat> op_stats() const;        // sorted by device time, descending
  std::vector<LayerStat> layer_stats() const;  // by layer index
  const std::vector<StepStat>& step_stats() const { return steps_; }
  const std::vector<Event>& trace_events() const { return trace_; }
  int64_t total_step_ns() const;               // sum of the steps' device spans (the "% of step" base)

  // The tables: summary, per-step lines, ops (top N by device time; 0 = all), layers.
  std::string report(int top) const;
  // Chrome trace JSON: complete events ("ph": "X", ts/dur in microseconds) on a CPU track
  // (tid 1) and a device track (tid 2) of one process; layer scopes contain their ops.
  std::string trace_json() const;
  void write_trace(const std::string& path) const;

 private:
  int64_t now_ns() const;
  void aggregate(const std::vector<Event>& evs);

  DeviceTimer* timer_;
  std::string device_label_;
  bool enabled_ = false, active_ = false;
  int64_t origin_ns_;
  int64_t max_trace_steps_ = 64;
  int64_t traced_steps_ = 0;
  std::vector<Event> cur_;     // events of the open step; cur_[0] is the step
  std::vector<int> open_;      // open step/scopes (indices into cur_)
  std::vector<Event> trace_;   // kept events of finished steps
  std::vector<StepStat> steps_;
  std::vector<OpStat> ops_;    // in first-seen order
  std::vector<LayerStat> layers_;
};

// RAII scope. Costs one pointer test when `p` is null and one flag test when it is inactive.
class Scope {
 public:
  explicit Scope(Profiler* p, const char* name, int index = -1, const char* tag = nullptr) {
    if (p != nullptr && p->active()) {
      p_ = p;
      p->scope_begin(name, index, tag);
    }
  }
  ~Scope() {
    if (p_ != nullptr) p_->scope_end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Profiler* p_ = nullptr;
};

// "A:B" -> first = A, last = B (1-based, inclusive, A <= B); throws qt::Error otherwise.
void parse_step_range(const std::string& text, int64_t& first, int64_t& last);

// Formats nanoseconds the way profiler tables do: "812.000us", "12.345ms", "1.234s".
std::string format_ns(int64_t ns);

}  // namespace qt::profile
