#include "model/qwen35.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "model/init.h"
#include "ops/dropout_hash.h"
#include "profile/profiled_backend.h"

namespace qt {
namespace {

constexpr int kNumRoles = static_cast<int>(ParamRole::AttnKNorm) + 1;
// What the memory plan leaves free beyond its own parts: the cross-entropy chunk, the GDN and
// attention workspaces, cuBLASLt and fragmentation (choose_checkpointing_within, gdn_keep_fits).

// Weights whose gradient comes from exactly one dW GEMM per backward (Qwen35Model::proj_backward).
bool is_projection(ParamRole r) {
  switch (r) {
    case ParamRole::MlpGate: case ParamRole::MlpUp: case ParamRole::MlpDown:
    case ParamRole::GdnInProjQkv: case ParamRole::GdnInProjZ: case ParamRole::GdnInProjB: case ParamRole::GdnInProjA:
    case ParamRole::GdnOutProj:
    case ParamRole::AttnQProj: case ParamRole::AttnKProj: case ParamRole::AttnVProj: case ParamRole::AttnOProj:
      return true;
    default:
      return false;
  }
}

// A view of the first numel(shape) elements of a capacity buffer.
Tensor slab(const Tensor& buf, const Shape& shape) {
  QT_CHECK(shape_numel(shape) <= buf.numel(), "activation buffer ", buf.describe(), " too small for ", shape_str(shape));
  return Tensor(buf.data, buf.dtype, shape, buf.device);
}

Tensor none() { return Tensor(); }

// The projections fp8 runs: all but the GDN's b and a (16 wide: their GEMMs are negligible and
// their gate pre-activations stay exact).
bool runs_fp8(ParamRole r) { return is_projection(r) && r != ParamRole::GdnInProjB && r != ParamRole::GdnInProjA; }

}  // namespace

// ---- PackedRow ---------------------------------------------------------------------------------

int64_t PackedRow::num_trained() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t != -100;
  return n;
}

void PackedRow::append_sample(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels) {
  QT_CHECK(!ids.empty(), "append_sample: empty sample");
  QT_CHECK(labels.size() == ids.size(), "append_sample: ", labels.size(), " labels for ", ids.size(), " tokens");
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  for (size_t i = 0; i < ids.size(); ++i) {
    input_ids.push_back(ids[i]);
    targets.push_back(i + 1 < ids.size() ? labels[i + 1] : -100);  // never predict across samples
    positions.push_back(static_cast<int32_t>(i));
  }
  cu_seqlens.push_back(static_cast<int32_t>(input_ids.size()));
}

void PackedRow::validate(int64_t vocab_size) const {
  const size_t T = input_ids.size();
  QT_CHECK(T > 0, "packed row is empty");
  QT_CHECK(targets.size() == T && positions.size() == T, "packed row: input_ids/targets/positions lengths differ (",
           T, ", ", targets.size(), ", ", positions.size(), ")");
  QT_CHECK(cu_seqlens.size() >= 2 && cu_seqlens.front() == 0 && static_cast<size_t>(cu_seqlens.back()) == T,
           "packed row: cu_seqlens must start at 0 and end at ", T);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    QT_CHECK(cu_seqlens[s + 1] > cu_seqlens[s], "packed row: sample ", s, " is empty or cu_seqlens decreases");
    for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t)
      QT_CHECK(positions[static_cast<size_t>(t)] == t - cu_seqlens[s], "packed row: position at token ", t,
               " is ", positions[static_cast<size_t>(t)], ", expected ", t - cu_seqlens[s]);
  }
  for (size_t t = 0; t < T; ++t) {
    QT_CHECK(input_ids[t] >= 0 && input_ids[t] < vocab_size, "packed row: token id ", input_ids[t], " at position ", t,
             " is outside the vocabulary [0, ", vocab_size, ")");
    QT_CHECK(targets[t] == -100 || (targets[t] >= 0 && targets[t] < vocab_size), "packed row: target ", targets[t],
             " at position ", t, " is outside the vocabulary");
  }
}

// ---- model ------------------------------------------------------------------------------------

struct Qwen35Model::LayerActs {
  Tensor x, rstd_in, xn;                                   // layer input, its norm
  Tensor mixed, z, b, a, conv, beta, g, o, y, gnorm_rstd;  // gated deltanet
  Tensor qg, kr, v, q, k, gate, q_rstd, k_rstd, attn_o, lse, attn_y;  // full attention
  Tensor h, rstd_post, hn, mlp_gate, mlp_up, mlp_act;      // MLP half
};

namespace {

GdnDims gdn_dims(const ModelConfig& c) {
  return {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
}
AttnDims attn_dims(const ModelConfig& c) {
  return {c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim(), c.rope_theta};
}

// Who keeps an activation for the backward: Input (the layer input: always), Kept (GEMM and
// mixer outputs and the small statistics: None and Selective), Cheap (one elementwise op of kept
// tensors recomputes it: None only).
enum class ActTier { Input, Kept, Cheap };

bool keeps(Checkpointing c, ActTier t) {
  return t == ActTier::Input || c == Checkpointing::None || (c == Checkpointing::Selective && t == ActTier::Kept);
}

// Calls f(field, dtype, shape, tier) for every activation a layer of this kind has.
template <class F>
void for_each_activation(Qwen35Model::LayerActs& A, LayerKind kind, const ModelConfig& c, int64_t T, DType at, F f) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, C = c.conv_dim();
  const int64_t Hv = c.linear_num_value_heads, VD = c.value_dim();
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const DType F32 = DType::F32;
  f(A.x, at, Shape{T, H}, ActTier::Input);
  f(A.rstd_in, F32, Shape{T}, ActTier::Kept);
  f(A.xn, at, Shape{T, H}, ActTier::Cheap);
  if (kind == LayerKind::GatedDeltaNet) {
    f(A.mixed, at, Shape{T, C}, ActTier::Kept);
    f(A.z, at, Shape{T, VD}, ActTier::Kept);
    f(A.b, at, Shape{T, Hv}, ActTier::Kept);
    f(A.a, at, Shape{T, Hv}, ActTier::Kept);
    f(A.conv, at, Shape{T, C}, ActTier::Cheap);
    f(A.beta, F32, Shape{T, Hv}, ActTier::Kept);
    f(A.g, F32, Shape{T, Hv}, ActTier::Kept);
    f(A.o, at, Shape{T, VD}, ActTier::Kept);
    f(A.y, at, Shape{T, VD}, ActTier::Cheap);
    f(A.gnorm_rstd, F32, Shape{T * Hv}, ActTier::Kept);
  } else {
    f(A.qg, at, Shape{T, 2 * Hq * D}, ActTier::Kept);
    f(A.kr, at, Shape{T, Hkv * D}, ActTier::Kept);
    f(A.v, at, Shape{T, Hkv * D}, ActTier::Kept);
    f(A.q, at, Shape{T, Hq * D}, ActTier::Cheap);
    f(A.k, at, Shape{T, Hkv * D}, ActTier::Cheap);
    f(A.gate, at, Shape{T, Hq * D}, ActTier::Cheap);
    f(A.q_rstd, F32, Shape{T * Hq}, ActTier::Kept);
    f(A.k_rstd, F32, Shape{T * Hkv}, ActTier::Kept);
    f(A.attn_o, at, Shape{T, Hq * D}, ActTier::Kept);
    f(A.lse, F32, Shape{Hq * T}, ActTier::Kept);
    f(A.attn_y, at, Shape{T, Hq * D}, ActTier::Cheap);
  }
  f(A.h, at, Shape{T, H}, ActTier::Kept);
  f(A.rstd_post, F32, Shape{T}, ActTier::Kept);
  f(A.hn, at, Shape{T, H}, ActTier::Cheap);
  f(A.mlp_gate, at, Shape{T, I}, ActTier::Kept);
  f(A.mlp_up, at, Shape{T, I}, ActTier::Kept);
  f(A.mlp_act, at, Shape{T, I}, ActTier::Cheap);
}

// Lays out every layer's activations for the policy: what it keeps in the layer's own tensors,
// the rest in the shared work set of the layer's kind (refilled per layer by the backward).
// make(dtype, shape) returns the tensor: allocated by the model, or just counted.
template <class Make>
void lay_out_activations(const ModelConfig& cfg, int64_t T, DType at, Checkpointing ckpt,
                         std::vector<Qwen35Model::LayerActs>& work, std::vector<Qwen35Model::LayerActs>& acts,
                         Make make) {
  work.assign(2, Qwen35Model::LayerActs{});
  for (int kind = 0; kind < 2; ++kind)
    for_each_activation(work[static_cast<size_t>(kind)], static_cast<LayerKind>(kind), cfg, T, at,
                        [&](Tensor& t, DType dt, const Shape& shape, ActTier tier) {
                          if (tier != ActTier::Input && !keeps(ckpt, tier)) t = make(dt, shape);
                        });
  acts.assign(cfg.layer_types.size(), Qwen35Model::LayerActs{});
  for (size_t l = 0; l < cfg.layer_types.size(); ++l) {
    const LayerKind kind = cfg.layer_types[l];
    acts[l] = work[static_cast<size_t>(kind)];  // the shared tensors; the kept ones are replaced below
    for_each_activation(acts[l], kind, cfg, T, at, [&](Tensor& t, DType dt, const Shape& shape, ActTier tier) {
      if (keeps(ckpt, tier)) t = make(dt, shape);
    });
  }
}

}  // namespace

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::None: return "none";
    case Checkpointing::Selective: return "selective";
    case Checkpointing::Full: return "full";
  }
  return "?";
}

std::optional<Checkpointing> checkpointing_from_name(const std::string& name) {
  if (name == "none") return Checkpointing::None;
  if (name == "selective") return Checkpointing::Selective;
  if (name == "full") return Checkpointing::Full;
  return std::nullopt;
}

Checkpointing choose_checkpointing(const ModelConfig& cfg, const Backend& backend, int64_t max_tokens, int max_seqs,
                                   std::string* why, int64_t trained_params, int zero3_world, Precision precision,
                                   bool fp8_head) {
  const int64_t free_bytes = backend.free_memory_bytes();
  if (free_bytes < 0) {
    if (why != nullptr) *why = "host memory: none";
    return Checkpointing::None;
  }
  const GdnDims gd = gdn_dims(cfg);
  const int64_t n_gdn = std::count(cfg.layer_types.begin(), cfg.layer_types.end(), LayerKind::GatedDeltaNet);
  const int64_t kept = backend.gdn_state_bytes(gd, max_tokens, max_seqs, gdn_keep_for(Checkpointing::None, backend.gdn_prefers_prep(gd)));
  return choose_checkpointing_within(cfg, backend.activation_dtype(), max_tokens,
                                     gdn_kept_bytes(Checkpointing::None, n_gdn, kept), free_bytes, why, trained_params,
                                     zero3_world, precision, fp8_head);
}

GdnKeep gdn_keep_for(Checkpointing ckpt, bool prefers_prep) {
  return ckpt != Checkpointing::None || prefers_prep ? GdnKeep::Prep : GdnKeep::States;
}

int64_t gdn_kept_bytes(Checkpointing ckpt, int64_t n_gdn, int64_t layer_bytes) {
  if (n_gdn == 0) return 0;
  return ckpt == Checkpointing::Full ? layer_bytes : n_gdn * layer_bytes;
}

bool gdn_keep_fits(int64_t kept_bytes, int64_t free_bytes) {
  return free_bytes < 0 || free_bytes - kept_bytes >= kWorkspaceReserve;
}

Checkpointing choose_checkpointing_within(const ModelConfig& cfg, DType act, int64_t max_tokens, int64_t gdn_state_bytes,
                                          int64_t free_bytes, std::string* why, int64_t trained_params,
                                          int zero3_world, Precision precision, bool fp8_head) {
  // bf16 weights, fp32 gradients, fp32 master + m + v; gradient scratch; 4 GiB for the
  // cross-entropy chunk, the GDN / attention workspaces, cuBLASLt and fragmentation.
  // LoRA: the frozen base takes only its weights; the adapters weights, gradients and AdamW state.
  const int64_t act_bytes = static_cast<int64_t>(dtype_size(act));
  const int64_t trained = trained_params < 0 ? param_count(cfg) : trained_params;
  int64_t states = param_count(cfg) * act_bytes + trained * (trained_params < 0 ? 16 : act_bytes + 16);
  if (zero3_world > 0) states = (states + zero3_world - 1) / zero3_world + zero3_buffer_bytes(cfg, act_bytes);
  const int64_t fixed = states + gradient_scratch_bytes(cfg, act, max_tokens) + kWorkspaceReserve;
  std::string detail;
  for (Checkpointing c : {Checkpointing::None, Checkpointing::Selective, Checkpointing::Full}) {
    int64_t need = fixed + activation_bytes(cfg, act, max_tokens, c);
    if (c == Checkpointing::None) need += gdn_state_bytes;
    if (precision == Precision::FP8)
      need += fp8_codes_bytes(cfg, max_tokens, c, zero3_world > 0, trained_params >= 0, fp8_head);
    detail += str(detail.empty() ? "" : ", ", checkpointing_name(c), " needs ", need >> 20, " MiB");
    if (need <= free_bytes) {
      if (why != nullptr) *why = str(detail, " of ", free_bytes >> 20, " MiB free: ", checkpointing_name(c));
      return c;
    }
  }
  QT_FAIL("the model does not fit on this device even with full activation checkpointing: ", detail, ", ",
          free_bytes >> 20, " MiB free (", param_count(cfg), " parameters take ", fixed >> 30,
          " GiB with bf16 weights, fp32 gradients and AdamW state before any activation); use a smaller model or "
          "fewer tokens per row, or set train.activation_checkpointing to full to try anyway");
}

int64_t gradient_scratch_bytes(const ModelConfig& cfg, DType act, int64_t max_tokens) {
  const int64_t wide = std::max({cfg.intermediate_size, cfg.conv_dim(), cfg.value_dim(),
                                 2 * cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size});
  return max_tokens * (2 * cfg.hidden_size + 5 * wide) * static_cast<int64_t>(dtype_size(act));
}

int64_t activation_bytes(const ModelConfig& cfg, DType act, int64_t max_tokens, Checkpointing ckpt) {
  int64_t bytes = 0;
  std::vector<Qwen35Model::LayerActs> work, acts;
  lay_out_activations(cfg, max_tokens, act, ckpt, work, acts, [&](DType dt, const Shape& shape) {
    bytes += shape_numel(shape) * static_cast<int64_t>(dtype_size(dt));
    return Tensor();
  });
  // final_in, final_out (act), final_rstd, token_loss (f32)
  bytes += max_tokens * (2 * cfg.hidden_size * static_cast<int64_t>(dtype_size(act)) + 8);
  return bytes;
}

Qwen35Model::Qwen35Model(const ModelConfig& cfg, Backend& be, int64_t max_tokens, Checkpointing ckpt,
                         const LoraSpec* lora, const Zero3Options* zero3)
    : cfg_(cfg), be_(be), prof_(profile::attached_profiler(be)), max_tokens_(max_tokens), ckpt_(ckpt),
      specs_(lora ? lora_trainable_table(cfg, *lora) : param_table(cfg)), base_specs_(param_table(cfg)),
      lora_(lora != nullptr) {
  if (lora) {
    lora_validate(*lora);
    lora_spec_ = *lora;
  }
  QT_CHECK(max_tokens > 0, "max_tokens must be positive");
  plan_.checkpointing = ckpt;
  // Every buffer is allocated here, counted by kind for the memory plan.
  auto planned = [&](int64_t& bytes, DType t, const Shape& shape) {
    bytes += shape_numel(shape) * static_cast<int64_t>(dtype_size(t));
    return be.alloc(t, shape);
  };
  const DType at = be.activation_dtype();
  if (zero3 != nullptr) {
    QT_CHECK(zero3->comm != nullptr, "ZeRO-3: no communicator");
    QT_CHECK(!lora, "ZeRO-3 shards full fine-tuning; LoRA keeps its frozen base whole on every rank (use dist.zero 0-2)");
    shards_ = std::make_unique<WeightShards>(base_specs_, cfg.num_hidden_layers, be, *zero3->comm,
                                             zero3->reshard_after_forward);
    plan_.weights += shards_->shard_bytes() + shards_->buffer_bytes();
  }
  role_index_.assign(static_cast<size_t>(cfg.num_hidden_layers + 1), std::vector<int>(kNumRoles, -1));
  for (size_t i = 0; i < base_specs_.size(); ++i) {
    if (shards_ && shards_->sharded(i)) base_.push_back(shards_->weight(i));
    else base_.push_back(planned(plan_.weights, at, base_specs_[i].shape));
    role_index_[static_cast<size_t>(base_specs_[i].layer + 1)][static_cast<int>(base_specs_[i].role)] = static_cast<int>(i);
  }
  trainable_of_base_.assign(base_specs_.size(), -1);
  if (!lora_) {
    params_ = base_;
    for (size_t i = 0; i < base_.size(); ++i) trainable_of_base_[i] = static_cast<int>(i);
  } else {
    const std::vector<size_t> saved = lora_saved_modules(cfg, lora_spec_);
    num_adapter_tensors_ = specs_.size() - saved.size();  // lora_trainable_table: adapters, then saved
    lora_index_.assign(static_cast<size_t>(cfg.num_hidden_layers), std::vector<int>(kNumRoles, -1));
    lora_t_.assign(static_cast<size_t>(cfg.num_hidden_layers), std::vector<Tensor>(kNumRoles));
    for (size_t i = 0; i < num_adapter_tensors_; ++i) {
      params_.push_back(planned(plan_.weights, at, specs_[i].shape));
      const auto l = static_cast<size_t>(specs_[i].layer);
      const int role = static_cast<int>(specs_[i].role);
      if (lora_index_[l][role] < 0) {  // A (B follows)
        lora_index_[l][role] = static_cast<int>(i);
        lora_t_[l][role] = planned(plan_.activations, at, {max_tokens, lora_spec_.r});
      }
    }
    lora_dt_ = planned(plan_.scratch, at, {max_tokens, lora_spec_.r});
    if (lora_spec_.dropout > 0) {
      const int64_t widest = std::max({cfg.intermediate_size, cfg.hidden_size, cfg.value_dim(),
                                       cfg.num_attention_heads * cfg.head_dim});
      lora_xd_ = planned(plan_.scratch, at, {max_tokens * widest});
      lora_u_ = planned(plan_.scratch, at, {max_tokens * widest});
    }
    // modules_to_save: trained in place, the base tensor itself.
    for (size_t k = 0; k < saved.size(); ++k) {
      params_.push_back(base_[saved[k]]);
      trainable_of_base_[saved[k]] = static_cast<int>(num_adapter_tensors_ + k);
    }
  }
  // All gradients live in one buffer (each view 256-byte aligned). They are fp32 on every backend:
  // micro-batches accumulate into them without bf16 rounding. The gradients whose first op of a
  // backward writes them come last (the projections' dW GEMMs; the loss head's, i.e. lm_head or the
  // tied embeddings, from the cross-entropy's first chunk), so zero_grads() clears only the front
  // part (norms, conv, gates, untied embeddings: one launch) and the rest is never zeroed or re-read.
  const bool tied = cfg.tie_word_embeddings;
  auto written_first = [&](const ParamSpec& spec) {
    return is_projection(spec.role) || spec.role == ParamRole::LmHead || (tied && spec.role == ParamRole::EmbedTokens);
  };
  constexpr int64_t kGradAlign = 256;
  const DType gt = DType::F32;
  std::vector<int64_t> offsets(specs_.size());
  int64_t grad_bytes = 0, zeroed_bytes = 0;
  // ZeRO-3's sharded gradients live in its layer buffers instead.
  auto in_shards = [&](size_t i) { return shards_ && shards_->sharded(i); };
  for (const bool written : {false, true}) {  // accumulated ones first, then the written ones
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (written_first(specs_[i]) != written || in_shards(i)) continue;
      offsets[i] = grad_bytes;
      grad_bytes += (shape_numel(specs_[i].shape) * static_cast<int64_t>(dtype_size(gt)) + kGradAlign - 1) /
                    kGradAlign * kGradAlign;
    }
    if (!written) zeroed_bytes = grad_bytes;
  }
  grads_flat_ = planned(plan_.grads, DType::U8, {grad_bytes});
  be.zero(grads_flat_);  // the alignment gaps stay zero (a sharded job all-reduces the whole buffer)
  grads_zeroed_ = Tensor(grads_flat_.data, DType::U8, {zeroed_bytes}, grads_flat_.device);
  for (size_t i = 0; i < specs_.size(); ++i)
    grads_.push_back(in_shards(i) ? shards_->grad(i)
                                  : Tensor(static_cast<char*>(grads_flat_.data) + offsets[i], gt, specs_[i].shape,
                                           grads_flat_.device));
  const int64_t T = max_tokens, H = cfg.hidden_size, I = cfg.intermediate_size, C = cfg.conv_dim();
  const int64_t Hv = cfg.linear_num_value_heads, VD = cfg.value_dim();
  const int64_t Hq = cfg.num_attention_heads, D = cfg.head_dim;
  inputs_ = planned(plan_.inputs, DType::I32, {4 * T + 3});  // ids, targets, positions, cu_seqlens, dropout seed
  lay_out_activations(cfg, T, at, ckpt, work_, acts_,
                      [&](DType dt, const Shape& shape) { return planned(plan_.activations, dt, shape); });
  final_in_ = planned(plan_.activations, at, {T, H});
  final_rstd_ = planned(plan_.activations, DType::F32, {T});
  final_out_ = planned(plan_.activations, at, {T, H});
  token_loss_ = planned(plan_.activations, DType::F32, {T});
  // Gradient scratch: wide enough for every intermediate of any layer.
  const int64_t wide = std::max({I, C, VD, 2 * Hq * D, H});
  d_res_ = planned(plan_.scratch, at, {T, H});
  d_norm_out_ = planned(plan_.scratch, at, {T, H});
  for (Tensor* t : {&d_a_, &d_b_, &d_c_, &d_d_, &d_e_}) *t = planned(plan_.scratch, at, {T * wide});
  d_f32_a_ = planned(plan_.scratch, DType::F32, {T * std::max(Hv, Hq)});
  d_f32_b_ = planned(plan_.scratch, DType::F32, {T * std::max(Hv, Hq)});
}

Qwen35Model::~Qwen35Model() = default;

std::string MemoryPlan::describe() const {
  auto mib = [](int64_t b) { return str(static_cast<double>(b) / double(1 << 20)); };
  return str("weights ", mib(weights), " MiB | grads ", mib(grads), " MiB | activations ", mib(activations),
             " MiB (checkpointing ", checkpointing_name(checkpointing), ") | GDN state kept for the backward ",
             mib(mixer_state), " MiB (", mixer_kept, ") | gradient scratch ", mib(scratch), " MiB | inputs ",
             mib(inputs), " MiB | ", fp8 > 0 ? str("fp8 codes ", mib(fp8), " MiB | ") : std::string(), "total ",
             mib(total()), " MiB (optimizer state and kernel workspaces come on top)");
}

const Tensor& Qwen35Model::p(ParamRole role, int layer) const {
  int i = role_index_[static_cast<size_t>(layer + 1)][static_cast<int>(role)];
  QT_CHECK(i >= 0, "model has no parameter for role ", static_cast<int>(role), " in layer ", layer);
  return base_[static_cast<size_t>(i)];
}

const Tensor& Qwen35Model::g(ParamRole role, int layer) const {
  int i = role_index_[static_cast<size_t>(layer + 1)][static_cast<int>(role)];
  QT_CHECK(i >= 0, "model has no gradient for role ", static_cast<int>(role), " in layer ", layer);
  const int t = trainable_of_base_[static_cast<size_t>(i)];
  return t < 0 ? no_grad_ : grads_[static_cast<size_t>(t)];  // frozen: the ops skip optional weight gradients
}

Tensor Qwen35Model::rows(const Tensor& t, int64_t T) const {
  Shape s = t.shape_vec();
  s[0] = T;
  return Tensor(t.data, t.dtype, s, t.device);
}

void Qwen35Model::load(const HfModelDir& dir, uint64_t lora_seed) {
  QT_CHECK(dir.params.size() == base_specs_.size(), dir.dir, ": parameter table mismatch");
  for (size_t i = 0; i < base_specs_.size(); ++i) {
    const SafetensorsEntry& e = dir.store.get(base_specs_[i].name);
    QT_CHECK(e.shape == base_specs_[i].shape, e.file, ": tensor '", e.name, "' has shape ", shape_str(e.shape),
             ", expected ", shape_str(base_specs_[i].shape));
    std::vector<float> values = tensor_to_f32(e.view());
    for (size_t k = 0; k < values.size(); ++k)
      QT_CHECK(std::isfinite(values[k]), e.file, ": tensor '", e.name, "' holds ", std::isnan(values[k]) ? "NaN" : "inf",
               " (first at element ", k, " of ", values.size(), "): the input model is corrupt; training from it "
               "would fail at the first step");
    set_base_param_f32(i, values);
  }
  if (!lora_) return;
  for (size_t i = 0; i < num_adapter_tensors_; ++i) {
    std::vector<float> init(static_cast<size_t>(shape_numel(specs_[i].shape)));
    init_param(specs_[i], 0.0, lora_seed, DType::F32, init.data());
    set_param_f32(i, init);
  }
}

std::vector<float> Qwen35Model::download_f32(const Tensor& t) const {
  HostTensor h(t.dtype, t.shape_vec());
  be_.copy_to_host(h.t.data, t);
  return tensor_to_f32(h.t);
}

void Qwen35Model::upload_f32(const Tensor& t, const std::vector<float>& values, const std::string& name) {
  QT_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "upload: ", values.size(), " values for ", name, " ",
           t.describe());
  HostTensor h(t.dtype, t.shape_vec());
  tensor_from_f32(h.t, values.data());
  be_.copy_from_host(t, h.t.data);
}

void Qwen35Model::set_base_param_f32(size_t i, const std::vector<float>& values) {
  if (!(shards_ && shards_->sharded(i))) {
    upload_f32(base_[i], values, base_specs_[i].name);
    return;
  }
  // This rank's rows of the whole tensor.
  const ShardLayout& L = shards_->layout(i);
  QT_CHECK(static_cast<int64_t>(values.size()) == L.rows * L.cols, "upload: ", values.size(), " values for ",
           base_specs_[i].name, " ", base_[i].describe());
  const auto b = static_cast<std::ptrdiff_t>(L.begin * L.cols), e = static_cast<std::ptrdiff_t>(L.end * L.cols);
  upload_f32(shards_->shard_weight(i), std::vector<float>(values.begin() + b, values.begin() + e), base_specs_[i].name);
}
std::vector<float> Qwen35Model::base_param_f32(size_t i) const {
  if (!(shards_ && shards_->sharded(i))) return download_f32(base_[i]);
  shards_->gather(shards_->group_of(i));  // between steps: the buffer is gathered again before its next use
  return download_f32(base_[i]);
}
std::vector<float> Qwen35Model::param_f32(size_t i) const {
  return lora_ ? download_f32(params_[i]) : base_param_f32(i);
}
std::vector<float> Qwen35Model::grad_f32(size_t i) const {
  if (!(shards_ && shards_->sharded(i))) return download_f32(grads_[i]);
  return shards_->gather_whole_host(i, download_f32(shards_->shard_grad(i)));  // the summed gradient's rows
}
void Qwen35Model::set_param_f32(size_t i, const std::vector<float>& values) {
  if (lora_) upload_f32(params_[i], values, specs_[i].name);
  else set_base_param_f32(i, values);
}

Tensor Qwen35Model::replicated_grads() const {
  return Tensor(grads_flat_.data, DType::F32, {grads_flat_.numel() / 4}, grads_flat_.device);
}

const Tensor& Qwen35Model::optimizer_param(size_t i) const {
  return shards_ && shards_->sharded(i) ? shards_->shard_weight(i) : params_.at(i);
}
const Tensor& Qwen35Model::optimizer_grad(size_t i) const {
  return shards_ && shards_->sharded(i) ? shards_->shard_grad(i) : grads_.at(i);
}

void Qwen35Model::zero_grads() {
  be_.zero(grads_zeroed_);
  grads_fresh_ = true;
  micro_ = 0;
}

bool Qwen35Model::grad_overwrites(int base_index) const {
  // A sharded gradient is reduced after each micro-batch's backward, so each backward writes it anew.
  return grads_fresh_ || (shards_ && shards_->sharded(static_cast<size_t>(base_index)));
}

void Qwen35Model::zero3_gather(int group, bool in_backward) {
  if (!shards_) return;
  if (group >= 0 && !shards_->reshard_after_forward()) {
    // Each layer has its own buffer: gathered by the step's first forward (after the optimizer
    // changed the shards), kept through the step's backwards. A forward-only pass always gathers.
    if (in_backward || (pass_backward_ && micro_ > 0)) return;
  } else if (in_backward && group == static_cast<int>(cfg_.num_hidden_layers) - 1) {
    return;  // the last layer's buffer still holds it from this pass's forward
  }
  shards_->gather(group);
}

void Qwen35Model::zero3_reduce(int group, bool accumulate) {
  if (shards_) shards_->reduce(group, accumulate || micro_ > 0);
}

void Qwen35Model::proj_backward(const Tensor& dx, ParamRole role, int l, const Tensor& dy, const Tensor& x,
                                bool accumulate_dx, Fp8Tap dy_tap, int x_slot) {
  // Keeps is_projection (which gradients zero_grads() skips) in step with the roles written here.
  QT_CHECK(is_projection(role), "proj_backward: role ", static_cast<int>(role), " is not a projection");
  const int bi = role_index_[static_cast<size_t>(l + 1)][static_cast<int>(role)];
  const int f = fp8_id(role, l);
  if (f >= 0) {
    fp8_->backward(dx, g(role, l), dy, x, f, accumulate_dx, !grad_overwrites(bi), dy_tap, x_slot);
  } else {
    be_.linear_backward(dx, g(role, l), dy, x, p(role, l), accumulate_dx, !grad_overwrites(bi));
  }
  if (!lora_) return;
  const int i = lora_index_[static_cast<size_t>(l)][static_cast<int>(role)];
  if (i < 0) return;
  const int64_t T = dy.size(0);
  const auto a = static_cast<size_t>(i);
  const LoraArgs args{params_[a], params_[a + 1], lora_spec_.scale()};
  const LoraGrads grads{grads_[a], grads_[a + 1], !grads_fresh_};
  const Tensor t = rows(lora_t_[static_cast<size_t>(l)][static_cast<int>(role)], T);
  if (!dropout_active_) {
    be_.lora_backward(dx, grads, rows(lora_dt_, T), dy, x, t, args);
    return;
  }
  // Dropout: the mask is drawn again; dA from dropout(x), and the adapter's dx term through it.
  const Tensor xd = slab(lora_xd_, x.shape_vec()), u = slab(lora_u_, x.shape_vec());
  const DropoutArgs d = lora_dropout_args(role, l);
  be_.dropout(xd, x, d, false);
  be_.lora_backward(none(), grads, rows(lora_dt_, T), dy, xd, t, args);
  if (dx.data == nullptr) return;
  be_.linear_backward(u, none(), rows(lora_dt_, T), xd, params_[a], false, false);  // u = dt A
  be_.dropout(dx, u, d, true);
}

DropoutArgs Qwen35Model::lora_dropout_args(ParamRole role, int l) const {
  return {dropout_seed_, static_cast<uint32_t>(l * kNumRoles + static_cast<int>(role)), lora_spec_.dropout};
}

void Qwen35Model::set_dropout_step(int64_t step) {
  dropout_base_ = dropout_mix(static_cast<uint64_t>(step) * 0x2545f4914f6cdd1dull + 0x6a09e667f3bcc909ull);
  dropout_calls_ = 0;
}

void Qwen35Model::write_dropout_seed(int32_t* dst, uint64_t salt) const {
  const uint64_t seed = dropout_mix(dropout_base_ ^ (salt * 0x9e3779b97f4a7c15ull));
  dst[0] = static_cast<int32_t>(static_cast<uint32_t>(seed));
  dst[1] = static_cast<int32_t>(static_cast<uint32_t>(seed >> 32));
}

void Qwen35Model::proj_forward(const Tensor& y, ParamRole role, int l, const Tensor& x, const Fp8Input& in) {
  const int f = fp8_id(role, l);
  if (f >= 0) {
    fp8_->forward(y, x, f, in);
  } else {
    be_.linear_forward(y, x, p(role, l));
  }
  proj_lora_forward(y, role, l, x);
}

int Qwen35Model::fp8_id(ParamRole role, int l) const {
  return fp8_ ? fp8_ids_[static_cast<size_t>(l)][static_cast<int>(role)] : -1;
}

int Qwen35Model::fp8_slot(int l, Fp8Feed f) const {
  return fp8_slots_.empty() ? -1 : fp8_slots_[static_cast<size_t>(l)][static_cast<size_t>(f)];
}

Fp8Input Qwen35Model::fp8_input(int l, Fp8Feed f, LayerPass pass, Fp8Tap tap) const {
  const int slot = fp8_slot(l, f);
  return {tap, slot, slot >= 0 && pass == LayerPass::Forward && pass_backward_};
}

Tensor Qwen35Model::fp8_tap(ParamRole consumer, int l, Fp8Tap t) {
  return fp8_id(consumer, l) >= 0 ? fp8_->tap(t) : none();
}

Fp8Tap Qwen35Model::fp8_tapped(ParamRole consumer, int l, Fp8Tap t) const {
  return fp8_id(consumer, l) >= 0 ? t : Fp8Tap::None;
}

ParamRole Qwen35Model::input_proj_role(int l) const {
  return cfg_.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet ? ParamRole::GdnInProjQkv
                                                                               : ParamRole::AttnQProj;
}

namespace {
// Which codes train.precision fp8 allocates (Fp8Projections): weights [N, K] by id, each layer's
// role -> id (-1: bf16), kept input widths by slot, each layer's Fp8Feed -> slot. per_use (ZeRO-3):
// one set of weight codes per role, written at each layer's use.
struct Fp8Plan {
  std::vector<std::pair<int64_t, int64_t>> weights;
  std::vector<int64_t> slot_widths;
  std::vector<std::vector<int>> ids, slots;
  std::string skipped;  // the first projection off the FP8 layouts
};

Fp8Plan plan_fp8(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, Checkpointing ckpt, bool per_use,
                 bool frozen) {
  Fp8Plan p;
  const auto layers = static_cast<size_t>(cfg.num_hidden_layers);
  p.ids.assign(layers, std::vector<int>(kNumRoles, -1));
  std::vector<int> shared(kNumRoles, -1);
  for (const ParamSpec& s : specs) {
    if (s.layer < 0 || !runs_fp8(s.role)) continue;
    const int64_t N = s.shape[0], K = s.shape[1];
    if (!Fp8Projections::eligible(N, K)) {
      if (p.skipped.empty()) p.skipped = str(s.name, " [", N, ", ", K, "]");
      continue;
    }
    int& id = p.ids[static_cast<size_t>(s.layer)][static_cast<int>(s.role)];
    int& sh = shared[static_cast<size_t>(s.role)];
    if (per_use && sh >= 0) {
      id = sh;
      continue;
    }
    p.weights.push_back({N, K});
    id = static_cast<int>(p.weights.size()) - 1;
    if (per_use) sh = id;
  }
  // The wgrad's transposed input codes, written by the forward with the row-major ones (one read of
  // each input instead of a second pass): kept per layer unless full checkpointing recomputes the
  // layer anyway; none for frozen projections (LoRA: no wgrad).
  if (ckpt == Checkpointing::Full || frozen) return p;
  const AttnDims ad = attn_dims(cfg);
  p.slots.assign(layers, std::vector<int>(4, -1));
  for (size_t l = 0; l < layers; ++l) {
    const bool gdn = cfg.layer_types[l] == LayerKind::GatedDeltaNet;
    const int64_t mix = gdn ? cfg.value_dim() : ad.num_q_heads * ad.head_dim;
    // Fp8Feed order: xn, the mixer's gated output, hn, act; by the projection that reads each first.
    const std::pair<ParamRole, int64_t> feeds[] = {{gdn ? ParamRole::GdnInProjQkv : ParamRole::AttnQProj, cfg.hidden_size},
                                                   {gdn ? ParamRole::GdnOutProj : ParamRole::AttnOProj, mix},
                                                   {ParamRole::MlpGate, cfg.hidden_size},
                                                   {ParamRole::MlpDown, cfg.intermediate_size}};
    for (size_t f = 0; f < 4; ++f) {
      if (p.ids[l][static_cast<int>(feeds[f].first)] < 0) continue;
      p.slot_widths.push_back(feeds[f].second);
      p.slots[l][f] = static_cast<int>(p.slot_widths.size()) - 1;
    }
  }
  return p;
}
}  // namespace

bool fp8_head_eligible(const ModelConfig& cfg) { return Fp8Projections::eligible(cfg.vocab_size, cfg.hidden_size); }

int64_t fp8_codes_bytes(const ModelConfig& cfg, int64_t max_tokens, Checkpointing ckpt, bool sharded, bool frozen,
                        bool fp8_head) {
  const Fp8Plan p = plan_fp8(cfg, param_table(cfg), ckpt, sharded, frozen);
  if (p.weights.empty()) return 0;
  const bool head = fp8_head && fp8_head_eligible(cfg);
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  // The head's loss also keeps the e5m2 logit gradients transposed for its one wgrad: [V, T]
  // bytes of workspace past the bf16 head's.
  const int64_t ws = head ? V * ((max_tokens + 15) / 16 * 16) : 0;
  return Fp8Projections::bytes_for(max_tokens, p.weights, p.slot_widths, head ? std::pair{V, H} : std::pair<int64_t, int64_t>{0, 0}) + ws;
}

void Qwen35Model::set_precision(Precision precision, bool fp8_head) {
  QT_CHECK(fp8_ == nullptr, "set_precision: already set");
  if (precision == Precision::BF16) return;
  fp8_per_use_ = shards_ != nullptr;
  Fp8Plan plan = plan_fp8(cfg_, base_specs_, ckpt_, fp8_per_use_, lora_);
  QT_CHECK(plan.skipped.empty(), "train.precision fp8: ", plan.skipped,
           " has a dimension that is not a multiple of 16 (the FP8 GEMM layouts); use bf16 for this model");
  fp8_ = std::make_unique<Fp8Projections>(be_, max_tokens_);
  for (const auto& [N, K] : plan.weights) fp8_->add(N, K);  // ids in plan order
  for (const int64_t K : plan.slot_widths) fp8_->add_slot(K);
  if (fp8_head && fp8_head_eligible(cfg_)) fp8_->add_head(cfg_.vocab_size, cfg_.hidden_size);
  fp8_ids_ = std::move(plan.ids);
  fp8_slots_ = std::move(plan.slots);
  fp8_->allocate();
  plan_.fp8 = fp8_codes_bytes(cfg_, max_tokens_, ckpt_, fp8_per_use_, lora_, fp8_head);
  QT_CHECK(plan_.fp8 >= fp8_->bytes(), "fp8_codes_bytes is out of step with Fp8Projections");
}

void Qwen35Model::fp8_refresh(int l) {
  for (int r = 0; r < kNumRoles; ++r) {
    const int f = fp8_ids_[static_cast<size_t>(l)][r];
    if (f >= 0) fp8_->quantize_weight(f, p(static_cast<ParamRole>(r), l));
  }
}

void Qwen35Model::proj_lora_forward(const Tensor& y, ParamRole role, int l, const Tensor& x) {
  if (!lora_) return;
  const int i = lora_index_[static_cast<size_t>(l)][static_cast<int>(role)];
  if (i < 0) return;
  const auto a = static_cast<size_t>(i);
  Tensor in = x;
  if (dropout_active_) {  // the adapter sees dropout(x), the frozen projection x itself
    in = slab(lora_xd_, x.shape_vec());
    be_.dropout(in, x, lora_dropout_args(role, l), false);
  }
  be_.lora_forward(y, rows(lora_t_[static_cast<size_t>(l)][static_cast<int>(role)], y.size(0)), in,
                   {params_[a], params_[a + 1], lora_spec_.scale()});
}

void Qwen35Model::use_inputs(const Tensor& inputs, int num_seqs, int max_seqlen, int64_t T, int64_t seed_offset) {
  // Layout of every input buffer (capacity max_tokens_): ids, targets, positions, cu_seqlens.
  auto at = [&](int64_t off, int64_t n) {
    return Tensor(static_cast<int32_t*>(inputs.data) + off, DType::I32, {n}, inputs.device);
  };
  ids_ = at(0, T);
  targets_ = at(max_tokens_, T);
  positions_ = at(2 * max_tokens_, T);
  cu_seqlens_ = at(3 * max_tokens_, num_seqs + 1);
  dropout_seed_ = at(seed_offset, 2);
  seqs_.cu_seqlens = cu_seqlens_;
  seqs_.num_seqs = num_seqs;
  seqs_.total_tokens = static_cast<int>(T);
  seqs_.max_seqlen = max_seqlen;
}

void Qwen35Model::upload(const PackedRow& row) {
  row.validate(cfg_.vocab_size);
  const int64_t T = row.num_tokens();
  QT_CHECK(T <= max_tokens_, "packed row has ", T, " tokens, more than the planned ", max_tokens_);
  const int num_seqs = static_cast<int>(row.cu_seqlens.size()) - 1;
  int max_seqlen = 0;
  for (int s = 0; s < num_seqs; ++s)
    max_seqlen = std::max(max_seqlen, row.cu_seqlens[static_cast<size_t>(s) + 1] - row.cu_seqlens[static_cast<size_t>(s)]);
  use_inputs(inputs_, num_seqs, max_seqlen, T, 4 * max_tokens_ + 1);
  if (lora_ && lora_spec_.dropout > 0) {  // only a dropout run reads the seed: no copy otherwise
    int32_t seed[2];
    write_dropout_seed(seed, 1000 + dropout_calls_++);
    be_.copy_from_host(dropout_seed_, seed);
  }
  be_.copy_from_host(ids_, row.input_ids.data());
  be_.copy_from_host(targets_, row.targets.data());
  be_.copy_from_host(positions_, row.positions.data());
  be_.copy_from_host(cu_seqlens_, row.cu_seqlens.data());
}

void Qwen35Model::set_static_shape(int max_seqs, int slots) {
  QT_CHECK(static_slots_ == 0, "set_static_shape: already set (", static_slots_, " slots)");
  QT_CHECK(slots >= 1 && max_seqs >= 2, "set_static_shape: needs slots >= 1 and max_seqs >= 2 (got ", slots, ", ",
           max_seqs, ")");
  QT_CHECK(max_seqs <= max_tokens_, "set_static_shape: max_seqs ", max_seqs, " exceeds the ", max_tokens_,
           " planned tokens");
  static_max_seqs_ = max_seqs;
  static_slots_ = slots;
  const int64_t stride = 3 * max_tokens_ + max_seqs + 1 + 2;  // ... cu_seqlens, the dropout seed
  for (int s = 0; s < slots; ++s) {
    static_inputs_.push_back(be_.alloc(DType::I32, {stride}));
    staging_.push_back(static_cast<int32_t*>(be_.alloc_host(static_cast<size_t>(stride) * sizeof(int32_t))));
    plan_.inputs += stride * 4;
  }
  loss_sums_ = be_.alloc(DType::F64, {slots});
  gdn_state_.assign(static_cast<size_t>(cfg_.num_hidden_layers), Tensor());
  const GdnDims gd = gdn_dims(cfg_);
  const int64_t n_gdn = std::count(cfg_.layer_types.begin(), cfg_.layer_types.end(), LayerKind::GatedDeltaNet);
  static_split_seqlen_ = n_gdn > 0 ? be_.gdn_split_seqlen(gd, max_tokens_, max_seqs) : std::numeric_limits<int>::max();
  staged_longest_.assign(static_cast<size_t>(slots), static_cast<int>(max_tokens_));
  gdn_keep_ = gdn_keep_for(ckpt_, be_.gdn_prefers_prep(gd));
  int64_t bytes = be_.gdn_state_bytes(gd, max_tokens_, max_seqs, gdn_keep_);
  // None's states are part of its plan (choose_checkpointing); the others' part is kept only where
  // it leaves the reserve, so it never costs a policy (it saves the chunk table and prep: 6-10 % of
  // the GDN backward, bench_gdn).
  if (ckpt_ != Checkpointing::None && !gdn_keep_fits(gdn_kept_bytes(ckpt_, n_gdn, bytes), be_.free_memory_bytes()))
    bytes = 0;
  int64_t first_gdn = -1;
  if (bytes > 0)
    for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l)
      if (cfg_.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet) {
        Tensor& st = gdn_state_[static_cast<size_t>(l)];
        if (ckpt_ == Checkpointing::Full && first_gdn >= 0) {
          st = gdn_state_[static_cast<size_t>(first_gdn)];  // shared: each layer refills it just before its backward
          continue;
        }
        st = be_.alloc(DType::U8, {bytes});
        plan_.mixer_state += bytes;
        first_gdn = l;
      }
  if (first_gdn >= 0) plan_.mixer_kept = gdn_keep_ == GdnKeep::States ? "chunk states" : "prep's results";
  // The step is planned now (weights, optimizer, activations, GDN state); what stays free holds
  // the kernel workspaces. A 2000 MiB logits chunk (2048 rows at V = 248,320) halves the
  // cross-entropy's dW passes over the default 1000 MiB: -6 % of its time at 2B (bench_cuda_ops
  // --ce-rows 2048), taken when 8 GiB stay free.
  if (be_.free_memory_bytes() >= (int64_t(8) << 30)) be_.set_loss_chunk_budget(int64_t(2000) << 20);
}

const Tensor* Qwen35Model::gdn_state_for(int layer, int64_t T) const {
  if (static_cast<size_t>(layer) >= gdn_state_.size()) return nullptr;
  const Tensor& st = gdn_state_[static_cast<size_t>(layer)];
  if (st.data == nullptr) return nullptr;
  const GdnDims gd = gdn_dims(cfg_);
  // A row with more samples than the static bound (an eager fallback) does not fit: recompute.
  return be_.gdn_state_bytes(gd, T, seqs_.num_seqs, gdn_keep_) <= static_cast<int64_t>(st.nbytes()) ? &st : nullptr;
}

int Qwen35Model::static_seqs_needed(const PackedRow& row) const {
  const int own = static_cast<int>(row.cu_seqlens.size()) - 1;
  return own + (row.num_tokens() < max_tokens_ ? 1 : 0);
}

void Qwen35Model::stage(const PackedRow& row, int slot) {
  QT_CHECK(slot >= 0 && slot < static_slots_, "stage: slot ", slot, " of ", static_slots_,
           " (call set_static_shape first)");
  row.validate(cfg_.vocab_size);
  const int64_t T = row.num_tokens(), M = max_tokens_;
  QT_CHECK(T <= M, "packed row has ", T, " tokens, more than the planned ", M);
  const int need = static_seqs_needed(row);
  QT_CHECK(need <= static_max_seqs_, "packed row needs ", need, " samples (with padding), more than the static ",
           static_max_seqs_);
  int32_t* st = staging_[static_cast<size_t>(slot)];
  std::copy(row.input_ids.begin(), row.input_ids.end(), st);
  std::copy(row.targets.begin(), row.targets.end(), st + M);
  std::copy(row.positions.begin(), row.positions.end(), st + 2 * M);
  // Padding: one sample of ignored targets (token 0) fills the row to M tokens.
  for (int64_t t = T; t < M; ++t) {
    st[t] = 0;
    st[M + t] = -100;
    st[2 * M + t] = static_cast<int32_t>(t - T);
  }
  int32_t* cu = st + 3 * M;
  std::copy(row.cu_seqlens.begin(), row.cu_seqlens.end(), cu);
  int longest = static_cast<int>(M - T);  // the padding sample
  for (size_t s = 0; s + 1 < row.cu_seqlens.size(); ++s)
    longest = std::max(longest, row.cu_seqlens[s + 1] - row.cu_seqlens[s]);
  staged_longest_[static_cast<size_t>(slot)] = longest;
  // Empty samples at the end (cu repeating M): kernels see zero-length samples and skip them.
  for (int s = static_cast<int>(row.cu_seqlens.size()); s <= static_max_seqs_; ++s) cu[s] = static_cast<int32_t>(M);
  write_dropout_seed(cu + static_max_seqs_ + 1, static_cast<uint64_t>(slot));
}

bool Qwen35Model::staged_may_split(int slots) const {
  QT_CHECK(slots >= 0 && slots <= static_slots_, "staged_may_split: ", slots, " slots of ", static_slots_);
  for (int s = 0; s < slots; ++s)
    if (staged_longest_[static_cast<size_t>(s)] >= static_split_seqlen_) return true;
  return false;
}

void Qwen35Model::enqueue_step(int slot, bool backward, double grad_scale, bool may_split) {
  QT_CHECK(slot >= 0 && slot < static_slots_, "enqueue_step: slot ", slot, " of ", static_slots_);
  QT_CHECK(may_split || staged_longest_[static_cast<size_t>(slot)] < static_split_seqlen_, "enqueue_step: slot ",
           slot, " holds a ", staged_longest_[static_cast<size_t>(slot)], "-token sample, which the GDN may split (from ",
           static_split_seqlen_, " tokens), but the step was enqueued as one that may not");
  const Tensor& dev = static_inputs_[static_cast<size_t>(slot)];
  be_.copy_from_host(dev, staging_[static_cast<size_t>(slot)]);
  // max_seqlen is a bound the kernels plan by, kept by a captured graph: the whole row, or just
  // below the GDN's split for a step of short samples only.
  const int bound = may_split || static_split_seqlen_ > max_tokens_ ? static_cast<int>(max_tokens_)
                                                                     : static_split_seqlen_ - 1;
  use_inputs(dev, static_max_seqs_, bound, max_tokens_, 3 * max_tokens_ + static_max_seqs_ + 1);
  const Tensor sum(static_cast<double*>(loss_sums_.data) + slot, DType::F64, {1}, loss_sums_.device);
  forward_loss_backward(max_tokens_, backward, grad_scale, none(), &sum);
}

void Qwen35Model::forward_layers(int64_t T) {
  const ModelConfig& c = cfg_;
  profile::Scope phase(prof_, "forward");
  zero3_gather(WeightShards::kEmbed, false);
  be_.embedding_forward(rows(acts_[0].x, T), p(ParamRole::EmbedTokens, -1), rows(ids_, T));
  // The first layer normalizes its input; every later norm (layer inputs, the final norm) is fused
  // with the residual add that ends the layer before it.
  be_.rmsnorm_forward(rows(acts_[0].xn, T), rows(acts_[0].rstd_in, T), rows(acts_[0].x, T),
                      p(ParamRole::InputNorm, 0), c.rms_norm_eps, fp8_tap(input_proj_role(0), 0, Fp8Tap::Xn));
  for (int l = 0; l < static_cast<int>(c.num_hidden_layers); ++l) {
    zero3_gather(l, false);
    forward_layer(l, T, LayerPass::Forward);
  }
}

void Qwen35Model::forward_layer(int l, int64_t T, LayerPass pass) {
  const ModelConfig& c = cfg_;
  const GdnDims gd = gdn_dims(c);
  const AttnDims ad = attn_dims(c);
  const int64_t Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  // heavy: GEMMs, mixers, gates and adds, whose outputs selective checkpointing keeps.
  const bool heavy = pass != LayerPass::RecomputeCheap;
  LayerActs& A = acts_[static_cast<size_t>(l)];
  profile::Scope layer(prof_, pass == LayerPass::Forward ? "layer" : "recompute", l,
                       layer_kind_name(c.layer_types[static_cast<size_t>(l)]));
  const Tensor x = rows(A.x, T), xn = rows(A.xn, T);
  if (fp8_) {
    fp8_->forget_inputs();  // this layer's buffers (shared ones refilled) hold new values
    // The weights changed since the last step's forward (or a pass without backward: always).
    if (pass == LayerPass::Forward && (fp8_per_use_ || micro_ == 0 || !pass_backward_)) fp8_refresh(l);
  }
  // The forward pass got xn with x (forward_layers, or the previous layer's residual add), and its
  // amax where the input projections run fp8; a heavy recompute folds it in here.
  if (pass != LayerPass::Forward)
    be_.rmsnorm_forward(xn, rows(A.rstd_in, T), x, p(ParamRole::InputNorm, l), c.rms_norm_eps,
                        heavy ? fp8_tap(input_proj_role(l), l, Fp8Tap::Xn) : none());
  const Fp8Tap xn_tap = heavy ? fp8_tapped(input_proj_role(l), l, Fp8Tap::Xn) : Fp8Tap::None;
  Tensor mix_out = rows(A.h, T);  // mixer output, turned into h = x + mixer in place
  if (c.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet) {
    const Tensor mixed = rows(A.mixed, T), z = rows(A.z, T), b = rows(A.b, T), a = rows(A.a, T);
    const Tensor conv = rows(A.conv, T), beta = rows(A.beta, T), gg = rows(A.g, T);
    const Tensor o = rows(A.o, T).view({T, Hv, dv}), y = rows(A.y, T);
    if (heavy) {
      const Fp8Input in = fp8_input(l, Fp8Feed::In, pass, xn_tap);
      proj_forward(mixed, ParamRole::GdnInProjQkv, l, xn, in);
      proj_forward(z, ParamRole::GdnInProjZ, l, xn, in);
      proj_forward(b, ParamRole::GdnInProjB, l, xn);
      proj_forward(a, ParamRole::GdnInProjA, l, xn);
    }
    const Tensor& cw = p(ParamRole::GdnConv1d, l);
    be_.conv1d_silu_forward(conv, mixed, cw.view({cw.size(0), cw.size(2)}), seqs_);
    if (heavy) {
      be_.gdn_gates_forward(beta, gg, b, a, p(ParamRole::GdnALog, l), p(ParamRole::GdnDtBias, l));
      const Tensor* st = gdn_state_for(l, T);
      be_.gdn_forward(o, conv, gg, beta, gd, seqs_, st != nullptr ? *st : Tensor(), gdn_keep_);
    }
    be_.gated_rmsnorm_forward(y.view({T, Hv, dv}), slab(A.gnorm_rstd, {T * Hv}), o, z.view({T, Hv, dv}),
                              p(ParamRole::GdnNorm, l), c.rms_norm_eps);
    if (heavy) proj_forward(mix_out, ParamRole::GdnOutProj, l, y, fp8_input(l, Fp8Feed::Mix, pass));
  } else {
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    const Tensor qg = rows(A.qg, T), kr = rows(A.kr, T), v = rows(A.v, T);
    const Tensor q = rows(A.q, T).view({T, Hq, D}), k = rows(A.k, T).view({T, Hkv, D}), gate = rows(A.gate, T);
    const Tensor o = rows(A.attn_o, T).view({T, Hq, D}), y = rows(A.attn_y, T);
    if (heavy) {
      const Fp8Input in = fp8_input(l, Fp8Feed::In, pass, xn_tap);
      proj_forward(qg, ParamRole::AttnQProj, l, xn, in);
      proj_forward(kr, ParamRole::AttnKProj, l, xn, in);
      proj_forward(v, ParamRole::AttnVProj, l, xn, in);
    }
    be_.attn_prep_forward(q, k, gate, slab(A.q_rstd, {T * Hq}), slab(A.k_rstd, {T * Hkv}), qg, kr,
                          p(ParamRole::AttnQNorm, l), p(ParamRole::AttnKNorm, l), rows(positions_, T), ad,
                          c.rms_norm_eps);
    if (heavy) be_.attention_forward(o, slab(A.lse, {Hq, T}), q, k, v.view({T, Hkv, D}), ad, seqs_);
    be_.attn_gate_forward(y, o.view({T, Hq * D}), gate);
    if (heavy) proj_forward(mix_out, ParamRole::AttnOProj, l, y, fp8_input(l, Fp8Feed::Mix, pass));
  }
  const Tensor h = rows(A.h, T), hn = rows(A.hn, T);
  if (heavy)  // h = x + mixer (in place over the mixer output), then its norm
    be_.add_rmsnorm_forward(h, hn, rows(A.rstd_post, T), x, mix_out, p(ParamRole::PostAttnNorm, l), c.rms_norm_eps,
                            fp8_tap(ParamRole::MlpGate, l, Fp8Tap::Hn));
  else
    be_.rmsnorm_forward(hn, rows(A.rstd_post, T), h, p(ParamRole::PostAttnNorm, l), c.rms_norm_eps, none());
  const Tensor mg = rows(A.mlp_gate, T), mu = rows(A.mlp_up, T), act = rows(A.mlp_act, T);
  if (heavy) {
    const Fp8Input in = fp8_input(l, Fp8Feed::Hn, pass, fp8_tapped(ParamRole::MlpGate, l, Fp8Tap::Hn));
    proj_forward(mg, ParamRole::MlpGate, l, hn, in);
    proj_forward(mu, ParamRole::MlpUp, l, hn, in);
  }
  // Only the forward pass runs the down projection on act: its amax is folded in there.
  const bool act_tap = pass == LayerPass::Forward && fp8_id(ParamRole::MlpDown, l) >= 0;
  be_.swiglu_forward(act, mg, mu, act_tap ? fp8_->tap(Fp8Tap::Act) : none());
  if (pass != LayerPass::Forward) return;  // the backward needs neither the MLP output nor the next input
  // MLP output, then next = h + mlp (in place) fused with the next layer's input norm, or the final
  // norm after the last layer.
  const bool last = l + 1 == static_cast<int>(c.num_hidden_layers);
  const LayerActs* N = last ? nullptr : &acts_[static_cast<size_t>(l) + 1];
  const Tensor next = rows(last ? final_in_ : N->x, T);
  proj_forward(next, ParamRole::MlpDown, l, act, fp8_input(l, Fp8Feed::Act, pass, act_tap ? Fp8Tap::Act : Fp8Tap::None));
  be_.add_rmsnorm_forward(next, rows(last ? final_out_ : N->xn, T), rows(last ? final_rstd_ : N->rstd_in, T), h, next,
                          last ? p(ParamRole::FinalNorm, -1) : p(ParamRole::InputNorm, l + 1), c.rms_norm_eps,
                          last ? (fp8_head_pass_ ? fp8_->tap(Fp8Tap::Final) : none())
                               : fp8_tap(input_proj_role(l + 1), l + 1, Fp8Tap::Xn));
}

void Qwen35Model::backward_layers(int64_t T) {
  const ModelConfig& c = cfg_;
  const GdnDims gd = gdn_dims(c);
  const AttnDims ad = attn_dims(c);
  const int64_t I = c.intermediate_size, Hv = c.linear_num_value_heads;
  const int64_t dv = c.linear_value_head_dim, C = c.conv_dim(), VD = c.value_dim();
  const Tensor dr = rows(d_res_, T);   // gradient of the residual stream, updated in place
  const Tensor dn = rows(d_norm_out_, T);
  profile::Scope phase(prof_, "backward");
  for (int l = static_cast<int>(c.num_hidden_layers) - 1; l >= 0; --l) {
    zero3_gather(l, true);
    if (fp8_per_use_) fp8_refresh(l);  // before a recompute's forward GEMMs read them
    // Refill what the checkpointing policy dropped (into the shared work activations).
    if (ckpt_ == Checkpointing::Full) forward_layer(l, T, LayerPass::Recompute);
    if (ckpt_ == Checkpointing::Selective) forward_layer(l, T, LayerPass::RecomputeCheap);
    LayerActs& A = acts_[static_cast<size_t>(l)];
    profile::Scope layer(prof_, "layer", l, layer_kind_name(c.layer_types[static_cast<size_t>(l)]));
    if (fp8_) fp8_->forget_inputs();
    const Tensor x = rows(A.x, T), xn = rows(A.xn, T), h = rows(A.h, T), hn = rows(A.hn, T);
    // MLP: next = h + down(silu(gate(hn)) * up(hn))
    const Tensor dact = slab(d_a_, {T, I}), dgate = slab(d_b_, {T, I}), dup = slab(d_c_, {T, I});
    // dr's amax: folded in by the norm backward that wrote it (the next layer's input norm, or the final norm).
    proj_backward(dact, ParamRole::MlpDown, l, dr, rows(A.mlp_act, T), false, fp8_tapped(ParamRole::MlpDown, l, Fp8Tap::Dr),
                  fp8_slot(l, Fp8Feed::Act));
    const Tensor tap_g = fp8_tap(ParamRole::MlpGate, l, Fp8Tap::Dgate), tap_u = fp8_tap(ParamRole::MlpUp, l, Fp8Tap::Dup);
    be_.swiglu_backward(dgate, dup, dact, rows(A.mlp_gate, T), rows(A.mlp_up, T), tap_g, tap_u);
    proj_backward(dn, ParamRole::MlpGate, l, dgate, hn, false, tap_g.data ? Fp8Tap::Dgate : Fp8Tap::None,
                  fp8_slot(l, Fp8Feed::Hn));
    proj_backward(dn, ParamRole::MlpUp, l, dup, hn, true, tap_u.data ? Fp8Tap::Dup : Fp8Tap::None,
                  fp8_slot(l, Fp8Feed::Hn));
    const ParamRole out_role =
        c.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet ? ParamRole::GdnOutProj : ParamRole::AttnOProj;
    be_.rmsnorm_backward(dr, g(ParamRole::PostAttnNorm, l), dn, h, p(ParamRole::PostAttnNorm, l),
                         rows(A.rstd_post, T), true, fp8_tap(out_role, l, Fp8Tap::Dr));
    // Mixer: h = x + mixer(xn); dr now holds dL/dh.
    if (c.layer_types[static_cast<size_t>(l)] == LayerKind::GatedDeltaNet) {
      const Tensor dy = slab(d_a_, {T, VD}), d_o = slab(d_b_, {T, Hv, dv}), dz = slab(d_c_, {T, VD});
      const Tensor dconv = slab(d_d_, {T, C}), dmixed = slab(d_e_, {T, C});
      const Tensor dbeta = slab(d_f32_a_, {T, Hv}), dg = slab(d_f32_b_, {T, Hv});
      proj_backward(dy, ParamRole::GdnOutProj, l, dr, rows(A.y, T), false,
                    fp8_tapped(ParamRole::GdnOutProj, l, Fp8Tap::Dr), fp8_slot(l, Fp8Feed::Mix));
      be_.gated_rmsnorm_backward(d_o, dz.view({T, Hv, dv}), g(ParamRole::GdnNorm, l), dy.view({T, Hv, dv}),
                                 rows(A.o, T).view({T, Hv, dv}), rows(A.z, T).view({T, Hv, dv}),
                                 p(ParamRole::GdnNorm, l), slab(A.gnorm_rstd, {T * Hv}));
      const Tensor* st = gdn_state_for(l, T);
      be_.gdn_backward(dconv, dg, dbeta, d_o, rows(A.conv, T), rows(A.g, T), rows(A.beta, T), gd, seqs_,
                       st != nullptr ? *st : Tensor(), gdn_keep_);
      // db and da reuse the (now free) dy buffer: [T, Hv] each.
      const Tensor db = slab(d_a_, {T, Hv});
      const Tensor da = Tensor(static_cast<char*>(d_a_.data) + static_cast<size_t>(T * Hv) * dtype_size(d_a_.dtype),
                               d_a_.dtype, {T, Hv}, d_a_.device);
      be_.gdn_gates_backward(db, da, g(ParamRole::GdnALog, l), g(ParamRole::GdnDtBias, l), dbeta, dg, rows(A.b, T),
                             rows(A.a, T), p(ParamRole::GdnALog, l), p(ParamRole::GdnDtBias, l));
      const Tensor& cw = p(ParamRole::GdnConv1d, l);
      const Tensor& cgw = g(ParamRole::GdnConv1d, l);
      be_.conv1d_silu_backward(dmixed, cgw.data ? cgw.view({cgw.size(0), cgw.size(2)}) : none(), dconv, rows(A.mixed, T),
                               cw.view({cw.size(0), cw.size(2)}), seqs_);
      proj_backward(dn, ParamRole::GdnInProjQkv, l, dmixed, xn, false, Fp8Tap::None, fp8_slot(l, Fp8Feed::In));
      proj_backward(dn, ParamRole::GdnInProjZ, l, dz, xn, true, Fp8Tap::None, fp8_slot(l, Fp8Feed::In));
      proj_backward(dn, ParamRole::GdnInProjB, l, db, xn, true);
      proj_backward(dn, ParamRole::GdnInProjA, l, da, xn, true);
    } else {
      const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
      const Tensor dy = slab(d_a_, {T, Hq * D}), d_o = slab(d_b_, {T, Hq * D}), dgt = slab(d_c_, {T, Hq * D});
      const Tensor dq = slab(d_d_, {T, Hq, D});
      // dk, dv share d_e_ (each T*Hkv*D <= wide/2 * T since 2*Hq*D <= wide and Hkv <= Hq).
      const Tensor dk = slab(d_e_, {T, Hkv, D});
      const Tensor dv = Tensor(static_cast<char*>(d_e_.data) + static_cast<size_t>(T * Hkv * D) * dtype_size(d_e_.dtype),
                               d_e_.dtype, {T, Hkv, D}, d_e_.device);
      proj_backward(dy, ParamRole::AttnOProj, l, dr, rows(A.attn_y, T), false,
                    fp8_tapped(ParamRole::AttnOProj, l, Fp8Tap::Dr), fp8_slot(l, Fp8Feed::Mix));
      be_.attn_gate_backward(d_o, dgt, dy, rows(A.attn_o, T), rows(A.gate, T));
      be_.attention_backward(dq, dk, dv, d_o.view({T, Hq, D}), rows(A.q, T).view({T, Hq, D}),
                             rows(A.k, T).view({T, Hkv, D}), rows(A.v, T).view({T, Hkv, D}),
                             rows(A.attn_o, T).view({T, Hq, D}), slab(A.lse, {Hq, T}), ad, seqs_);
      // dqg [T, 2HqD] reuses d_a_ (dy is consumed); dkr reuses d_b_ (d_o is consumed).
      const Tensor dqg = slab(d_a_, {T, 2 * Hq * D}), dkr = slab(d_b_, {T, Hkv * D});
      be_.attn_prep_backward(dqg, dkr, g(ParamRole::AttnQNorm, l), g(ParamRole::AttnKNorm, l), dq, dk, dgt,
                             rows(A.qg, T), rows(A.kr, T), p(ParamRole::AttnQNorm, l), p(ParamRole::AttnKNorm, l),
                             slab(A.q_rstd, {T * Hq}), slab(A.k_rstd, {T * Hkv}), rows(positions_, T), ad);
      const int in = fp8_slot(l, Fp8Feed::In);
      proj_backward(dn, ParamRole::AttnQProj, l, dqg, xn, false, Fp8Tap::None, in);
      proj_backward(dn, ParamRole::AttnKProj, l, dkr, xn, true, Fp8Tap::None, in);
      proj_backward(dn, ParamRole::AttnVProj, l, dv.view({T, Hkv * D}), xn, true, Fp8Tap::None, in);
    }
    be_.rmsnorm_backward(dr, g(ParamRole::InputNorm, l), dn, x, p(ParamRole::InputNorm, l), rows(A.rstd_in, T), true,
                         l > 0 ? fp8_tap(ParamRole::MlpDown, l - 1, Fp8Tap::Dr) : none());
    zero3_reduce(l, false);
  }
  if (g(ParamRole::EmbedTokens, -1).data) {
    // A sharded embedding's whole gradient starts at zero each backward (the tied one's loss-head
    // part was reduced already: the layers shared its buffer since).
    const int e = role_index_[0][static_cast<int>(ParamRole::EmbedTokens)];
    if (shards_ && shards_->sharded(static_cast<size_t>(e))) shards_->zero_grad(WeightShards::kEmbed);
    be_.embedding_backward(g(ParamRole::EmbedTokens, -1), dr, rows(ids_, T));
    zero3_reduce(WeightShards::kEmbed, cfg_.tie_word_embeddings);
  }
  grads_fresh_ = false;
  ++micro_;  // the written-first gradients now hold this backward's: accumulate from here
}

LossResult Qwen35Model::step(const PackedRow& row, bool backward, double grad_scale, std::vector<float>* token_loss) {
  upload(row);
  const int64_t T = row.num_tokens();
  const Tensor tl = token_loss != nullptr ? rows(token_loss_, T) : none();
  LossResult r;
  r.loss_sum = forward_loss_backward(T, backward, grad_scale, tl, nullptr);
  r.num_trained = row.num_trained();
  if (token_loss != nullptr) {
    token_loss->resize(static_cast<size_t>(T));
    be_.copy_to_host(token_loss->data(), tl);
  }
  return r;
}

double Qwen35Model::forward_loss_backward(int64_t T, bool backward, double grad_scale, const Tensor& token_loss,
                                          const Tensor* loss_dev) {
  dropout_active_ = backward && lora_ && lora_spec_.dropout > 0;  // training passes only (not eval)
  pass_backward_ = backward;
  if (fp8_) fp8_->reset_taps();
  fp8_head_pass_ = fp8_head();
  forward_layers(T);
  const bool tied = cfg_.tie_word_embeddings;
  zero3_gather(tied ? WeightShards::kEmbed : WeightShards::kHead, false);  // the layers reused the embedding's buffer
  const int head_index = role_index_[0][static_cast<int>(tied ? ParamRole::EmbedTokens : ParamRole::LmHead)];
  const bool head_accumulates = !grad_overwrites(head_index);
  const Tensor& head = tied ? p(ParamRole::EmbedTokens, -1) : p(ParamRole::LmHead, -1);
  const Tensor dhead = backward ? (tied ? g(ParamRole::EmbedTokens, -1) : g(ParamRole::LmHead, -1)) : none();
  const Tensor dn = backward ? rows(d_norm_out_, T) : none();
  double loss_sum = 0;
  if (fp8_head_pass_) {
    profile::Scope loss(prof_, "loss");
    // The weight's codes as the projections' (the step's first forward; ZeRO-3 after each gather).
    if (fp8_per_use_ || micro_ == 0 || !pass_backward_) fp8_->quantize_head_weight(head);
    const Fp8HeadCodes codes = fp8_->head_codes(rows(final_out_, T), Fp8Tap::Final);
    const Tensor sum = loss_dev != nullptr ? *loss_dev : fp8_->loss_word();
    be_.linear_cross_entropy_fp8(sum, dn, dhead, token_loss, codes, rows(targets_, T), grad_scale, head_accumulates);
    if (loss_dev == nullptr) be_.copy_to_host(&loss_sum, sum);
  } else {
    profile::Scope loss(prof_, "loss");
    if (loss_dev != nullptr)
      be_.linear_cross_entropy_to(*loss_dev, dn, dhead, token_loss, rows(final_out_, T), head, rows(targets_, T),
                                  grad_scale, head_accumulates);
    else
      loss_sum = be_.linear_cross_entropy(dn, dhead, token_loss, rows(final_out_, T), head, rows(targets_, T), grad_scale,
                                          head_accumulates);
  }
  if (backward) {
    zero3_reduce(tied ? WeightShards::kEmbed : WeightShards::kHead, false);
    const Tensor dr = rows(d_res_, T);  // the residual stream's gradient starts at the final norm's dx
    be_.rmsnorm_backward(dr, g(ParamRole::FinalNorm, -1), dn, rows(final_in_, T), p(ParamRole::FinalNorm, -1),
                         rows(final_rstd_, T), false,
                         fp8_tap(ParamRole::MlpDown, static_cast<int>(cfg_.num_hidden_layers) - 1, Fp8Tap::Dr));
    backward_layers(T);
  }
  return loss_sum;
}

std::vector<float> Qwen35Model::logits(const PackedRow& row) {
  upload(row);
  dropout_active_ = false;
  pass_backward_ = false;
  fp8_head_pass_ = false;  // the bf16 head below
  if (fp8_) fp8_->reset_taps();
  const int64_t T = row.num_tokens(), V = cfg_.vocab_size;
  forward_layers(T);
  zero3_gather(cfg_.tie_word_embeddings ? WeightShards::kEmbed : WeightShards::kHead, false);
  const Tensor& head = cfg_.tie_word_embeddings ? p(ParamRole::EmbedTokens, -1) : p(ParamRole::LmHead, -1);
  // [T, V] is only needed for inspection and decoding, so its buffer grows on demand.
  if (logits_buf_.data == nullptr || logits_buf_.numel() < T * V) logits_buf_ = be_.alloc(be_.activation_dtype(), {T * V});
  const Tensor dev = slab(logits_buf_, {T, V});
  be_.linear_forward(dev, rows(final_out_, T), head);
  HostTensor host(dev.dtype, {T, V});
  be_.copy_to_host(host.t.data, dev);
  return tensor_to_f32(host.t);
}

}  // namespace qt
