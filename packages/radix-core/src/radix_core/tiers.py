"""TieredRadixCache: the radix tree with a host tier under the device one (SGLang's HiCache).

A node holds a device value (indices into the device KV pool), a host value (indices into the
host pool), or both; a node with neither is gone. The rules are those of SGLang 0.5.23's Python
TreeCore for full attention (``unified_cache/unified_tree_core.py``, ``components/full.py``):

- device nodes form a rooted subtree; so do host nodes, except under ``write_back``;
- device eviction takes device leaves (unlocked, with no child on the device; host-only children
  allowed) by the eviction policy: a leaf with a host copy is demoted (its device value freed, the
  node kept), one without is deleted (``write_through``) or first backed up through ``back_up``
  (``write_back``; where no host room is found, it is dropped with its host-only subtree);
- host eviction takes host leaves (host-only, childless, no device or host lock) by the same
  policy; ``write_back`` first reclaims host copies of nodes also on the device;
- a match walks through host-only nodes: the device prefix ends at the last device node, the walk
  at the deepest node on either tier (``best_node``), ``host_hit_length`` units past the device;
- an insert through a host-only node gives it the request's device values (nothing to free
  there); a node whose hit count reaches the policy's threshold (1 for ``write_through``, 2 for
  ``write_through_selective``, never for ``write_back``) is reported to be backed up;
- the caller moves the KV (SGLang's cache controller) and tells the tree: ``commit_backup``,
  ``load_back_nodes`` / ``commit_load_back`` / ``finish_load_back``, ``insert_host`` (L3 prefetch).

Sizes (``evictable_size``, ``protected_size``, ``total_size``) are the device tier's, as SGLang
reports them; ``host_size`` is the host tier's. Device locks count along the whole path, the
host-only bottom of it included (without moving sizes: nothing of it is on the device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, cast

from .key import RadixKey
from .python_tree import InsertResult, KeyLike, LazyHeap, MatchResult, PythonTree, TreeNode, descend, no_indices
from .values import ValueKind, value_kind_of

__all__ = [
    "WRITE_POLICIES",
    "HostInsertResult",
    "TieredNode",
    "TieredRadixCache",
]

# The hit count at which a node on the device is to be backed up to the host; None: only when
# device eviction takes it (write_back).
WRITE_POLICIES: dict[str, int | None] = {"write_through": 1, "write_through_selective": 2, "write_back": None}


def _checked_host_value(host_value: Any, units: int, holder: str) -> ValueKind:
    """The kind of a host value, which must hold an item per unit of its ``holder`` (of ``units``)."""
    kind = value_kind_of(host_value)
    kind.check(host_value)
    if kind.length(host_value) != units:
        raise ValueError(f"host value has {kind.length(host_value)} items for {holder} of {units} units")
    return kind


class TieredNode(TreeNode):
    """A node of a :class:`TieredRadixCache`: ``value`` is None once the device copy is gone."""

    __slots__ = ("host_value", "host_lock_ref", "host_lock_edge", "backup_pending", "load_back_pending", "_host_stamp")
    parent: TieredNode | None

    def __init__(self, key: RadixKey, value: Any, parent: TreeNode | None, priority: int = 0):
        super().__init__(key, value, parent, priority)
        self.host_value: Any = None
        self.host_lock_ref = 0
        self.host_lock_edge: int | None = None  # the top node of a host lock's segment keeps its mark
        self.backup_pending = False  # a device-to-host copy submitted, not yet acknowledged
        self.load_back_pending: TieredNode | None = None  # the anchor of a host-to-device copy in flight
        self._host_stamp = -1  # as _heap_stamp, for the host eviction heap


class HostInsertResult(NamedTuple):
    """What ``insert_host`` did: the host value items of the ``adopted`` unit ranges are the
    tree's now (free the rest); ``last_node`` is where the key ends, None if it was dropped;
    ``refilled``: the nodes on the way that took their host copy from it, top down."""

    adopted: list[tuple[int, int]]
    last_node: TieredNode | None
    refilled: list[TieredNode]


class TieredRadixCache(PythonTree):
    """A :class:`~radix_core.RadixCache` whose nodes may also (or only) live in a host tier.

    ``write_policy``: one of :data:`WRITE_POLICIES`. ``back_up(node)``: under ``write_back``,
    device eviction asks it to copy an unbacked leaf's device KV to the host; it returns the host
    value (the node is then demoted) or None (no host room: the node and its host-only subtree
    are dropped, unless something there is locked or in flight). ``on_evict`` receives freed
    device values, ``on_host_evict`` freed host values; ``on_store`` / ``on_remove`` each node
    that enters / leaves the tree.
    """

    def __init__(
        self,
        page_size: int = 1,
        is_eagle: bool = False,
        eviction_policy: str = "lru",
        write_policy: str = "write_through",
        on_evict: Callable[[Any], None] | None = None,
        on_host_evict: Callable[[Any], None] | None = None,
        back_up: Callable[[TieredNode], Any] | None = None,
        on_store: Callable[[TreeNode], None] | None = None,
        on_remove: Callable[[TreeNode], None] | None = None,
        node_class: type[TieredNode] = TieredNode,
        clock: Callable[[], float] | None = None,
    ):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown write policy {write_policy!r}; use one of: {', '.join(WRITE_POLICIES)}")
        if not issubclass(node_class, TieredNode):
            raise TypeError(f"node_class must be a TieredNode subclass, not {node_class!r}")
        self.write_policy = write_policy
        self.write_back = write_policy == "write_back"
        self.backup_threshold = WRITE_POLICIES[write_policy]
        self.on_host_evict = on_host_evict
        self.back_up = back_up
        super().__init__(page_size, is_eagle, eviction_policy, on_evict, on_store, on_remove, node_class, clock)

    def reset(self) -> None:
        """Drop every cached entry on both tiers (no callback is called)."""
        super().reset()
        self._host_heap = LazyHeap("_host_stamp")  # as _heap, for host leaves
        self._host_size = 0
        self._host_marks = 0
        self._duplicates: dict[int, TieredNode] = {}  # node id -> node on both tiers, lazily pruned
        # Scratch of the running insert: the nodes it passed, whether each counted a hit; the value
        # ranges host-only nodes took.
        self._walked: list[tuple[TieredNode, bool]] = []
        self._adopted: list[tuple[int, int]] = []

    # ----- match and insert -------------------------------------------------------------------

    def _match_result(self, path: list[TreeNode], ends: list[int], indices: bool) -> MatchResult:
        """A match's answer on both tiers: the device prefix ends at the last device node."""
        root = self.root_node
        join = self._join if indices else no_indices
        if not path:
            return MatchResult(0, root, [], join)
        on_device = 0  # device nodes form a rooted subtree: they come first on any path
        while on_device < len(path) and path[on_device].value is not None:
            on_device += 1
        last_device = path[on_device - 1] if on_device else root
        device_units = ends[on_device - 1] if on_device else 0
        self._reprioritize(last_device)
        self._reprioritize(path[-1])
        values = [node.value for node in path[:on_device]] if indices else []
        return MatchResult(device_units, last_device, values, join, path[-1], ends[-1] - device_units)

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
        """:meth:`RadixCache.insert` on the device tier: host-only nodes on the way take the
        insert's values (``adopted``), and nodes that reach the backup threshold are reported
        (this insert's: the prefix inserted again runs once they are)."""
        self._check_split(split_at, prefix_priority)
        self._walked, self._adopted = [], []
        prefix_len, last_node, _, _ = super().insert(
            key,
            value,
            priority,
            inserted_len=inserted_len,
            value_offset=value_offset,
            known_path=known_path,
            copy=copy,
            split_at=split_at,
        )
        threshold = self.backup_threshold
        to_back_up = []
        if threshold is not None:
            counted = [node for node, counts in self._walked if counts]
            new = last_node is not self.root_node and not any(node is last_node for node, _ in self._walked)
            if new:
                counted.append(cast(TieredNode, last_node))
            to_back_up = [node for node in counted if node.hit_count >= threshold and node.host_value is None]
        result = InsertResult(prefix_len, last_node, self._adopted, to_back_up)
        self._walked, self._adopted = [], []
        if prefix_priority is not None:
            self._insert_prefix_again(key, value, split_at, prefix_priority, last_node)  # type: ignore[arg-type]
        return result

    def _pass_through(
        self,
        path: list[TreeNode],
        ends: list[int],
        position: int,
        priority: int,
        inserted_len: int,
        values_of: Callable[[int, int], Any],
    ) -> None:
        start = position
        for node, end in zip(cast("list[TieredNode]", path), ends):
            if node.value is None:  # host-only: on the device again, with the insert's own values
                node.value = values_of(start, end)
                if node.lock_ref:
                    self._protected_size += end - start
                else:
                    self._evictable_size += end - start
                self._adopted.append((start, end))
                self._note_duplicate(node)
                self._reprioritize(cast(TieredNode, node.parent))  # no longer a device leaf
            self._walked.append((node, end > inserted_len))
            start = end
        super()._pass_through(path, ends, position, priority, inserted_len, values_of)

    def touch(self, node: TreeNode) -> None:
        super().touch(node)
        for ancestor in self._path_to_root(node):  # the device leaf above a host-only node among them
            self._reprioritize(ancestor)

    def backup_chain(self, node: TieredNode) -> list[TieredNode]:
        """``node`` and its ancestors with no host copy, root first: what a write-through backup
        of ``node`` copies, so that host nodes stay a rooted subtree."""
        return self._run_up(node, lambda part: part.host_value is None)

    # ----- backup, load-back, L3 --------------------------------------------------------------

    def commit_backup(self, node: TieredNode, host_value: Any) -> None:
        """``node``'s device KV is copied (or on its way) to ``host_value`` in the host pool."""
        self._check_in_tree(node)
        if node.value is None or node.host_value is not None:
            raise ValueError(f"{node!r} needs a device value and no host value to be backed up")
        _checked_host_value(host_value, len(node.key), "a node")
        node.host_value = host_value
        self._host_size += len(node.key)
        self._note_duplicate(node)

    def mark_backup_pending(self, node: TieredNode) -> None:
        """``node``'s host copy (committed) is still being written: its host copy stays until
        :meth:`finish_backup`."""
        if node.host_value is None:
            raise ValueError(f"{node!r} has no host copy being written")
        node.backup_pending = True

    def finish_backup(self, node: TieredNode) -> None:
        """The copy :meth:`mark_backup_pending` announced has landed."""
        node.backup_pending = False
        self._note_duplicate(node)

    def load_back_nodes(self, node: TieredNode) -> list[TieredNode]:
        """The host-only nodes from ``node`` up to the first device node, root first: what must
        be copied to the device for a request to use the path down to ``node``."""
        self._check_in_tree(node)
        return self._run_up(node, lambda part: part.value is None)

    def host_indices(self, nodes: Iterable[TieredNode]) -> Any:
        """The host values of ``nodes``, joined."""
        values = [node.host_value for node in nodes]
        return value_kind_of(values[0]).concat(values) if values else self._join([])

    def commit_load_back(self, nodes: list[TieredNode], device_value: Any, anchor: TieredNode | None = None) -> None:
        """``nodes`` (a :meth:`load_back_nodes` run) are copied to ``device_value`` on the device;
        the host copies stay. ``anchor`` marks them in flight (their host copies are not reclaimed)
        until :meth:`finish_load_back`."""
        if not nodes:
            return
        top = nodes[0].parent
        if top is not self.root_node and (top is None or top.value is None):
            raise ValueError("a load-back run must start right below a device node")
        for upper, lower in zip(nodes, nodes[1:]):
            if lower.parent is not upper:
                raise ValueError("a load-back run must be a path, root first")
        if any(node.value is not None for node in nodes):
            raise ValueError("a load-back run holds host-only nodes")
        kind = self._kind_of(device_value)
        if kind.length(device_value) != sum(len(node.key) for node in nodes):
            raise ValueError(f"device value has {kind.length(device_value)} items for {len(nodes)} nodes")
        self._settle_kind(kind, device_value)
        start = 0
        for node in nodes:
            self._check_in_tree(node)
            units = len(node.key)
            node.value = kind.cut(device_value, start, start + units)
            start += units
            if node.lock_ref:
                self._protected_size += units
            else:
                self._evictable_size += units
            node.load_back_pending = anchor
            self._note_duplicate(node)
            self._reprioritize(node)
        self._reprioritize(cast(TieredNode, top))

    def finish_load_back(self, anchor: TieredNode) -> None:
        """The copy :meth:`commit_load_back` announced for ``anchor`` has landed."""
        node: TieredNode | None = anchor
        while node is not None and node is not self.root_node:
            if node.load_back_pending is anchor:
                node.load_back_pending = None
                self._note_duplicate(node)
            node = node.parent

    def insert_host(self, node: TieredNode, key: KeyLike, host_value: Any) -> HostInsertResult:
        """Cache ``key``, the units that follow ``node``'s path, on the host tier with
        ``host_value`` (an L3 prefetch). Nodes on the way without a host copy take theirs from
        ``host_value`` (not under write_back) where the node above has one; the rest becomes a
        host-only node, unless (outside write_back) it would hang below a node with no host copy:
        then it is dropped. So host copies stay a rooted subtree: SGLang 0.5.23 refills below a
        node with none (a prefetch anchored on an unbacked node under write_through_selective),
        and deleting that node at device eviction then orphans the copies below it, lost to the
        host pool for good."""
        self._check_in_tree(node)
        key = self._as_cache_key(key)
        kind = _checked_host_value(host_value, len(key), "a key")
        key = key.page_aligned(self.page_size)
        units = len(key)
        access_time = self.clock()
        node.last_access_time = access_time
        self._reprioritize(node)
        adopted: list[tuple[int, int]] = []
        refilled: list[TieredNode] = []
        found, ends = descend(node, key, 0, self.page_size)
        position = 0
        if found:
            self._enter(found, ends, 0, access_time)  # splits the last node where the key leaves it
            path = cast("list[TieredNode]", found)
            above_on_host = node is self.root_node or node.host_value is not None
            for child, end in zip(path, ends):
                if not self.write_back and child.host_value is None and above_on_host:
                    child.host_value = kind.cut(host_value, position, end)
                    self._host_size += end - position
                    adopted.append((position, end))
                    refilled.append(child)
                    self._note_duplicate(child)
                self._reprioritize(child)  # a device leaf above host-only children may be on the path
                above_on_host = child.host_value is not None
                position = end
            node = path[-1]
        if position == units:
            return HostInsertResult(adopted, node, refilled)
        if not self.write_back and node is not self.root_node and node.host_value is None:
            return HostInsertResult(adopted, None, refilled)
        new = cast(TieredNode, self._node(key._units(position, units).compact(), None, node, node.priority))
        new.host_value = kind.cut(host_value, position, units)
        node.children[new.key.child_key(self.page_size)] = new
        self._node_count += 1
        self._host_size += units - position
        adopted.append((position, units))
        self._reprioritize(new)
        if self.on_store is not None:
            self.on_store(new)
        return HostInsertResult(adopted, new, refilled)

    # ----- eviction ---------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device units from device leaves (see the module's rules),
        lowest eviction priority first, or all that can go; returns the units freed."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, not {num_tokens}")
        evicted = 0
        kept = []  # unbacked write_back leaves with no host room that cannot be dropped either
        while evicted < num_tokens:
            node = self.pop_device_leaf()
            if node is None:
                break
            if node.host_value is None and self.write_back:
                host_value = self.back_up(node) if self.back_up is not None else None
                if host_value is None:
                    if self.drop_subtree(node):
                        evicted += len(node.key)
                    else:
                        kept.append(node)
                    continue
                self.commit_backup(node, host_value)
            evicted += self.evict_device_leaf(node)
        for node in kept:  # evictable still: back in the heap for the next eviction
            self.requeue(node)
        return evicted

    def pop_device_leaf(self) -> TieredNode | None:
        """The device leaf eviction takes next (lowest eviction priority), taken off the eviction
        heap (give it back with :meth:`requeue` if it stays); None when there is none. For a
        caller that evicts step by step, as SGLang's UnifiedRadixCache drives its TreeCore."""
        return cast("TieredNode | None", self._pop_evictable_leaf())

    def requeue(self, node: TieredNode) -> None:
        """Give a node :meth:`pop_device_leaf` returned and that stayed back to eviction."""
        self._reprioritize(node)

    def evict_device_leaf(self, node: TieredNode) -> int:
        """Demote a device leaf with a host copy; delete one without (not under write_back,
        where it must be backed up or dropped first). Returns the device units freed."""
        if node.host_value is not None:
            return self.demote(node)
        if self.write_back or not self._is_evictable_leaf(node):
            raise ValueError(f"{node!r} is not an unlocked device leaf that write_through may delete")
        return self._evict_leaf(node)

    def demote(self, node: TieredNode) -> int:
        """Free the device value of a device leaf that has a host copy; the node stays, host-only.
        Returns the units freed."""
        if not (node.host_value is not None and self._is_evictable_leaf(node)):
            raise ValueError(f"{node!r} is not an unlocked device leaf with a host copy")
        value, node.value = node.value, None
        units = len(node.key)
        self._evictable_size -= units  # its entry among the duplicates goes when evict_host passes it
        self._reprioritize(node)
        self._reprioritize(cast(TieredNode, node.parent))
        if self.on_evict is not None:
            self.on_evict(value)
        return units

    def drop_subtree(self, node: TieredNode) -> bool:
        """Delete a device leaf without a host copy and its host-only subtree (write_back's way
        out when the backup finds no host room), unless a node there is locked or in flight;
        returns whether it did."""
        if node.host_value is not None or not self._is_evictable_leaf(node):
            raise ValueError(f"{node!r} is not an unlocked device leaf without a host copy")
        below: list[TieredNode] = []
        stack = list(node.children.values())
        while stack:
            child = cast(TieredNode, stack.pop())
            below.append(child)
            stack.extend(child.children.values())
        if any(self._is_pinned(part) for part in [node, *below]):
            return False
        for part in reversed(below):  # children before their parents
            self._delete_host_leaf(part)
        self._duplicates.pop(node.id, None)
        super()._evict_leaf(node)
        return True

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host units, or all that can go; returns the units freed.
        Under write_back, host copies of nodes also on the device go first (device leaves, soon
        demoted, last); then host leaves, lowest eviction priority first."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, not {num_tokens}")
        freed = 0
        if self.write_back:
            for spare_device_leaves in (True, False):
                for node in list(self._duplicates.values()):
                    if freed >= num_tokens:
                        break
                    if node.parent is None or node.value is None or node.host_value is None:
                        del self._duplicates[node.id]  # no longer on both tiers: forgotten
                    elif spare_device_leaves and self._is_evictable_leaf(node):
                        continue
                    elif self._is_duplicate(node) and not node.host_lock_ref:
                        freed += self._drop_host_value(node)
                        del self._duplicates[node.id]
        while freed < num_tokens:
            leaf = self._host_heap.pop(self._is_host_leaf)  # type: ignore[arg-type]  # its nodes are tiered
            if leaf is None:
                break
            parent = leaf.parent
            freed += self._delete_host_leaf(cast(TieredNode, leaf))
            self._reprioritize(cast(TieredNode, parent))
        return freed

    # ----- locks ------------------------------------------------------------------------------

    def inc_host_lock_ref(self, node: TieredNode) -> int | None:
        """Keep ``node``'s host copy from host eviction (and, after splits, the copies of the
        upper parts it was cut into); returns the mark to release it with, None where there is
        nothing to lock (no host copy, outside write_back)."""
        self._check_in_tree(node)
        if node.host_value is None and not self.write_back:
            return None
        if node.host_lock_edge is None:
            self._host_marks += 1
            node.host_lock_edge = self._host_marks
        node.host_lock_ref += 1
        return node.host_lock_edge

    def dec_host_lock_ref(self, node: TieredNode, mark: int | None) -> None:
        """Release a lock :meth:`inc_host_lock_ref` returned ``mark`` for on ``node``."""
        if mark is None:
            return
        current: TieredNode | None = node
        while True:
            if current is None or current.host_lock_ref <= 0:
                raise ValueError(f"no host lock {mark} held from {node!r}")
            current.host_lock_ref -= 1
            self._reprioritize(current)
            if current.host_lock_edge == mark:
                return
            current = current.parent

    def host_size(self) -> int:
        """Units cached on the host tier."""
        return self._host_size

    # ----- internals --------------------------------------------------------------------------

    def _cut_values(self, upper_part: TreeNode, lower_part: TreeNode, at: int) -> None:
        upper, child = cast(TieredNode, upper_part), cast(TieredNode, lower_part)
        if child.value is not None:
            super()._cut_values(upper, child, at)
        if child.host_value is not None:
            kind = value_kind_of(child.host_value)
            upper.host_value, child.host_value = kind.split(child.host_value, at)
        # A host lock covers its node and the upper parts later cut from it: the mark moves up.
        upper.host_lock_ref = child.host_lock_ref
        upper.host_lock_edge, child.host_lock_edge = child.host_lock_edge, None
        upper.backup_pending = child.backup_pending
        upper.load_back_pending = child.load_back_pending
        self._note_duplicate(upper)

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        """A device leaf: unlocked, on the device, no child on the device."""
        if node.lock_ref or node.value is None or node.parent is None:
            return False
        return all(child.value is None for child in node.children.values())

    def _is_host_leaf(self, node: TieredNode) -> bool:
        return (
            node.value is None
            and node.host_value is not None
            and not node.children
            and not node.lock_ref
            and not node.host_lock_ref
            and node.parent is not None
        )

    def _is_duplicate(self, node: TieredNode) -> bool:
        """On both tiers, nothing in flight: the host copy may go (write_back)."""
        return (
            node.parent is not None
            and node.value is not None
            and node.host_value is not None
            and not node.backup_pending
            and node.load_back_pending is None
        )

    def _note_duplicate(self, node: TieredNode) -> None:
        """Registers a node that became a duplicate; entries go when evict_host passes them (so a
        node keeps its first place, as in SGLang) or their node leaves the tree. write_back only:
        the other policies never reclaim duplicates."""
        if self.write_back and self._is_duplicate(node):
            self._duplicates.setdefault(node.id, node)

    def _is_pinned(self, node: TieredNode) -> bool:
        return bool(node.lock_ref or node.host_lock_ref or node.backup_pending or node.load_back_pending is not None)

    def _reprioritize(self, any_node: TreeNode) -> None:
        super()._reprioritize(any_node)
        node = cast(TieredNode, any_node)
        if self._is_host_leaf(node):
            self._host_heap.push(node, self._eviction_priority(node), next(self._stamps), self._node_count)

    def _drop_host_value(self, node: TieredNode) -> int:
        host_value, node.host_value = node.host_value, None
        units = len(node.key)
        self._host_size -= units
        if self.on_host_evict is not None:
            self.on_host_evict(host_value)
        return units

    def _delete_host_leaf(self, node: TieredNode) -> int:
        """Take a host-only node with no children out of the tree; returns the host units freed."""
        parent = cast(TieredNode, node.parent)
        del parent.children[node.key.child_key(self.page_size)]
        node.parent = None
        self._node_count -= 1
        self._duplicates.pop(node.id, None)
        units = self._drop_host_value(node)
        if self.on_remove is not None:
            self.on_remove(node)
        return units

    def _run_up(self, node: TieredNode, lacking: Callable[[TieredNode], bool]) -> list[TieredNode]:
        """``node`` and its ancestors up to the root or the first not ``lacking``, root first."""
        run = []
        while node is not self.root_node and lacking(node):
            run.append(node)
            node = cast(TieredNode, node.parent)
        run.reverse()
        return run

    def _check_in_tree(self, node: TreeNode) -> None:
        if node is not self.root_node:
            self._path_to_root(node)
