// The bigram kernel radix started from, rebuilt to be timed beside radix-native (never shipped):
// a pybind11 function that makes each pair with PyTuple_New and gives it the two item references
// with PyTuple_SET_ITEM, which steals them. Nothing else: pybind11's own argument handling, every
// pair left tracked by the cyclic GC, the collector left running while the list is built.

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

py::list convert_to_bigram_key(const py::list& tokens) {
    PyObject* const items = tokens.ptr();
    const Py_ssize_t pairs = PyList_GET_SIZE(items) > 1 ? PyList_GET_SIZE(items) - 1 : 0;
    PyObject* result = PyList_New(pairs);
    if (result == nullptr) {
        throw py::error_already_set();
    }
    for (Py_ssize_t i = 0; i < pairs; ++i) {
        PyObject* pair = PyTuple_New(2);
        if (pair == nullptr) {
            Py_DECREF(result);
            throw py::error_already_set();
        }
        PyObject* first = PyList_GET_ITEM(items, i);
        PyObject* second = PyList_GET_ITEM(items, i + 1);
        Py_INCREF(first);
        Py_INCREF(second);
        PyTuple_SET_ITEM(pair, 0, first);
        PyTuple_SET_ITEM(pair, 1, second);
        PyList_SET_ITEM(result, i, pair);
    }
    return py::reinterpret_steal<py::list>(result);
}

}  // namespace

PYBIND11_MODULE(seed_style_kernel, module) {
    module.def("convert_to_bigram_key", &convert_to_bigram_key, py::arg("tokens"),
               "[t0, t1, t2] -> [(t0, t1), (t1, t2)] for a list of token ids, the seed's way.");
}
