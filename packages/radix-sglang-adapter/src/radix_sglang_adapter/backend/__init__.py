"""The backend: SGLang serves its prefix cache on radix-core (``--radix-cache-backend radix``).

SGLang 0.5.13 added a registry of tree-cache factories (``register_radix_cache_backend``) selected
with ``--radix-cache-backend NAME``; the scheduler-facing cache interface this backend implements
(``checkpoint``, ``path_device_indices``) is that of 0.5.22 and later. Registering imports nothing
from SGLang but its registry; the cache class (``backend.cache``, a subclass of SGLang's
RadixCache) is imported when SGLang builds a cache.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._settings import AdapterError, Release, release_text

logger = logging.getLogger("radix_sglang_adapter")

BACKEND_NAME = "radix"
REGISTRY_MODULE = "sglang.srt.mem_cache.registry"
TREE_CORE_REGISTRY_MODULE = "sglang.srt.mem_cache.unified_cache.tree_core_registry"
TREE_CORE_MODULE = "radix_sglang_adapter.backend.tree_core"  # imported when SGLang builds a HiCache cache
FIRST_REGISTRY_RELEASE: Release = (0, 5, 13)
# The first release whose RadixCache has checkpoint()/path_device_indices(), the interface here.
FIRST_BACKEND_RELEASE: Release = (0, 5, 22)
SELECT_FLAG = f"--radix-cache-backend {BACKEND_NAME}"

_lock = threading.Lock()
_live_caches: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class BackendRegistration:
    """Whether SGLang can select the ``radix`` backend in this process, and why (not)."""

    registered: bool
    detail: str
    live_caches: int = 0

    def format(self) -> str:
        if not self.registered:
            return f"radix-cache backend {BACKEND_NAME!r}: not registered ({self.detail})"
        import radix_core

        return (
            f"radix-cache backend {BACKEND_NAME!r}: registered ({self.detail}); its tree runs radix-core "
            f"{radix_core.backend().active}; {self.live_caches} cache(s) built in this process"
        )


def unavailable_reason(release: Release) -> str | None:
    """Why this SGLang release cannot serve on the backend, or None when it can."""
    if release < FIRST_REGISTRY_RELEASE:
        return (
            f"SGLang {release_text(release)} has no radix-cache registry "
            f"(--radix-cache-backend came in {release_text(FIRST_REGISTRY_RELEASE)})"
        )
    if release < FIRST_BACKEND_RELEASE:
        return (
            f"SGLang {release_text(release)}'s cache interface (cache_finished_req) predates the "
            f"checkpoint() interface this backend implements ({release_text(FIRST_BACKEND_RELEASE)} and later)"
        )
    return None


def registration(release: Release | None) -> BackendRegistration:
    """Whether SGLang's registry holds ``radix`` right now, or why it cannot."""
    reason = unavailable_reason(release) if release is not None else None
    if reason is not None:
        return BackendRegistration(False, reason)
    registry = sys.modules.get(REGISTRY_MODULE)
    if registry is None or registry.get_radix_cache_factory(BACKEND_NAME) is not build_cache:
        return BackendRegistration(False, "not registered in this process")
    return BackendRegistration(True, f"select it with {SELECT_FLAG}", len(_live_caches))


def register(release: Release) -> None:
    """Register ``radix`` with SGLang's registry (idempotent; nothing where the release can't
    serve on it). AdapterError if the registry holds another factory under that name."""
    if unavailable_reason(release) is not None:
        return
    registry = importlib.import_module(REGISTRY_MODULE)
    _register_once(registry.get_radix_cache_factory, registry.register_radix_cache_backend, build_cache, "radix-cache")


def _register_once(get: Callable[[str], Any], add: Callable[[str, Any], None], factory: Any, registry: str) -> None:
    """``factory`` under ``radix`` in one of SGLang's registries, once; AdapterError if that
    registry holds another one under the name."""
    with _lock:
        held = get(BACKEND_NAME)
        if held is None:
            add(BACKEND_NAME, factory)
        elif held is not factory:
            raise AdapterError(f"SGLang's {registry} registry already holds another {BACKEND_NAME!r}: {held!r}")


def unregister() -> None:
    """Take ``radix`` out of SGLang's registries where this adapter put it: the radix-cache
    backend, and the TreeCore that serves HiCache (which SGLang's
    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND could otherwise still select). SGLang has no public way
    to do that: its registry dicts are edited directly (caches already built keep working)."""
    tree_core = sys.modules.get(TREE_CORE_MODULE)
    ours = [
        (REGISTRY_MODULE, "_RADIX_CACHE_REGISTRY", build_cache),
        (TREE_CORE_REGISTRY_MODULE, "_TREE_CORE_REGISTRY", getattr(tree_core, "RadixTreeCore", None)),
    ]
    with _lock:
        for module, name, factory in ours:
            entries = getattr(sys.modules.get(module), name, None)
            if factory is not None and entries is not None and entries.get(BACKEND_NAME) is factory:
                del entries[BACKEND_NAME]


def context_refusal(ctx: Any) -> str | None:
    """Why a server built with ``ctx`` (SGLang's TreeCacheBuildContext) cannot run the backend."""
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    unsupported = [
        (ctx.is_hybrid_swa, "a hybrid sliding-window (SWA) model", "radix-core's tree has no SWA component"),
        (ctx.is_hybrid_ssm, "a model with mamba state", "radix-core's tree has no mamba component"),
        (getattr(memory, "enable_lmcache", False), "--enable-lmcache", "LMCache needs SGLang's unified tree"),
        (getattr(memory, "enable_flexkv", False), "--enable-flexkv", "FlexKV brings its own tree cache"),
    ]
    return _first_refusal(unsupported) or params_refusal(ctx.params)


def hicache_refusal(ctx: Any) -> str | None:
    """Why a server with ``--enable-hierarchical-cache`` cannot run the backend's TreeCore yet."""
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    unsupported = [
        (
            getattr(memory, "hicache_host_memory_mode", None) == "buffer_only",
            "--hicache-host-memory-mode buffer_only",
            "radix-core's TreeCore serves the host tier as a cache",
        ),
        (
            ctx.params.enable_kv_cache_events,
            "--kv-events-config and --enable-hierarchical-cache together",
            "radix-core's TreeCore publishes no host-tier events yet",
        ),
    ]
    return _first_refusal(unsupported)


def params_refusal(params: Any) -> str | None:
    """Why a cache with SGLang's ``CacheInitParams`` cannot run on radix-core, or None."""
    from radix_core import EVICTION_POLICIES

    policy = params.eviction_policy.lower()
    unsupported = [
        (params.disable, "--disable-radix-cache", "a disabled cache has no tree to run"),
        (params.enable_session_radix_cache, "--enable-session-radix-cache", "sessions need SGLang's unified tree"),
        (params.sliding_window_size is not None, "a sliding-window (SWA) model", "radix-core has no SWA component"),
        (
            policy not in EVICTION_POLICIES,
            f"--radix-eviction-policy {policy}",
            f"radix-core implements {', '.join(EVICTION_POLICIES)}",
        ),
        (bool(params.eviction_policy_config), "--radix-eviction-policy-config", "radix-core's policies take none"),
    ]
    return _first_refusal(unsupported)


def _first_refusal(checks: list[tuple[Any, str, str]]) -> str | None:
    for applies, what, why in checks:
        if applies:
            return f"{SELECT_FLAG} cannot serve with {what} ({why}); drop that option or {SELECT_FLAG}"
    return None


def build_cache(ctx: Any) -> Any:
    """The factory SGLang's create_tree_cache() calls for ``--radix-cache-backend radix``."""
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    import radix_core

    if ctx.disable_radix_cache:
        logger.info("%s with --disable-radix-cache: no tree to run; SGLang builds its own cache", SELECT_FLAG)
        return default_radix_cache_factory(ctx)
    refusal = context_refusal(ctx) or (hicache_refusal(ctx) if ctx.enable_hierarchical_cache else None)
    if refusal is not None:
        raise ValueError(refusal)
    if ctx.enable_hierarchical_cache:
        from .hicache import RadixCoreHiCache, route_refusal

        policy = ctx.server_args.hicache_write_policy
        tree = "python"  # TieredRadixCache has only a Python store
        unserved = route_refusal(ctx)
        if unserved is None:
            cache = RadixCoreHiCache(ctx.params, ctx.tp_worker)
            what = f"the prefix cache with HiCache ({policy})"
        else:
            logger.info(
                "%s with HiCache and %s: UnifiedRadixCache serves it on radix-core's TreeCore", SELECT_FLAG, unserved
            )
            cache = _unified_cache_on_radix_core(ctx)
            what = f"UnifiedRadixCache with HiCache ({policy}), its TreeCore"
    else:
        from .cache import RadixCoreCache

        cache = RadixCoreCache(ctx.params)
        what = "the prefix cache"
        tree = cache.tree.tree_kind
    _live_caches.add(cache)
    status = radix_core.backend()
    logger.info(
        "radix-sglang-adapter: %s runs on radix-core %s (%s), page_size=%d, eagle=%s, policy=%s, tree=%s",
        what,
        status.active,
        status.reason,
        ctx.params.page_size,
        bool(ctx.params.is_eagle),
        ctx.params.eviction_policy,
        tree,
    )
    return cache


def _unified_cache_on_radix_core(ctx: Any) -> Any:
    """SGLang's UnifiedRadixCache (which drives HiCache: backups, load-backs, host eviction) with
    radix-core's tree as its TreeCore (``backend.tree_core``), registered under ``radix`` too."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache
    from sglang.srt.mem_cache.unified_cache import tree_core_registry

    from .tree_core import RadixTreeCore

    get, add = tree_core_registry.get_tree_core_factory, tree_core_registry.register_tree_core_backend
    _register_once(get, add, RadixTreeCore, "TreeCore")
    ctx.params.tree_core_backend = BACKEND_NAME
    return create_unified_radix_cache(ctx)
