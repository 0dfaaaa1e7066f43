// Exact full-dimension re-scoring of funnel-search shortlists; see rescore.hpp.
#include "rescore.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

constexpr size_t kLanes = 8;

/// IEEE binary16 -> binary32, exact for finite values (stored vectors are checked finite at
/// open); branch-free so the compiler can vectorise it.
inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    // normal numbers: rebias the exponent (15 -> 127) and widen the mantissa.
    uint32_t bits = (em << 13) + 0x38000000u;
    float normal;
    std::memcpy(&normal, &bits, sizeof normal);
    // zero and subnormals: em * 2^-24 (exact: em < 1024).
    const float sub = static_cast<float>(em) * 5.9604644775390625e-8f;
    float mag = em < 0x400u ? sub : normal;
    uint32_t out;
    std::memcpy(&out, &mag, sizeof out);
    out |= sign;
    float f;
    std::memcpy(&f, &out, sizeof f);
    return f;
}

template <class Load>
inline float dot_fixed(const float* q, size_t d, Load load) {
    double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (size_t j = 0; j < kLanes; ++j) {
            acc[j] += static_cast<double>(q[i + j]) * static_cast<double>(load(i + j));
        }
    }
    for (size_t j = 0; i + j < d; ++j) {
        acc[j] += static_cast<double>(q[i + j]) * static_cast<double>(load(i + j));
    }
    const double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return static_cast<float>(s);
}

}  // namespace

void check_candidates(const candidate_view& c, size_t n) {
    const size_t total = c.nq * c.kk;
    for (size_t p = 0; p < total; ++p) {
        const int64_t id = c.cand[p];
        if (id < -1 || (id >= 0 && static_cast<uint64_t>(id) >= n)) {
            throw std::invalid_argument("candidates[" + std::to_string(p / c.kk) + ", " +
                                        std::to_string(p % c.kk) + "] = " + std::to_string(id) +
                                        " is outside [-1, n_rows = " + std::to_string(n) + ")");
        }
    }
}

float dense_dot(const float* q, const dense_matrix_view& m, size_t row) {
    const size_t d = m.d;
    if (m.f16 != nullptr) {
        const uint16_t* v = m.f16 + row * d;
        return dot_fixed(q, d, [v](size_t i) { return half_to_float(v[i]); });
    }
    const float* v = m.f32 + row * d;
    return dot_fixed(q, d, [v](size_t i) { return v[i]; });
}

void rescore_topk(const float* q, const dense_matrix_view& m, const candidate_view& c, int64_t base,
                  int n_threads, const topk_out& out) {
    const size_t k = out.k;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    parallel_for_items(c.nq, n_threads, 4, [&]() {
        return [&, buf = std::vector<scored_doc>()](size_t qi) mutable {
            buf.clear();
            const int64_t* cand = c.cand + qi * c.kk;
            const float* qv = q + qi * m.d;
            for (size_t j = 0; j < c.kk; ++j) {
                if (cand[j] < 0) continue;
                const size_t row = static_cast<size_t>(cand[j]);
                // the id travels as uint32 inside scored_doc only for ordering; rows < 2^32
                // is checked at the boundary.
                buf.push_back({dense_dot(qv, m, row), static_cast<uint32_t>(row)});
            }
            const size_t keep = std::min(k, buf.size());
            std::partial_sort(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(keep), buf.end(),
                              ranks_before);
            int64_t* ids = out.ids + qi * k;
            float* sc = out.scores + qi * k;
            for (size_t j = 0; j < keep; ++j) {
                ids[j] = static_cast<int64_t>(buf[j].doc) + base;
                sc[j] = buf[j].score;
            }
            for (size_t j = keep; j < k; ++j) {
                ids[j] = -1;
                sc[j] = neg_inf;
            }
            out.n_found[qi] = static_cast<int32_t>(keep);
        };
    });
}

}  // namespace retriever
