// train.precision: fp8 (docs/fp8.md): the decoder projections' forward, dgrad and wgrad as e4m3
// GEMMs with per-tensor current scaling. This owns the weights' codes (row-major for the forward,
// transposed for dgrad, one scale each), the scratch codes of the projection input and the output
// gradient in flight, the kept transposed codes of the inputs the backward's wgrad reads, and the
// amax words the ops producing GEMM inputs fold their max|.| into; the model decides which
// projections run here, which inputs are kept and when the weight codes are refreshed
// (Qwen35Model::fp8_refresh).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/backend.h"

namespace qt {

enum class Precision { BF16, FP8 };
const char* precision_name(Precision p);
Precision precision_from_name(const std::string& name);  // bf16|fp8, else an error naming the value

// The tensors whose producer folds in their amax (its amax output) for the quantize that reads
// them next: the projection inputs and output gradients the model taps.
enum class Fp8Tap { None = -1, Xn, Hn, Act, Dr, Dgate, Dup, Final, kCount };  // Final: the head's input

// How a projection's input reaches its codes: tap (its producer filled that amax word), slot (kept
// transposed codes for the backward's wgrad: written with the row-major ones when write_t).
struct Fp8Input {
  Fp8Tap tap = Fp8Tap::None;
  int slot = -1;
  bool write_t = false;
};

class Fp8Projections {
 public:
  // max_tokens: the rows of the largest pass.
  Fp8Projections(Backend& be, int64_t max_tokens);
  // Whether a [N, K] weight meets the FP8 GEMM layouts in all three products (K and N multiples of 16).
  static bool eligible(int64_t N, int64_t K) { return N % 16 == 0 && K % 16 == 0; }
  // Registers a weight's codes ([N, K], eligible); returns its id. allocate() after the last one.
  int add(int64_t N, int64_t K);
  // Registers kept transposed codes of a K-wide input ([K, max_tokens padded to 16]); returns its slot.
  int add_slot(int64_t K);
  // The LM head in FP8 (linear_cross_entropy_fp8): its weight [V, H]'s codes in both layouts and
  // the codes of its input; before allocate().
  void add_head(int64_t V, int64_t H);
  bool has_head() const { return head_.V > 0; }
  void allocate();
  int64_t bytes() const { return bytes_; }
  // What allocate() takes for these weights ([N, K] each), kept input widths at max_tokens and the
  // head ({V, H}, or {0, 0} for none).
  static int64_t bytes_for(int64_t max_tokens, const std::vector<std::pair<int64_t, int64_t>>& weights,
                           const std::vector<int64_t>& slot_widths, std::pair<int64_t, int64_t> head = {0, 0});
  // The codes and scale of weight `id` from w (bf16 on the device).
  void quantize_weight(int id, const Tensor& w);
  // The head weight's codes (both layouts) and scale from w ([V, H], bf16 on the device).
  void quantize_head_weight(const Tensor& w);
  // hidden [T, H]'s codes in both layouts (one pass; tap: its producer's amax) with the head
  // weight's: the operands of linear_cross_entropy_fp8. Also the f64 [1] word the loss sum may go to.
  Fp8HeadCodes head_codes(const Tensor& hidden, Fp8Tap tap);
  Tensor loss_word() const { return loss_word_; }
  // The amax word of `t` for its producer's amax output; a quantize with the same tap reads and
  // resets it. Taking a tap that no quantize has read since is an error (it would widen the scale).
  Tensor tap(Fp8Tap t);
  // A pass that stopped between a tap and its quantize (an error) left the word filled: zero the
  // pending ones (a memset each, nothing when none is pending) before the next pass.
  void reset_taps();
  // Whether `t` was taken and no quantize has read it yet.
  bool tap_pending(Fp8Tap t) const { return t != Fp8Tap::None && pending_[static_cast<size_t>(t)]; }
  // The input's codes are kept for the next call with the same x (the projections that share an
  // input quantize it once). A caller whose buffers change under the same pointer calls forget_inputs().
  void forget_inputs() {
    held_ = Input{};
    held_slot_ = nullptr;
  }
  // y [T, N] = x W^T.
  void forward(const Tensor& y, const Tensor& x, int id, const Fp8Input& in);
  // dx (= or +=) dy W, skipped for an empty dx; dW (= or +=) dy^T x, skipped for an empty dw (a
  // frozen weight: x is then not read). dy_tap: dy's producer folded in its amax. x_slot >= 0: x's
  // transposed codes were kept there by the forward (it must be the same x), else x is quantized.
  void backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, int id, bool accumulate_dx,
                bool accumulate_dw, Fp8Tap dy_tap, int x_slot);

 private:
  struct Weight {
    int64_t N, K;
    Tensor q, q_t, scale_inv;
  };
  struct Input {
    const void* src = nullptr;
    int64_t T = 0, K = 0;
    bool transposed = false;
    bool operator==(const Input& o) const { return src == o.src && T == o.T && K == o.K && transposed == o.transposed; }
  };
  struct Slot {
    int64_t K;
    Tensor q_t, scale_inv;
    Input holds;  // what q_t was written from (src null: nothing valid)
  };
  // x's codes into x_codes_ (row-major, or transposed when `transposed`) unless held_ already;
  // slot: also its transposed codes, with the slot's scale. Returns the scale word of the codes.
  Tensor use_input(const Tensor& x, bool transposed, Fp8Tap tap, Slot* slot);
  Tensor take(Fp8Tap t);  // the word of a pending tap (now read), or empty for None
  Tensor view(const Tensor& buf, const Shape& shape) const;
  Tensor scale_word(int64_t i) const;  // 0: the input's, 1: dy's, 2 + id: weight id's
  Backend& be_;
  int64_t max_tokens_, bytes_ = 0;
  int64_t widest_n_ = 0, widest_k_ = 0;
  struct Head {
    int64_t V = 0, H = 0;
    Tensor wq, wq_t, w_scale_inv, hq, hq_t, h_scale_inv;
  };
  std::vector<Weight> w_;
  Head head_;
  Tensor loss_word_;
  std::vector<Slot> slots_;
  Tensor x_codes_, dy_codes_, dy_codes_t_, scales_, amax_;  // scratch; scales_: scale_word()s
  Input held_;                                              // what x_codes_ holds
  Slot* held_slot_ = nullptr;                               // which slot its pass also wrote
  Tensor held_scale_;                                       // and with which scale
  std::array<bool, static_cast<size_t>(Fp8Tap::kCount)> pending_{};
};

}  // namespace qt
