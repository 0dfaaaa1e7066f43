// Bounded top-k collector over arbitrary float scores.
//
// Order: higher score first; equal scores -> smaller doc id first. Negative and
// zero scores are ordinary scores (unlike PISA's topk_queue, which drops
// scores <= 0). NaN scores are never collected.
//
// Internally a binary min-heap of at most k entries whose root is the current
// k-th best entry ("the worst kept"). Pruning algorithms read `threshold()`:
// while the heap is not full it is -inf, afterwards the k-th score. Because a
// candidate whose score EQUALS the threshold still enters when its doc id is
// smaller, pruning code must only discard documents whose upper bound is
// strictly below `threshold()`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

namespace retriever {

struct scored_doc {
    float score;
    uint32_t doc;
};

/// True when `a` ranks strictly before `b` (higher score, or equal score and
/// smaller doc id). Scores must not be NaN.
inline bool ranks_before(const scored_doc& a, const scored_doc& b) {
    return a.score > b.score || (a.score == b.score && a.doc < b.doc);
}

class topk_heap {
  public:
    topk_heap() = default;

    /// Empties the collector and sets its capacity (k >= 1).
    void reset(size_t k) {
        m_k = k;
        m_entries.clear();
        // Do not reserve k: k may be far larger than the number of candidates.
        if (m_entries.capacity() < std::min<size_t>(k, 4096)) {
            m_entries.reserve(std::min<size_t>(k, 4096));
        }
    }

    size_t size() const { return m_entries.size(); }
    bool full() const { return m_entries.size() >= m_k; }

    /// Score of the k-th kept entry, or -inf while fewer than k are kept.
    float threshold() const {
        return full() ? m_entries.front().score : -std::numeric_limits<float>::infinity();
    }

    /// Would (score, doc) be kept if pushed now?
    bool would_enter(float score, uint32_t doc) const {
        if (std::isnan(score)) return false;
        if (!full()) return true;
        return ranks_before(scored_doc{score, doc}, m_entries.front());
    }

    /// Offers a candidate; returns true when it was kept. Each doc id must be
    /// offered at most once per query.
    bool push(float score, uint32_t doc) {
        if (!would_enter(score, doc)) return false;
        if (!full()) {
            m_entries.push_back(scored_doc{score, doc});
            sift_up(m_entries.size() - 1);
        } else {
            m_entries.front() = scored_doc{score, doc};
            sift_down(0);
        }
        return true;
    }

    /// Makes the kept entries best[0..n) (n <= k, distinct docs, sorted
    /// best-first, no NaN score), replacing what was kept.
    void assign_sorted(const scored_doc* best, size_t n) {
        // worst first: a sorted array is a valid min-heap on rank
        m_entries.assign(std::make_reverse_iterator(best + n), std::make_reverse_iterator(best));
    }

    /// Writes the kept entries sorted best-first into ids/scores (length k),
    /// pads the rest with -1 / -inf and returns the number of real entries.
    /// The collector is left empty.
    int32_t finalize(int64_t* ids, float* scores) {
        if (std::is_sorted(m_entries.begin(), m_entries.end(), worse)) {  // e.g. from assign_sorted
            std::reverse(m_entries.begin(), m_entries.end());
        } else {
            std::sort(m_entries.begin(), m_entries.end(), ranks_before);
        }
        const size_t n = m_entries.size();
        for (size_t i = 0; i < n; ++i) {
            ids[i] = static_cast<int64_t>(m_entries[i].doc);
            scores[i] = m_entries[i].score;
        }
        for (size_t i = n; i < m_k; ++i) {
            ids[i] = -1;
            scores[i] = -std::numeric_limits<float>::infinity();
        }
        m_entries.clear();
        return static_cast<int32_t>(n);
    }

  private:
    // Min-heap on rank: the root is the entry that ranks last.
    static bool worse(const scored_doc& a, const scored_doc& b) { return ranks_before(b, a); }

    void sift_up(size_t i) {
        scored_doc x = m_entries[i];
        while (i > 0) {
            size_t parent = (i - 1) / 2;
            if (!worse(x, m_entries[parent])) break;
            m_entries[i] = m_entries[parent];
            i = parent;
        }
        m_entries[i] = x;
    }

    void sift_down(size_t i) {
        const size_t n = m_entries.size();
        scored_doc x = m_entries[i];
        for (;;) {
            size_t child = 2 * i + 1;
            if (child >= n) break;
            if (child + 1 < n && worse(m_entries[child + 1], m_entries[child])) ++child;
            if (!worse(m_entries[child], x)) break;
            m_entries[i] = m_entries[child];
            i = child;
        }
        m_entries[i] = x;
    }

    size_t m_k = 1;
    std::vector<scored_doc> m_entries;
};

/// 1-based competition ranks of sorted top-k rows: scores (nq, k) row-major,
/// each row descending; ranks[q][j] = 1 + the first position of row q holding
/// scores[q][j] (equal scores share the best position), 0 for j >= n_found[q]
/// (the padding). Time O(nq * k).
inline void tie_ranks_rows(const float* scores, size_t nq, size_t k, const int32_t* n_found, int32_t* ranks) {
    for (size_t q = 0; q < nq; ++q) {
        const float* s = scores + q * k;
        int32_t* r = ranks + q * k;
        const size_t n = n_found[q] < 0 ? 0 : std::min(k, static_cast<size_t>(n_found[q]));
        int32_t start = 1;
        for (size_t j = 0; j < n; ++j) {
            if (j > 0 && !(s[j] == s[j - 1])) start = static_cast<int32_t>(j + 1);
            r[j] = start;
        }
        for (size_t j = n; j < k; ++j) r[j] = 0;
    }
}

}  // namespace retriever
