// Native kernels for radix-core.
//
// Every kernel here has a pure-Python reference in radix_core; results must be identical to it.
// A kernel answers NotImplemented for inputs it does not handle, so that the dispatcher in
// radix_core runs the reference instead (that is not a failure of the native backend).
//
// Two rules keep a kernel from ever being the reason a process leaves native, or crashes:
// - A kernel runs no Python code. It reads exact ints only (anything else, whose __index__ or
//   __class__ could run code or lie, goes to the reference), and pauses the cyclic GC while it
//   builds objects, so no finalizer can change its input half-way. What it computes is a
//   function of its input as it was when called, exactly like the reference.
// - No C++ object with a destructor holds Python state. CPython ends a daemon thread that wakes
//   up after interpreter shutdown with pthread_exit, which unwinds the thread's C++ frames and
//   runs their destructors without the GIL; plain C-style cleanup leaves nothing to run.
// The kernels are raw METH_O / METH_FASTCALL functions added to the pybind11 module, which is
// only its container: pybind11's argument machinery costs more than a short conversion.

#include <pybind11/pybind11.h>

#include <Python.h>
#include <structmember.h>  // T_OBJECT_EX: how a __slots__ member is stored

#include <cstdint>
#include <cstring>

namespace py = pybind11;

namespace {

// Bumped whenever a kernel's signature or contract changes; radix_core refuses other values.
constexpr int kKernelAbi = 4;

constexpr int64_t kPackedTokenLimit = int64_t{1} << 31;

// array('q', [0]), made at import: repeated to allocate a packed result without running Python.
PyObject* g_one_zero_int64 = nullptr;
// array.array, a heap type whose buffer export is C (see exports_without_python).
PyTypeObject* g_array_type = nullptr;

// Whether getting `obj`'s buffer runs only C code: a static type's does, and array.array's; a
// class statement's may not (Python 3.12's __buffer__), and such a class could change the input.
bool exports_without_python(PyObject* obj) {
    PyTypeObject* type = Py_TYPE(obj);
    return type == g_array_type || !PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE);
}

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
// Same contract as radix_core.bigram.python_convert_to_bigram_key, which decides whenever the
// first item is neither an exact int nor a tuple (isinstance may consult a spoofed __class__).
PyObject* convert_to_bigram_key(PyObject* /*module*/, PyObject* tokens) {
    if (!PyList_CheckExact(tokens) && !PyTuple_CheckExact(tokens)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    if (n == 0) {
        return PyList_New(0);
    }
    PyObject* const head = PySequence_Fast_GET_ITEM(tokens, 0);
    if (PyTuple_Check(head)) {
        Py_INCREF(tokens);
        return tokens;
    }
    if (!PyLong_CheckExact(head)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (n < 2) {
        return PyList_New(0);
    }
    const int gc_was_enabled = PyGC_Disable();  // nothing else may run while `tokens` is read
    PyObject* result = PyList_New(n - 1);
    for (Py_ssize_t i = 0; result != nullptr && i < n - 1; ++i) {
        PyObject* pair = PyTuple_New(2);
        if (pair == nullptr) {
            Py_CLEAR(result);
            break;
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
    if (gc_was_enabled) {
        PyGC_Enable();
    }
    return result;
}

// The accepted token buffer formats, as radix_core.bigram._TOKEN_BUFFER_FORMATS.
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

bool is_int64_buffer(const Py_buffer& view) {
    return view.ndim == 1 && view.itemsize == 8 && is_token_buffer_format(view.format, 8);
}

PyObject* raise_token_out_of_range() {
    PyErr_SetString(PyExc_ValueError, "token ids must be in [0, 2**31) to be packed into int64 bigram keys");
    return nullptr;
}

// The bytes [lo, hi) a 1-D buffer's items span (strides may be negative).
void item_span(const Py_buffer& view, Py_ssize_t count, const char** lo, const char** hi) {
    const char* base = static_cast<const char*>(view.buf);
    const Py_ssize_t stride = view.strides != nullptr ? view.strides[0] : view.itemsize;
    const Py_ssize_t reach = count > 0 ? (count - 1) * stride : 0;
    *lo = reach < 0 ? base + reach : base;
    *hi = (reach < 0 ? base : base + reach) + view.itemsize;
}

bool overlaps(const char* lo_a, const char* hi_a, const char* lo_b, const char* hi_b) {
    return lo_a < hi_b && lo_b < hi_a;
}

// (first << 32) | second in unsigned arithmetic: defined for any ids, out-of-range ones included
// (the callers reject those); the bits are the same for ids in [0, 2**31).
inline int64_t pack(int64_t first, int64_t second) {
    return static_cast<int64_t>((static_cast<uint64_t>(first) << 32) | static_cast<uint64_t>(second));
}

inline bool in_packed_range(int64_t id) { return (static_cast<uint64_t>(id) >> 31) == 0; }

template <typename Int>
inline int64_t load(const char* base, Py_ssize_t i, Py_ssize_t stride) {
    Int value;
    std::memcpy(&value, base + i * stride, sizeof value);
    return value;
}

// Packs `count` ids read from a 1-D buffer into dst[0 .. count-1); false if any id is out of range
// (dst is then partly written, as the reference allows on error). Unsigned arithmetic throughout,
// so an out-of-range id is no undefined behaviour; it is caught by OR-ing every id's bits from
// bit 31 up (negatives too): no branch, so the contiguous loop vectorizes.
template <typename Int>
inline uint64_t pack_run(const char* base, Py_ssize_t count, Py_ssize_t stride, int64_t* dst) {
    uint64_t high_bits = 0;
    for (Py_ssize_t i = 0; i + 1 < count; ++i) {
        const int64_t first = load<Int>(base, i, stride);
        high_bits |= static_cast<uint64_t>(first) >> 31;
        dst[i] = pack(first, load<Int>(base, i + 1, stride));
    }
    return high_bits;
}

template <typename Int>
bool pack_buffer(const char* base, Py_ssize_t count, Py_ssize_t stride, int64_t* dst) {
    if (count == 0) {
        return true;
    }
    uint64_t high_bits = static_cast<uint64_t>(load<Int>(base, count - 1, stride)) >> 31;
    high_bits |= stride == static_cast<Py_ssize_t>(sizeof(Int)) ? pack_run<Int>(base, count, sizeof(Int), dst)
                                                                 : pack_run<Int>(base, count, stride, dst);
    return high_bits == 0;
}

// Writable int64 storage for `count` keys: the caller's `out` (a writable, C-contiguous 1-D int64
// buffer not overlapping [avoid_lo, avoid_hi)) or a new array('q'). Returns a new reference to the
// object to return with `*view` held, nullptr with an error set, or Py_NotImplemented (new
// reference, nothing held) when the reference must decide.
PyObject* packed_output(PyObject* out, Py_ssize_t count, Py_buffer* view, const char* avoid_lo, const char* avoid_hi) {
    PyObject* owner;
    if (out == nullptr || out == Py_None) {
        owner = PySequence_Repeat(g_one_zero_int64, count);
        if (owner == nullptr) {
            return nullptr;
        }
    } else {
        if (!exports_without_python(out)) {
            Py_RETURN_NOTIMPLEMENTED;
        }
        owner = out;
        Py_INCREF(owner);
    }
    if (PyObject_GetBuffer(owner, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        Py_DECREF(owner);
        Py_RETURN_NOTIMPLEMENTED;
    }
    const char* lo = static_cast<const char*>(view->buf);
    if (!is_int64_buffer(*view) || view->len / 8 < count || overlaps(lo, lo + view->len, avoid_lo, avoid_hi)) {
        PyBuffer_Release(view);
        Py_DECREF(owner);
        Py_RETURN_NOTIMPLEMENTED;
    }
    return owner;
}

PyObject* pack_tokens(PyObject* tokens, PyObject* out);

// pack_bigram_keys(tokens, out=None), positional (radix_core binds keywords): (t[i] << 32) | t[i+1].
// Lists and tuples of exact ints, and 1-D int64/int32 buffers, natively; the rest, and an `out`
// the kernel cannot write safely (overlapping the input, say), by the reference, before anything
// is written. On a range error `out` is partly written, as the reference allows. The cyclic GC is
// paused: allocating the result must not let a finalizer change `tokens`.
PyObject* pack_bigram_keys(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const int gc_was_enabled = PyGC_Disable();
    PyObject* result = pack_tokens(args[0], nargs == 2 ? args[1] : nullptr);
    if (gc_was_enabled) {
        PyGC_Enable();
    }
    return result;
}

PyObject* pack_tokens(PyObject* tokens, PyObject* out) {
    Py_buffer dst_view;
    if (PyList_CheckExact(tokens) || PyTuple_CheckExact(tokens)) {
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
        PyObject* owner = packed_output(out, n > 1 ? n - 1 : 0, &dst_view, nullptr, nullptr);
        if (owner == nullptr || owner == Py_NotImplemented) {
            return owner;
        }
        int64_t* dst = static_cast<int64_t*>(dst_view.buf);
        PyObject* failed = nullptr;  // NotImplemented, or nullptr with an error set, or stays nullptr
        bool ok = true;
        int64_t previous = 0;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PySequence_Fast_GET_ITEM(tokens, i);
            if (!PyLong_CheckExact(item)) {  // its __index__ could run code: the reference decides
                failed = Py_NewRef(Py_NotImplemented);
                ok = false;
                break;
            }
            int overflow = 0;
            const long long id = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow != 0 || !in_packed_range(id)) {
                raise_token_out_of_range();
                ok = false;
                break;
            }
            if (i > 0) {
                dst[i - 1] = pack(previous, id);
            }
            previous = id;
        }
        PyBuffer_Release(&dst_view);
        if (!ok) {
            Py_DECREF(owner);
            return failed;
        }
        return owner;
    }
    if (!PyObject_CheckBuffer(tokens) || !exports_without_python(tokens)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_buffer src;
    if (PyObject_GetBuffer(tokens, &src, PyBUF_FORMAT | PyBUF_STRIDES) != 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (src.ndim != 1 || !is_token_buffer_format(src.format, src.itemsize)) {
        PyBuffer_Release(&src);
        Py_RETURN_NOTIMPLEMENTED;
    }
    const Py_ssize_t count = src.shape[0];
    const Py_ssize_t stride = src.strides[0];
    const char* base = static_cast<const char*>(src.buf);
    const char *lo, *hi;
    item_span(src, count, &lo, &hi);
    PyObject* owner = packed_output(out, count > 1 ? count - 1 : 0, &dst_view, lo, hi);
    if (owner != nullptr && owner != Py_NotImplemented) {
        int64_t* dst = static_cast<int64_t*>(dst_view.buf);
        const bool in_range = src.itemsize == 8 ? pack_buffer<int64_t>(base, count, stride, dst)
                                                : pack_buffer<int32_t>(base, count, stride, dst);
        PyBuffer_Release(&dst_view);
        if (!in_range) {
            Py_SETREF(owner, raise_token_out_of_range());
        }
    }
    PyBuffer_Release(&src);
    return owner;
}

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

// An index argument as the reference reads it (operator.index); a value outside Py_ssize_t is
// outside every buffer, so it becomes -1, which the range check turns into the reference's IndexError.
bool read_index(PyObject* arg, Py_ssize_t* value) {
    PyObject* index = PyNumber_Index(arg);
    if (index == nullptr) {
        return false;
    }
    *value = PyLong_AsSsize_t(index);
    Py_DECREF(index);
    if (*value == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return false;
        }
        PyErr_Clear();
    }
    return true;
}

// common_prefix_length(a, a_start, b, b_start, length): how many of the `length` items from
// a[a_start:] and b[b_start:] agree before the first difference. Same contract as
// radix_core.key.python_common_prefix_length; NotImplemented unless both are 1-D contiguous int64
// buffers. The indices are read first, so the buffers seen are the ones compared.
PyObject* common_prefix_length(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 5) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_ssize_t a_start, b_start, length;
    if (!read_index(args[1], &a_start) || !read_index(args[3], &b_start) || !read_index(args[4], &length)) {
        return nullptr;
    }
    Py_buffer a, b;
    for (PyObject* tokens : {args[0], args[2]}) {
        if (!PyObject_CheckBuffer(tokens) || !exports_without_python(tokens)) {
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    if (PyObject_GetBuffer(args[0], &a, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (PyObject_GetBuffer(args[2], &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&a);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject* result;
    if (!is_int64_buffer(a) || !is_int64_buffer(b)) {
        result = Py_NewRef(Py_NotImplemented);
    } else if (a_start < 0 || b_start < 0 || length < 0 || length > a.len / 8 - a_start ||
               length > b.len / 8 - b_start) {
        PyErr_SetString(PyExc_IndexError, "common_prefix_length range is outside a token buffer");
        result = nullptr;
    } else {
        const int64_t* a_items = static_cast<const int64_t*>(a.buf) + a_start;
        const int64_t* b_items = static_cast<const int64_t*>(b.buf) + b_start;
        result = PyLong_FromSsize_t(first_difference(a_items, b_items, length));
    }
    PyBuffer_Release(&b);
    PyBuffer_Release(&a);
    return result;
}

// ----- descend: one walk step after another down radix_core's tree, in one call ------------------

// Where the attributes descend reads sit in instances of one class, learnt once per class: each must
// be a __slots__ member (a member descriptor of the class, whose metaclass is `type`), so that
// reading it is a load from the object and runs no Python code, exactly as getattr would find it.
constexpr int kMaxSlots = 5;
struct SlotLayout {
    PyTypeObject* type;  // a strong reference, kept for the process's life once learnt
    Py_ssize_t offsets[kMaxSlots];
};
const char* const kNodeSlots[] = {"children", "key"};  // radix_core.cache.TreeNode
const char* const kKeySlots[] = {"_tokens", "_start", "_stop", "extra_key", "is_bigram"};  // RadixKey
SlotLayout g_node_layout = {nullptr, {}};
SlotLayout g_key_layout = {nullptr, {}};

bool knows_layout(PyTypeObject* type, const char* const* names, int count, SlotLayout* layout) {
    if (layout->type == type) {
        return true;
    }
    if (!Py_IS_TYPE(reinterpret_cast<PyObject*>(type), &PyType_Type) || type->tp_getattro != PyObject_GenericGetAttr) {
        return false;
    }
    Py_ssize_t offsets[kMaxSlots];
    for (int i = 0; i < count; ++i) {
        PyObject* found = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), names[i]);
        if (found == nullptr) {
            PyErr_Clear();
            return false;
        }
        const bool is_slot = Py_IS_TYPE(found, &PyMemberDescr_Type) &&
                             reinterpret_cast<PyMemberDescrObject*>(found)->d_member->type == T_OBJECT_EX;
        if (is_slot) {
            offsets[i] = reinterpret_cast<PyMemberDescrObject*>(found)->d_member->offset;
        }
        Py_DECREF(found);
        if (!is_slot) {
            return false;
        }
    }
    Py_INCREF(type);  // the old type's reference is kept: releasing it could run a finalizer
    layout->type = type;
    std::memcpy(layout->offsets, offsets, sizeof offsets);
    return true;
}

// The object in slot `index` (borrowed; nullptr when unset, where getattr would raise).
inline PyObject* slot(PyObject* obj, const SlotLayout& layout, int index) {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + layout.offsets[index]);
}

// A namespace whose hash and equality are C code: None, an exact str, int or bytes, or a tuple of those.
bool is_plain_namespace(PyObject* ns) {
    auto plain = [](PyObject* item) {
        return item == Py_None || PyUnicode_CheckExact(item) || PyLong_CheckExact(item) || PyBytes_CheckExact(item);
    };
    if (plain(ns)) {
        return true;
    }
    if (!PyTuple_CheckExact(ns)) {
        return false;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ns); ++i) {
        if (!plain(PyTuple_GET_ITEM(ns, i))) {
            return false;
        }
    }
    return true;
}

// A RadixKey as descend reads it: its raw tokens [start, stop) of an array('q') it holds exported.
struct KeyView {
    Py_buffer buffer;
    const int64_t* items;  // the first raw token of the key
    Py_ssize_t raw;        // raw tokens
    Py_ssize_t units;      // len(key): raw tokens, or bigrams
    PyObject* extra_key;   // borrowed
    bool is_bigram;
};

// 1: `view` holds the key's tokens (release them); 0: a key descend leaves to the reference.
int read_key(PyObject* key, KeyView* view) {
    if (!knows_layout(Py_TYPE(key), kKeySlots, 5, &g_key_layout)) {
        return 0;
    }
    PyObject* tokens = slot(key, g_key_layout, 0);
    PyObject* start = slot(key, g_key_layout, 1);
    PyObject* stop = slot(key, g_key_layout, 2);
    PyObject* extra_key = slot(key, g_key_layout, 3);
    PyObject* is_bigram = slot(key, g_key_layout, 4);
    if (tokens == nullptr || !Py_IS_TYPE(tokens, g_array_type) || start == nullptr || !PyLong_CheckExact(start) ||
        stop == nullptr || !PyLong_CheckExact(stop) || extra_key == nullptr || !is_plain_namespace(extra_key) ||
        (is_bigram != Py_True && is_bigram != Py_False)) {
        return 0;
    }
    const Py_ssize_t first = PyLong_AsSsize_t(start);
    const Py_ssize_t last = PyLong_AsSsize_t(stop);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_GetBuffer(tokens, &view->buffer, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (!is_int64_buffer(view->buffer) || first < 0 || first > last || last > view->buffer.len / 8) {
        PyBuffer_Release(&view->buffer);
        return 0;
    }
    view->items = static_cast<const int64_t*>(view->buffer.buf) + first;
    view->raw = last - first;
    view->is_bigram = is_bigram == Py_True;
    view->units = view->is_bigram ? (view->raw > 1 ? view->raw - 1 : 0) : view->raw;
    view->extra_key = extra_key;
    return 1;
}

PyObject* new_pair(const int64_t* items) {
    PyObject* first = PyLong_FromLongLong(items[0]);
    PyObject* second = first == nullptr ? nullptr : PyLong_FromLongLong(items[1]);
    PyObject* pair = second == nullptr ? nullptr : PyTuple_Pack(2, first, second);
    Py_XDECREF(first);
    Py_XDECREF(second);
    return pair;
}

// RadixKey.child_key_at: the first `page` units from `items`, namespaced by `extra_key` unless None.
PyObject* new_child_key(const int64_t* items, Py_ssize_t page, bool is_bigram, PyObject* extra_key) {
    PyObject* plain;
    if (page == 1) {
        plain = is_bigram ? new_pair(items) : PyLong_FromLongLong(items[0]);
    } else {
        plain = PyTuple_New(page);
        for (Py_ssize_t i = 0; plain != nullptr && i < page; ++i) {
            PyObject* unit = is_bigram ? new_pair(items + i) : PyLong_FromLongLong(items[i]);
            if (unit == nullptr) {
                Py_CLEAR(plain);
                break;
            }
            PyTuple_SET_ITEM(plain, i, unit);
        }
    }
    if (plain == nullptr || extra_key == Py_None) {
        return plain;
    }
    PyObject* namespaced = PyTuple_Pack(2, extra_key, plain);
    Py_DECREF(plain);
    return namespaced;
}

// How far the walk goes from `node` (already at unit `position` of `key`): appends each child it
// enters to `path` and the key position after it to `ends`. Returns 1 when done, 0 for a tree or
// key left to the reference, -1 with an exception set. Python code runs only if a dict lookup meets
// another namespace's child key of a class with its own __eq__ (a hash collision); everything the
// walk uses is held meanwhile, and the walk reads on from what it finds, as the reference would.
int walk(PyObject* node, const KeyView& key, Py_ssize_t position, Py_ssize_t page, PyObject* path, PyObject* ends) {
    while (position < key.units) {
        if (key.raw - position < page + key.is_bigram) {
            return 0;  // not a whole page left: the reference raises
        }
        PyObject* children = slot(node, g_node_layout, 0);
        if (children == nullptr || !PyDict_CheckExact(children)) {
            return 0;
        }
        PyObject* child_key = new_child_key(key.items + position, page, key.is_bigram, key.extra_key);
        if (child_key == nullptr) {
            return -1;
        }
        // The dict and the child are held: a hash collision with another namespace's child key may
        // run that namespace's __eq__, which could replace them.
        Py_INCREF(children);
        PyObject* child = PyDict_GetItemWithError(children, child_key);  // borrowed
        Py_DECREF(child_key);
        if (child == nullptr) {
            Py_DECREF(children);
            return PyErr_Occurred() ? -1 : 1;
        }
        const int held = PyList_Append(path, child);
        Py_DECREF(children);
        if (held != 0) {
            return -1;
        }
        if (!knows_layout(Py_TYPE(child), kNodeSlots, 2, &g_node_layout)) {
            return 0;
        }
        PyObject* child_radix_key = slot(child, g_node_layout, 1);
        KeyView edge;
        if (child_radix_key == nullptr || read_key(child_radix_key, &edge) == 0) {
            return 0;
        }
        // RadixKey._shared_units, with the edge's own reading of its tokens
        const Py_ssize_t rest = key.raw - position;
        Py_ssize_t shared = first_difference(edge.items, key.items + position, edge.raw < rest ? edge.raw : rest);
        if (edge.is_bigram) {
            shared = shared > 1 ? shared - 1 : 0;
        }
        shared -= shared % page;
        const Py_ssize_t edge_units = edge.units;
        PyBuffer_Release(&edge.buffer);
        position += shared;
        PyObject* end = PyLong_FromSsize_t(position);
        if (end == nullptr || PyList_Append(ends, end) != 0) {
            Py_XDECREF(end);
            return -1;
        }
        Py_DECREF(end);
        if (shared < edge_units) {
            return 1;
        }
        node = child;  // `path` holds it
    }
    return 1;
}

// descend(node, key, position, page_size): radix_core.cache.python_descend, natively (see there).
// NotImplemented for objects it does not know how to read without running Python code.
PyObject* descend(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyLong_CheckExact(args[2]) || !PyLong_CheckExact(args[3]) ||
        !knows_layout(Py_TYPE(args[0]), kNodeSlots, 2, &g_node_layout)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const Py_ssize_t position = PyLong_AsSsize_t(args[2]);
    const Py_ssize_t page = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    KeyView key;
    if (position < 0 || page < 1 || read_key(args[1], &key) == 0) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const int gc_was_enabled = PyGC_Disable();  // no finalizer may change the tree during the walk
    PyObject* result = nullptr;
    PyObject* path = PyList_New(0);
    PyObject* ends = PyList_New(0);
    if (path != nullptr && ends != nullptr) {
        const int done = walk(args[0], key, position, page, path, ends);
        if (done == 1) {
            result = PyTuple_Pack(2, path, ends);
        } else if (done == 0) {
            result = Py_NewRef(Py_NotImplemented);
        }
    }
    Py_XDECREF(path);
    Py_XDECREF(ends);
    PyBuffer_Release(&key.buffer);
    if (gc_was_enabled) {
        PyGC_Enable();
    }
    return result;
}

PyMethodDef raw_methods[] = {
    {"convert_to_bigram_key", convert_to_bigram_key, METH_O,
     "convert_to_bigram_key(tokens)\n--\n\n"
     "[t0, t1, t2] -> [(t0, t1), (t1, t2)] for an exact list or tuple (NotImplemented otherwise)."},
    {"pack_bigram_keys", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pack_bigram_keys)),
     METH_FASTCALL,
     "pack_bigram_keys(tokens, out=None, /)\n--\n\n"
     "(t[i] << 32) | t[i + 1] for adjacent token ids in [0, 2**31) from a list or tuple of ints or "
     "an int64/int32 buffer, into `out` (an int64 buffer) or a new array('q')."},
    {"common_prefix_length", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(common_prefix_length)),
     METH_FASTCALL,
     "common_prefix_length(a, a_start, b, b_start, length, /)\n--\n\n"
     "Items of a[a_start:] and b[b_start:] that agree before the first difference, among `length`."},
    {"descend", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(descend)), METH_FASTCALL,
     "descend(node, key, position, page_size, /)\n--\n\n"
     "The children a walk of key[position:] enters below node, and the key position after each."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PYBIND11_MODULE(_kernels, m) {
    m.doc() = "radix-native kernels; use them through radix_core, which checks KERNEL_ABI first.";
    m.attr("__version__") = RADIX_NATIVE_VERSION;
    m.attr("KERNEL_ABI") = kKernelAbi;
    py::object array_type = py::module_::import("array").attr("array");
    g_one_zero_int64 = array_type("q", py::make_tuple(0)).release().ptr();  // kept for the process's life
    g_array_type = reinterpret_cast<PyTypeObject*>(array_type.release().ptr());
    if (PyModule_AddFunctions(m.ptr(), raw_methods) != 0) {
        throw py::error_already_set();
    }
}
