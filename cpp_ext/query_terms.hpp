// Query analysis for BM25 with a read-only token table: UTF-8 query texts ->
// a ragged batch of (term id, weight) per query, in parallel without the GIL.
//
// It computes exactly what the build-time numba scanner of
// index/analyzer_kernels.py computes (str.casefold from tables, the
// possessive strip, the token scanner, the token -> entry hash table with the
// same keys and probing) followed by index.analyzer_kernels.query_term_weights
// (distinct terms in first-occurrence order, weight = float32(count * idf)).
// The table is only read: a query holding a token the table lacks, or a code
// point above U+FFFF, is reported back (status 1) and analysed by the caller.
//
// Plain C++ over raw pointers and sizes; bind_bm25.cpp holds the binding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace retriever {

/// The persistent token table of index.analyzer_kernels.TokenTable.
struct token_table_view {
    const int64_t* slots = nullptr;  // 2 * cap (cap a power of two): (key, entry) pairs, key 0 = empty
    size_t n_slots = 0;
    const int64_t* entry_off = nullptr;  // entry e's bytes: blob[entry_off[e] : entry_off[e+1] - 1]
    size_t n_off = 0;
    const uint8_t* blob = nullptr;
    size_t blob_len = 0;
    const int64_t* value = nullptr;  // term id of entry e (-1: no term)
    size_t n_entries = 0;            // entries 0 .. n_entries - 1 exist
};

/// Character classes and case folding of the Basic Multilingual Plane
/// (index.analyzer_kernels.char_tables and _ascii_fold).
struct char_tables_view {
    const uint8_t* flags = nullptr;     // 65536: bit 1 word, bit 2 digit, bit 4 single-character token
    const uint8_t* fold_n = nullptr;    // 65536: length of the code point's casefold (1..3)
    const uint32_t* fold_cp = nullptr;  // 65536 * 3: its code points
    const uint8_t* ascii_fold = nullptr;  // 128: each ASCII byte's fold
    bool lowercase = true;
};

/// The argument checks of bm25_query_terms (offsets within data and
/// non-decreasing, a well-formed table); throws std::invalid_argument.
void check_query_texts(size_t data_len, const int64_t* offsets, size_t n, const token_table_view& table);

/// bm25_query_terms one text at a time, for a caller that consumes each
/// query's terms right away (bm25_topk_text): one per thread, arguments
/// checked by check_query_texts first.
class query_analyzer {
  public:
    query_analyzer(const uint8_t* data, const int64_t* offsets, const token_table_view& table,
                   const char_tables_view& chars, const float* idf, size_t n_terms);
    ~query_analyzer();
    query_analyzer(query_analyzer&&) noexcept;
    query_analyzer(const query_analyzer&) = delete;
    query_analyzer& operator=(const query_analyzer&) = delete;

    /// Text i's distinct known terms (first-occurrence order) and their
    /// weights float32(double(occurrences) * double(idf[t])) replace terms /
    /// weights; false (both empty) when the text needs the caller (status 1
    /// of bm25_query_terms).
    bool analyse(size_t i, std::vector<uint32_t>& terms, std::vector<float>& weights);

  private:
    struct impl;
    std::unique_ptr<impl> m_impl;
};

/// Analyses texts[i] = data[offsets[i] : offsets[i+1]] (valid UTF-8) for
/// i < n. Query i's distinct known terms (first-occurrence order) land in
/// q_terms / q_weights[q_offsets[i] : q_offsets[i+1]], weight =
/// float32(double(occurrences) * double(idf[t])); status[i] = 0, or 1 when
/// the query needs the caller (a token not in the table, or a code point
/// above U+FFFF; it then has no terms here). Outputs: q_offsets (n + 1),
/// status (n); q_terms / q_weights are returned through the vectors (their
/// length is q_offsets[n]). Throws std::invalid_argument on offsets outside
/// data or decreasing, a malformed table (an entry or offset out of range) or
/// a term id >= n_terms.
void bm25_query_terms(const uint8_t* data, size_t data_len, const int64_t* offsets, size_t n,
                      const token_table_view& table, const char_tables_view& chars, const float* idf,
                      size_t n_terms, int n_threads, uint64_t* q_offsets, uint8_t* status,
                      std::vector<uint32_t>& q_terms, std::vector<float>& q_weights);

}  // namespace retriever
