// Python bindings shared by fusion: competition ranks of sorted top-k rows.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "topk.hpp"

#include "bind_common.hpp"

namespace retriever::bind {

namespace {

carray<int32_t> py_tie_ranks(const carray<float>& scores, const carray<int32_t>& n_found) {
    if (scores.ndim() != 2) fail("scores must be 2-dimensional (nq, k), got ndim = " + std::to_string(scores.ndim()));
    const size_t nq = static_cast<size_t>(scores.shape(0)), k = static_cast<size_t>(scores.shape(1));
    require_eq(len1d(n_found, "n_found"), nq, "len(n_found)", "scores.shape[0]");
    carray<int32_t> ranks(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    tie_ranks_rows(scores.data(), nq, k, n_found.data(), ranks.mutable_data());
    return ranks;
}

}  // namespace

void register_fusion(py::module_& m) {
    m.def("tie_ranks", &py_tie_ranks, py::arg("scores").noconvert(), py::arg("n_found").noconvert(),
          "1-based competition ranks of sorted top-k rows (scores float32 (nq, k), each row\n"
          "descending; n_found int32 (nq,)): rank = 1 + the first position holding the same\n"
          "score (ties share the best position), 0 past n_found (clamped to [0, k]); rows must\n"
          "be sorted (neighbours are compared).\n"
          "Returns int32 (nq, k). Raises ValueError on a shape mismatch.");
}

}  // namespace retriever::bind
