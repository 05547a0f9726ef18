"""What the cache stores per token: 1-D integer index sequences of one kind per cache.

SGLang stores torch tensors of KV-pool indices; a capacity simulator wants no torch at all. Each
supported kind knows how to check, cut (a copy the tree may keep) and concatenate values. torch
and numpy are recognised by type, never imported here.
"""

from __future__ import annotations

import sys
from array import array
from itertools import chain
from typing import Any

__all__ = ["ValueKind", "value_kind_of"]

_INTEGER_TYPECODES = frozenset("bBhHiIlLqQ")


class ValueKind:
    """Operations on one kind of value; the plain-sequence base serves ``list``."""

    name = "list"
    # An empty tensor or ndarray cannot grow in place, so one can be handed to every caller (as
    # SGLang does); an empty list or array could be appended to, so each caller gets a new one.
    empty_is_shareable = False

    def check(self, value: Any) -> None:
        if not all(type(item) is int for item in value):
            raise TypeError("a list value must hold only int indices")

    def length(self, value: Any) -> int:
        """Items in a value that passed :meth:`check`."""
        return len(value)

    def cut(self, value: Any, start: int, stop: int) -> Any:
        """``value[start:stop]`` as a copy that shares no storage with ``value``."""
        return value[start:stop]

    def split(self, value: Any, at: int) -> tuple[Any, Any]:
        """``value[:at]`` and ``value[at:]`` for the two nodes a split makes, sharing no storage
        with ``value`` unless the kind says otherwise."""
        return self.cut(value, 0, at), self.cut(value, at, self.length(value))

    def concat(self, values: list[Any]) -> Any:
        return list(chain.from_iterable(values))


class _ArrayKind(ValueKind):
    name = "array"

    def check(self, value: array) -> None:
        if value.typecode not in _INTEGER_TYPECODES:
            raise TypeError(f"an array value must have an integer typecode, not {value.typecode!r}")

    def concat(self, values: list[array]) -> array:
        joined = values[0][:0]
        for value in values:
            joined.extend(value)
        return joined


class _TensorKind(ValueKind):
    name = "torch"
    empty_is_shareable = True

    def __init__(self) -> None:
        self._integer_dtypes: set[Any] = set()  # dtypes seen to pass: the test is a function of the dtype

    def check(self, value: Any) -> None:
        if value.dim() == 1 and value.dtype in self._integer_dtypes:
            return
        if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == _loaded("torch").bool:
            shape = tuple(value.shape)
            raise TypeError(f"a tensor value must be a 1-D integer tensor, got {value.dtype} with shape {shape}")
        self._integer_dtypes.add(value.dtype)

    def length(self, value: Any) -> int:
        return value.shape[0]  # 1-D; len() would run torch's Python-level __len__

    def split(self, value: Any, at: int) -> tuple[Any, Any]:
        """A part that is at least half of the storage it views stays a view of it, the other is
        cloned: a split copies at most half, and no node keeps more than twice its own indices
        alive (the tree owns that storage: it cloned or was given it for itself)."""
        held = value.untyped_storage().nbytes() // value.element_size()
        parts = value[:at], value[at:]
        return tuple(part if 2 * part.shape[0] >= held else part.clone() for part in parts)  # type: ignore[return-value]

    def cut(self, value: Any, start: int, stop: int) -> Any:
        if start == 0 and stop == value.shape[0]:
            return value.clone()  # a whole value (a miss) skips torch's slicing, ~2 us a call
        return value[start:stop].clone()

    def concat(self, values: list[Any]) -> Any:
        return _loaded("torch").cat(values)


class _NumpyKind(ValueKind):
    name = "numpy"
    empty_is_shareable = True

    def check(self, value: Any) -> None:
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise TypeError(f"an ndarray value must be a 1-D integer array, got {value.dtype} with shape {value.shape}")

    def cut(self, value: Any, start: int, stop: int) -> Any:
        return value[start:stop].copy()

    def concat(self, values: list[Any]) -> Any:
        return _loaded("numpy").concatenate(values)


def _loaded(module: str) -> Any:
    """A module the caller's own values prove is already imported."""
    return sys.modules[module]


_LIST, _ARRAY, _TENSOR, _NUMPY = ValueKind(), _ArrayKind(), _TensorKind(), _NumpyKind()


_KIND_OF_TYPE: dict[type, ValueKind] = {list: _LIST, array: _ARRAY}  # filled as types are met


def value_kind_of(value: Any) -> ValueKind:
    """The kind of ``value``; TypeError for anything that is not a supported index sequence."""
    cls = type(value)
    kind = _KIND_OF_TYPE.get(cls)
    if kind is not None:
        return kind
    module = cls.__module__
    if module.startswith("torch") and hasattr(cls, "clone"):
        kind = _TENSOR
    elif module == "numpy" and cls.__name__ == "ndarray":
        kind = _NUMPY
    if kind is not None:
        _KIND_OF_TYPE[cls] = kind  # the kind is a function of the type
        return kind
    raise TypeError(
        f"values must be 1-D integer index sequences (torch.Tensor, numpy.ndarray, array or list), "
        f"not {cls.__module__}.{cls.__qualname__}"
    )
