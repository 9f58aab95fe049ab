#include "model/weight_shards.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace qt {

bool zero_shards(const ParamSpec& p) {
  // The 2-D tensors are the projections, the embedding and the LM head (conv1d weights are 3-D).
  return p.shape.size() == 2 && shape_numel(p.shape) >= kZeroShardMin;
}

ShardLayout shard_layout(const ParamSpec& p, int world, int rank) {
  ShardLayout s;
  const int64_t n = shape_numel(p.shape);
  s.rows = p.shape.empty() ? 1 : p.shape[0];
  s.cols = s.rows > 0 ? n / s.rows : 0;
  s.rows_per_rank = (s.rows + world - 1) / world;
  s.begin = std::min(s.rows, int64_t(rank) * s.rows_per_rank);
  s.end = std::min(s.rows, s.begin + s.rows_per_rank);
  return s;
}

int64_t zero3_buffer_bytes(const ModelConfig& cfg, int64_t act_bytes) {
  std::map<int, int64_t> group;  // layer, or -1 / -2 for the embedding / head
  for (const ParamSpec& p : param_table(cfg))
    if (zero_shards(p))
      group[p.role == ParamRole::EmbedTokens ? -1 : p.role == ParamRole::LmHead ? -2 : p.layer] += shape_numel(p.shape);
  int64_t largest = 0;
  for (const auto& [g, n] : group) largest = std::max(largest, n);
  return largest * (2 * act_bytes + 4);
}

namespace {

constexpr int64_t kAlign = 256;  // bytes: every region starts aligned (vectorized kernels, GEMM operands)

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

Tensor at(const Tensor& base, int64_t byte_offset, DType dt, const Shape& shape) {
  return Tensor(static_cast<char*>(base.data) + byte_offset, dt, shape, base.device);
}

}  // namespace

WeightShards::WeightShards(const std::vector<ParamSpec>& specs, int64_t num_layers, Backend& be, Communicator& comm,
                           bool reshard_after_forward)
    : be_(be), comm_(comm), reshard_(reshard_after_forward) {
  const int W = comm.world(), r = comm.rank();
  const DType wt = be.activation_dtype();
  const auto wsize = static_cast<int64_t>(dtype_size(wt));
  index_.assign(specs.size(), -1);
  members_.assign(static_cast<size_t>(num_layers + 2), {});
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!zero_shards(specs[i])) continue;
    Sharded s;
    s.spec = i;
    s.group = specs[i].role == ParamRole::EmbedTokens ? kEmbed : specs[i].role == ParamRole::LmHead ? kHead : specs[i].layer;
    QT_CHECK(s.group >= kHead && s.group < num_layers, "ZeRO-3: ", specs[i].name, " belongs to no layer");
    s.layout = shard_layout(specs[i], W, r);
    index_[i] = static_cast<int>(shards_.size());
    members_[static_cast<size_t>(s.group + 2)].push_back(static_cast<int>(shards_.size()));
    shards_.push_back(std::move(s));
  }
  // Weight buffers: layer l in l % 2, the embedding and the head (used at the two ends of the
  // forward, never at the same time) in the buffer after the last layer's, L % 2; with
  // reshard_after_forward false each layer in its own and those two in one more. One gradient
  // buffer for every group: each group's gradients are reduced before the next group's are written
  // (the tied embedding's two parts, the loss head's and the embedding backward's, separately).
  const int L = static_cast<int>(num_layers);
  auto weight_slot = [&](int g) { return g < 0 ? (reshard_ ? L % 2 : L) : (reshard_ ? g % 2 : g); };

  std::map<int, int64_t> wslot_bytes, gslot_bytes;
  std::vector<int64_t> w_off(shards_.size()), g_off(shards_.size());
  int64_t largest = 0, shard_w = 0, shard_g = 0;
  for (int g = kHead; g < num_layers; ++g) {
    int64_t wb = 0, gb = 0;
    for (int k : members(g)) {
      const Sharded& s = shards_[static_cast<size_t>(k)];
      const int64_t n = W * s.layout.padded_numel();
      w_off[static_cast<size_t>(k)] = wb;
      g_off[static_cast<size_t>(k)] = gb;
      wb += aligned(n * wsize);
      gb += aligned(n * 4);
      largest = std::max(largest, s.layout.padded_numel());
      shard_w += aligned(s.layout.padded_numel() * wsize);
      shard_g += aligned(s.layout.padded_numel() * 4);
    }
    wslot_bytes[weight_slot(g)] = std::max(wslot_bytes[weight_slot(g)], wb);
    gslot_bytes[0] = std::max(gslot_bytes[0], gb);
  }
  std::map<int, Tensor> wbuf, gbuf;
  for (auto [slot, bytes] : wslot_bytes)
    if (bytes > 0) wbuf[slot] = be.alloc(DType::U8, {bytes}), buffer_bytes_ += bytes;
  for (auto [slot, bytes] : gslot_bytes)
    if (bytes > 0) gbuf[slot] = be.alloc(DType::U8, {bytes}), buffer_bytes_ += bytes;
  // The gradient buffers' padding rows take part in the reduce-scatter: zero them once (no op
  // writes beyond a tensor's view; a longer tensor of another layer in the slot may, which only
  // reaches the padding rows of the last ranks' shards, never read).
  for (auto& [slot, buf] : gbuf) be.zero(buf);
  const Tensor shard_w_buf = shard_w > 0 ? be.alloc(DType::U8, {shard_w}) : Tensor();
  const Tensor shard_g_buf = shard_g > 0 ? be.alloc(DType::U8, {shard_g}) : Tensor();
  if (shard_g > 0) be.zero(shard_g_buf);
  if (shard_w > 0) be.zero(shard_w_buf);
  shard_bytes_ = shard_w + shard_g;
  int64_t sw = 0, sg = 0;
  for (size_t k = 0; k < shards_.size(); ++k) {
    Sharded& s = shards_[k];
    const ShardLayout& L = s.layout;
    const Shape& shape = specs[s.spec].shape;
    const int64_t all = W * L.padded_numel();
    const Tensor& wb = wbuf.at(weight_slot(s.group));
    const Tensor& gb = gbuf.at(0);
    s.weight = at(wb, w_off[k], wt, shape);
    s.gather_out = at(wb, w_off[k], wt, {all});
    s.grad = at(gb, g_off[k], DType::F32, shape);
    s.reduce_in = at(gb, g_off[k], DType::F32, {all});
    s.shard_weight_padded = at(shard_w_buf, sw, wt, {L.padded_numel()});
    s.shard_weight = at(shard_w_buf, sw, wt, {L.shard_numel()});
    s.shard_grad_padded = at(shard_g_buf, sg, DType::F32, {L.padded_numel()});
    s.shard_grad = at(shard_g_buf, sg, DType::F32, {L.shard_numel()});
    sw += aligned(L.padded_numel() * wsize);
    sg += aligned(L.padded_numel() * 4);
  }
  if (largest > 0) {
    reduce_tmp_ = be.alloc(DType::F32, {largest});
    buffer_bytes_ += largest * 4;
  }
}

const WeightShards::Sharded& WeightShards::t(size_t i) const {
  QT_CHECK(i < index_.size() && index_[i] >= 0, "WeightShards: tensor ", i, " is not sharded");
  return shards_[static_cast<size_t>(index_[i])];
}

const std::vector<int>& WeightShards::members(int group) const {
  QT_CHECK(group >= kHead && group + 2 < static_cast<int>(members_.size()), "WeightShards: no group ", group);
  return members_[static_cast<size_t>(group + 2)];
}

std::vector<float> WeightShards::gather_whole_host(size_t i, const std::vector<float>& mine) {
  const ShardLayout& L = layout(i);
  std::vector<float> padded(static_cast<size_t>(L.padded_numel()), 0.0f);
  std::copy(mine.begin(), mine.end(), padded.begin());
  std::vector<float> all(padded.size() * static_cast<size_t>(comm_.world()));
  comm_.all_gather(Tensor(all.data(), DType::F32, {static_cast<int64_t>(all.size())}, Device::cpu()),
                   Tensor(padded.data(), DType::F32, {static_cast<int64_t>(padded.size())}, Device::cpu()));
  all.resize(static_cast<size_t>(L.rows * L.cols));
  return all;
}

void WeightShards::gather(int group) {
  for (int k : members(group)) {
    const Sharded& s = shards_[static_cast<size_t>(k)];
    comm_.all_gather(s.gather_out, s.shard_weight_padded);
  }
}

void WeightShards::reduce(int group, bool accumulate) {
  for (int k : members(group)) {
    const Sharded& s = shards_[static_cast<size_t>(k)];
    if (!accumulate) {
      comm_.reduce_scatter(s.shard_grad_padded, s.reduce_in);
      continue;
    }
    const Tensor tmp(reduce_tmp_.data, DType::F32, {s.layout.padded_numel()}, reduce_tmp_.device);
    comm_.reduce_scatter(tmp, s.reduce_in);
    be_.add(s.shard_grad_padded, s.shard_grad_padded, tmp);
  }
}

void WeightShards::zero_grad(int group) {
  for (int k : members(group)) be_.zero(shards_[static_cast<size_t>(k)].grad);
}

}  // namespace qt
