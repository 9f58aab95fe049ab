#include "model/flops.h"

#include <algorithm>

#include "model/params.h"

namespace qt {

std::vector<int64_t> chat_like_lengths(int64_t total, std::mt19937_64& rng) {
  std::lognormal_distribution<double> dist(6.5, 0.6);
  std::vector<int64_t> out;
  for (int64_t left = total; left > 0;) {
    const int64_t n = std::min<int64_t>(left, std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 32, 3000));
    out.push_back(n);
    left -= n;
  }
  return out;
}

StepFlops step_flops(const ModelConfig& c, const std::vector<int64_t>& lengths) {
  StepFlops f;
  int64_t tokens = 0;
  double l2 = 0;
  for (int64_t n : lengths) {
    tokens += n;
    l2 += double(n) * double(n);
  }
  f.dense = 6.0 * double(param_count(c)) * double(tokens);
  const double fwd_attn_per_layer = 2.0 * l2 * double(c.head_dim) * double(c.num_attention_heads);  // 2*2*L^2/2*D
  f.attention = 3.5 * fwd_attn_per_layer * double(c.num_full_layers());
  const double C = 64, K = double(c.linear_key_head_dim), V = double(c.linear_value_head_dim);
  const double per_token_head = (6 * C * K + 4 * C * V + 6 * K * V + C * C / 3) + (18 * C * K + 10 * C * V + 16 * K * V + 4 * C * C);
  f.gdn = per_token_head * double(tokens) * double(c.linear_num_value_heads) * double(c.num_linear_layers());
  return f;
}

}  // namespace qt
