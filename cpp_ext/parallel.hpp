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
// rethrown on the calling thread after all workers have finished.
//
// Helper threads come from one process-wide pool (worker_pool), started on
// first use and kept: starting a thread costs tens of microseconds (about
// 60 us measured on a 2-core VM), as much as a whole small query batch. The
// calling thread always works too and claims items until none are left, so a
// call finishes even when every pooled thread is busy with another call (or
// absent, e.g. in a child process after fork): helpers that have not started
// by then skip the call.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__unix__)
#include <pthread.h>
#endif

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

/// How long an idle pooled thread, or a caller waiting for its helpers, spins
/// before it blocks (microseconds).
constexpr int kSpinMicros = 300;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

/// Makes fork() safe for a process-wide structure guarded by the mutex
/// `Get()` (a free list of scratch buffers, say): the forking thread holds it
/// across fork(), so neither process inherits it locked by a thread that does
/// not exist there (a child would block on it forever).
template <std::mutex& (*Get)()>
void hold_mutex_across_fork() {
#if defined(__unix__)
    pthread_atfork([]() { Get().lock(); }, []() { Get().unlock(); }, []() { Get().unlock(); });
#endif
}

/// Process-wide pool of helper threads, grown on demand and never shut down:
/// the threads are detached and a pool is never destroyed, so process exit
/// needs no coordination with it. After fork() the child gets a new, empty
/// pool (pthread_atfork): the parent's threads do not exist there, and its
/// copy of the old pool's mutex, condition variable and queue may be in any
/// state (held by a thread that is gone, waited on by one); it is abandoned.
class worker_pool {
  public:
    static worker_pool& instance() {
        static std::once_flag once;
        std::call_once(once, []() {
            slot() = new worker_pool();  // leaked on purpose (see above)
#if defined(__unix__)
            pthread_atfork(nullptr, nullptr, []() { slot() = new worker_pool(); });
#endif
        });
        return *slot();
    }

    /// Queues `n` runs of `task`, growing the pool to at least `n` threads.
    /// Returns false when a thread could not be started or a task queued; the
    /// runs queued before that still run (or skip) as usual.
    bool submit(size_t n, const std::function<void()>& task) {
        std::lock_guard<std::mutex> lock(m_mutex);
        size_t queued = 0;
        bool ok = true;
        try {
            while (m_threads < n) {
                std::thread([this]() { loop(); }).detach();
                ++m_threads;
            }
            for (; queued < n; ++queued) m_queue.push_back(task);
        } catch (...) {
            ok = false;
        }
        m_pending.fetch_add(queued, std::memory_order_release);
        for (size_t i = 0; i < queued; ++i) m_ready.notify_one();
        return ok;
    }

  private:
    worker_pool() = default;

    static worker_pool*& slot() {
        static worker_pool* pool = nullptr;
        return pool;
    }

    void loop() {
        for (;;) {
            // Spin a little before sleeping: batches arrive back to back (a search call's
            // analysis and top-k, then the next batch), and waking a sleeping thread costs
            // tens of microseconds on a VM.
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
            while (m_pending.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until) {
                cpu_relax();
            }
            std::function<void()> task;
            {
                std::unique_lock<std::mutex> lock(m_mutex);
                m_ready.wait(lock, [this]() { return !m_queue.empty(); });
                task = std::move(m_queue.front());
                m_queue.pop_front();
                m_pending.fetch_sub(1, std::memory_order_release);
            }
            task();
        }
    }

    std::mutex m_mutex;
    std::condition_variable m_ready;
    std::deque<std::function<void()>> m_queue;
    std::atomic<size_t> m_pending{0};  // m_queue.size(), readable without the lock
    size_t m_threads = 0;
};

/// A call's bookkeeping shared with its queued helper runs: a helper enters
/// only while the call is open; the caller closes it and waits for the
/// helpers that entered.
struct parallel_call {
    std::mutex mutex;
    std::condition_variable done;
    std::atomic<size_t> active{0};  // changed under `mutex` on entry, atomically on leave
    bool closed = false;
};

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

    // Helpers run `body` only while the call is open; `call` outlives this
    // frame in the queued copies, `body` is used only between enter and leave.
    auto call = std::make_shared<parallel_call>();
    const std::function<void()> helper = [call, &body]() {
        {
            std::lock_guard<std::mutex> lock(call->mutex);
            if (call->closed) return;
            call->active.fetch_add(1, std::memory_order_relaxed);
        }
        body();
        if (call->active.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            { std::lock_guard<std::mutex> lock(call->mutex); }  // the caller is waiting or will see 0
            call->done.notify_all();
        }
    };
    try {
        worker_pool::instance().submit(n_workers - 1, helper);  // if it fails the caller does it all
    } catch (...) {
        // the caller does it all; whatever was queued runs or skips under `call` as usual
    }
    body();  // the calling thread works too, until no item is left
    {
        std::lock_guard<std::mutex> lock(call->mutex);
        call->closed = true;  // helpers that have not entered by now never will
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    while (call->active.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < until) {
        cpu_relax();
    }
    if (call->active.load(std::memory_order_acquire) != 0) {
        std::unique_lock<std::mutex> lock(call->mutex);
        call->done.wait(lock, [&]() { return call->active.load(std::memory_order_acquire) == 0; });
    }
    if (first_error) std::rethrow_exception(first_error);
}

}  // namespace retriever
