"""The native store of a RadixCache: radix-native's tree, no Python object per node.

A filled Python tree is about three gc-tracked objects a node, which every full collection in a
serving process walks. Here radix-native's ``Tree`` holds nodes, locks and the eviction heap in
C++ (docs/architecture.md says how keys and values are kept); Python holds the cache and a handle
per node someone asked for (``NativeNode``, made on demand, one per node while it is referenced).
The answers are the Python store's, operation by operation (``radix-native/tests/test_tree.py``,
and every radix-core cache test runs on both). A value the tree cannot hold losslessly, or a
native failure, makes the store give up (:class:`TreeUnusable`) before it changes anything; the
cache then swaps it for a Python store rebuilt from it (:class:`RebuiltTree`), handles included.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import time
import weakref
from array import array
from collections.abc import Hashable
from typing import Any, cast

from . import _backend
from .device_values import DeviceArena
from .key import RadixKey
from .python_tree import InsertResult, KeyLike, MatchResult, PythonTree, TreeNode, check_path_range, no_indices
from .values import ValueKind

__all__ = ["NativeNode", "NativeTree", "RebuiltTree", "TreeUnusable"]

logger = logging.getLogger("radix_core")

_SYSTEM_MONOTONIC = time.monotonic  # the clock the tree can read itself, in C++
_MATCH_READINGS = 3  # a match's own clock reading, then two for the node a split makes
# an insert's own, then two for each of the three nodes it may make (a split of the node the key
# leaves, and the new part cut in two at split_at)
_INSERT_READINGS = 7
_NO_NODE = 2**32 - 1  # the tree's "no known path"
_HANDLE_SLACK = 16  # entries of handles gone that a registry may keep, past twice its live ones
_CALLER_ERRORS = (ValueError, TypeError, OverflowError)  # a bad call, not a broken tree
_arena_for_cpu_tensors = False  # CPU tensors take the device path as well (tests, where there is no GPU)


class TreeUnusable(Exception):
    """A native store cannot go on serving its cache: a native failure (``failure``), or a value
    it cannot hold losslessly (said at debug level where the cache is still empty: ``quietly``).
    Raised before the call changed anything the Python store would not redo."""

    def __init__(self, reason: str, *, failure: bool = False, quietly: bool = False):
        super().__init__(reason)
        self.failure = failure
        self.quietly = quietly


def _first(parts: list[Any]) -> Any:
    """A match's indices, already joined."""
    return parts[0]


class NativeNode(TreeNode):
    """A node of a native tree, read from the tree when asked; TreeNode's attributes as
    properties (``page_hashes`` writable). A handle to a node that is gone raises ValueError on
    reading, as the cache does when given it. It holds its cache weakly: a cache and its root
    handle make no cycle, so a dropped cache frees its tree at once, not at a collection."""

    __slots__ = ("_cache", "_generation", "_epoch", "__weakref__")

    def __init__(self, cache: weakref.ref, node_id: int, generation: int, epoch: int):  # noqa: D107 (no TreeNode init)
        self._cache = cache
        self.id = node_id
        self._generation = generation
        self._epoch = epoch

    def _read(self, field: str) -> Any:
        cache = self._cache()
        if cache is None:
            raise ValueError(f"{self!r} is not (or no longer) in a cache")
        return cache._store._node_field(self, field)

    parent = property(lambda self: self._read("parent"))  # type: ignore[assignment]
    children = property(lambda self: self._read("children"))  # type: ignore[assignment]
    key = property(lambda self: self._read("key"))  # type: ignore[assignment]
    value = property(lambda self: self._read("value"))  # type: ignore[assignment]
    lock_ref = property(lambda self: self._read("lock_ref"))  # type: ignore[assignment]
    hit_count = property(lambda self: self._read("hit_count"))  # type: ignore[assignment]
    priority = property(lambda self: self._read("priority"))  # type: ignore[assignment]
    last_access_time = property(lambda self: self._read("last_access_time"))  # type: ignore[assignment]
    creation_time = property(lambda self: self._read("creation_time"))  # type: ignore[assignment]
    _heap_stamp = property(lambda self: self._read("heap_stamp"))  # type: ignore[assignment]

    @property  # type: ignore[override]
    def page_hashes(self) -> Any:
        return self._read("page_hashes")

    @page_hashes.setter
    def page_hashes(self, hashes: Any) -> None:
        cache = self._cache()
        if cache is None:
            raise ValueError(f"{self!r} is not (or no longer) in a cache")
        cache._store._set_page_hashes(self, hashes)

    def __repr__(self) -> str:
        return f"NativeNode(id={self.id}, generation={self._generation})"


@functools.cache
def _handle_class(node_class: type[TreeNode]) -> type[NativeNode]:
    """Handles that also behave as ``node_class`` (a TreeNode subclass adding properties only,
    e.g. the SGLang backend's view of page hashes): NativeNode's attributes come first."""
    if node_class is TreeNode:
        return NativeNode
    return type(f"Native{node_class.__name__}", (NativeNode, node_class), {"__slots__": ()})


class NativeTree(PythonTree):
    """The store of a :class:`~radix_core.RadixCache` on radix-native's tree: the same answers as
    the Python store; nodes are :class:`NativeNode` handles that hold ``cache`` (a weak reference
    to the cache they belong to, which reads them through this store)."""

    tree_kind = "native"

    def __init__(self, cache: weakref.ref, *arguments: Any):
        """``cache``: the cache this store serves; ``arguments``: PythonTree's, checked there."""
        self._epoch = 0
        self._self_ref = cache  # what handles hold
        # (id, generation) -> a weak reference to the node's one handle; entries of handles gone
        # are dropped in batches (_handle): a callback per handle would cost more than its handle
        self._handles: dict[tuple[int, int], weakref.ref] = {}
        self._live_handles = 0  # entries left by the last batch
        self._page_hashes: dict[int, Any] = {}
        self._held_tensor: Any = None  # a converted value's tensor, during the insert that reads it
        self._arena: DeviceArena | None = None  # where tensor values on a device are kept, if any
        self._arena_for_cpu = _arena_for_cpu_tensors
        self._arena_for_device = _backend.device_tree == "native"
        # extra_key <-> the number the tree files it under, for namespaces that have nodes
        self._namespaces: dict[Hashable, int] = {None: 0}
        self._namespace_keys: dict[int, Hashable] = {0: None}
        self._namespace_numbers = itertools.count(1)
        self._tree: Any = None  # made by reset(), once PythonTree checked the arguments
        super().__init__(*arguments)
        self._reads_clock_itself = self.clock is _SYSTEM_MONOTONIC

    # ----- RadixCache's API, which documents it ----------------------------------------------

    def reset(self) -> None:
        if self._tree is None:
            self._tree = _backend.native_tree_module().Tree(self.page_size, self.is_eagle, self.eviction_policy)  # type: ignore[union-attr]
            self._handle_class = _handle_class(self.node_class)  # type: ignore[arg-type]
        self._tree.reset()
        if self._arena is not None:
            self._arena.clear()
        self._epoch += 1
        self._handles, self._live_handles = {}, 0
        self._page_hashes.clear()
        self._namespaces, self._namespace_keys = {None: 0}, {0: None}
        self.root_node = self._handle(0, self._tree.root_generation())
        self._evictable_size = self._protected_size = self._node_count = 0

    def match_prefix(self, key: KeyLike, *, indices: bool = True) -> MatchResult:
        """:meth:`RadixCache.match_prefix`; without ``indices`` the tree copies no values out."""
        key = self._as_cache_key(key).page_aligned(self.page_size)
        namespace = self._namespaces.get(key.extra_key, -1)  # -1: a namespace with no node
        try:
            length, node_id, generation, values = self._tree.match(
                key._tokens, namespace, self._readings(_MATCH_READINGS), key._start, key._stop, indices
            )
        except _CALLER_ERRORS:
            raise
        except Exception as exc:
            raise TreeUnusable(f"match raised {type(exc).__name__}: {exc}", failure=True) from exc
        finally:
            if self._page_hashes:
                self._cut_page_hashes()
        node = self.root_node if node_id == 0 else self._handle(node_id, generation)
        if not indices:
            return MatchResult(length, node, [], no_indices)
        if self._arena is not None and length:  # now: the positions may be reused before a later join
            return MatchResult(length, node, [self._from_int64(values)], _first)
        return MatchResult(length, node, [values] if length else [], self._join_int64)

    def insert(
        self,
        key: KeyLike,
        value: Any = None,
        priority: int = 0,
        *,
        inserted_len: int = 0,
        value_offset: int = 0,
        known_path: TreeNode | None = None,
        copy: bool = True,
        split_at: int | None = None,
        prefix_priority: int | None = None,
    ) -> InsertResult:
        """:meth:`RadixCache.insert`; values are copied into the tree (``copy`` is moot), except
        the key's token ids where ``value`` is None: sliced for the tree, kept. The prefix
        ``prefix_priority`` inserts again is in the same call of the tree."""

        empty_before = self._value_kind is None
        cache_key, checked, kind = self._checked_insert(key, value, value_offset, split_at, prefix_priority)
        known = (_NO_NODE, 0) if known_path is None else self._ids(known_path)
        reserved = None  # the arena positions given to the tree, and their runs
        if self._arena is not None or (empty_before and self._wants_arena(kind, checked)):
            reserved = self._arena_positions(kind, checked)
            values = None if reserved is None else self._tree_values(kind, reserved[0])
        else:
            values = self._tree_values(kind, checked)
        if values is None:  # the first value: nothing to rebuild, and nothing to say
            raise TreeUnusable(f"{kind.name} values it cannot hold as int64", quietly=empty_before)
        try:
            position, node_id, generation = self._tree.insert(
                cache_key._tokens,
                self._namespace(cache_key.extra_key),
                values,
                0 if priority is None else priority,
                inserted_len,
                self._readings(_INSERT_READINGS),
                value_offset,
                known[0],
                known[1],
                -1 if split_at is None else split_at,
                cache_key._start,
                cache_key._stop,
                value is None,  # the values are the key's token ids, sliced for this call: kept
                prefix_priority,
                None if prefix_priority is None else self._readings(_INSERT_READINGS),  # after this insert's
            )
        except Exception as exc:
            if reserved is not None:  # the tree kept none of them
                self._arena.commit(checked, reserved[1], 0, 0)  # type: ignore[union-attr]
            if isinstance(exc, _CALLER_ERRORS):
                raise
            raise TreeUnusable(f"insert raised {type(exc).__name__}: {exc}", failure=True) from exc
        finally:
            self._held_tensor = None
            if self._page_hashes:
                self._cut_page_hashes()
        if reserved is not None:  # the tree kept the positions of value items [position, units) - offset
            units = len(cache_key)
            kept = (position - value_offset, units - value_offset) if position < units else (0, 0)
            self._arena.commit(checked, reserved[1], *kept)  # type: ignore[union-attr]
        node = self._handle(node_id, generation)
        if self.on_store is not None and position < len(cache_key):
            for stored in self._stored_pieces(node, position, len(cache_key), split_at):
                self.on_store(stored)
        return InsertResult(position, node)

    def evict(self, num_tokens: int) -> int:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, not {num_tokens}")
        try:
            evicted, taken = self._tree.evict(num_tokens, self.on_remove is not None)
        except _CALLER_ERRORS:
            raise
        except Exception as exc:
            raise TreeUnusable(f"evict raised {type(exc).__name__}: {exc}", failure=True) from exc
        if not taken:
            return evicted
        on_evict, on_remove, page_hashes, arena = self.on_evict, self.on_remove, self._page_hashes, self._arena
        if on_evict is not None or on_remove is not None or page_hashes or arena is not None:
            for node_id, units, namespace, tokens, values, start in taken:
                hashes = page_hashes.pop(node_id, None) if page_hashes else None
                if on_evict is not None or on_remove is not None:
                    part = self._view_of(values, start, units)  # made only for someone to take
                    if on_evict is not None:
                        on_evict(part)
                    if on_remove is not None:
                        on_remove(self._removed_node(node_id, namespace, tokens, part, hashes))
                if arena is not None:  # copied out above before its positions can be reused
                    arena.release(self._positions(values, start, units))
        if len(self._namespaces) > 1:  # namespaces beside the default one, which is never forgotten
            for namespace in {entry[2] for entry in taken}:
                if namespace and not self._tree.namespace_nodes(namespace):  # its last node went
                    del self._namespaces[self._namespace_keys.pop(namespace)]
        return evicted

    def inc_lock_ref(self, node: TreeNode) -> int:
        return self._tree.inc_lock_ref(*self._ids(node))

    def dec_lock_ref(self, node: TreeNode) -> int:
        return self._tree.dec_lock_ref(*self._ids(node))

    def move_lock(self, old: TreeNode, new: TreeNode) -> int:
        return self._tree.move_lock(*self._ids(old), *self._ids(new))

    def touch(self, node: TreeNode) -> None:
        self._tree.touch(*self._ids(node), self.clock())

    def path_indices(self, node: TreeNode, start: int = 0, stop: int | None = None) -> Any:
        """:meth:`RadixCache.path_indices`: the tree copies only the range asked for."""
        check_path_range(start, stop)
        return self._join_int64([self._tree.path_values(*self._ids(node), start, -1 if stop is None else stop)])

    def evictable_size(self) -> int:
        return self._tree.evictable_size()

    def protected_size(self) -> int:
        return self._tree.protected_size()

    def node_count(self) -> int:
        return self._tree.node_count()

    def _readings(self, count: int) -> array | None:
        """The ``count`` clock readings a call of the Python store might make, in order, which the
        tree uses as that store would (both order evictions alike under any clock); None where the
        tree reads the system's clock itself, when the Python store would."""
        if self._reads_clock_itself:
            return None
        clock = self.clock
        return array("d", [clock() for _ in range(count)])

    # ----- handles ----------------------------------------------------------------------------

    def _handle(self, node_id: int, generation: int) -> NativeNode:
        """The one handle of a node while anyone holds it."""
        key = (node_id, generation)
        handles = self._handles
        ref = handles.get(key)
        handle = None if ref is None else ref()
        if handle is None:
            handle = self._handle_class(self._self_ref, node_id, generation, self._epoch)
            handles[key] = weakref.ref(handle)
            if len(handles) > 2 * self._live_handles + _HANDLE_SLACK:  # amortized O(1) a handle
                self._handles = {key: ref for key, ref in handles.items() if ref() is not None}
                self._live_handles = len(self._handles)
        return handle

    def _ids(self, node: TreeNode | None) -> tuple[int, int]:
        """A handle's node id and generation in this tree; ValueError for anything else."""
        if not isinstance(node, NativeNode) or node._cache is not self._self_ref or node._epoch != self._epoch:
            raise ValueError(f"{node!r} is not (or no longer) in this cache")
        return node.id, node._generation

    def _node_field(self, node: NativeNode, field: str) -> Any:
        """A node's attribute, as TreeNode holds it, read from the tree."""
        if field == "page_hashes":
            self._ids(node)
            return self._page_hashes.get(node.id)
        state = self._tree.node_state(*self._ids(node))
        if field == "parent":
            parent = state["parent"]
            return None if parent is None else self._handle(parent, state["parent_generation"])
        if field == "children":
            children = {}
            for child_id, child_generation in state["children"]:
                child = self._handle(child_id, child_generation)
                children[child.key.child_key(self.page_size)] = child
            return children
        if field == "key":
            return self._key_of(state["tokens"], state["namespace"])
        if field == "value":
            return None if state["parent"] is None else self._from_int64(state["values"])
        return state[field]

    def _set_page_hashes(self, node: NativeNode, hashes: Any) -> None:
        node_id, _ = self._ids(node)
        if hashes is None:
            self._page_hashes.pop(node_id, None)
        else:
            self._page_hashes[node_id] = hashes

    def _cut_page_hashes(self) -> None:
        """Split ``page_hashes`` as the tree split their nodes in its last call (RadixCache._split)."""
        for lower, upper, at, kept in self._tree.last_splits():
            hashes = self._page_hashes.get(lower)
            if hashes is not None:  # as many items per page: the upper node takes at / length of them
                cut = len(hashes) * at // (at + kept)
                self._page_hashes[upper], self._page_hashes[lower] = hashes[:cut], hashes[cut:]

    def _stored_pieces(self, last: NativeNode, position: int, units: int, split_at: int | None) -> list[NativeNode]:
        """The nodes an insert added, top down: ``last``, and its parent where it cut the new part
        at ``split_at``."""
        if split_at is not None and position < split_at < units:
            return [last.parent, last]  # type: ignore[list-item]
        return [last]

    def _removed_node(self, node_id: int, namespace: int, tokens: Any, value: Any, hashes: Any) -> TreeNode:
        """What an evicted node was, as a detached TreeNode (the Python tree hands out its own)."""
        node = self.node_class(self._key_of(tokens, namespace), value, None)
        node.id = node_id
        node.page_hashes = hashes
        return node

    # ----- conversions ------------------------------------------------------------------------

    def _namespace(self, extra_key: Hashable) -> int:
        """The number the tree files ``extra_key``'s nodes under (forgotten with its last node)."""
        number = self._namespaces.get(extra_key)
        if number is None:
            number = self._namespaces[extra_key] = next(self._namespace_numbers)
            self._namespace_keys[number] = extra_key
        return number

    def _key_of(self, tokens: Any, namespace: int) -> RadixKey:
        raw = array("q")
        raw.frombytes(tokens)
        return RadixKey._window(raw, 0, len(raw), self._namespace_keys[namespace], self.is_eagle)

    def _tree_values(self, kind: ValueKind, value: Any) -> Any:
        """``value`` as contiguous int64 or int32 items the tree reads (and keeps as int64: int32,
        the dtype of SGLang's KV index rows, is widened in the tree's one copy): a buffer, or a CPU
        tensor's memory as (address, items, itemsize), held until the tree has copied it; None
        where the native tree cannot hold it losslessly."""
        name = kind.name
        if name == "array":
            if (value.typecode == "i" and value.itemsize == 4) or (value.typecode in "ql" and value.itemsize == 8):
                return value
            try:
                return array("q", value)
            except OverflowError:
                return None
        if name == "numpy":
            numpy = sys.modules["numpy"]
            if value.dtype == numpy.int32:
                return numpy.ascontiguousarray(value)
            if value.dtype.kind == "u" and value.dtype.itemsize == 8 and value.size and value.max() >= 2**63:
                return None
            return numpy.ascontiguousarray(value, dtype=numpy.int64)
        if name == "torch":
            torch = sys.modules["torch"]
            dtype = value.dtype
            if not value.is_cpu or dtype == torch.uint64:
                return None
            if dtype != torch.int64 and dtype != torch.int32:
                value = value.to(torch.int64)
            value = value.contiguous()
            count = value.shape[0]
            self._held_tensor = value  # the memory's owner, alive until the tree has copied it
            return value.data_ptr(), count, 4 if dtype == torch.int32 else 8  # no buffer object, no copy
        return None  # lists

    def _from_int64(self, values: bytearray) -> Any:
        """The tree's int64 bytes as one value of this cache's kind."""
        kind = self._value_kind
        name = kind.name if kind is not None else "array"
        if not values:
            return self._join([])
        if self._arena is not None:
            return self._arena.gather(memoryview(values).cast("q"))
        if name == "torch":
            torch = sys.modules["torch"]
            return torch.frombuffer(values, dtype=torch.int64)
        if name == "numpy":
            return sys.modules["numpy"].frombuffer(values, dtype="int64")
        joined = array("q")
        joined.frombytes(values)
        return joined

    def _view_of(self, values: bytearray | array, start: int, count: int) -> Any:
        """Items [start, start + count) of a store the tree handed out, as one value of this
        cache's kind (a view for tensors and ndarrays; an array, which cannot share, a copy)."""
        name = self._value_kind.name  # type: ignore[union-attr]
        if self._arena is not None:
            return self._arena.gather(self._positions(values, start, count))
        if name == "torch":
            torch = sys.modules["torch"]
            return torch.frombuffer(values, dtype=torch.int64, count=count, offset=8 * start)
        if name == "numpy":
            return sys.modules["numpy"].frombuffer(values, dtype="int64", count=count, offset=8 * start)
        if isinstance(values, array):  # values the tree kept (made for it): a slice is a copy
            return values[start : start + count]
        part = array("q")
        part.frombytes(memoryview(values)[8 * start : 8 * (start + count)])
        return part

    def _wants_arena(self, kind: ValueKind, value: Any) -> bool:
        """Whether a first value is a tensor to keep on its device: with RADIX_CORE_DEVICE_TREE=native
        (else a device tensor makes the cache a Python tree), or a CPU one in tests."""
        if kind.name != "torch":
            return False
        return self._arena_for_cpu if value.is_cpu else self._arena_for_device

    def _arena_positions(self, kind: ValueKind, value: Any) -> tuple[Any, list[tuple[int, int]]] | None:
        """Arena positions reserved for every item of ``value`` (host int64) and their runs, or
        None where the arena cannot hold it (another kind, device or dtype)."""
        if kind.name != "torch":
            return None
        if self._arena is None:
            self._arena = DeviceArena(value, _backend.native_tree_module().consecutive_runs)  # type: ignore[union-attr]
        if not self._arena.holds(value):
            return None
        return self._arena.reserve(value.shape[0])

    def _positions(self, values: bytearray | array, start: int, count: int) -> memoryview:
        """Items [start, start + count) of a store the tree handed out (a bytearray: positions
        are copied, never kept by reference), as int64 arena positions."""
        return memoryview(values).cast("q")[start : start + count]

    def _join_int64(self, parts: list[bytearray]) -> Any:
        """A match's values: the one int64 buffer the tree answered, as this cache's kind."""
        return self._from_int64(parts[0]) if parts else self._join([])

    # ----- giving way to the Python store -----------------------------------------------------

    def rebuilt(self) -> RebuiltTree:
        """A Python store holding what this one holds (nodes, their state, the eviction order),
        to serve the cache from now on; handles given out resolve to its nodes. An unreadable
        tree gives an empty one (logged): SGLang recomputes what it held."""
        python = RebuiltTree(
            self.page_size,
            self.is_eagle,
            self.eviction_policy,
            self.on_evict,
            self.on_store,
            self.on_remove,
            self.node_class,
            self.clock,
        )
        python._value_kind, python._empty_value = self._value_kind, self._empty_value
        root = cast(NativeNode, self.root_node)
        try:
            self._rebuild_into(python)
        except Exception as exc:
            logger.warning(
                "the native tree could not be read (%s: %s); its entries are dropped", type(exc).__name__, exc
            )
            python.reset()
            python.handles = {(self._epoch, 0, root._generation): python.root_node}
        python.cache = self._self_ref
        return python

    def _rebuild_into(self, python: RebuiltTree) -> None:
        """Copy every node, with its state, and the eviction order into ``python``."""
        tree, epoch = self._tree, self._epoch
        root_generation = tree.root_generation()
        nodes = python.handles = {(epoch, 0, root_generation): python.root_node}
        # Only nodes with a handle given out before the move are looked up by it: an entry for any
        # other would keep that node (its key, its value) alive after the Python tree evicts it.
        handed_out = {key for key, ref in self._handles.items() if ref() is not None}
        leaves: list[tuple[int, TreeNode]] = []
        stack = [(0, root_generation, python.root_node)]
        count = 0
        while stack:
            node_id, generation, made = stack.pop()
            for child_id, child_generation in tree.node_state(node_id, generation)["children"]:
                state = tree.node_state(child_id, child_generation)
                child = self.node_class(
                    self._key_of(state["tokens"], state["namespace"]), self._from_int64(state["values"]), made
                )
                for field in ("lock_ref", "hit_count", "priority", "last_access_time", "creation_time"):
                    setattr(child, field, state[field])
                child.id = child_id
                child.page_hashes = self._page_hashes.get(child_id)
                made.children[child.key.child_key(self.page_size)] = child
                if (child_id, child_generation) in handed_out:
                    nodes[epoch, child_id, child_generation] = child
                if state["heap_stamp"] >= 0:
                    leaves.append((state["heap_stamp"], child))
                stack.append((child_id, child_generation, child))
                count += 1
        python._evictable_size = tree.evictable_size()
        python._protected_size = tree.protected_size()
        python._node_count = count
        for _, leaf in sorted(leaves, key=lambda entry: entry[0]):  # same order among equal keys
            python._reprioritize(leaf)

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        self._ids(node)
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        return path


class RebuiltTree(PythonTree):
    """The Python store a cache moves to from a native one (:meth:`NativeTree.rebuilt`): handles
    the native store gave out still name their nodes, here the rebuilt ones."""

    cache: weakref.ref | None = None  # the cache whose handles resolve here
    handles: dict[tuple[int, int, int], TreeNode]  # (epoch, id, generation) -> the rebuilt node

    def _own(self, node: TreeNode) -> TreeNode:
        """What ``node`` is in this store (a handle: its rebuilt node)."""
        if isinstance(node, NativeNode) and node._cache is self.cache:
            found = self.handles.get((node._epoch, node.id, node._generation))
            if found is None:
                raise ValueError(f"{node!r} is not (or no longer) in this cache")
            return found
        return node

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        return super()._path_to_root(self._own(node))

    def _node_field(self, node: NativeNode, field: str) -> Any:
        return getattr(self._own(node), "_heap_stamp" if field == "heap_stamp" else field)

    def _set_page_hashes(self, node: NativeNode, hashes: Any) -> None:
        self._own(node).page_hashes = hashes
