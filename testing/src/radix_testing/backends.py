"""Switches that tests and benchmarks use to compare radix-core's backends in one process: each
sets a process-wide choice for a block, as radix-core's environment variables do at import; none is
meant for use while other threads call radix-core."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import radix_core.native_tree as native_store
from radix_core import _backend


@contextlib.contextmanager
def python_reference_only() -> Iterator[None]:
    """radix-core's kernels on the Python reference within a block, whatever is loaded."""
    saved = _backend.native_kernels
    _backend.native_kernels = None
    try:
        yield
    finally:
        _backend.native_kernels = saved


@contextlib.contextmanager
def tree_by_default(tree: str) -> Iterator[None]:
    """New RadixCaches keep their nodes in ``tree`` unless told otherwise, as RADIX_CORE_TREE says."""
    if tree not in _backend.TREE_CHOICES:
        raise ValueError(f"tree must be one of: {', '.join(_backend.TREE_CHOICES)}; not {tree!r}")
    saved = _backend.default_tree
    _backend.default_tree = tree
    try:
        yield
    finally:
        _backend.default_tree = saved


@contextlib.contextmanager
def verifying(fraction: float) -> Iterator[None]:
    """A share of native calls checked against the reference, as RADIX_CORE_VERIFY does. The
    countdown to the next check goes on across blocks, so that many short blocks check their share."""
    saved = _backend._verify_stride
    _backend._verify_stride = _backend._stride(fraction)
    _backend._calls_to_verify = min(_backend._calls_to_verify, _backend._verify_stride) or _backend._verify_stride
    try:
        yield
    finally:
        _backend._verify_stride = saved


@contextlib.contextmanager
def device_path() -> Iterator[None]:
    """New caches keep tensor values in a device arena, CPU tensors included, as
    RADIX_CORE_DEVICE_TREE=native keeps a GPU's (where there is no GPU)."""
    saved = native_store._arena_for_cpu_tensors, _backend.device_tree
    native_store._arena_for_cpu_tensors, _backend.device_tree = True, "native"
    try:
        yield
    finally:
        native_store._arena_for_cpu_tensors, _backend.device_tree = saved
