// Safe pruning comparisons: a document is discarded only when an upper bound of its
// float32 score, inflated to cover rounding, is strictly below the current k-th score.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>

namespace retriever {
namespace {

/// may_enter(bound, thr) is false only when every float32 score the bound
/// covers is certainly < thr. `bound` is a double sum of exact products
/// (double)w * (double)ub; the float score of a document covered by it is at
/// most bound * (1 + 2^-24)^(n+1) (product rounding + n-1 additions of
/// non-negative terms) plus underflow slack. We use a larger margin.
struct bound_check {
    double margin;
    double slack;
    explicit bound_check(size_t n_terms)
        : margin(1.0 + static_cast<double>(n_terms + 4) * 0x1p-22),
          slack(static_cast<double>(n_terms + 1) * 0x1p-140) {}
    bool may_enter(double bound, float thr) const {
        const double b = bound * margin + slack;
        if (!(b < static_cast<double>(FLT_MAX))) return true;  // could round to +inf
        return b >= static_cast<double>(thr);
    }
    /// A cut c such that a < c implies !may_enter(a + rest, thr): compare a
    /// partial score with one subtraction-free test in hot loops. Slightly
    /// below the exact cut, so it never discards what may_enter keeps.
    double cut(double rest, float thr) const {
        const double t = std::min(static_cast<double>(thr), static_cast<double>(FLT_MAX));
        double c = (t - slack) / margin - rest;
        c -= std::fabs(c) * 1e-9 + 1e-300;
        return c;
    }
};

}  // namespace
}  // namespace retriever
