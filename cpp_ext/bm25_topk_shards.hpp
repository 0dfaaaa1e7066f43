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

/// One per thread: a bm25_worker per shard writing into a one-row scratch output, and
/// the collector of global ordinals carried across the shards. The state lives behind a
/// pointer because the shard workers hold references to the scratch row.
class bm25_shards_worker {
  public:
    bm25_shards_worker(const std::vector<bm25_shard_view>& shards, const std::vector<float>& norm_min,
                       bm25_algorithm algorithm, const topk_out& out)
        : m_shards(shards), m_out(out), m_st(std::make_unique<state>(out.k)) {
        // "auto" decides per query over the union of the shards, as bm25_worker does for one
        // shard holding them all (per shard, a query's shorter lists would go exhaustive and lose
        // the carried threshold): one exhaustive and one MaxScore worker per shard.
        m_auto = algorithm == bm25_algorithm::automatic;
        bool all_impacts = true;
        for (const bm25_shard_view& s : shards) {
            m_auto_docs += s.data.n_docs;
            all_impacts &= s.data.impacts != nullptr;
        }
        m_auto_limit = all_impacts ? kAutoExhaustivePostings : kAutoExhaustivePostings / 4;
        const bm25_algorithm first = m_auto ? bm25_algorithm::exhaustive : algorithm;
        for (size_t i = 0; i < shards.size(); ++i) {
            const bm25_shard_view& s = shards[i];
            const bm25_bounds_view* bounds = s.has_bounds ? &s.bounds : nullptr;
            const bm25_scatter scatter = bm25_scatter_for_cpu();  // chosen once per process
            m_st->workers.push_back(std::make_unique<bm25_worker>(s.data, bounds, s.queries, s.allow, first,
                                                                  m_st->row, norm_min[i], scatter));
            if (m_auto) {
                m_st->maxscore.push_back(std::make_unique<bm25_worker>(
                    s.data, bounds, s.queries, s.allow, bm25_algorithm::maxscore, m_st->row, norm_min[i], scatter));
            }
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
        for (size_t i = 0; i < m_shards.size(); ++i) {
            const bm25_shard_view& s = m_shards[i];
            const uint64_t b = s.queries.q_offsets[qi], e = s.queries.q_offsets[qi + 1];
            if (b == e || s.data.n_docs == 0) continue;  // no term of the query in this shard
            (prune ? st.maxscore : st.workers)[i]->run(0, b, e, st.carry.threshold());
            const int32_t n = st.n_found;
            for (int32_t j = 0; j < n; ++j) {
                st.carry.push(st.scores[j], static_cast<uint32_t>(s.base + static_cast<uint64_t>(st.ids[j])));
            }
        }
        m_out.n_found[qi] = st.carry.finalize(m_out.ids + qi * k, m_out.scores + qi * k);
    }

  private:
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
        topk_out row;  // the shard workers' output: one row of k
        topk_heap carry;
        std::vector<std::unique_ptr<bm25_worker>> workers;   // the call's algorithm ("auto": exhaustive)
        std::vector<std::unique_ptr<bm25_worker>> maxscore;  // "auto" only
    };

    const std::vector<bm25_shard_view>& m_shards;
    bool m_auto = false;
    size_t m_auto_docs = 0;
    uint64_t m_auto_limit = 0;
    const topk_out& m_out;
    std::unique_ptr<state> m_st;
};

}  // namespace

void bm25_topk_shards(const std::vector<bm25_shard_view>& shards, size_t nq, bm25_algorithm algorithm,
                      int n_threads, const topk_out& out) {
    std::vector<float> norm_min(shards.size(), -1.0f);
    for (size_t i = 0; i < shards.size(); ++i) {
        if (algorithm != bm25_algorithm::exhaustive && !shards[i].has_bounds) {
            fail("term_ub, block_offsets and block_ub are required for pruning algorithms");
        }
        norm_min[i] = shard_norm_min(shards[i].data, algorithm, nq);
    }
    parallel_for_items(nq, n_threads, query_chunk(nq, n_threads),
                       [&]() { return bm25_shards_worker(shards, norm_min, algorithm, out); });
}

}  // namespace retriever
