// bm25_topk_shards (declared in bm25_shards.hpp): the per-thread worker that runs a query
// through every shard with one carried top-k collector. Included once, at the end of
// bm25_topk.cpp, whose bm25_worker scores one shard.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "bm25_shards.hpp"

namespace retriever {

namespace {

/// min(doc_norm) of a shard when bm25_topk would use it for per-posting tf bounds (a
/// pruning algorithm without impacts, a batch large enough to pay the O(n_docs) pass),
/// else -1 (disabled). Results never depend on it.
float shard_norm_min(const bm25_view& data, bm25_algorithm algorithm, size_t nq) {
    if (algorithm == bm25_algorithm::exhaustive || data.impacts != nullptr || data.n_docs == 0 ||
        nq * 4096 < data.n_docs) {
        return -1.0f;
    }
    float mn = std::numeric_limits<float>::infinity();
    bool ok = true;
    for (size_t d = 0; d < data.n_docs; ++d) {
        const float v = data.doc_norm[d];
        ok &= (v >= 0.0f);  // false for NaN too
        mn = std::min(mn, v);
    }
    return ok && std::isfinite(mn) ? mn : -1.0f;
}

/// One per thread: one bm25_worker that serves every shard in turn (rebound to the shard's
/// views before each, so its scratch memory is allocated once per call: per shard, the
/// window buffers of MaxScore and the exhaustive accumulator cost more than a short query),
/// writing into a one-row scratch output, and the collector of global ordinals carried
/// across the shards. The state lives behind a pointer because the worker holds references
/// to the scratch row and to the current shard's views.
class bm25_shards_worker {
  public:
    bm25_shards_worker(const std::vector<bm25_shard_view>& shards, const query_batch_view& queries,
                       const float* union_kth, const std::vector<float>& norm_min, bm25_algorithm algorithm,
                       const topk_out& out)
        : m_shards(shards), m_q(queries), m_norm_min(norm_min), m_out(out), m_st(std::make_unique<state>(out.k)) {
        bool any_allow = false;
        for (const bm25_shard_view& s : shards) any_allow |= s.allow != nullptr;
        m_union_kth = any_allow ? nullptr : union_kth;  // single-term bounds assume every document may enter
        // "auto" decides per query over the union of the shards, as bm25_worker does for one
        // shard holding them all (per shard, a query's shorter lists would go exhaustive and lose
        // the carried threshold): exhaustive or MaxScore on every shard.
        m_auto = algorithm == bm25_algorithm::automatic;
        bool all_impacts = true;
        for (const bm25_shard_view& s : shards) {
            m_auto_docs += s.data.n_docs;
            all_impacts &= s.data.impacts != nullptr;
        }
        m_auto_limit = all_impacts ? kAutoExhaustivePostings : kAutoExhaustivePostings / 4;
        m_algo = m_auto ? bm25_algorithm::exhaustive : algorithm;
        if (!shards.empty()) {
            const bm25_shard_view& s = shards[0];
            m_st->data = s.data;
            m_st->queries = s.queries;
            m_st->bounds = s.bounds;
            m_st->worker = std::make_unique<bm25_worker>(m_st->data, s.has_bounds ? &m_st->bounds : nullptr,
                                                         m_st->queries, s.allow, m_algo, m_st->row, norm_min[0],
                                                         bm25_scatter_for_cpu());
        }
    }

    void operator()(size_t qi) {
        state& st = *m_st;
        const size_t k = m_out.k;
        st.carry.reset(k);
        bool prune = false;  // "auto": MaxScore for this query
        if (m_auto && m_auto_docs > kAutoExhaustiveDocs) {
            uint64_t total = 0;
            for (const bm25_shard_view& s : m_shards) {
                for (uint64_t j = s.queries.q_offsets[qi]; j < s.queries.q_offsets[qi + 1]; ++j) {
                    const uint32_t t = s.queries.q_terms[j];
                    total += s.data.csr.offsets[t + 1] - s.data.csr.offsets[t];
                }
            }
            prune = total > m_auto_limit;
        }
        const bm25_algorithm algo = prune ? bm25_algorithm::maxscore : m_algo;
        // The threshold every shard starts from, found once for the whole index as one shard
        // holding every document would find it (so the first shards prune as well as the last):
        // the best single-term k-th score over the union, then the k-th best partial score of
        // the documents of the query's short high-bound lists in all shards together.
        float floor = -std::numeric_limits<float>::infinity();
        bool primed = false;  // the shards then skip their own priming
        const uint64_t qb = m_q.q_offsets[qi], qe = m_q.q_offsets[qi + 1];
        if (algo != bm25_algorithm::exhaustive && qe > qb && !negative_weight(qb, qe)) {
            if (m_union_kth != nullptr) floor = single_term_threshold(qb, qe);
            floor = std::max(floor, prime_threshold(qb, qe, k));
            primed = true;
        }
        for (size_t i = 0; i < m_shards.size(); ++i) {
            const bm25_shard_view& s = m_shards[i];
            const uint64_t b = s.queries.q_offsets[qi], e = s.queries.q_offsets[qi + 1];
            if (b == e || s.data.n_docs == 0) continue;  // no term of the query in this shard
            st.data = s.data;
            st.queries = s.queries;
            st.bounds = s.bounds;
            st.worker->rebind(s.has_bounds ? &st.bounds : nullptr, s.allow, algo, m_norm_min[i], !primed);
            st.worker->run(0, b, e, std::max(floor, st.carry.threshold()));
            const int32_t n = st.n_found;
            for (int32_t j = 0; j < n; ++j) {
                st.carry.push(st.scores[j], static_cast<uint32_t>(s.base + static_cast<uint64_t>(st.ids[j])));
            }
        }
        m_out.n_found[qi] = st.carry.finalize(m_out.ids + qi * k, m_out.scores + qi * k);
    }

  private:
    bool negative_weight(uint64_t b, uint64_t e) const {
        bool negative = false;
        for (uint64_t j = b; j < e; ++j) negative |= !(m_q.q_weights[j] >= 0.0f);
        return negative;
    }

    /// bm25_query::single_term_threshold over the union: max over the query's terms of
    /// fl(w * union_kth[t]), union_kth[t] being the k-th largest tf part of t's postings in
    /// all shards together; safe for the same reason (k distinct documents reach it; weights
    /// >= 0 and no allow filter, both checked by the caller). A NaN entry is ignored.
    float single_term_threshold(uint64_t b, uint64_t e) const {
        float theta = -std::numeric_limits<float>::infinity();
        for (uint64_t j = b; j < e; ++j) {
            const float v = m_union_kth[m_q.q_terms[j]];
            if (v >= 0.0f) theta = std::max(theta, m_q.q_weights[j] * v);
        }
        return theta;
    }

    /// daat_query::prime_threshold over the union of the shards: the query's lists in
    /// decreasing order of their upper bound (the largest per-shard term_ub: the bound one
    /// shard holding every document would have; ties by query position) are taken while their
    /// postings over all shards fit the same budget; every document of the taken lists gets
    /// its partial score (the float32 sum, in query order, of the taken lists' contributions,
    /// a lower bound of its score), and the k-th best of those among the allowed documents,
    /// over all shards together, is a safe threshold (k documents reach it). -inf when fewer
    /// than k documents qualify, or a contribution is negative or NaN (no priming).
    float prime_threshold(uint64_t b, uint64_t e, size_t k) {
        const float none = -std::numeric_limits<float>::infinity();
        state& st = *m_st;
        const size_t n = static_cast<size_t>(e - b);
        st.prime_ub.assign(n, 0.0);
        st.prime_len.assign(n, 0);
        for (size_t j = 0; j < n; ++j) {
            const uint32_t g = m_q.q_terms[b + j];
            float ub = 0.0f;
            for (const bm25_shard_view& s : m_shards) {
                const uint32_t t = shard_term_at(s, b + j, g);
                if (t == kNoShardTerm) continue;
                st.prime_len[j] += s.data.csr.offsets[t + 1] - s.data.csr.offsets[t];
                if (s.has_bounds) ub = std::max(ub, s.bounds.term_ub[t]);
            }
            st.prime_ub[j] = static_cast<double>(m_q.q_weights[b + j]) * static_cast<double>(ub);
        }
        st.prime_order.resize(n);
        for (size_t j = 0; j < n; ++j) st.prime_order[j] = static_cast<uint32_t>(j);
        std::sort(st.prime_order.begin(), st.prime_order.end(), [&](uint32_t x, uint32_t y) {
            return st.prime_ub[x] > st.prime_ub[y] || (st.prime_ub[x] == st.prime_ub[y] && x < y);
        });
        st.prime_use.assign(n, 0);
        uint64_t budget = std::min<uint64_t>(std::max<uint64_t>(kPrimeBudget, 4 * k), kPrimeBudgetMax);
        uint64_t total = 0;
        for (uint32_t j : st.prime_order) {
            if (st.prime_len[j] > budget) break;
            budget -= st.prime_len[j];
            total += st.prime_len[j];
            st.prime_use[j] = 1;
        }
        if (total < k) return none;
        std::vector<float>& best = st.prime_best;  // min-heap of the k best partial scores
        best.clear();
        for (const bm25_shard_view& s : m_shards) {
            std::vector<uint32_t>& docs = st.prime_docs;
            docs.clear();
            for (size_t j = 0; j < n; ++j) {
                const uint32_t t = shard_term_at(s, b + j, m_q.q_terms[b + j]);
                if (!st.prime_use[j] || t == kNoShardTerm) continue;
                docs.insert(docs.end(), s.data.csr.doc_ids + s.data.csr.offsets[t],
                            s.data.csr.doc_ids + s.data.csr.offsets[t + 1]);
            }
            if (docs.empty()) continue;
            std::sort(docs.begin(), docs.end());
            docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
            std::vector<float>& sc = st.prime_scores;
            sc.assign(docs.size(), 0.0f);
            for (size_t j = 0; j < n; ++j) {  // query order
                const uint32_t t = shard_term_at(s, b + j, m_q.q_terms[b + j]);
                if (!st.prime_use[j] || t == kNoShardTerm) continue;
                const float w = m_q.q_weights[b + j];
                size_t at = 0;
                for (uint64_t p = s.data.csr.offsets[t], pe = s.data.csr.offsets[t + 1]; p < pe; ++p) {
                    const uint32_t d = s.data.csr.doc_ids[p];
                    while (docs[at] < d) ++at;  // d is in docs
                    if (d >= s.data.n_docs) {
                        fail("doc_ids contains doc id " + std::to_string(d) + " >= n_docs = " +
                             std::to_string(s.data.n_docs) + " (validate the postings with check_csr)");
                    }
                    const float v = s.data.impacts != nullptr
                                        ? w * s.data.impacts[p]
                                        : bm25_contribution(w, s.data.tfs[p], s.data.doc_norm[d]);
                    if (!(v >= 0.0f)) return none;  // negative or NaN: no priming
                    sc[at] += v;
                }
            }
            for (size_t i = 0; i < docs.size(); ++i) {
                if ((s.allow != nullptr && s.allow[docs[i]] == 0) || std::isnan(sc[i])) continue;
                if (best.size() < k) {
                    best.push_back(sc[i]);
                    std::push_heap(best.begin(), best.end(), std::greater<float>());
                } else if (sc[i] > best.front()) {
                    std::pop_heap(best.begin(), best.end(), std::greater<float>());
                    best.back() = sc[i];
                    std::push_heap(best.begin(), best.end(), std::greater<float>());
                }
            }
        }
        return best.size() < k ? none : best.front();
    }

    struct state {
        explicit state(size_t k) : ids(k), scores(k) {
            row.ids = ids.data();
            row.scores = scores.data();
            row.n_found = &n_found;
            row.k = k;
        }
        std::vector<int64_t> ids;
        std::vector<float> scores;
        int32_t n_found = 0;
        topk_out row;  // the worker's output: one row of k
        topk_heap carry;
        bm25_view data;             // the current shard's views, which the worker refers to
        query_batch_view queries;
        bm25_bounds_view bounds;
        std::unique_ptr<bm25_worker> worker;
        // prime_threshold scratch
        std::vector<double> prime_ub;
        std::vector<uint64_t> prime_len;
        std::vector<uint32_t> prime_order;
        std::vector<uint8_t> prime_use;
        std::vector<uint32_t> prime_docs;
        std::vector<float> prime_scores;
        std::vector<float> prime_best;
    };

    const std::vector<bm25_shard_view>& m_shards;
    const query_batch_view& m_q;
    const float* m_union_kth = nullptr;
    const std::vector<float>& m_norm_min;
    bool m_auto = false;
    bm25_algorithm m_algo = bm25_algorithm::exhaustive;  // "auto": exhaustive unless the query prunes
    size_t m_auto_docs = 0;
    uint64_t m_auto_limit = 0;
    const topk_out& m_out;
    std::unique_ptr<state> m_st;
};

}  // namespace

void bm25_topk_shards(const std::vector<bm25_shard_view>& shards, const query_batch_view& queries,
                      const float* union_kth, bm25_algorithm algorithm, int n_threads, const topk_out& out) {
    const size_t nq = queries.nq;
    std::vector<float> norm_min(shards.size(), -1.0f);
    for (size_t i = 0; i < shards.size(); ++i) {
        if (algorithm != bm25_algorithm::exhaustive && !shards[i].has_bounds) {
            fail("term_ub, block_offsets and block_ub are required for pruning algorithms");
        }
        norm_min[i] = shard_norm_min(shards[i].data, algorithm, nq);
    }
    parallel_for_items(nq, n_threads, query_chunk(nq, n_threads), [&]() {
        return bm25_shards_worker(shards, queries, union_kth, norm_min, algorithm, out);
    });
}

void bm25_term_kth_shards(const std::vector<bm25_shard_view>& shards, const uint32_t* terms, size_t n,
                          size_t depth, int n_threads, float* out) {
    if (depth == 0) fail("depth must be >= 1, got 0");
    auto make_worker = [&]() {
        std::vector<float> heap;  // min-heap of the depth largest values so far
        return [&, heap](size_t i) mutable {
            const uint32_t g = terms[i];
            const float none = -std::numeric_limits<float>::infinity();
            uint64_t total = 0;
            for (const bm25_shard_view& s : shards) {
                const uint32_t t = shard_term(s, g);
                if (t != kNoShardTerm) total += s.data.csr.offsets[t + 1] - s.data.csr.offsets[t];
            }
            if (total < depth) {
                out[i] = none;
                return;
            }
            heap.clear();
            for (const bm25_shard_view& s : shards) {
                const uint32_t t = shard_term(s, g);
                if (t == kNoShardTerm) continue;
                const bm25_view& data = s.data;
                const uint64_t b = data.csr.offsets[t], e = data.csr.offsets[t + 1];
                const bool blocks = s.bounds.block_offsets != nullptr && s.bounds.block_ub != nullptr;
                const uint64_t bs = blocks ? s.bounds.block_size : (e - b);
                uint64_t blk = blocks ? s.bounds.block_offsets[t] : 0;
                for (uint64_t p0 = b; p0 < e; p0 += bs, ++blk) {
                    // a block whose maximum is not above the current depth-th value cannot change it
                    if (blocks && heap.size() == depth && !(s.bounds.block_ub[blk] > heap.front())) continue;
                    const uint64_t pe = std::min<uint64_t>(e, p0 + bs);
                    for (uint64_t p = p0; p < pe; ++p) {
                        float v;
                        if (data.impacts != nullptr) {
                            v = data.impacts[p];
                        } else {
                            const uint32_t d = data.csr.doc_ids[p];
                            if (d >= data.n_docs) {
                                fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) +
                                     " >= n_docs = " + std::to_string(data.n_docs));
                            }
                            v = bm25_tf_part(data.tfs[p], data.doc_norm[d]);
                        }
                        if (!(v >= 0.0f)) {  // negative or NaN: no bound for t
                            out[i] = none;
                            return;
                        }
                        if (heap.size() < depth) {
                            heap.push_back(v);
                            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
                        } else if (v > heap.front()) {
                            std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
                            heap.back() = v;
                            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
                        }
                    }
                }
            }
            out[i] = heap.front();
        };
    };
    parallel_for_items(n, n_threads, 16, make_worker);
}

}  // namespace retriever
