// Dense score accumulators, pooled across calls so that a single-query call does not pay
// an O(n_docs) allocation. Invariant while in the pool: acc all +0.0f, seen all 0.
// One process-wide pool (a function-local static of an inline function) serves every
// kernel that includes this header.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel.hpp"

namespace retriever {


struct dense_accumulator {
    std::vector<float> acc;
    std::vector<uint8_t> seen;
    std::vector<uint32_t> touched;
    /// Prefix [0, dense_dirty) of acc / seen that a dense scan may have written
    /// and not yet cleared (non-zero only while one runs, or after it threw).
    size_t dense_dirty = 0;

    void ensure(size_t n) {
        if (acc.size() < n) {
            acc.resize(n, 0.0f);
            seen.resize(n, 0);
        }
    }
    void clear_touched() {
        if (dense_dirty) {  // a dense scan was interrupted (e.g. a bad doc id threw)
            std::memset(acc.data(), 0, dense_dirty * sizeof(float));
            std::memset(seen.data(), 0, dense_dirty);
            dense_dirty = 0;
        }
        float* a = acc.data();  // locals: the uint8 stores would force reloads
        uint8_t* s = seen.data();
        for (uint32_t d : touched) {
            a[d] = 0.0f;
            s[d] = 0;
        }
        touched.clear();
    }
};

class accumulator_pool {
  public:
    static accumulator_pool& instance() {
        static accumulator_pool pool;
        return pool;
    }
    std::unique_ptr<dense_accumulator> acquire() {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            if (!m_free.empty()) {
                auto a = std::move(m_free.back());
                m_free.pop_back();
                return a;
            }
        }
        return std::make_unique<dense_accumulator>();
    }
    void release(std::unique_ptr<dense_accumulator> a) {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_free.size() < m_capacity) m_free.push_back(std::move(a));
    }

  private:
    accumulator_pool() {
        const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
        m_capacity = 2 * hw;
        hold_mutex_across_fork<&accumulator_pool::mutex>();
    }
    static std::mutex& mutex() { return instance().m_mutex; }
    std::mutex m_mutex;
    std::vector<std::unique_ptr<dense_accumulator>> m_free;
    size_t m_capacity = 2;
};

/// A worker's lazily acquired accumulator, returned clean to the pool.
class accumulator_lease {
  public:
    accumulator_lease() = default;
    accumulator_lease(const accumulator_lease&) = delete;
    accumulator_lease& operator=(const accumulator_lease&) = delete;
    ~accumulator_lease() {
        if (m_acc) {
            m_acc->clear_touched();
            accumulator_pool::instance().release(std::move(m_acc));
        }
    }
    dense_accumulator& get() {
        if (!m_acc) m_acc = accumulator_pool::instance().acquire();
        return *m_acc;
    }

  private:
    std::unique_ptr<dense_accumulator> m_acc;
};

}  // namespace retriever
