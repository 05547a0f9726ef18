"""The factory SGLang calls to build its prefix cache with ``--radix-cache-backend radix``: the cache
class that serves the server's setup, or a clear refusal before anything is built. The cache
classes import SGLang; this module imports them when SGLang builds a cache.
"""

from __future__ import annotations

import logging
from typing import Any

from .refusals import Setup, refuse_unserved, tree_core_route
from .registry import BACKEND_NAME, SELECT_FLAG, live_caches, register_once

logger = logging.getLogger("radix_sglang_adapter")


def build_cache(ctx: Any) -> Any:
    """The factory SGLang's create_tree_cache() calls for ``--radix-cache-backend radix``."""
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    import radix_core

    if ctx.disable_radix_cache:
        logger.info("%s with --disable-radix-cache: no tree to run; SGLang builds its own cache", SELECT_FLAG)
        return default_radix_cache_factory(ctx)
    setup = Setup.of_context(ctx)
    refuse_unserved(setup)
    if ctx.enable_hierarchical_cache:
        from .hicache import RadixCoreHiCache

        policy = ctx.server_args.hicache_write_policy
        tree = "python"  # TieredRadixCache has only a Python store
        unserved = tree_core_route(ctx)
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
        from .cache import RadixCoreCache, RadixCorePureSWACache

        window = ctx.params.sliding_window_size
        if "SWA" not in setup.components:
            cache = RadixCoreCache(ctx.params)
            what = "the prefix cache"
            tree = cache.tree.tree_kind
        elif "FULL" in setup.components:
            cache = _unified_cache_on_radix_core(ctx)
            what = f"UnifiedRadixCache of a hybrid sliding-window model (window {window}), its TreeCore"
            tree = "python"  # WindowedRadixCache has only a Python store
        else:  # every layer sliding-window attention
            cache = RadixCorePureSWACache(ctx.params)
            what = f"the prefix cache of a sliding-window model (window {window})"
            tree = cache.tree.tree_kind
    live_caches.add(cache)
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
    """SGLang's UnifiedRadixCache (which drives HiCache, and a hybrid model's components: their
    frees, window rebuilds and eviction loop) with radix-core's tree as its TreeCore
    (``backend.tree_core``), registered under ``radix`` too."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache
    from sglang.srt.mem_cache.unified_cache import tree_core_registry

    from .tree_core import RadixTreeCore

    get, add = tree_core_registry.get_tree_core_factory, tree_core_registry.register_tree_core_backend
    register_once(get, add, RadixTreeCore, "TreeCore")
    ctx.params.tree_core_backend = BACKEND_NAME
    return create_unified_radix_cache(ctx)
