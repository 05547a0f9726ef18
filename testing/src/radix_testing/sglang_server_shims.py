"""Test-only: what SGLang 0.5.23's real HTTP server needs to serve on this CPU-only machine.

``install()`` runs at start-up in the launcher *and* in every process SGLang spawns (scheduler,
detokenizer; forked ones inherit it), from the ``sitecustomize`` of the servers' site directory
(``radix_testing/server_site``): the end-to-end tests and benchmark put
that directory first on their servers' ``PYTHONPATH``. A patch applied in the launcher alone would
not reach the spawned processes. Never shipped: only tests and benchmarks use it.

What each shim is for:
- torchvision stand-in (``sglang_cpu_shim``): no torchvision wheel imports beside the local CPU
  torch, yet SGLang's config chain imports ``torchvision.transforms`` in every process.
- ``sgl_kernel`` (the site directory's ``sgl_kernel.py``): SGLang's CPU kernels are not on PyPI;
  the stand-in computes the few ops a Llama server calls, from SGLang's own reference kernels, and
  raises on every other op, so it can never give a silent wrong answer.
- The page-size > 1 last-location path: with EAGLE's ``intel_amx`` attention backend SGLang takes
  ``get_last_loc_triton``, which needs a GPU ("0 active drivers"); its own ``get_last_loc_torch``
  computes the same on the CPU.
- HiCache's host tier (``--enable-hierarchical-cache``, io backend ``direct``): SGLang registers
  host pools with CUDA (``torch.cuda.cudart()``), syncs ``torch.cpu.Stream``s that have no
  ``synchronize``/``query``, and binds its device<->host KV copies (``sgl_kernel.kvcacheio``) only on
  CUDA/ROCm/XPU, and its L3 path allocates pinned staging pages. Here registration is skipped,
  host pools pin nothing, the streams' waits are no-ops (CPU copies are done when they return), and
  the three direct copies the layer_first and page_first layouts use are written in torch from
  their definitions (a token's KV rows, gathered and scattered by index).
- Dummy weights drawn from [-r, r] where ``RADIX_TEST_DUMMY_WEIGHT_RANGE=r`` (the sliding-window
  model's servers set it): from SGLang's [-1e-3, 1e-3] a token's output depends almost on the last
  token alone, so outputs could not show a window applied, nor KV read wrong inside it.
- AMX (the site directory's ``launch_sglang.py``, the launcher only): ``intel_amx`` is the one CPU
  attention backend with an EAGLE draft backend; on a CPU without AMX SGLang's argument resolution
  swaps it for ``torch_native``, which refuses EAGLE, unless the launcher's platform says AMX is there.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable
from types import ModuleType

from radix_testing import sglang_cpu_shim

_PATCHES: dict[str, Callable[[ModuleType], None]] = {}
DUMMY_WEIGHT_RANGE = "RADIX_TEST_DUMMY_WEIGHT_RANGE"


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


def _no_host_registration(common: ModuleType) -> None:
    common._cuda_host_register = lambda buffer, registration_granularity_bytes=None: None
    common._cuda_host_unregister = lambda buffer: None


def _host_pools_pin_nothing(base: ModuleType) -> None:
    built = base.HostKVCache.__init__

    def __init__(self, *args, **kwargs) -> None:
        built(self, *args, **kwargs)
        self.pin_memory = False

    base.HostKVCache.__init__ = __init__


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size) -> None:
    for source, destination in zip(src_layers, dst_layers):
        destination[dst_indices] = source[src_indices]


def _transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size) -> None:
    """Device layers (all K, then all V) into host K/V laid out [page, layer, slot in page, ...]."""
    layers = len(src_ptrs) // len(dst_ptrs)
    pages, slots = dst_indices // page_size, dst_indices % page_size
    for kind, host in enumerate(dst_ptrs):
        for layer in range(layers):
            host[pages, layer, slots] = src_ptrs[kind * layers + layer][src_indices]


def _transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size) -> None:
    pages, slots = src_indices // page_size, src_indices % page_size
    for host, device in zip(src_ptrs, dst_ptrs):
        device[dst_indices] = host[pages, layer_id, slots]


def _torch_kv_copies(mha: ModuleType) -> None:
    mha.transfer_kv_direct = _transfer_kv_direct
    mha.transfer_kv_all_layer_direct_lf_pf = _transfer_kv_all_layer_direct_lf_pf
    mha.transfer_kv_per_layer_direct_pf_lf = _transfer_kv_per_layer_direct_pf_lf


def _wider_dummy_weights(weight_utils: ModuleType) -> None:
    bound = float(os.environ[DUMMY_WEIGHT_RANGE])
    draw = weight_utils.initialize_dummy_weights

    def initialize_dummy_weights(model, low=-1e-3, high=1e-3, seed=1234) -> None:
        draw(model, low=-bound, high=bound, seed=seed)

    weight_utils.initialize_dummy_weights = initialize_dummy_weights  # before the model loader binds it


def _cpu_streams_wait_for_nothing() -> None:
    import torch

    for name in ("synchronize", "query"):
        if not hasattr(torch.cpu.Stream, name):
            setattr(torch.cpu.Stream, name, lambda self: True)


def install() -> None:
    """Every shim but AMX (which the launcher applies to itself); call once per process, first."""
    sglang_cpu_shim.install()
    patch_after_import("sglang.srt.mem_cache.allocation", _use_torch_last_loc)
    patch_after_import("sglang.srt.mem_cache.pool_host.common", _no_host_registration)
    patch_after_import("sglang.srt.mem_cache.pool_host.base", _host_pools_pin_nothing)
    patch_after_import("sglang.srt.mem_cache.pool_host.mha", _torch_kv_copies)
    if os.environ.get(DUMMY_WEIGHT_RANGE):
        patch_after_import("sglang.srt.model_loader.weight_utils", _wider_dummy_weights)
    _cpu_streams_wait_for_nothing()
