#include "data/loader.h"

#include "core/error.h"

namespace qt {

Loader::Loader(const TokenizedDataset& data, const PackOptions& opts, LoaderPosition start, int64_t max_epochs, int prefetch)
    : data_(data), opts_(opts), start_(start), pos_(start), max_epochs_(max_epochs),
      prefetch_(static_cast<size_t>(prefetch < 1 ? 1 : prefetch)) {
  QT_CHECK(start.epoch >= 0 && start.batch >= 0, "loader position must not be negative");
  worker_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int64_t Loader::batches_per_epoch(int64_t epoch) const { return pack_plan(data_, opts_, epoch).stats.batches; }

void Loader::run() {
  try {
    LoaderPosition p = start_;
    for (; max_epochs_ <= 0 || p.epoch < max_epochs_; ++p.epoch, p.batch = 0) {
      const PackPlan plan = pack_plan(data_, opts_, p.epoch);
      if (plan.bins.empty()) break;  // nothing to train on: stop instead of spinning
      for (; p.batch < static_cast<int64_t>(plan.bins.size()); ++p.batch) {
        Batch b = pack_materialize(data_, plan.bins[static_cast<size_t>(p.batch)], opts_);
        b.epoch = p.epoch;
        b.index = p.batch;
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < prefetch_; });
        if (stop_) return;
        queue_.push_back(std::move(b));
        cv_.notify_all();
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

std::optional<Batch> Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || done_; });
  if (queue_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  pos_ = LoaderPosition{b.epoch, b.index + 1};
  cv_.notify_all();
  return b;
}

LoaderPosition Loader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pos_;
}

}  // namespace qt
