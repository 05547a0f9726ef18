"""WindowedRadixCache: the tree of a hybrid model, whose nodes also keep sliding-window KV.

A hybrid model's full-attention layers read a request's whole prefix; its sliding-window (SWA)
layers read only the last ``window`` units of it. Its cache keeps, per node, the full value
(indices into the full-attention pool, the tree's ``value``) and a window value (its SWA KV), which
may go while the full value stays: a *tombstone*. The rules are those of SGLang 0.5.23's TreeCore
with FULL and SWA components (``unified_cache/unified_tree_core.py``, ``components/swa.py``):

- a match is usable down to the deepest node whose last ``window`` units, counted since the last
  tombstone on the way, all have window values (with ``gates_prefix_match`` off, a tombstone node
  is usable too); the walk itself goes as deep as the full values match (``hit_len``);
- window values have their own LRU list: a match or an insert moves the nodes of the window above
  the node it ends at to its recent end; window eviction walks it from the other end, skipping
  locked nodes: a device leaf goes whole (the caller evicts it as a leaf), any other node is
  tombstoned in place;
- a request's window lock counts on the nodes from its node up until ``window`` units are covered,
  tombstones included; the top one carries a mark, where the release stops (no mark: the lock
  reaches the root). A lock may be given back early (``release_window``), the full lock kept;
- an insert publishes window values only past ``window_floor``, the units the request's own
  window has already freed: a tombstoned node it passes takes the request's values there (its
  full value is replaced and freed, or kept when locked), and a new leaf is published capped at
  one page-aligned window (a longer one is split first, the upper part published too). Publishing
  is the caller's (SGLang translates full indices to SWA ones): the insert hands back actions, and
  stops at each publish until the caller has given the node its window value.

There is no host tier for window values: a hybrid model's cache runs without HiCache here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, cast

from .key import RadixKey
from .python_tree import KeyLike, PythonTree, TreeNode, _stored, descend
from .tiers import TieredNode, TieredRadixCache
from .values import value_kind_of

__all__ = ["FreeValue", "PublishWindow", "RecoverWindowUnderLock", "WindowMatch", "WindowedRadixCache"]

# A match stamps its node now and each ancestor this much earlier (SGLang's rule), so that among
# the path's nodes the deeper ones are the more recently used.
_ANCESTOR_STEP = 1e-5


class FreeValue(NamedTuple):
    """Free the pool slots of ``value`` (full indices); ``window_too``: their SWA slots as well
    (else those were freed already, or never held)."""

    value: Any
    window_too: bool


class PublishWindow(NamedTuple):
    """Give ``node`` its window value, built from its full value (``set_window_value``)."""

    node: TreeNode
    full_value: Any


class RecoverWindowUnderLock(NamedTuple):
    """A locked tombstone passed by an insert: ``node`` keeps its full value ``kept``; the SWA KV of
    the insert's ``incoming`` values (same units) becomes its window value, ``incoming``'s full
    slots are freed (``set_window_value`` with the window value)."""

    node: TreeNode
    kept: Any
    incoming: Any


class WindowMatch(NamedTuple):
    """``prefix_len`` units are usable, down to ``last_node``; the full values match ``hit_len``
    units, down to ``deepest``."""

    prefix_len: int
    last_node: TieredNode
    hit_len: int
    deepest: TieredNode


class WindowInsertResult(NamedTuple):
    """``prefix_len`` units of the key were cached already; the key ends at ``last_node``. The
    insert's full values of the ``adopted`` ranges are the tree's now, and the window values of
    ``adopted_window`` (key unit ranges, in walk order)."""

    prefix_len: int
    last_node: TieredNode
    adopted: list[tuple[int, int]]
    adopted_window: list[tuple[int, int]]


class _Window:
    """A node's sliding-window state: its value (None: a tombstone), the window locks counted on
    it, the mark of a lock segment that ends at it, and its place in the window LRU list."""

    __slots__ = ("node", "value", "lock_ref", "mark", "newer", "older")

    def __init__(self, node: Any):
        self.node = node
        self.value: Any = None
        self.lock_ref = 0
        self.mark: int | None = None
        self.newer: _Window | None = None  # toward the recent end; None: not in the list
        self.older: _Window | None = None


class WindowedRadixCache(TieredRadixCache):
    """A :class:`~radix_core.TieredRadixCache` (its host tier unused) whose nodes also keep a
    sliding-window value (see the module's rules). ``window``: the units a request's window reads
    (SGLang's retain window, draft window included). ``on_window_evict`` receives the full values
    of nodes whose window value is freed (SGLang frees SWA slots by full index)."""

    def __init__(
        self,
        window: int,
        page_size: int = 1,
        is_eagle: bool = False,
        eviction_policy: str = "lru",
        *,
        gates_prefix_match: bool = True,
        on_evict: Callable[[Any], None] | None = None,
        on_window_evict: Callable[[Any], None] | None = None,
        on_store: Callable[[TreeNode], None] | None = None,
        on_remove: Callable[[TreeNode], None] | None = None,
        node_class: type[TieredNode] = TieredNode,
        clock: Callable[[], float] | None = None,
    ):
        if type(window) is not int or window < 1:
            raise ValueError(f"window must be a positive int, not {window!r}")
        self.window = window
        self.gates_prefix_match = gates_prefix_match
        self.on_window_evict = on_window_evict
        self._marks = itertools.count(1)
        super().__init__(
            page_size,
            is_eagle,
            eviction_policy,
            on_evict=on_evict,
            on_store=on_store,
            on_remove=on_remove,
            node_class=node_class,
            clock=clock,
        )

    def reset(self) -> None:
        """Drop every cached entry (no callback is called)."""
        super().reset()
        self._windows: dict[TreeNode, _Window] = {}
        self._recent = _Window(None)  # the LRU list's ends: recent <-> ... <-> old
        self._old = _Window(None)
        self._recent.older, self._old.newer = self._old, self._recent
        self._window_evictable = 0
        self._window_protected = 0
        self._cursor: _Window | None = None

    # ----- window values and sizes --------------------------------------------------------------

    def window_value(self, node: TreeNode) -> Any:
        """``node``'s window value, None if it has none (a tombstone)."""
        record = self._windows.get(node)
        return None if record is None else record.value

    def window_lock_ref(self, node: TreeNode) -> int:
        record = self._windows.get(node)
        return 0 if record is None else record.lock_ref

    def set_window_value(self, node: TreeNode, value: Any) -> None:
        """``node`` (a tombstone) has a window value now: the most recent in the window LRU."""
        self._check_in_tree(node)
        record = self._record(node)
        if record.value is not None:
            raise ValueError(f"{node!r} has a window value already")
        kind = value_kind_of(value)
        kind.check(value)
        if kind.length(value) != len(node.key):
            raise ValueError(f"window value has {kind.length(value)} items for a node of {len(node.key)} units")
        record.value = value
        self._link_after(self._recent, record)
        if record.lock_ref:
            self._window_protected += len(node.key)
        else:
            self._window_evictable += len(node.key)

    def window_evictable_size(self) -> int:
        return self._window_evictable

    def window_protected_size(self) -> int:
        return self._window_protected

    def window_size(self) -> int:
        """Units holding window values."""
        return self._window_evictable + self._window_protected

    def window_lru(self) -> list[TreeNode]:
        """The nodes with window values, most recently used first."""
        nodes, record = [], self._recent.older
        while record is not self._old:
            nodes.append(record.node)  # type: ignore[union-attr]
            record = record.older  # type: ignore[union-attr]
        return nodes

    # ----- match --------------------------------------------------------------------------------

    def match_window(self, key: KeyLike) -> WindowMatch:
        """The usable prefix of ``key`` (see the module's rules): the node it ends at and its
        window above are marked used, the deeper ones are not; a walk that leaves a node inside
        splits it there."""
        root = cast(TieredNode, self.root_node)
        key = self.cache_key(key)
        if not len(key):
            return WindowMatch(0, root, 0, root)
        path, ends = descend(root, key, 0, self.page_size)
        if not path:
            return WindowMatch(0, root, 0, root)
        start = ends[-2] if len(ends) > 1 else 0
        if ends[-1] - start < len(path[-1].key):
            path[-1] = self._split(path[-1], ends[-1] - start)
        best: TreeNode = root
        usable, covered = 0, float("inf")
        for part, end in zip(path, ends):
            if self.window_value(part) is None:
                covered = 0
                valid = not self.gates_prefix_match and part.value is not None
            else:
                covered += len(part.key)
                valid = covered >= self.window
            if valid:
                best, usable = part, end
        self._refresh_window(best)
        access_time = self.clock()
        stamped: TreeNode | None = best
        while stamped is not None:
            stamped.last_access_time = access_time
            access_time -= _ANCESTOR_STEP
            stamped = stamped.parent
        self._reprioritize(best)
        return WindowMatch(usable, cast(TieredNode, best), ends[-1], cast(TieredNode, path[-1]))

    # ----- insert -------------------------------------------------------------------------------

    def insert_window(
        self,
        key: KeyLike,
        value: Any,
        actions: list[Any],
        priority: int = 0,
        *,
        inserted_len: int = 0,
        prev_prefix_len: int = 0,
        window_floor: int = 0,
    ) -> Generator[None, None, WindowInsertResult]:
        """Insert ``key`` with ``value`` (an item per unit), step by step: the walk appends what the
        caller must do to ``actions`` (:class:`FreeValue`, :class:`PublishWindow`,
        :class:`RecoverWindowUnderLock`, in order) and yields after each node that made a publish,
        for the caller to carry out the actions so far (and empty the list) before going on.
        ``prev_prefix_len``: the units the request had cached already (its own: no duplicates);
        ``window_floor``: the units whose window KV the request has freed."""
        root = cast(TieredNode, self.root_node)
        key = self.cache_key(key)
        kind = self._kind_of(value)
        self._settle_kind(kind, value)
        units = len(key)
        if kind.length(value) < units:
            raise ValueError(f"value has {kind.length(value)} items for a key of {units} units")
        priority = priority or 0
        root.last_access_time = self.clock()
        root.priority = max(root.priority, priority)
        adopted: list[tuple[int, int]] = []
        adopted_window: list[tuple[int, int]] = []
        if not units:
            return WindowInsertResult(0, root, adopted, adopted_window)
        page = self.page_size
        node: TreeNode = root
        position = 0
        while position < units:
            child = node.children.get(key.child_key_at(position, page))
            if child is None:
                break
            flushed = len(actions)
            child.last_access_time = self.clock()
            shared = child.key._shared_units(key, position, page)
            if shared < len(child.key):
                child = self._split(child, shared)
            child.priority = max(child.priority, priority)
            end = position + shared
            reused_from = shared  # the insert's values from here on are the tree's now
            if prev_prefix_len < end and self.window_value(child) is None:
                live = max(position, window_floor)
                if live < end:
                    if live > position:
                        self._split(child, live - position)
                    adopted_window.append((live, end))
                    incoming = value[live:end]
                    if child.lock_ref:
                        actions.append(RecoverWindowUnderLock(child, child.value, incoming))
                    else:
                        adopted.append((live, end))
                        old, child.value = child.value, kind.cut(value, live, end)
                        actions.append(FreeValue(old, window_too=False))
                        actions.append(PublishWindow(child, child.value))
                    reused_from = live - position
            duplicate_from = max(0, prev_prefix_len - position)
            if duplicate_from < reused_from:
                first, stop = position + duplicate_from, position + reused_from
                window_freed = min(max(window_floor - first, 0), stop - first)
                if window_freed:
                    actions.append(FreeValue(value[first : first + window_freed], window_too=False))
                if first + window_freed < stop:
                    actions.append(FreeValue(value[first + window_freed : stop], window_too=True))
            if end > inserted_len:
                child.hit_count += 1
            self._reprioritize(child)
            node, position = child, end
            if _publishes(actions, flushed):
                yield
        flushed = len(actions)
        target: TreeNode = node
        if position < units:
            target = self._new_leaf(node, key._units(position, units), kind.cut(value, position, units), priority)
            adopted.append((position, units))
            live = max(position, window_floor)
            if live < units:
                if live > position:
                    self._split(target, live - position)
                upper = self._cap_to_window(target)
                if upper is not None:
                    actions.append(PublishWindow(upper, upper.value))
                actions.append(PublishWindow(target, target.value))
                adopted_window.append((live, units))
            target.hit_count = 1 if units > inserted_len else 0  # the parts split off above got none
        if _publishes(actions, flushed):
            yield
        if target is not root:
            self._refresh_window(target)
        return WindowInsertResult(position, cast(TieredNode, target), adopted, adopted_window)

    def _new_leaf(self, parent: TreeNode, key: RadixKey, value: Any, priority: int) -> TieredNode:
        leaf = self._node(_stored(key), value, parent, priority)
        parent.children[key.child_key(self.page_size)] = leaf
        self._node_count += 1
        self._evictable_size += len(key)
        self._reprioritize(leaf)
        self._reprioritize(parent)
        if self.on_store is not None:
            self.on_store(leaf)
        return cast(TieredNode, leaf)

    def _cap_to_window(self, leaf: TieredNode) -> TieredNode | None:
        """Split a new leaf longer than one page-aligned window so that its lower part is that
        window (a lock on it then pins no more SWA KV than the window); returns the upper part."""
        page = self.page_size
        tail = -(-self.window // page) * page
        units = len(leaf.key)
        if self.window_lock_ref(leaf) or units <= tail:
            return None
        at = units - tail
        if page > 1 and (at % page or units % page):
            return None
        return cast(TieredNode, self._split(leaf, at))

    # ----- window locks -------------------------------------------------------------------------

    def lock_window(self, node: TreeNode) -> int | None:
        """Lock the window above ``node`` (see the module's rules); returns the mark its release
        stops at, None where the lock reaches the root."""
        self._check_in_tree(node)
        covered, mark = 0, None
        while node is not self.root_node and covered < self.window:
            record = self._record(node)
            if record.lock_ref == 0 and record.value is not None:
                self._window_evictable -= len(node.key)
                self._window_protected += len(node.key)
            record.lock_ref += 1
            covered += len(node.key)
            if covered >= self.window:
                if record.mark is None:
                    record.mark = next(self._marks)
                mark = record.mark
            node = cast(TreeNode, node.parent)
        return mark

    def unlock_window(self, node: TreeNode, mark: int | None) -> list[TreeNode]:
        """Release a lock :meth:`lock_window` took on ``node`` and returned ``mark`` for; returns
        the nodes it left with no window lock, bottom up."""
        self._check_in_tree(node)
        segment = []
        while node is not self.root_node:  # checked whole before any count moves
            record = self._windows.get(node)
            if record is None or record.lock_ref <= 0:
                raise ValueError(f"{node!r} holds no window lock: a release without a matching lock")
            segment.append(record)
            if mark is not None and record.mark == mark:
                break
            node = cast(TreeNode, node.parent)
        unlocked = []
        for record in segment:
            record.lock_ref -= 1
            if record.lock_ref == 0:
                if record.value is not None:
                    self._window_evictable += len(record.node.key)
                    self._window_protected -= len(record.node.key)
                self._reprioritize(record.node)
                unlocked.append(record.node)
        return unlocked

    def release_window(self, node: TreeNode, mark: int | None) -> None:
        """Release a window lock early (the full lock stays): as :meth:`unlock_window`, and an
        unlocked device leaf on the way loses its window value at once (``on_window_evict``)."""
        for unlocked in self.unlock_window(node, mark):
            if self.window_value(unlocked) is not None and self._is_evictable_leaf(unlocked):
                self.tombstone_window(unlocked)

    # ----- window eviction ----------------------------------------------------------------------

    def start_window_eviction(self) -> None:
        """Begin a walk of the window LRU from its old end (:meth:`next_window_victim`)."""
        self._cursor = self._unlocked_from(self._old)

    def next_window_victim(self) -> TieredNode | None:
        """The next unlocked node with a window value on the walk, the walk moved past it; None
        when the walk is done. The caller evicts it whole if it is a device leaf
        (``is_device_leaf``), else tombstones it (:meth:`tombstone_window`)."""
        cursor = self._cursor
        if cursor is not None and cursor.newer is None:  # left the list since: start over
            cursor = self._unlocked_from(self._old)
        if cursor is None:
            self._cursor = None
            return None
        self._cursor = self._unlocked_from(cursor)
        return cast(TieredNode, cursor.node)

    def end_window_eviction(self) -> None:
        self._cursor = None

    def tombstone_window(self, node: TreeNode) -> None:
        """Free ``node``'s window value, its full value kept (``on_window_evict`` gets the full
        value, whose SWA slots are to be freed)."""
        record = self._windows.get(node)
        if record is None or record.value is None or record.lock_ref:
            raise ValueError(f"{node!r} has no unlocked window value")
        self._drop_window(record)
        self._reprioritize(node)

    def is_device_leaf(self, node: TreeNode) -> bool:
        return self._is_evictable_leaf(node)

    # ----- internals ----------------------------------------------------------------------------

    def _record(self, node: TreeNode) -> _Window:
        record = self._windows.get(node)
        if record is None:
            record = self._windows[node] = _Window(node)
        return record

    def _link_after(self, before: _Window, record: _Window) -> None:
        after = cast(_Window, before.older)
        record.newer, record.older = before, after
        before.older = after.newer = record

    def _unlink(self, record: _Window) -> None:
        newer, older = cast(_Window, record.newer), cast(_Window, record.older)
        newer.older, older.newer = older, newer
        record.newer = record.older = None

    def _unlocked_from(self, record: _Window) -> _Window | None:
        """The first record newer than ``record`` with no window lock, None at the recent end."""
        record = cast(_Window, record.newer)
        while record is not self._recent and record.lock_ref:
            record = cast(_Window, record.newer)
        return None if record is self._recent else record

    def _refresh_window(self, node: TreeNode) -> None:
        """Move the window values of ``node`` and its ancestors within a window (and a page) of it
        to the recent end of the LRU list, ``node`` most recent."""
        before, covered, reach = self._recent, 0, self.window + self.page_size
        while node is not self.root_node and covered < reach:
            record = self._windows.get(node)
            if record is not None and record.value is not None:
                self._unlink(record)
                self._link_after(before, record)
                before = record
            covered += len(node.key)
            node = cast(TreeNode, node.parent)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """A split cuts the window state too: the upper part takes the locks, the mark (a lock
        segment's top edge) and its part of the value, just older than the lower part in the LRU
        list; the lower part counts as used now."""
        upper = super()._split(child, at)
        record = self._windows.get(child)
        if record is not None:
            top = self._record(upper)
            top.lock_ref = record.lock_ref
            top.mark, record.mark = record.mark, None
            if record.value is not None:
                top.value, record.value = value_kind_of(record.value).split(record.value, at)
                self._link_after(record, top)
        child.last_access_time = self.clock()
        self._reprioritize(child)
        return upper

    def _drop_window(self, record: _Window) -> None:
        """An unlocked window value freed: out of the LRU list and the sizes, to ``on_window_evict``."""
        record.value = None
        self._unlink(record)
        self._window_evictable -= len(record.node.key)
        if self.on_window_evict is not None:
            self.on_window_evict(record.node.value)

    def _evict_leaf(self, node: TreeNode) -> int:
        record = self._windows.pop(node, None)
        if record is not None and record.value is not None:
            self._drop_window(record)
        return super()._evict_leaf(node)

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return super()._is_evictable_leaf(node) and not self.window_lock_ref(node)

    # No host tier: the device tier's bookkeeping alone.

    def _reprioritize(self, node: TreeNode) -> None:
        PythonTree._reprioritize(self, node)

    def _cut_values(self, upper: TreeNode, lower: TreeNode, at: int) -> None:
        PythonTree._cut_values(self, upper, lower, at)


def _publishes(actions: list[Any], since: int) -> bool:
    """Whether an action from ``since`` on makes the insert wait for the caller."""
    return any(not isinstance(action, FreeValue) for action in actions[since:])
