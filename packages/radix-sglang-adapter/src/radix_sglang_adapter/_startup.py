"""Automatic activation in every SGLang process: the .pth startup hook and the SGLang plugin.

SGLang starts its scheduler in a spawned child, so anything done in the launcher never reaches
it. Two ways in, both of which only log on failure:
- SGLang >= 0.5.11 runs installed plugins (entry-point group ``sglang.srt.plugins``) early in each
  of its processes: ``sglang_plugin`` below.
- For 0.5.10, ``radix_sglang_adapter.pth`` runs ``startup_hook`` at every interpreter start when
  ``RADIX_SGLANG_ADAPTER`` is set.
Either way each part of the adapter runs once the SGLang module it works on has been imported
(right away if it already is): the patches after ``mem_cache.utils`` (so modules that bind functions
by name bind the replacements), the backend after ``mem_cache.registry`` (before SGLang can build a
tree cache). Nothing else is imported early, so no import cycle of SGLang's is disturbed.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ._activation import Part, activate_guarded
from ._settings import AUTO_ENV, boolean_env
from .backend import REGISTRY_MODULE
from .patching import UTILS_MODULE

logger = logging.getLogger("radix_sglang_adapter")

PART_MODULES: dict[Part, str] = {"patching": UTILS_MODULE, "backend": REGISTRY_MODULE}


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: makes the loader of one module call ``then`` as soon as it has run."""

    def __init__(self, module: str, then: Callable[[], None]):
        self.module = module
        self.then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the search below from finding us
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module
        then = self.then

        def exec_then_run(module: Any) -> None:
            run_module(module)
            then()

        spec.loader.exec_module = exec_then_run  # type: ignore[method-assign]
        return spec


def run_after_import(module: str, then: Callable[[], None]) -> None:
    """Call ``then`` now if ``module`` is loaded, else right after it gets imported (once)."""
    if module in sys.modules:
        then()
    elif not any(isinstance(finder, _RunAfterImport) and finder.module == module for finder in sys.meta_path):
        sys.meta_path.insert(0, _RunAfterImport(module, then))


def activate_when_imported(source: str) -> None:
    """Run each part of the adapter once its SGLang module is imported."""
    for part, module in PART_MODULES.items():
        run_after_import(module, functools.partial(activate_guarded, source, parts=(part,)))


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
