// The Qwen3.5 text model (docs/model_spec.md section 3): forward and backward over one packed row,
// written once against the Backend interface. Parameters, gradients and every activation buffer
// are allocated at construction for `max_tokens`, so a training step allocates nothing; a batch
// with fewer tokens uses the leading rows of each buffer.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/hf_checkpoint.h"
#include "model/config.h"
#include "model/fp8_projections.h"
#include "model/lora.h"
#include "model/params.h"
#include "model/weight_shards.h"
#include "ops/backend.h"

namespace qt {
namespace profile {
class Profiler;
}

// One packed row on the host. targets[t] is the label the position t predicts (already shifted;
// -100 = not trained); positions restart at 0 for every sample; cu_seqlens = sample boundaries.
struct PackedRow {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> targets;
  std::vector<int32_t> positions;
  std::vector<int32_t> cu_seqlens;  // [num_seqs + 1]

  int64_t num_tokens() const { return static_cast<int64_t>(input_ids.size()); }
  int64_t num_trained() const;
  // Appends one sample given HF-style unshifted labels (same length as ids; -100 = ignored).
  void append_sample(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels);
  void validate(int64_t vocab_size) const;  // throws qt::Error on any inconsistency
};

// Activation checkpointing: what the forward keeps for the backward.
//   none:      every activation;
//   selective: all but what one elementwise op recomputes from kept tensors (the norm outputs,
//              the conv output, the gated-norm output, q/k/gate after prep, the gated attention
//              output, the SwiGLU output); the backward recomputes them layer by layer (a few
//              bandwidth-bound kernels; ~40 % less activation memory);
//   full:      only each layer's input; the backward recomputes the whole layer but its last GEMM
//              (about one more forward pass).
enum class Checkpointing { None, Selective, Full };
const char* checkpointing_name(Checkpointing c);
std::optional<Checkpointing> checkpointing_from_name(const std::string& name);  // none|selective|full
// What a memory plan leaves free beyond its own parts: the cross-entropy chunk, the GDN and
// attention workspaces, cuBLASLt and fragmentation (choose_checkpointing_within, gdn_keep_fits, plan).
inline constexpr int64_t kWorkspaceReserve = int64_t(4) << 30;
// Bytes of the gradient scratch shared by all layers (the residual, the norm output, five wide buffers).
int64_t gradient_scratch_bytes(const ModelConfig& cfg, DType act, int64_t max_tokens);
// Activation bytes a model planned for max_tokens with this policy would allocate.
int64_t activation_bytes(const ModelConfig& cfg, DType act, int64_t max_tokens, Checkpointing ckpt);
// The policy for training cfg on backend at max_tokens per row (at most max_seqs samples): the
// first of none, selective, full whose activations fit in the backend's free memory next to the
// weights, fp32 gradients, AdamW state (master, m, v) and a reserve for scratch and kernel
// workspaces (none also keeps the GDN forward state, Backend::gdn_state_bytes); none where the
// backend reports no device budget (CPU). `why` (optional) receives the figures.
// trained_params: parameters with gradients and AdamW state (-1 = all: full fine-tuning; LoRA: the
// adapters').
// zero3_world > 0: the model is sharded by ZeRO-3 over that many ranks (weights, gradients and AdamW
// state divided by it, its gather buffers added).
// precision fp8: the projections' codes count too, and with fp8_head the LM head's (fp8_codes_bytes).
Checkpointing choose_checkpointing(const ModelConfig& cfg, const Backend& backend, int64_t max_tokens, int max_seqs,
                                   std::string* why = nullptr, int64_t trained_params = -1, int zero3_world = 0,
                                   Precision precision = Precision::BF16, bool fp8_head = true);
// The same decision from explicit figures (GDN state of all layers, free bytes). Throws, naming
// the figures, when even full checkpointing does not fit.
Checkpointing choose_checkpointing_within(const ModelConfig& cfg, DType act, int64_t max_tokens, int64_t gdn_state_bytes,
                                          int64_t free_bytes, std::string* why = nullptr, int64_t trained_params = -1,
                                          int zero3_world = 0, Precision precision = Precision::BF16,
                                          bool fp8_head = true);
// Device bytes of train.precision fp8's codes (Qwen35Model::set_precision: MemoryPlan::fp8) for a
// model planned at max_tokens with this policy; sharded: ZeRO-3, frozen: LoRA's base projections.
// fp8_head: with the LM head's codes (when its shape allows) and its extra loss workspace.
int64_t fp8_codes_bytes(const ModelConfig& cfg, int64_t max_tokens, Checkpointing ckpt, bool sharded, bool frozen,
                        bool fp8_head = true);
// Whether the LM head of cfg can run in FP8 (V and H multiples of 16).
bool fp8_head_eligible(const ModelConfig& cfg);
// What each policy keeps of a GDN layer's forward for its backward (Backend::gdn_forward's `keep`):
// none prep's results where the backend prefers them (Backend::gdn_prefers_prep: the backward runs
// the forward scan again, as fast as reading kept states; CUDA at dk = dv = 128) and the chunk states
// elsewhere (no forward stage runs again), part of none's memory either way; selective prep's
// results per layer; full
// the same in one buffer every layer shares (each layer's forward runs again just before its
// backward and refills it). The last two are optional: kept only where memory is left after the
// plan (gdn_keep_fits), never a reason to pick a slower policy.
GdnKeep gdn_keep_for(Checkpointing ckpt, bool prefers_prep);
// Bytes of that over n_gdn GDN layers, from one layer's Backend::gdn_state_bytes for that keep.
int64_t gdn_kept_bytes(Checkpointing ckpt, int64_t n_gdn, int64_t layer_bytes);
// Whether selective's / full's optional GDN part (kept_bytes) is kept with free_bytes free after the
// plan: it must leave the plan's 4 GiB reserve for workspaces (free_bytes < 0: no device budget).
bool gdn_keep_fits(int64_t kept_bytes, int64_t free_bytes);

// Bytes the model allocates at construction, by kind (the step itself allocates nothing).
struct MemoryPlan {
  int64_t weights = 0, grads = 0, activations = 0, scratch = 0, inputs = 0, mixer_state = 0;
  int64_t fp8 = 0;  // train.precision fp8: the weights' e4m3 codes and the codes scratch
  const char* mixer_kept = "nothing";  // what mixer_state holds: "chunk states", "prep's results" or "nothing"
  int64_t total() const { return weights + grads + activations + scratch + inputs + mixer_state + fp8; }
  std::string describe() const;
  Checkpointing checkpointing = Checkpointing::None;
};

struct LossResult {
  double loss_sum = 0;      // sum of per-token cross-entropy over trained targets
  int64_t num_trained = 0;  // trained targets in the row
};

// ZeRO-3 (model/weight_shards.h): the ranks of `comm` each keep a row range of every large matrix;
// the model gathers a layer's weights before it runs and reduce-scatters its gradients after its
// backward. Full fine-tuning only.
struct Zero3Options {
  Communicator* comm = nullptr;
  bool reshard_after_forward = true;
};

// With a LoraSpec the base weights are frozen (no gradient, no optimizer state) and the trainable
// tensors (specs(), param(), grad()) are the adapters of model/lora.h; without, every parameter of
// param_table is trainable.
class Qwen35Model {
 public:
  Qwen35Model(const ModelConfig& cfg, Backend& backend, int64_t max_tokens,
              Checkpointing ckpt = Checkpointing::None, const LoraSpec* lora = nullptr,
              const Zero3Options* zero3 = nullptr);
  ~Qwen35Model();
  Qwen35Model(const Qwen35Model&) = delete;
  Qwen35Model& operator=(const Qwen35Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  // The trainable tensors: every parameter (full fine-tuning) or the LoRA adapters.
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The base model's parameters (param_table), trained or frozen.
  const std::vector<ParamSpec>& base_specs() const { return base_specs_; }
  const LoraSpec* lora() const { return lora_ ? &lora_spec_ : nullptr; }
  // LoRA: specs() holds the adapters (A, B per projection) first, then the modules_to_save weights.
  size_t num_adapter_tensors() const { return lora_ ? num_adapter_tensors_ : 0; }
  const Tensor& param(size_t i) const { return params_[i]; }
  const Tensor& grad(size_t i) const { return grads_[i]; }
  int64_t max_tokens() const { return max_tokens_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  Backend& backend() { return be_; }

  // Copies (and converts) every base parameter from an HF directory; with LoRA, also initializes
  // the adapters as PEFT does (A Kaiming-uniform from `lora_seed`, B zero).
  void load(const HfModelDir& dir, uint64_t lora_seed = 0);
  // Host f32 copy of a base parameter (the merged / frozen weights).
  std::vector<float> base_param_f32(size_t i) const;
  void set_base_param_f32(size_t i, const std::vector<float>& values);
  // LoRA dropout: the masks of the next training rows derive from `step` (and the row's slot, or
  // its order since this call), so they differ from step to step and recompute identically.
  void set_dropout_step(int64_t step);
  // Host copies of one parameter / gradient as f32 (for saving, tests, the optimizer twin). Under
  // ZeRO-3 a sharded tensor's whole copy is gathered from every rank (a collective: every rank calls
  // it in the same order), and set_param_f32 keeps this rank's rows of the whole tensor given.
  std::vector<float> param_f32(size_t i) const;
  std::vector<float> grad_f32(size_t i) const;
  void set_param_f32(size_t i, const std::vector<float>& values);

  // ---- ZeRO-3 ----
  // nullptr without; else the shards (whether tensor i is sharded, its row range).
  const WeightShards* weight_shards() const { return shards_.get(); }
  WeightShards* weight_shards() { return shards_.get(); }
  // What the optimizer updates for trainable tensor i: this rank's rows of a sharded tensor (the
  // weights and the gradient summed over the ranks), else the whole parameter and gradient.
  const Tensor& optimizer_param(size_t i) const;
  const Tensor& optimizer_grad(size_t i) const;
  // The gradients of the tensors ZeRO-3 does not shard, as one f32 buffer (summed over the ranks in
  // one all-reduce; alignment gaps included, zero).
  Tensor replicated_grads() const;
  // Host f32 copies of those, and writing the weights (converted to the weights' dtype).
  std::vector<float> optimizer_grad_f32(size_t i) const { return download_f32(optimizer_grad(i)); }
  void set_optimizer_param_f32(size_t i, const std::vector<float>& values) {
    upload_f32(optimizer_param(i), values, specs_.at(i).name);
  }

  // Starts a step's gradients: zeroes those that accumulate from several ops, and marks the others
  // (projections, loss head) for overwriting by the next backward (later backwards accumulate).
  void zero_grads();
  // Forward over the row; with backward=true also accumulates into the gradients the gradient of
  // grad_scale * loss_sum. token_loss (optional, host) receives per-position losses.
  LossResult step(const PackedRow& row, bool backward, double grad_scale, std::vector<float>* token_loss = nullptr);
  // Logits [T, V] (host, f32) for every position of the row (for generation and parity checks).
  std::vector<float> logits(const PackedRow& row);

  // ---- precision (docs/fp8.md) ----
  // fp8: the decoder's projections (all but the GDN's b and a, which are 16 wide) run their
  // forward, dgrad and wgrad as e4m3 GEMMs with per-tensor current scaling; their weight codes are
  // written once a step (by the step's first forward; under ZeRO-3 at each use, one layer's at a
  // time, so the codes stay a layer's size). The LM head, attention, the GDN and the norms stay
  // bf16 / fp32, as do the LoRA adapters. fp8_head (train.fp8_lm_head): the LM head's three
  // products too (linear_cross_entropy_fp8; its weight codes refreshed as the projections'), where V
  // and H are multiples of 16, else it stays bf16 (fp8_head() says which). logits() keeps the bf16
  // head. Allocates (call once, at set-up).
  void set_precision(Precision p, bool fp8_head = true);
  Precision precision() const { return fp8_ ? Precision::FP8 : Precision::BF16; }
  bool fp8_head() const { return fp8_ && fp8_->has_head(); }
  // ---- static shapes (whole-step CUDA graphs) ----
  // From here on, staged rows are padded to max_tokens tokens (the padding is one extra sample
  // whose targets are all ignored) and cu_seqlens to max_seqs + 1 entries (repeating the row
  // end), so every kernel's grid and workspace are the same for every row. `slots` rows can be
  // staged at once (one per micro-batch of a step), each in its own page-locked host slot and
  // device input buffer. It also allocates the GDN forward state the backward reuses
  // (Backend::gdn_state_bytes; what gdn_keep_for the policy names, where gdn_keep_fits for selective
  // and full). Allocates (call once, at set-up).
  void set_static_shape(int max_seqs, int slots);
  int static_max_seqs() const { return static_max_seqs_; }
  // Samples the row needs in a static slot (its own plus the padding one).
  int static_seqs_needed(const PackedRow& row) const;
  // Host only: validates the row and writes it, padded, into the slot's staging.
  void stage(const PackedRow& row, int slot);
  // Whether a row staged in one of the first `slots` slots has a sample (the padding one included)
  // long enough for the GDN kernels to split it (Backend::gdn_split_seqlen). The kernels' choice
  // follows the max_seqlen bound a step passes, which a captured graph keeps: a caller captures one
  // graph per answer (TrainStep), so rows of short samples run the unsplit kernels.
  bool staged_may_split(int slots) const;
  // Enqueues with no host synchronization (capturable): the copy of the slot's staging to the
  // device, the forward pass, the loss sum into static_loss_sums()[slot] and, with backward, the
  // gradient of grad_scale * loss_sum accumulated into the gradients. may_split: the step's rows
  // as staged_may_split answered (the bound is the whole row if so, else just below the split).
  void enqueue_step(int slot, bool backward, double grad_scale, bool may_split = true);
  const Tensor& static_loss_sums() const { return loss_sums_; }  // f64 [slots] on the device

  struct LayerActs;  // (internal) one layer's activation tensors

 private:
  // Forward: everything; Recompute: the layer again from its input, without the last GEMM and the
  // residual add (the backward needs neither); RecomputeCheap: only the elementwise ops whose
  // outputs selective checkpointing drops.
  enum class LayerPass { Forward, Recompute, RecomputeCheap };
  void forward_layer(int l, int64_t T, LayerPass pass);
  void upload(const PackedRow& row);
  // Points ids_, targets_, positions_, cu_seqlens_ and dropout_seed_ (at seed_offset) into inputs.
  void use_inputs(const Tensor& inputs, int num_seqs, int max_seqlen, int64_t T, int64_t seed_offset);
  void write_dropout_seed(int32_t* dst, uint64_t salt) const;
  DropoutArgs lora_dropout_args(ParamRole role, int l) const;
  // Forward from the uploaded inputs, the loss (returned, or into loss_dev when given: no sync),
  // and with backward the gradients.
  double forward_loss_backward(int64_t T, bool backward, double grad_scale, const Tensor& token_loss,
                               const Tensor* loss_dev);
  void forward_layers(int64_t T);
  void backward_layers(int64_t T);
  // dx (= or +=) dy W and the projection's dW (see grads_fresh_) for the weight of `role` in layer l.
  // fp8: dy_tap names the amax its producer folded in; x_slot the kept transposed codes of x.
  void proj_backward(const Tensor& dx, ParamRole role, int l, const Tensor& dy, const Tensor& x, bool accumulate_dx,
                     Fp8Tap dy_tap = Fp8Tap::None, int x_slot = -1);
  // With LoRA: after the projection of `role` in layer l wrote y from x, adds its adapter's term.
  void proj_lora_forward(const Tensor& y, ParamRole role, int l, const Tensor& x);
  // The projection of `role` in layer l: y = x W^T, plus its LoRA adapter's term where it has one.
  void proj_forward(const Tensor& y, ParamRole role, int l, const Tensor& x, const Fp8Input& in = {});
  // fp8: layer l's weight codes from its current weights.
  void fp8_refresh(int l);
  int fp8_id(ParamRole role, int l) const;  // -1: the projection runs in bf16
  // The projection inputs whose transposed codes the forward keeps for the wgrad (not under full
  // checkpointing, whose recompute refills them, nor for frozen weights).
  enum class Fp8Feed { In, Mix, Hn, Act, kCount };  // xn, the mixer's gated output, hn, act
  int fp8_slot(int l, Fp8Feed f) const;             // -1: not kept
  Fp8Input fp8_input(int l, Fp8Feed f, LayerPass pass, Fp8Tap tap = Fp8Tap::None) const;
  // The amax word the op producing the input of `consumer` folds into, or empty when that
  // projection runs in bf16.
  Tensor fp8_tap(ParamRole consumer, int l, Fp8Tap t);
  Fp8Tap fp8_tapped(ParamRole consumer, int l, Fp8Tap t) const;  // t where fp8_tap gave a word, else None
  ParamRole input_proj_role(int l) const;  // the first projection reading layer l's xn
  std::vector<float> download_f32(const Tensor& t) const;
  void upload_f32(const Tensor& t, const std::vector<float>& values, const std::string& name);
  const Tensor& p(ParamRole role, int layer) const;
  const Tensor& g(ParamRole role, int layer) const;
  Tensor rows(const Tensor& t, int64_t T) const;  // leading T rows of a [max_tokens, ...] buffer
  // ZeRO-3 hooks (no-ops without): the group's weights before use; its gradients after its backward.
  void zero3_gather(int group, bool in_backward);
  void zero3_reduce(int group, bool accumulate);  // accumulate: or a later micro-batch
  // Whether the backward's first op writes (rather than adds to) the gradient of base tensor i.
  bool grad_overwrites(int base_index) const;

  ModelConfig cfg_;
  Backend& be_;
  profile::Profiler* prof_;  // non-null when be_ is a ProfiledBackend: layer/phase scopes
  int64_t max_tokens_;
  Checkpointing ckpt_;
  MemoryPlan plan_;
  std::vector<ParamSpec> specs_, base_specs_;
  std::vector<Tensor> params_, grads_;  // the trainable tensors (specs_)
  std::vector<Tensor> base_;            // base_specs_' tensors (= params_ without LoRA)
  bool lora_ = false;
  LoraSpec lora_spec_;
  std::vector<std::vector<int>> lora_index_;     // [layer][role] -> index of the adapter's A in params_ (B next), -1
  std::vector<std::vector<Tensor>> lora_t_;      // [layer][role]: scale * x A^T kept for the backward [T, r]
  Tensor lora_dt_;                               // backward scratch [T, r]
  Tensor lora_xd_, lora_u_;                      // dropout: the adapter's input, dt A (scratch, [T, widest])
  bool dropout_active_ = false;                  // this pass trains with lora.dropout > 0
  uint64_t dropout_base_ = 0;
  uint64_t dropout_calls_ = 0;
  Tensor dropout_seed_;                          // i32 [2] in the current inputs
  Tensor no_grad_;                               // what g() gives for a frozen parameter
  size_t num_adapter_tensors_ = 0;
  std::vector<int> trainable_of_base_;           // [base index] -> index into params_ (-1: frozen)
  Tensor grads_flat_;    // the one buffer every gradient views into
  Tensor grads_zeroed_;  // its front part: the gradients zero_grads() clears (see the constructor)
  bool grads_fresh_ = false;  // zero_grads() ran and no backward since: the written-first gradients overwrite
  std::unique_ptr<WeightShards> shards_;  // ZeRO-3
  std::unique_ptr<Fp8Projections> fp8_;   // train.precision fp8
  bool fp8_head_pass_ = false;             // this forward ends in the fp8 head: the final norm taps its amax
  std::vector<std::vector<int>> fp8_ids_; // [layer][role] -> codes id (-1: bf16)
  bool fp8_per_use_ = false;              // ZeRO-3: one set of codes, written at each layer's use
  std::vector<std::vector<int>> fp8_slots_;  // [layer][Fp8Feed] -> kept input codes (-1: none)
  bool pass_backward_ = false;  // the pass running now has a backward
  int micro_ = 0;               // backwards since zero_grads() (ZeRO-3: the first one's sums are written, later added)
  std::vector<std::vector<int>> role_index_;  // [layer + 1][role] -> index into base_ (-1 if none)

  // Inputs: one i32 buffer per row, [ids T | targets T | positions T | cu_seqlens], and views.
  Tensor inputs_, ids_, targets_, positions_, cu_seqlens_;
  SeqInfo seqs_;
  // Static shapes: device input buffers, page-locked staging (same layout) and loss sums per slot.
  int static_max_seqs_ = 0, static_slots_ = 0;
  int static_split_seqlen_ = 0;          // Backend::gdn_split_seqlen at the static shape
  std::vector<int> staged_longest_;      // [slot]: the staged row's longest sample, padding included
  std::vector<Tensor> static_inputs_;
  std::vector<int32_t*> staging_;
  Tensor loss_sums_;
  std::vector<Tensor> gdn_state_;  // [layer]: the kept GDN forward state (empty: recomputed; full: one shared)
  GdnKeep gdn_keep_ = GdnKeep::States;  // what gdn_state_ keeps (gdn_keep_for the policy)
  const Tensor* gdn_state_for(int layer, int64_t T) const;
  // Activations saved for backward
  std::vector<LayerActs> acts_;  // per layer; tensors the policy does not keep alias work_
  std::vector<LayerActs> work_;  // [layer kind]: the shared, recomputed activations
  Tensor final_in_, final_rstd_, final_out_, token_loss_, logits_buf_;
  // Gradient scratch shared by all layers
  Tensor d_res_, d_norm_out_, d_a_, d_b_, d_c_, d_d_, d_e_, d_f32_a_, d_f32_b_;
};

}  // namespace qt
