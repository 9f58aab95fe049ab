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
  // The input's codes are kept for the next call with the same x (the projections that share an
  // input quantize it once): row-major for forward(), transposed and padded to 16 tokens with zeros
  // for backward(). A caller whose buffers change under the same pointer calls forget_inputs().
  void forget_inputs() { held_ = Input{}; }
  // y [T, N] = x W^T.
  void forward(const Tensor& y, const Tensor& x, int id);
  // dx (= or +=) dy W, skipped for an empty dx; dW (= or +=) dy^T x, skipped for an empty dw (a
  // frozen weight: x is then not read).
  void backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, int id, bool accumulate_dx,
                bool accumulate_dw);

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
  void use_input(const Tensor& x, bool transposed);  // x's codes into x_codes_ unless held_ already
  Tensor view(const Tensor& buf, const Shape& shape) const;
  Tensor scale_word(int64_t i) const;  // 0: the input's, 1: dy's, 2 + id: weight id's
  Backend& be_;
  int64_t max_tokens_, bytes_ = 0;
  int64_t widest_n_ = 0, widest_k_ = 0;
  std::vector<Weight> w_;
  Tensor x_codes_, dy_codes_, dy_codes_t_, scales_;  // scratch; scales_: scale_word()s
  Input held_;                                       // what x_codes_ holds
};

}  // namespace qt
