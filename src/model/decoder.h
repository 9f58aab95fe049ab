// Incremental decoding on the CPU: one token at a time with a recurrent state per Gated DeltaNet
// layer (the K-1 previous conv inputs and the dk x dv state per value head) and a KV cache per
// full-attention layer, so generating n tokens costs O(n) layer steps instead of re-running the
// whole prefix. fp32, same math as the packed forward (docs/model_spec.md section 3); the tests check
// its logits against Qwen35Model::logits at every position.
#pragma once
#include <cstdint>
#include <vector>

#include "model/qwen35.h"

namespace qt {

class IncrementalDecoder {
 public:
  // Copies the model's weights (as f32) once.
  explicit IncrementalDecoder(const Qwen35Model& model);

  // Feeds one token at the next position and returns the logits [V] predicting the token after it.
  const std::vector<float>& step(int32_t token);
  void reset();  // forget the sequence (position 0, zero states, empty caches)
  int64_t position() const { return pos_; }

 private:
  struct Layer {
    std::vector<float> conv_hist;         // [K-1, C] previous conv inputs, oldest first
    std::vector<float> state;             // [Hv, dk, dv]
    std::vector<float> k_cache, v_cache;  // [t, Hkv, D]
  };
  const std::vector<float>& w(ParamRole role, int layer) const;

  ModelConfig cfg_;
  std::vector<std::vector<float>> weights_;
  std::vector<std::vector<int>> index_;  // [layer + 1][role] -> weights_ index
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_, logits_;
  int64_t pos_ = 0;
};

}  // namespace qt
