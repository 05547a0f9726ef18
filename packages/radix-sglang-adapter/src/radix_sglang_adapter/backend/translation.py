"""Between SGLang's types and radix-core's: what the backend's caches and its TreeCore share
(namespaces, match results, the duplicates an insert frees, backup chains). Imports SGLang.

SGLang namespaces its tree by ``extra_key``, and by ``cache_salt`` too when one is set (an empty
salt is none, as in SGLang's RadixKey); radix-core's keys have one namespace, ``extra_key``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sglang.srt.mem_cache.base_prefix_cache import MatchResult

import radix_core


def namespace(extra_key: Any, cache_salt: Any) -> Any:
    """SGLang's (extra_key, cache_salt) as one radix-core namespace."""
    return extra_key if not cache_salt else (extra_key, cache_salt)


def split_namespace(tree_namespace: Any) -> tuple[str | None, str | None]:
    """A radix-core namespace made by :func:`namespace` back as SGLang's (extra_key, cache_salt)."""
    return tree_namespace if isinstance(tree_namespace, tuple) else (tree_namespace, None)


def match_result(
    found: radix_core.MatchResult, root: Any, empty: MatchResult, *, tree_core: bool = False
) -> MatchResult:
    """radix-core's match (on either tree) as SGLang's ``MatchResult``: the device prefix and, on a
    tiered tree, how far the host tier goes past it; ``empty`` where nothing matched. For a
    ``tree_core``, nodes by id, and the fields UnifiedRadixCache reads of its TreeCore."""
    best = found.best_node
    if best is root:
        return empty
    host_hit_length = found.host_hit_length
    if not tree_core:
        return MatchResult(found.prefix_len, found.last_node, best, best, host_hit_length=host_hit_length)
    return MatchResult(
        found.prefix_len,
        found.last_node.id,
        best.id,
        best.id,
        host_hit_length=host_hit_length,
        full_kv_hit_length=found.prefix_len + host_hit_length,
        cache_actions=[],
        last_visited_node_id=best.id,
    )


def duplicate_ranges(inserted: radix_core.InsertResult, root: Any, protected: int) -> list[tuple[int, int]]:
    """The key ranges of an insert's values that were cached already, past the ``protected``
    first units (the request's own cached prefix), except what host-only nodes took (their device
    copy now): a range per node, top down, as UnifiedRadixCache frees them. An adopted range is
    matched by containment, not by its start: the same insert may cut the node that took it (the
    prompt boundary of a checkpoint), and every part of it is the tree's."""
    matched = inserted.prefix_len
    if matched <= protected:
        return []
    lengths: list[int] = []
    node: Any = inserted.last_node
    while node is not root:
        lengths.append(len(node.key))
        node = node.parent
    ranges, start = [], 0
    for units in reversed(lengths):
        end = start + units
        if end > matched:
            break
        if end > protected and not any(first <= start and end <= last for first, last in inserted.adopted):
            ranges.append((max(start, protected), end))
        start = end
    return ranges


def on_tree(name: str) -> Callable[..., Any]:
    """A method that is the tree's own ``name``: ``self.tree.name(*args)``."""

    def call(self: Any, *args: Any) -> Any:
        return getattr(self.tree, name)(*args)

    return call


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` in order, empty ones left out and those that touch or overlap joined."""
    joined: list[tuple[int, int]] = []
    for start, stop in ranges:
        if start >= stop:
            continue
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], stop))
        else:
            joined.append((start, stop))
    return joined


def backup_chains(tree: Any, nodes: Iterable[Any]) -> list[list[Any]]:
    """What backing up ``nodes`` copies to the host, in order: for each node the ancestors with no
    host copy and the node, root first, an ancestor in the first chain that needs it only."""
    chains: list[list[Any]] = []
    seen: set[int] = set()
    for node in nodes:
        chain = [part for part in tree.backup_chain(node) if part.id not in seen]
        seen.update(part.id for part in chain)
        if chain:
            chains.append(chain)
    return chains
