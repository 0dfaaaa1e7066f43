// Python bindings of the hits path: Python strings made straight from the UTF-8 buffer of a
// memory-mapped Arrow string column (no Arrow take, no copy of the bytes), and the result
// tuples (Hit, LegHit) of a batch made in one C loop.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "bind_common.hpp"

namespace retriever::bind {

namespace {

/// ``[data[offsets[r]:offsets[r + 1]].decode("utf-8") for r in rows]``, one str object per
/// distinct row (a repeated row shares it: str is immutable). Every row and its two offsets
/// are checked before its bytes are read.
template <class Off>
py::list py_decode_strings(const carray<Off>& offsets, const py::buffer& data, const carray<int64_t>& rows) {
    const size_t n_off = len1d(offsets, "offsets");
    if (n_off == 0) fail("offsets must have length n_rows + 1 >= 1, got length 0");
    const size_t n = len1d(rows, "rows");
    const py::buffer_info buf = data.request();
    if (buf.ndim != 1) fail("data must be a 1-dimensional buffer, got ndim = " + std::to_string(buf.ndim));
    const char* bytes = static_cast<const char*>(buf.ptr);
    const int64_t n_bytes = static_cast<int64_t>(buf.size) * static_cast<int64_t>(buf.itemsize);
    const int64_t n_rows = static_cast<int64_t>(n_off) - 1;
    const Off* off = offsets.data();
    const int64_t* r = rows.data();
    py::list out(n);
    std::unordered_map<int64_t, PyObject*> made;
    made.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const int64_t row = r[i];
        if (row < 0 || row >= n_rows) {
            fail("rows[" + std::to_string(i) + "] = " + std::to_string(row) + " is outside [0, " +
                 std::to_string(n_rows) + ")");
        }
        auto it = made.find(row);
        PyObject* s;
        if (it != made.end()) {
            s = it->second;
            Py_INCREF(s);
        } else {
            const int64_t a = static_cast<int64_t>(off[row]), b = static_cast<int64_t>(off[row + 1]);
            if (a < 0 || b < a || b > n_bytes) {
                fail("offsets[" + std::to_string(row) + ":" + std::to_string(row + 2) + "] = [" + std::to_string(a) +
                     ", " + std::to_string(b) + "] is not a range inside data (" + std::to_string(n_bytes) +
                     " bytes)");
            }
            s = PyUnicode_DecodeUTF8(bytes + a, static_cast<Py_ssize_t>(b - a), "strict");
            if (s == nullptr) throw py::error_already_set();
            made.emplace(row, s);
        }
        PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), s);  // steals the reference
    }
    return out;
}


/// decode_strings for int32 or int64 offsets (one entry point: the stubs type one signature).
py::list py_decode_strings_any(const py::array& offsets, const py::buffer& data, const carray<int64_t>& rows) {
    if (py::isinstance<carray<int32_t>>(offsets)) {
        return py_decode_strings<int32_t>(py::reinterpret_borrow<carray<int32_t>>(offsets), data, rows);
    }
    if (py::isinstance<carray<int64_t>>(offsets)) {
        return py_decode_strings<int64_t>(py::reinterpret_borrow<carray<int64_t>>(offsets), data, rows);
    }
    throw py::type_error("offsets must be a C-contiguous int32 or int64 array, got dtype " +
                         std::string(py::str(offsets.dtype())));
}

/// A tuple subclass whose instances are plain tuples plus a type (a NamedTuple: no extra slots,
/// no instance dict), so that ``type->tp_alloc(type, n)`` and filling the items makes exactly what
/// ``tuple.__new__(type, items)`` makes.
PyTypeObject* tuple_type(const py::handle& t, const char* name) {
    if (!PyType_Check(t.ptr()) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t.ptr()), &PyTuple_Type)) {
        throw py::type_error(std::string(name) + " must be a tuple subclass (a NamedTuple)");
    }
    PyTypeObject* tp = reinterpret_cast<PyTypeObject*>(t.ptr());
    if (tp->tp_basicsize != PyTuple_Type.tp_basicsize || tp->tp_itemsize != PyTuple_Type.tp_itemsize ||
        tp->tp_dictoffset != 0) {
        throw py::type_error(std::string(name) + " must add no instance storage to tuple (a NamedTuple)");
    }
    return tp;
}

/// A new instance of tuple subclass ``tp`` holding ``items`` (references stolen, none NULL).
PyObject* new_tuple(PyTypeObject* tp, PyObject* const* items, Py_ssize_t n) {
    PyObject* o = tp->tp_alloc(tp, n);
    if (o == nullptr) {
        for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(items[i]);
        throw py::error_already_set();
    }
    for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(o, i, items[i]);
    return o;
}

/// A new reference or an exception.
PyObject* checked(PyObject* o) {
    if (o == nullptr) throw py::error_already_set();
    return o;
}

template <class T>
carray<T> exact_array(const py::handle& h, const std::string& name) {
    if (!py::isinstance<carray<T>>(h)) {
        throw py::type_error(name + " must be a C-contiguous array of dtype " +
                             std::string(py::str(py::dtype::of<T>())));
    }
    return py::reinterpret_borrow<carray<T>>(h);
}

/// One list of hits per query (see register_docs for the contract).
py::list py_make_hits(const py::handle& hit_type, const py::handle& leg_type, const carray<float>& scores,
                      const carray<int32_t>& n_found, const py::list& ids, const py::list& titles,
                      const py::list& texts, const py::list& metas, const py::list& leg_names,
                      const py::list& leg_scores, const py::list& leg_ranks) {
    PyTypeObject* hit_tp = tuple_type(hit_type, "hit_type");
    PyTypeObject* leg_tp = tuple_type(leg_type, "leg_type");
    if (scores.ndim() != 2) fail("scores must be 2-dimensional (nq, k), got ndim = " + std::to_string(scores.ndim()));
    const size_t nq = static_cast<size_t>(scores.shape(0)), width = static_cast<size_t>(scores.shape(1));
    require_eq(len1d(n_found, "n_found"), nq, "len(n_found)", "scores.shape[0]");
    const int32_t* nf = n_found.data();
    size_t total = 0;
    for (size_t q = 0; q < nq; ++q) {
        if (nf[q] < 0 || static_cast<size_t>(nf[q]) > width) {
            fail("n_found[" + std::to_string(q) + "] = " + std::to_string(nf[q]) + " is outside [0, " +
                 std::to_string(width) + "]");
        }
        total += static_cast<size_t>(nf[q]);
    }
    const std::pair<const py::list*, const char*> cols[] = {{&ids, "ids"}, {&titles, "titles"}, {&texts, "texts"},
                                                           {&metas, "metas"}};
    for (const auto& [col, name] : cols) require_eq(col->size(), total, std::string("len(") + name + ")", "sum(n_found)");
    const size_t n_legs = leg_names.size();
    require_eq(leg_scores.size(), n_legs, "len(leg_scores)", "len(leg_names)");
    require_eq(leg_ranks.size(), n_legs, "len(leg_ranks)", "len(leg_names)");
    std::vector<carray<float>> ls;
    std::vector<carray<int32_t>> lr;
    for (size_t l = 0; l < n_legs; ++l) {
        if (!PyUnicode_Check(leg_names[l].ptr())) throw py::type_error("leg_names must hold str");
        ls.push_back(exact_array<float>(leg_scores[l], "leg_scores[" + std::to_string(l) + "]"));
        lr.push_back(exact_array<int32_t>(leg_ranks[l], "leg_ranks[" + std::to_string(l) + "]"));
        for (const py::array* a : {static_cast<const py::array*>(&ls.back()), static_cast<const py::array*>(&lr.back())}) {
            if (a->ndim() != 2 || static_cast<size_t>(a->shape(0)) != nq || static_cast<size_t>(a->shape(1)) != width) {
                fail("leg arrays of leg " + std::string(py::str(leg_names[l])) + " must have the shape of scores (" +
                     std::to_string(nq) + ", " + std::to_string(width) + ")");
            }
        }
    }
    const float* sc = scores.data();
    py::list out(nq);
    size_t flat = 0;
    for (size_t q = 0; q < nq; ++q) {
        const Py_ssize_t n = nf[q];
        PyObject* row = checked(PyList_New(n));
        PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(q), row);  // owned by out from here
        for (Py_ssize_t j = 0; j < n; ++j, ++flat) {
            const size_t at = q * width + static_cast<size_t>(j);
            PyObject* legs = checked(PyDict_New());
            for (size_t l = 0; l < n_legs; ++l) {
                const int32_t rank = lr[l].data()[at];
                if (rank <= 0) continue;  // rank 0: the leg did not return this document
                PyObject* items[2] = {nullptr, nullptr};
                items[0] = PyFloat_FromDouble(static_cast<double>(ls[l].data()[at]));
                items[1] = PyLong_FromLong(rank);
                if (items[0] == nullptr || items[1] == nullptr) {
                    Py_XDECREF(items[0]);
                    Py_XDECREF(items[1]);
                    Py_DECREF(legs);
                    throw py::error_already_set();
                }
                PyObject* leg;
                try {
                    leg = new_tuple(leg_tp, items, 2);
                } catch (...) {
                    Py_DECREF(legs);
                    throw;
                }
                // a (float, int) tuple can never be part of a cycle: the collector need not
                // follow it (CPython untracks such plain tuples itself, not tuple subclasses)
                PyObject_GC_UnTrack(leg);
                const int rc = PyDict_SetItem(legs, leg_names[l].ptr(), leg);
                Py_DECREF(leg);
                if (rc != 0) {
                    Py_DECREF(legs);
                    throw py::error_already_set();
                }
            }
            // the dict holds only untracked tuples: a later insertion of a container re-tracks
            // it (CPython's own rule for dicts), so it need not be followed until then
            if (PyObject_GC_IsTracked(legs)) PyObject_GC_UnTrack(legs);
            PyObject* items[7];
            const Py_ssize_t fi = static_cast<Py_ssize_t>(flat);
            items[0] = PyList_GET_ITEM(ids.ptr(), fi);
            items[3] = PyList_GET_ITEM(titles.ptr(), fi);
            items[4] = PyList_GET_ITEM(texts.ptr(), fi);
            items[5] = PyList_GET_ITEM(metas.ptr(), fi);
            items[1] = PyFloat_FromDouble(static_cast<double>(sc[at]));
            items[2] = PyLong_FromSsize_t(j + 1);
            items[6] = legs;
            if (items[1] == nullptr || items[2] == nullptr) {
                Py_XDECREF(items[1]);
                Py_XDECREF(items[2]);
                Py_DECREF(legs);
                throw py::error_already_set();
            }
            Py_INCREF(items[0]);
            Py_INCREF(items[3]);
            Py_INCREF(items[4]);
            Py_INCREF(items[5]);
            PyList_SET_ITEM(row, j, new_tuple(hit_tp, items, 7));
        }
    }
    return out;
}

}  // namespace

void register_docs(py::module_& m) {
    const char* doc =
        "The strings of ``rows`` of an Arrow string column without nulls, decoded from its\n"
        "buffers: ``offsets`` int32 or int64 (n_rows + 1,) and ``data`` (its UTF-8 bytes, any\n"
        "1-d buffer); ``rows`` int64 (n,). Returns a list of n str, one object per distinct row.\n"
        "Raises ValueError (a row outside [0, n_rows), or offsets that are not a range inside\n"
        "data), UnicodeDecodeError (invalid UTF-8). Holds the GIL (it makes Python objects).";
    m.def("decode_strings", &py_decode_strings_any, py::arg("offsets").noconvert(), py::arg("data"),
          py::arg("rows").noconvert(), doc);
    m.def("make_hits", &py_make_hits, py::arg("hit_type"), py::arg("leg_type"), py::arg("scores").noconvert(),
          py::arg("n_found").noconvert(), py::arg("ids"), py::arg("titles"), py::arg("texts"), py::arg("metas"),
          py::arg("leg_names"), py::arg("leg_scores"), py::arg("leg_ranks"),
          "The hits of a batch: for query q, a list of n_found[q] hit_type tuples\n"
          "(id, float(scores[q, j]), j + 1, title, text, metadata, legs), j < n_found[q], where\n"
          "id / title / text / metadata are the next entries of the flat lists ids / titles /\n"
          "texts / metas (query order, sum(n_found) entries each; the objects are shared, not\n"
          "copied) and legs is a new dict {leg_names[l]: leg_type(float(leg_scores[l][q, j]),\n"
          "int(leg_ranks[l][q, j]))} over the legs whose rank there is > 0, in leg order.\n"
          "hit_type / leg_type: NamedTuple classes; scores and each leg_scores float32 (nq, k),\n"
          "leg_ranks int32 (nq, k), n_found int32 (nq,) in [0, k]. Returns list[list[hit_type]].\n"
          "The same objects as tuple.__new__(hit_type, ...) makes (the per-leg tuples and dicts\n"
          "are left to the cyclic collector's untracked set, as CPython does for atomic contents).\n"
          "Raises TypeError (a type or array), ValueError (shapes, lengths, n_found). Holds the GIL.");
}

}  // namespace retriever::bind
