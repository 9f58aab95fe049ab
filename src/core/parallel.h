// parallel_for over [0, n) on a process-wide pool of worker threads (QWENTUNE_THREADS, default:
// all cores). Chunks are contiguous and deterministic for a given thread count.
#pragma once
#include <cstdint>
#include <functional>

namespace qt {

int num_threads();
void set_num_threads(int n);
// fn(begin, end) is called on disjoint ranges covering [0, n); blocks until all return.
// Exceptions thrown by fn are rethrown (the first one) in the caller.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

}  // namespace qt
