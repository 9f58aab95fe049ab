#include "profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"

#ifdef QT_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace qt::profile {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string scope_label(const Profiler::Event& e) {
  return e.index >= 0 ? std::string(e.name) + " " + std::to_string(e.index) : std::string(e.name);
}

// Microseconds with nanosecond resolution, as Chrome trace wants them.
double to_us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * x);
  return buf;
}

// A plain text table: left-aligned first column, right-aligned others, dashed rules.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> w(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    std::string rule;
    for (size_t i = 0; i < w.size(); ++i) rule += (i ? "  " : "") + std::string(w[i], '-');
    rule += "\n";
    std::string out = rule;
    for (size_t r = 0; r < rows_.size(); ++r) {
      for (size_t i = 0; i < w.size(); ++i) {
        const std::string cell = i < rows_[r].size() ? rows_[r][i] : "";
        const std::string padding(w[i] - cell.size(), ' ');
        if (i) out += "  ";
        out += i == 0 ? cell + (i + 1 < w.size() ? padding : "") : padding + cell;
      }
      out += "\n";
      if (r == 0) out += rule;
    }
    return out + rule;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace

std::string format_ns(int64_t ns) {
  char buf[32];
  const double x = static_cast<double>(ns);
  if (ns < 1000000) std::snprintf(buf, sizeof buf, "%.3fus", x / 1e3);
  else if (ns < 1000000000) std::snprintf(buf, sizeof buf, "%.3fms", x / 1e6);
  else std::snprintf(buf, sizeof buf, "%.3fs", x / 1e9);
  return buf;
}

void parse_step_range(const std::string& text, int64_t& first, int64_t& last) {
  const size_t colon = text.find(':');
  auto number = [&](const std::string& s) -> int64_t {
    QT_CHECK(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos && s.size() < 19,
             "step range '", text, "': expected A:B with step numbers A <= B (1-based)");
    return std::stoll(s);
  };
  QT_CHECK(colon != std::string::npos, "step range '", text, "': expected A:B (e.g. 5:8)");
  first = number(text.substr(0, colon));
  last = number(text.substr(colon + 1));
  QT_CHECK(first >= 1 && first <= last, "step range '", text, "': expected 1 <= A <= B");
}

Profiler::Profiler(DeviceTimer* timer, std::string device_label)
    : timer_(timer), device_label_(std::move(device_label)), origin_ns_(steady_ns()) {}

int64_t Profiler::now_ns() const { return steady_ns() - origin_ns_; }

void Profiler::begin_step(int64_t step) {
  if (!enabled_) return;
  if (active_) end_step();
  cur_.clear();
  open_.clear();
  Event e;
  e.kind = Kind::Step;
  e.name = "step";
  e.step = step;
  if (timer_ != nullptr) {
    timer_->device_resolve();  // drop marks left from outside profiled steps
    e.mark_begin = timer_->device_mark();
  }
  e.cpu_begin_ns = now_ns();
  cur_.push_back(e);
  open_.push_back(0);
  active_ = true;
}

int Profiler::op_begin(const char* name, bool launches) {
  const Event& parent = cur_[static_cast<size_t>(open_.back())];
  Event e;
  e.kind = Kind::Op;
  e.name = name;
  e.launches = launches;
  e.parent = open_.back();
  e.layer = parent.kind == Kind::Scope && parent.index >= 0 ? parent.index : parent.layer;
  e.layer_scope = parent.kind == Kind::Scope && parent.index >= 0 ? open_.back() : parent.layer_scope;
  e.phase = parent.kind == Kind::Scope && parent.index < 0 ? parent.name : parent.phase;
  e.step = cur_[0].step;
#ifdef QT_HAVE_CUDA
  nvtxRangePushA(name);
#endif
  if (timer_ != nullptr) e.mark_begin = timer_->device_mark();
  e.cpu_begin_ns = now_ns();
  cur_.push_back(e);
  return static_cast<int>(cur_.size()) - 1;
}

void Profiler::op_end(int event) {
  if (!active_ || event <= 0 || static_cast<size_t>(event) >= cur_.size()) return;  // step ended meanwhile
  Event& e = cur_[static_cast<size_t>(event)];
  e.cpu_end_ns = now_ns();
  if (timer_ != nullptr) e.mark_end = timer_->device_mark();
#ifdef QT_HAVE_CUDA
  nvtxRangePop();
#endif
}

void Profiler::scope_begin(const char* name, int index, const char* tag) {
  const Event& parent = cur_[static_cast<size_t>(open_.back())];
  Event e;
  e.kind = Kind::Scope;
  e.name = name;
  e.tag = tag;
  e.index = index;
  e.parent = open_.back();
  const bool parent_layer = parent.kind == Kind::Scope && parent.index >= 0;
  const bool parent_phase = parent.kind == Kind::Scope && parent.index < 0;
  e.layer = index >= 0 ? index : (parent_layer ? parent.index : parent.layer);
  e.layer_scope = parent_layer ? e.parent : parent.layer_scope;
  e.phase = parent_phase ? parent.name : parent.phase;
  e.step = cur_[0].step;
#ifdef QT_HAVE_CUDA
  nvtxRangePushA(scope_label(e).c_str());
#endif
  e.cpu_begin_ns = now_ns();
  cur_.push_back(e);
  open_.push_back(static_cast<int>(cur_.size()) - 1);
}

void Profiler::scope_end() {
  if (!active_ || open_.size() < 2) return;  // the step itself is closed by end_step
  cur_[static_cast<size_t>(open_.back())].cpu_end_ns = now_ns();
  open_.pop_back();
#ifdef QT_HAVE_CUDA
  nvtxRangePop();
#endif
}

void Profiler::end_step() {
  if (!active_) return;
  const int64_t end = now_ns();
  while (open_.size() > 1) scope_end();  // scopes left open by an exception
  Event& step = cur_[0];
  step.cpu_end_ns = end;
  active_ = false;
  if (timer_ != nullptr) {
    step.mark_end = timer_->device_mark();
    const std::vector<int64_t> t = timer_->device_resolve();
    auto at = [&](int mark) -> int64_t {
      QT_CHECK(mark >= 0 && static_cast<size_t>(mark) < t.size(), "profiler: device mark ", mark, " of ", t.size(),
               " was not resolved");
      return step.cpu_begin_ns + (t[static_cast<size_t>(mark)] - t[static_cast<size_t>(step.mark_begin)]);
    };
    step.dev_begin_ns = at(step.mark_begin);
    step.dev_end_ns = at(step.mark_end);
    step.has_device = true;
    for (Event& e : cur_) {
      if (e.kind != Kind::Op) continue;
      e.dev_begin_ns = at(e.mark_begin);
      e.dev_end_ns = at(e.mark_end);
      e.has_device = true;
    }
    // A scope's device interval covers the device intervals of the ops inside it.
    for (size_t i = 1; i < cur_.size(); ++i) {
      if (cur_[i].kind != Kind::Op) continue;
      for (int p = cur_[i].parent; p > 0; p = cur_[static_cast<size_t>(p)].parent) {
        Event& s = cur_[static_cast<size_t>(p)];
        if (!s.has_device) {
          s.dev_begin_ns = cur_[i].dev_begin_ns;
          s.dev_end_ns = cur_[i].dev_end_ns;
          s.has_device = true;
        } else {
          s.dev_begin_ns = std::min(s.dev_begin_ns, cur_[i].dev_begin_ns);
          s.dev_end_ns = std::max(s.dev_end_ns, cur_[i].dev_end_ns);
        }
      }
    }
  } else {
    for (Event& e : cur_) {
      e.dev_begin_ns = e.cpu_begin_ns;
      e.dev_end_ns = e.cpu_end_ns;
      e.has_device = true;
    }
  }
  aggregate(cur_);
  if (traced_steps_ < max_trace_steps_) {
    trace_.insert(trace_.end(), cur_.begin(), cur_.end());
    ++traced_steps_;
  }
  cur_.clear();
  open_.clear();
}

void Profiler::aggregate(const std::vector<Event>& evs) {
  const Event& step = evs[0];
  StepStat s;
  s.step = step.step;
  s.cpu_ns = step.cpu_end_ns - step.cpu_begin_ns;
  s.dev_span_ns = step.dev_end_ns - step.dev_begin_ns;
  for (const Event& e : evs) {
    if (e.kind != Kind::Op) continue;
    const int64_t cpu = e.cpu_end_ns - e.cpu_begin_ns, dev = e.dev_end_ns - e.dev_begin_ns;
    ++s.ops;
    s.launches += e.launches && timer_ != nullptr;
    s.dev_busy_ns += dev;
    auto op = std::find_if(ops_.begin(), ops_.end(), [&](const OpStat& o) { return o.name == e.name; });
    if (op == ops_.end()) {
      ops_.push_back(OpStat{e.name, 0, 0, 0});
      op = ops_.end() - 1;
    }
    ++op->calls;
    op->cpu_ns += cpu;
    op->dev_ns += dev;
    if (e.layer < 0) continue;
    if (layers_.size() <= static_cast<size_t>(e.layer)) layers_.resize(static_cast<size_t>(e.layer) + 1);
    LayerStat& l = layers_[static_cast<size_t>(e.layer)];
    if (l.layer < 0) {
      const Event& scope = evs[static_cast<size_t>(e.layer_scope)];
      l.layer = e.layer;
      l.name = scope.name;
      l.tag = scope.tag != nullptr ? scope.tag : "";
    }
    ++l.calls;
    l.cpu_ns += cpu;
    l.dev_ns += dev;
    if (e.phase != nullptr && std::strcmp(e.phase, "forward") == 0) l.dev_forward_ns += dev;
    if (e.phase != nullptr && std::strcmp(e.phase, "backward") == 0) l.dev_backward_ns += dev;
  }
  steps_.push_back(s);
}

void Profiler::clear() {
  active_ = false;
  cur_.clear();
  open_.clear();
  trace_.clear();
  steps_.clear();
  ops_.clear();
  layers_.clear();
  traced_steps_ = 0;
}

std::vector<Profiler::OpStat> Profiler::op_stats() const {
  std::vector<OpStat> v = ops_;
  std::stable_sort(v.begin(), v.end(), [](const OpStat& a, const OpStat& b) { return a.dev_ns > b.dev_ns; });
  return v;
}

std::vector<Profiler::LayerStat> Profiler::layer_stats() const {
  std::vector<LayerStat> v;
  for (const LayerStat& l : layers_)
    if (l.layer >= 0) v.push_back(l);
  return v;
}

int64_t Profiler::total_step_ns() const {
  int64_t t = 0;
  for (const StepStat& s : steps_) t += s.dev_span_ns;
  return t;
}

std::string Profiler::report(int top) const {
  std::string out;
  const int64_t n = static_cast<int64_t>(steps_.size());
  if (n == 0) return "profiler: no profiled steps\n";
  StepStat sum;
  for (const StepStat& s : steps_) {
    sum.cpu_ns += s.cpu_ns;
    sum.dev_busy_ns += s.dev_busy_ns;
    sum.dev_span_ns += s.dev_span_ns;
    sum.launches += s.launches;
    sum.ops += s.ops;
  }
  out += "profile: " + std::to_string(n) + " step(s) on " + device_label_ +
         (timer_ != nullptr ? " (device time from device timestamps)\n"
                            : " (synchronous backend: device time = CPU time)\n");
  out += "per step: CPU " + format_ns(sum.cpu_ns / n) + " | device busy " + format_ns(sum.dev_busy_ns / n) +
         " | device idle " + pct(sum.dev_idle_fraction()) + " | kernel launches " + std::to_string(sum.launches / n) +
         " | op calls " + std::to_string(sum.ops / n) + "\n\n";

  Table steps({"Step", "CPU time", "Device busy", "Device idle", "Launches", "Op calls"});
  for (const StepStat& s : steps_)
    steps.add({std::to_string(s.step), format_ns(s.cpu_ns), format_ns(s.dev_busy_ns), pct(s.dev_idle_fraction()),
               std::to_string(s.launches), std::to_string(s.ops)});
  out += steps.str() + "\n";

  const double base = static_cast<double>(std::max<int64_t>(1, total_step_ns()));
  const std::vector<OpStat> ops = op_stats();
  Table t({"Name", "Calls", "CPU total", "CPU avg", "Device total", "Device avg", "% of step"});
  int64_t shown = 0;
  OpStat rest{"(other ops)", 0, 0, 0};
  for (const OpStat& o : ops) {
    if (top > 0 && shown >= top) {
      rest.calls += o.calls;
      rest.cpu_ns += o.cpu_ns;
      rest.dev_ns += o.dev_ns;
      continue;
    }
    ++shown;
    t.add({o.name, std::to_string(o.calls), format_ns(o.cpu_ns), format_ns(o.cpu_ns / o.calls), format_ns(o.dev_ns),
           format_ns(o.dev_ns / o.calls), pct(static_cast<double>(o.dev_ns) / base)});
  }
  if (rest.calls > 0)
    t.add({rest.name, std::to_string(rest.calls), format_ns(rest.cpu_ns), format_ns(rest.cpu_ns / rest.calls),
           format_ns(rest.dev_ns), format_ns(rest.dev_ns / rest.calls), pct(static_cast<double>(rest.dev_ns) / base)});
  int64_t op_cpu = 0, op_dev = 0;
  for (const OpStat& o : ops) {
    op_cpu += o.cpu_ns;
    op_dev += o.dev_ns;
  }
  out += t.str();
  out += "op CPU total " + format_ns(op_cpu) + " | op device total " + format_ns(op_dev) + " | step total " +
         format_ns(total_step_ns()) + " over " + std::to_string(n) + " step(s)\n";

  const std::vector<LayerStat> layers = layer_stats();
  if (!layers.empty()) {
    Table lt({"Layer", "Kind", "Calls", "CPU total", "Device total", "Device fwd", "Device bwd", "% of step"});
    for (const LayerStat& l : layers)
      lt.add({l.name + " " + std::to_string(l.layer), l.tag, std::to_string(l.calls), format_ns(l.cpu_ns),
              format_ns(l.dev_ns), format_ns(l.dev_forward_ns), format_ns(l.dev_backward_ns),
              pct(static_cast<double>(l.dev_ns) / base)});
    out += "\n" + lt.str();
  }
  return out;
}

std::string Profiler::trace_json() const {
  using nlohmann::ordered_json;
  ordered_json evs = ordered_json::array();
  const int pid = 1, cpu_tid = 1, dev_tid = 2;
  evs.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "qwentune"}}}});
  evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", cpu_tid}, {"args", {{"name", "CPU"}}}});
  evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", dev_tid},
                 {"args", {{"name", "device (" + device_label_ + ")"}}}});
  evs.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", cpu_tid}, {"args", {{"sort_index", 0}}}});
  evs.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", dev_tid}, {"args", {{"sort_index", 1}}}});
  for (int track = 0; track < 2; ++track) {
    for (const Event& e : trace_) {
      if (track == 1 && !e.has_device) continue;
      const int64_t b = track == 0 ? e.cpu_begin_ns : e.dev_begin_ns;
      const int64_t d = track == 0 ? e.cpu_end_ns - e.cpu_begin_ns : e.dev_end_ns - e.dev_begin_ns;
      ordered_json args = {{"step", e.step}};
      std::string name, cat;
      if (e.kind == Kind::Step) {
        name = "step " + std::to_string(e.step);
        cat = "step";
      } else if (e.kind == Kind::Scope) {
        name = scope_label(e);
        cat = e.index >= 0 ? "layer" : "phase";
      } else {
        name = e.name;
        cat = "op";
      }
      if (e.layer >= 0) args["layer"] = e.layer;
      if (e.tag != nullptr) args["kind"] = e.tag;
      if (e.phase != nullptr) args["phase"] = e.phase;
      evs.push_back({{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", pid}, {"tid", track == 0 ? cpu_tid : dev_tid},
                     {"ts", to_us(b)}, {"dur", to_us(d)}, {"args", args}});
    }
  }
  ordered_json root = {{"traceEvents", evs}, {"displayTimeUnit", "ms"},
                       {"otherData", {{"device", device_label_}, {"steps", steps_.size()},
                                      {"device_timestamps", timer_ != nullptr}}}};
  return root.dump() + "\n";
}

void Profiler::write_trace(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  QT_CHECK(out.good(), path, ": cannot open for writing");
  out << trace_json();
  out.flush();
  QT_CHECK(out.good(), path, ": write failed");
}

}  // namespace qt::profile
