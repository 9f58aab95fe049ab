// The op table's test: one registered row per op of ops/backend_ops.def, run two ways.
//   OpTable.FiniteDifferences (every build, CI): on the fp32 CPU reference, every gradient an op's
//     backward writes is checked against central differences of the loss sum(output * d_output) at
//     sampled elements.
//   OpTable.CudaMatchesCpu (GPU builds, skipped without a device): the CUDA backend against the CPU
//     reference on the same bf16-rounded inputs, at odd token counts with varlen rows (1- and 2-token
//     samples, then a long one), forward and backward; every CUDA output is followed by a sentinel
//     guard that must stay untouched, NaN/inf fail, and the tolerance is precision-derived:
//       max|cuda - ref| <= k * max|bf16(ref) - ref| + max|ref| / 1024 + 1e-6
//     (k = 2 where only the output is rounded to bf16, more where the kernel rounds an intermediate).
// A new op adds one row here (its tensors, its forward, its backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/splitmix.h"
#include "ops/backend_factory.h"
#include "ops/cpu/cpu_backend.h"

namespace qt {
namespace {

constexpr int64_t kGuard = 64;  // elements after every device output
constexpr uint32_t kSentinel = 0x4b1d4b1du;

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

enum class Role { In, Ids, Out, GradIn, GradOut };

// One tensor of a case: its role, shape, the dtype it has on the device (the CPU reference keeps
// every float tensor in f32) and its host values (inputs; zero for outputs).
struct TensorSpec {
  Role role;
  Shape shape;
  DType device_dtype = DType::BF16;
  std::vector<float> values;  // In, GradIn (bf16-rounded), Out/GradOut (initial: zeros)
  std::vector<int32_t> ids;   // Ids
};

// What a row declares for one token count: the tensors by name and the sequence layout.
class CaseSpec {
 public:
  CaseSpec(int64_t T, uint64_t seed) : T_(T), rng_{seed * 0x2545f4914f6cdd1dull + 7} {}
  int64_t T() const { return T_; }
  void in(const std::string& name, const Shape& s, float lo = -1.0f, float hi = 1.0f, DType dt = DType::BF16) {
    TensorSpec& t = add(name, Role::In, s, dt);
    for (float& x : t.values) x = round_bf16(lo + (hi - lo) * static_cast<float>(rng_.uniform()));
  }
  void ids(const std::string& name, const Shape& s, int64_t below, double ignored_share = 0.0) {
    TensorSpec& t = add(name, Role::Ids, s, DType::I32);
    t.values.clear();
    t.ids.resize(static_cast<size_t>(shape_numel(s)));
    for (int32_t& v : t.ids)
      v = rng_.uniform() < ignored_share ? -100 : static_cast<int32_t>(rng_.below(static_cast<uint64_t>(below)));
  }
  void out(const std::string& name, const Shape& s, DType dt = DType::BF16) { add(name, Role::Out, s, dt); }
  // The upstream gradient of output `of` ("d" + of), random.
  void grad_in(const std::string& of, float scale = 1.0f) {
    const TensorSpec& o = tensors_.at(of);
    TensorSpec& t = add("d" + of, Role::GradIn, o.shape, o.device_dtype);
    for (float& x : t.values) x = round_bf16(scale * (2.0f * static_cast<float>(rng_.uniform()) - 1.0f));
  }
  // The gradient of input `of` ("d" + of) the backward writes (starting from zeros).
  void grad_out(const std::string& of, DType dt = DType::BF16) {
    add("d" + of, Role::GradOut, tensors_.at(of).shape, dt);
  }
  // Packed samples over the T tokens: short ones (1 and 2 tokens among them), then a long one.
  void varlen() {
    const int pattern[] = {1, 2, 1, 3, 2, 1, 5, 2, 4, 1, 2, 7, 3};
    cu_ = {0};
    int64_t at = 0;
    for (int len : pattern) {
      if (at + len >= T_ || (T_ < 40 && at > T_ / 2)) break;
      at += len;
      cu_.push_back(static_cast<int32_t>(at));
    }
    cu_.push_back(static_cast<int32_t>(T_));
  }
  const std::map<std::string, TensorSpec>& tensors() const { return tensors_; }
  std::map<std::string, TensorSpec>& tensors() { return tensors_; }
  const std::vector<int32_t>& cu() const { return cu_; }

 private:
  TensorSpec& add(const std::string& name, Role r, const Shape& s, DType dt) {
    TensorSpec t{r, s, dt, std::vector<float>(static_cast<size_t>(shape_numel(s)), 0.0f), {}};
    auto [it, fresh] = tensors_.emplace(name, std::move(t));
    EXPECT_TRUE(fresh) << "tensor " << name << " declared twice";
    return it->second;
  }
  int64_t T_;
  SplitMix64 rng_;
  std::map<std::string, TensorSpec> tensors_;
  std::vector<int32_t> cu_;
};

// A case instantiated on one backend: its tensors (device outputs with a guard after them).
class Case {
 public:
  Case(Backend& be, const CaseSpec& spec) : be(be), device_(be.device().kind == DeviceKind::CUDA) {
    for (const auto& [name, ts] : spec.tensors()) {
      const DType dt = ts.role == Role::Ids ? DType::I32 : device_ ? ts.device_dtype : DType::F32;
      const int64_t n = shape_numel(ts.shape);
      const bool guarded = device_ && (ts.role == Role::Out || ts.role == Role::GradOut);
      Tensor full = be.alloc(dt, {n + (guarded ? kGuard : 0)});
      if (guarded) fill_sentinel(full);
      Tensor t(full.data, dt, ts.shape, full.device);
      if (ts.role == Role::Ids) be.copy_from_host(t, ts.ids.data());
      else upload(t, ts.values);
      tensors_[name] = {t, full, guarded};
    }
    if (!spec.cu().empty()) {
      const int n = static_cast<int>(spec.cu().size()) - 1;
      cu_ = be.alloc(DType::I32, {n + 1});
      be.copy_from_host(cu_, spec.cu().data());
      int longest = 0;
      for (int i = 0; i < n; ++i) longest = std::max(longest, spec.cu()[size_t(i) + 1] - spec.cu()[size_t(i)]);
      seqs = SeqInfo{cu_, n, longest, static_cast<int>(spec.T())};
    }
  }
  const Tensor& operator[](const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw std::runtime_error("op table: no tensor " + name);
    return it->second.t;
  }
  std::vector<float> download(const std::string& name) {
    const Tensor& t = (*this)[name];
    std::vector<float> out(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::BF16) {
      std::vector<bf16> h(out.size());
      be.copy_to_host(h.data(), t);
      for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_float(h[i]);
    } else {
      be.copy_to_host(out.data(), t);
    }
    return out;
  }
  // Index of the first guard element that was overwritten, or -1.
  int64_t guard_damage(const std::string& name) {
    const Slot& s = tensors_.at(name);
    if (!s.guarded) return -1;
    const size_t es = dtype_size(s.t.dtype), n = static_cast<size_t>(s.t.numel());
    std::vector<uint8_t> raw(static_cast<size_t>(s.full.numel()) * es);
    be.copy_to_host(raw.data(), s.full);
    for (int64_t i = 0; i < kGuard; ++i)
      if (std::memcmp(raw.data() + (n + size_t(i)) * es, &kSentinel, es) != 0) return i;
    return -1;
  }

  Backend& be;
  SeqInfo seqs;
  double scalar = 0;  // an op's returned value (the cross-entropy's loss sum)

 private:
  struct Slot {
    Tensor t, full;
    bool guarded = false;
  };
  void upload(const Tensor& t, const std::vector<float>& v) {
    if (t.dtype == DType::BF16) {
      std::vector<bf16> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
      be.copy_from_host(t, h.data());
    } else {
      be.copy_from_host(t, v.data());
    }
  }
  void fill_sentinel(const Tensor& full) {
    std::vector<uint8_t> h(full.nbytes());
    const size_t es = dtype_size(full.dtype);
    for (size_t i = 0; i < h.size(); i += es) std::memcpy(h.data() + i, &kSentinel, es);
    be.copy_from_host(full, h.data());
  }
  bool device_;
  std::map<std::string, Slot> tensors_;
  Tensor cu_;
};

struct OpRow {
  const char* op;  // the backend_ops.def names it exercises
  std::function<void(CaseSpec&)> declare;
  std::function<void(Case&)> forward;
  std::function<void(Case&)> backward;  // null: forward only
  double k = 2.0;                       // CUDA tolerance factor (see the header)
  bool scalar_loss = false;             // FD loss is Case::scalar (the op returns its loss)
  std::vector<int64_t> fd_tokens = {5, 13};
  std::vector<int64_t> cuda_tokens = {1, 7, 133, 1021};
};

const GdnDims kGdn{2, 4, 16, 16};  // 2 key heads, 4 value heads (GQA), dk = dv = 16
AttnDims attn_dims(int64_t head_dim) { return AttnDims{4, 2, head_dim, head_dim / 2, 10000.0}; }

const std::vector<OpRow>& op_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r;
    r.push_back({"add",
                 [](CaseSpec& s) {
                   s.in("a", {s.T(), 40});
                   s.in("b", {s.T(), 40});
                   s.out("y", {s.T(), 40});
                 },
                 [](Case& c) { c.be.add(c["y"], c["a"], c["b"]); }, nullptr});
    r.push_back({"linear_forward/backward",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 72});
                   s.in("w", {40, 72});
                   s.out("y", {s.T(), 40});
                   s.grad_in("y");
                   s.grad_out("x");
                   s.grad_out("w", DType::F32);
                 },
                 [](Case& c) { c.be.linear_forward(c["y"], c["x"], c["w"]); },
                 [](Case& c) { c.be.linear_backward(c["dx"], c["dw"], c["dy"], c["x"], c["w"], false, false); }});
    r.push_back({"lora_forward/backward",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 48});
                   s.in("a", {8, 48});
                   s.in("b", {40, 8});
                   s.out("y", {s.T(), 40});
                   s.out("t", {s.T(), 8});
                   s.grad_in("y");
                   s.grad_out("x");
                   s.grad_out("a", DType::F32);
                   s.grad_out("b", DType::F32);
                   s.out("dt", {s.T(), 8});
                 },
                 [](Case& c) { c.be.lora_forward(c["y"], c["t"], c["x"], {c["a"], c["b"], 0.75}); },
                 [](Case& c) {
                   c.be.lora_backward(c["dx"], {c["da"], c["db"], false}, c["dt"], c["dy"], c["x"], c["t"],
                                      {c["a"], c["b"], 0.75});
                 },
                 3.0});
    r.push_back({"embedding_forward/backward",
                 [](CaseSpec& s) {
                   s.in("table", {50, 24});
                   s.ids("ids", {s.T()}, 50);
                   s.out("y", {s.T(), 24});
                   s.grad_in("y");
                   s.grad_out("table", DType::F32);
                 },
                 [](Case& c) { c.be.embedding_forward(c["y"], c["table"], c["ids"]); },
                 [](Case& c) { c.be.embedding_backward(c["dtable"], c["dy"], c["ids"]); }});
    r.push_back({"rmsnorm_forward/backward",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 96}, -3, 3);
                   s.in("w", {96}, -0.5, 0.5);
                   s.out("y", {s.T(), 96});
                   s.out("rstd", {s.T()}, DType::F32);
                   s.grad_in("y");
                   s.grad_out("x");
                   s.grad_out("w", DType::F32);
                 },
                 [](Case& c) { c.be.rmsnorm_forward(c["y"], c["rstd"], c["x"], c["w"], 1e-6, Tensor()); },
                 [](Case& c) { c.be.rmsnorm_backward(c["dx"], c["dw"], c["dy"], c["x"], c["w"], c["rstd"], false, Tensor()); }});
    r.push_back({"add_rmsnorm_forward",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 96}, -2, 2);
                   s.in("r", {s.T(), 96}, -2, 2);
                   s.in("w", {96}, -0.5, 0.5);
                   s.out("h", {s.T(), 96});
                   s.out("y", {s.T(), 96});
                   s.out("rstd", {s.T()}, DType::F32);
                 },
                 [](Case& c) { c.be.add_rmsnorm_forward(c["h"], c["y"], c["rstd"], c["x"], c["r"], c["w"], 1e-6, Tensor()); },
                 nullptr, 4.0});  // y normalizes the bf16-rounded h on the device
    r.push_back({"swiglu_forward/backward",
                 [](CaseSpec& s) {
                   s.in("gate", {s.T(), 56}, -3, 3);
                   s.in("up", {s.T(), 56});
                   s.out("h", {s.T(), 56});
                   s.grad_in("h");
                   s.grad_out("gate");
                   s.grad_out("up");
                 },
                 [](Case& c) { c.be.swiglu_forward(c["h"], c["gate"], c["up"], Tensor()); },
                 [](Case& c) { c.be.swiglu_backward(c["dgate"], c["dup"], c["dh"], c["gate"], c["up"], Tensor(), Tensor()); }});
    r.push_back({"dropout",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 40});
                   s.ids("seed", {2}, 1 << 30);
                   s.out("y", {s.T(), 40});
                 },
                 [](Case& c) { c.be.dropout(c["y"], c["x"], {c["seed"], 3, 0.25}, false); }, nullptr});
    r.push_back({"conv1d_silu_forward/backward",
                 [](CaseSpec& s) {
                   s.varlen();
                   s.in("x", {s.T(), 48}, -2, 2);
                   s.in("w", {48, 4}, -0.7, 0.7);
                   s.out("y", {s.T(), 48});
                   s.grad_in("y");
                   s.grad_out("x");
                   s.grad_out("w", DType::F32);
                 },
                 [](Case& c) { c.be.conv1d_silu_forward(c["y"], c["x"], c["w"], c.seqs); },
                 [](Case& c) { c.be.conv1d_silu_backward(c["dx"], c["dw"], c["dy"], c["x"], c["w"], c.seqs); }});
    r.push_back({"gdn_gates_forward/backward",
                 [](CaseSpec& s) {
                   s.in("b", {s.T(), 6}, -3, 3);
                   s.in("a", {s.T(), 6}, -3, 3);
                   s.in("a_log", {6}, -1, 1);
                   s.in("dt_bias", {6}, -1, 1);
                   s.out("beta", {s.T(), 6}, DType::F32);
                   s.out("g", {s.T(), 6}, DType::F32);
                   s.grad_in("beta");
                   s.grad_in("g");
                   s.grad_out("b");
                   s.grad_out("a");
                   s.grad_out("a_log", DType::F32);
                   s.grad_out("dt_bias", DType::F32);
                 },
                 [](Case& c) { c.be.gdn_gates_forward(c["beta"], c["g"], c["b"], c["a"], c["a_log"], c["dt_bias"]); },
                 [](Case& c) {
                   c.be.gdn_gates_backward(c["db"], c["da"], c["da_log"], c["ddt_bias"], c["dbeta"], c["dg"], c["b"],
                                           c["a"], c["a_log"], c["dt_bias"]);
                 }});
    r.push_back({"gdn_forward/backward",
                 [](CaseSpec& s) {
                   s.varlen();
                   s.in("qkv", {s.T(), kGdn.conv_dim()}, -1, 1);
                   s.in("g", {s.T(), kGdn.num_v_heads}, -0.7f, -0.01f, DType::F32);
                   s.in("beta", {s.T(), kGdn.num_v_heads}, 0.05f, 0.95f, DType::F32);
                   s.out("o", {s.T(), kGdn.num_v_heads, kGdn.v_head_dim});
                   s.grad_in("o");
                   s.grad_out("qkv");
                   s.grad_out("g", DType::F32);
                   s.grad_out("beta", DType::F32);
                 },
                 [](Case& c) { c.be.gdn_forward(c["o"], c["qkv"], c["g"], c["beta"], kGdn, c.seqs, Tensor(), GdnKeep::States); },
                 [](Case& c) {
                   c.be.gdn_backward(c["dqkv"], c["dg"], c["dbeta"], c["do"], c["qkv"], c["g"], c["beta"], kGdn, c.seqs,
                                     Tensor(), GdnKeep::States);
                 },
                 4.0});
    r.push_back({"gated_rmsnorm_forward/backward",
                 [](CaseSpec& s) {
                   s.in("x", {s.T(), 4, 32}, -2, 2);
                   s.in("z", {s.T(), 4, 32}, -2, 2);
                   s.in("w", {32}, 0.5, 1.5);
                   s.out("y", {s.T(), 4, 32});
                   s.out("rstd", {s.T() * 4}, DType::F32);
                   s.grad_in("y");
                   s.grad_out("x");
                   s.grad_out("z");
                   s.grad_out("w", DType::F32);
                 },
                 [](Case& c) { c.be.gated_rmsnorm_forward(c["y"], c["rstd"], c["x"], c["z"], c["w"], 1e-6); },
                 [](Case& c) {
                   c.be.gated_rmsnorm_backward(c["dx"], c["dz"], c["dw"], c["dy"], c["x"], c["z"], c["w"], c["rstd"]);
                 }});
    for (int64_t D : {int64_t(64), int64_t(128), int64_t(256)}) {
      OpRow prep{"attn_prep_forward/backward",
                 [D](CaseSpec& s) {
                   const AttnDims d = attn_dims(D);
                   s.in("qg", {s.T(), d.num_q_heads * 2 * D}, -2, 2);
                   s.in("kr", {s.T(), d.num_kv_heads * D}, -2, 2);
                   s.in("q_norm_w", {D}, -0.5, 0.5);
                   s.in("k_norm_w", {D}, -0.5, 0.5);
                   s.ids("positions", {s.T()}, 4000);
                   s.out("q", {s.T(), d.num_q_heads, D});
                   s.out("k", {s.T(), d.num_kv_heads, D});
                   s.out("gate", {s.T(), d.num_q_heads * D});
                   s.out("q_rstd", {s.T() * d.num_q_heads}, DType::F32);
                   s.out("k_rstd", {s.T() * d.num_kv_heads}, DType::F32);
                   s.grad_in("q");
                   s.grad_in("k");
                   s.grad_in("gate");
                   s.grad_out("qg");
                   s.grad_out("kr");
                   s.grad_out("q_norm_w", DType::F32);
                   s.grad_out("k_norm_w", DType::F32);
                 },
                 [D](Case& c) {
                   c.be.attn_prep_forward(c["q"], c["k"], c["gate"], c["q_rstd"], c["k_rstd"], c["qg"], c["kr"],
                                          c["q_norm_w"], c["k_norm_w"], c["positions"], attn_dims(D), 1e-6);
                 },
                 [D](Case& c) {
                   c.be.attn_prep_backward(c["dqg"], c["dkr"], c["dq_norm_w"], c["dk_norm_w"], c["dq"], c["dk"],
                                           c["dgate"], c["qg"], c["kr"], c["q_norm_w"], c["k_norm_w"], c["q_rstd"],
                                           c["k_rstd"], c["positions"], attn_dims(D));
                 },
                 3.0};
      if (D != 64) prep.fd_tokens = {5};
      r.push_back(prep);
      OpRow attn{"attention_forward/backward",
                 [D](CaseSpec& s) {
                   const AttnDims d = attn_dims(D);
                   s.varlen();
                   s.in("q", {s.T(), d.num_q_heads, D});
                   s.in("k", {s.T(), d.num_kv_heads, D});
                   s.in("v", {s.T(), d.num_kv_heads, D});
                   s.out("o", {s.T(), d.num_q_heads, D});
                   s.out("lse", {d.num_q_heads, s.T()}, DType::F32);
                   s.grad_in("o");
                   s.grad_out("q");
                   s.grad_out("k");
                   s.grad_out("v");
                 },
                 [D](Case& c) { c.be.attention_forward(c["o"], c["lse"], c["q"], c["k"], c["v"], attn_dims(D), c.seqs); },
                 [D](Case& c) {
                   c.be.attention_backward(c["dq"], c["dk"], c["dv"], c["do"], c["q"], c["k"], c["v"], c["o"], c["lse"],
                                           attn_dims(D), c.seqs);
                 },
                 4.0};
      if (D != 64) attn.fd_tokens = {7};
      r.push_back(attn);
    }
    r.push_back({"attn_gate_forward/backward",
                 [](CaseSpec& s) {
                   s.in("o", {s.T(), 64});
                   s.in("gate", {s.T(), 64}, -3, 3);
                   s.out("y", {s.T(), 64});
                   s.grad_in("y");
                   s.grad_out("o");
                   s.grad_out("gate");
                 },
                 [](Case& c) { c.be.attn_gate_forward(c["y"], c["o"], c["gate"]); },
                 [](Case& c) { c.be.attn_gate_backward(c["do"], c["dgate"], c["dy"], c["o"], c["gate"]); }});
    OpRow ce{"linear_cross_entropy",
             [](CaseSpec& s) {
               s.in("hidden", {s.T(), 48}, -2, 2);
               s.in("w", {1001, 48}, -0.5, 0.5);
               s.ids("targets", {s.T()}, 1001, 0.2);
               s.out("token_loss", {s.T()}, DType::F32);
               s.grad_out("hidden");
               s.grad_out("w", DType::F32);
             },
             [](Case& c) {
               c.scalar = c.be.linear_cross_entropy(Tensor(), Tensor(), c["token_loss"], c["hidden"], c["w"], c["targets"],
                                                    1.0, false);
             },
             [](Case& c) {
               c.scalar = c.be.linear_cross_entropy(c["dhidden"], c["dw"], c["token_loss"], c["hidden"], c["w"],
                                                    c["targets"], 1.0, false);
             },
             4.0, true};
    ce.cuda_tokens = {1, 133, 300};
    r.push_back(ce);
    return r;
  }();
  return rows;
}

// ---- finite differences on the CPU reference ---------------------------------------------------

// sum over the outputs that have an upstream gradient of output * d_output (double), or the op's
// returned loss.
double fd_loss(const OpRow& row, const CaseSpec& spec, Case& c) {
  if (row.scalar_loss) return c.scalar;
  double loss = 0;
  for (const auto& [name, ts] : spec.tensors()) {
    if (ts.role != Role::GradIn) continue;
    const std::vector<float> out = c.download(name.substr(1));
    for (size_t i = 0; i < out.size(); ++i) loss += double(out[i]) * double(ts.values[i]);
  }
  return loss;
}

TEST(OpTable, FiniteDifferences) {
  uint64_t seed = 1;
  int64_t probes = 0;
  for (const OpRow& row : op_rows()) {
    if (!row.backward) continue;
    for (int64_t T : row.fd_tokens) {
      SCOPED_TRACE(std::string(row.op) + ", T " + std::to_string(T));
      CaseSpec spec(T, seed++);
      row.declare(spec);
      CpuBackend cpu;
      Case base(cpu, spec);
      row.forward(base);
      row.backward(base);
      SplitMix64 pick{seed * 77};
      for (const auto& [gname, gs] : spec.tensors()) {
        if (gs.role != Role::GradOut) continue;
        const std::string input = gname.substr(1);
        if (!spec.tensors().count(input)) continue;  // a scratch output such as LoRA's dt
        const std::vector<float> analytic = base.download(gname);
        double scale = 0;
        for (float g : analytic) scale = std::max(scale, std::fabs(double(g)));
        for (int probe = 0; probe < 6; ++probe) {
          const size_t i = static_cast<size_t>(pick.below(analytic.size()));
          const float x0 = spec.tensors().at(input).values[i];
          const float eps = 1e-2f * std::max(1.0f, std::fabs(x0));
          double loss[2];
          for (int side = 0; side < 2; ++side) {
            CaseSpec moved = spec;
            moved.tensors().at(input).values[i] = x0 + (side ? eps : -eps);
            CpuBackend be;
            Case c(be, moved);
            row.forward(c);
            loss[side] = fd_loss(row, moved, c);
          }
          const double fd = (loss[1] - loss[0]) / (2.0 * double(eps));
          ++probes;
          EXPECT_NEAR(analytic[i], fd, 2e-2 * std::fabs(fd) + 5e-3 * scale + 1e-4)
              << "d" << input << "[" << i << "]: backward " << analytic[i] << ", finite difference " << fd;
        }
      }
    }
  }
  EXPECT_GE(probes, 6 * 40) << "every gradient of every row is probed";
}

// ---- the CUDA backend against the CPU reference ------------------------------------------------

void expect_close(const std::string& what, Case& dev, Case& ref, double k) {
  SCOPED_TRACE(what);
  const int64_t damaged = dev.guard_damage(what);
  ASSERT_EQ(damaged, -1) << what << ": guard element " << damaged << " after the output was overwritten";
  const std::vector<float> got = dev.download(what), want = ref.download(what);
  double err = 0, err_bf16 = 0, ref_max = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
    ASSERT_TRUE(std::isfinite(want[i])) << what << " reference[" << i << "] = " << want[i];
    const double e = std::fabs(double(got[i]) - want[i]);
    if (e > err) {
      err = e;
      worst = i;
    }
    err_bf16 = std::max(err_bf16, std::fabs(double(round_bf16(want[i])) - want[i]));
    ref_max = std::max(ref_max, std::fabs(double(want[i])));
  }
  const double tol = k * err_bf16 + ref_max / 1024.0 + 1e-6;
  EXPECT_LE(err, tol) << what << ": max error " << err << " at " << worst << " (device " << got[worst] << ", ref "
                      << want[worst] << "); bf16 rounding of the reference " << err_bf16 << ", k " << k;
}

TEST(OpTable, CudaMatchesCpu) {
  if (default_backend_name() != "cuda") GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Backend> gpu = make_backend("cuda");
  uint64_t seed = 1000;
  for (const OpRow& row : op_rows()) {
    for (int64_t T : row.cuda_tokens) {
      SCOPED_TRACE(std::string(row.op) + ", T " + std::to_string(T));
      CaseSpec spec(T, seed++);
      row.declare(spec);
      CpuBackend cpu;
      Case ref(cpu, spec), dev(*gpu, spec);
      row.forward(ref);
      row.forward(dev);
      if (row.scalar_loss) {
        EXPECT_NEAR(dev.scalar, ref.scalar, 1e-4 * std::fabs(ref.scalar) + 1e-3);
      }
      if (row.backward) {
        row.backward(ref);
        row.backward(dev);
      }
      for (const auto& [name, ts] : spec.tensors())
        if (ts.role == Role::Out || ts.role == Role::GradOut) expect_close(name, dev, ref, row.k);
    }
  }
}

}  // namespace
}  // namespace qt
