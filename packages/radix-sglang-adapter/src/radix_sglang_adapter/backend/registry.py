"""The ``radix`` name in SGLang's registries: registering it, taking it out, and whether it is there.

SGLang 0.5.13 added a registry of tree-cache factories (``register_radix_cache_backend``) selected
with ``--radix-cache-backend NAME``; the scheduler-facing cache interface the backend implements
(``checkpoint``, ``path_device_indices``) is that of 0.5.22 and later. Registering imports nothing
from SGLang but its registry.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._settings import AdapterError, Release, release_text

BACKEND_NAME = "radix"
REGISTRY_MODULE = "sglang.srt.mem_cache.registry"
TREE_CORE_REGISTRY_MODULE = "sglang.srt.mem_cache.unified_cache.tree_core_registry"
TREE_CORE_MODULE = "radix_sglang_adapter.backend.tree_core"  # imported when SGLang builds a HiCache cache
FIRST_REGISTRY_RELEASE: Release = (0, 5, 13)
FIRST_BACKEND_RELEASE: Release = (0, 5, 22)
SELECT_FLAG = f"--radix-cache-backend {BACKEND_NAME}"

_lock = threading.Lock()
live_caches: weakref.WeakSet[Any] = weakref.WeakSet()  # every cache the factory built


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
    from .factory import build_cache  # the factory module imports this one

    registry = sys.modules.get(REGISTRY_MODULE)
    if registry is None or registry.get_radix_cache_factory(BACKEND_NAME) is not build_cache:
        return BackendRegistration(False, "not registered in this process")
    return BackendRegistration(True, f"select it with {SELECT_FLAG}", len(live_caches))


def register(release: Release) -> None:
    """Register ``radix`` with SGLang's registry (idempotent; nothing where the release can't
    serve on it). AdapterError if the registry holds another factory under that name."""
    if unavailable_reason(release) is not None:
        return
    from .factory import build_cache

    registry = importlib.import_module(REGISTRY_MODULE)
    register_once(registry.get_radix_cache_factory, registry.register_radix_cache_backend, build_cache, "radix-cache")


def register_once(get: Callable[[str], Any], add: Callable[[str, Any], None], factory: Any, registry: str) -> None:
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
    from .factory import build_cache

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
