"""The Python store of a RadixCache: the prefix tree SGLang's scheduler keeps over cached KV
indices, as Python nodes (the reference every other store answers as).

Semantics follow SGLang's ``RadixCache`` (match, insert with node splits, lock counting, leaf
eviction by policy, page alignment, EAGLE bigram keys) and are checked against it operation by
operation. What differs is cost: keys are O(1) windows, so walking a long key down a deep path
never re-copies its tail; prefix comparison runs natively when radix-native is installed; and
eviction keeps one lazily-updated heap instead of re-heapifying every leaf on every call.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import time
from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import IO, Any, NamedTuple, TypeAlias, cast

from ._backend import dispatching
from .key import RadixKey
from .values import ValueKind, value_kind_of

__all__ = ["EVICTION_POLICIES", "InsertResult", "MatchResult", "PythonTree", "TreeNode", "python_descend"]


class TreeNode:
    """One edge of the radix tree: a key segment and the values (KV indices) of its units."""

    __slots__ = (
        "children",
        "parent",
        "key",
        "value",
        "lock_ref",
        "hit_count",
        "priority",
        "last_access_time",
        "creation_time",
        "id",
        "page_hashes",
        "_heap_stamp",
    )
    _ids = itertools.count()

    def __init__(self, key: RadixKey, value: Any, parent: TreeNode | None, priority: int = 0):
        self.children: dict[Hashable, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.last_access_time = 0.0  # both set by the tree that makes the node, from its clock
        self.creation_time = 0.0
        self.id = next(TreeNode._ids)
        # A caller's per-page record of this node (e.g. KV event block hashes): any sequence with
        # the same number of items for each page; a split cuts it with the node.
        self.page_hashes: Any = None
        self._heap_stamp = -1  # stamp of this node's one valid eviction-heap entry, if any

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, children={len(self.children)})"


def adds_no_state(node_class: type[TreeNode]) -> bool:
    """Whether ``node_class`` is TreeNode or a subclass that adds behaviour only (empty
    ``__slots__`` all the way up): what the native tree's handles can take on."""
    return all(
        klass.__dict__.get("__slots__") == () for klass in node_class.__mro__[: node_class.__mro__.index(TreeNode)]
    )


# Smaller sorts first, i.e. is evicted first.
EVICTION_POLICIES: dict[str, Callable[[TreeNode], Any]] = {
    "lru": lambda node: node.last_access_time,
    "lfu": lambda node: (node.hit_count, node.last_access_time),
    "fifo": lambda node: node.creation_time,
    "mru": lambda node: -node.last_access_time,
    "filo": lambda node: -node.creation_time,
    "priority": lambda node: (node.priority, node.last_access_time),
}


def python_descend(node: TreeNode, key: RadixKey, position: int, page_size: int) -> tuple[list[TreeNode], list[int]]:
    """The children a walk of ``key`` (page-aligned, standing at unit ``position``) enters below
    ``node``, top down, and the key position after each; the reference. Every child but the last
    matches whole; the walk stops inside the last where the key leaves it (the caller splits it
    there), or after it where no child continues the key. Nothing in the tree changes."""
    path, ends = [], []
    units = len(key)
    while position < units:
        child = node.children.get(key.child_key_at(position, page_size))
        if child is None:
            break
        shared = child.key._shared_units(key, position, page_size)  # same namespace: found by child key
        position += shared
        path.append(child)
        ends.append(position)
        if shared < len(child.key):
            break
        node = child
    return path, ends


def _stored(key: RadixKey) -> RadixKey:
    """``key`` as a node keeps it: the window itself where it is at least half of its array (no
    array is kept alive for less than half its tokens; a split copies at most one half), else a
    copy of just its tokens."""
    return key if 2 * key.raw_length >= len(key._tokens) else key.compact()


@dispatching("descend")
def descend(node: TreeNode, key: RadixKey, position: int, page_size: int) -> tuple[list[TreeNode], list[int]]:
    """Same as :func:`python_descend`, in one native call when radix-native is in use."""
    return python_descend(node, key, position, page_size)


class LazyHeap:
    """Nodes by eviction priority, lowest first, updated lazily: a push stamps its node (in the
    node's ``field`` slot), which makes the node's older entries stale; stale entries are skipped
    when popped, and dropped all at once when they outnumber the tree's nodes four to one."""

    __slots__ = ("entries", "field")

    def __init__(self, field: str):
        self.entries: list[tuple[Any, int, TreeNode]] = []
        self.field = field

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[Any, int, TreeNode]]:
        """The entries, stale ones included: (priority, stamp, node), in heap order."""
        return iter(self.entries)

    def push(self, node: TreeNode, priority: Any, stamp: int, node_count: int) -> None:
        setattr(node, self.field, stamp)
        entries = self.entries
        heapq.heappush(entries, (priority, stamp, node))
        if len(entries) > 4 * node_count + 64:
            field = self.field
            self.entries = [entry for entry in entries if entry[1] == getattr(entry[2], field)]
            heapq.heapify(self.entries)

    def pop(self, valid: Callable[[TreeNode], bool]) -> TreeNode | None:
        """The node of lowest priority whose entry is current and that is still ``valid``, its
        entry taken; None if none."""
        entries, field = self.entries, self.field
        while entries:
            _, stamp, node = heapq.heappop(entries)
            if stamp == getattr(node, field) and valid(node):
                return node
        return None


class MatchResult:
    """``prefix_len`` cached units, ending at ``last_node``; ``indices`` are their values, joined.
    With a host tier, ``host_hit_length`` more units are cached on the host only, down to
    ``best_node`` (else ``best_node`` is ``last_node`` and ``host_hit_length`` 0).

    The join (a ``torch.cat`` for tensor values) happens on first access of ``indices``, so a
    caller that only needs the node (SGLang reads indices later, off the node) pays no copy; a
    match asked for no indices (``match_prefix(key, indices=False)``) has None.
    """

    __slots__ = ("prefix_len", "last_node", "best_node", "host_hit_length", "_parts", "_join", "_indices")

    def __init__(
        self,
        prefix_len: int,
        last_node: TreeNode,
        parts: list[Any],
        join: Callable[[list[Any]], Any],
        best_node: TreeNode | None = None,
        host_hit_length: int = 0,
    ):
        self.prefix_len = prefix_len
        self.last_node = last_node
        self.best_node = last_node if best_node is None else best_node
        self.host_hit_length = host_hit_length
        self._parts: list[Any] | None = parts
        self._join = join
        self._indices: Any = None

    @property
    def indices(self) -> Any:
        if self._parts is not None:
            self._indices = self._join(self._parts)
            self._parts = None
        return self._indices

    def __repr__(self) -> str:
        return f"MatchResult(prefix_len={self.prefix_len}, last_node={self.last_node!r})"


def check_path_range(start: int, stop: int | None) -> None:
    """A range of a path's units: start >= 0, stop None (to its end) or >= 0."""
    if start < 0 or (stop is not None and stop < 0):
        raise ValueError(f"a path's units are [start, stop) with both >= 0, not [{start}, {stop})")


def no_indices(parts: list[Any]) -> None:
    """The join of a match asked for no indices."""
    return None


class InsertResult(NamedTuple):
    """``prefix_len`` units of the key were cached already; the key ends at ``last_node``. With a
    host tier: the insert's values of the units in the ``adopted`` ranges were taken by host-only
    nodes (not duplicates, not to be freed); ``to_back_up`` are the nodes that reached the write
    policy's hit threshold with no host copy, top down."""

    prefix_len: int
    last_node: TreeNode
    adopted: Sequence[tuple[int, int]] = ()
    to_back_up: Sequence[TreeNode] = ()


KeyLike: TypeAlias = RadixKey | Iterable[int]


class PythonTree:
    """The reference store: a radix tree of :class:`TreeNode` objects, with the arguments and
    answers of :class:`radix_core.RadixCache` (which documents them). A host tier builds on it
    (:class:`radix_core.TieredRadixCache`), and radix-native's store falls back to it."""

    def __init__(
        self,
        page_size: int = 1,
        is_eagle: bool = False,
        eviction_policy: str = "lru",
        on_evict: Callable[[Any], None] | None = None,
        on_store: Callable[[TreeNode], None] | None = None,
        on_remove: Callable[[TreeNode], None] | None = None,
        node_class: type[TreeNode] = TreeNode,
        clock: Callable[[], float] | None = None,
    ):
        if type(page_size) is not int or page_size < 1:
            raise ValueError(f"page_size must be a positive int, not {page_size!r}")
        policy = eviction_policy.lower()
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction policy {eviction_policy!r}; use one of: {', '.join(EVICTION_POLICIES)}")
        self.page_size = page_size
        self.is_eagle = bool(is_eagle)
        self.eviction_policy = policy
        self.on_evict = on_evict
        self.on_store = on_store
        self.on_remove = on_remove
        self.node_class = node_class
        self.clock = time.monotonic if clock is None else clock
        self._eviction_priority = EVICTION_POLICIES[policy]
        self._value_kind: ValueKind | None = None
        self._empty_value: Any = None
        self.reset()

    # ----- RadixCache's API, which documents it ----------------------------------------------

    def reset(self) -> None:
        self.root_node = self._node(RadixKey(), None, None, -sys.maxsize)
        self.root_node.lock_ref = 1
        self._evictable_size = 0
        self._protected_size = 0
        self._node_count = 0
        self._heap = LazyHeap("_heap_stamp")
        self._stamps = itertools.count()  # shared by every heap of the tree

    def match_prefix(self, key: KeyLike, *, indices: bool = True) -> MatchResult:
        key = self._as_cache_key(key).page_aligned(self.page_size)
        node = self.root_node
        access_time = self.clock()
        node.last_access_time = access_time
        path, ends = descend(node, key, 0, self.page_size)
        if path:
            self._enter(path, ends, 0, access_time)
        return self._match_result(path, ends, indices)

    def _match_result(self, path: list[TreeNode], ends: list[int], indices: bool) -> MatchResult:
        """The answer of a match whose walk entered ``path`` (the key unit where each node ends)."""
        join = self._join if indices else no_indices
        if not path:
            return MatchResult(0, self.root_node, [], join)
        node = path[-1]
        self._reprioritize(node)
        values = [child.value for child in path] if indices else []
        return MatchResult(ends[-1], node, values, join)

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
        key, value, kind = self._checked_insert(key, value, value_offset, split_at, prefix_priority)
        units = len(key)
        priority = 0 if priority is None else priority
        page = self.page_size

        def values_of(start: int, stop: int) -> Any:
            """The value items of key units [start, stop), as a node keeps them."""
            if start < value_offset:
                raise ValueError(f"only {start} units are cached, but the value starts at unit {value_offset}")
            first, last = start - value_offset, stop - value_offset
            return kind.cut(value, first, last) if copy else value[first:last]

        node = self.root_node
        access_time = self.clock()
        node.last_access_time = access_time
        node.priority = max(node.priority, priority)
        position = 0
        if known_path is not None:
            node, position = self._follow(known_path, units, access_time, priority, inserted_len, values_of)
        if position < units:
            path, ends = descend(node, key, position, page)
            if path:
                self._enter(path, ends, position, access_time)
                self._pass_through(path, ends, position, priority, inserted_len, values_of)
                node, position = path[-1], ends[-1]
        if position < units:
            if position < value_offset:
                raise ValueError(f"only {position} units are cached, but the value starts at unit {value_offset}")
            bounds = (
                [position, split_at, units]
                if split_at is not None and position < split_at < units
                else [position, units]
            )
            # Made lowest first, as a later split of one node would make them; linked top down.
            pieces = []
            for start, stop in reversed(list(zip(bounds, bounds[1:]))):
                piece_key = key._units(start, stop)
                piece = self._node(_stored(piece_key), values_of(start, stop), None, priority)
                piece.hit_count = 1 if units > inserted_len else 0
                pieces.append((piece_key, piece))
            for piece_key, piece in reversed(pieces):
                piece.parent = node
                node.children[piece_key.child_key(page)] = piece  # type: ignore[union-attr]
                node = piece
            self._node_count += len(pieces)
            self._evictable_size += units - position
            self._reprioritize(node)
            if self.on_store is not None:
                for _, piece in reversed(pieces):
                    self.on_store(piece)
        if prefix_priority is not None:
            self._insert_prefix_again(key, value, split_at, prefix_priority, node)  # type: ignore[arg-type]
        return InsertResult(position, node)  # type: ignore[arg-type]

    def _insert_prefix_again(self, key: KeyLike, value: Any, split_at: int, priority: int, last: TreeNode) -> None:
        """The second insert ``prefix_priority`` asks for, after the one that ended at ``last``:
        the key's first ``split_at`` units, all cached, at ``priority``."""
        given = key if isinstance(key, RadixKey) else RadixKey(key)
        prefix = cast(RadixKey, self._as_cache_key(given).page_aligned(self.page_size)[:split_at])
        units = len(prefix)
        empty = None if value is None else value[:0]
        self.insert(prefix, empty, priority, inserted_len=units, value_offset=units, known_path=last)

    def evict(self, num_tokens: int) -> int:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, not {num_tokens}")
        evicted = 0
        while evicted < num_tokens:
            node = self._pop_evictable_leaf()
            if node is None:
                break
            evicted += self._evict_leaf(node)
        return evicted

    def _pop_evictable_leaf(self) -> TreeNode | None:
        """The evictable leaf of lowest eviction priority, its heap entry taken; None if none."""
        return self._heap.pop(self._is_evictable_leaf)

    def _evict_leaf(self, node: TreeNode) -> int:
        """Take an evictable leaf out of the tree (its value to ``on_evict``); returns its units."""
        parent: TreeNode = node.parent  # type: ignore[assignment]
        del parent.children[node.key.child_key(self.page_size)]
        node.parent = None
        units = len(node.key)
        self._evictable_size -= units
        self._node_count -= 1
        self._reprioritize(parent)
        if self.on_evict is not None:
            self.on_evict(node.value)
        if self.on_remove is not None:
            self.on_remove(node)
        return units

    def inc_lock_ref(self, node: TreeNode) -> int:
        return self._lock_path(self._path_to_root(node))

    def dec_lock_ref(self, node: TreeNode) -> int:
        return self._unlock_path(self._locked_path_to_root(node))

    def move_lock(self, old: TreeNode, new: TreeNode) -> int:
        old_path = self._locked_path_to_root(old)
        new_path = self._path_to_root(new)
        kept = 0  # the two paths share their top ``kept`` nodes, whose counts would go down and up
        while kept < len(old_path) and kept < len(new_path) and old_path[-1 - kept] is new_path[-1 - kept]:
            kept += 1
        return self._unlock_path(old_path[: len(old_path) - kept]) + self._lock_path(new_path[: len(new_path) - kept])

    def touch(self, node: TreeNode) -> None:
        path = self._path_to_root(node)
        access_time = self.clock()
        self.root_node.last_access_time = access_time
        for ancestor in path:
            ancestor.last_access_time = access_time
        if path:
            self._reprioritize(path[0])

    def path_indices(self, node: TreeNode, start: int = 0, stop: int | None = None) -> Any:
        check_path_range(start, stop)
        path = self._path_to_root(node)
        path.reverse()
        if not start and stop is None:
            return self._join([ancestor.value for ancestor in path])
        parts, position = [], 0
        for ancestor in path:
            if stop is not None and position >= stop:
                break
            end = position + len(ancestor.key)
            if end > start:
                value = ancestor.value
                first, last = max(start - position, 0), None if stop is None or stop >= end else stop - position
                parts.append(value if first == 0 and last is None else value[first:last])
            position = end
        return self._join(parts)

    def path_to(self, node: TreeNode) -> list[TreeNode]:
        path = self._path_to_root(node)
        path.reverse()
        return path

    def cache_key(self, key: KeyLike) -> RadixKey:
        return self._as_cache_key(key).page_aligned(self.page_size)

    def walk(self, key: KeyLike) -> tuple[list[TreeNode], list[int]]:
        """The nodes a match of ``key`` passes, top down, and the key unit where each ends (the
        last may be left inside: a match would split it there). Changes nothing: no split, no
        access time."""
        return python_descend(self.root_node, self.cache_key(key), 0, self.page_size)

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def node_count(self) -> int:
        return self._node_count

    tree_kind = "python"

    def pretty_print(self, file: IO[str] | None = None) -> None:
        stack = [(self.root_node, 0)]
        while stack:
            node, indent = stack.pop()
            print(" " * indent, len(node.key), node.key.token_ids[:10].tolist(), f"r={node.lock_ref}", file=file)
            stack.extend((child, indent + 2) for child in node.children.values())
        print(f"#tokens: {self.total_size()}", file=file)

    # ----- internals --------------------------------------------------------------------------

    def _as_cache_key(self, key: KeyLike) -> RadixKey:
        if not isinstance(key, RadixKey):
            key = RadixKey(key)
        if self.is_eagle:
            return key.as_bigram()
        if key.is_bigram:
            raise ValueError("a bigram key needs a cache built with is_eagle=True")
        return key

    def _checked_insert(
        self, key: KeyLike, value: Any, value_offset: int, split_at: int | None, prefix_priority: int | None = None
    ) -> tuple[RadixKey, Any, ValueKind]:
        """An insert's arguments checked: the page-aligned cache key, the value (the key's token
        ids where none is given) and its kind."""
        given = key if isinstance(key, RadixKey) else RadixKey(key)
        cache_key = self._as_cache_key(given)
        if not 0 <= value_offset <= len(given):
            raise ValueError(f"value_offset {value_offset} is outside a key of {len(given)} units")
        self._check_split(split_at, prefix_priority)
        if value is None:  # the token ids, one per unit of the cache key
            value = cache_key.token_ids[value_offset : len(cache_key)]
            kind = self._check_value(value, len(cache_key), value_offset)
        else:  # one per raw token of the key given (EAGLE: the cache keeps n - 1 of them)
            kind = self._check_value(value, len(given), value_offset)
        return cache_key.page_aligned(self.page_size), value, kind

    def _check_split(self, split_at: int | None, prefix_priority: int | None) -> None:
        """A split point falls on a page; a prefix inserted again needs one (checked before any change)."""
        if split_at is not None and split_at % self.page_size:
            raise ValueError(f"split_at {split_at} is not a multiple of the page size {self.page_size}")
        if prefix_priority is not None and (split_at is None or split_at <= 0):
            raise ValueError(f"prefix_priority needs a split_at of at least a page, not {split_at}")

    def _check_value(self, value: Any, key_units: int, value_offset: int) -> ValueKind:
        """The kind of ``value``, which must hold an item per unit of a key of ``key_units`` from
        ``value_offset`` on; the first value checked sets the cache's kind."""
        kind = self._kind_of(value)
        items = kind.length(value)
        if items != key_units - value_offset:
            raise ValueError(
                f"value has {items} items but the key has {key_units} from offset {value_offset}; they must match"
            )
        self._settle_kind(kind, value)
        return kind

    def _kind_of(self, value: Any) -> ValueKind:
        """The kind of a device value, checked, which must be the cache's kind if it has one."""
        kind = value_kind_of(value)
        if self._value_kind is not None and kind is not self._value_kind:
            raise TypeError(f"this cache holds {self._value_kind.name} values, not {kind.name}")
        kind.check(value)
        return kind

    def _settle_kind(self, kind: ValueKind, value: Any) -> None:
        """The first value the cache takes sets its kind."""
        if self._value_kind is None:
            self._value_kind = kind
            self._empty_value = kind.cut(value, 0, 0)

    def _join(self, values: list[Any]) -> Any:
        kind = self._value_kind
        if values:
            return kind.concat(values)  # type: ignore[union-attr]
        if kind is None:
            return array("q")
        return self._empty_value if kind.empty_is_shareable else kind.cut(self._empty_value, 0, 0)

    def _enter(self, path: list[TreeNode], ends: list[int], position: int, access_time: float) -> None:
        """What a walk does to the nodes :func:`descend` found, from key position ``position``:
        marks them used; where the key leaves the last one inside, splits it there (replacing it
        in ``path`` by the new upper node). No child continues past such a split: the unit after
        the shared part differs from the split-off lower part's first unit."""
        for child in path:
            child.last_access_time = access_time
        last = path[-1]
        shared = ends[-1] - (ends[-2] if len(ends) > 1 else position)
        if shared < len(last.key):
            self._reprioritize(last)  # the lower part keeps its children and got a new access time
            path[-1] = self._split(last, shared)

    def _follow(
        self,
        known_path: TreeNode,
        units: int,
        access_time: float,
        priority: int,
        inserted_len: int,
        values_of: Callable[[int, int], Any],
    ) -> tuple[TreeNode, int]:
        """What insert's walk does down ``known_path``'s path as far as the key's ``units`` go,
        without comparing tokens (the key ends inside a node: that node is split there, as the
        comparing walk would); returns where the walk stands, to go on from there."""
        node, position = self.root_node, 0
        passed, ends = [], []
        for child in reversed(self._path_to_root(known_path)):
            if position == units:
                break
            end = position + len(child.key)
            child.last_access_time = access_time
            if end > units:  # what _enter does when the key leaves the child inside
                self._reprioritize(child)
                child, end = self._split(child, units - position), units
            passed.append(child)
            ends.append(end)
            node, position = child, end
        if passed:
            self._pass_through(passed, ends, 0, priority, inserted_len, values_of)
        return node, position

    def _pass_through(
        self,
        path: list[TreeNode],
        ends: list[int],
        position: int,
        priority: int,
        inserted_len: int,
        values_of: Callable[[int, int], Any],
    ) -> None:
        """What an insert does to the nodes it walks through, top down from key unit ``position``,
        node ``i`` ending at unit ``ends[i]`` of the key (``values_of(start, stop)`` gives the
        insert's value items of units there, for a tree that stores values in nodes it passes).
        Every node but the last leads on to the next: only the last can be a leaf whose eviction
        priority changes."""
        for child, end in zip(path, ends):
            if priority > child.priority:
                child.priority = priority
            if end > inserted_len:  # SGLang's rule: a request's own earlier inserts are no new hit
                child.hit_count += 1
        self._reprioritize(path[-1])

    def _node(self, key: RadixKey, value: Any, parent: TreeNode | None, priority: int) -> TreeNode:
        """A new node of ``node_class``, used and made now (two clock readings, as SGLang's nodes)."""
        node = self.node_class(key, value, parent, priority)
        node.last_access_time = self.clock()
        node.creation_time = self.clock()
        return node

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut ``child`` after ``at`` units; returns the new upper node (SGLang's node split)."""
        page = self.page_size
        parent: TreeNode = child.parent  # type: ignore[assignment]
        upper = self._node(_stored(child.key._units(0, at)), None, parent, child.priority)
        self._cut_values(upper, child, at)
        upper.hit_count = child.hit_count
        upper.lock_ref = child.lock_ref
        parent.children[child.key.child_key(page)] = upper
        child.key = _stored(child.key._units(at, len(child.key)))
        child.parent = upper
        upper.children[child.key.child_key(page)] = child
        hashes = child.page_hashes
        if hashes is not None:  # as many items per page: the upper node takes at / length of them
            cut = len(hashes) * at // (at + len(child.key))
            upper.page_hashes, child.page_hashes = hashes[:cut], hashes[cut:]
        self._node_count += 1
        return upper

    def _cut_values(self, upper: TreeNode, child: TreeNode, at: int) -> None:
        """Give ``upper``, the new upper part of ``child`` in a split, the first ``at`` value items."""
        kind: ValueKind = self._value_kind  # type: ignore[assignment]
        upper.value, child.value = kind.split(child.value, at)

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return node.lock_ref == 0 and not node.children and node.parent is not None

    def _reprioritize(self, node: TreeNode) -> None:
        """Give an evictable leaf a heap entry with its current priority (older entries go stale)."""
        if self._is_evictable_leaf(node):
            self._heap.push(node, self._eviction_priority(node), next(self._stamps), self._node_count)

    def _lock_path(self, path: list[TreeNode]) -> int:
        delta = 0
        for ancestor in path:
            if ancestor.lock_ref == 0 and ancestor.value is not None:  # only a host tier has None
                units = len(ancestor.key)
                self._evictable_size -= units
                self._protected_size += units
                delta -= units
            ancestor.lock_ref += 1
        return delta

    def _unlock_path(self, path: list[TreeNode]) -> int:
        delta = 0
        for ancestor in path:
            ancestor.lock_ref -= 1
            if ancestor.lock_ref == 0:
                if ancestor.value is not None:  # only a host tier has None
                    units = len(ancestor.key)
                    self._evictable_size += units
                    self._protected_size -= units
                    delta += units
                self._reprioritize(ancestor)
        return delta

    def _locked_path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """:meth:`_path_to_root` of a node whose path is locked; ValueError if it is not."""
        path = self._path_to_root(node)
        for ancestor in path:
            if ancestor.lock_ref <= 0:
                raise ValueError(f"{ancestor!r} is not locked: dec_lock_ref without a matching inc_lock_ref")
        return path

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from ``node`` up to (not including) the root; ValueError if not in this tree."""
        path = []
        while node is not self.root_node:
            if node.parent is None:
                raise ValueError(f"{node!r} is not (or no longer) in this cache")
            path.append(node)
            node = node.parent
        return path
