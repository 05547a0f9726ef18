"""Code that runs in spawned children (they import this module to find it)."""

from __future__ import annotations

import sglang_cpu_shim


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
