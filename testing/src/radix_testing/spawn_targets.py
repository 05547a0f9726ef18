"""Code that runs in spawned children: a child imports this module by name to find it, so it
lives in an installed package, not in a test directory."""

from __future__ import annotations

from radix_testing import sglang_cpu_shim


def report_patching_in_sglang_child(load_plugins: bool) -> dict:
    """What a fresh SGLang process looks like after its own start-up, with no activate() call."""
    sglang_cpu_shim.install()
    if load_plugins:
        from sglang.srt.plugins import load_plugins as sglang_load_plugins

        sglang_load_plugins()  # what SGLang's scheduler process does first
    import sglang.srt.mem_cache.radix_cache as radix_cache

    import radix_sglang_adapter

    status = radix_sglang_adapter.status()
    return {
        "state": status.state,
        "activated_by": status.activated_by,
        "radix_cache_bound": getattr(radix_cache, "convert_to_bigram_key", None)
        is radix_sglang_adapter.sglang_convert_to_bigram_key,
    }


def build_tree_cache_in_sglang_child(backend_name: str) -> dict:
    """A fresh SGLang process as its scheduler starts: plugins loaded (no activate() call), the
    server's config published with ``--radix-cache-backend <backend_name>``, then SGLang's own
    create_tree_cache(). Returns what was built, or the error SGLang raised."""
    import logging

    sglang_cpu_shim.install()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.mem_cache.registry import create_tree_cache

    from radix_testing import scheduler_harness as sh

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    with sh.published_server_args(radix_cache_backend=backend_name) as server_args:
        pool, allocator = sh.small_pools()
        context = sh.build_context(server_args, sh.cache_params(pool, allocator, 1, True, "lru"))
        try:
            cache = create_tree_cache(context)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "log": records}
    return {
        "cache": type(cache).__name__,
        "tree": getattr(getattr(cache, "tree", None), "tree_kind", None),
        "log": records,
    }
