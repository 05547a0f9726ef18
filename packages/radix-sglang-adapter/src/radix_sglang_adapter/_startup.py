"""Automatic activation in every SGLang process: the .pth startup hook and the SGLang plugin.

SGLang starts its scheduler in a spawned child, so a patch applied in the launcher never reaches
it. Two ways in, both of which only log on failure:
- SGLang >= 0.5.11 runs installed plugins (entry-point group ``sglang.srt.plugins``) early in each
  of its processes: ``sglang_plugin`` below.
- For 0.5.10, ``radix_sglang_adapter.pth`` runs ``startup_hook`` at every interpreter start when
  ``RADIX_SGLANG_ADAPTER`` is set.
Either way activation happens once ``sglang.srt.mem_cache.utils`` has been imported (right away if
it already is), so the modules that bind the function by name bind the replacement.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from typing import Any

from ._patching import UTILS_MODULE, activate_guarded, boolean_env

logger = logging.getLogger("radix_sglang_adapter")

AUTO_ENV = "RADIX_SGLANG_ADAPTER"


class _ActivateAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: makes the loader of SGLang's mem_cache.utils activate the adapter
    as soon as that module has run."""

    def __init__(self, source: str):
        self.source = source

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != UTILS_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the search below from finding us
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module
        source = self.source

        def exec_then_activate(module: Any) -> None:
            run_module(module)
            activate_guarded(source)

        spec.loader.exec_module = exec_then_activate  # type: ignore[method-assign]
        return spec


def activate_when_imported(source: str) -> None:
    """Activate now if SGLang's mem_cache.utils is loaded, else right after it gets imported."""
    if UTILS_MODULE in sys.modules:
        activate_guarded(source)
    elif not any(isinstance(finder, _ActivateAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ActivateAfterImport(source))


def startup_hook() -> None:
    """Called from the .pth file in every interpreter where RADIX_SGLANG_ADAPTER is set."""
    try:
        if boolean_env(AUTO_ENV):
            activate_when_imported(f"startup hook ({AUTO_ENV}={os.environ[AUTO_ENV]})")
    except Exception as exc:  # a .pth line must never stop an interpreter from starting
        logger.warning("radix-sglang-adapter stays off: %s", exc)


def sglang_plugin() -> None:
    """Entry point of the ``sglang.srt.plugins`` group, run by SGLang's load_plugins()."""
    activate_when_imported("SGLang plugin")
