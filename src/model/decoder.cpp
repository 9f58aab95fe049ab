#include "model/decoder.h"

#include <cmath>

#include "core/error.h"

namespace qt {
namespace {

constexpr int kRoles = static_cast<int>(ParamRole::AttnKNorm) + 1;

// y[n] = W[n, :] . x for W [N, K] row-major.
void matvec(std::vector<float>& y, const std::vector<float>& W, const float* x, int64_t N, int64_t K) {
  y.assign(static_cast<size_t>(N), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = W.data() + n * K;
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) acc += double(row[k]) * x[k];
    y[static_cast<size_t>(n)] = static_cast<float>(acc);
  }
}

// (1+w) RMSNorm of x[0..n) into y.
void rmsnorm1p(float* y, const float* x, const float* w, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * r * (1.0 + w[i]));
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Qwen35Model& model) : cfg_(model.config()) {
  index_.assign(static_cast<size_t>(cfg_.num_hidden_layers + 1), std::vector<int>(kRoles, -1));
  const auto& base = model.base_specs();
  for (size_t i = 0; i < base.size(); ++i) {
    weights_.push_back(model.base_param_f32(i));
    index_[static_cast<size_t>(base[i].layer + 1)][static_cast<int>(base[i].role)] = static_cast<int>(i);
  }
  // LoRA: decode with the merged weights W + scale B A (the same function, one GEMM less a step).
  if (const LoraSpec* lora = model.lora()) {
    const auto& ad = model.specs();
    for (size_t i = 0; i + 1 < model.num_adapter_tensors(); i += 2) {
      const int w = index_[static_cast<size_t>(ad[i].layer + 1)][static_cast<int>(ad[i].role)];
      lora_merge_into(weights_[static_cast<size_t>(w)], model.param_f32(i), model.param_f32(i + 1), ad[i + 1].shape[0],
                      ad[i].shape[1], lora->r, lora->scale());
    }
  }
  const int64_t rot = cfg_.rotary_dim();
  for (int64_t i = 0; i < rot / 2; ++i)
    inv_freq_.push_back(static_cast<float>(std::pow(cfg_.rope_theta, -2.0 * double(i) / double(rot))));
  layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
  reset();
}

const std::vector<float>& IncrementalDecoder::w(ParamRole role, int layer) const {
  const int i = index_[static_cast<size_t>(layer + 1)][static_cast<int>(role)];
  QT_CHECK(i >= 0, "decoder: no parameter for role ", static_cast<int>(role), " in layer ", layer);
  return weights_[static_cast<size_t>(i)];
}

void IncrementalDecoder::reset() {
  pos_ = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    if (cfg_.layer_types[l] == LayerKind::GatedDeltaNet) {
      L.conv_hist.assign(static_cast<size_t>((cfg_.linear_conv_kernel_dim - 1) * cfg_.conv_dim()), 0.0f);
      L.state.assign(static_cast<size_t>(cfg_.linear_num_value_heads * cfg_.linear_key_head_dim * cfg_.linear_value_head_dim), 0.0f);
    } else {
      L.k_cache.clear();
      L.v_cache.clear();
    }
  }
}

const std::vector<float>& IncrementalDecoder::step(int32_t token) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  QT_CHECK(token >= 0 && token < c.vocab_size, "decoder: token id ", token, " is outside the vocabulary");
  std::vector<float> x(w(ParamRole::EmbedTokens, -1).begin() + token * H, w(ParamRole::EmbedTokens, -1).begin() + (token + 1) * H);
  std::vector<float> xn(static_cast<size_t>(H)), out, t1, t2, t3;
  for (int l = 0; l < static_cast<int>(c.num_hidden_layers); ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    rmsnorm1p(xn.data(), x.data(), w(ParamRole::InputNorm, l).data(), H, c.rms_norm_eps);
    if (c.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet) {
      const int64_t C = c.conv_dim(), K = c.linear_conv_kernel_dim, Hk = c.linear_num_key_heads;
      const int64_t Hv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
      std::vector<float> mixed, z, b, a;
      matvec(mixed, w(ParamRole::GdnInProjQkv, l), xn.data(), C, H);
      matvec(z, w(ParamRole::GdnInProjZ, l), xn.data(), Hv * dv, H);
      matvec(b, w(ParamRole::GdnInProjB, l), xn.data(), Hv, H);
      matvec(a, w(ParamRole::GdnInProjA, l), xn.data(), Hv, H);
      // Causal depthwise conv over [history..., current]; w[ch, K-1] multiplies the current token.
      const std::vector<float>& cw = w(ParamRole::GdnConv1d, l);
      std::vector<float> conv(static_cast<size_t>(C));
      for (int64_t ch = 0; ch < C; ++ch) {
        double acc = double(cw[static_cast<size_t>(ch * K + K - 1)]) * mixed[static_cast<size_t>(ch)];
        for (int64_t j = 0; j < K - 1; ++j) acc += double(cw[static_cast<size_t>(ch * K + j)]) * L.conv_hist[static_cast<size_t>(j * C + ch)];
        conv[static_cast<size_t>(ch)] = silu(static_cast<float>(acc));
      }
      for (int64_t j = 0; j + 1 < K - 1; ++j)
        std::copy(L.conv_hist.begin() + (j + 1) * C, L.conv_hist.begin() + (j + 2) * C, L.conv_hist.begin() + j * C);
      if (K > 1) std::copy(mixed.begin(), mixed.end(), L.conv_hist.begin() + (K - 2) * C);
      const float* q = conv.data();
      const float* k = conv.data() + Hk * dk;
      const float* v = conv.data() + 2 * Hk * dk;
      const std::vector<float>& A_log = w(ParamRole::GdnALog, l);
      const std::vector<float>& dt_bias = w(ParamRole::GdnDtBias, l);
      const std::vector<float>& nw = w(ParamRole::GdnNorm, l);
      std::vector<float> y(static_cast<size_t>(Hv * dv));
      std::vector<double> qh(static_cast<size_t>(dk)), kh(static_cast<size_t>(dk)), o(static_cast<size_t>(dv)), m(static_cast<size_t>(dv));
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t kv = h / (Hv / Hk);
        double qs = 0, ks = 0;
        for (int64_t i = 0; i < dk; ++i) {
          qs += double(q[kv * dk + i]) * q[kv * dk + i];
          ks += double(k[kv * dk + i]) * k[kv * dk + i];
        }
        const double qr = 1.0 / std::sqrt(qs + 1e-6) / std::sqrt(double(dk)), kr = 1.0 / std::sqrt(ks + 1e-6);
        for (int64_t i = 0; i < dk; ++i) {
          qh[static_cast<size_t>(i)] = q[kv * dk + i] * qr;
          kh[static_cast<size_t>(i)] = k[kv * dk + i] * kr;
        }
        const double beta = 1.0 / (1.0 + std::exp(-double(b[static_cast<size_t>(h)])));
        const double g = -std::exp(double(A_log[static_cast<size_t>(h)])) *
                         softplus(double(a[static_cast<size_t>(h)]) + dt_bias[static_cast<size_t>(h)]);
        const double decay = std::exp(g);
        float* S = L.state.data() + h * dk * dv;  // [dk, dv]
        for (int64_t i = 0; i < dk * dv; ++i) S[i] = static_cast<float>(S[i] * decay);
        std::fill(m.begin(), m.end(), 0.0);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) m[static_cast<size_t>(j)] += double(S[i * dv + j]) * kh[static_cast<size_t>(i)];
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) {
            const double delta = beta * (double(v[h * dv + j]) - m[static_cast<size_t>(j)]);
            S[i * dv + j] = static_cast<float>(S[i * dv + j] + kh[static_cast<size_t>(i)] * delta);
            o[static_cast<size_t>(j)] += double(S[i * dv + j]) * qh[static_cast<size_t>(i)];
          }
        // Gated RMSNorm per head: (w * o * rstd) * silu(z).
        double ss = 0;
        for (double vj : o) ss += vj * vj;
        const double r = 1.0 / std::sqrt(ss / double(dv) + c.rms_norm_eps);
        for (int64_t j = 0; j < dv; ++j)
          y[static_cast<size_t>(h * dv + j)] =
              static_cast<float>(nw[static_cast<size_t>(j)] * o[static_cast<size_t>(j)] * r * silu(z[static_cast<size_t>(h * dv + j)]));
      }
      matvec(out, w(ParamRole::GdnOutProj, l), y.data(), H, Hv * dv);
    } else {
      const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim, half = c.rotary_dim() / 2;
      std::vector<float> qg, kr, v;
      matvec(qg, w(ParamRole::AttnQProj, l), xn.data(), 2 * Hq * D, H);
      matvec(kr, w(ParamRole::AttnKProj, l), xn.data(), Hkv * D, H);
      matvec(v, w(ParamRole::AttnVProj, l), xn.data(), Hkv * D, H);
      auto rope = [&](float* t) {
        for (int64_t i = 0; i < half; ++i) {
          const double ang = double(pos_) * inv_freq_[static_cast<size_t>(i)];
          const double cs = std::cos(ang), sn = std::sin(ang), x1 = t[i], x2 = t[i + half];
          t[i] = static_cast<float>(x1 * cs - x2 * sn);
          t[i + half] = static_cast<float>(x2 * cs + x1 * sn);
        }
      };
      std::vector<float> q(static_cast<size_t>(Hq * D)), gate(static_cast<size_t>(Hq * D)), kn(static_cast<size_t>(Hkv * D));
      for (int64_t h = 0; h < Hq; ++h) {
        rmsnorm1p(q.data() + h * D, qg.data() + h * 2 * D, w(ParamRole::AttnQNorm, l).data(), D, c.rms_norm_eps);
        rope(q.data() + h * D);
        std::copy(qg.begin() + h * 2 * D + D, qg.begin() + (h + 1) * 2 * D, gate.begin() + h * D);
      }
      for (int64_t h = 0; h < Hkv; ++h) {
        rmsnorm1p(kn.data() + h * D, kr.data() + h * D, w(ParamRole::AttnKNorm, l).data(), D, c.rms_norm_eps);
        rope(kn.data() + h * D);
      }
      L.k_cache.insert(L.k_cache.end(), kn.begin(), kn.end());
      L.v_cache.insert(L.v_cache.end(), v.begin(), v.end());
      const int64_t n = pos_ + 1;
      std::vector<float> att(static_cast<size_t>(Hq * D));
      std::vector<double> p(static_cast<size_t>(n));
      const double scale = 1.0 / std::sqrt(double(D));
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t kvh = h / (Hq / Hkv);
        double mx = -1e300;
        for (int64_t t = 0; t < n; ++t) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += double(q[static_cast<size_t>(h * D + d)]) * L.k_cache[static_cast<size_t>((t * Hkv + kvh) * D + d)];
          p[static_cast<size_t>(t)] = s * scale;
          mx = std::max(mx, p[static_cast<size_t>(t)]);
        }
        double sum = 0;
        for (auto& e : p) sum += (e = std::exp(e - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t t = 0; t < n; ++t) acc += p[static_cast<size_t>(t)] * L.v_cache[static_cast<size_t>((t * Hkv + kvh) * D + d)];
          const double gt = gate[static_cast<size_t>(h * D + d)];
          att[static_cast<size_t>(h * D + d)] = static_cast<float>(acc / sum / (1.0 + std::exp(-gt)));
        }
      }
      matvec(out, w(ParamRole::AttnOProj, l), att.data(), H, Hq * D);
    }
    for (int64_t i = 0; i < H; ++i) x[static_cast<size_t>(i)] += out[static_cast<size_t>(i)];  // h = x + mixer
    rmsnorm1p(xn.data(), x.data(), w(ParamRole::PostAttnNorm, l).data(), H, c.rms_norm_eps);
    matvec(t1, w(ParamRole::MlpGate, l), xn.data(), I, H);
    matvec(t2, w(ParamRole::MlpUp, l), xn.data(), I, H);
    for (int64_t i = 0; i < I; ++i) t1[static_cast<size_t>(i)] = silu(t1[static_cast<size_t>(i)]) * t2[static_cast<size_t>(i)];
    matvec(t3, w(ParamRole::MlpDown, l), t1.data(), H, I);
    for (int64_t i = 0; i < H; ++i) x[static_cast<size_t>(i)] += t3[static_cast<size_t>(i)];
  }
  rmsnorm1p(xn.data(), x.data(), w(ParamRole::FinalNorm, -1).data(), H, c.rms_norm_eps);
  matvec(logits_, c.tie_word_embeddings ? w(ParamRole::EmbedTokens, -1) : w(ParamRole::LmHead, -1), xn.data(),
         c.vocab_size, H);
  ++pos_;
  return logits_;
}

}  // namespace qt
