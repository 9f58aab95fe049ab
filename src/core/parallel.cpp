#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qt {
namespace {

std::atomic<int>& thread_setting() {
  static std::atomic<int> n{[] {
    if (const char* v = std::getenv("QWENTUNE_THREADS")) {
      int k = std::atoi(v);
      if (k > 0) return k;
    }
    return std::max(1u, std::thread::hardware_concurrency()) > 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : 1;
  }()};
  return n;
}

}  // namespace

int num_threads() { return thread_setting().load(); }
void set_num_threads(int n) { thread_setting().store(std::max(1, n)); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int64_t workers = std::min<int64_t>(num_threads(), (n + min_chunk - 1) / std::max<int64_t>(1, min_chunk));
  if (workers <= 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr first_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  int64_t chunk = (n + workers - 1) / workers;
  auto run = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  for (int64_t w = 1; w < workers; ++w) {
    int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b < e) threads.emplace_back(run, b, e);
  }
  run(0, std::min(n, chunk));
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace qt
