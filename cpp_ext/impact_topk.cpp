// Exact learned-sparse (float32 impact) top-k, term-at-a-time over a dense accumulator:
// see impact_topk_f32 in postings_topk.hpp.

#include <algorithm>
#include <stdexcept>
#include <string>

#include "accumulator.hpp"
#include "parallel.hpp"
#include "postings_topk.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

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
    return std::max<size_t>(1, std::min<size_t>(16, nq / (32 * t)));
}


}  // namespace

void impact_topk_f32(const csr_view& csr, const float* impacts, const query_batch_view& queries,
                     const uint8_t* allow, size_t allow_len, int n_threads, const topk_out& out) {
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return impact_worker<float, decode_f32>(csr, impacts, decode_f32{}, queries, allow,
                                                allow_len, out);
    });
}

}  // namespace retriever
