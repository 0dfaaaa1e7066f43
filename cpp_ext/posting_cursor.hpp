// Posting cursor over one term's CSR list, with optional block-max data.
//
// PISA's split: the cursor is the only code that walks a posting list (next,
// galloping / interpolated seek, block-max shallow seek); the scorer (bm25_scorer.hpp)
// turns a posting into a contribution and the algorithms only move cursors.
#pragma once

#include <algorithm>
#include <cstdint>

#include "postings_topk.hpp"

namespace retriever {

/// posting_cursor::seek interpolates when more than this many postings are
/// left and the doc-id gap exceeds kInterpolateGap; shorter hops gallop.
constexpr uint64_t kInterpolateMin = 64;
constexpr uint32_t kInterpolateGap = 256;

struct posting_cursor {
    const uint32_t* docs = nullptr;
    uint64_t beg = 0, end = 0, pos = 0;
    uint32_t doc = kEndDoc;  // docs[pos], or kEndDoc when exhausted
    uint32_t qpos = 0;       // position of the term in its query
    float weight = 0.0f;
    double ub = 0.0;         // (double)weight * term_ub[t]
    // membership bitmap of a long list (bm25_bounds_view::dense_slot), or null
    const uint64_t* bits = nullptr;
    const uint32_t* rank = nullptr;
    // block-max
    const float* bub = nullptr;  // this term's block bounds
    uint64_t nb = 0;             // number of blocks of this term
    uint64_t bi = 0;             // shallow block position
    uint64_t bs = 1;             // block size

    void refresh() { doc = pos < end ? docs[pos] : kEndDoc; }
    void next() {
        ++pos;
        refresh();
    }
    /// Moves to the first posting with doc id >= target. Short hops gallop
    /// from the current posting; long ones (more than kInterpolateMin
    /// postings left and a doc-id gap of more than kInterpolateGap) first
    /// guess the position by interpolation between the current posting and
    /// the list's last one, then gallop from the guess in the direction it
    /// missed (Bentley & Yao 1976 galloping; interpolation search, Perl,
    /// Itai & Avni 1978). Both find the same posting (lower_bound); the guess
    /// cuts the cache misses of a long hop in a dense list from ~log2(hop) to
    /// a few.
    void seek(uint32_t target) {
        if (doc >= target) return;  // also when exhausted
        uint64_t lo = pos;          // docs[lo] < target
        uint64_t hi = end;          // hi == end or docs[hi] >= target
        if (end - pos > kInterpolateMin && target - doc > kInterpolateGap) {
            const uint32_t last = docs[end - 1];
            if (last < target) {
                pos = end;
                doc = kEndDoc;
                return;
            }
            // doc < target <= last: the answer lies in (pos, end - 1]
            const double frac = static_cast<double>(target - doc) / (static_cast<double>(last - doc) + 1.0);
            uint64_t g = pos + 1 + static_cast<uint64_t>(frac * static_cast<double>(end - 2 - pos));
            if (g > end - 1) g = end - 1;
            uint64_t step = 1;
            if (docs[g] < target) {
                lo = g;
                while (lo + step < hi) {
                    const uint64_t probe = lo + step;
                    if (docs[probe] >= target) {
                        hi = probe;
                        break;
                    }
                    lo = probe;
                    step <<= 1;
                }
            } else {
                hi = g;
                while (hi - lo > step) {
                    const uint64_t probe = hi - step;
                    if (docs[probe] < target) {
                        lo = probe;
                        break;
                    }
                    hi = probe;
                    step <<= 1;
                }
            }
        } else {
            uint64_t step = 1;
            uint64_t h = lo + 1;
            while (h < end && docs[h] < target) {
                lo = h;
                step <<= 1;
                h = lo + step;
            }
            hi = h > end ? end : h;
        }
        pos = static_cast<uint64_t>(std::lower_bound(docs + lo + 1, docs + hi, target) - docs);
        refresh();
    }
    uint32_t block_last(uint64_t b) const {
        uint64_t e = beg + (b + 1) * bs;
        if (e > end) e = end;
        return docs[e - 1];
    }
    /// Moves the block position (not the posting position) to the first block
    /// whose last doc id is >= target. Targets must be non-decreasing.
    void shallow_seek(uint32_t target) {
        if (bi >= nb || block_last(bi) >= target) return;
        uint64_t lo = bi;  // block_last(lo) < target
        uint64_t step = 1;
        uint64_t hi = lo + 1;
        while (hi < nb && block_last(hi) < target) {
            lo = hi;
            step <<= 1;
            hi = lo + step;
        }
        if (hi > nb) hi = nb;
        uint64_t l = lo + 1, r = hi;  // answer in [l, r], r == nb means none
        while (l < r) {
            const uint64_t mid = l + (r - l) / 2;
            if (block_last(mid) < target) {
                l = mid + 1;
            } else {
                r = mid;
            }
        }
        bi = l;
    }
    /// Upper bound on this term's contribution to any doc id >= target that
    /// lies in the shallow block reached for target (0 when no block remains).
    double block_bound(uint32_t target) {
        shallow_seek(target);
        return bi < nb ? static_cast<double>(weight) * static_cast<double>(bub[bi]) : 0.0;
    }
    /// Smallest doc id past the current shallow block (kEndDoc if none).
    uint32_t block_boundary() const {
        if (bi >= nb) return kEndDoc;
        return block_last(bi) + 1;  // block_last <= kMaxDocs - 1, no overflow
    }
    // Cached facts about the block holding the current posting (block-max
    // MaxScore): refreshed by update_block() when pos leaves the block.
    uint64_t blk_end = 0;   // posting index one past the current block
    uint32_t blk_last = 0;  // last doc id of the current block
    double blk_bound = 0.0; // weight * block_ub of the current block

    void update_block() {
        if (pos < blk_end || pos >= end) return;
        const uint64_t b = (pos - beg) / bs;
        blk_end = std::min(end, beg + (b + 1) * bs);
        blk_last = docs[blk_end - 1];
        blk_bound = static_cast<double>(weight) * static_cast<double>(bub[b]);
    }
    void next_b() {
        next();
        update_block();
    }
    void seek_b(uint32_t target) {
        seek(target);
        update_block();
    }
};

}  // namespace retriever
