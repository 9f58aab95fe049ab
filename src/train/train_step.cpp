#include "train/train_step.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "profile/profiled_backend.h"

namespace qt {

struct TrainStep::GraphState {
  struct Captured {
    std::unique_ptr<CapturedStep> graph;
    uint64_t ws_generation = 0;
    double max_grad_norm = 0;
    bool logged = false;
  };
  Captured graphs[2];  // [may_split]
};

Checkpointing resolve_checkpointing(const std::string& policy, const ModelConfig& cfg, const Backend& backend,
                                    int64_t tokens_per_row, int max_seqs, int64_t trained_params, int zero3_world,
                                    Precision precision, bool fp8_head) {
  if (policy != "auto") {
    const std::optional<Checkpointing> c = checkpointing_from_name(policy);
    QT_CHECK(c.has_value(), "activation checkpointing '", policy, "' is not auto, none, selective or full");
    log_info("activation checkpointing: ", policy, " (as asked)");
    return *c;
  }
  std::string why;
  const Checkpointing c =
      choose_checkpointing(cfg, backend, tokens_per_row, max_seqs, &why, trained_params, zero3_world, precision, fp8_head);
  log_info("activation checkpointing (auto): ", why);
  return c;
}

TrainStep::TrainStep(Qwen35Model& model, ModelOptimizer& opt, int64_t micro_batches, int max_seqs, bool graph,
                     Communicator* comm)
    : model_(model), opt_(opt), comm_(comm), micro_(micro_batches), gs_(std::make_unique<GraphState>()) {
  QT_CHECK(micro_batches >= 1, "TrainStep: micro_batches must be >= 1");
  // Static shapes need the sync-free optimizer (the device one); the profiler's decorator times
  // each op with host-side events, so profiled runs stay eager with exact shapes.
  static_ = opt.supports_enqueue() && profile::attached_profiler(model.backend()) == nullptr;
  if (!static_) return;
  model.set_static_shape(std::max(2, max_seqs), static_cast<int>(micro_batches));
  host_results_ = static_cast<double*>(model.backend().alloc_host(sizeof(double) * static_cast<size_t>(micro_ + 1)));
  // A communicator that stages through the host (MPI on GPU ranks) synchronizes: eager steps.
  if (!graph || (comm != nullptr && !comm->capturable())) return;
  for (GraphState::Captured& g : gs_->graphs) g.graph = model.backend().make_captured_step();
  graph_ = gs_->graphs[0].graph != nullptr;  // the backend can capture a step
}

TrainStep::~TrainStep() = default;

std::string TrainStep::mode() const {
  if (graph_) return "cuda-graph";
  return static_ ? "eager (static shapes)" : "eager";
}

double TrainStep::device_memory_gib() const {
  const int64_t used = model_.backend().device_memory_used_bytes();
  return used < 0 ? 0.0 : double(used) / double(1ull << 30);
}

std::string TrainStep::memory_report() const {
  const double mib = 1.0 / double(1 << 20);
  std::string out = str("optimizer state ", double(opt_.state_bytes()) * mib, " MiB");
  if (model_.backend().device_memory_used_bytes() >= 0)
    out += str(" | kernel workspace ", double(model_.backend().workspace_bytes()) * mib, " MiB | device in use ",
               device_memory_gib(), " GiB");
  return out;
}

StepResult TrainStep::run_dynamic(const std::vector<PackedRow>& rows, double lr, double max_grad_norm, int64_t step,
                                  int64_t global_trained) {
  StepResult r;
  for (const PackedRow& row : rows) {
    r.trained += row.num_trained();
    r.tokens += row.num_tokens();
  }
  if (global_trained >= 0) r.trained = global_trained;
  const auto t0 = std::chrono::steady_clock::now();
  model_.set_dropout_step(step);
  model_.zero_grads();
  // Each row's gradient is scaled by 1 / (trained tokens of the whole step): the accumulated
  // gradient is that of the step's mean loss.
  for (const PackedRow& row : rows) r.loss_sum += model_.step(row, true, 1.0 / double(r.trained)).loss_sum;
  r.grad_norm = opt_.step(lr, max_grad_norm, step);
  // After the optimizer, as in the static step: a rank that runs this step eagerly (a row over the
  // static sample bound) issues its collectives in the same order as the ranks that replay a graph.
  if (comm_ != nullptr) comm_->all_reduce_host(&r.loss_sum, 1);  // every rank's rows
  QT_CHECK(std::isfinite(r.loss_sum), "step ", step, ": loss is ", r.loss_sum, " (diverged; lower train.lr?)");
  r.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void TrainStep::enqueue_all(double max_grad_norm, bool may_split) {
  model_.zero_grads();
  for (int64_t i = 0; i < micro_; ++i) model_.enqueue_step(static_cast<int>(i), true, 1.0, may_split);
  opt_.enqueue_step(max_grad_norm, host_results_ + micro_);
  model_.backend().copy_to_host_async(host_results_, model_.static_loss_sums());
}

StepResult TrainStep::run(const std::vector<PackedRow>& rows, double lr, double max_grad_norm, int64_t step,
                          int64_t global_trained) {
  QT_CHECK(!rows.empty() || global_trained >= 0, "step ", step, ": no rows");
  int64_t trained = 0;
  for (const PackedRow& row : rows) trained += row.num_trained();
  if (global_trained >= 0) trained = global_trained;
  QT_CHECK(trained > 0, "step ", step, ": no trained targets in its rows");
  bool fits = static_ && static_cast<int64_t>(rows.size()) == micro_;
  if (fits)
    for (const PackedRow& row : rows) fits = fits && model_.static_seqs_needed(row) <= model_.static_max_seqs();
  if (!fits) {
    if (static_ && static_cast<int64_t>(rows.size()) == micro_)
      log_warn("step ", step, ": a row has more samples than the static bound ", model_.static_max_seqs(),
               "; this step runs eagerly with exact shapes");
    return run_dynamic(rows, lr, max_grad_norm, step, global_trained);
  }
  StepResult r;
  r.trained = trained;
  const auto t0 = std::chrono::steady_clock::now();
  model_.set_dropout_step(step);
  for (size_t i = 0; i < rows.size(); ++i) {
    model_.stage(rows[i], static_cast<int>(i));
    r.tokens += rows[i].num_tokens();
  }
  opt_.set_step(lr, step, 1.0 / double(trained));
  // Rows of short samples only run the GDN's unsplit kernels: their own graph.
  const bool may_split = model_.staged_may_split(static_cast<int>(micro_));
  bool launched = false;
  if (graph_ && warmed_[may_split]) {
    GraphState::Captured& g = gs_->graphs[may_split];
    const Backend& be = model_.backend();
    // A workspace reallocated since the capture (an eval row, a larger shape) or a new clip
    // threshold invalidates the graph: capture again (no growth can happen now).
    if (!g.graph->ready() || g.ws_generation != be.workspace_generation() || g.max_grad_norm != max_grad_norm) {
      g.graph->capture([&] { enqueue_all(max_grad_norm, may_split); });
      g.ws_generation = be.workspace_generation();
      g.max_grad_norm = max_grad_norm;
      ++captures_;
      graph_kernels_ = g.graph->kernel_nodes();
      graph_nodes_ = g.graph->total_nodes();
      // Once per kind (a recapture after a workspace move says nothing new).
      if (!g.logged) {
        log_info("CUDA graph captured", may_split ? " for steps with a sample the GDN may split" : "", ": ",
                 g.graph->kernel_nodes(), " kernels, ", g.graph->copy_nodes(), " copies/memsets; one launch per step");
        g.logged = true;
      }
    }
    g.graph->launch();
    launched = true;
  }
  if (!launched) {
    // The first step of each kind runs eagerly: it grows every workspace and caches every GEMM
    // plan and kernel attribute, which a capture cannot do.
    enqueue_all(max_grad_norm, may_split);
    warmed_[may_split] = true;
  }
  r.replayed = launched;
  r.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  model_.backend().synchronize();
  for (int64_t i = 0; i < micro_; ++i) r.loss_sum += host_results_[i];
  if (comm_ != nullptr) comm_->all_reduce_host(&r.loss_sum, 1);  // every rank's rows
  r.grad_norm = host_results_[micro_];
  // A non-finite norm skipped the update on the device; name the first bad gradient.
  if (!std::isfinite(r.grad_norm)) fail_non_finite_gradients(model_, step, r.grad_norm);
  QT_CHECK(std::isfinite(r.loss_sum), "step ", step, ": loss is ", r.loss_sum, " (diverged; lower train.lr?)");
  return r;
}

}  // namespace qt
