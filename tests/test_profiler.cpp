// The profiler on the CPU backend: op call counts equal what the model executes for a known config,
// layer scopes, the Chrome trace (parses, events nest), a disabled profiler records nothing, and
// device-time resolution through a DeviceTimer.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/qwen35.h"
#include "ops/cpu/cpu_backend.h"
#include "train/step_runner.h"
#include "profile/profiled_backend.h"
#include "test_util.h"

namespace qt {
namespace {

ModelConfig three_layer_config() {  // GDN, GDN, attention
  ModelConfig c = preset_config("tiny");
  c.num_hidden_layers = 3;
  c.full_attention_interval = 3;
  c.layer_types = default_layer_types(3, 3);
  return c;
}

// Op calls of model.zero_grads() + model.step(row, backward=true), derived from the config.
std::map<std::string, int64_t> expected_calls(const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers, La = c.num_full_layers(), Lg = L - La;
  std::map<std::string, int64_t> e;
  e["zero"] = 1;                   // the gradients that accumulate (projections' dW GEMMs write theirs)
  e["copy_from_host"] = 4;         // ids, targets, positions, cu_seqlens
  e["embedding_forward"] = 1;
  e["embedding_backward"] = 1;
  e["rmsnorm_forward"] = 1;          // the first layer's input norm
  // h = x + mixer fused with the post-attention norm; next = h + mlp with the next input norm (the
  // final norm after the last layer)
  e["add_rmsnorm_forward"] = 2 * L;
  e["rmsnorm_backward"] = 2 * L + 1;
  e["linear_forward"] = 5 * Lg + 4 * La + 3 * L;  // GDN qkv/z/b/a/out, attention q/k/v/o, MLP gate/up/down
  e["linear_backward"] = 5 * Lg + 4 * La + 3 * L;
  e["swiglu_forward"] = L;
  e["swiglu_backward"] = L;
  for (const char* op : {"conv1d_silu", "gdn_gates", "gdn", "gated_rmsnorm"}) {
    e[std::string(op) + "_forward"] = Lg;
    e[std::string(op) + "_backward"] = Lg;
  }
  for (const char* op : {"attn_prep", "attention", "attn_gate"}) {
    e[std::string(op) + "_forward"] = La;
    e[std::string(op) + "_backward"] = La;
  }
  e["linear_cross_entropy"] = 1;
  for (auto it = e.begin(); it != e.end();) it = it->second == 0 ? e.erase(it) : std::next(it);
  return e;
}

// Op calls inside one layer (forward + backward) of the given kind.
int64_t expected_layer_calls(LayerKind k) {
  // 2 add_rmsnorm, 3 MLP linears, swiglu (layer 0's input norm runs before its scope)
  const int64_t fwd_common = 2 + 3 + 1;
  const int64_t bwd_common = 2 + 3 + 1;       // 2 rmsnorm, 3 MLP linears, swiglu
  return k == LayerKind::GatedDeltaNet ? fwd_common + 5 + 4 + bwd_common + 5 + 4 : fwd_common + 4 + 3 + bwd_common + 4 + 3;
}

struct Rig {
  CpuBackend cpu;
  ProfiledBackend be;
  Qwen35Model model;
  explicit Rig(const ModelConfig& c, int64_t tokens = 96, profile::DeviceTimer* timer = nullptr)
      : be(cpu, timer), model(c, be, tokens) {
    init_model_random(model, 3);
  }
  void step(int64_t n, const PackedRow& row) {
    be.profiler().begin_step(n);
    model.zero_grads();
    model.step(row, true, 1.0 / double(std::max<int64_t>(1, row.num_trained())));
    be.profiler().end_step();
  }
};

std::map<std::string, int64_t> calls_of(const profile::Profiler& p) {
  std::map<std::string, int64_t> m;
  for (const auto& o : p.op_stats()) m[o.name] = o.calls;
  return m;
}

TEST(Profiler, OpCallsEqualWhatTheModelExecutes) {
  for (const ModelConfig& c : {preset_config("tiny"), three_layer_config()}) {
    Rig rig(c);
    const std::vector<PackedRow> rows = synthetic_chat_rows(c.vocab_size, 96, 2, 7);
    rig.be.profiler().set_enabled(true);
    for (int s = 0; s < 2; ++s) rig.step(s + 1, rows[static_cast<size_t>(s)]);
    std::map<std::string, int64_t> want = expected_calls(c);
    for (auto& kv : want) kv.second *= 2;  // two steps
    EXPECT_EQ(calls_of(rig.be.profiler()), want) << c.num_hidden_layers << " layers";

    const auto& steps = rig.be.profiler().step_stats();
    ASSERT_EQ(steps.size(), 2u);
    int64_t per_step = 0;
    for (const auto& kv : want) per_step += kv.second / 2;
    for (const auto& s : steps) {
      EXPECT_EQ(s.ops, per_step);
      EXPECT_EQ(s.launches, 0);  // CPU backend: nothing is launched
      EXPECT_GT(s.cpu_ns, 0);
      EXPECT_EQ(s.dev_span_ns, s.cpu_ns);  // device time = CPU time without a device timer
      EXPECT_LE(s.dev_busy_ns, s.dev_span_ns);
    }
    int64_t op_dev = 0, op_cpu = 0;
    for (const auto& o : rig.be.profiler().op_stats()) {
      EXPECT_EQ(o.dev_ns, o.cpu_ns) << o.name;
      op_dev += o.dev_ns;
      op_cpu += o.cpu_ns;
    }
    EXPECT_EQ(op_dev, steps[0].dev_busy_ns + steps[1].dev_busy_ns);

    const auto layers = rig.be.profiler().layer_stats();
    ASSERT_EQ(static_cast<int64_t>(layers.size()), c.num_hidden_layers);
    for (const auto& l : layers) {
      const LayerKind k = c.layer_types[static_cast<size_t>(l.layer)];
      EXPECT_EQ(l.calls, 2 * expected_layer_calls(k)) << "layer " << l.layer;
      EXPECT_EQ(l.tag, layer_kind_name(k));
      EXPECT_EQ(l.dev_forward_ns + l.dev_backward_ns, l.dev_ns);
      EXPECT_GT(l.dev_forward_ns, 0);
      EXPECT_GT(l.dev_backward_ns, 0);
    }

    const std::string report = rig.be.profiler().report(5);
    EXPECT_NE(report.find("Name"), std::string::npos);
    EXPECT_NE(report.find("% of step"), std::string::npos);
    EXPECT_NE(report.find("(other ops)"), std::string::npos);  // top 5 of more ops
    EXPECT_NE(report.find("layer 0"), std::string::npos);
  }
}

struct TraceEvent {
  std::string name, cat;
  int tid;
  double ts, end;
  int64_t step;
  int layer;
};

TEST(Profiler, TraceParsesAndEventsNest) {
  const ModelConfig c = preset_config("tiny");
  Rig rig(c);
  const std::vector<PackedRow> rows = synthetic_chat_rows(c.vocab_size, 96, 2, 1);
  rig.be.profiler().set_enabled(true);
  rig.step(1, rows[0]);
  rig.step(2, rows[1]);
  const nlohmann::json j = nlohmann::json::parse(rig.be.profiler().trace_json());
  ASSERT_TRUE(j.contains("traceEvents") && j["traceEvents"].is_array());
  std::vector<TraceEvent> evs;
  std::map<int, std::string> threads;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"));
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") threads[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["dur"].get<double>() >= 0);
    const auto& a = e["args"];
    evs.push_back({e["name"].get<std::string>(), e["cat"].get<std::string>(), e["tid"].get<int>(), e["ts"].get<double>(),
                   e["ts"].get<double>() + e["dur"].get<double>(), a["step"].get<int64_t>(),
                   a.contains("layer") ? a["layer"].get<int>() : -1});
  }
  ASSERT_EQ(threads.size(), 2u);  // a CPU track and a device track
  EXPECT_EQ(threads[1], "CPU");
  const double eps = 1e-6;  // microseconds; times are written with nanosecond resolution
  auto inside = [&](const TraceEvent& in, const TraceEvent& out) {
    return in.ts >= out.ts - eps && in.end <= out.end + eps;
  };
  int64_t ops_checked = 0;
  for (int tid : {1, 2}) {
    std::vector<TraceEvent> track;
    for (const auto& e : evs)
      if (e.tid == tid) track.push_back(e);
    ASSERT_FALSE(track.empty());
    // Every op of a layer lies inside that layer's scope event of the same step, on its own track.
    for (const auto& op : track) {
      if (op.cat != "op") continue;
      const auto step = std::find_if(track.begin(), track.end(), [&](const TraceEvent& s) {
        return s.cat == "step" && s.step == op.step;
      });
      ASSERT_NE(step, track.end());
      EXPECT_TRUE(inside(op, *step)) << op.name;
      if (op.layer < 0) continue;
      int containing = 0;
      for (const auto& l : track)
        if (l.cat == "layer" && l.step == op.step && l.layer == op.layer && inside(op, l)) ++containing;
      EXPECT_EQ(containing, 1) << op.name << " of layer " << op.layer << " on track " << tid;
      ++ops_checked;
    }
    // No partial overlaps anywhere on a track: sorted by start (longer first), intervals form a stack.
    std::sort(track.begin(), track.end(), [](const TraceEvent& a, const TraceEvent& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.end > b.end;
    });
    std::vector<TraceEvent> stack;
    for (const auto& e : track) {
      while (!stack.empty() && stack.back().end <= e.ts + eps && !inside(e, stack.back())) stack.pop_back();
      if (!stack.empty()) {
        EXPECT_TRUE(inside(e, stack.back())) << e.name << " overlaps " << stack.back().name;
      }
      stack.push_back(e);
    }
  }
  EXPECT_GT(ops_checked, 0);
}

TEST(Profiler, DisabledRecordsNothing) {
  const ModelConfig c = preset_config("tiny");
  Rig rig(c);
  const std::vector<PackedRow> rows = synthetic_chat_rows(c.vocab_size, 96, 1, 1);
  EXPECT_FALSE(rig.be.profiler().enabled());
  rig.step(1, rows[0]);
  const profile::Profiler& p = rig.be.profiler();
  EXPECT_FALSE(p.active());
  EXPECT_TRUE(p.op_stats().empty());
  EXPECT_TRUE(p.layer_stats().empty());
  EXPECT_TRUE(p.step_stats().empty());
  EXPECT_TRUE(p.trace_events().empty());
  // Turning it on later records only what runs after.
  rig.be.profiler().set_enabled(true);
  rig.step(2, rows[0]);
  rig.be.profiler().set_enabled(false);
  rig.step(3, rows[0]);
  EXPECT_EQ(p.step_stats().size(), 1u);
  EXPECT_EQ(p.step_stats()[0].step, 2);
}

TEST(Profiler, ModelOnRawBackendHasNoProfiler) {
  CpuBackend cpu;
  ProfiledBackend be(cpu);
  EXPECT_EQ(profile::attached_profiler(cpu), nullptr);
  EXPECT_EQ(profile::attached_profiler(be), &be.profiler());
  EXPECT_EQ(&profile::unwrap_backend(be), &cpu);
  EXPECT_EQ(&profile::unwrap_backend(cpu), &cpu);
  profile::Scope s(nullptr, "layer", 0);  // a null profiler: a no-op
}

// Device marks 1 us apart: each op spans exactly its two marks.
class FakeTimer : public profile::DeviceTimer {
 public:
  int device_mark() override { return marks_++; }
  std::vector<int64_t> device_resolve() override {
    std::vector<int64_t> t;
    for (int i = 0; i < marks_; ++i) t.push_back(5000000 + 1000 * int64_t{i});
    marks_ = 0;
    return t;
  }

 private:
  int marks_ = 0;
};

TEST(Profiler, DeviceTimerGivesDeviceTimesAndLaunches) {
  const ModelConfig c = preset_config("tiny");
  FakeTimer timer;
  Rig rig(c, 96, &timer);
  ASSERT_TRUE(rig.be.profiler().has_device_timer());
  const std::vector<PackedRow> rows = synthetic_chat_rows(c.vocab_size, 96, 1, 1);
  rig.be.profiler().set_enabled(true);
  rig.step(1, rows[0]);
  const auto& s = rig.be.profiler().step_stats().at(0);
  const auto want = expected_calls(c);
  const int64_t memory_ops = want.at("zero") + want.at("copy_from_host");
  EXPECT_EQ(s.dev_busy_ns, 1000 * s.ops);              // every op: 1 us between its marks
  EXPECT_EQ(s.dev_span_ns, 1000 * (2 * s.ops + 1));    // step marks around 2 marks per op
  EXPECT_EQ(s.launches, s.ops - memory_ops);           // zero and host copies are not launches
  EXPECT_NEAR(s.dev_idle_fraction(), 1.0 - double(s.ops) / double(2 * s.ops + 1), 1e-12);
  for (const auto& o : rig.be.profiler().op_stats()) EXPECT_EQ(o.dev_ns, 1000 * o.calls) << o.name;
}

TEST(Profiler, StepRangeParsing) {
  int64_t a = 0, b = 0;
  profile::parse_step_range("3:7", a, b);
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 7);
  EXPECT_ERROR_CONTAINS([&] { profile::parse_step_range("7:3", a, b); }, "1 <= A <= B");
  EXPECT_ERROR_CONTAINS([&] { profile::parse_step_range("5", a, b); }, "expected A:B");
  EXPECT_ERROR_CONTAINS([&] { profile::parse_step_range("x:2", a, b); }, "expected A:B");
}

}  // namespace
}  // namespace qt
