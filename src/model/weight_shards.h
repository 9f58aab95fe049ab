// ZeRO-3 for Qwen35Model (dist.zero: 3): every large matrix lives on each rank only as its row
// range (a shard: rows [rank * rows_per_rank, (rank + 1) * rows_per_rank) of dim 0, the last
// ranks' ranges shorter or empty), gathered whole into a layer buffer just before the layer runs and
// gathered again for its backward; its gradient, computed whole into a layer gradient buffer, is
// reduce-scattered (summed in fp32) into this rank's rows as soon as the layer's backward ends.
//
// Groups and buffers: each decoder layer is one group; the embedding and the untied LM head are a
// group each. Layer l's weights use buffer l % 2 (reshard_after_forward: true, two layers whole at
// a time), the embedding and the head buffer L % 2 (each gathered just before its use: the
// embedding's forward, the loss); with reshard_after_forward false every layer has its own buffer,
// gathered once per step by the first micro-batch's forward and kept to the step's end. All groups
// share one gradient buffer, reduced as soon as a group's backward ends. Memory beyond the shards:
// two bf16 and one fp32 buffer of the largest group (as `qwentune plan` counts). The model's tensors
// point into these buffers once, at construction, so a captured step replays the same addresses.
// Each tensor's region holds world * rows_per_rank rows (the all-gather's layout), its view the
// first `rows`.
//
// Small tensors (norms, conv1d weights, A_log, dt_bias and any matrix below kZeroShardMin
// elements) are not sharded: they stay whole on every rank with their gradients in the model's own
// buffer, summed over the ranks by the optimizer in one all-reduce.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "model/params.h"
#include "ops/backend.h"

namespace qt {

inline constexpr int64_t kZeroShardMin = int64_t(1) << 14;

// Whether ZeRO shards the tensor's rows: the projections, the embedding and the LM head, from
// kZeroShardMin elements (the same rule for every stage, so checkpoints name the same shards).
bool zero_shards(const ParamSpec& p);

struct ShardLayout {
  int64_t rows = 0, cols = 0;
  int64_t rows_per_rank = 0;  // ceil(rows / world)
  int64_t begin = 0, end = 0;  // this rank's rows
  int64_t shard_numel() const { return (end - begin) * cols; }
  int64_t padded_numel() const { return rows_per_rank * cols; }  // one rank's part of a collective
};
ShardLayout shard_layout(const ParamSpec& p, int world, int rank);
// Bytes of ZeRO-3's gather and gradient buffers for cfg: two weight buffers (act_bytes an element)
// and one fp32 gradient buffer of the largest group (a layer's sharded tensors, the embedding, the
// head), before row padding.
int64_t zero3_buffer_bytes(const ModelConfig& cfg, int64_t act_bytes);

class WeightShards {
 public:
  static constexpr int kEmbed = -1, kHead = -2;  // groups besides the layers (0 .. L-1)

  // specs: the model's parameter table (param_table); weights in the backend's activation dtype.
  WeightShards(const std::vector<ParamSpec>& specs, int64_t num_layers, Backend& be, Communicator& comm,
               bool reshard_after_forward);
  WeightShards(const WeightShards&) = delete;
  WeightShards& operator=(const WeightShards&) = delete;

  bool sharded(size_t i) const { return index_[i] >= 0; }
  int group_of(size_t i) const { return t(i).group; }
  int world() const { return comm_.world(); }
  bool reshard_after_forward() const { return reshard_; }
  Communicator& comm() { return comm_; }
  const ShardLayout& layout(size_t i) const { return t(i).layout; }
  // The whole tensor as the model computes with it (valid after gather of its group) and its
  // whole gradient (valid between the backward that writes it and reduce).
  const Tensor& weight(size_t i) const { return t(i).weight; }
  const Tensor& grad(size_t i) const { return t(i).grad; }
  // This rank's rows: weights (activation dtype) and the gradient summed over the ranks (f32),
  // [shard_numel] views of padded storage.
  const Tensor& shard_weight(size_t i) const { return t(i).shard_weight; }
  const Tensor& shard_grad(size_t i) const { return t(i).shard_grad; }

  // The whole tensor i from every rank's rows on the host: `mine` is this rank's shard_numel
  // values (a collective: every rank calls it in the same order).
  std::vector<float> gather_whole_host(size_t i, const std::vector<float>& mine);
  // All-gathers the group's weights into its buffer.
  void gather(int group);
  // Reduce-scatters the group's whole gradients into the shard gradients: = (accumulate false) or
  // += (a later micro-batch of the step, or the tied embedding's second part).
  void reduce(int group, bool accumulate);
  // Zeroes the group's whole gradients (for a gradient that accumulates from its first op).
  void zero_grad(int group);

  // Bytes: the shards (weights + f32 gradients) and the gather / gradient buffers.
  int64_t shard_bytes() const { return shard_bytes_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  struct Sharded {
    size_t spec = 0;
    int group = 0;
    ShardLayout layout;
    Tensor weight, grad;              // whole views into the group's buffers
    Tensor gather_out, reduce_in;     // the same regions, [world * padded_numel]
    Tensor shard_weight, shard_grad;  // [shard_numel] views
    Tensor shard_weight_padded, shard_grad_padded;  // [padded_numel]
  };
  const Sharded& t(size_t i) const;
  const std::vector<int>& members(int group) const;

  Backend& be_;
  Communicator& comm_;
  bool reshard_;
  std::vector<int> index_;  // [spec] -> index into shards_ (-1: not sharded)
  std::vector<Sharded> shards_;
  std::vector<std::vector<int>> members_;  // [group + 2] -> indices into shards_
  Tensor reduce_tmp_;  // f32 [largest padded_numel]: a later micro-batch's sums before they are added
  int64_t shard_bytes_ = 0, buffer_bytes_ = 0;
};

}  // namespace qt
