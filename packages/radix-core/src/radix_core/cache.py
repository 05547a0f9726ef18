"""RadixCache: the prefix tree SGLang's scheduler keeps over cached KV indices.

One class answers callers; a store holds the tree: the Python store (``python_tree``: TreeNode
objects, the reference) or radix-native's (``native_tree``: no Python object per node). A native
store that cannot go on (a native failure, or a value it cannot hold losslessly) is swapped for a
Python store rebuilt from it: the cache, the handles it gave out and everything cached stay.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import IO, Any

from . import _backend
from .key import RadixKey
from .native_tree import NativeTree, TreeUnusable
from .python_tree import (
    EVICTION_POLICIES,
    InsertResult,
    KeyLike,
    MatchResult,
    PythonTree,
    TreeNode,
    adds_no_state,
    descend,
    python_descend,
)

__all__ = ["EVICTION_POLICIES", "InsertResult", "MatchResult", "RadixCache", "TreeNode", "descend", "python_descend"]

logger = logging.getLogger("radix_core")


class RadixCache:
    """A radix tree over token-id keys whose nodes hold 1-D integer index values.

    ``page_size``: keys and values are used in whole pages only. ``is_eagle``: keys are read as
    bigrams of their raw tokens (EAGLE speculative decoding), so ``n`` tokens cache ``n - 1``
    units. ``on_evict`` receives each evicted node's value (free it in your KV pool).
    ``on_store`` receives each node an insert adds, top down, once it is linked in the tree;
    ``on_remove`` each node eviction takes out, after ``on_evict``: what a consumer that mirrors
    the tree (a KV event stream) needs; splits call neither (they cut ``page_hashes`` instead).
    ``node_class``: a TreeNode subclass (slots only) the tree makes its nodes of, for a caller
    whose readers expect more of a node (read-only views of its state).

    ``tree``: ``"native"`` keeps the nodes in radix-native's tree (outside the Python heap: the
    garbage collector never walks them) where the native backend is in use, ``node_class`` adds no
    state to TreeNode and the values are int64 (see :mod:`radix_core.native_tree`); ``"python"``
    keeps Python nodes, the reference. The default is ``RADIX_CORE_TREE``'s (``native`` unless
    set: a cache that cannot have it gets the Python tree, quietly). ``tree_kind`` says which
    holds the nodes now.

    ``clock``: what the tree reads for access and creation times (recency policies order by
    them); ``time.monotonic`` as the ``time`` module has it when the cache is made, unless given.
    On the system's clock the native store reads it in C++; on another (a test's ticking clock) it
    reads it from Python, as often as the Python store would.

    Threads: one writer at a time, as SGLang's scheduler uses its cache. Every method, matches
    included (they split nodes and reorder eviction), changes the tree; callers that share a cache
    between threads hold one lock around every call.
    """

    def __init__(
        self,
        page_size: int = 1,
        is_eagle: bool = False,
        eviction_policy: str = "lru",
        on_evict: Callable[[Any], None] | None = None,
        on_store: Callable[[TreeNode], None] | None = None,
        on_remove: Callable[[TreeNode], None] | None = None,
        node_class: type[TreeNode] = TreeNode,
        *,
        tree: str | None = None,
        clock: Callable[[], float] | None = None,
    ):
        if tree is None:
            tree = _backend.default_tree
        elif tree not in _backend.TREE_CHOICES:
            raise ValueError(f"tree must be one of: {', '.join(_backend.TREE_CHOICES)}; not {tree!r}")
        arguments = (page_size, is_eagle, eviction_policy, on_evict, on_store, on_remove, node_class, clock)
        self._store: PythonTree
        if tree == "native" and adds_no_state(node_class) and _backend.native_tree_module() is not None:
            self._store = NativeTree(weakref.ref(self), *arguments)
        else:
            self._store = PythonTree(*arguments)

    # ----- what the cache was built with ------------------------------------------------------

    page_size = property(lambda self: self._store.page_size, doc="Units per page.")
    is_eagle = property(lambda self: self._store.is_eagle, doc="Whether keys are read as bigrams.")
    eviction_policy = property(lambda self: self._store.eviction_policy, doc="One of EVICTION_POLICIES.")
    node_class = property(lambda self: self._store.node_class, doc="The class of the tree's nodes.")
    clock = property(lambda self: self._store.clock, doc="What the tree reads for access and creation times.")

    on_evict = property(
        lambda self: self._store.on_evict,
        lambda self, callback: setattr(self._store, "on_evict", callback),
        doc="Called with each evicted node's value (settable).",
    )
    on_store = property(lambda self: self._store.on_store, doc="Called with each node an insert adds.")
    on_remove = property(lambda self: self._store.on_remove, doc="Called with each node eviction takes out.")

    @property
    def tree_kind(self) -> str:
        """Which store holds the nodes: ``"python"`` (TreeNode objects) or ``"native"``
        (radix-native's tree, until a native failure moves it to Python)."""
        return self._store.tree_kind

    @property
    def root_node(self) -> TreeNode:
        return self._store.root_node

    # ----- the tree ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Drop every cached entry (``on_evict`` is not called)."""
        self._store.reset()

    def match_prefix(self, key: KeyLike, *, indices: bool = True) -> MatchResult:
        """The longest cached prefix of ``key`` (whole pages), splitting a node where it ends inside
        one. ``indices=False``: the result has no indices (None), for a caller that reads them
        later by path, as SGLang does; radix-native's tree then copies none."""
        try:
            return self._store.match_prefix(key, indices=indices)
        except TreeUnusable as unusable:  # the native store gave up before changing anything
            self._move_to_python(unusable)
        return self._store.match_prefix(key, indices=indices)

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
        """Cache ``key`` with one value item per token of ``key``; returns how many units were
        already cached (the caller may free those duplicate values) and the node the key ends at.

        In EAGLE mode a raw key of ``n`` tokens caches ``n - 1`` bigrams with ``value[:n - 1]``.
        Without a value the token ids themselves are stored (useful for tests and simulators).
        ``inserted_len``: units of this key the same request inserted before; as in SGLang, only
        nodes reaching past it count a hit (LFU), so a request re-inserting its growing prefix
        counts each node once. ``value_offset``: ``value`` holds the items of the key from there
        on, for a caller that knows (holds a lock on) the first ``value_offset`` units being
        cached; ValueError if fewer are found (the walk down the cached part has then happened,
        but no node is added). ``known_path``: a node of this cache whose path from the root
        spells the same units as the key, as far as both go (the caller matched or inserted them
        and has held a lock since); the walk follows it without comparing those units again.

        The tree keeps the key's ``array('q')`` itself (no copy) where a new node covers at least
        half of it (SGLang keeps it where the node covers all of it), so the array is never more
        than twice what the tree uses; a shorter part is copied: do not modify an array after
        inserting it. Values are copied, unless ``copy`` is False: then a new node of the Python
        store keeps a slice of ``value`` itself (a view, for tensors and ndarrays), for a caller
        that built ``value`` for the tree.
        ``split_at``: a unit (a whole page) inside the part this insert adds where a next insert
        will end (SGLang's prompt boundary): the new part is stored as two nodes there, the tree
        such an insert would leave, without cutting one node in two.
        ``prefix_priority``: with ``split_at``, that next insert in the same call: the key's first
        ``split_at`` units (all of it if fewer) inserted again at this priority, following this
        insert's last node and counting no hit (SGLang's checkpoint inserts the prompt again so
        that eviction drops the output first); the answer is this insert's.
        """
        options: dict[str, Any] = {
            "inserted_len": inserted_len,
            "value_offset": value_offset,
            "known_path": known_path,
            "copy": copy,
            "split_at": split_at,
            "prefix_priority": prefix_priority,
        }
        try:
            return self._store.insert(key, value, priority, **options)
        except TreeUnusable as unusable:
            self._move_to_python(unusable)
        return self._store.insert(key, value, priority, **options)

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, lowest eviction priority first, until at least ``num_tokens`` units
        are gone or nothing evictable is left; returns the number evicted (whole leaves)."""
        try:
            return self._store.evict(num_tokens)
        except TreeUnusable as unusable:
            self._move_to_python(unusable)
        return self._store.evict(num_tokens)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect ``node`` and its ancestors from eviction; returns the change of evictable size."""
        return self._store.inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Release one lock taken by :meth:`inc_lock_ref`; returns the change of evictable size."""
        return self._store.dec_lock_ref(node)

    def move_lock(self, old: TreeNode, new: TreeNode) -> int:
        """``dec_lock_ref(old)`` then ``inc_lock_ref(new)``, touching only the nodes on one of the
        two paths (a request whose lock moves down as it is cached chunk by chunk keeps most of its
        path); returns the change of evictable size. ValueError, with nothing changed, where either
        call would raise."""
        return self._store.move_lock(old, new)

    def touch(self, node: TreeNode) -> None:
        """Mark the path from the root to ``node`` used now, as a match ending there would, without
        comparing a token. ValueError if ``node`` is not (or no longer) in this cache."""
        self._store.touch(node)

    def path_indices(self, node: TreeNode, start: int = 0, stop: int | None = None) -> Any:
        """The values on the path from the root down to ``node``, joined: the ``indices`` of a
        match that ended there; only units [start, stop) of it if given (SGLang's checkpoint
        rewrites only part of its row), cut to the path. ValueError if ``node`` is not (or no
        longer) in this cache."""
        return self._store.path_indices(node, start, stop)

    def path_to(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root (excluded) down to ``node``. ValueError if ``node`` is not (or
        no longer) in this cache."""
        return self._store.path_to(node)

    def cache_key(self, key: KeyLike) -> RadixKey:
        """``key`` as this cache files it: read as bigrams in EAGLE mode, cut to whole pages."""
        return self._store.cache_key(key)

    def evictable_size(self) -> int:
        """Cached units that eviction may take (not locked)."""
        return self._store.evictable_size()

    def protected_size(self) -> int:
        """Cached units that are locked."""
        return self._store.protected_size()

    def total_size(self) -> int:
        """All cached units; always ``evictable_size() + protected_size()``."""
        return self._store.total_size()

    def node_count(self) -> int:
        """Nodes in the tree, the root excluded."""
        return self._store.node_count()

    def pretty_print(self, file: IO[str] | None = None) -> None:
        """One line per node: depth-indented length, first tokens and lock count."""
        self._store.pretty_print(file)

    def _move_to_python(self, unusable: TreeUnusable) -> None:
        """Serve this cache from a Python store from now on, rebuilt from the native one (which
        gave up before changing anything: the call is then repeated on the new store). A
        native failure is also the process's: radix_core stops using radix-native (logged once
        there)."""
        reason = str(unusable)
        if unusable.failure:
            _backend._native_failed("tree", reason)
            logger.warning("RadixCache moves its tree to Python after a native failure; nothing cached is lost")
        elif unusable.quietly:
            logger.debug("RadixCache keeps its nodes in Python: %s", reason)
        else:
            logger.warning("RadixCache moves its tree to Python: %s", reason)
        self._store = self._store.rebuilt()  # type: ignore[attr-defined]
