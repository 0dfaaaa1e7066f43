// BM25 top-k over several shards of one index in one call, with one top-k collector per
// query carried from shard to shard (bm25_topk_shards; defined in bm25_topk_shards.hpp,
// which bm25_topk.cpp includes).
#pragma once

#include <cstdint>
#include <vector>

#include "postings_topk.hpp"

namespace retriever {

/// One shard of a bm25_topk_shards call: its postings and bounds (as bm25_topk takes
/// them), its filter, the global ordinal of its local document 0, and the call's query
/// batch restricted to the shard's vocabulary (terms >= data.csr.n_terms removed, every
/// query keeping its row).
struct bm25_shard_view {
    bm25_view data;
    bm25_bounds_view bounds;
    bool has_bounds = false;  // false: exhaustive only
    const uint8_t* allow = nullptr;  // n_docs bytes, nonzero = allowed; null = every document
    uint64_t base = 0;
    query_batch_view queries;
};

/// Exact BM25 top-k over the union of `shards` for a batch of nq queries: equal, ids and
/// scores bit for bit, to bm25_topk on each shard (ids + base) merged by score descending,
/// then global ordinal ascending. Each query runs through the shards in order on one
/// thread with one top-k collector of global ordinals; each shard's pruning starts from
/// the k-th score collected so far (Lucene's shared minimum competitive score), which is
/// exact because a document scoring below it cannot enter, and one scoring equal to it
/// ranks after the k earlier hits (shards are in ordinal order, ties go to the smaller
/// ordinal) while pruning discards only bounds strictly below it.
/// Preconditions (checked by the binding): every shard's views as bm25_topk requires;
/// bases ascending with base + n_docs <= the next base and <= kMaxDocs; every shard's
/// queries hold nq queries.
void bm25_topk_shards(const std::vector<bm25_shard_view>& shards, size_t nq, bm25_algorithm algorithm,
                      int n_threads, const topk_out& out);

}  // namespace retriever
