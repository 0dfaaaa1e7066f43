// BM25 top-k over several shards of one index in one call, with one top-k collector per
// query carried from shard to shard (bm25_topk_shards; defined in bm25_topk_shards.hpp,
// which bm25_topk.cpp includes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "postings_topk.hpp"

namespace retriever {

/// One shard of a bm25_topk_shards call: its postings and bounds (as bm25_topk takes
/// them), its filter, the global ordinal of its local document 0, and the call's query
/// batch restricted to the shard's vocabulary, in the shard's term ids (terms it does not
/// hold removed, every query keeping its row).
///
/// A shard's term ids are the index's own (its lists are those of terms 0 .. n_terms-1), or,
/// with a term map (`terms`: the index's term id of each of its lists, strictly ascending,
/// data.csr.n_terms of them), positions in that map: a segment of a living index lists only
/// the terms it holds, so its per-term arrays (offsets, bounds, bitmap slots) are as long as
/// its own vocabulary, not the index's.
struct bm25_shard_view {
    bm25_view data;
    bm25_bounds_view bounds;
    bool has_bounds = false;  // false: exhaustive only
    const uint8_t* allow = nullptr;  // n_docs bytes, nonzero = allowed; null = every document
    uint64_t base = 0;
    const uint32_t* terms = nullptr;  // the term map (null: the shard's term ids are the index's)
    query_batch_view queries;
    /// per position of the call's batch: the shard's id of that query term, or kNoShardTerm
    /// (null: the batch's ids, where below data.csr.n_terms)
    const uint32_t* q_local = nullptr;
};

/// "Not a term of this shard".
constexpr uint32_t kNoShardTerm = 0xFFFFFFFFu;

/// The shard's id of the index's term t (kNoShardTerm when the shard has no list for it):
/// t itself below its vocabulary without a term map, else t's position in the map (binary
/// search, O(log n_terms)).
inline uint32_t shard_term(const bm25_shard_view& s, uint32_t t) {
    const size_t n = s.data.csr.n_terms;
    if (s.terms == nullptr) return t < n ? t : kNoShardTerm;
    const uint32_t* at = std::lower_bound(s.terms, s.terms + n, t);
    return (at != s.terms + n && *at == t) ? static_cast<uint32_t>(at - s.terms) : kNoShardTerm;
}

/// shard_term for position j of the call's batch (q_terms[j] = t), from q_local when set.
inline uint32_t shard_term_at(const bm25_shard_view& s, uint64_t j, uint32_t t) {
    return s.q_local != nullptr ? s.q_local[j] : shard_term(s, t);
}

/// Exact BM25 top-k over the union of `shards` for the batch `queries` (term ids of the
/// index's vocabulary; each shard's view holds the same batch restricted to its own
/// vocabulary): equal, ids and scores bit for bit, to bm25_topk on each shard (ids + base)
/// merged by score descending, then global ordinal ascending. Each query runs through the
/// shards in order on one thread, one bm25_worker rebound to each shard in turn (its scratch
/// memory allocated once per call), with one top-k collector of global ordinals. A pruning
/// query first gets one threshold for the whole index, as one shard holding every document
/// would: max over its terms of fl(w * union_kth[t]) (when union_kth is given, no shard has
/// an allow filter and no weight is negative; union_kth[t] = the k-th largest tf part of t's
/// postings over all shards, from bm25_term_kth_shards with depth = k, -inf / NaN = none),
/// raised by priming from the query's short high-bound lists over all shards; the shards
/// then skip their own priming. Each shard's pruning starts from the larger of that and the
/// k-th score collected so far (Lucene's shared minimum competitive score). Exact because a
/// document scoring below either cannot enter, and one scoring equal to it is still offered
/// (pruning discards only bounds strictly below it) and ranked by the collector (score, then
/// smaller ordinal; shards are in ordinal order).
/// Preconditions (checked by the binding): every shard's views as bm25_topk requires;
/// bases ascending with base + n_docs <= the next base and <= kMaxDocs; every shard's
/// queries hold queries.nq queries; union_kth null or indexable by every query term.
void bm25_topk_shards(const std::vector<bm25_shard_view>& shards, const query_batch_view& queries,
                      const float* union_kth, bm25_algorithm algorithm, int n_threads, const topk_out& out);

/// out[i] = the depth-th largest bm25_tf_part over the postings of term terms[i] in all of
/// `shards` together (from each shard's impacts when set; a term a shard has no list for
/// has no postings there), or -inf when they number fewer than depth or one of
/// the values read is negative or NaN: the union_kth of bm25_topk_shards, equal to what
/// bm25_term_kth returns for one shard holding the same postings. Blocks whose bound
/// (bounds.block_offsets / block_ub, when set) is not above the running depth-th value are
/// skipped. Parallel over terms. Preconditions (checked by the binding): every term's range
/// in each shard's offsets lies inside its doc_ids, and its blocks inside block_ub.
void bm25_term_kth_shards(const std::vector<bm25_shard_view>& shards, const uint32_t* terms, size_t n,
                          size_t depth, int n_threads, float* out);

}  // namespace retriever
