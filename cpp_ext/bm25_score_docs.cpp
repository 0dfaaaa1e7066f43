// BM25 scores of given documents (full-score fusion): see bm25_score_docs in
// postings_topk.hpp.
//
// For each query, its candidates are visited in increasing doc id order (a
// sorted permutation) and every query term's cursor gallops forward to each
// candidate (posting_cursor::seek), term by term in query order. A candidate's
// score is therefore the float32 sum, from +0.0f in query-term order, of
// weight * tf part over the terms whose list holds it: exactly the expression
// and order of exhaustive term-at-a-time scoring (bm25_topk), so the scores are
// bit-identical to the ones bm25_topk reports.

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel.hpp"
#include "posting_cursor.hpp"
#include "postings_topk.hpp"

namespace retriever {

void check_candidates(const candidates_view& c, size_t nq, size_t n_docs) {
    if (c.n_offsets != nq + 1) {
        throw std::invalid_argument("len(cand_offsets) = " + std::to_string(c.n_offsets) +
                                    " must equal len(q_offsets) = " + std::to_string(nq + 1));
    }
    if (c.offsets[0] != 0) {
        throw std::invalid_argument("cand_offsets[0] must be 0, got " + std::to_string(c.offsets[0]));
    }
    for (size_t i = 0; i < nq; ++i) {
        if (c.offsets[i + 1] < c.offsets[i]) {
            throw std::invalid_argument("cand_offsets must be non-decreasing: cand_offsets[" + std::to_string(i + 1) +
                                        "] = " + std::to_string(c.offsets[i + 1]) + " < cand_offsets[" +
                                        std::to_string(i) + "] = " + std::to_string(c.offsets[i]));
        }
    }
    if (static_cast<uint64_t>(c.offsets[nq]) != c.n_docs) {
        throw std::invalid_argument("cand_offsets[-1] = " + std::to_string(c.offsets[nq]) +
                                    " must equal len(cand_docs) = " + std::to_string(c.n_docs));
    }
    for (size_t j = 0; j < c.n_docs; ++j) {
        const int64_t d = c.docs[j];
        if (d < 0 || static_cast<uint64_t>(d) >= n_docs) {
            throw std::invalid_argument("cand_docs[" + std::to_string(j) + "] = " + std::to_string(d) +
                                        " is not a document of this shard: n_docs = " + std::to_string(n_docs));
        }
    }
}

namespace {

/// One per thread: scores the candidates of a query (scratch reused across queries).
class score_docs_worker {
  public:
    score_docs_worker(const bm25_view& data, const query_batch_view& q, const candidates_view& cand, float* scores)
        : m_data(data), m_q(q), m_cand(cand), m_scores(scores) {}

    void operator()(size_t qi) {
        const uint64_t c0 = static_cast<uint64_t>(m_cand.offsets[qi]);
        const uint64_t c1 = static_cast<uint64_t>(m_cand.offsets[qi + 1]);
        float* out = m_scores + c0;
        std::fill(out, out + (c1 - c0), 0.0f);
        if (c1 == c0) return;
        // (doc, position) in increasing doc order; repeated docs keep their order
        m_order.resize(c1 - c0);
        for (uint64_t j = c0; j < c1; ++j) {
            m_order[j - c0] = {static_cast<uint32_t>(m_cand.docs[j]), j - c0};
        }
        std::sort(m_order.begin(), m_order.end());
        const float* imp = m_data.impacts;
        for (uint64_t i = m_q.q_offsets[qi]; i < m_q.q_offsets[qi + 1]; ++i) {
            const uint32_t t = m_q.q_terms[i];
            const float w = m_q.q_weights[i];
            posting_cursor c;
            c.docs = m_data.csr.doc_ids;
            c.beg = c.pos = m_data.csr.offsets[t];
            c.end = m_data.csr.offsets[t + 1];
            c.refresh();
            for (const auto& [d, j] : m_order) {
                c.seek(d);
                if (c.doc == kEndDoc) break;
                if (c.doc != d) continue;
                // the exhaustive kernel's expression: acc += w * tf part (d < n_docs: checked)
                out[j] += imp != nullptr ? w * imp[c.pos] : bm25_contribution(w, m_data.tfs[c.pos], m_data.doc_norm[d]);
            }
        }
    }

  private:
    const bm25_view& m_data;
    const query_batch_view& m_q;
    const candidates_view& m_cand;
    float* m_scores;
    std::vector<std::pair<uint32_t, uint64_t>> m_order;
};

}  // namespace

void bm25_score_docs(const bm25_view& data, const query_batch_view& queries, const candidates_view& cand,
                     int n_threads, float* scores) {
    const size_t t = resolve_threads(n_threads, queries.nq);
    const size_t chunk = std::max<size_t>(1, std::min<size_t>(16, queries.nq / (32 * t)));
    parallel_for_items(queries.nq, n_threads, chunk,
                       [&]() { return score_docs_worker(data, queries, cand, scores); });
}

}  // namespace retriever
