"""Test-only: what SGLang 0.5.23's real HTTP server needs to serve on this CPU-only machine.

``install()`` runs at start-up in the launcher *and* in every process SGLang spawns (scheduler,
detokenizer), from the ``sitecustomize`` beside this file: the end-to-end tests and benchmark put
this directory first on their servers' ``PYTHONPATH``. A patch applied in the launcher alone would
not reach the spawned processes. Never shipped: only ``tests/`` and ``benchmarks/`` use it.

What each shim is for:
- torchvision stand-in (``sglang_cpu_shim``): no torchvision wheel imports beside the local CPU
  torch, yet SGLang's config chain imports ``torchvision.transforms`` in every process.
- ``sgl_kernel`` (the ``sgl_kernel.py`` beside this file): SGLang's CPU kernels are not on PyPI;
  the stand-in computes the few ops a Llama server calls, from SGLang's own reference kernels, and
  raises on every other op, so it can never give a silent wrong answer.
- The page-size > 1 last-location path: with EAGLE's ``intel_amx`` attention backend SGLang takes
  ``get_last_loc_triton``, which needs a GPU ("0 active drivers"); its own ``get_last_loc_torch``
  computes the same on the CPU.
- AMX (``launch_sglang.py``, the launcher only): ``intel_amx`` is the one CPU attention backend with
  an EAGLE draft backend; on a CPU without AMX SGLang's argument resolution swaps it for
  ``torch_native``, which refuses EAGLE, unless the launcher's platform says AMX is there.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable
from types import ModuleType

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where sglang_cpu_shim lives

_PATCHES: dict[str, Callable[[ModuleType], None]] = {}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs a module's registered patch right after the module's own code has run."""

    def find_spec(self, fullname, path=None, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        others = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next((spec for finder in others if (spec := finder.find_spec(fullname, path, target))), None)
        if spec is None:
            return None
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_after_import(module_name: str, patch: Callable[[ModuleType], None]) -> None:
    """``patch(module)`` once ``module_name`` is imported (it must not be imported yet)."""
    if module_name in sys.modules:
        raise RuntimeError(f"{module_name} is already imported: too late to patch it at import")
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
    _PATCHES[module_name] = patch


def _use_torch_last_loc(allocation: ModuleType) -> None:
    allocation.get_last_loc_triton = allocation.get_last_loc_torch


def install() -> None:
    """Every shim but AMX (which the launcher applies to itself); call once per process, first."""
    sys.path.insert(1, TESTS)
    import sglang_cpu_shim

    sglang_cpu_shim.install()
    patch_after_import("sglang.srt.mem_cache.allocation", _use_torch_last_loc)
