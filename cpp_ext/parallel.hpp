// Splits a batch of independent items (queries, or terms) over worker threads.
//
// Each worker thread builds its own worker object (and so its own scratch
// memory) with `make_worker()` and then calls `worker(i)` for every item index
// it claims. Items are claimed in small contiguous chunks from a shared atomic
// counter, so the split adapts to uneven query costs. Results must depend only
// on the item, never on which thread handled it: that is what keeps outputs
// bit-identical for any thread count.
//
// The first exception thrown by any worker stops the remaining work and is
// rethrown on the calling thread after all workers have joined.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace retriever {

/// Number of threads to use for `n_items` items when the caller asked for
/// `n_threads` (<= 0: std::thread::hardware_concurrency()).
inline size_t resolve_threads(int n_threads, size_t n_items) {
    size_t t = n_threads > 0 ? static_cast<size_t>(n_threads)
                             : static_cast<size_t>(std::thread::hardware_concurrency());
    if (t == 0) t = 1;
    if (t > n_items) t = n_items;
    return t == 0 ? 1 : t;
}

template <class MakeWorker>
void parallel_for_items(size_t n_items, int n_threads, size_t chunk, MakeWorker&& make_worker) {
    if (n_items == 0) return;
    if (chunk == 0) chunk = 1;
    const size_t n_workers = resolve_threads(n_threads, n_items);

    if (n_workers == 1) {
        // Run inline: no thread start-up cost for single-query calls.
        auto worker = make_worker();
        for (size_t i = 0; i < n_items; ++i) worker(i);
        return;
    }

    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first_error;
    std::mutex error_mutex;

    auto body = [&]() {
        try {
            auto worker = make_worker();
            for (;;) {
                if (failed.load(std::memory_order_relaxed)) return;
                const size_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
                if (begin >= n_items) return;
                const size_t end = std::min(n_items, begin + chunk);
                for (size_t i = begin; i < end; ++i) worker(i);
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!first_error) first_error = std::current_exception();
            failed.store(true, std::memory_order_relaxed);
        }
    };

    std::vector<std::thread> threads;
    threads.reserve(n_workers - 1);
    try {
        for (size_t t = 0; t + 1 < n_workers; ++t) threads.emplace_back(body);
    } catch (...) {
        // Could not start a thread: stop the ones already running, then report.
        failed.store(true);
        for (auto& th : threads) th.join();
        throw;
    }
    body();  // the calling thread works too
    for (auto& th : threads) th.join();
    if (first_error) std::rethrow_exception(first_error);
}

}  // namespace retriever
