#include "model/plan.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "core/error.h"
#include "model/flops.h"
#include "model/weight_shards.h"

namespace qt {
namespace {

constexpr double kGiB = 1073741824.0;

Plan plan_for(const ModelConfig& cfg, const PlanRequest& req, int zero, Checkpointing ck) {
  Plan p;
  p.zero = zero;
  p.checkpointing = ck;
  const double n = req.gpus;
  const int64_t P = param_count(cfg);
  int64_t trained = P;
  if (req.lora) {
    trained = 0;
    for (const ParamSpec& s : lora_trainable_table(cfg, *req.lora)) trained += shape_numel(s.shape);
  }
  auto shard = [&](int64_t bytes, int from_stage) { return zero >= from_stage ? int64_t(std::ceil(double(bytes) / n)) : bytes; };
  const int64_t weights = shard(P * 2, 3) + (req.lora ? trained * 2 : 0);
  const int64_t grads = shard(trained * 4, 2);
  const int64_t optimizer = shard(trained * 12, 1);
  const int64_t T = req.tokens_per_batch;
  int64_t acts = activation_bytes(cfg, DType::BF16, T, ck);
  if (ck == Checkpointing::None) {
    // The gated delta rule's kept forward state (prep's results: the gates' cumsum, T = (I + A)^-1
    // per 64-token chunk, the q / k row scales), per GDN layer.
    acts += int64_t(cfg.num_linear_layers()) * T * cfg.linear_num_value_heads * (64 * 4 + 16);
  }
  const int64_t scratch = gradient_scratch_bytes(cfg, DType::BF16, T);
  const int64_t comm = zero == 3 ? zero3_buffer_bytes(cfg, 2) : 0;  // what model/weight_shards allocates
  p.parts = {{"weights (bf16)", weights}, {"gradients (fp32)", grads}, {"optimizer: master, m, v (fp32)", optimizer},
             {"activations", acts},       {"gradient scratch", scratch}, {"communication buffers", comm},
             {"workspaces (reserve)", kWorkspaceReserve}};
  for (const auto& part : p.parts) p.total_bytes += part.bytes;
  p.fits_80 = double(p.total_bytes) <= 74.0 * kGiB;    // an 80 GB H100's usable memory
  p.fits_141 = double(p.total_bytes) <= 139.0 * kGiB;  // an H200's
  // Time: FLOPs per GPU (its own row) at the stated efficiency; collectives per GPU.
  std::mt19937_64 rng(0);
  StepFlops f = step_flops(cfg, chat_like_lengths(T, rng));
  if (req.lora) f.dense = 4.0 * double(P) * double(T) + 6.0 * double(trained) * double(T);
  if (ck == Checkpointing::Full) f.dense += 2.0 * double(P) * double(T);  // the recomputed forward
  p.flops = f.total();
  p.compute_s = p.flops / (kPeakBf16FlopsPerSecond * req.compute_efficiency);
  const double ring = n > 1 ? (n - 1) / n : 0.0;
  double bytes = 0;
  if (req.gpus > 1) {
    const double tp = double(trained);
    if (zero == 3) bytes = 2.0 * 2.0 * double(P) * ring + 4.0 * tp * ring;  // bf16 gathers fwd + bwd, f32 reduce-scatter
    else if (zero == 2) bytes = 4.0 * tp * ring + 2.0 * tp * ring;           // reduce-scatter grads, gather weights
    else bytes = 2.0 * 4.0 * tp * ring + (zero == 1 ? 2.0 * tp * ring : 0);  // all-reduce (= RS + AG) in f32
  }
  p.comm_bytes = bytes;
  p.comm_s = bytes / (req.busbw_gbs * 1e9);
  p.step_s = std::max(p.compute_s, p.comm_s);
  p.tokens_per_s = double(T) / p.step_s;
  const double model_flops = (req.lora ? 4.0 * double(P) + 6.0 * double(trained) : 6.0 * double(P)) * double(T) +
                             f.attention + f.gdn;
  p.mfu = model_flops / p.step_s / kPeakBf16FlopsPerSecond;
  return p;
}

}  // namespace

Plan plan_training(const ModelConfig& cfg, const PlanRequest& req) {
  QT_CHECK(req.gpus >= 1, "plan: --gpus must be >= 1");
  QT_CHECK(req.zero >= -1 && req.zero <= 3, "plan: --zero must be 0, 1, 2 or 3");
  QT_CHECK(req.tokens_per_batch >= 16, "plan: --tokens-per-batch must be >= 16");
  QT_CHECK(req.busbw_gbs > 0 && req.compute_efficiency > 0 && req.compute_efficiency <= 1,
           "plan: --busbw and --efficiency must be positive (efficiency at most 1)");
  std::vector<int> stages;
  if (req.zero >= 0) stages = {req.zero};
  else if (req.gpus == 1) stages = {0};
  else stages = {0, 1, 2, 3};
  std::vector<Checkpointing> policies;
  if (req.checkpointing == "auto") {
    policies = {Checkpointing::None, Checkpointing::Selective, Checkpointing::Full};
  } else {
    const auto c = checkpointing_from_name(req.checkpointing);
    QT_CHECK(c.has_value(), "plan: --checkpointing '", req.checkpointing, "' is not auto, none, selective or full");
    policies = {*c};
  }
  // The smallest stage, then the cheapest policy, that fits; otherwise the last tried, said so.
  Plan best;
  bool found = false;
  for (int z : stages) {
    for (Checkpointing c : policies) {
      best = plan_for(cfg, req, z, c);
      if (double(best.total_bytes) <= req.gpu_mem_gib * kGiB) {
        found = true;
        break;
      }
    }
    if (found) break;
  }
  best.why = found ? str("ZeRO-", best.zero, " and checkpointing ", checkpointing_name(best.checkpointing),
                         ": the first that fits ", req.gpu_mem_gib, " GiB per GPU")
                   : str("nothing fits ", req.gpu_mem_gib, " GiB per GPU; shown: ZeRO-", best.zero, ", checkpointing ",
                         checkpointing_name(best.checkpointing));
  return best;
}

nlohmann::ordered_json plan_json(const Plan& p, const PlanRequest& req) {
  nlohmann::ordered_json j;
  j["gpus"] = req.gpus;
  j["zero"] = p.zero;
  j["checkpointing"] = checkpointing_name(p.checkpointing);
  j["method"] = req.lora ? "lora" : "full";
  j["tokens_per_batch_per_gpu"] = req.tokens_per_batch;
  nlohmann::ordered_json parts = nlohmann::ordered_json::object();
  for (const auto& part : p.parts) parts[part.name] = double(part.bytes) / kGiB;
  j["memory_gib_per_gpu"] = parts;
  j["total_gib_per_gpu"] = double(p.total_bytes) / kGiB;
  j["fits_80gb"] = p.fits_80;
  j["fits_141gb"] = p.fits_141;
  j["step_s"] = p.step_s;
  j["compute_s"] = p.compute_s;
  j["comm_s"] = p.comm_s;
  j["comm_gb_per_gpu"] = p.comm_bytes / 1e9;
  j["tokens_per_s_per_gpu"] = p.tokens_per_s;
  j["tokens_per_s"] = p.tokens_per_s * req.gpus;
  j["mfu"] = p.mfu;
  j["assumptions"] = {{"busbw_gbs", req.busbw_gbs}, {"compute_efficiency", req.compute_efficiency},
                      {"peak_tflops", kPeakBf16FlopsPerSecond / 1e12}, {"overlap", "communication hidden up to compute"}};
  j["choice"] = p.why;
  return j;
}

std::string plan_table(const Plan& p, const PlanRequest& req) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "plan: " << req.gpus << " GPU(s), ZeRO-" << p.zero << ", checkpointing " << checkpointing_name(p.checkpointing)
     << ", " << (req.lora ? "LoRA" : "full SFT") << ", " << req.tokens_per_batch << " tokens per GPU per row (" << p.why
     << ")\n";
  for (const auto& part : p.parts) os << "  " << part.name << ": " << double(part.bytes) / kGiB << " GiB\n";
  os << "  total per GPU: " << double(p.total_bytes) / kGiB << " GiB (fits 80 GB: " << (p.fits_80 ? "yes" : "no")
     << ", fits 141 GB: " << (p.fits_141 ? "yes" : "no") << ")\n";
  os << "  step: " << p.step_s << " s (compute " << p.compute_s << " s at " << 100 * req.compute_efficiency
     << " % of peak, communication " << p.comm_s << " s for " << p.comm_bytes / 1e9 << " GB at " << req.busbw_gbs
     << " GB/s); " << p.tokens_per_s << " tokens/s per GPU, MFU " << 100 * p.mfu << " %\n";
  return os.str();
}

}  // namespace qt
