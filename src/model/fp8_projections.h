// train.precision: fp8 (docs/fp8.md): the decoder projections' forward, dgrad and wgrad as e4m3
// GEMMs with per-tensor current scaling. This owns the weights' codes (row-major for the forward,
// transposed for dgrad, one scale each) and the scratch codes of the projection input and the
// output gradient in flight; the model decides which projections run here and when the weight codes
// are refreshed (Qwen35Model::fp8_refresh).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace qt {

enum class Precision { BF16, FP8 };
const char* precision_name(Precision p);
Precision precision_from_name(const std::string& name);  // bf16|fp8, else an error naming the value

class Fp8Projections {
 public:
  // max_tokens: the rows of the largest pass.
  Fp8Projections(Backend& be, int64_t max_tokens);
  // Whether a [N, K] weight meets the FP8 GEMM layouts in all three products (K and N multiples of 16).
  static bool eligible(int64_t N, int64_t K) { return N % 16 == 0 && K % 16 == 0; }
  // Registers a weight's codes ([N, K], eligible); returns its id. allocate() after the last one.
  int add(int64_t N, int64_t K);
  void allocate();
  int64_t bytes() const { return bytes_; }
  // The codes and scale of weight `id` from w (bf16 on the device).
  void quantize_weight(int id, const Tensor& w);
  // The input the next forward() (transposed = false: its row-major codes) or backward() (its
  // transposed codes, padded to 16 tokens with zeros) reads. Quantized once per x: a caller whose
  // buffers change under the same pointer calls forget_inputs() first.
  void use_input(const Tensor& x, bool transposed);
  void forget_inputs();
  // y [T, N] = x W^T from the current input's codes.
  void forward(const Tensor& y, int id);
  // dx (= or +=) dy W, skipped for an empty dx; dW (= or +=) dy^T x from the current (transposed)
  // input, skipped for an empty dw (a frozen weight).
  void backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, int id, bool accumulate_dx, bool accumulate_dw);

 private:
  struct Weight {
    int64_t N, K;
    Tensor q, q_t, scale_inv;
  };
  struct Input {
    const void* src = nullptr;
    int64_t T = 0, K = 0;
  };
  Tensor view(const Tensor& buf, const Shape& shape) const;
  Tensor scale_word(int64_t i) const;  // 0: the input's, 1: dy's, 2 + id: weight id's
  Backend& be_;
  int64_t max_tokens_, bytes_ = 0;
  int64_t widest_n_ = 0, widest_k_ = 0;
  std::vector<Weight> w_;
  Tensor x_codes_, dy_codes_, dy_codes_t_, scales_;  // scratch; scales_: scale_word()s
  Input fwd_, bwd_;                                  // what x_codes_ holds (one kind at a time)
};

}  // namespace qt
