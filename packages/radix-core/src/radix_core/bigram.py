"""EAGLE bigram keys: the Python references and their dispatching (native when available) versions.

EAGLE's draft sequence is the target sequence shifted by one token, so the radix tree keys its
entries by adjacent token pairs: ``[t0, t1, t2] -> [(t0, t1), (t1, t2)]``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import islice
from typing import Any, TypeVar

from ._backend import dispatching

__all__ = [
    "PACKED_TOKEN_LIMIT",
    "convert_to_bigram_key",
    "pack_bigram_keys",
    "python_convert_to_bigram_key",
    "python_pack_bigram_keys",
]

# pack_bigram_keys puts two token ids in one int64: each must fit in 31 bits.
PACKED_TOKEN_LIMIT = 1 << 31

# 1-D native-order int64/int32 buffers (array('q'), array('i'), numpy int64/int32, memoryview).
_TOKEN_BUFFER_FORMATS = frozenset({"q", "l", "i", "@q", "@l", "@i"})
_INT64_FORMATS = frozenset({"q", "l", "@q", "@l"})

T = TypeVar("T")
BufferOut = TypeVar("BufferOut")


def python_convert_to_bigram_key(tokens: Sequence[T]) -> list[tuple[T, T]] | Sequence[T]:
    """``[t0, t1, t2] -> [(t0, t1), (t1, t2)]``, the reference (SGLang 0.5.10's semantics).

    A sequence that already holds tuples is returned as it is (the same object); fewer than two
    tokens give ``[]``. The pairs hold the very item objects of ``tokens``. A list or tuple is
    paired by CPython's own iterators (``zip`` over it and an iterator one item ahead), which
    yield the items indexing would; any other sequence is indexed, as SGLang's list comprehension
    does.
    """
    try:
        count = len(tokens)
    except TypeError:
        raise TypeError(f"tokens must be a sequence of token ids, not {type(tokens).__name__}") from None
    if count and isinstance(tokens[0], tuple):
        return tokens
    if count < 2:
        return []
    if type(tokens) is list or type(tokens) is tuple:
        ahead = iter(tokens)
        next(ahead)
        return list(zip(tokens, ahead))
    return [(tokens[i], tokens[i + 1]) for i in range(count - 1)]


@dispatching("convert_to_bigram_key")
def convert_to_bigram_key(tokens: Sequence[T]) -> list[tuple[T, T]] | Sequence[T]:
    """``[t0, t1, t2] -> [(t0, t1), (t1, t2)]``, natively when radix-native is in use.

    Identical to :func:`python_convert_to_bigram_key` for every input.
    """
    return python_convert_to_bigram_key(tokens)


def _token_id_array(tokens: Any) -> array:
    """Token ids as array('q'), with the errors pack_bigram_keys promises."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise TypeError(f"tokens must be a sequence of token ids, not {type(tokens).__name__}")
    if not isinstance(tokens, (list, tuple)):
        try:
            view = memoryview(tokens)
        except TypeError:
            pass
        else:
            with view:
                if view.ndim != 1 or view.format not in _TOKEN_BUFFER_FORMATS:
                    raise TypeError(
                        f"a token buffer must be 1-D int64 or int32, not format {view.format!r} "
                        f"with {view.ndim} dimensions"
                    )
                tokens = view.tolist()
    try:
        ids = array("q", tokens)
    except OverflowError:
        raise ValueError(_out_of_range_message()) from None
    except TypeError as exc:
        raise TypeError(f"tokens must be a sequence of integer token ids: {exc}") from None
    if ids and (min(ids) < 0 or max(ids) >= PACKED_TOKEN_LIMIT):
        raise ValueError(_out_of_range_message())
    return ids


def _out_of_range_message() -> str:
    return "token ids must be in [0, 2**31) to be packed into int64 bigram keys"


def _write_packed(packed: array, out: BufferOut) -> BufferOut:
    try:
        view = memoryview(out)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("out must be a writable, contiguous, 1-D int64 buffer") from None
    with view:
        if view.readonly or not view.c_contiguous or view.ndim != 1 or view.format not in _INT64_FORMATS:
            raise TypeError("out must be a writable, contiguous, 1-D int64 buffer")
        if len(view) < len(packed):
            raise ValueError("out is too short for the packed bigram keys")
        with view.cast("B") as out_bytes, memoryview(packed).cast("B") as packed_bytes:
            out_bytes[: len(packed_bytes)] = packed_bytes
    return out


def python_pack_bigram_keys(tokens: Any, out: BufferOut | None = None) -> array | BufferOut:
    """``(t[i] << 32) | t[i + 1]`` for each adjacent pair, the reference.

    ``tokens``: a list/tuple of ints (anything with ``__index__``) or a 1-D int64/int32 buffer, each
    id in ``[0, 2**31)``. Returns a new ``array('q')``, or fills the first ``len(tokens) - 1`` items
    of ``out`` (a writable contiguous int64 buffer) and returns ``out``; on error ``out``'s contents
    are unspecified.
    """
    ids = _token_id_array(tokens)
    packed = array("q", [(first << 32) | second for first, second in zip(ids, islice(ids, 1, None))])
    if out is None:
        return packed
    return _write_packed(packed, out)


@dispatching("pack_bigram_keys")
def pack_bigram_keys(tokens: Any, out: BufferOut | None = None) -> array | BufferOut:
    """``(t[i] << 32) | t[i + 1]`` for each adjacent pair, natively when radix-native is in use.

    Identical to :func:`python_pack_bigram_keys` for every input.
    """
    return python_pack_bigram_keys(tokens, out)
