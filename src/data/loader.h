// Loader: a background thread that packs and materializes batches ahead of the trainer.
//
// Batches come in epoch order: epoch e uses pack_plan(data, opts, e), batch 0..n-1, then epoch
// e+1 (a new shuffle). The position of the next batch (epoch, index) is all a checkpoint needs to
// resume: a loader started at that position yields exactly the batches an uninterrupted one would.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "data/packer.h"

namespace qt {

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;  // index of the next batch inside the epoch
  bool operator==(const LoaderPosition& o) const { return epoch == o.epoch && batch == o.batch; }
};

class Loader {
 public:
  // `data` must outlive the loader. max_epochs <= 0: run forever. prefetch >= 1 batches queued.
  Loader(const TokenizedDataset& data, const PackOptions& opts, LoaderPosition start = {}, int64_t max_epochs = 1,
         int prefetch = 4);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Blocks until the next batch is ready; nullopt after the last epoch. Rethrows worker errors.
  std::optional<Batch> next();
  // Position of the batch next() returns next (the resume point after the last one returned).
  LoaderPosition position() const;
  int64_t batches_per_epoch(int64_t epoch) const;

 private:
  void run();

  const TokenizedDataset& data_;
  PackOptions opts_;
  LoaderPosition start_, pos_;
  int64_t max_epochs_;
  size_t prefetch_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace qt
