// BM25 top-k over CSR postings (bm25_topk, bm25_topk_text): the per-thread worker
// that picks an algorithm per query. See postings_topk.hpp.
//
// Algorithms (one header each):
//   exhaustive  term-at-a-time over a dense float accumulator (+ touched list),
//               bm25_exhaustive.hpp
//   maxscore    MaxScore (Turtle & Flood 1995): lists sorted by upper bound,
//               candidates only from the essential lists, the non-essential
//               ones probed while a document can still reach the k-th score.
//               Evaluated window-at-a-time (term-at-a-time inside windows of
//               kWindow doc ids, as Lucene's MaxScoreBulkScorer does) when the
//               essential lists are dense, document-at-a-time with galloping
//               seeks when they are sparse or the query is long; bm25_maxscore.hpp.
//   bmw         Block-Max WAND (Ding & Suel 2011)
//   bmm         Block-Max MaxScore (DAAT MaxScore whose essential lists skip
//               whole blocks and pre-check candidates with per-block bounds;
//               block maxima after Ding & Suel 2011 / Chakrabarti et al. 2011);
//               both in bm25_block_max.hpp
// With an allow filter a query is either evaluated by its algorithm (the
// postings walked, the filter tested per candidate) or, when the filter passes
// few documents, filter-driven: only the passing documents are scored
// (bm25_filtered.hpp), chosen per query by a cost model (bm25_worker::run).
// All pruning algorithms first prime the threshold from the query's short,
// high-bound lists (prime_threshold, bm25_daat.hpp) and, when the caller passes term_kth, from
// the best single-term k-th score (single_term_threshold), and check
// candidates against per-posting tf bounds before reading doc_norm.
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

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bm25_block_max.hpp"
#include "bm25_exhaustive.hpp"
#include "bm25_filtered.hpp"
#include "bm25_maxscore.hpp"
#include "bm25_query.hpp"
#include "bm25_simd.hpp"
#include "parallel.hpp"
#include "postings_topk.hpp"
#include "query_terms.hpp"

namespace retriever {

namespace {

/// One per thread: the query context and one instance of each algorithm, each owning
/// its scratch memory (reused across the queries of a batch).
class bm25_worker {
  public:
    bm25_worker(const bm25_view& data, const bm25_bounds_view* bounds, const query_batch_view& q,
                const uint8_t* allow, bm25_algorithm algo, const topk_out& out, float norm_min, bm25_scatter scatter,
                bm25_filter_plan filter_plan = bm25_filter_plan::automatic)
        : m_ctx(data, bounds, q, allow, algo, out, norm_min, scatter), m_exhaustive(m_ctx), m_maxscore(m_ctx),
          m_block_max(m_ctx), m_filtered(m_ctx) {
        m_ctx.filter_plan = filter_plan;
    }
    bm25_worker(const bm25_worker&) = delete;
    bm25_worker& operator=(const bm25_worker&) = delete;
    bm25_worker(bm25_worker&& o) noexcept
        : bm25_worker(o.m_ctx.data, o.m_ctx.bounds, o.m_ctx.q, o.m_ctx.allow, o.m_ctx.algo, o.m_ctx.out,
                      o.m_ctx.norm_min, o.m_ctx.scatter, o.m_ctx.filter_plan) {}

    void operator()(size_t qi) { run(qi, m_ctx.q.q_offsets[qi], m_ctx.q.q_offsets[qi + 1]); }

    /// Serves another shard: the caller has reassigned the bm25_view and query_batch_view
    /// this worker was built over (see bm25_query::rebind).
    void rebind(const bm25_bounds_view* bounds, const uint8_t* allow, bm25_algorithm algo, float norm_min,
                bool prime) {
        m_ctx.rebind(bounds, allow, algo, norm_min, prime);
        m_maxscore.rebind();
        m_block_max.rebind();
        m_auto_limit = m_ctx.imp != nullptr ? kAutoExhaustivePostings : kAutoExhaustivePostings / 4;
    }

    /// Scores the query whose terms are m_ctx.q.q_terms[b .. e) into output row qi.
    /// floor: a score the caller already holds k better-ranked hits for (the shared
    /// threshold of bm25_topk_shards, -inf otherwise): the pruning algorithms start
    /// from it, so the row is exact only for the hits that rank above it.
    void run(size_t qi, uint64_t b, uint64_t e,
             float floor = -std::numeric_limits<float>::infinity()) {
        m_ctx.heap.reset(m_ctx.out.k);
        if (e > b) {
            bool negative = false;
            for (uint64_t i = b; i < e; ++i) negative |= (m_ctx.q.q_weights[i] < 0.0f);
            bm25_algorithm algo = m_ctx.algo;
            if (algo == bm25_algorithm::automatic) {
                uint64_t total = 0;
                for (uint64_t i = b; i < e; ++i) {
                    const uint32_t t = m_ctx.q.q_terms[i];
                    total += m_ctx.data.csr.offsets[t + 1] - m_ctx.data.csr.offsets[t];
                }
                algo = (total <= m_auto_limit || m_ctx.data.n_docs <= kAutoExhaustiveDocs)
                           ? bm25_algorithm::exhaustive
                           : bm25_algorithm::maxscore;
            }
            m_ctx.theta_ext = floor;
            if (m_ctx.allow != nullptr && filter_driven(b, e)) {
                m_filtered.run(b, e);
                m_ctx.out.n_found[qi] =
                    m_ctx.heap.finalize(m_ctx.out.ids + qi * m_ctx.out.k, m_ctx.out.scores + qi * m_ctx.out.k);
                return;
            }
            if (!negative && m_ctx.allow == nullptr && m_ctx.bounds != nullptr &&
                m_ctx.bounds->term_kth != nullptr) {
                m_ctx.theta_ext = std::max(floor, m_ctx.single_term_threshold(b, e));
            } else if (!negative && m_ctx.allow != nullptr && algo != bm25_algorithm::exhaustive) {
                m_ctx.theta_ext = std::max(floor, m_filtered.passing_single_term_threshold(b, e));
            }
            if (algo == bm25_algorithm::exhaustive || negative || m_ctx.bounds == nullptr) {
                m_exhaustive.exhaustive(b, e);
            } else if (algo == bm25_algorithm::maxscore) {
                m_maxscore.maxscore(b, e);
            } else if (m_ctx.algo == bm25_algorithm::block_max_maxscore) {
                m_block_max.block_max_maxscore(b, e);
            } else {
                m_block_max.block_max_wand(b, e);
            }
        }
        m_ctx.out.n_found[qi] = m_ctx.heap.finalize(m_ctx.out.ids + qi * m_ctx.out.k, m_ctx.out.scores + qi * m_ctx.out.k);
    }

  private:
    /// Filter-driven plan for query terms [b, e)? "auto": when the modelled cost of scoring
    /// only the passing documents (filtered_query::costs: per term the cheaper of walking its
    /// list and probing it once per passing document) times kFilterPlanBase +
    /// kFilterPlanSlope * (passing fraction) is below the query's posting total.
    bool filter_driven(uint64_t b, uint64_t e) {
        if (m_ctx.filter_plan == bm25_filter_plan::postings) return false;
        if (m_ctx.filter_plan == bm25_filter_plan::passing) return true;
        const auto [cost, total] = m_filtered.costs(b, e);
        const double fraction = m_ctx.data.n_docs ? static_cast<double>(m_ctx.pass_count()) /
                                                        static_cast<double>(m_ctx.data.n_docs) : 1.0;
        return cost * (kFilterPlanBase + kFilterPlanSlope * fraction) < static_cast<double>(total);
    }

    bm25_query m_ctx;
    exhaustive_query m_exhaustive;
    maxscore_query m_maxscore;
    block_max_query m_block_max;
    filtered_query m_filtered;
    // "auto": exhaustive up to this many postings per query; with computed
    // (not precomputed) contributions the crossover is lower.
    uint64_t m_auto_limit = m_ctx.imp != nullptr ? kAutoExhaustivePostings : kAutoExhaustivePostings / 4;
};

size_t query_chunk(size_t nq, int n_threads) {
    const size_t t = resolve_threads(n_threads, nq);
    return std::max<size_t>(1, std::min<size_t>(16, nq / (32 * t)));
}


}  // namespace

bm25_scatter bm25_scatter_for_cpu() {
    static const bm25_scatter best = [] {
#if defined(RETRIEVER_AVX512_SCATTER)
        if (kHaveAvx512 && kIntel) return bm25_scatter::avx512;
        if (kHaveAvx2) return bm25_scatter::avx2;
#endif
        return bm25_scatter::scalar;
    }();
    return best;
}

bm25_filter_plan parse_bm25_filter_plan(const std::string& name) {
    if (name == "auto") return bm25_filter_plan::automatic;
    if (name == "postings") return bm25_filter_plan::postings;
    if (name == "passing") return bm25_filter_plan::passing;
    fail("filter_plan must be one of 'auto', 'postings', 'passing'; got '" + name + "'");
}

bm25_scatter parse_bm25_scatter(const std::string& name) {
    bool supported = true;
    bm25_scatter impl;
    if (name == "auto") {
        impl = bm25_scatter::automatic;
    } else if (name == "scalar") {
        impl = bm25_scatter::scalar;
    } else if (name == "avx2" || name == "avx512") {
        impl = name == "avx2" ? bm25_scatter::avx2 : bm25_scatter::avx512;
#if defined(RETRIEVER_AVX512_SCATTER)
        supported = name == "avx2" ? kHaveAvx2 : kHaveAvx512;
#else
        supported = false;
#endif
    } else {
        fail("impl must be one of 'auto', 'scalar', 'avx2', 'avx512'; got '" + name + "'");
    }
    if (!supported) fail("impl '" + name + "' is not supported on this CPU");
    return impl;
}

void bm25_topk(const bm25_view& data, const bm25_bounds_view* bounds, const query_batch_view& queries,
               const bm25_search_params& params, const topk_out& out) {
    const bm25_algorithm algorithm = params.algorithm;
    const int n_threads = params.n_threads;
    const bm25_scatter scatter =
        params.scatter == bm25_scatter::automatic ? bm25_scatter_for_cpu() : params.scatter;
    if (algorithm != bm25_algorithm::exhaustive && bounds == nullptr) {
        fail("term_ub, block_offsets and block_ub are required for pruning algorithms");
    }
    // min(doc_norm) gives every posting a bound from its tf alone,
    // tf / (tf + norm_min), checked before doc_norm[d] is read. Worth its
    // O(n_docs) pass only for batches; results never depend on it.
    float norm_min = -1.0f;
    if (algorithm != bm25_algorithm::exhaustive && data.impacts == nullptr && data.n_docs > 0 &&
        queries.nq * 4096 >= data.n_docs) {
        float mn = std::numeric_limits<float>::infinity();
        bool ok = true;
        for (size_t d = 0; d < data.n_docs; ++d) {
            const float v = data.doc_norm[d];
            ok &= (v >= 0.0f);  // false for NaN too
            mn = std::min(mn, v);
        }
        if (ok && std::isfinite(mn)) norm_min = mn;
    }
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return bm25_worker(data, bounds, queries, params.allow, algorithm, out, norm_min, scatter, params.filter_plan);
    });
}

void bm25_topk_text(const query_texts_view& texts, const bm25_view& data, const bm25_search_params& params,
                    const topk_out& out, uint8_t* status,
                    const std::function<void(const query_batch_view&)>& check) {
    const size_t nq = texts.nq;
    try {
        check_query_texts(texts.text_len, texts.offsets, nq, texts.table);
    } catch (const std::invalid_argument& e) {
        fail(std::string("text ") + e.what());  // "text offsets[...]" (the postings have theirs)
    }
    // One per thread: analyses a query into its own buffers, checks them and
    // scores them at once (the query's terms are still in cache).
    struct fused_worker {
        fused_worker(const query_texts_view& t, const bm25_view& data, const uint8_t* allow, bm25_scatter scatter,
                     bm25_filter_plan plan, const topk_out& out, uint8_t* status, const std::function<void(const query_batch_view&)>& check)
            : analyzer(t.text, t.offsets, t.table, t.chars, t.idf, t.n_idf),
              view(std::make_unique<query_batch_view>()),
              scorer(data, nullptr, *view, allow, bm25_algorithm::exhaustive, out, -1.0f, scatter, plan),
              status(status), check(check) {}

        void operator()(size_t q) {
            const bool ok = analyzer.analyse(q, terms, weights);
            status[q] = ok ? 0 : 1;
            offsets[1] = terms.size();
            view->q_offsets = offsets;
            view->nq = 1;
            view->q_terms = terms.data();
            view->q_weights = weights.data();
            view->m = terms.size();
            check(*view);
            scorer.run(q, 0, view->m);
        }

        query_analyzer analyzer;
        std::vector<uint32_t> terms;
        std::vector<float> weights;
        uint64_t offsets[2] = {0, 0};
        std::unique_ptr<query_batch_view> view;  // scorer reads it by reference: a stable address
        bm25_worker scorer;
        uint8_t* status;
        const std::function<void(const query_batch_view&)>& check;
    };
    const bm25_scatter scatter =
        params.scatter == bm25_scatter::automatic ? bm25_scatter_for_cpu() : params.scatter;
    parallel_for_items(nq, params.n_threads, query_chunk(nq, params.n_threads), [&]() {
        return fused_worker(texts, data, params.allow, scatter, params.filter_plan, out, status, check);
    });
}

}  // namespace retriever

#include "bm25_topk_shards.hpp"  // bm25_topk_shards: uses bm25_worker above
