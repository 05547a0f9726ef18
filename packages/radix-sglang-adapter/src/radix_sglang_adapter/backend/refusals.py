"""What ``--radix-cache-backend radix`` does not serve, as data: one table of refusals, read by the
factory before it builds anything and by the TreeCore when SGLang builds one itself, and one
table of what sends a HiCache server to the TreeCore route instead of ``RadixCoreHiCache``.

Importing this module imports nothing from SGLang; reading a server's setup does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from .registry import SELECT_FLAG


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the refusals look at: SGLang's ``CacheInitParams`` and memory settings, whether HiCache
    is on, which tree components the model needs (a model whose every layer is sliding-window
    attention needs SWA alone), and whether SGLang builds radix's TreeCore itself. ``Setup(params)``
    is what the parameters alone say (a cache built directly, without HiCache)."""

    params: Any
    memory: Any = None
    hicache: bool = False
    components: Collection[str] = ("FULL",)
    tree_core: bool = False

    @classmethod
    def of_context(cls, ctx: Any) -> Setup:
        """The setup of a server SGLang is building a cache for (its TreeCacheBuildContext)."""
        from sglang.srt.runtime_context import get_memory

        pure_swa = bool(ctx.is_hybrid_swa) and ctx.full_tokens_per_layer == 0
        components = ["FULL"] * (not pure_swa) + ["SWA"] * bool(ctx.is_hybrid_swa) + ["MAMBA"] * bool(ctx.is_hybrid_ssm)
        return cls(ctx.params, get_memory(), bool(ctx.enable_hierarchical_cache), components)

    @classmethod
    def of_tree_core(cls, params: Any, components: Collection[Any]) -> Setup:
        """The setup of a TreeCore SGLang builds under its UnifiedRadixCache, as far as it is known
        then: SGLang turns HiCache on later, by a call (the TreeCore checks again with it), and the
        memory settings are the factory's to check (buffer-only host memory comes by a call too,
        which the TreeCore refuses)."""
        return cls(params, None, False, [component.name for component in components], tree_core=True)

    @property
    def policy(self) -> str:
        return self.params.eviction_policy.lower()


def _eviction_policies() -> Collection[str]:
    from radix_core import EVICTION_POLICIES

    return EVICTION_POLICIES


@dataclasses.dataclass(frozen=True)
class Refusal:
    """An option radix cannot serve: when it applies, what the operator asked for (formatted with
    the setup's ``policy``), and why (a string, or made from the setup)."""

    applies: Callable[[Setup], bool]
    option: str
    reason: str | Callable[[Setup], str]


REFUSALS = [
    Refusal(lambda s: s.params.disable, "--disable-radix-cache", "a disabled cache has no tree to run"),
    Refusal(
        lambda s: s.hicache and {"FULL", "SWA"} <= set(s.components),
        "--enable-hierarchical-cache with a hybrid sliding-window (FULL and SWA attention) model",
        "radix-core's tree keeps no host copies of sliding-window KV",
    ),
    Refusal(
        lambda s: s.hicache and "FULL" not in s.components,
        "--enable-hierarchical-cache with a model whose every layer is sliding-window attention",
        "SGLang has no host tier for one either",
    ),
    Refusal(lambda s: "MAMBA" in s.components, "a model with mamba state", "radix-core's tree has no mamba component"),
    Refusal(
        lambda s: not set(s.components) <= {"FULL", "SWA", "MAMBA"},
        "tree components other than FULL, SWA and MAMBA",
        "radix-core's trees have FULL and SWA attention",
    ),
    Refusal(lambda s: getattr(s.memory, "enable_lmcache", False), "--enable-lmcache", "LMCache needs SGLang's tree"),
    Refusal(lambda s: getattr(s.memory, "enable_flexkv", False), "--enable-flexkv", "FlexKV brings its own tree cache"),
    Refusal(
        lambda s: s.params.enable_session_radix_cache,
        "--enable-session-radix-cache",
        "sessions need SGLang's unified tree",
    ),
    Refusal(
        lambda s: s.policy not in _eviction_policies(),
        "--radix-eviction-policy {policy}",
        lambda s: f"radix-core implements {', '.join(_eviction_policies())}",
    ),
    Refusal(
        lambda s: bool(s.params.eviction_policy_config),
        "--radix-eviction-policy-config",
        "radix-core's policies take none",
    ),
    Refusal(
        lambda s: s.hicache and getattr(s.memory, "hicache_host_memory_mode", None) == "buffer_only",
        "--hicache-host-memory-mode buffer_only",
        "radix-core's TreeCore serves the host tier as a cache",
    ),
    Refusal(
        lambda s: s.hicache and s.params.enable_kv_cache_events,
        "--kv-events-config and --enable-hierarchical-cache together",
        "radix-core's TreeCore publishes no host-tier events yet",
    ),
    Refusal(
        lambda s: s.tree_core and s.params.enable_kv_cache_events and "SWA" not in s.components,
        "--kv-events-config with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=radix for full attention alone",
        "the backend publishes them from its own cache there: drop that variable",
    ),
]


def refuse_unserved(setup: Setup) -> None:
    """ValueError where radix cannot serve ``setup``, naming the option and what to do."""
    for entry in REFUSALS:
        if entry.applies(setup):
            option = entry.option.format(policy=setup.policy)
            reason = entry.reason if isinstance(entry.reason, str) else entry.reason(setup)
            raise ValueError(f"{SELECT_FLAG} cannot serve with {option} ({reason}); drop that option or {SELECT_FLAG}")


def tree_core_route(ctx: Any) -> str | None:
    """What sends a HiCache server built with ``ctx`` to UnifiedRadixCache over radix-core's
    TreeCore (``RadixCoreHiCache`` drives SGLang's cache controller only for one rank of plain
    FULL attention, without an L3 store or draft pools), or None."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.runtime_context import get_disagg, get_memory, get_spec

    params = ctx.params
    groups = (params.tp_cache_group, params.attn_cp_cache_group, params.attn_tp_cache_group, params.pp_cache_group)
    multi_rank = params.pp_size > 1 or any(
        group is not None and torch.distributed.get_world_size(group=group) > 1 for group in groups
    )
    routes = [
        (get_memory().hicache_storage_backend is not None, "an L3 storage backend (--hicache-storage-backend)"),
        (get_spec().speculative_algorithm is not None, "speculative decoding (HiCache's draft pools)"),
        (multi_rank, "more than one scheduler rank (their copies are agreed on across ranks)"),
        (
            type(params.token_to_kv_pool_allocator.get_kvcache()) is not MHATokenToKVPool,
            "a KV pool other than SGLang's MHA one",
        ),
        (get_disagg().disaggregation_mode != "null", "PD disaggregation"),
        (get_disagg().disaggregation_decode_retraction_backup == "host_pool", "retraction backups to the host pool"),
    ]
    return next((what for applies, what in routes if applies), None)
