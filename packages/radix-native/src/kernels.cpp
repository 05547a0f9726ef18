// Native kernels for radix-core.
//
// Every kernel here has a pure-Python reference in radix_core; results must be identical to it.
// A kernel answers NotImplemented for inputs it does not handle, so that the dispatcher in
// radix_core runs the reference instead (that is not a failure of the native backend).
//
// The hot kernel (convert_to_bigram_key) is a raw METH_O function added to the pybind11 module:
// pybind11's argument machinery costs more than the whole conversion of a short prompt.

#include <pybind11/pybind11.h>

#include <Python.h>

#include <cstdint>
#include <cstring>

namespace py = pybind11;

namespace {

// Bumped whenever a kernel's signature or contract changes; radix_core refuses other values.
constexpr int kKernelAbi = 2;

constexpr long long kPackedTokenLimit = 1LL << 31;

// Above this many pairs the result list is hidden from the cyclic GC while it is filled. Tracked, a
// long list is rescanned by every generation-1 collection its own tuple allocations trigger (one per
// ~7000 allocations), which grows with the square of its length; a short one is cheaper to leave
// tracked (it is scanned young, once or twice). Measured crossover: between 32k and 64k pairs.
constexpr Py_ssize_t kHideListAbove = 1 << 15;

// Mirrors CPython's own rule for tuples it may stop tracking: a tuple whose items can never be part
// of a reference cycle need not be scanned by the cyclic GC. CPython untracks such tuples lazily,
// during a collection; doing it at creation saves every young-generation scan from visiting them.
inline bool may_be_gc_tracked(PyObject* item) {
    if (PyLong_CheckExact(item)) {
        return false;
    }
    if (!PyObject_IS_GC(item)) {
        return false;
    }
    if (PyTuple_CheckExact(item)) {
        return PyObject_GC_IsTracked(item);
    }
    return true;
}

// [t0, t1, t2] -> [(t0, t1), (t1, t2)] for an exact list or tuple, reusing the item objects.
// Same contract as radix_core.bigram.python_convert_to_bigram_key.
PyObject* convert_to_bigram_key(PyObject* /*module*/, PyObject* tokens) {
    const bool is_list = PyList_CheckExact(tokens);
    if (!is_list && !PyTuple_CheckExact(tokens)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    if (n > 0 && PyTuple_Check(PySequence_Fast_GET_ITEM(tokens, 0))) {
        Py_INCREF(tokens);
        return tokens;
    }
    if (n < 2) {
        return PyList_New(0);
    }
    const Py_ssize_t pairs = n - 1;
    PyObject* result = PyList_New(pairs);
    if (result == nullptr) {
        return nullptr;
    }
    // Hidden or not, the result is tracked as usual before anyone else can see it.
    const bool hidden = pairs > kHideListAbove;
    if (hidden) {
        PyObject_GC_UnTrack(result);
    }
    for (Py_ssize_t i = 0; i < pairs; ++i) {
        PyObject* pair = PyTuple_New(2);
        // A collection triggered by that allocation may run finalizers that resize the input list.
        if (pair == nullptr || PySequence_Fast_GET_SIZE(tokens) != n) {
            if (pair != nullptr) {
                Py_DECREF(pair);
                PyErr_SetString(PyExc_RuntimeError, "token list changed size during bigram conversion");
            }
            if (hidden) {
                PyObject_GC_Track(result);
            }
            Py_DECREF(result);
            return nullptr;
        }
        PyObject* first = PySequence_Fast_GET_ITEM(tokens, i);
        PyObject* second = PySequence_Fast_GET_ITEM(tokens, i + 1);
        Py_INCREF(first);
        Py_INCREF(second);
        PyTuple_SET_ITEM(pair, 0, first);
        PyTuple_SET_ITEM(pair, 1, second);
        if (!may_be_gc_tracked(first) && !may_be_gc_tracked(second)) {
            PyObject_GC_UnTrack(pair);
        }
        PyList_SET_ITEM(result, i, pair);
    }
    if (hidden) {
        PyObject_GC_Track(result);
    }
    return result;
}

// Same accepted formats as radix_core.bigram._TOKEN_BUFFER_FORMATS.
bool is_token_buffer_format(const char* format, Py_ssize_t itemsize) {
    if (format == nullptr) {
        return false;
    }
    if (format[0] == '@') {
        ++format;
    }
    if (format[0] == '\0' || format[1] != '\0') {
        return false;
    }
    const char code = format[0];
    return (code == 'q' && itemsize == 8) || (code == 'l' && (itemsize == 8 || itemsize == 4)) ||
           (code == 'i' && itemsize == 4);
}

[[noreturn]] void raise_token_out_of_range() {
    throw py::value_error("token ids must be in [0, 2**31) to be packed into int64 bigram keys");
}

inline int64_t checked_token(long long value) {
    if (value < 0 || value >= kPackedTokenLimit) {
        raise_token_out_of_range();
    }
    return value;
}

// Reads one token id from a Python object with the reference's rules: any object with __index__.
int64_t token_from_object(PyObject* item) {
    int overflow = 0;
    long long value;
    if (PyLong_Check(item)) {
        value = PyLong_AsLongLongAndOverflow(item, &overflow);
    } else {
        PyObject* index = PyNumber_Index(item);
        if (index == nullptr) {
            throw py::error_already_set();
        }
        value = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    }
    if (overflow != 0) {
        raise_token_out_of_range();
    }
    if (value == -1 && PyErr_Occurred()) {
        throw py::error_already_set();
    }
    return checked_token(value);
}

// A Py_buffer released on every path out of the scope that acquired it.
class ScopedBuffer {
  public:
    ScopedBuffer() = default;
    ScopedBuffer(const ScopedBuffer&) = delete;
    ScopedBuffer& operator=(const ScopedBuffer&) = delete;
    ~ScopedBuffer() {
        if (held_) {
            PyBuffer_Release(&view_);
        }
    }
    // False, with the Python error set, when `obj` cannot export such a buffer.
    bool acquire(PyObject* obj, int flags) {
        held_ = PyObject_GetBuffer(obj, &view_, flags) == 0;
        return held_;
    }
    const Py_buffer& view() const { return view_; }

  private:
    Py_buffer view_{};
    bool held_ = false;
};

// Writable int64 storage for `count` packed keys: the caller's `out`, or a new array('q').
class PackedOutput {
  public:
    PackedOutput(py::object out, Py_ssize_t count) {
        if (out.is_none()) {
            // Leaked on purpose: a static py::object would be destroyed after the interpreter.
            static PyObject* const zero =
                py::module_::import("array").attr("array")("q", py::make_tuple(0)).release().ptr();
            owner_ = py::reinterpret_steal<py::object>(PySequence_Repeat(zero, count));
            if (!owner_) {
                throw py::error_already_set();
            }
        } else {
            owner_ = std::move(out);
        }
        if (!buffer_.acquire(owner_.ptr(), PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) {
            PyErr_Clear();
            throw py::type_error("out must be a writable, contiguous, 1-D int64 buffer");
        }
        const Py_buffer& view = buffer_.view();
        if (view.ndim != 1 || view.itemsize != 8 || !is_token_buffer_format(view.format, 8)) {
            throw py::type_error("out must be a writable, contiguous, 1-D int64 buffer");
        }
        if (view.len / 8 < count) {
            throw py::value_error("out is too short for the packed bigram keys");
        }
    }
    int64_t* data() { return static_cast<int64_t*>(buffer_.view().buf); }
    const py::object& owner() const { return owner_; }

  private:
    py::object owner_;
    ScopedBuffer buffer_;  // declared after owner_: released before the owner is dropped
};

inline int64_t pack(int64_t first, int64_t second) { return (first << 32) | second; }

template <typename Int>
inline Int load(const char* base, Py_ssize_t i, Py_ssize_t stride) {
    Int value;
    std::memcpy(&value, base + i * stride, sizeof value);
    return value;
}

// Packs `count` ids read from a 1-D buffer into dst[0 .. count-1); false if any id is out of range
// (dst is then partly written). An id is out of range iff any bit from bit 31 up is set (negative
// ids included): a shift and an OR per id, no branch, so the contiguous loop vectorizes with SSE2.
template <typename Int>
bool pack_buffer(const void* data, Py_ssize_t count, Py_ssize_t stride, int64_t* dst) {
    static_assert(kPackedTokenLimit == (1LL << 31), "the range check below assumes 31-bit ids");
    const char* base = static_cast<const char*>(data);
    uint64_t high_bits = 0;
    if (count > 0) {
        high_bits |= static_cast<uint64_t>(static_cast<int64_t>(load<Int>(base, count - 1, stride))) >> 31;
    }
    if (stride == static_cast<Py_ssize_t>(sizeof(Int))) {
        for (Py_ssize_t i = 0; i + 1 < count; ++i) {
            const int64_t first = load<Int>(base, i, sizeof(Int));
            high_bits |= static_cast<uint64_t>(first) >> 31;
            dst[i] = pack(first, load<Int>(base, i + 1, sizeof(Int)));
        }
    } else {
        for (Py_ssize_t i = 0; i + 1 < count; ++i) {
            const int64_t first = load<Int>(base, i, stride);
            high_bits |= static_cast<uint64_t>(first) >> 31;
            dst[i] = pack(first, load<Int>(base, i + 1, stride));
        }
    }
    return high_bits == 0;
}

// (t[i] << 32) | t[i + 1] for every adjacent pair; NotImplemented for inputs the reference must decide.
py::object pack_bigram_keys(py::handle tokens, py::object out) {
    if (PyList_CheckExact(tokens.ptr()) || PyTuple_CheckExact(tokens.ptr())) {
        PyObject* seq = tokens.ptr();
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        const Py_ssize_t pairs = n > 1 ? n - 1 : 0;
        PackedOutput output(std::move(out), pairs);
        int64_t* dst = output.data();
        if (n > 0) {
            int64_t previous = token_from_object(PySequence_Fast_GET_ITEM(seq, 0));
            for (Py_ssize_t i = 1; i < n; ++i) {
                // __index__ of an item may run Python code that shrinks the list.
                if (PySequence_Fast_GET_SIZE(seq) != n) {
                    throw py::value_error("token list changed size while packing bigram keys");
                }
                const int64_t current = token_from_object(PySequence_Fast_GET_ITEM(seq, i));
                dst[i - 1] = pack(previous, current);
                previous = current;
            }
        }
        return output.owner();
    }
    if (!PyObject_CheckBuffer(tokens.ptr())) {
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    }
    ScopedBuffer in;
    if (!in.acquire(tokens.ptr(), PyBUF_FORMAT | PyBUF_STRIDES)) {
        PyErr_Clear();
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    }
    const Py_buffer& buffer = in.view();
    if (buffer.ndim != 1 || !is_token_buffer_format(buffer.format, buffer.itemsize)) {
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    }
    const Py_ssize_t count = buffer.shape[0];
    PackedOutput output(std::move(out), count > 1 ? count - 1 : 0);
    const bool in_range = buffer.itemsize == 8
                              ? pack_buffer<int64_t>(buffer.buf, count, buffer.strides[0], output.data())
                              : pack_buffer<int32_t>(buffer.buf, count, buffer.strides[0], output.data());
    if (!in_range) {
        raise_token_out_of_range();
    }
    return output.owner();
}

// Borrowed int64 storage of a 1-D contiguous buffer (array('q'), numpy int64), or nullptr with
// no error set when `obj` is not one.
class Int64Buffer {
  public:
    explicit Int64Buffer(PyObject* obj) {
        if (!PyObject_CheckBuffer(obj)) {
            return;
        }
        if (!buffer_.acquire(obj, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) {
            PyErr_Clear();
            return;
        }
        const Py_buffer& view = buffer_.view();
        if (view.ndim == 1 && view.itemsize == 8 && is_token_buffer_format(view.format, 8)) {
            data_ = static_cast<const int64_t*>(view.buf);
            length_ = view.len / 8;
        }
    }
    const int64_t* data() const { return data_; }
    Py_ssize_t length() const { return length_; }

  private:
    ScopedBuffer buffer_;
    const int64_t* data_ = nullptr;
    Py_ssize_t length_ = 0;
};

Py_ssize_t first_difference(const int64_t* a, const int64_t* b, Py_ssize_t length) {
    // memcmp over blocks finds the differing block fast; a scan then finds the element.
    constexpr Py_ssize_t kBlock = 32;
    Py_ssize_t i = 0;
    while (i + kBlock <= length && std::memcmp(a + i, b + i, kBlock * sizeof(int64_t)) == 0) {
        i += kBlock;
    }
    while (i < length && a[i] == b[i]) {
        ++i;
    }
    return i;
}

// common_prefix_length(a, a_start, b, b_start, length): how many of the `length` items from
// a[a_start:] and b[b_start:] agree before the first difference. Same contract as
// radix_core.key.python_common_prefix_length; NotImplemented unless both are int64 buffers.
PyObject* common_prefix_length(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "common_prefix_length expected 5 arguments, got %zd", nargs);
        return nullptr;
    }
    Py_ssize_t offsets[3];
    const int offset_args[3] = {1, 3, 4};
    for (int k = 0; k < 3; ++k) {
        offsets[k] = PyNumber_AsSsize_t(args[offset_args[k]], PyExc_OverflowError);
        if (offsets[k] == -1 && PyErr_Occurred()) {
            return nullptr;
        }
    }
    const Py_ssize_t a_start = offsets[0], b_start = offsets[1], length = offsets[2];
    try {
        Int64Buffer a(args[0]);
        Int64Buffer b(args[2]);
        if (a.data() == nullptr || b.data() == nullptr) {
            Py_RETURN_NOTIMPLEMENTED;
        }
        if (a_start < 0 || b_start < 0 || length < 0 || length > a.length() - a_start ||
            length > b.length() - b_start) {
            PyErr_SetString(PyExc_IndexError, "common_prefix_length range is outside a token buffer");
            return nullptr;
        }
        return PyLong_FromSsize_t(first_difference(a.data() + a_start, b.data() + b_start, length));
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
}

PyMethodDef raw_methods[] = {
    {"convert_to_bigram_key", convert_to_bigram_key, METH_O,
     "convert_to_bigram_key(tokens)\n--\n\n"
     "[t0, t1, t2] -> [(t0, t1), (t1, t2)] for an exact list or tuple (NotImplemented otherwise)."},
    {"common_prefix_length", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(common_prefix_length)),
     METH_FASTCALL,
     "common_prefix_length(a, a_start, b, b_start, length)\n--\n\n"
     "Items of a[a_start:] and b[b_start:] that agree before the first difference, among `length`."},
    {nullptr, nullptr, 0, nullptr},
};


}  // namespace

PYBIND11_MODULE(_kernels, m) {
    m.doc() = "radix-native kernels; use them through radix_core, which checks KERNEL_ABI first.";
    m.attr("__version__") = RADIX_NATIVE_VERSION;
    m.attr("KERNEL_ABI") = kKernelAbi;
    if (PyModule_AddFunctions(m.ptr(), raw_methods) != 0) {
        throw py::error_already_set();
    }
    m.def("pack_bigram_keys", &pack_bigram_keys, py::arg("tokens"), py::arg("out") = py::none(),
          "(t[i] << 32) | t[i + 1] for adjacent token ids in [0, 2**31) from a list, tuple or "
          "int64/int32 buffer, into `out` (an int64 buffer) or a new array('q').");
}
