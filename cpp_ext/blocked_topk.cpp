// Learned-sparse top-k kernels (see blocked_topk.hpp).
#include "blocked_topk.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

void check_offsets(const uint64_t* off, size_t n, size_t total, const char* name) {
    if (off[0] != 0) bad(std::string(name) + "[0] = " + std::to_string(off[0]) + " must be 0");
    for (size_t i = 0; i < n; ++i) {
        if (off[i + 1] < off[i]) {
            bad(std::string(name) + " must be non-decreasing; " + name + "[" + std::to_string(i + 1) +
                "] = " + std::to_string(off[i + 1]) + " < " + std::to_string(off[i]));
        }
    }
    if (off[n] != total) {
        bad(std::string(name) + "[-1] = " + std::to_string(off[n]) + " must equal " +
            std::to_string(total));
    }
}

constexpr size_t kChunk = 4;

void write_row(topk_heap& heap, const topk_out& out, size_t q) {
    out.n_found[q] = heap.finalize(out.ids + q * out.k, out.scores + q * out.k);
}

}  // namespace

void check_forward(const forward_view& f, size_t n_terms) {
    check_offsets(f.offsets, f.n_docs, f.nnz, "fwd_offsets");
    for (size_t i = 0; i < f.nnz; ++i) {
        if (f.terms[i] >= n_terms) {
            bad("fwd_terms[" + std::to_string(i) + "] = " + std::to_string(f.terms[i]) +
                " must be < n_terms = " + std::to_string(n_terms));
        }
    }
    if (!(std::isfinite(f.scale) && f.scale > 0)) {
        bad("scale must be finite and > 0, got " + std::to_string(f.scale));
    }
}

void check_blocks(const blocks_view& b, size_t n_docs, size_t vocab) {
    check_offsets(b.term_blocks, b.n_terms, b.n_blocks, "term_blocks");
    check_offsets(b.block_docs_offsets, b.n_blocks, b.n_block_docs, "block_docs_offsets");
    check_offsets(b.summary_offsets, b.n_blocks, b.n_summary, "summary_offsets");
    for (size_t i = 0; i < b.n_block_docs; ++i) {
        if (b.block_docs[i] >= n_docs) {
            bad("block_docs[" + std::to_string(i) + "] = " + std::to_string(b.block_docs[i]) +
                " must be < n_docs = " + std::to_string(n_docs));
        }
    }
    for (size_t i = 0; i < b.n_summary; ++i) {
        if (b.summary_terms[i] >= vocab) {
            bad("summary_terms[" + std::to_string(i) + "] = " + std::to_string(b.summary_terms[i]) +
                " must be < n_terms = " + std::to_string(vocab));
        }
    }
    for (size_t i = 0; i < b.n_blocks; ++i) {
        if (!(std::isfinite(b.summary_scale[i]) && b.summary_scale[i] >= 0)) {
            bad("summary_scale[" + std::to_string(i) + "] must be finite and >= 0");
        }
    }
}

void check_sparse_queries(const query_batch_view& q, size_t n_terms) {
    check_query_batch(q, n_terms);  // offsets, term range, finite weights
    std::vector<uint8_t> seen(n_terms, 0);
    for (size_t i = 0; i < q.nq; ++i) {
        const uint64_t lo = q.q_offsets[i], hi = q.q_offsets[i + 1];
        for (uint64_t j = lo; j < hi; ++j) {
            if (q.q_weights[j] < 0) {
                bad("q_weights[" + std::to_string(j) + "] = " + std::to_string(q.q_weights[j]) +
                    " (query " + std::to_string(i) + ") must be >= 0");
            }
            if (seen[q.q_terms[j]]) {
                bad("q_terms[" + std::to_string(j) + "] = " + std::to_string(q.q_terms[j]) +
                    " repeats a term of query " + std::to_string(i));
            }
            seen[q.q_terms[j]] = 1;
        }
        for (uint64_t j = lo; j < hi; ++j) seen[q.q_terms[j]] = 0;
    }
}

void sparse_exact_topk(const u16_postings_view& p, const query_batch_view& queries, int n_threads,
                       const topk_out& out) {
    const size_t n_docs = p.n_docs;
    parallel_for_items(queries.nq, n_threads, kChunk, [&]() {
        return [&, acc = std::vector<float>(n_docs, 0.0f), heap = topk_heap()](size_t q) mutable {
            heap.reset(out.k);
            const uint64_t lo = queries.q_offsets[q], hi = queries.q_offsets[q + 1];
            float* a = acc.data();
            for (uint64_t j = lo; j < hi; ++j) {
                const uint32_t t = queries.q_terms[j];
                const float w = queries.q_weights[j];
                const uint64_t b = p.csr.offsets[t], e = p.csr.offsets[t + 1];
                const uint32_t* ids = p.csr.doc_ids;
                const uint16_t* imp = p.impacts;
                for (uint64_t i = b; i < e; ++i) a[ids[i]] += w * static_cast<float>(imp[i]);
            }
            // Scan in doc order: an equal score arriving later never displaces (larger id).
            const float scale = p.scale;
            float thr = 0.0f;  // found = score > 0
            for (size_t d = 0; d < n_docs; ++d) {
                const float v = a[d];
                if (v > 0.0f) {
                    a[d] = 0.0f;
                    const float s = v * scale;
                    if (s > thr) {
                        heap.push(s, static_cast<uint32_t>(d));
                        if (heap.full()) thr = std::max(thr, heap.threshold());
                    }
                }
            }
            write_row(heap, out, q);
        };
    });
}

void sparse_seismic_topk(const forward_view& f, const blocks_view& bl, const query_batch_view& queries,
                         size_t query_cut, float heap_factor, int n_threads, const topk_out& out) {
    const size_t vocab = bl.n_terms;
    parallel_for_items(queries.nq, n_threads, kChunk, [&]() {
        struct state {
            std::vector<float> qd;
            std::vector<uint32_t> stamp;
            uint32_t gen = 0;
            std::vector<uint64_t> order;
            topk_heap heap;
        };
        auto st = std::make_shared<state>();
        st->qd.assign(vocab, 0.0f);
        st->stamp.assign(f.n_docs, 0);
        return [&, st](size_t q) {
            state& s = *st;
            if (++s.gen == 0) {  // wrapped: reset stamps
                std::fill(s.stamp.begin(), s.stamp.end(), 0);
                s.gen = 1;
            }
            const uint32_t gen = s.gen;
            s.heap.reset(out.k);
            const uint64_t lo = queries.q_offsets[q], hi = queries.q_offsets[q + 1];
            float* qd = s.qd.data();
            s.order.resize(hi - lo);
            for (uint64_t j = lo; j < hi; ++j) {
                qd[queries.q_terms[j]] = queries.q_weights[j];
                s.order[j - lo] = j;
            }
            // Largest weights first; ties by term id (deterministic).
            std::sort(s.order.begin(), s.order.end(), [&](uint64_t x, uint64_t y) {
                const float wx = queries.q_weights[x], wy = queries.q_weights[y];
                return wx > wy || (wx == wy && queries.q_terms[x] < queries.q_terms[y]);
            });
            const size_t n_cut = std::min<size_t>(query_cut, s.order.size());
            const float fscale = f.scale;
            for (size_t oi = 0; oi < n_cut; ++oi) {
                const uint32_t t = queries.q_terms[s.order[oi]];
                if (queries.q_weights[s.order[oi]] <= 0.0f) break;
                for (uint64_t b = bl.term_blocks[t]; b < bl.term_blocks[t + 1]; ++b) {
                    if (s.heap.full()) {
                        float sum = 0.0f;
                        for (uint64_t i = bl.summary_offsets[b]; i < bl.summary_offsets[b + 1]; ++i) {
                            sum += qd[bl.summary_terms[i]] * static_cast<float>(bl.summary_values[i]);
                        }
                        if (sum * bl.summary_scale[b] < heap_factor * s.heap.threshold()) continue;
                    }
                    for (uint64_t i = bl.block_docs_offsets[b]; i < bl.block_docs_offsets[b + 1]; ++i) {
                        const uint32_t d = bl.block_docs[i];
                        if (s.stamp[d] == gen) continue;
                        s.stamp[d] = gen;
                        float acc = 0.0f;
                        for (uint64_t p = f.offsets[d]; p < f.offsets[d + 1]; ++p) {
                            acc += qd[f.terms[p]] * static_cast<float>(f.values[p]);
                        }
                        const float sc = acc * fscale;
                        if (sc > 0.0f) s.heap.push(sc, d);
                    }
                }
            }
            for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = 0.0f;
            write_row(s.heap, out, q);
        };
    });
}

}  // namespace retriever
