// The radix tree itself, outside the Python object graph: use it through radix_core.
//
// The same tree as radix_core.RadixCache's Python one, operation by operation: the same splits,
// the same sizes, and the same eviction order (the heap holds the same entries in the same order,
// stamped the same way; times are the caller's, or read from the clock Python's time.monotonic
// reads, as the Python tree would read them). Nodes live in an
// arena, found again by (id, generation); children by one hash map keyed by the parent, the
// namespace and the first page of units. A node's key (its raw int64 tokens: k + 1 for k bigram
// units) is a window of the caller's array('q') or of a copy, and its values a window of a
// bytearray copy or of an array made for the tree (a part of at least half of one is shared, else
// copied), none of which Python's collector walks; eviction hands a node's values out as their
// store (a bytearray or that array). Nothing here calls back into Python, and a call makes
// Python objects, or lets go of them, only once the tree is whole again (an allocation may run a
// collection, and a collection finalizers).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Python.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// Bumped whenever the tree's interface or contract changes; radix_core refuses other values.
constexpr int kTreeAbi = 8;
constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kRoot = 0;

enum class Policy { kLru, kLfu, kFifo, kMru, kFilo, kPriority };

Policy policy_named(const std::string& name) {
    if (name == "lru") return Policy::kLru;
    if (name == "lfu") return Policy::kLfu;
    if (name == "fifo") return Policy::kFifo;
    if (name == "mru") return Policy::kMru;
    if (name == "filo") return Policy::kFilo;
    if (name == "priority") return Policy::kPriority;
    throw py::value_error("unknown eviction policy '" + name + "'; use one of: lru, lfu, fifo, mru, filo, priority");
}

// Where a node's int64 items live: a bytearray the tree made (a copy of values, or of a key's
// tokens), or the caller's own array('q') (key tokens, or values made for the tree), which the
// tree keeps a reference to, as the Python tree keeps the key's array (no copy). Neither is
// tracked by Python's collector.
// A borrowed array is never exported between calls (SGLang grows a request's array in place,
// which an export forbids), so its items are located again in each call that reads them; within
// a call no Python code runs that could move them. A store no span uses any more waits in
// released_stores() until the running call has left the tree whole (freeing is kept out of the
// middle of a change, with every other way of running Python).
struct Store {
    PyObject* owner = nullptr;      // the bytearray, or the borrowed array
    const int64_t* data = nullptr;  // owner's items (a borrowed array's: as located in call read_in)
    size_t size = 0;                // owner's items when the store was made (the half rule's measure)
    size_t refs = 0;
    bool borrowed = false;
    size_t needed = 0;              // borrowed: the items its spans read (the array must keep them)
    uint64_t read_in = 0;
};

uint64_t& running_call() {  // guarded by the GIL, as every tree call holds it
    static uint64_t call = 0;
    return call;
}

// A tree call that may read key tokens begins: borrowed arrays are located again when read.
void begin_call() { running_call() += 1; }

// A store's items, locating a borrowed array's in this call if not done yet. ValueError where the
// caller shrank the array below the tokens the tree holds (a key it gave may not lose tokens).
const int64_t* items_of(Store* store) {
    if (store->borrowed && store->read_in != running_call()) {
        Py_buffer view;
        if (PyObject_GetBuffer(store->owner, &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
        const int64_t* data = static_cast<const int64_t*>(view.buf);
        size_t items = static_cast<size_t>(view.len) / sizeof(int64_t);
        PyBuffer_Release(&view);
        if (items < store->needed) {
            throw py::value_error("a key array given to the cache lost tokens it holds (" + std::to_string(items) +
                                  " left of " + std::to_string(store->needed) + ")");
        }
        store->data = data;
        store->read_in = running_call();
    }
    return store->data;
}

std::vector<Store*>& released_stores() {  // guarded by the GIL, as every tree call holds it
    static std::vector<Store*> released;
    return released;
}

// Lets go of the stores no span uses; call only where no tree is in the middle of a change.
void free_released_stores() {
    std::vector<Store*> now;
    now.swap(released_stores());
    for (Store* store : now) {
        Py_DECREF(store->owner);
        delete store;
    }
}

// A store owning `bytes`, a new bytearray of `count` int64 items.
Store* owning_store(PyObject* bytes, size_t count) {
    Store* store = new Store;
    store->owner = bytes;
    store->data = reinterpret_cast<const int64_t*>(PyByteArray_AS_STRING(bytes));
    store->size = count;
    return store;
}

// A new bytearray store holding a copy of `count` items (MemoryError leaves nothing behind).
Store* copied_store(const int64_t* from, size_t count) {
    PyObject* bytes = PyByteArray_FromStringAndSize(reinterpret_cast<const char*>(from),
                                                    static_cast<Py_ssize_t>(count * sizeof(int64_t)));
    if (bytes == nullptr) throw py::error_already_set();
    return owning_store(bytes, count);
}

// A store borrowing the caller's array of `items` int64 tokens, its spans reading the first `needed`.
// An array.array refers to nothing but its type, so it can never be part of a reference cycle:
// the tree takes it off the collector's list (as CPython does with tuples and dicts that cannot
// be), so a full collection does not walk one array per cached request.
Store* borrowed_store(PyObject* array, size_t items, size_t needed) {
    Store* store = new Store;
    if (PyObject_GC_IsTracked(array)) PyObject_GC_UnTrack(array);
    Py_INCREF(array);
    store->owner = array;
    store->size = items;
    store->borrowed = true;
    store->needed = needed;
    return store;
}

// Whether the tree may keep a reference to `tokens` instead of a copy: an array.array (int64,
// checked by the caller), which holds no Python objects and which callers only ever grow.
bool borrowable(PyObject* tokens) { return std::strcmp(Py_TYPE(tokens)->tp_name, "array.array") == 0; }

// A node's tokens or values: a window [start, start + length) of a store, counted among its users.
class Span {
  public:
    Span() = default;
    Span(Store* store, size_t start, size_t length) : store_(store), start_(start), length_(length) {
        store_->refs += 1;
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    Span(Span&& other) noexcept : store_(other.store_), start_(other.start_), length_(other.length_) {
        other.store_ = nullptr;
        other.start_ = other.length_ = 0;
    }
    Span& operator=(Span&& other) noexcept {
        if (this != &other) {
            release();
            store_ = other.store_;
            start_ = other.start_;
            length_ = other.length_;
            other.store_ = nullptr;
            other.start_ = other.length_ = 0;
        }
        return *this;
    }
    ~Span() { release(); }

    const int64_t* data() const { return store_ == nullptr ? nullptr : items_of(store_) + start_; }
    size_t size() const { return length_; }
    const int64_t* begin() const { return data(); }
    const int64_t* end() const { return data() + length_; }
    const Store* store() const { return store_; }  // values' only
    size_t start() const { return start_; }

    // Items [from, from + count) as a span of their own: this span's store where they are at
    // least half of it, else a copy (no store is kept for less than half its items: the Python
    // tree's rule for keys and values). May raise MemoryError; changes nothing.
    Span part(size_t from, size_t count) const {
        if (2 * count >= store_->size) return Span(store_, start_ + from, count);
        return Span(copied_store(data() + from, count), 0, count);
    }

    void release() {
        if (store_ != nullptr && --store_->refs == 0) released_stores().push_back(store_);
        store_ = nullptr;
        start_ = length_ = 0;
    }

  private:
    Store* store_ = nullptr;
    size_t start_ = 0;
    size_t length_ = 0;
};

struct Node {
    uint32_t parent = kNone;
    uint32_t first_child = kNone;
    uint32_t next_sibling = kNone;
    uint32_t prev_sibling = kNone;
    uint32_t child_count = 0;
    uint32_t generation = 0;
    bool alive = false;
    int64_t ns = 0;                // the namespace (extra_key) number the caller gave
    Span tokens;                   // raw tokens: units + 1 in bigram mode (none for the root)
    Span values;                   // one per unit
    int64_t lock_ref = 0;
    int64_t hit_count = 0;
    int64_t priority = 0;
    double last_access = 0.0;
    double creation = 0.0;
    int64_t heap_stamp = -1;
};

// Python's heap entry (policy key, stamp, node): the key as (major, minor) covers every policy.
struct HeapEntry {
    int64_t major;
    double minor;
    int64_t stamp;
    uint32_t id;
    uint32_t generation;
};

bool evicted_later(const HeapEntry& a, const HeapEntry& b) {  // std heaps keep the largest on top
    return std::tie(a.major, a.minor, a.stamp) > std::tie(b.major, b.minor, b.stamp);
}

// A 1-D C-contiguous int64 buffer, checked; `info` must outlive the view (it holds the buffer).
struct Int64View {
    const int64_t* data;
    size_t size;
};

Int64View int64_view(const py::buffer_info& info, const char* what) {
    if (info.ndim != 1 || info.itemsize != 8 || (info.shape[0] > 1 && info.strides[0] != 8) ||
        (info.format != "q" && info.format != "l" && info.format != "<q" && info.format != "=q")) {
        throw py::type_error(std::string(what) + " must be a 1-D contiguous int64 buffer (array('q'))");
    }
    return {static_cast<const int64_t*>(info.ptr), static_cast<size_t>(info.shape[0])};
}

// Values as given: a 1-D C-contiguous buffer of int64 or int32 items (int32 widened as the tree
// copies them: SGLang's KV index rows are int32, and one widening copy is all a node needs).
struct ValuesView {
    const void* data;
    size_t size;
    bool narrow;  // int32 items
};

ValuesView values_view(const py::buffer_info& info) {
    bool narrow = info.itemsize == 4 && (info.format == "i" || info.format == "<i" || info.format == "=i");
    if (!narrow) {
        Int64View wide = int64_view(info, "values");  // raises for anything else
        return {wide.data, wide.size, false};
    }
    if (info.ndim != 1 || (info.shape[0] > 1 && info.strides[0] != 4)) {
        throw py::type_error("values must be a 1-D contiguous int64 or int32 buffer");
    }
    return {info.ptr, static_cast<size_t>(info.shape[0]), true};
}

// Values given as memory the caller holds for the call: (address, items, itemsize 8 or 4), which
// saves a CPU tensor a buffer object of its own (radix_core passes a tensor's data_ptr()); else a
// buffer, read as values_view reads it. `held` keeps the buffer for the call.
ValuesView given_values(const py::object& values, py::buffer_info& held) {
    if (!PyTuple_Check(values.ptr())) {
        if (!PyObject_CheckBuffer(values.ptr())) {
            throw py::type_error("values must be a 1-D contiguous int64 or int32 buffer, or (address, items, itemsize)");
        }
        held = py::reinterpret_borrow<py::buffer>(values).request();
        return values_view(held);
    }
    std::tuple<uintptr_t, int64_t, int64_t> memory;
    try {
        memory = values.cast<std::tuple<uintptr_t, int64_t, int64_t>>();
    } catch (const py::cast_error&) {
        throw py::type_error("values as memory must be a tuple of three ints: (address, items, itemsize)");
    }
    auto [address, items, itemsize] = memory;
    if (items < 0 || (itemsize != 8 && itemsize != 4) || (items > 0 && address == 0)) {
        throw py::value_error("values as memory must be (address, items >= 0, itemsize 8 or 4)");
    }
    return {reinterpret_cast<const void*>(address), static_cast<size_t>(items), itemsize == 4};
}

// A new bytearray store of items [from, from + count) of `values` as int64 (MemoryError leaves
// nothing behind).
Store* copied_values(const ValuesView& values, size_t from, size_t count) {
    if (!values.narrow) return copied_store(static_cast<const int64_t*>(values.data) + from, count);
    PyObject* bytes = PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * sizeof(int64_t)));
    if (bytes == nullptr) throw py::error_already_set();
    int64_t* to = reinterpret_cast<int64_t*>(PyByteArray_AS_STRING(bytes));
    const int32_t* source = static_cast<const int32_t*>(values.data) + from;
    for (size_t i = 0; i < count; ++i) to[i] = source[i];
    return owning_store(bytes, count);
}

py::object int64_bytes(const int64_t* values, size_t count) {
    PyObject* out = PyByteArray_FromStringAndSize(reinterpret_cast<const char*>(values),
                                                  static_cast<Py_ssize_t>(count * sizeof(int64_t)));
    if (out == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(out);
}

// Raw tokens [start, stop) of a key buffer (stop -1: its end); ValueError outside it.
Int64View window(const Int64View& all, int64_t start, int64_t stop) {
    int64_t size = static_cast<int64_t>(all.size);
    if (stop < 0) stop = size;
    if (start < 0 || start > stop || stop > size) {
        throw py::value_error("key window [" + std::to_string(start) + ", " + std::to_string(stop) +
                              ") is outside a buffer of " + std::to_string(size) + " tokens");
    }
    return {all.data + start, static_cast<size_t>(stop - start)};
}

class Tree {
  public:
    Tree(int64_t page_size, bool bigram, const std::string& policy)
        : page_(page_size),
          bigram_(bigram ? 1 : 0),
          width_(static_cast<size_t>(page_size) + bigram_),
          policy_(policy_named(policy)) {
        if (page_size < 1) throw py::value_error("page_size must be a positive int");
        reset();
    }

    ~Tree() {
        nodes_.clear();
        taken_.clear();
        free_released_stores();
    }

    void reset() {
        nodes_.clear();
        nodes_.emplace_back();
        free_.clear();
        namespace_nodes_.clear();
        children_.clear();
        heap_.clear();
        Node& root = nodes_[kRoot];
        root.alive = true;
        root.lock_ref = 1;
        root.priority = INT64_MIN + 1;  // -sys.maxsize
        evictable_ = protected_ = 0;
        node_count_ = 0;
        next_stamp_ = 0;
        free_released_stores();
    }

    // (prefix units, last node id, its generation, the matched values as int64 bytes, or None
    // without `values`: a caller that reads them later by path, as SGLang does, skips the copy)
    py::tuple match(const py::buffer& tokens, int64_t ns, const py::object& times, int64_t key_start, int64_t key_stop,
                    bool values) {
        begin_call();
        py::buffer_info held = tokens.request();
        Int64View key = window(int64_view(held, "tokens"), key_start, key_stop);
        py::buffer_info held_times;
        double now = start_clock(read_times(times, held_times));
        size_t units = aligned_units(key.size);
        splits_.clear();
        nodes_[kRoot].last_access = now;
        descend(kRoot, key, ns, 0, units);
        if (path_.empty()) {
            return py::make_tuple(0, kRoot, nodes_[kRoot].generation, values ? int64_bytes(nullptr, 0) : py::none());
        }
        enter(0, now);
        uint32_t last = path_.back();
        reprioritize(last);
        py::object joined = values ? joined_values(path_.begin(), path_.end()) : py::none();
        py::tuple answer = py::make_tuple(ends_.back(), last, nodes_[last].generation, joined);
        free_released_stores();
        return answer;
    }

    // (units already cached, last node id, its generation): RadixCache.insert. values[i] (int64,
    // or int32 kept as int64) is the value of unit value_offset + i; known_path (a node id and
    // generation, or kNone) is a node whose path spells the key's first units; split_at (or -1) a
    // unit where the new part is cut; keep_values: the values are an array the caller made for
    // this call and never writes, which the tree may keep instead of copying. prefix_priority (or
    // None): then the key's first split_at units (all of it if fewer) are inserted again at
    // that priority, as a second insert of them (following this one's last node, counting no
    // hit) reading prefix_times would (None: the clock): SGLang's checkpoint inserts the prompt
    // again, so that eviction drops the output first. The answer is this insert's.
    py::tuple insert(const py::buffer& tokens, int64_t ns, const py::object& values, int64_t priority,
                     int64_t inserted_len, const py::object& times, int64_t value_offset, uint32_t known_path,
                     uint32_t known_generation, int64_t split_at, int64_t key_start, int64_t key_stop,
                     bool keep_values, std::optional<int64_t> prefix_priority, const py::object& prefix_times) {
        begin_call();
        py::buffer_info held_key = tokens.request();
        py::buffer_info held_values;
        ValuesView value = given_values(values, held_values);
        py::buffer_info held_prefix_times;
        bool prefix_again = prefix_priority.has_value();
        if (prefix_again) read_times(prefix_times, held_prefix_times);
        py::buffer_info held_times;
        double now = start_clock(read_times(times, held_times));
        Int64View key = window(int64_view(held_key, "tokens"), key_start, key_stop);
        size_t units = aligned_units(key.size);
        if (value_offset < 0) throw py::value_error("value_offset must be >= 0");
        if (split_at >= 0 && split_at % page_ != 0) {
            throw py::value_error("split_at " + std::to_string(split_at) + " is not a multiple of the page size " +
                                  std::to_string(page_));
        }
        size_t offset = static_cast<size_t>(value_offset);
        if (units > offset && value.size < units - offset) {
            throw py::value_error("values must hold one item per unit of the key from value_offset on");
        }
        if (prefix_again && split_at <= 0) throw py::value_error("prefix_priority needs a split_at of at least a page");
        splits_.clear();
        Node& root = nodes_[kRoot];
        root.last_access = now;
        root.priority = std::max(root.priority, priority);
        uint32_t node = kRoot;
        size_t position = 0;
        if (known_path != kNone) follow(known_path, known_generation, units, now, priority, inserted_len, node, position);
        if (position < units) {
            descend(node, key, ns, position, units);
            if (!path_.empty()) {
                enter(position, now);
                pass_through(path_, ends_, priority, inserted_len);
                node = path_.back();
                position = ends_.back();
            }
        }
        if (position < units) {
            if (position < offset) {
                throw py::value_error("only " + std::to_string(position) + " units are cached, but the value starts at unit " +
                                      std::to_string(offset));
            }
            size_t cut = units;  // one piece, or two where split_at falls inside the new part
            if (split_at >= 0 && static_cast<size_t>(split_at) > position && static_cast<size_t>(split_at) < units) {
                cut = static_cast<size_t>(split_at);
            }
            // The pieces' keys and values, made before the tree changes (a copy may raise
            // MemoryError). A piece keeps the caller's token array itself where it is at least
            // half of it (the Python tree's rule), else a copy of its tokens.
            size_t array_items = static_cast<size_t>(held_key.shape[0]);
            size_t first_raw = static_cast<size_t>(key_start);  // the window's start in the array
            Store* borrowed = nullptr;  // one store for both pieces
            auto key_part = [&](size_t from, size_t stop) {
                size_t count = stop + bigram_ - from;
                if (2 * count < array_items || !borrowable(tokens.ptr())) {
                    return Span(copied_store(key.data + from, count), 0, count);
                }
                if (borrowed == nullptr) borrowed = borrowed_store(tokens.ptr(), array_items, first_raw + units + bigram_);
                return Span(borrowed, first_raw + from, count);
            };
            // Values are copied, unless the caller gives an int64 array it will never write again
            // (keep_values): then kept as keys are.
            Store* kept_values = nullptr;
            bool may_keep = keep_values && !value.narrow && held_values.ptr != nullptr && borrowable(values.ptr());
            auto value_part = [&](size_t from, size_t stop) {
                size_t count = stop - from;
                if (!may_keep || 2 * count < value.size) return Span(copied_values(value, from - offset, count), 0, count);
                if (kept_values == nullptr) kept_values = borrowed_store(values.ptr(), value.size, value.size);
                return Span(kept_values, from - offset, count);
            };
            Span upper_tokens = key_part(position, cut);
            Span upper_values = value_part(position, cut);
            Span lower_tokens = cut < units ? key_part(cut, units) : Span();
            Span lower_values = cut < units ? value_part(cut, units) : Span();
            // Made lowest first, as a later split of one node would make them; linked top down.
            uint32_t lower = cut < units ? make_node(kNone, ns, priority) : kNone;
            uint32_t upper = make_node(kNone, ns, priority);
            int64_t hit = static_cast<int64_t>(units) > inserted_len ? 1 : 0;
            fill(upper, std::move(upper_tokens), std::move(upper_values), hit);
            link(node, upper);
            node = upper;
            if (lower != kNone) {
                fill(lower, std::move(lower_tokens), std::move(lower_values), hit);
                link(upper, lower);
                node = lower;
            }
            node_count_ += lower != kNone ? 2 : 1;
            evictable_ += static_cast<int64_t>(units - position);
            reprioritize(node);
        }
        if (prefix_again) {  // all of it is cached now: a walk up the path just made, no new node
            double then = start_clock(held_prefix_times);
            Node& top = nodes_[kRoot];  // made nodes may have moved the arena: `root` is stale
            top.last_access = then;
            top.priority = std::max(top.priority, *prefix_priority);
            size_t prefix_units = std::min(units, static_cast<size_t>(split_at));
            uint32_t prefix_node = kRoot;
            size_t prefix_position = 0;
            follow(node, nodes_[node].generation, prefix_units, then, *prefix_priority,
                   static_cast<int64_t>(prefix_units), prefix_node, prefix_position);
        }
        py::tuple answer = py::make_tuple(position, node, nodes_[node].generation);
        free_released_stores();
        return answer;
    }

    // (units evicted, [(node id, units, namespace, tokens, values, start)] in eviction order):
    // a node's values are items [start, start + units) of `values`, a bytearray the tree no
    // longer writes (handed out, not copied); tokens are its raw tokens as int64 bytes if `keys`.
    py::tuple evict(int64_t num_units, bool keys) {
        if (num_units < 0) throw py::value_error("num_tokens must be >= 0");
        begin_call();
        int64_t evicted = 0;
        taken_.clear();
        taken_tokens_.clear();
        while (evicted < num_units) {
            uint32_t id = pop_evictable_leaf();
            if (id == kNone) break;
            Node& node = nodes_[id];
            int64_t units = static_cast<int64_t>(node.values.size());
            if (keys) taken_tokens_.insert(taken_tokens_.end(), node.tokens.begin(), node.tokens.end());
            taken_.push_back({id, units, node.ns, node.tokens.size(), std::move(node.values)});
            uint32_t parent = node.parent;
            unlink(id);
            evictable_ -= units;
            node_count_ -= 1;
            release(id);
            reprioritize(parent);
            evicted += units;
        }
        // Python objects only once the tree is whole again (an allocation may run a collection).
        py::list taken(taken_.size());
        size_t raw_at = 0;
        for (size_t i = 0; i < taken_.size(); ++i) {
            const Taken& t = taken_[i];
            py::object tokens = py::none();
            if (keys) {
                tokens = int64_bytes(taken_tokens_.data() + raw_at, t.raw);
                raw_at += t.raw;
            }
            py::object values = py::reinterpret_borrow<py::object>(t.values.store()->owner);
            taken[i] = py::make_tuple(t.id, t.units, t.ns, tokens, values, t.values.start());
        }
        taken_.clear();
        free_released_stores();
        return py::make_tuple(evicted, taken);
    }

    // The splits the last match or insert made, in order: (lower node id, new upper node id, units
    // the upper took, units the lower kept); the lower part keeps the node's id and generation.
    py::list last_splits() const {
        py::list out;
        for (const Split& split : splits_) out.append(py::make_tuple(split.lower, split.upper, split.at, split.kept));
        return out;
    }

    int64_t inc_lock_ref(uint32_t id, uint32_t generation) {
        path_to_root(id, generation, up_);
        return lock_path(up_, up_.size());
    }

    int64_t dec_lock_ref(uint32_t id, uint32_t generation) {
        locked_path_to_root(id, generation, up_);
        return unlock_path(up_, up_.size());
    }

    // RadixCache.move_lock: dec_lock_ref(old) then inc_lock_ref(new), touching only the nodes on
    // one of the two paths; nothing changes where either would raise.
    int64_t move_lock(uint32_t old_id, uint32_t old_generation, uint32_t new_id, uint32_t new_generation) {
        locked_path_to_root(old_id, old_generation, up_);
        path_to_root(new_id, new_generation, other_);
        size_t kept = 0;
        while (kept < up_.size() && kept < other_.size() && up_[up_.size() - 1 - kept] == other_[other_.size() - 1 - kept]) {
            ++kept;
        }
        return unlock_path(up_, up_.size() - kept) + lock_path(other_, other_.size() - kept);
    }

    // RadixCache.touch: the path to the node marked used now, as a match ending there would.
    void touch(uint32_t id, uint32_t generation, double now) {
        path_to_root(id, generation, up_);
        nodes_[kRoot].last_access = now;
        for (uint32_t ancestor : up_) nodes_[ancestor].last_access = now;
        reprioritize(id);
    }

    // Items [start, stop) of the values on the path from the root down to the node (stop < 0: to
    // its end; a range past it is cut to it).
    py::object path_values(uint32_t id, uint32_t generation, int64_t start, int64_t stop) {
        if (start < 0) throw py::value_error("start must be >= 0, not " + std::to_string(start));
        path_to_root(id, generation, up_);
        size_t to = stop < 0 ? SIZE_MAX : static_cast<size_t>(stop);
        return joined_values(up_.rbegin(), up_.rend(), static_cast<size_t>(start), to);
    }

    bool is_alive(uint32_t id, uint32_t generation) const {
        return id < nodes_.size() && nodes_[id].alive && nodes_[id].generation == generation;
    }

    // A node's state as the Python tree's TreeNode holds it, for handles and tests.
    py::dict node_state(uint32_t id, uint32_t generation) const {
        check_alive(id, generation);
        begin_call();
        const Node& node = nodes_[id];
        py::dict state;
        state["parent"] = node.parent == kNone ? py::object(py::none()) : py::object(py::int_(node.parent));
        state["parent_generation"] = node.parent == kNone ? 0 : nodes_[node.parent].generation;
        state["namespace"] = node.ns;
        state["tokens"] = int64_bytes(node.tokens.data(), node.tokens.size());
        state["values"] = int64_bytes(node.values.data(), node.values.size());
        state["lock_ref"] = node.lock_ref;
        state["hit_count"] = node.hit_count;
        state["priority"] = node.priority;
        state["last_access_time"] = node.last_access;
        state["creation_time"] = node.creation;
        state["heap_stamp"] = node.heap_stamp;
        py::list children;
        for (uint32_t child = node.first_child; child != kNone; child = nodes_[child].next_sibling) {
            children.append(py::make_tuple(child, nodes_[child].generation));
        }
        state["children"] = children;
        return state;
    }

    int64_t evictable_size() const { return evictable_; }
    int64_t protected_size() const { return protected_; }
    int64_t node_count() const { return node_count_; }
    // Nodes in namespace `ns` (the caller may forget a namespace that has none).
    int64_t namespace_nodes(int64_t ns) const {
        auto counted = namespace_nodes_.find(ns);
        return counted == namespace_nodes_.end() ? 0 : counted->second;
    }
    size_t heap_size() const { return heap_.size(); }  // entries, stale ones included
    uint32_t root_generation() const { return nodes_[kRoot].generation; }

  private:
    // Items [from, to) of the values of the nodes in [first, last) in order, joined into one new
    // bytearray (one copy; the range cut to what the nodes hold).
    template <typename It>
    py::object joined_values(It first, It last, size_t from = 0, size_t to = SIZE_MAX) const {
        size_t total = 0;
        for (It it = first; it != last; ++it) total += nodes_[*it].values.size();
        to = std::min(to, total);
        from = std::min(from, to);
        PyObject* out = PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>((to - from) * sizeof(int64_t)));
        if (out == nullptr) throw py::error_already_set();
        char* at = PyByteArray_AS_STRING(out);
        size_t position = 0;  // the path's items before the node
        for (It it = first; it != last && position < to; ++it) {
            const Span& values = nodes_[*it].values;
            size_t begin = std::max(position, from);
            size_t end = std::min(position + values.size(), to);
            if (begin < end) {
                std::memcpy(at, values.data() + (begin - position), (end - begin) * sizeof(int64_t));
                at += (end - begin) * sizeof(int64_t);
            }
            position += values.size();
        }
        return py::reinterpret_steal<py::object>(out);
    }

    // Items of a and b that agree before the first difference, among `length` (block memcmp).
    static size_t shared_prefix(const int64_t* a, const int64_t* b, size_t length) {
        constexpr size_t kBlock = 64;
        size_t done = 0;
        while (length - done >= kBlock && std::memcmp(a + done, b + done, kBlock * sizeof(int64_t)) == 0) {
            done += kBlock;
        }
        while (done < length && a[done] == b[done]) ++done;
        return done;
    }

    size_t aligned_units(size_t raw) const {
        size_t units = bigram_ ? (raw > 1 ? raw - 1 : 0) : raw;
        return units - units % static_cast<size_t>(page_);
    }

    // The hash of a child key: parent, namespace and the first page of units (raw tokens).
    uint64_t child_hash(uint32_t parent, int64_t ns, const int64_t* first) const {
        uint64_t h = 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(parent) << 1);
        auto mix = [&h](uint64_t v) {
            h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
            h *= 0xbf58476d1ce4e5b9ULL;
            h ^= h >> 31;
        };
        mix(static_cast<uint64_t>(ns));
        for (size_t i = 0; i < width_; ++i) mix(static_cast<uint64_t>(first[i]));
        return h;
    }

    uint32_t find_child(uint32_t parent, int64_t ns, const int64_t* first) const {
        auto range = children_.equal_range(child_hash(parent, ns, first));
        size_t width = width_ * sizeof(int64_t);
        for (auto it = range.first; it != range.second; ++it) {
            const Node& child = nodes_[it->second];
            if (child.parent == parent && child.ns == ns && std::memcmp(child.tokens.data(), first, width) == 0) {
                return it->second;
            }
        }
        return kNone;
    }

    void add_child_entry(uint32_t parent, uint32_t child) {
        const Node& node = nodes_[child];
        children_.emplace(child_hash(parent, node.ns, node.tokens.data()), child);
    }

    void remove_child_entry(uint32_t parent, uint32_t child) {
        const Node& node = nodes_[child];
        auto range = children_.equal_range(child_hash(parent, node.ns, node.tokens.data()));
        for (auto it = range.first; it != range.second; ++it) {
            if (it->second == child) {
                children_.erase(it);
                return;
            }
        }
    }

    // python_descend: the children a walk of key units [position, units) enters below `node`.
    void descend(uint32_t node, const Int64View& key, int64_t ns, size_t position, size_t units) {
        path_.clear();
        ends_.clear();
        size_t key_raw_stop = units + (units ? bigram_ : 0);
        while (position < units) {
            uint32_t child = find_child(node, ns, key.data + position);
            if (child == kNone) break;
            const Node& found = nodes_[child];
            size_t raw = found.tokens.size();
            size_t other_raw = key_raw_stop - position;
            size_t length = raw < other_raw ? raw : other_raw;
            size_t matched = shared_prefix(found.tokens.data(), key.data + position, length);
            if (bigram_) matched = matched > 1 ? matched - 1 : 0;
            matched -= matched % static_cast<size_t>(page_);
            position += matched;
            path_.push_back(child);
            ends_.push_back(position);
            if (matched < found.values.size()) break;
            node = child;
        }
    }

    // RadixCache._enter: mark the path used; split the last node where the key leaves it inside.
    void enter(size_t position, double now) {
        for (uint32_t id : path_) nodes_[id].last_access = now;
        uint32_t last = path_.back();
        size_t start = ends_.size() > 1 ? ends_[ends_.size() - 2] : position;
        size_t shared = ends_.back() - start;
        if (shared < nodes_[last].values.size()) {
            reprioritize(last);
            path_.back() = split(last, shared);
        }
    }

    // RadixCache._split: cut `child` after `at` units; returns the new upper node.
    uint32_t split(uint32_t child_id, size_t at) {
        // The two parts first (a copy may raise MemoryError): the tree is unchanged until they exist.
        const Node& old = nodes_[child_id];
        Span upper_tokens = old.tokens.part(0, at + bigram_);
        Span lower_tokens = old.tokens.part(at, old.tokens.size() - at);
        Span upper_values = old.values.part(0, at);
        Span lower_values = old.values.part(at, old.values.size() - at);
        uint32_t parent = old.parent;
        uint32_t upper = make_node(parent, old.ns, old.priority);
        Node& child = nodes_[child_id];  // after make_node: the arena may have moved
        Node& made = nodes_[upper];
        // The upper node takes the child's place (same first page), then the child goes below it.
        remove_child_entry(parent, child_id);
        made.tokens = std::move(upper_tokens);
        made.values = std::move(upper_values);
        child.tokens = std::move(lower_tokens);
        child.values = std::move(lower_values);
        made.hit_count = child.hit_count;
        made.lock_ref = child.lock_ref;
        replace_sibling(child_id, upper);
        add_child_entry(parent, upper);
        child.parent = kNone;
        child.next_sibling = child.prev_sibling = kNone;
        link(upper, child_id);
        node_count_ += 1;
        splits_.push_back({child_id, upper, at, nodes_[child_id].values.size()});
        return upper;
    }

    // A node made now: its times are the call's next two (Python's TreeNode reads its clock twice).
    uint32_t make_node(uint32_t parent, int64_t ns, int64_t priority) {
        uint32_t id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
        } else {
            id = static_cast<uint32_t>(nodes_.size());
            nodes_.emplace_back();
        }
        Node& node = nodes_[id];
        uint32_t generation = node.generation;
        node = Node{};
        node.generation = generation;
        node.alive = true;
        node.parent = parent;  // linked by the caller
        node.ns = ns;
        namespace_nodes_[ns] += 1;
        node.priority = priority;
        node.last_access = next_time();
        node.creation = next_time();
        return id;
    }

    void release(uint32_t id) {
        Node& node = nodes_[id];
        auto counted = namespace_nodes_.find(node.ns);
        if (--counted->second == 0) namespace_nodes_.erase(counted);
        node.alive = false;
        node.generation += 1;
        node.tokens.release();
        node.values.release();
        free_.push_back(id);
    }

    void link(uint32_t parent, uint32_t child) {
        Node& node = nodes_[child];
        Node& up = nodes_[parent];
        node.parent = parent;
        node.prev_sibling = kNone;
        node.next_sibling = up.first_child;
        if (up.first_child != kNone) nodes_[up.first_child].prev_sibling = child;
        up.first_child = child;
        up.child_count += 1;
        add_child_entry(parent, child);
    }

    void unlink(uint32_t child) {
        Node& node = nodes_[child];
        uint32_t parent = node.parent;
        remove_child_entry(parent, child);
        if (node.prev_sibling != kNone) {
            nodes_[node.prev_sibling].next_sibling = node.next_sibling;
        } else {
            nodes_[parent].first_child = node.next_sibling;
        }
        if (node.next_sibling != kNone) nodes_[node.next_sibling].prev_sibling = node.prev_sibling;
        nodes_[parent].child_count -= 1;
        node.parent = node.next_sibling = node.prev_sibling = kNone;
    }

    // `upper` takes `old`'s place among its siblings (a split).
    void replace_sibling(uint32_t old, uint32_t upper) {
        Node& was = nodes_[old];
        Node& now = nodes_[upper];
        now.prev_sibling = was.prev_sibling;
        now.next_sibling = was.next_sibling;
        if (was.prev_sibling != kNone) {
            nodes_[was.prev_sibling].next_sibling = upper;
        } else {
            nodes_[was.parent].first_child = upper;
        }
        if (was.next_sibling != kNone) nodes_[was.next_sibling].prev_sibling = upper;
        now.first_child = kNone;
        now.child_count = 0;
    }

    bool is_evictable_leaf(uint32_t id) const {
        const Node& node = nodes_[id];
        return node.alive && node.lock_ref == 0 && node.child_count == 0 && node.parent != kNone;
    }

    void reprioritize(uint32_t id) {
        if (!is_evictable_leaf(id)) return;
        Node& node = nodes_[id];
        node.heap_stamp = next_stamp_++;
        HeapEntry entry{0, 0.0, node.heap_stamp, id, node.generation};
        switch (policy_) {
            case Policy::kLru: entry.minor = node.last_access; break;
            case Policy::kLfu: entry.major = node.hit_count; entry.minor = node.last_access; break;
            case Policy::kFifo: entry.minor = node.creation; break;
            case Policy::kMru: entry.minor = -node.last_access; break;
            case Policy::kFilo: entry.minor = -node.creation; break;
            case Policy::kPriority: entry.major = node.priority; entry.minor = node.last_access; break;
        }
        heap_.push_back(entry);
        std::push_heap(heap_.begin(), heap_.end(), evicted_later);
        if (heap_.size() > 4 * static_cast<size_t>(node_count_) + 64) {
            auto stale = [this](const HeapEntry& e) { return !is_current(e); };
            heap_.erase(std::remove_if(heap_.begin(), heap_.end(), stale), heap_.end());
            std::make_heap(heap_.begin(), heap_.end(), evicted_later);
        }
    }

    bool is_current(const HeapEntry& entry) const {
        const Node& node = nodes_[entry.id];
        return node.alive && node.generation == entry.generation && node.heap_stamp == entry.stamp;
    }

    uint32_t pop_evictable_leaf() {
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), evicted_later);
            HeapEntry entry = heap_.back();
            heap_.pop_back();
            if (is_current(entry) && is_evictable_leaf(entry.id)) return entry.id;
        }
        return kNone;
    }

    void check_alive(uint32_t id, uint32_t generation) const {
        if (!is_alive(id, generation)) {
            throw py::value_error("node " + std::to_string(id) + " is not (or no longer) in this cache");
        }
    }

    // The nodes from `id` up to (not including) the root, into `path`.
    void path_to_root(uint32_t id, uint32_t generation, std::vector<uint32_t>& path) const {
        check_alive(id, generation);
        path.clear();
        while (id != kRoot) {
            path.push_back(id);
            id = nodes_[id].parent;
        }
    }

    void locked_path_to_root(uint32_t id, uint32_t generation, std::vector<uint32_t>& path) const {
        path_to_root(id, generation, path);
        for (uint32_t ancestor : path) {
            if (nodes_[ancestor].lock_ref <= 0) {
                throw py::value_error("node " + std::to_string(ancestor) +
                                      " is not locked: dec_lock_ref without a matching inc_lock_ref");
            }
        }
    }

    // RadixCache._lock_path / _unlock_path over the first `count` nodes of `path`.
    int64_t lock_path(const std::vector<uint32_t>& path, size_t count) {
        int64_t delta = 0;
        for (size_t i = 0; i < count; ++i) {
            Node& node = nodes_[path[i]];
            if (node.lock_ref == 0) {
                int64_t units = static_cast<int64_t>(node.values.size());
                evictable_ -= units;
                protected_ += units;
                delta -= units;
            }
            node.lock_ref += 1;
        }
        return delta;
    }

    int64_t unlock_path(const std::vector<uint32_t>& path, size_t count) {
        int64_t delta = 0;
        for (size_t i = 0; i < count; ++i) {
            Node& node = nodes_[path[i]];
            node.lock_ref -= 1;
            if (node.lock_ref == 0) {
                int64_t units = static_cast<int64_t>(node.values.size());
                evictable_ += units;
                protected_ -= units;
                delta += units;
                reprioritize(path[i]);
            }
        }
        return delta;
    }

    // A new node's key and values.
    void fill(uint32_t id, Span tokens, Span values, int64_t hit) {
        Node& node = nodes_[id];
        node.tokens = std::move(tokens);
        node.values = std::move(values);
        node.hit_count = hit;
    }

    // RadixCache._pass_through: what an insert does to the nodes it walks through.
    void pass_through(const std::vector<uint32_t>& path, const std::vector<size_t>& ends, int64_t priority,
                      int64_t inserted_len) {
        for (size_t i = 0; i < path.size(); ++i) {
            Node& child = nodes_[path[i]];
            if (priority > child.priority) child.priority = priority;
            if (static_cast<int64_t>(ends[i]) > inserted_len) child.hit_count += 1;
        }
        reprioritize(path.back());
    }

    // A call's clock: `times` are the times the Python tree would read in the call, in order (the
    // call's own first, then two per node it makes); past the last, the last repeats. None: each
    // is read when needed from the monotonic clock, the one Python's time.monotonic reads
    // (CLOCK_MONOTONIC on Linux), which saves a caller on the real clock reading it in advance.
    static void check_clock(const py::buffer_info& times) {
        if (times.ndim != 1 || times.itemsize != 8 || times.shape[0] < 1 || (times.shape[0] > 1 && times.strides[0] != 8) ||
            (times.format != "d" && times.format != "<d" && times.format != "=d")) {
            throw py::type_error("times must be a 1-D contiguous buffer of at least one double (array('d'))");
        }
    }

    // `times` (None: the clock) checked and held in `held` for the call.
    static const py::buffer_info& read_times(const py::object& times, py::buffer_info& held) {
        if (!times.is_none()) {
            if (!PyObject_CheckBuffer(times.ptr())) throw py::type_error("times must be None or a buffer of doubles");
            held = py::reinterpret_borrow<py::buffer>(times).request();
            check_clock(held);
        }
        return held;
    }

    // The call's first time; its readings from then on are `held`'s (read_times), or the clock's
    // where it holds none.
    double start_clock(const py::buffer_info& held) {
        if (held.ptr == nullptr) {
            times_ = nullptr;
            return monotonic_seconds();
        }
        times_ = static_cast<const double*>(held.ptr);
        times_count_ = static_cast<size_t>(held.shape[0]);
        times_used_ = 1;
        return times_[0];
    }

    static double monotonic_seconds() {
        auto since = std::chrono::steady_clock::now().time_since_epoch();
        return std::chrono::duration<double>(since).count();
    }

    double next_time() {
        if (times_ == nullptr) return monotonic_seconds();
        double time = times_[times_used_ < times_count_ ? times_used_ : times_count_ - 1];
        times_used_ += 1;
        return time;
    }

    // RadixCache._follow: insert's walk down known_path's path as far as the key's units go,
    // comparing no token (a node the key ends inside is split there).
    void follow(uint32_t id, uint32_t generation, size_t units, double now, int64_t priority, int64_t inserted_len,
                uint32_t& node, size_t& position) {
        path_to_root(id, generation, other_);
        followed_.clear();
        followed_ends_.clear();
        for (auto it = other_.rbegin(); it != other_.rend() && position < units; ++it) {
            uint32_t child = *it;
            size_t end = position + nodes_[child].values.size();
            nodes_[child].last_access = now;
            if (end > units) {
                reprioritize(child);
                child = split(child, units - position);
                end = units;
            }
            followed_.push_back(child);
            followed_ends_.push_back(end);
            node = child;
            position = end;
        }
        if (!followed_.empty()) pass_through(followed_, followed_ends_, priority, inserted_len);
    }

    int64_t page_;
    size_t bigram_;
    size_t width_;  // raw tokens of a child key: a page of units
    Policy policy_;
    std::vector<Node> nodes_;
    std::vector<uint32_t> free_;
    std::unordered_map<int64_t, int64_t> namespace_nodes_;  // live nodes per namespace, root excluded
    std::unordered_multimap<uint64_t, uint32_t> children_;
    std::vector<HeapEntry> heap_;
    int64_t evictable_ = 0;
    int64_t protected_ = 0;
    int64_t node_count_ = 0;
    int64_t next_stamp_ = 0;
    // Reused between calls: a call's scratch never allocates once the tree has grown.
    std::vector<uint32_t> path_;
    std::vector<size_t> ends_;
    std::vector<uint32_t> up_;
    std::vector<uint32_t> other_;
    std::vector<uint32_t> followed_;
    std::vector<size_t> followed_ends_;
    struct Taken {
        uint32_t id;
        int64_t units;
        int64_t ns;
        size_t raw;    // its raw tokens, in taken_tokens_ when asked for
        Span values;   // until handed out
    };
    std::vector<Taken> taken_;
    std::vector<int64_t> taken_tokens_;
    struct Split {
        uint32_t lower;
        uint32_t upper;
        size_t at;
        size_t kept;
    };
    std::vector<Split> splits_;  // the last match's or insert's
    const double* times_ = nullptr;  // the running call's clock (start_clock)
    size_t times_count_ = 0;
    size_t times_used_ = 0;
};

// The runs of consecutive values of an int64 buffer, in order, as [(first value, length)]: a
// device arena's positions (radix_core.device_values) become one slice of the arena per run.
py::list consecutive_runs(const py::buffer& values) {
    py::buffer_info held = values.request();
    Int64View view = int64_view(held, "values");
    std::vector<std::pair<int64_t, size_t>> runs;
    for (size_t i = 0; i < view.size;) {
        size_t j = i + 1;
        while (j < view.size && view.data[j - 1] != INT64_MAX && view.data[j] == view.data[j - 1] + 1) ++j;
        runs.emplace_back(view.data[i], j - i);
        i = j;
    }
    py::list out(runs.size());  // Python objects once the buffer is read (an allocation may run Python)
    for (size_t i = 0; i < runs.size(); ++i) out[i] = py::make_tuple(runs[i].first, runs[i].second);
    return out;
}

}  // namespace

PYBIND11_MODULE(_tree, m) {
    m.doc() = "radix-native's radix tree: use it through radix_core.";
    m.attr("TREE_ABI") = kTreeAbi;
    m.def("consecutive_runs", &consecutive_runs, py::arg("values"));
    py::class_<Tree>(m, "Tree")
        .def(py::init<int64_t, bool, const std::string&>(), py::arg("page_size"), py::arg("bigram"),
             py::arg("policy"))
        .def("reset", &Tree::reset)
        .def("match", &Tree::match, py::arg("tokens"), py::arg("namespace"), py::arg("times"),
             py::arg("key_start") = 0, py::arg("key_stop") = -1, py::arg("values") = true)
        .def("insert", &Tree::insert, py::arg("tokens"), py::arg("namespace"), py::arg("values"),
             py::arg("priority"), py::arg("inserted_len"), py::arg("times"), py::arg("value_offset") = 0,
             py::arg("known_path") = kNone, py::arg("known_generation") = 0, py::arg("split_at") = -1,
             py::arg("key_start") = 0, py::arg("key_stop") = -1, py::arg("keep_values") = false,
             py::arg("prefix_priority") = py::none(), py::arg("prefix_times") = py::none())
        .def("evict", &Tree::evict, py::arg("num_units"), py::arg("keys") = false)
        .def("last_splits", &Tree::last_splits)
        .def("inc_lock_ref", &Tree::inc_lock_ref, py::arg("node"), py::arg("generation"))
        .def("dec_lock_ref", &Tree::dec_lock_ref, py::arg("node"), py::arg("generation"))
        .def("move_lock", &Tree::move_lock, py::arg("old"), py::arg("old_generation"), py::arg("new"),
             py::arg("new_generation"))
        .def("touch", &Tree::touch, py::arg("node"), py::arg("generation"), py::arg("now"))
        .def("path_values", &Tree::path_values, py::arg("node"), py::arg("generation"), py::arg("start") = 0,
             py::arg("stop") = -1)
        .def("is_alive", &Tree::is_alive, py::arg("node"), py::arg("generation"))
        .def("node_state", &Tree::node_state, py::arg("node"), py::arg("generation"))
        .def("evictable_size", &Tree::evictable_size)
        .def("protected_size", &Tree::protected_size)
        .def("node_count", &Tree::node_count)
        .def("heap_size", &Tree::heap_size)
        .def("namespace_nodes", &Tree::namespace_nodes, py::arg("namespace"))
        .def("root_generation", &Tree::root_generation);
}
