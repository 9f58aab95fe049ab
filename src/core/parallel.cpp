#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qt {
namespace {

int default_threads() {
  if (const char* v = std::getenv("QWENTUNE_THREADS")) {
    const int k = std::atoi(v);
    if (k > 0) return k;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> n{default_threads()};
  return n;
}

// A persistent pool: ops call parallel_for thousands of times a step, so threads are started
// once and woken per job (creating threads per call cost more than the work itself).
class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  // Runs job(w) for w in [0, workers) with the caller as worker 0; blocks until all finish.
  void run(int workers, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one job at a time; nested calls run inline
    ensure(workers - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      active_ = workers - 1;
      pending_ = workers - 1;
      ++generation_;
    }
    cv_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

  bool busy_in_this_thread() const { return in_worker_; }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void ensure(int n) {
    while (static_cast<int>(threads_.size()) < n) {
      const int index = static_cast<int>(threads_.size()) + 1;
      threads_.emplace_back([this, index] { loop(index); });
    }
  }

  void loop(int index) {
    in_worker_ = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && index <= active_); });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  static thread_local bool in_worker_;
};

thread_local bool Pool::in_worker_ = false;
thread_local bool in_parallel_region = false;

}  // namespace

int num_threads() { return thread_setting().load(); }
void set_num_threads(int n) { thread_setting().store(std::max(1, n)); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t workers = std::min<int64_t>(num_threads(), (n + min_chunk - 1) / std::max<int64_t>(1, min_chunk));
  // Nested calls (from inside a worker or a running region) run inline: the pool is busy.
  if (workers <= 1 || in_parallel_region || Pool::get().busy_in_this_thread()) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  std::exception_ptr first_error;
  std::mutex err_mu;
  const std::function<void(int)> job = [&](int w) {
    const int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b >= e) return;
    const bool was = in_parallel_region;
    in_parallel_region = true;
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!first_error) first_error = std::current_exception();
    }
    in_parallel_region = was;
  };
  Pool::get().run(static_cast<int>(workers), job);
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace qt
