// Query-time top-k over CSR postings: BM25 (exhaustive, MaxScore, block-max
// WAND, block-max MaxScore) and learned-sparse impacts (exhaustive).
//
// Plain C++ over raw pointers and sizes; no pybind11 here (the bind_*.cpp files
// are the binding layer). All functions throw std::invalid_argument on bad input,
// with a message naming the argument and the offending value.
//
// Split after PISA: posting access (posting_cursor.hpp), the formula
// (bm25_tf_part; bm25_query.hpp turns a posting into a contribution), one file
// per algorithm (bm25_exhaustive.hpp, bm25_maxscore.hpp, bm25_block_max.hpp,
// dispatched per query in bm25_topk.cpp), the pruning bounds (bound_check.hpp at
// query time, bm25_bounds.cpp at index open) and the top-k collector (topk.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "query_terms.hpp"

namespace retriever {

/// Sentinel doc id of an exhausted cursor; valid doc ids are < kMaxDocs.
constexpr uint32_t kEndDoc = 0xFFFFFFFFu;
/// Largest supported number of documents per shard.
constexpr uint64_t kMaxDocs = 0xFFFFFFFFull;

/// The BM25 term-frequency part, tf / (tf + doc_norm), in float32.
/// EVERY code path (all algorithms and the upper bounds) uses exactly this
/// expression, which together with -ffp-contract=off makes scores bit-identical
/// across algorithms.
inline float bm25_tf_part(uint32_t tf, float doc_norm) {
    const float f = static_cast<float>(tf);
    return f / (f + doc_norm);
}

/// One query term's contribution to a document score.
inline float bm25_contribution(float weight, uint32_t tf, float doc_norm) {
    return weight * bm25_tf_part(tf, doc_norm);
}

/// CSR postings of one shard: term t owns doc_ids[offsets[t] : offsets[t+1]],
/// strictly increasing.
struct csr_view {
    const uint64_t* offsets = nullptr;  // n_terms + 1
    size_t n_terms = 0;
    const uint32_t* doc_ids = nullptr;  // nnz
    size_t nnz = 0;
};

struct bm25_view {
    csr_view csr;
    const uint32_t* tfs = nullptr;      // nnz, parallel to csr.doc_ids
    const float* doc_norm = nullptr;    // n_docs
    size_t n_docs = 0;
    /// Optional precomputed impacts (nnz, parallel to csr.doc_ids):
    /// impacts[p] == bm25_tf_part(tfs[p], doc_norm[doc_ids[p]]) bit for bit
    /// (from bm25_impacts with the same doc_norm). When set, the kernels read
    /// a posting's contribution as weight * impacts[p] (one load, no division,
    /// no random doc_norm read); results are identical either way.
    const float* impacts = nullptr;
    /// Optional dense impact rows of the longest lists (requires impacts):
    /// impact_row_slot[t] (n_terms) = the row of term t, or -1 when t has
    /// none; row r is impact_rows[r * n_docs .. (r + 1) * n_docs), holding
    /// impacts[p] at doc_ids[p] for each posting p of t and +0.0f elsewhere.
    /// Exhaustive scoring adds w * row to the accumulator with vector
    /// instructions instead of scattering t's postings one by one (each
    /// document gets the same fl(acc + fl(w * impact)); the others
    /// fl(acc + w * 0) == acc, the weights being finite), so results are
    /// identical. The caller checks every query term's slot is -1 or < n_impact_rows.
    const float* impact_rows = nullptr;
    const int32_t* impact_row_slot = nullptr;
    size_t n_impact_rows = 0;
};

/// Per-term and per-block upper bounds of bm25_tf_part (see bm25_upper_bounds).
struct bm25_bounds_view {
    const float* term_ub = nullptr;        // n_terms
    const uint64_t* block_offsets = nullptr;  // n_terms + 1; term t's blocks start at block_offsets[t]
    const float* block_ub = nullptr;       // n_blocks
    size_t n_blocks = 0;
    uint32_t block_size = 128;
    /// Optional (n_terms): term_kth[t] = the k-th largest bm25_tf_part over
    /// t's postings for k = the call's k (topk_out::k), or -inf when t has
    /// fewer than k postings; from bm25_term_kth with the same doc_norm and
    /// depth == k. Gives a safe initial threshold (see bm25_topk).
    const float* term_kth = nullptr;
    /// Optional membership bitmaps of the long lists (from bm25_dense_bitmaps):
    /// dense_slot[t] (n_terms) = row of term t, or -1 when t has none; row r
    /// is dense_bits[r * dense_words ...] (bit d set iff d is in t's list) and
    /// dense_rank[r * dense_words + w] = the number of t's postings with doc id
    /// < 64 * w. MaxScore then probes a non-essential list for a candidate
    /// with one bit test and a popcount instead of a seek; results are
    /// identical.
    const int32_t* dense_slot = nullptr;
    const uint64_t* dense_bits = nullptr;
    const uint32_t* dense_rank = nullptr;
    size_t dense_words = 0;  // ceil(n_docs / 64)
    size_t dense_rows = 0;
};

/// A ragged query batch: query q is q_terms/q_weights[q_offsets[q] : q_offsets[q+1]].
struct query_batch_view {
    const uint64_t* q_offsets = nullptr;  // nq + 1
    size_t nq = 0;
    const uint32_t* q_terms = nullptr;    // m
    const float* q_weights = nullptr;     // m
    size_t m = 0;
};

/// Caller-allocated outputs: ids (nq, k), scores (nq, k), n_found (nq).
struct topk_out {
    int64_t* ids = nullptr;
    float* scores = nullptr;
    int32_t* n_found = nullptr;
    size_t k = 0;
};

/// automatic: per query, exhaustive when the query's postings total at most
/// kAutoExhaustivePostings or the collection is small (at most 65,536
/// documents), else maxscore (same results either way).
enum class bm25_algorithm { exhaustive, maxscore, block_max_wand, block_max_maxscore, automatic };

/// Collections of at most this many documents are always scored exhaustively
/// by "auto" (measured: the dense scatter beats any pruning there).
constexpr size_t kAutoExhaustiveDocs = size_t{1} << 16;

/// Query posting total up to which "auto" scores exhaustively (measured
/// crossover against MaxScore, see benchmarks/bench_bm25.py).
constexpr uint64_t kAutoExhaustivePostings = 16384;

/// Parses "exhaustive" | "maxscore" | "bmw" | "bmm" | "auto"; throws otherwise.
bm25_algorithm parse_bm25_algorithm(const std::string& name);

// ---- validation (throw std::invalid_argument) -------------------------------

/// O(nnz) structural check, meant to run once when an index is opened:
/// offsets[0] == 0, offsets non-decreasing, offsets[n_terms] == nnz, doc ids
/// strictly increasing within each term and < n_docs.
void check_csr(const csr_view& csr, uint64_t n_docs);

/// O(nq + m) per-call check: q_offsets[0] == 0, non-decreasing, last == m;
/// every q_terms value < n_terms; every q_weights value finite.
void check_query_batch(const query_batch_view& q, size_t n_terms);

/// O(m) per-call check of the bounds of the terms a batch uses: term_ub finite
/// and >= 0, block ranges consistent with the posting lengths and in range
/// (block checks skipped when b.block_offsets is null).
void check_bounds_for_queries(const csr_view& csr, const bm25_bounds_view& b,
                              const query_batch_view& q);

// ---- kernels -----------------------------------------------------------------

/// Fills block_offsets (n_terms + 1) for blocks of block_size postings and
/// returns the total number of blocks. O(n_terms).
uint64_t bm25_block_offsets(const csr_view& csr, uint32_t block_size, uint64_t* block_offsets);

/// term_ub[t] = max over t's postings of bm25_tf_part(tf, doc_norm[d]) (0 for
/// an empty list); block_ub[b] likewise over each block. block_offsets must
/// come from bm25_block_offsets with the same block_size. Parallel over terms.
/// Requires doc_norm finite and >= 0 and doc ids < n_docs (checked).
void bm25_upper_bounds(const bm25_view& data, uint32_t block_size,
                       const uint64_t* block_offsets, int n_threads, float* term_ub,
                       float* block_ub);

/// impacts[p] = bm25_tf_part(tfs[p], doc_norm[doc_ids[p]]) for every posting
/// (nnz floats). Requires doc ids < n_docs (checked). Parallel over terms.
void bm25_impacts(const bm25_view& data, int n_threads, float* impacts);

/// Membership bitmaps of the lists with at least min_df postings, for
/// bm25_bounds_view::dense_slot/dense_bits/dense_rank. slot (n_terms) is
/// filled with each term's row or -1 and the number of rows is returned;
/// with bits == nullptr only slot is filled (to size the rows). Otherwise bits
/// and rank hold rows * words entries, words = ceil(n_docs / 64). Throws
/// std::invalid_argument on a doc id >= n_docs.
size_t bm25_dense_bitmaps(const csr_view& csr, size_t n_docs, uint64_t min_df, int32_t* slot,
                          uint64_t* bits, uint32_t* rank, int n_threads);

/// Dense impact rows of the longest lists, for bm25_view::impact_rows /
/// impact_row_slot: the (at most max_rows) lists with the most postings
/// among those with at least min_df (equal lengths: smaller term id first)
/// get rows 0, 1, ... in term order. slot (n_terms) is filled with each
/// term's row or -1 and the number of rows is returned; with rows == nullptr
/// only slot is filled (to size the rows). Otherwise rows holds
/// n_rows * n_docs floats: impacts[p] at doc_ids[p] for each posting p of
/// the row's term (a list's doc ids are distinct), +0.0f elsewhere. Throws
/// std::invalid_argument on a doc id >= n_docs.
size_t bm25_impact_rows(const csr_view& csr, const float* impacts, size_t n_docs, uint64_t min_df,
                        size_t max_rows, int32_t* slot, float* rows, int n_threads);

/// out[i] = the depth-th largest bm25_tf_part(tf, doc_norm[d]) over the
/// postings of term terms[i] (from data.impacts when set; duplicates in a list
/// count separately), or -inf when the list has fewer than depth postings or
/// holds a negative or NaN value.
/// Blocks whose bound (bounds->block_ub, when bounds and its block data are
/// given) cannot beat the running depth-th value are skipped. Time O(postings
/// of the listed terms) at most, memory O(depth) per thread; parallel over
/// terms. Throws on depth == 0 or a term id >= n_terms.
void bm25_term_kth(const bm25_view& data, const bm25_bounds_view* bounds, const uint32_t* terms,
                   size_t n, size_t depth, int n_threads, float* out);

/// The scatter of exhaustive scoring with precomputed impacts (the dense path):
/// scalar (4 postings a step), AVX2 products with scalar stores, or AVX-512
/// gathers / scatters of 16 postings. All compute the same float32 sums in the
/// same order (bit-identical results); `automatic` is bm25_scatter_for_cpu().
enum class bm25_scatter : uint8_t { automatic, scalar, avx2, avx512 };

/// The scatter "auto" means on this CPU, read once per process from CPUID (a
/// function-local static; nothing can change it): AVX-512 on Intel CPUs that
/// have it (on AMD Zen 4 its scatters are microcoded and ran ~15% slower than
/// scalar stores), else AVX2, else scalar.
bm25_scatter bm25_scatter_for_cpu();

/// Parses "auto" | "scalar" | "avx2" | "avx512" (an explicit choice for tests
/// and benchmarks); throws std::invalid_argument naming the value for another
/// name or for an instruction set this CPU lacks.
bm25_scatter parse_bm25_scatter(const std::string& name);

/// Per-call settings of bm25_topk / bm25_topk_text (the search parameters of a
/// call, as FAISS's SearchParameters; the data and the bounds are views).
/// How a query with an allow filter is evaluated (bm25_filtered.hpp): automatic picks per
/// query by the cost model (filter-driven when scoring only the passing documents is
/// cheaper than walking the query's postings); postings: the algorithm's own walk over the
/// posting lists, the filter tested per candidate; passing: score only the passing
/// documents. Results are identical.
enum class bm25_filter_plan { automatic, postings, passing };

/// Parses "auto" | "postings" | "passing"; throws otherwise.
bm25_filter_plan parse_bm25_filter_plan(const std::string& name);

struct bm25_search_params {
    bm25_algorithm algorithm = bm25_algorithm::maxscore;
    /// Plan of filtered queries (ignored without allow).
    bm25_filter_plan filter_plan = bm25_filter_plan::automatic;
    /// n_docs bytes, nonzero = allowed; null = every document.
    const uint8_t* allow = nullptr;
    /// Worker threads; <= 0: std::thread::hardware_concurrency().
    int n_threads = 0;
    /// Scatter of the dense exhaustive path (automatic: bm25_scatter_for_cpu()).
    bm25_scatter scatter = bm25_scatter::automatic;
};

/// Exact BM25 top-k for a batch of queries. `bounds` may be null only for the
/// exhaustive algorithm.
/// With bounds->term_kth (and no allow filter, non-negative weights), the
/// pruning algorithms start from the safe threshold max over the query's
/// terms of weight * term_kth[t] (see bm25_query::single_term_threshold).
/// Precondition: doc ids strictly increasing within each list (check_csr);
/// an id >= n_docs throws, a repeated id gives unspecified (memory-safe)
/// scores.
void bm25_topk(const bm25_view& data, const bm25_bounds_view* bounds, const query_batch_view& queries,
               const bm25_search_params& params, const topk_out& out);

/// Query texts for bm25_topk_text: text i is text[offsets[i] : offsets[i+1]]
/// (UTF-8), analysed with the token table and character tables of
/// bm25_query_terms against idf (n_idf terms).
struct query_texts_view {
    const uint8_t* text = nullptr;
    size_t text_len = 0;
    const int64_t* offsets = nullptr;  // nq + 1
    size_t nq = 0;
    token_table_view table;
    char_tables_view chars;
    const float* idf = nullptr;
    size_t n_idf = 0;
};

/// bm25_topk with the exhaustive algorithm for query texts instead of
/// analysed queries: each thread analyses a query (query_analyzer over
/// texts), passes its one-query batch to `check` (which throws on a term or
/// weight the postings cannot take) and scores it into output row i, so
/// analysis runs in the same parallel pass as scoring. status[i] = 1 (and an
/// empty row) for a query the analyzer leaves to the caller (bm25_query_terms'
/// status 1), else 0. params.algorithm is ignored (exhaustive). Results equal
/// bm25_query_terms followed by bm25_topk. Throws as those do.
void bm25_topk_text(const query_texts_view& texts, const bm25_view& data, const bm25_search_params& params,
                    const topk_out& out, uint8_t* status,
                    const std::function<void(const query_batch_view&)>& check);

/// Candidate documents of a query batch: query i's are
/// docs[offsets[i] : offsets[i+1]] (shard-local ids, any order, repeats allowed).
struct candidates_view {
    const int64_t* offsets = nullptr;  // n_offsets == nq + 1
    size_t n_offsets = 0;
    const int64_t* docs = nullptr;     // n_docs entries
    size_t n_docs = 0;
};

/// O(nq + candidates) per-call check: n_offsets == nq + 1, offsets[0] == 0,
/// non-decreasing, offsets[nq] == c.n_docs, every doc in [0, n_docs).
void check_candidates(const candidates_view& c, size_t nq, size_t n_docs);

/// BM25 scores of given documents: scores[j] for j in [cand.offsets[i],
/// cand.offsets[i+1]) is the score of document cand.docs[j] for query i, the
/// float32 sum from +0.0f, in query-term order, of w * tf part over the terms
/// whose list holds it (0.0f when none does): the exhaustive algorithm's
/// arithmetic, so bit-identical to the score bm25_topk reports for it. Reads
/// data.impacts when set (impact rows are not needed). Each term's cursor
/// gallops through the query's candidates in doc order: O(m * c log(len / c))
/// per query. Precondition: check_query_batch and check_candidates passed;
/// lists strictly increasing (check_csr), else scores are unspecified (never
/// a memory error). Parallel over queries.
void bm25_score_docs(const bm25_view& data, const query_batch_view& queries, const candidates_view& cand,
                     int n_threads, float* scores);

/// Exact learned-sparse top-k with float32 impacts:
/// score = sum over query terms (query order) of q_weight * impact, in float32.
/// The number of documents is not needed: the accumulator grows to the largest
/// doc id seen. If `allow` is given (allow_len bytes), a doc id >= allow_len
/// throws.
void impact_topk_f32(const csr_view& csr, const float* impacts,
                     const query_batch_view& queries, const uint8_t* allow, size_t allow_len,
                     int n_threads, const topk_out& out);

}  // namespace retriever
