// Python bindings of the dense leg's kernels: Matryoshka funnel re-scoring
// (rescore.hpp), the running top-k' of a blocked exact scan, and the int8 prefix scan
// (int8_scan.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "int8_scan.hpp"
#include "rescore.hpp"

#include "bind_common.hpp"

namespace retriever::bind {

namespace {

topk_result py_rescore_topk(const carray<float>& queries, const py::array& vectors,
                            const carray<int64_t>& candidates, int64_t k, int64_t base, int n_threads,
                            const std::string& impl) {
    if (queries.ndim() != 2) fail("queries must be 2-dimensional (nq, d), got ndim = " + std::to_string(queries.ndim()));
    if (vectors.ndim() != 2) fail("vectors must be 2-dimensional (n, d), got ndim = " + std::to_string(vectors.ndim()));
    if (candidates.ndim() != 2) {
        fail("candidates must be 2-dimensional (nq, k'), got ndim = " + std::to_string(candidates.ndim()));
    }
    if (!(vectors.flags() & py::array::c_style)) throw py::type_error("vectors must be C-contiguous");
    const py::dtype dt = vectors.dtype();
    dense_matrix_view m;
    m.n = static_cast<size_t>(vectors.shape(0));
    m.d = static_cast<size_t>(vectors.shape(1));
    if (dt.byteorder() == '>') {  // kind/itemsize alone would let a big-endian array through
        throw py::type_error("vectors must be in native byte order, got " + std::string(py::str(dt)));
    }
    if (dt.kind() == 'f' && dt.itemsize() == 2) {
        m.f16 = static_cast<const uint16_t*>(vectors.data());
    } else if (dt.kind() == 'f' && dt.itemsize() == 4) {
        m.f32 = static_cast<const float*>(vectors.data());
    } else {
        throw py::type_error("vectors must be float16 or float32, got " + std::string(py::str(dt)));
    }
    if (m.n > (size_t{1} << 32)) fail("vectors has " + std::to_string(m.n) + " rows, more than 2**32");
    const size_t nq = static_cast<size_t>(queries.shape(0));
    require_eq(static_cast<size_t>(queries.shape(1)), m.d, "queries.shape[1]", "vectors.shape[1]");
    require_eq(static_cast<size_t>(candidates.shape(0)), nq, "candidates.shape[0]", "queries.shape[0]");
    check_k(k);
    if (base < 0) fail("base must be >= 0, got " + std::to_string(base));
    if (vectors.ndim() >= 1 && vectors.shape(0) > 0 &&
        base > std::numeric_limits<int64_t>::max() - static_cast<int64_t>(vectors.shape(0) - 1)) {
        fail("base = " + std::to_string(base) + " + " + std::to_string(vectors.shape(0)) +
             " rows overflows int64 ids");
    }
    candidate_view c;
    c.cand = candidates.data();
    c.nq = nq;
    c.kk = static_cast<size_t>(candidates.shape(1));
    rescore_impl which;
    if (impl == "auto") {
        which = rescore_impl::automatic;
    } else if (impl == "portable") {
        which = rescore_impl::portable;
    } else if (impl == "avx512") {
        which = rescore_impl::avx512;
        if (!rescore_has_avx512()) fail("impl = 'avx512' but this CPU has no AVX-512F / F16C");
    } else {
        fail("impl must be 'auto', 'portable' or 'avx512', got '" + impl + "'");
    }
    const float* qp = queries.data();
    topk_arrays res(nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_candidates(c, m.n);
        rescore_topk(qp, m, c, base, n_threads, res.out, which);
    }
    return res.result();
}


void py_heap_push_block(const carray<float>& scores, int64_t first_id, carray<float>& heap_scores,
                        carray<int64_t>& heap_ids, int n_threads, const opt_carray<uint8_t>& allow) {
    if (scores.ndim() != 2) fail("scores must be 2-dimensional (nq, nd), got ndim = " + std::to_string(scores.ndim()));
    if (heap_scores.ndim() != 2 || heap_ids.ndim() != 2) fail("heap_scores and heap_ids must be 2-dimensional (nq, k')");
    const size_t nq = static_cast<size_t>(scores.shape(0));
    require_eq(static_cast<size_t>(heap_scores.shape(0)), nq, "heap_scores.shape[0]", "scores.shape[0]");
    require_eq(static_cast<size_t>(heap_ids.shape(0)), nq, "heap_ids.shape[0]", "scores.shape[0]");
    require_eq(static_cast<size_t>(heap_ids.shape(1)), static_cast<size_t>(heap_scores.shape(1)),
               "heap_ids.shape[1]", "heap_scores.shape[1]");
    if (heap_scores.shape(1) < 1) fail("heaps must hold k' >= 1 entries");
    if (first_id < 0) fail("first_id must be >= 0, got " + std::to_string(first_id));
    heap_rows_view h;
    h.scores = heap_scores.mutable_data();
    h.ids = heap_ids.mutable_data();
    h.nq = nq;
    h.kk = static_cast<size_t>(heap_scores.shape(1));
    const float* sp = scores.data();
    const size_t nd = static_cast<size_t>(scores.shape(1));
    const uint8_t* al = nullptr;
    if (allow) {
        require_eq(len1d(*allow, "allow"), nd, "len(allow)", "scores.shape[1]");
        al = allow->data();
    }
    {
        py::gil_scoped_release nogil;
        heap_push_block(sp, nd, first_id, h, n_threads, al);
    }
}

std::tuple<carray<int32_t>, carray<int64_t>> py_int8_scan_topk(const carray<int8_t>& queries,
                                                              const carray<uint8_t>& codes, int64_t n,
                                                              int64_t kk, int n_threads, const std::string& impl,
                                                              const opt_carray<uint8_t>& allow) {
    if (queries.ndim() != 2) {
        fail("queries must be 2-dimensional (nq, 4 * d4), got ndim = " + std::to_string(queries.ndim()));
    }
    if (codes.ndim() != 3 || codes.shape(2) != 64) {
        fail("codes must have shape (n_blocks, d4, 64), got ndim = " + std::to_string(codes.ndim()) +
             (codes.ndim() == 3 ? ", shape[2] = " + std::to_string(codes.shape(2)) : std::string()));
    }
    if (n < 1 || n > 4294967295LL) fail("n must be in [1, 2**32 - 1], got " + std::to_string(n));
    const size_t n_blocks = (static_cast<size_t>(n) + kI8BlockDocs - 1) / kI8BlockDocs;
    require_eq(static_cast<size_t>(codes.shape(0)), n_blocks, "codes.shape[0]", "ceil(n / 16)");
    const size_t d4 = static_cast<size_t>(codes.shape(1));
    if (d4 < 1 || d4 > kI8MaxGroups) {
        fail("codes.shape[1] (d4) must be in [1, " + std::to_string(kI8MaxGroups) + "], got " + std::to_string(d4));
    }
    require_eq(static_cast<size_t>(queries.shape(1)), 4 * d4, "queries.shape[1]", "4 * codes.shape[1]");
    if (kk < 1 || kk > n) fail("kk must be in [1, n = " + std::to_string(n) + "], got " + std::to_string(kk));
    i8_impl which;
    if (impl == "auto") {
        which = i8_impl::automatic;
    } else if (impl == "portable") {
        which = i8_impl::portable;
    } else if (impl == "vnni") {
        which = i8_impl::vnni;
        if (!int8_scan_has_vnni()) fail("impl = 'vnni' but this CPU has no AVX-512 VNNI");
    } else {
        fail("impl must be 'auto', 'portable' or 'vnni', got '" + impl + "'");
    }
    const size_t nq = static_cast<size_t>(queries.shape(0));
    const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(kk)};
    carray<int32_t> scores(shape);
    carray<int64_t> ids(shape);
    u8_packed_view m;
    m.codes = codes.data();
    m.n = static_cast<size_t>(n);
    m.d4 = d4;
    std::vector<uint16_t> allow16;
    if (allow) {
        require_eq(len1d(*allow, "allow"), static_cast<size_t>(n), "len(allow)", "n (the shard's documents)");
        const uint8_t* al = allow->data();
        allow16.assign(n_blocks, 0);
        for (size_t d = 0; d < static_cast<size_t>(n); ++d) {
            allow16[d / kI8BlockDocs] |= static_cast<uint16_t>((al[d] != 0 ? 1u : 0u) << (d % kI8BlockDocs));
        }
        m.allow16 = allow16.data();
    }
    i8_topk_out out;
    out.scores = scores.mutable_data();
    out.ids = ids.mutable_data();
    out.kk = static_cast<size_t>(kk);
    const int8_t* qp = queries.data();
    {
        py::gil_scoped_release nogil;
        int8_scan_topk(qp, nq, m, out, n_threads, which);
    }
    return {scores, ids};
}

}  // namespace

void register_dense(py::module_& m) {
    m.def("rescore_topk", &py_rescore_topk, py::arg("queries").noconvert(), py::arg("vectors"),
          py::arg("candidates").noconvert(), py::arg("k"), py::arg("base") = 0, py::arg("n_threads") = 0,
          py::arg("impl") = "auto",
          "Exact full-dimension re-scoring of funnel shortlists: for query i, the inner products\n"
          "of queries[i] (float32) with vectors[candidates[i, j]] (float16 or float32 rows; -1 =\n"
          "no candidate), accumulated in float64 in a fixed order (8 lanes over i % 8, combined\n"
          "pairwise) and rounded to float32, so scores never depend on the batch. Returns the\n"
          "top-k (ids = candidate + base, scores, n_found); ties by smaller id. impl: 'auto',\n"
          "'portable' or 'avx512' (AVX-512F + F16C; bit-identical scores on every path).");
    m.def("rescore_has_avx512", &rescore_has_avx512,
          "True when rescore_topk's AVX-512 path is available on this CPU.");
    m.def("heap_push_block", &py_heap_push_block, py::arg("scores").noconvert(), py::arg("first_id"),
          py::arg("heap_scores").noconvert(), py::arg("heap_ids").noconvert(), py::arg("n_threads") = 0,
          py::arg("allow").noconvert() = py::none(),
          "Running top-k' of a blocked exact scan (Matryoshka prefix candidate generation): row i\n"
          "of scores (nq, nd) float32 holds query i's scores of ids first_id .. first_id + nd - 1;\n"
          "each enters query i's min-heap (heap_scores f32 / heap_ids i64 (nq, k'), updated in\n"
          "place; initialise to -inf / -1) when it ranks before the root (higher score, or equal\n"
          "score and smaller id); allow: None or uint8 (nd,) aligned with the block's columns, 0 =\n"
          "never enters. The heaps are left unsorted.");
    m.def("int8_scan_topk", &py_int8_scan_topk, py::arg("queries").noconvert(), py::arg("codes").noconvert(),
          py::arg("n"), py::arg("kk"), py::arg("n_threads") = 0, py::arg("impl") = "auto",
          py::arg("allow").noconvert() = py::none(),
          "Exact top-k' of int8-quantised prefixes (funnel candidate generation; layout in\n"
          "cpp_ext/int8_scan.hpp): score(i, d) = sum_t codes_d[t] * queries[i, t] in int32 over\n"
          "uint8 document codes packed in 16-document blocks (codes (ceil(n/16), d4, 64)) and int8\n"
          "queries (nq, 4 * d4). Returns (scores int32 (nq, kk), ids int64 (nq, kk)) sorted by score\n"
          "descending then id. impl: 'auto' (AVX-512 VNNI where available), 'portable' or 'vnni';\n"
          "every path returns identical results for any n_threads.");
    m.def("int8_scan_has_vnni", &int8_scan_has_vnni,
          "True when int8_scan_topk's AVX-512 VNNI path is available on this CPU.");
}

}  // namespace retriever::bind
