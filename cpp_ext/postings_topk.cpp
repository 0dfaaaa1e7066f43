// BM25 and impact top-k kernels over CSR postings. See postings_topk.hpp.
//
// Algorithms:
//   exhaustive  term-at-a-time over a dense float accumulator (+ touched list)
//   maxscore    MaxScore (Turtle & Flood 1995), document-at-a-time over the
//               essential lists, galloping seeks in the non-essential ones
//   bmw         Block-Max WAND (Ding & Suel 2011)
//   bmm         Block-Max MaxScore (MaxScore with per-block bounds in the
//               non-essential check, after Chakrabarti et al. 2011 / PISA)
//
// Determinism: every algorithm computes a candidate's score with the same
// float32 expression (bm25_contribution) summed in query-term order starting
// at 0.0f, so all algorithms and thread counts return bit-identical results.
// Term-at-a-time adds only the terms present in a document; the
// document-at-a-time paths add +0.0f for absent terms, which is an exact no-op
// because the running sum starts at +0.0f and can never become -0.0f.
//
// Safe pruning: a document is discarded only if an upper bound on its float
// score is STRICTLY below the current k-th score (a document with an equal
// score and a smaller id still enters). Bounds are summed in double and
// inflated by a relative margin that covers float32 rounding of the products
// and of the query-order sum (see bound_check).

#include "postings_topk.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// ---------------------------------------------------------------------------
// Dense accumulators, pooled across calls so a single-query call does not pay
// an O(n_docs) allocation. Invariant while in the pool: acc all +0.0f, seen all 0.
// ---------------------------------------------------------------------------

struct dense_accumulator {
    std::vector<float> acc;
    std::vector<uint8_t> seen;
    std::vector<uint32_t> touched;

    void ensure(size_t n) {
        if (acc.size() < n) {
            acc.resize(n, 0.0f);
            seen.resize(n, 0);
        }
    }
    void clear_touched() {
        for (uint32_t d : touched) {
            acc[d] = 0.0f;
            seen[d] = 0;
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
    }
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

// ---------------------------------------------------------------------------
// Safe bound comparison.
// ---------------------------------------------------------------------------

/// may_enter(bound, thr) is false only when every float32 score the bound
/// covers is certainly < thr. `bound` is a double sum of exact products
/// (double)w * (double)ub; the float score of a document covered by it is at
/// most bound * (1 + 2^-24)^(n+1) (product rounding + n-1 additions of
/// non-negative terms) plus underflow slack. We use a larger margin.
struct bound_check {
    double margin;
    double slack;
    explicit bound_check(size_t n_terms)
        : margin(1.0),
          slack(static_cast<double>(n_terms + 1) * 0x1p-140) {}
    bool may_enter(double bound, float thr) const {
        const double b = bound * margin + slack;
        if (!(b < static_cast<double>(FLT_MAX))) return true;  // could round to +inf
        return b >= static_cast<double>(thr);
    }
};

// ---------------------------------------------------------------------------
// Posting cursor with optional block-max data.
// ---------------------------------------------------------------------------

struct posting_cursor {
    const uint32_t* docs = nullptr;
    uint64_t beg = 0, end = 0, pos = 0;
    uint32_t doc = kEndDoc;  // docs[pos], or kEndDoc when exhausted
    uint32_t qpos = 0;       // position of the term in its query
    float weight = 0.0f;
    double ub = 0.0;         // (double)weight * term_ub[t]
    // block-max
    const float* bub = nullptr;  // this term's block bounds
    uint64_t nb = 0;             // number of blocks of this term
    uint64_t bi = 0;             // shallow block position
    uint64_t bs = 1;             // block size

    void refresh() { doc = pos < end ? docs[pos] : kEndDoc; }
    void next() {
        ++pos;
        refresh();
    }
    /// Moves to the first posting with doc id >= target (galloping search).
    void seek(uint32_t target) {
        if (doc >= target) return;  // also when exhausted
        uint64_t lo = pos;          // docs[lo] < target
        uint64_t step = 1;
        uint64_t hi = lo + 1;
        while (hi < end && docs[hi] < target) {
            lo = hi;
            step <<= 1;
            hi = lo + step;
        }
        if (hi > end) hi = end;
        pos = static_cast<uint64_t>(std::lower_bound(docs + lo + 1, docs + hi, target) - docs);
        refresh();
    }
    uint32_t block_last(uint64_t b) const {
        uint64_t e = beg + (b + 1) * bs;
        if (e > end) e = end;
        return docs[e - 1];
    }
    /// Moves the block position (not the posting position) to the first block
    /// whose last doc id is >= target. Targets must be non-decreasing.
    void shallow_seek(uint32_t target) {
        if (bi >= nb || block_last(bi) >= target) return;
        uint64_t lo = bi;  // block_last(lo) < target
        uint64_t step = 1;
        uint64_t hi = lo + 1;
        while (hi < nb && block_last(hi) < target) {
            lo = hi;
            step <<= 1;
            hi = lo + step;
        }
        if (hi > nb) hi = nb;
        uint64_t l = lo + 1, r = hi;  // answer in [l, r], r == nb means none
        while (l < r) {
            const uint64_t mid = l + (r - l) / 2;
            if (block_last(mid) < target) {
                l = mid + 1;
            } else {
                r = mid;
            }
        }
        bi = l;
    }
    /// Upper bound on this term's contribution to any doc id >= target that
    /// lies in the shallow block reached for target (0 when no block remains).
    double block_bound(uint32_t target) {
        shallow_seek(target);
        return bi < nb ? static_cast<double>(weight) * static_cast<double>(bub[bi]) : 0.0;
    }
    /// Smallest doc id past the current shallow block (kEndDoc if none).
    uint32_t block_boundary() const {
        if (bi >= nb) return kEndDoc;
        return block_last(bi) + 1;  // block_last <= kMaxDocs - 1, no overflow
    }
    /// Bound for the block holding the current posting (not exhausted).
    double current_block_bound() const {
        return static_cast<double>(weight) * static_cast<double>(bub[(pos - beg) / bs]);
    }
};

// ---------------------------------------------------------------------------
// BM25 worker: one per thread, owns all scratch memory.
// ---------------------------------------------------------------------------

class bm25_worker {
  public:
    bm25_worker(const bm25_view& data, const bm25_bounds_view* bounds, const query_batch_view& q,
                const uint8_t* allow, bm25_algorithm algo, const topk_out& out)
        : m_data(data), m_bounds(bounds), m_q(q), m_allow(allow), m_algo(algo), m_out(out) {}

    void operator()(size_t qi) {
        const uint64_t b = m_q.q_offsets[qi];
        const uint64_t e = m_q.q_offsets[qi + 1];
        m_heap.reset(m_out.k);
        if (e > b) {
            bool negative = false;
            for (uint64_t i = b; i < e; ++i) negative |= (m_q.q_weights[i] < 0.0f);
            if (m_algo == bm25_algorithm::exhaustive || negative || m_bounds == nullptr) {
                exhaustive(b, e);
            } else if (m_algo == bm25_algorithm::maxscore) {
                maxscore<false>(b, e);
            } else if (m_algo == bm25_algorithm::block_max_maxscore) {
                maxscore<true>(b, e);
            } else {
                block_max_wand(b, e);
            }
        }
        m_out.n_found[qi] = m_heap.finalize(m_out.ids + qi * m_out.k, m_out.scores + qi * m_out.k);
    }

  private:
    bool allowed(uint32_t d) const { return m_allow == nullptr || m_allow[d] != 0; }

    void check_doc(uint32_t d) const {
        if (d >= m_data.n_docs) {
            fail("doc_ids contains doc id " + std::to_string(d) + " >= n_docs = " +
                 std::to_string(m_data.n_docs) + " (validate the postings with check_csr)");
        }
    }

    // ---- exhaustive: term-at-a-time ------------------------------------
    void exhaustive(uint64_t b, uint64_t e) {
        dense_accumulator& A = m_acc.get();
        A.ensure(m_data.n_docs);
        float* acc = A.acc.data();
        uint8_t* seen = A.seen.data();
        const uint64_t* offsets = m_data.csr.offsets;
        const uint32_t* doc_ids = m_data.csr.doc_ids;
        const uint32_t* tfs = m_data.tfs;
        const float* norm = m_data.doc_norm;
        const size_t n_docs = m_data.n_docs;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_q.q_terms[i];
            const float w = m_q.q_weights[i];
            const uint64_t pe = offsets[t + 1];
            for (uint64_t p = offsets[t]; p < pe; ++p) {
                const uint32_t d = doc_ids[p];
                if (d >= n_docs) check_doc(d);
                if (!seen[d]) {
                    seen[d] = 1;
                    A.touched.push_back(d);
                }
                acc[d] += bm25_contribution(w, tfs[p], norm[d]);
            }
        }
        for (uint32_t d : A.touched) {
            if (allowed(d)) m_heap.push(acc[d], d);
        }
        A.clear_touched();
    }

    // ---- cursor set-up shared by the DAAT algorithms -------------------
    void open_cursors(uint64_t b, uint64_t e, bool with_blocks) {
        const size_t n = static_cast<size_t>(e - b);
        m_cursors.resize(n);
        for (size_t j = 0; j < n; ++j) {
            const uint32_t t = m_q.q_terms[b + j];
            posting_cursor& c = m_cursors[j];
            c.docs = m_data.csr.doc_ids;
            c.beg = m_data.csr.offsets[t];
            c.end = m_data.csr.offsets[t + 1];
            c.pos = c.beg;
            c.refresh();
            c.qpos = static_cast<uint32_t>(j);
            c.weight = m_q.q_weights[b + j];
            c.ub = static_cast<double>(c.weight) * static_cast<double>(m_bounds->term_ub[t]);
            if (with_blocks) {
                c.bs = m_bounds->block_size;
                c.bub = m_bounds->block_ub + m_bounds->block_offsets[t];
                c.nb = m_bounds->block_offsets[t + 1] - m_bounds->block_offsets[t];
                c.bi = 0;
            }
        }
        m_contrib.assign(n, 0.0f);
        m_sorted.resize(n);
        for (size_t j = 0; j < n; ++j) m_sorted[j] = &m_cursors[j];
    }

    float contribution(const posting_cursor& c, uint32_t d) const {
        return bm25_contribution(c.weight, m_data.tfs[c.pos], m_data.doc_norm[d]);
    }

    /// Canonical score: query-order float32 sum of m_contrib; resets m_contrib.
    float take_score() {
        float s = 0.0f;
        for (float& v : m_contrib) {
            s += v;
            v = 0.0f;
        }
        return s;
    }

    // ---- MaxScore / Block-Max MaxScore ----------------------------------
    template <bool BlockMax>
    void maxscore(uint64_t b, uint64_t e) {
        open_cursors(b, e, BlockMax);
        const size_t n = m_cursors.size();
        // Ascending upper bound; ties by query position (deterministic).
        std::sort(m_sorted.begin(), m_sorted.end(),
                  [](const posting_cursor* x, const posting_cursor* y) {
                      return x->ub < y->ub || (x->ub == y->ub && x->qpos < y->qpos);
                  });
        m_prefix.resize(n);
        double run = 0.0;
        for (size_t j = 0; j < n; ++j) {
            run += m_sorted[j]->ub;
            m_prefix[j] = run;
        }
        m_block_prefix.resize(n);
        const bound_check bc(n);
        float thr = m_heap.threshold();
        size_t fe = 0;  // first essential list in m_sorted
        auto min_essential = [&]() {
            uint32_t d = kEndDoc;
            for (size_t j = fe; j < n; ++j) d = std::min(d, m_sorted[j]->doc);
            return d;
        };
        uint32_t cur = min_essential();
        while (fe < n && cur != kEndDoc) {
            check_doc(cur);
            bool candidate = allowed(cur);
            if (candidate && BlockMax) {
                // Block-level bound: essential lists holding cur plus the
                // non-essential lists' blocks that may hold cur.
                double bb = 0.0;
                for (size_t j = fe; j < n; ++j) {
                    if (m_sorted[j]->doc == cur) bb += m_sorted[j]->current_block_bound();
                }
                double run_b = 0.0;
                for (size_t j = 0; j < fe; ++j) {
                    run_b += m_sorted[j]->block_bound(cur);
                    m_block_prefix[j] = run_b;
                }
                if (!bc.may_enter(bb + run_b, thr)) candidate = false;
            }
            if (!candidate) {
                for (size_t j = fe; j < n; ++j) {
                    if (m_sorted[j]->doc == cur) m_sorted[j]->next();
                }
                cur = min_essential();
                continue;
            }
            double partial = 0.0;
            for (size_t j = fe; j < n; ++j) {
                posting_cursor& c = *m_sorted[j];
                if (c.doc == cur) {
                    const float v = contribution(c, cur);
                    m_contrib[c.qpos] = v;
                    partial += v;
                    c.next();
                }
            }
            bool pruned = false;
            for (size_t j = fe; j-- > 0;) {
                const double rest = BlockMax ? m_block_prefix[j] : m_prefix[j];
                if (!bc.may_enter(partial + rest, thr)) {
                    pruned = true;
                    break;
                }
                posting_cursor& c = *m_sorted[j];
                c.seek(cur);
                if (c.doc == cur) {
                    const float v = contribution(c, cur);
                    m_contrib[c.qpos] = v;
                    partial += v;
                }
            }
            if (pruned) {
                std::fill(m_contrib.begin(), m_contrib.end(), 0.0f);
            } else {
                const float s = take_score();
                if (m_heap.push(s, cur)) {
                    const float nt = m_heap.threshold();
                    if (nt != thr) {
                        thr = nt;
                        while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
                    }
                }
            }
            cur = min_essential();
        }
    }

    // ---- Block-Max WAND ---------------------------------------------------
    void sort_by_doc() {
        // Insertion sort: few cursors move per step, so the order is nearly sorted.
        for (size_t i = 1; i < m_sorted.size(); ++i) {
            posting_cursor* x = m_sorted[i];
            size_t j = i;
            while (j > 0 && (m_sorted[j - 1]->doc > x->doc ||
                             (m_sorted[j - 1]->doc == x->doc && m_sorted[j - 1]->qpos > x->qpos))) {
                m_sorted[j] = m_sorted[j - 1];
                --j;
            }
            m_sorted[j] = x;
        }
    }

    void block_max_wand(uint64_t b, uint64_t e) {
        open_cursors(b, e, true);
        const size_t n = m_cursors.size();
        const bound_check bc(n);
        float thr = m_heap.threshold();
        for (;;) {
            sort_by_doc();
            // Pivot: first position where the list bounds of all lists up to it may reach thr.
            double acc = 0.0;
            size_t p = n;
            for (size_t i = 0; i < n; ++i) {
                if (m_sorted[i]->doc == kEndDoc) break;
                acc += m_sorted[i]->ub;
                if (bc.may_enter(acc, thr)) {
                    p = i;
                    break;
                }
            }
            if (p == n) break;
            const uint32_t pivot = m_sorted[p]->doc;
            while (p + 1 < n && m_sorted[p + 1]->doc == pivot) ++p;
            double bb = 0.0;
            for (size_t i = 0; i <= p; ++i) bb += m_sorted[i]->block_bound(pivot);
            if (bc.may_enter(bb, thr)) {
                if (m_sorted[0]->doc == pivot) {
                    // Lists 0..p hold exactly the terms of pivot.
                    check_doc(pivot);
                    if (allowed(pivot)) {
                        for (size_t i = 0; i <= p; ++i) {
                            const posting_cursor& c = *m_sorted[i];
                            m_contrib[c.qpos] = contribution(c, pivot);
                        }
                        const float s = take_score();
                        if (m_heap.push(s, pivot)) thr = m_heap.threshold();
                    }
                    for (size_t i = 0; i <= p; ++i) m_sorted[i]->next();
                } else {
                    // Docs before pivot are covered only by lists before the
                    // pivot position, whose bounds cannot reach thr.
                    for (size_t i = 0; i < p && m_sorted[i]->doc < pivot; ++i) m_sorted[i]->seek(pivot);
                }
            } else {
                // No doc in [pivot, next) can reach thr: it would lie in the
                // current blocks of lists 0..p only.
                uint32_t next = p + 1 < n ? m_sorted[p + 1]->doc : kEndDoc;
                for (size_t i = 0; i <= p; ++i) next = std::min(next, m_sorted[i]->block_boundary());
                // Advance the list with the largest bound (ties: first).
                size_t best = 0;
                for (size_t i = 1; i <= p; ++i) {
                    if (m_sorted[i]->ub > m_sorted[best]->ub) best = i;
                }
                m_sorted[best]->seek(next);
            }
        }
        std::fill(m_contrib.begin(), m_contrib.end(), 0.0f);
    }

    const bm25_view& m_data;
    const bm25_bounds_view* m_bounds;
    const query_batch_view& m_q;
    const uint8_t* m_allow;
    bm25_algorithm m_algo;
    const topk_out& m_out;

    topk_heap m_heap;
    accumulator_lease m_acc;
    std::vector<posting_cursor> m_cursors;
    std::vector<posting_cursor*> m_sorted;
    std::vector<float> m_contrib;
    std::vector<double> m_prefix;
    std::vector<double> m_block_prefix;
};

// ---------------------------------------------------------------------------
// Impact worker: exhaustive term-at-a-time, templated over the stored impact
// type and its decoding so a quantised (uint8 + scale) variant is one more
// instantiation.
// ---------------------------------------------------------------------------

struct decode_f32 {
    float operator()(float v) const { return v; }
};

template <class Impact, class Decode>
class impact_worker {
  public:
    impact_worker(const csr_view& csr, const Impact* impacts, Decode decode,
                  const query_batch_view& q, const uint8_t* allow, size_t allow_len,
                  const topk_out& out)
        : m_csr(csr), m_impacts(impacts), m_decode(decode), m_q(q), m_allow(allow),
          m_allow_len(allow_len), m_out(out) {}

    void operator()(size_t qi) {
        const uint64_t b = m_q.q_offsets[qi];
        const uint64_t e = m_q.q_offsets[qi + 1];
        m_heap.reset(m_out.k);
        if (e > b) {
            dense_accumulator& A = m_acc.get();
            for (uint64_t i = b; i < e; ++i) {
                const uint32_t t = m_q.q_terms[i];
                const float w = m_q.q_weights[i];
                const uint64_t pe = m_csr.offsets[t + 1];
                for (uint64_t p = m_csr.offsets[t]; p < pe; ++p) {
                    const uint32_t d = m_csr.doc_ids[p];
                    if (d >= A.acc.size()) grow(A, d);
                    if (!A.seen[d]) {
                        A.seen[d] = 1;
                        A.touched.push_back(d);
                    }
                    A.acc[d] += w * m_decode(m_impacts[p]);
                }
            }
            for (uint32_t d : A.touched) {
                if (m_allow != nullptr) {
                    if (d >= m_allow_len) {
                        fail("doc_ids contains doc id " + std::to_string(d) +
                             " >= len(allow) = " + std::to_string(m_allow_len));
                    }
                    if (!m_allow[d]) continue;
                }
                m_heap.push(A.acc[d], d);
            }
            A.clear_touched();
        }
        m_out.n_found[qi] = m_heap.finalize(m_out.ids + qi * m_out.k, m_out.scores + qi * m_out.k);
    }

  private:
    static void grow(dense_accumulator& A, uint32_t d) {
        if (static_cast<uint64_t>(d) >= kMaxDocs) {
            fail("doc_ids contains doc id " + std::to_string(d) + ", above the supported maximum");
        }
        size_t want = std::max<size_t>(static_cast<size_t>(d) + 1, A.acc.size() + A.acc.size() / 2);
        want = std::min<size_t>(want, static_cast<size_t>(kMaxDocs));
        A.ensure(want);
    }

    const csr_view& m_csr;
    const Impact* m_impacts;
    Decode m_decode;
    const query_batch_view& m_q;
    const uint8_t* m_allow;
    size_t m_allow_len;
    const topk_out& m_out;
    topk_heap m_heap;
    accumulator_lease m_acc;
};

size_t query_chunk(size_t nq, int n_threads) {
    const size_t t = resolve_threads(n_threads, nq);
    return std::max<size_t>(1, std::min<size_t>(16, nq / (8 * t)));
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

bm25_algorithm parse_bm25_algorithm(const std::string& name) {
    if (name == "exhaustive") return bm25_algorithm::exhaustive;
    if (name == "maxscore") return bm25_algorithm::maxscore;
    if (name == "bmw") return bm25_algorithm::block_max_wand;
    if (name == "bmm") return bm25_algorithm::block_max_maxscore;
    fail("algorithm must be one of 'exhaustive', 'maxscore', 'bmw', 'bmm'; got '" + name + "'");
}

void check_csr(const csr_view& csr, uint64_t n_docs) {
    if (n_docs > kMaxDocs) {
        fail("n_docs = " + std::to_string(n_docs) + " exceeds the supported maximum " +
             std::to_string(kMaxDocs));
    }
    const uint64_t* off = csr.offsets;
    if (off[0] != 0) fail("offsets[0] must be 0, got " + std::to_string(off[0]));
    for (size_t t = 0; t < csr.n_terms; ++t) {
        if (off[t + 1] < off[t]) {
            fail("offsets must be non-decreasing: offsets[" + std::to_string(t + 1) + "] = " +
                 std::to_string(off[t + 1]) + " < offsets[" + std::to_string(t) +
                 "] = " + std::to_string(off[t]));
        }
    }
    if (off[csr.n_terms] != csr.nnz) {
        fail("offsets[-1] = " + std::to_string(off[csr.n_terms]) + " != len(doc_ids) = " +
             std::to_string(csr.nnz));
    }
    for (size_t t = 0; t < csr.n_terms; ++t) {
        const uint64_t b = off[t], e = off[t + 1];
        for (uint64_t p = b; p < e; ++p) {
            const uint32_t d = csr.doc_ids[p];
            if (d >= n_docs) {
                fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) + " (term " +
                     std::to_string(t) + ") >= n_docs = " + std::to_string(n_docs));
            }
            if (p > b && d <= csr.doc_ids[p - 1]) {
                fail("doc_ids of term " + std::to_string(t) + " must be strictly increasing: doc_ids[" +
                     std::to_string(p) + "] = " + std::to_string(d) + " <= doc_ids[" +
                     std::to_string(p - 1) + "] = " + std::to_string(csr.doc_ids[p - 1]));
            }
        }
    }
}

void check_query_batch(const query_batch_view& q, size_t n_terms) {
    if (q.q_offsets[0] != 0) fail("q_offsets[0] must be 0, got " + std::to_string(q.q_offsets[0]));
    for (size_t i = 0; i < q.nq; ++i) {
        if (q.q_offsets[i + 1] < q.q_offsets[i]) {
            fail("q_offsets must be non-decreasing: q_offsets[" + std::to_string(i + 1) + "] = " +
                 std::to_string(q.q_offsets[i + 1]) + " < q_offsets[" + std::to_string(i) +
                 "] = " + std::to_string(q.q_offsets[i]));
        }
    }
    if (q.q_offsets[q.nq] != q.m) {
        fail("q_offsets[-1] = " + std::to_string(q.q_offsets[q.nq]) + " != len(q_terms) = " +
             std::to_string(q.m));
    }
    for (size_t i = 0; i < q.m; ++i) {
        if (q.q_terms[i] >= n_terms) {
            fail("q_terms[" + std::to_string(i) + "] = " + std::to_string(q.q_terms[i]) +
                 " is out of range: n_terms = " + std::to_string(n_terms));
        }
        if (!std::isfinite(q.q_weights[i])) {
            fail("q_weights[" + std::to_string(i) + "] = " + std::to_string(q.q_weights[i]) +
                 " is not finite");
        }
    }
}

void check_bounds_for_queries(const csr_view& csr, const bm25_bounds_view& b,
                              const query_batch_view& q) {
    if (b.block_offsets != nullptr && b.block_size == 0) fail("block_size must be >= 1, got 0");
    for (size_t i = 0; i < q.m; ++i) {
        const uint32_t t = q.q_terms[i];
        const float ub = b.term_ub[t];
        if (!(ub >= 0.0f) || !std::isfinite(ub)) {
            fail("term_ub[" + std::to_string(t) + "] = " + std::to_string(ub) +
                 " must be finite and >= 0 (compute it with bm25_upper_bounds)");
        }
        if (b.block_offsets == nullptr) continue;
        const uint64_t b0 = b.block_offsets[t], b1 = b.block_offsets[t + 1];
        const uint64_t len = csr.offsets[t + 1] - csr.offsets[t];
        const uint64_t want = (len + b.block_size - 1) / b.block_size;
        if (b1 < b0 || b1 - b0 != want || b1 > b.n_blocks) {
            fail("block_offsets[" + std::to_string(t) + ":" + std::to_string(t + 2) + "] = [" +
                 std::to_string(b0) + ", " + std::to_string(b1) + "] do not match term " +
                 std::to_string(t) + " with " + std::to_string(len) + " postings, block_size " +
                 std::to_string(b.block_size) + " and len(block_ub) = " +
                 std::to_string(b.n_blocks) + " (compute them with bm25_upper_bounds)");
        }
    }
}

uint64_t bm25_block_offsets(const csr_view& csr, uint32_t block_size, uint64_t* block_offsets) {
    if (block_size == 0) fail("block_size must be >= 1, got 0");
    uint64_t total = 0;
    for (size_t t = 0; t < csr.n_terms; ++t) {
        block_offsets[t] = total;
        const uint64_t len = csr.offsets[t + 1] - csr.offsets[t];
        total += (len + block_size - 1) / block_size;
    }
    block_offsets[csr.n_terms] = total;
    return total;
}

void bm25_upper_bounds(const bm25_view& data, uint32_t block_size, const uint64_t* block_offsets,
                       int n_threads, float* term_ub, float* block_ub) {
    if (block_size == 0) fail("block_size must be >= 1, got 0");
    for (size_t d = 0; d < data.n_docs; ++d) {
        const float v = data.doc_norm[d];
        if (!(v >= 0.0f) || !std::isfinite(v)) {
            fail("doc_norm[" + std::to_string(d) + "] = " + std::to_string(v) +
                 " must be finite and >= 0");
        }
    }
    const size_t n_docs = data.n_docs;
    auto make_worker = [&]() {
        return [&](size_t t) {
            const uint64_t b = data.csr.offsets[t], e = data.csr.offsets[t + 1];
            float tmax = 0.0f;
            uint64_t blk = block_offsets[t];
            for (uint64_t s = b; s < e; s += block_size, ++blk) {
                const uint64_t se = std::min<uint64_t>(e, s + block_size);
                float bmax = 0.0f;
                for (uint64_t p = s; p < se; ++p) {
                    const uint32_t d = data.csr.doc_ids[p];
                    if (d >= n_docs) {
                        fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) +
                             " >= n_docs = " + std::to_string(n_docs));
                    }
                    bmax = std::max(bmax, bm25_tf_part(data.tfs[p], data.doc_norm[d]));
                }
                block_ub[blk] = bmax;
                tmax = std::max(tmax, bmax);
            }
            term_ub[t] = tmax;
        };
    };
    parallel_for_items(data.csr.n_terms, n_threads, 256, make_worker);
}

void bm25_topk(const bm25_view& data, const bm25_bounds_view* bounds,
               const query_batch_view& queries, const uint8_t* allow, bm25_algorithm algorithm,
               int n_threads, const topk_out& out) {
    if (algorithm != bm25_algorithm::exhaustive && bounds == nullptr) {
        fail("term_ub, block_offsets and block_ub are required for pruning algorithms");
    }
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return bm25_worker(data, bounds, queries, allow, algorithm, out);
    });
}

void impact_topk_f32(const csr_view& csr, const float* impacts, const query_batch_view& queries,
                     const uint8_t* allow, size_t allow_len, int n_threads, const topk_out& out) {
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return impact_worker<float, decode_f32>(csr, impacts, decode_f32{}, queries, allow,
                                                allow_len, out);
    });
}

}  // namespace retriever
