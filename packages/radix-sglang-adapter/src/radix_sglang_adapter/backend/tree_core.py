"""RadixTreeCore: SGLang's UnifiedRadixCache on radix-core's trees (HiCache, hybrid models).

SGLang 0.5.22+'s ``UnifiedRadixCache`` drives a TreeCore through ``UnifiedTreeCoreInterface``, by
node id. This core answers it with a ``radix_core.TieredRadixCache`` for full attention (with
HiCache), or a ``radix_core.WindowedRadixCache`` for a hybrid model's FULL and SWA components
(without HiCache; with KV events, the stores and removals SGLang's TreeCore records); what it does
not serve (the mamba component, session radix cache, buffer-only host memory, the external cache
linker, host-tier KV events) is refused when asked for, naming it, never served wrong. With L3
storage on, each node keeps its pages' storage hashes (SGLang's own hash of SGLang's key) in
``page_hashes``, which the tree cuts with the node. Imported only when SGLang builds a cache with
it: it imports SGLang.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    _dfs_weight_order,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.cache_action import (
    BackupKV,
    FreeDeviceKV,
    FreeDeviceKVFullOnly,
    RecoverSWAWithLockedFull,
    SWARebuild,
)
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components import CacheTransferPhase
from sglang.srt.mem_cache.unified_cache.unified_tree_core import StorageBackupSpec
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    BaseEvictionResult,
    DecSwaLockOnlyResult,
    DemoteResult,
    DriveHostEvictionResult,
    DropSubtreeNoHostResult,
    EvictDeviceLeafResult,
    EvictDeviceNextNodeResult,
    InsertStepResult,
    TreePathNodeInfo,
    UnifiedTreeCoreInterface,
)
from sglang.srt.mem_cache.utils import get_storage_hash_str

import radix_core
from radix_core import TieredNode, TieredRadixCache, WindowedRadixCache
from radix_core.windows import FreeValue, PublishWindow, RecoverWindowUnderLock

from .kv_events import TreeEvents
from .refusals import Setup, refuse_unserved
from .translation import backup_chains, duplicate_ranges, match_result, merged, namespace, on_tree

FULL = ComponentType.FULL
SWA = ComponentType.SWA
NodeId = int


def _refuse(what: str) -> NoReturn:
    raise NotImplementedError(
        f"--radix-cache-backend radix does not serve {what} on its TreeCore yet; "
        "run without it, or use SGLang's own cache"
    )


def _refused(what: str) -> Callable[..., NoReturn]:
    """A method of SGLang's interface that this core refuses (whatever it is called with)."""

    def refuse(self: RadixTreeCore, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(what)

    return refuse


def _policy_setting(attribute: str) -> Any:
    """A setting SGLang's controller reads and writes; each write re-syncs the tree's backup policy."""

    def write(core: RadixTreeCore, value: Any) -> None:
        setattr(core, attribute, value)
        core._sync_policy()

    return property(operator.attrgetter(attribute), write)


class CoreNode(TieredNode):
    """A tiered node that files itself by id in its core's arena when made (splits included).

    Each core makes its own subclass, whose ``core`` is a weak reference to it: radix-native's walk
    keeps every node class it has read for the life of the process, so a class holding the arena
    itself would keep every tree a core ever made (each reset's, each dead core's)."""

    __slots__ = ()
    core: Callable[[], RadixTreeCore | None]

    def __init__(self, key: radix_core.RadixKey, value: Any, parent: Any, priority: int = 0):
        super().__init__(key, value, parent, priority)
        self.core()._arena[self.id] = self  # type: ignore[union-attr]  # a live core makes its nodes


class RadixTreeCore(UnifiedTreeCoreInterface):
    """A TreeCore on radix-core's trees, FULL alone or FULL and SWA; node ids are radix-core node ids."""

    supports_rotation_base = False

    def __init__(self, params: CacheInitParams, components: dict[ComponentType, Any]):
        self._setup = Setup.of_tree_core(params, components)
        refuse_unserved(self._setup)
        # The units a request's window reads (its draft's included), when the model has SWA layers.
        self.window: int | None = params.swa_retain_window if SWA in components else None
        self.gates_prefix_match = bool(params.swa_gates_prefix_match)
        self.page_size = params.page_size
        self.is_eagle = bool(params.is_eagle)
        self.eviction_policy = params.eviction_policy.lower()
        allocator = params.token_to_kv_pool_allocator
        self.device = allocator.device if allocator is not None else torch.device("cpu")
        self.enable_hicache = False
        self.is_host_memory_buffer_only = False
        self.enable_storage = False
        self.enable_external_cache_linker = False
        self.has_swa_host_pool = False
        self._write_through_threshold = 256
        self._is_write_back = False
        self.kv_events = KVCacheEventRecorder(
            enabled=params.enable_kv_cache_events,
            page_size=self.page_size,
            dynamo_format=params.dynamo_kv_event_format,
            lora_names=params.kv_event_lora_names,
        )
        self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._node_class = type("CoreNode", (CoreNode,), {"__slots__": (), "core": weakref.ref(self)})
        self.reset()

    # ----- state the controller reads and writes ---------------------------------------------

    write_through_threshold = _policy_setting("_write_through_threshold")
    is_write_back = _policy_setting("_is_write_back")

    def _sync_policy(self) -> None:
        """The tree backs up what SGLang's core would: on a hit threshold with HiCache on and
        outside write_back, never otherwise."""
        tree = self.tree
        tree.write_back = self._is_write_back
        tree.write_policy = "write_back" if self._is_write_back else "write_through"
        counting = self.enable_hicache and not self._is_write_back
        tree.backup_threshold = self._write_through_threshold if counting else None

    def set_hicache_enabled(self) -> None:
        refuse_unserved(dataclasses.replace(self._setup, hicache=True))
        self.enable_hicache = True
        self._sync_policy()

    # ----- the tree ---------------------------------------------------------------------------

    def reset(self) -> None:
        self._arena: dict[int, CoreNode] = {}
        self._device_frees: list[Any] = []  # what the tree freed, until _collect() hands it to SGLang
        self._window_frees: list[Any] = []
        self._host_frees: list[Any] = []
        self._insert_walk: Any = None  # a hybrid insert suspended at a publish, and its actions so far
        self._insert_actions: list[Any] = []
        # A node's page_hashes hold its KV events' digests, or else (HiCache, where events are
        # refused) its L3 storage hashes.
        self._events = TreeEvents(self.kv_events, self.page_size) if self.kv_events.enabled else None
        on_store = self._events.stored if self._events else self._hash_if_stored
        self.tree: TieredRadixCache
        if self.window is None:
            self.tree = TieredRadixCache(
                self.page_size,
                self.is_eagle,
                self.eviction_policy,
                on_evict=self._device_frees.append,
                on_host_evict=self._host_frees.append,
                on_store=on_store,
                on_remove=self._forget,
                node_class=self._node_class,
            )
        else:  # stamps uses from a counter, as SGLang's TreeCore: a match's ancestors go just below
            self.tree = WindowedRadixCache(
                self.window,
                self.page_size,
                self.is_eagle,
                self.eviction_policy,
                gates_prefix_match=self.gates_prefix_match,
                on_evict=self._device_frees.append,
                on_window_evict=self._window_frees.append,
                on_store=on_store,
                on_remove=self._forget,
                node_class=self._node_class,
                clock=itertools.count(1.0).__next__,
            )
        self.root_node = self.tree.root_node
        self._namespaces: dict[Any, tuple[Any, Any]] = {}
        self._eviction_target = 0
        self._sync_policy()
        root = self.root_node.id
        self._empty_match_result = MatchResult(
            device_prefix_len=0, last_device_node=root, last_host_node=root, best_match_node=root, cache_actions=[]
        )

    # ----- L3 storage: page hash chains -----------------------------------------------------------

    def _hash_if_stored(self, node: Any) -> None:
        """A node entered the tree: with storage on, its pages get their storage hashes."""
        if self.enable_storage and node.page_hashes is None:
            node.page_hashes = self._storage_hashes(node)

    def _storage_hashes(self, node: Any) -> list[str]:
        """SGLang's storage hashes of ``node``'s pages, chained from its parent's last one."""
        parent = node.parent
        prior = parent.page_hashes[-1] if parent is not self.root_node and parent.page_hashes else None
        extra_key, salt = self._namespaces.get(node.key.extra_key, (node.key.extra_key, None))
        key = RadixKey(node.key.token_ids, extra_key, node.key.is_bigram, None, salt)
        return cast("list[str]", get_storage_hash_str(key, prior, page_size=self.page_size))

    def get_last_hash_value(self, node_id: NodeId) -> str | None:
        hashes = self._node(node_id).page_hashes
        return hashes[-1] if hashes else None

    def get_prefix_hash_values(self, node_id: NodeId) -> list[str]:
        """The hashes of the node's ancestors, root first, up to the first one without (as SGLang)."""
        chunks, node = [], self._node(node_id).parent
        while node is not None and node is not self.root_node and node.page_hashes is not None:
            chunks.append(node.page_hashes)
            node = node.parent
        return [value for chunk in reversed(chunks) for value in chunk]

    def get_hash_values(self, node_id: NodeId) -> list[str]:
        return list(self._node(node_id).page_hashes or [])

    def backfill_missing_hash_values(self) -> int:
        filled, stack = 0, list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.page_hashes is None:
                node.page_hashes = self._storage_hashes(node)
                filled += 1
            stack.extend(node.children.values())
        return filled

    def build_storage_backup_spec(self, node_id: NodeId, pass_prefix_keys: bool) -> StorageBackupSpec | None:
        node = self._node(node_id)
        if node.host_value is None:
            return None
        prefix = self.get_prefix_hash_values(node_id) if pass_prefix_keys else None
        return StorageBackupSpec(node.host_value, node.key.token_ids, node.page_hashes, prefix, {})

    def _forget(self, node: Any) -> None:
        """A node left the tree: its id no longer resolves (and its pages are removed, with events)."""
        self._arena.pop(node.id, None)
        if self._events is not None:
            self._events.removed(node)

    def _node(self, node_id: NodeId) -> TieredNode:
        return self._arena[node_id]

    node_by_id = _node

    def _tree_key(self, key: RadixKey) -> radix_core.RadixKey:
        tree_namespace = namespace(key.extra_key, key.cache_salt)
        self._namespaces.setdefault(tree_namespace, (key.extra_key, key.cache_salt))
        return radix_core.RadixKey(key.token_ids, tree_namespace, key.is_bigram, key.limit)

    def is_write_through_compatible(self) -> bool:
        root = self.root_node
        return all(
            node.host_value is None or node.parent is root or cast(TieredNode, node.parent).host_value is not None
            for node in self._arena.values()
            if node is not root
        )

    def is_backuped(self, node_id: NodeId) -> bool:
        return self._node(node_id).host_value is not None

    def is_root(self, node_id: NodeId) -> bool:
        return node_id == self.root_node.id

    def root_node_handle(self, extra_key: str | None = None) -> NodeId:
        return self.root_node.id

    def dfs_weight_order(self, node_ids: Sequence[NodeId]) -> list[int]:
        return _dfs_weight_order(self.root_node, node_ids, self._node)

    def collect_path_info(self, end_node_ids: Sequence[NodeId]) -> tuple[tuple[TreePathNodeInfo, ...], ...]:
        paths = []
        for node_id in end_node_ids:
            path, start = [], 0
            for node in self.tree.path_to(self._node(node_id)):
                end = start + len(node.key)
                value = None if node.value is None else len(node.value)
                parent = cast(TieredNode, node.parent)
                path.append(TreePathNodeInfo(node.id, parent.id, start, end, value, len(node.children)))
                start = end
            paths.append(tuple(path))
        return tuple(paths)

    # ----- match --------------------------------------------------------------------------------

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        if isinstance(self.tree, WindowedRadixCache):
            return self._match_window(params)
        found = self.tree.match_prefix(self._tree_key(params.key), indices=False)
        return match_result(found, self.root_node, self._empty_match_result, tree_core=True)

    def _match_window(self, params: MatchPrefixParams) -> MatchResult:
        """A hybrid model's match: usable where the window is, walked as far as full attention is;
        past the usable prefix, the last page-aligned unit of the walk is where a request's SWA
        branches (SGLang's ``swa_branching_seqlen``)."""
        found = cast(WindowedRadixCache, self.tree).match_window(self._tree_key(params.key))
        if found.deepest is self.root_node:
            return self._empty_match_result
        best = found.last_node.id
        aligned = found.hit_len // self.page_size * self.page_size
        return MatchResult(
            device_prefix_len=found.prefix_len,
            last_device_node=best,
            last_host_node=best,
            best_match_node=best,
            last_visited_node_id=found.deepest.id,
            full_kv_hit_length=found.hit_len,
            swa_branching_seqlen=aligned if aligned > found.prefix_len else None,
            cache_actions=[],
        )

    @property
    def empty_match_result(self) -> MatchResult:
        return self._empty_match_result

    def match_full_device_prefix(self, key: RadixKey) -> tuple[int, NodeId, int]:
        path, ends = self.tree.walk(self._tree_key(key))
        node, matched, pinned = self.root_node, 0, 0
        for child, end in zip(path, ends):
            if child.value is None:
                break
            node, matched, pinned = child, end, pinned + len(child.key)
        return matched, node.id, pinned

    def is_full_device_evicted(self, node_id: NodeId) -> bool:
        node = self._node(node_id)
        return node is not self.root_node and node.value is None

    def collect_full_device_indices(self, from_node_id: NodeId, until_node_id: NodeId) -> torch.Tensor:
        until = self._node(until_node_id)
        node, parts = self._node(from_node_id), []
        while node is not until:
            parts.append(node.value)
            node = cast(TieredNode, node.parent)
        return torch.cat(parts[::-1]) if parts else self._empty

    # ----- insert -------------------------------------------------------------------------------

    def begin_insert(self, params: InsertParams) -> InsertStepResult:
        """The walk has no barrier for FULL alone: one step, done when it returns (nothing stays in
        flight, as SGLang's core after its last step), its actions in SGLang's order (the
        duplicates to free, then each backup chain, root first, an ancestor in one chain only).
        A hybrid model's walk stops after each window it publishes (SGLang applies the
        ``SWARebuild`` before the walk goes on)."""
        if self._insert_walk is not None:
            raise RuntimeError("concurrent insert walks")
        key = self._tree_key(params.key)
        value = params.value
        if value is None:  # SGLang stores the token ids themselves then
            value = torch.tensor(key.token_ids[: len(key)], dtype=torch.int64)
        if isinstance(self.tree, WindowedRadixCache):
            walk = self.tree.insert_window(
                key,
                value,
                self._insert_actions,
                params.priority or 0,
                inserted_len=params.inserted_len,
                prev_prefix_len=params.prev_prefix_len,
                window_floor=params.get_evicted_seqlen(SWA),
            )
            self._insert_walk = (walk, params)
            return self.resume_insert()
        tree = self.tree
        result = tree.insert(key, value, params.priority or 0, inserted_len=params.inserted_len)
        actions: list[Any] = []
        duplicates = merged(duplicate_ranges(result, self.root_node, params.prev_prefix_len))
        if duplicates:
            actions.append(FreeDeviceKV([value[start:stop] for start, stop in duplicates]))
        actions.extend(BackupKV([part.id for part in chain]) for chain in backup_chains(tree, result.to_back_up))
        ranges = merged([*result.adopted, (result.prefix_len, len(tree.cache_key(key)))])
        insert_result = InsertResult(
            prefix_len=result.prefix_len,
            last_device_node=result.last_node.id,
            adopted_ranges={FULL: ranges} if params.track_adopted_ranges else None,
        )
        return InsertStepResult(actions=actions, result=insert_result)

    def resume_insert(self) -> InsertStepResult:
        if self._insert_walk is None:
            raise RuntimeError("no in-flight insert")
        walk, params = self._insert_walk
        try:
            next(walk)
        except StopIteration as done:
            self._insert_walk = None
            result = self._window_insert_result(done.value, params)
            return InsertStepResult(actions=self._take_insert_actions(), result=result)
        return InsertStepResult(actions=self._take_insert_actions())

    def _window_insert_result(self, inserted: Any, params: InsertParams) -> InsertResult:
        result = InsertResult(prefix_len=inserted.prefix_len, last_device_node=inserted.last_node.id)
        if params.swa_branching_seqlen is not None:
            result.swa_branch_inserted = len(params.key) >= params.swa_branching_seqlen
        if params.track_adopted_ranges:
            ranges = {FULL: merged(inserted.adopted), SWA: merged(inserted.adopted_window)}
            result.adopted_ranges = {component: spans for component, spans in ranges.items() if spans}
        return result

    def _take_insert_actions(self) -> list[Any]:
        """The hybrid insert's actions so far, as SGLang's cache actions (the list emptied)."""
        actions = []
        for action in self._insert_actions:
            if isinstance(action, FreeValue):
                actions.append((FreeDeviceKV if action.window_too else FreeDeviceKVFullOnly)([action.value]))
            elif isinstance(action, PublishWindow):
                actions.append(SWARebuild(action.node.id, action.full_value))
            elif isinstance(action, RecoverWindowUnderLock):
                actions.append(RecoverSWAWithLockedFull(action.node.id, action.kept, action.incoming))
        self._insert_actions.clear()
        return actions

    def has_ongoing_insert(self) -> bool:
        return self._insert_walk is not None

    def end_insert(self) -> list[Any]:
        if self._insert_walk is not None:
            self._insert_walk[0].close()
            self._insert_walk = None
        return self._take_insert_actions()

    # ----- locks --------------------------------------------------------------------------------

    def inc_lock_ref(self, node_id: NodeId, skip_lock_components: Sequence[ComponentType] = ()) -> IncLockRefResult:
        """FULL locks the whole path; SWA the window above the node, its receipt carrying the mark
        where the window's release stops."""
        skipped = tuple(skip_lock_components)
        result = IncLockRefResult(node_id=node_id, skipped_lock_components=skipped)
        node = self._node(node_id)
        if FULL not in skipped:
            result.delta = -self.tree.inc_lock_ref(node)
        if isinstance(self.tree, WindowedRadixCache) and SWA not in skipped:
            result.set_lock_uuid(SWA, self.tree.lock_window(node))
        return result

    def dec_lock_ref(self, node_id: NodeId, params: DecLockRefParams, skip_swa: bool = False) -> DecLockRefResult:
        """``skip_swa``: the window was released early already (``dec_swa_lock_only``)."""
        self._check_receipt(node_id, params)
        node = self._node(node_id)
        windowed = isinstance(self.tree, WindowedRadixCache) and SWA not in params.skipped_lock_components
        if windowed and not skip_swa:
            cast(WindowedRadixCache, self.tree).unlock_window(node, params.get_lock_uuid(SWA))
        if FULL not in params.skipped_lock_components:
            self.tree.dec_lock_ref(node)
        return DecLockRefResult()

    def dec_swa_lock_only(self, node_id: NodeId, params: DecLockRefParams) -> DecSwaLockOnlyResult:
        """Give back a request's window lock early, its FULL lock kept (decode has moved past the
        window); a device leaf left unlocked loses its window KV at once."""
        self._check_receipt(node_id, params)
        result = DecSwaLockOnlyResult()
        if not isinstance(self.tree, WindowedRadixCache):
            _refuse("the SWA component")
        if node_id != self.root_node.id:
            self.tree.release_window(self._node(node_id), params.get_lock_uuid(SWA))
        return self._collect(result)

    @staticmethod
    def _check_receipt(node_id: NodeId, params: DecLockRefParams) -> None:
        if params.node_id != node_id:
            raise AssertionError(f"lock receipt anchored on node {params.node_id} released on node {node_id}")

    def inc_full_pin(self, node_id: NodeId) -> None:
        self.tree.inc_lock_ref(self._node(node_id))

    def dec_full_pin(self, node_id: NodeId) -> None:
        self.tree.dec_lock_ref(self._node(node_id))

    def inc_host_lock_ref(self, node_id: NodeId) -> IncLockRefResult:
        result = IncLockRefResult(node_id=node_id)
        mark = self.tree.inc_host_lock_ref(self._node(node_id))
        if mark is not None:
            result.set_lock_uuid(FULL, mark, lock_host=True)
        return result

    def dec_host_lock_ref(self, node_id: NodeId, params: DecLockRefParams) -> DecLockRefResult:
        if FULL in params.component_host_lock_uuids:
            self.tree.dec_host_lock_ref(self._node(node_id), params.get_lock_uuid(FULL, lock_host=True))
        return DecLockRefResult()

    # ----- eviction -----------------------------------------------------------------------------

    def _collect(self, result: BaseEvictionResult) -> Any:
        """Move what the tree freed during the step into the step's result."""
        if self._device_frees:
            result.device_frees[FULL].extend(self._device_frees)
            result.tracker[FULL] += sum(len(value) for value in self._device_frees)
            self._device_frees.clear()
        if self._window_frees:  # SGLang frees SWA slots by their full indices
            result.device_frees[SWA].extend(self._window_frees)
            result.tracker[SWA] += sum(len(value) for value in self._window_frees)
            self._window_frees.clear()
        if self._host_frees:
            result.host_frees[FULL].extend(self._host_frees)
            self._host_frees.clear()
        return result

    def evict_device_start(self, component_type: ComponentType, request_cnt: int) -> None:
        self._served(component_type)
        self._eviction_target = request_cnt
        if component_type == SWA:
            cast(WindowedRadixCache, self.tree).start_window_eviction()

    def evict_device_next_node(
        self, component_type: ComponentType, tracker: dict[ComponentType, int]
    ) -> EvictDeviceNextNodeResult:
        """FULL: the next device leaf by the eviction policy. SWA: the next unlocked window value
        from the old end of its LRU list: a device leaf to evict whole, else tombstoned here."""
        self._served(component_type)
        result = EvictDeviceNextNodeResult()
        if tracker.get(component_type, 0) >= self._eviction_target:
            return result
        if component_type == FULL:
            node = self.tree.pop_device_leaf()
        else:
            tree = cast(WindowedRadixCache, self.tree)
            node = tree.next_window_victim()
            if node is not None and not tree.is_device_leaf(node):
                tree.tombstone_window(node)
                result.made_progress = True
                return self._collect(result)
        if node is not None:
            result.node_id = node.id
            result.made_progress = True
        return result

    def evict_device_leaf(self, node_id: NodeId, is_write_back: bool) -> EvictDeviceLeafResult:
        node = self._node(node_id)
        result = EvictDeviceLeafResult()
        if node.host_value is None and is_write_back:
            result.backup_kv = BackupKV([node_id])
            return result
        unbacked = node.host_value is None
        self.tree.evict_device_leaf(node)
        self._collect(result)
        if unbacked:
            result.unbacked_tokens = result.tracker[FULL]
        return result

    def demote(self, node_id: NodeId) -> DemoteResult:
        self.tree.demote(self._node(node_id))
        return self._collect(DemoteResult())

    def drop_subtree_no_host(self, node_id: NodeId) -> DropSubtreeNoHostResult:
        result = DropSubtreeNoHostResult()
        node = self._node(node_id)
        result.is_dropped = self.tree.drop_subtree(node)
        if not result.is_dropped:
            self.tree.requeue(node)
        return self._collect(result)

    def evict_device_end(self, component_type: ComponentType) -> None:
        self._served(component_type)
        self._eviction_target = 0
        if component_type == SWA:
            cast(WindowedRadixCache, self.tree).end_window_eviction()

    def drive_host_eviction(self, component_type: ComponentType, num_tokens: int) -> DriveHostEvictionResult:
        result = DriveHostEvictionResult()
        if component_type == FULL:
            freed = self.tree.evict_host(num_tokens)
            self._collect(result)
            result.tracker[FULL] = freed
        return result

    # ----- sizes and values ---------------------------------------------------------------------

    evictable_size = on_tree("evictable_size")
    protected_size = on_tree("protected_size")
    full_evictable_size = evictable_size
    full_protected_size = protected_size

    def component_evictable_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self.tree.evictable_size()
        return self.swa_evictable_size() if component_type == SWA else 0

    def component_protected_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self.tree.protected_size()
        return self.swa_protected_size() if component_type == SWA else 0

    def swa_evictable_size(self) -> int:
        tree = self.tree
        return tree.window_evictable_size() if isinstance(tree, WindowedRadixCache) else 0

    def swa_protected_size(self) -> int:
        tree = self.tree
        return tree.window_protected_size() if isinstance(tree, WindowedRadixCache) else 0

    def _no_component(self) -> int:
        """Mamba sizes: this core has no mamba component."""
        return 0

    mamba_evictable_size = _no_component
    mamba_protected_size = _no_component

    def total_size(self) -> tuple[int, int]:
        tree = self.tree
        return tree.total_size(), tree.window_size() if isinstance(tree, WindowedRadixCache) else 0

    def all_values_flatten(self) -> torch.Tensor:
        values = [node.value for node in self._arena.values() if node.value is not None and node is not self.root_node]
        return torch.cat(values) if values else self._empty

    def all_mamba_values_flatten(self) -> torch.Tensor:
        return self._empty

    def get_component_device_value(self, node_id: NodeId, component_type: ComponentType) -> torch.Tensor | None:
        self._served(component_type)
        node = self._node(node_id)
        if component_type == SWA:
            return cast("torch.Tensor | None", cast(WindowedRadixCache, self.tree).window_value(node))
        return cast("torch.Tensor | None", node.value)

    def set_component_device_value(self, node_id: NodeId, component_type: ComponentType, value: torch.Tensor) -> None:
        """A window value SGLang built for a node an insert published (SWA only: FULL values
        enter through inserts)."""
        if component_type != SWA:
            _refuse(f"setting values of the {component_type.name} component")
        self._served(component_type)
        cast(WindowedRadixCache, self.tree).set_window_value(self._node(node_id), value)

    def component_has_host_value_only(self, node_id: NodeId, component_type: ComponentType) -> bool:
        self._served(component_type)
        if component_type == SWA:
            return False  # no host tier for window values
        node = self._node(node_id)
        return node.value is None and node.host_value is not None

    def _served(self, component_type: ComponentType) -> None:
        if component_type != FULL and not (component_type == SWA and isinstance(self.tree, WindowedRadixCache)):
            _refuse(f"the {component_type.name} component")

    # ----- HiCache: backup, load-back, L3 -------------------------------------------------------

    def build_backup_spec(self, node_id: NodeId) -> tuple[torch.Tensor, dict]:
        node = self._node(node_id)
        value = node.value
        if value is None:
            raise ValueError(f"node {node_id} has no device value to back up")
        return (value[:0] if node.host_value is not None else value), {}

    def build_backup_kv_action(self, node_id: NodeId) -> BackupKV:
        return BackupKV([node.id for node in self.tree.backup_chain(self._node(node_id))])

    def build_hicache_transfers(
        self, component_type: ComponentType, node_id: NodeId, phase: CacheTransferPhase, **_: Any
    ) -> list[PoolTransfer] | None:
        if component_type != FULL:
            _refuse(f"HiCache transfers of the {component_type.name} component")
        if phase != CacheTransferPhase.LOAD_BACK:
            return None
        run = self.tree.load_back_nodes(self._node(node_id))
        host = self.tree.host_indices(run) if run else self._empty
        return [PoolTransfer(name=PoolName.KV, host_indices=host, nodes_to_load=[node.id for node in run])]

    def build_load_back_spec(self, node_id: NodeId, req: Any = None) -> tuple[PoolTransfer, dict]:
        transfer = cast("list[PoolTransfer]", self.build_hicache_transfers(FULL, node_id, CacheTransferPhase.LOAD_BACK))
        kv = transfer[0]
        if any(self._node(nid).load_back_pending not in (None, self._node(node_id)) for nid in kv.nodes_to_load or ()):
            return PoolTransfer(name=PoolName.KV, host_indices=self._empty, nodes_to_load=[]), {}
        return kv, {}

    def commit_backup(self, node_id: NodeId, host_indices: torch.Tensor, comp_xfers: dict) -> None:
        if comp_xfers:
            _refuse("auxiliary component transfers")
        if host_indices.numel() > 0:
            self.tree.commit_backup(self._node(node_id), host_indices.clone())

    def commit_load_back(
        self, node_id: NodeId, device_indices: torch.Tensor, kv_xfer: PoolTransfer, comp_xfers: dict
    ) -> list[Any]:
        if comp_xfers:
            _refuse("auxiliary component transfers")
        kv_xfer.device_indices = device_indices
        nodes = [self._node(nid) for nid in kv_xfer.nodes_to_load or ()]
        anchor = self._node(node_id) if self._is_write_back else None  # pins host copies, as SGLang
        self.tree.commit_load_back(nodes, device_indices, anchor=anchor)
        return []

    def finish_load_back(self, anchor_node_id: NodeId) -> None:
        if anchor_node_id in self._arena:
            self.tree.finish_load_back(self._node(anchor_node_id))

    def commit_hicache_transfers(self, node_id: NodeId, phase: CacheTransferPhase, comp_xfers: dict, **_: Any) -> None:
        if comp_xfers:
            _refuse("auxiliary component transfers")

    def mark_write_through_pending(self, node_ids: list[NodeId], ack_id: NodeId) -> list[NodeId]:
        nodes = [self._node(node_id) for node_id in node_ids]
        for node in nodes:
            self.tree.mark_backup_pending(node)
        nodes.sort(key=lambda node: len(self.tree.path_to(node)))
        return [node.id for node in nodes]

    def finish_write_through(self, node_ids: list[NodeId], ack_id: int) -> None:
        for node_id in node_ids:
            if node_id in self._arena:
                self.tree.finish_backup(self._node(node_id))

    def insert_host(
        self, node_id: NodeId, key: RadixKey, host_value: torch.Tensor, hash_value: list[str]
    ) -> InsertResult:
        result = self.tree.insert_host(self._node(node_id), self._tree_key(key), host_value)
        total = len(host_value)
        if result.last_node is None:
            return InsertResult(prefix_len=total, total_len=total, host_insert_dropped=True)
        kept_from = result.adopted[0][0] if result.adopted else total  # the tree took a suffix
        pages = self.page_size
        for node, (first, stop) in zip(result.refilled, result.adopted):  # a range per refill, in order
            if node.page_hashes is None:  # SGLang gives a refilled node the hashes given, if it has none
                node.page_hashes = list(hash_value[first // pages : stop // pages])
        if len(result.adopted) > len(result.refilled):
            first, stop = result.adopted[-1]  # the new node's pages: SGLang keeps the hashes given
            result.last_node.page_hashes = list(hash_value[first // pages : stop // pages])
        last = result.last_node
        inserted = last.id if last.host_value is not None and last is not self.root_node else None
        return InsertResult(prefix_len=kept_from, total_len=total, inserted_host_node=inserted)

    def prefetch_anchor_info(self, node_id: NodeId) -> tuple[str | None, str | None]:
        node = self._node(node_id)
        if node is self.root_node:
            return None, None
        return self._namespaces.get(node.key.extra_key, (node.key.extra_key, None))

    # ----- refused: what this core does not serve -----------------------------------------------

    set_host_memory_buffer_only = _refused("buffer-only host memory")
    snapshot_buffer_backup = _refused("buffer-only host memory")
    validate_buffer_backup = _refused("buffer-only host memory")
    finish_swa_state_eviction = _refused("the SWA component")
    swa_tombstone_ranges = _refused("the SWA component")
    attach_swa_window = _refused("the SWA component")
    finish_mamba_state_eviction = _refused("the MAMBA component")
    evict_excess_path_states = _refused("the MAMBA component")
    walk_for_kv_canary = _refused("the KV canary")
    build_external_linker_offload_transfers = _refused("the external cache linker")
    mark_external_cache_stored_path = _refused("the external cache linker")
    mark_external_linker_offload_pending = _refused("the external cache linker")
    finish_external_linker_offload = _refused("the external cache linker")

    def adjust_component_size(self, node_id: NodeId, component_type: ComponentType, delta: int) -> NoReturn:
        _refuse(f"size adjustments of the {component_type.name} component")

    # ----- debugging ----------------------------------------------------------------------------

    def sanity_check(self, ongoing_write_through: list, ongoing_load_back: list) -> None:
        for _, node_id in ongoing_write_through:
            assert node_id in self._arena, f"write-through of node {node_id} pending on a node gone from the tree"
        assert self.is_write_back or self.is_write_through_compatible(), "host copies must form a rooted subtree"

    pretty_print = on_tree("pretty_print")
