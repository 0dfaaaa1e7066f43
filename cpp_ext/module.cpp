// The extension module retriever._kernels: its docstring and one registration per leg
// (bind_bm25.cpp, bind_sparse.cpp, bind_dense.cpp, bind_fusion.cpp) and the document fetch
// (bind_docs.cpp). The kernels
// themselves are plain C++ (no pybind11); the bind_*.cpp files are the boundary.

#include <pybind11/pybind11.h>

#include "bind_common.hpp"

PYBIND11_MODULE(_kernels, m) {
    m.doc() =
        "Query-time kernels of retriever (C++, pybind11).\n\n"
        "Stateless functions over numpy arrays; see retriever/_kernels.pyi for the full\n"
        "contracts. Arrays must already have the exact dtype and be C-contiguous\n"
        "(TypeError otherwise; nothing is copied). Bad values raise ValueError naming the\n"
        "argument. The GIL is released while the kernels run.\n\n"
        "Top-k outputs: ids int64 (nq, k) padded with -1, scores float32 (nq, k) padded\n"
        "with -inf, n_found int32 (nq,); rows sorted by score descending, ties by smaller\n"
        "doc id; bit-identical for any n_threads and (bm25) any algorithm.";

    retriever::bind::register_bm25(m);
    retriever::bind::register_sparse(m);
    retriever::bind::register_dense(m);
    retriever::bind::register_fusion(m);
    retriever::bind::register_docs(m);
}
