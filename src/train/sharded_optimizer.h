// AdamW over the ranks of a job (ZeRO stages 0-3), for eager steps:
//   0: gradients all-reduced, every rank updates every weight (data parallel);
//   1: gradients all-reduced, each rank keeps the fp32 master, m and v of its row range of every
//      large tensor only, updates that and all-gathers the new rows;
//   2: as 1, but the gradients are reduce-scattered: each rank receives only its rows' sums;
//   3: the model itself keeps only its rows of the weights and has reduce-scattered their
//      gradients layer by layer (model/weight_shards.h): the update writes this rank's rows, which
//      the next forward gathers.
// A shard is a row range of a tensor (dim 0; ceil(rows / world) rows per rank, the last ranks'
// ranges shorter or empty; zero_shards picks the tensors), so checkpoints reshard trivially:
// get_state gathers whole tensors (a collective: every rank calls it in the same order) and
// set_state takes a rank's rows of them. The other tensors (norms, A_log, dt_bias, conv1d weights,
// small matrices) stay whole on every rank, their gradients all-reduced. The gradient norm is the global one (each sharded row
// counted once, the replicated tensors once); clipping and the update match the single-rank
// HostOptimizer up to the summation order of the reductions.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "train/model_optimizer.h"

namespace qt {

class ShardedOptimizer final : public ModelOptimizer {
 public:
  // reduce_bf16: gradients are summed in bf16 (dist.reduce_dtype: bf16) instead of fp32.
  ShardedOptimizer(Qwen35Model& model, const AdamWConfig& cfg, Communicator& comm, int zero_stage, bool reduce_bf16);

  double step(double lr, double max_grad_norm, int64_t step) override;
  int64_t state_bytes() const override;
  void get_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override;
  void set_state(size_t i, const std::vector<float>& master, const std::vector<float>& m,
                 const std::vector<float>& v) override;
  bool shards_state() const override;
  StateRows state_rows(size_t i) const override;
  void get_local_state(size_t i, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) override;
  std::vector<float> get_master(size_t i) override;
  void set_local_state(size_t i, const std::vector<float>& master, const std::vector<float>& m_rows,
                       const std::vector<float>& v_rows) override;

 private:
  struct Slot {
    int64_t rows = 0, cols = 0;   // the tensor as [rows, cols]
    int64_t rows_per_rank = 0;    // the shard stride (ceil(rows / world)); 0: replicated
    int64_t begin = 0, end = 0;   // this rank's rows
    bool decay = true;
    std::vector<float> master, m, v;  // this rank's rows (replicated: the whole tensor)
  };
  bool sharded(const Slot& s) const { return s.rows_per_rank > 0; }
  // Every rank's rows of `mine` ([rows_per_rank, cols] each, zero-padded) gathered into a whole tensor.
  std::vector<float> gather(const Slot& s, const std::vector<float>& mine);
  void reduce(std::vector<float>& g);  // sums a whole tensor over the ranks (f32 or bf16)

  Qwen35Model& model_;
  AdamWConfig cfg_;
  Communicator& comm_;
  int zero_;
  bool reduce_bf16_;
  std::vector<Slot> slots_;
};

}  // namespace qt
