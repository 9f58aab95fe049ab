#include "model/fp8_projections.h"

#include <algorithm>

#include "core/error.h"

namespace qt {

namespace {
int64_t pad16(int64_t T) { return (T + 15) / 16 * 16; }
// Floats between two scale words: cuBLASLt refuses (NOT_SUPPORTED) scale pointers that are only
// 4-byte aligned, so each gets its own 256 bytes.
constexpr int64_t kScaleStride = 64;
constexpr size_t kTaps = static_cast<size_t>(Fp8Tap::kCount);
const char* tap_name(Fp8Tap t) {
  static const char* const names[] = {"xn", "hn", "act", "dr", "dgate", "dup", "final"};
  return t == Fp8Tap::None ? "none" : names[static_cast<size_t>(t)];
}
}  // namespace

const char* precision_name(Precision p) { return p == Precision::FP8 ? "fp8" : "bf16"; }

Precision precision_from_name(const std::string& name) {
  if (name == "bf16") return Precision::BF16;
  if (name == "fp8") return Precision::FP8;
  QT_FAIL("train.precision '", name, "' is not bf16 or fp8");
}

Fp8Projections::Fp8Projections(Backend& be, int64_t max_tokens) : be_(be), max_tokens_(max_tokens) {}

int Fp8Projections::add(int64_t N, int64_t K) {
  QT_CHECK(eligible(N, K), "fp8 projection [", N, ", ", K, "]: N and K must be multiples of 16");
  QT_CHECK(x_codes_.data == nullptr, "Fp8Projections::add after allocate()");
  w_.push_back({N, K, Tensor(), Tensor(), Tensor()});
  widest_n_ = std::max(widest_n_, N);
  widest_k_ = std::max(widest_k_, K);
  return static_cast<int>(w_.size()) - 1;
}

void Fp8Projections::add_head(int64_t V, int64_t H) {
  QT_CHECK(eligible(V, H), "fp8 LM head [", V, ", ", H, "]: V and H must be multiples of 16");
  QT_CHECK(x_codes_.data == nullptr && !has_head(), "Fp8Projections::add_head twice or after allocate()");
  head_.V = V;
  head_.H = H;
}

int Fp8Projections::add_slot(int64_t K) {
  QT_CHECK(x_codes_.data == nullptr, "Fp8Projections::add_slot after allocate()");
  slots_.push_back({K, Tensor(), Tensor(), Input{}});
  return static_cast<int>(slots_.size()) - 1;
}

void Fp8Projections::allocate() {
  QT_CHECK(!w_.empty(), "Fp8Projections: no projection registered");
  auto planned = [&](DType t, const Shape& s) {
    bytes_ += shape_numel(s) * static_cast<int64_t>(dtype_size(t));
    return be_.alloc(t, s);
  };
  scales_ = planned(DType::F32, {(static_cast<int64_t>(w_.size() + slots_.size()) + 4) * kScaleStride});
  be_.zero(scales_);
  amax_ = planned(DType::F32, {static_cast<int64_t>(kTaps)});
  be_.zero(amax_);  // every quantize leaves its word zero again
  for (size_t i = 0; i < w_.size(); ++i) {
    Weight& w = w_[i];
    w.q = planned(DType::F8E4M3, {w.N, w.K});
    w.q_t = planned(DType::F8E4M3, {w.K, w.N});
    w.scale_inv = scale_word(2 + static_cast<int64_t>(i));
  }
  const int64_t Tp = pad16(max_tokens_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].q_t = planned(DType::F8E4M3, {slots_[i].K * Tp});
    slots_[i].scale_inv = scale_word(2 + static_cast<int64_t>(w_.size() + i));
  }
  x_codes_ = planned(DType::F8E4M3, {Tp * widest_k_});
  dy_codes_ = planned(DType::F8E4M3, {Tp * widest_n_});
  dy_codes_t_ = planned(DType::F8E4M3, {Tp * widest_n_});
  loss_word_ = planned(DType::F64, {1});
  if (has_head()) {
    const int64_t words = static_cast<int64_t>(w_.size() + slots_.size()) + 2;
    head_.wq = planned(DType::F8E4M3, {head_.V, head_.H});
    head_.wq_t = planned(DType::F8E4M3, {head_.H, head_.V});
    head_.hq = planned(DType::F8E4M3, {max_tokens_ * head_.H});
    head_.hq_t = planned(DType::F8E4M3, {head_.H * Tp});
    head_.w_scale_inv = scale_word(words);
    head_.h_scale_inv = scale_word(words + 1);
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::vector<int64_t> widths;
  for (const Weight& w : w_) shapes.push_back({w.N, w.K});
  for (const Slot& sl : slots_) widths.push_back(sl.K);
  QT_CHECK(bytes_ == bytes_for(max_tokens_, shapes, widths, {head_.V, head_.H}),
           "Fp8Projections::bytes_for is out of step with allocate()");
}

int64_t Fp8Projections::bytes_for(int64_t max_tokens, const std::vector<std::pair<int64_t, int64_t>>& weights,
                                  const std::vector<int64_t>& slot_widths, std::pair<int64_t, int64_t> head) {
  int64_t b = ((static_cast<int64_t>(weights.size() + slot_widths.size()) + 4) * kScaleStride + int64_t(kTaps)) * 4 + 8;
  int64_t widest_n = 0, widest_k = 0;
  for (const auto& [N, K] : weights) {
    b += 2 * N * K;
    widest_n = std::max(widest_n, N);
    widest_k = std::max(widest_k, K);
  }
  const int64_t Tp = pad16(max_tokens);
  for (const int64_t K : slot_widths) b += K * Tp;
  b += 2 * head.first * head.second + (max_tokens + Tp) * head.second;
  return b + Tp * (widest_k + 2 * widest_n);
}

Tensor Fp8Projections::view(const Tensor& buf, const Shape& shape) const {
  QT_CHECK(shape_numel(shape) <= buf.numel(), "fp8 scratch ", buf.describe(), " too small for ", shape_str(shape));
  return Tensor(buf.data, buf.dtype, shape, buf.device);
}

Tensor Fp8Projections::scale_word(int64_t i) const {
  return Tensor(scales_.ptr<float>() + i * kScaleStride, DType::F32, {1}, scales_.device);
}

Tensor Fp8Projections::tap(Fp8Tap t) {
  QT_CHECK(t != Fp8Tap::None && amax_.data != nullptr, "Fp8Projections::tap: no tap ", tap_name(t));
  bool& p = pending_[static_cast<size_t>(t)];
  QT_CHECK(!p, "fp8: the amax of ", tap_name(t), " was taken again before a quantize read it");
  p = true;
  return Tensor(amax_.ptr<float>() + static_cast<int64_t>(t), DType::F32, {1}, amax_.device);
}

void Fp8Projections::reset_taps() {
  for (size_t i = 0; i < kTaps; ++i) {
    if (!pending_[i]) continue;
    be_.zero(Tensor(amax_.ptr<float>() + static_cast<int64_t>(i), DType::F32, {1}, amax_.device));
    pending_[i] = false;
  }
}

Tensor Fp8Projections::take(Fp8Tap t) {
  if (t == Fp8Tap::None) return Tensor();
  bool& p = pending_[static_cast<size_t>(t)];
  QT_CHECK(p, "fp8: a quantize reads the amax of ", tap_name(t), ", which no op has folded in since its last read");
  p = false;
  return Tensor(amax_.ptr<float>() + static_cast<int64_t>(t), DType::F32, {1}, amax_.device);
}

void Fp8Projections::quantize_weight(int id, const Tensor& w) {
  Weight& c = w_.at(static_cast<size_t>(id));
  QT_CHECK(w.ndim == 2 && w.size(0) == c.N && w.size(1) == c.K, "fp8 weight codes [", c.N, ", ", c.K, "] for ",
           w.describe());
  be_.quantize_fp8(c.q, c.q_t, c.scale_inv, w, Tensor());
}

void Fp8Projections::quantize_head_weight(const Tensor& w) {
  QT_CHECK(has_head(), "Fp8Projections: no fp8 LM head registered");
  QT_CHECK(w.ndim == 2 && w.size(0) == head_.V && w.size(1) == head_.H, "fp8 LM head codes [", head_.V, ", ", head_.H,
           "] for ", w.describe());
  be_.quantize_fp8(head_.wq, head_.wq_t, head_.w_scale_inv, w, Tensor());
}

Fp8HeadCodes Fp8Projections::head_codes(const Tensor& hidden, Fp8Tap tap) {
  QT_CHECK(has_head(), "Fp8Projections: no fp8 LM head registered");
  QT_CHECK(hidden.ndim == 2 && hidden.size(1) == head_.H && hidden.size(0) <= max_tokens_, "fp8 LM head input ",
           hidden.describe(), " exceeds the planned [", max_tokens_, ", ", head_.H, "]");
  const int64_t T = hidden.size(0);
  const Tensor hq = view(head_.hq, {T, head_.H}), hq_t = view(head_.hq_t, {head_.H, pad16(T)});
  be_.quantize_fp8(hq, hq_t, head_.h_scale_inv, hidden, take(tap));
  return {hq, hq_t, head_.h_scale_inv, head_.wq, head_.wq_t, head_.w_scale_inv};
}

Tensor Fp8Projections::use_input(const Tensor& x, bool transposed, Fp8Tap tap, Slot* slot) {
  QT_CHECK(x.ndim == 2 && x.size(1) <= widest_k_ && x.size(0) <= max_tokens_, "fp8 projection input ", x.describe(),
           " exceeds the planned [", max_tokens_, ", ", widest_k_, "]");
  const Input key{x.data, x.size(0), x.size(1), transposed};
  if (held_ == key && held_slot_ == slot) return held_scale_;
  const int64_t T = x.size(0), K = x.size(1);
  const Tensor amax = take(tap);
  if (transposed) {
    held_scale_ = scale_word(0);
    be_.quantize_fp8(Tensor(), view(x_codes_, {K, pad16(T)}), held_scale_, x, amax);
  } else if (slot != nullptr) {
    QT_CHECK(slot->K == K, "fp8 input slot of width ", slot->K, " given ", x.describe());
    slot->holds = Input{};
    held_scale_ = slot->scale_inv;
    be_.quantize_fp8(view(x_codes_, {T, K}), view(slot->q_t, {K, pad16(T)}), held_scale_, x, amax);
    slot->holds = Input{x.data, T, K, true};
  } else {
    held_scale_ = scale_word(0);
    be_.quantize_fp8(view(x_codes_, {T, K}), Tensor(), held_scale_, x, amax);
  }
  held_ = key;
  held_slot_ = slot;
  return held_scale_;
}

void Fp8Projections::forward(const Tensor& y, const Tensor& x, int id, const Fp8Input& in) {
  const Weight& w = w_.at(static_cast<size_t>(id));
  QT_CHECK(x.ndim == 2 && x.size(1) == w.K, "fp8 forward of [", w.N, ", ", w.K, "]: x is ", x.describe());
  Slot* slot = in.slot >= 0 ? &slots_.at(static_cast<size_t>(in.slot)) : nullptr;
  // Codes this forward does not keep must not be read by a backward: the slot is void until written.
  if (slot != nullptr && !in.write_t) {
    slot->holds = Input{};
    slot = nullptr;
  }
  const Tensor scale = use_input(x, false, in.tap, slot);
  // The forward accumulates in the tensor cores' fast mode (K is a layer width, at most a few
  // thousand); dgrad and wgrad promote to fp32 (wgrad's K is the token count).
  be_.linear_fp8(y, view(x_codes_, {x.size(0), w.K}), scale, w.q, w.scale_inv, false, true);
}

void Fp8Projections::backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, int id,
                              bool accumulate_dx, bool accumulate_dw, Fp8Tap dy_tap, int x_slot) {
  const Weight& w = w_.at(static_cast<size_t>(id));
  QT_CHECK(dy.ndim == 2 && dy.size(1) == w.N, "fp8 backward of [", w.N, ", ", w.K, "]: dy is ", dy.describe());
  const int64_t T = dy.size(0), Tp = pad16(T);
  const bool wgrad = dw.data != nullptr, dgrad = dx.data != nullptr;
  const Tensor dy_amax = take(dy_tap);  // read even when nothing runs: the next producer starts from zero
  if (!wgrad && !dgrad) {
    if (dy_amax.data != nullptr) be_.zero(dy_amax);
    return;
  }
  const Tensor dy_scale = scale_word(1);
  const Tensor dyq = view(dy_codes_, {T, w.N}), dyq_t = view(dy_codes_t_, {w.N, Tp});
  be_.quantize_fp8(dgrad ? dyq : Tensor(), wgrad ? dyq_t : Tensor(), dy_scale, dy, dy_amax);
  if (dgrad) be_.linear_fp8(dx, dyq, dy_scale, w.q_t, w.scale_inv, accumulate_dx, false);
  if (!wgrad) return;
  QT_CHECK(x.ndim == 2 && x.size(0) == T && x.size(1) == w.K, "fp8 wgrad of [", w.N, ", ", w.K, "]: x is ",
           x.describe(), " for dy ", dy.describe());
  if (x_slot >= 0) {
    const Slot& s = slots_.at(static_cast<size_t>(x_slot));
    QT_CHECK(s.holds == (Input{x.data, T, w.K, true}), "fp8 wgrad of [", w.N, ", ", w.K,
             "]: the kept codes of its input were not written from ", x.describe(), " by this pass's forward");
    be_.linear_fp8(dw, dyq_t, dy_scale, view(s.q_t, {w.K, Tp}), s.scale_inv, accumulate_dw, false);
    return;
  }
  const Tensor x_scale = use_input(x, true, Fp8Tap::None, nullptr);
  be_.linear_fp8(dw, dyq_t, dy_scale, view(x_codes_, {w.K, Tp}), x_scale, accumulate_dw, false);
}

}  // namespace qt
