"""RadixKey: token ids of one request, as an O(1)-sliceable view with an optional bigram reading.

A key is a window ``[start, stop)`` over an ``array('q')`` of raw token ids. Slicing makes a new
window over the same array (no copy), so walking a 100k-token key down a deep tree never copies the
remaining tokens at every node. In bigram mode (EAGLE) the same raw tokens are read as adjacent
pairs: unit ``i`` is ``(t[i], t[i + 1])``, so ``n`` raw tokens make ``n - 1`` units, and no tuple
list is ever materialised.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from ._backend import dispatching

__all__ = ["RadixKey", "common_prefix_length", "python_common_prefix_length"]

TokenIds = array | Iterable[int]
Unit = int | tuple[int, int]


def python_common_prefix_length(a: Any, a_start: int, b: Any, b_start: int, length: int) -> int:
    """How many of the ``length`` items of ``a[a_start:]`` and ``b[b_start:]`` agree before the first
    difference, the reference: galloping then binary search over slice comparisons, so a long
    shared prefix costs O(log n) C-level compares instead of a per-token Python loop. Where the
    last items agree, the whole range is compared first: a walk down a tree mostly passes whole
    nodes, and a range that ends alike rarely differs earlier."""
    a_start, b_start, length = operator.index(a_start), operator.index(b_start), operator.index(length)
    a, b = _whole_comparing(a), _whole_comparing(b)
    if a_start < 0 or b_start < 0 or length < 0 or length > len(a) - a_start or length > len(b) - b_start:
        raise IndexError("common_prefix_length range is outside a token buffer")
    if length and a[a_start + length - 1] == b[b_start + length - 1]:
        if _items(a, a_start, length) == _items(b, b_start, length):
            return length
    lo, step = 0, 16
    while lo < length:
        hi = min(lo + step, length)
        if a[a_start + lo : a_start + hi] != b[b_start + lo : b_start + hi]:
            while hi - lo > 1:  # [lo, hi) holds the first difference
                mid = (lo + hi) // 2
                if a[a_start + lo : a_start + mid] == b[b_start + lo : b_start + mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, step * 2
    return length


def _items(tokens: Any, start: int, length: int) -> Any:
    """``tokens[start:start + length]``, without the copy where that is all of ``tokens`` (a node's
    key mostly is its whole array)."""
    return tokens if start == 0 and length == len(tokens) else tokens[start : start + length]


def _whole_comparing(tokens: Any) -> Any:
    """``tokens`` as a sequence whose slices compare as a whole: a buffer other than array (a
    numpy array compares item by item) is read through a memoryview."""
    if type(tokens) in (array, list, tuple):
        return tokens
    try:
        return memoryview(tokens)
    except TypeError:
        return tokens


@dispatching("common_prefix_length")
def common_prefix_length(a: Any, a_start: int, b: Any, b_start: int, length: int) -> int:
    """Same as :func:`python_common_prefix_length`, natively over int64 buffers when available."""
    return python_common_prefix_length(a, a_start, b, b_start, length)


def _token_array(token_ids: TokenIds) -> array:
    """The token ids as array('q'); an array('q') is shared, anything else is copied and checked."""
    if type(token_ids) is array and token_ids.typecode == "q":
        return token_ids
    if isinstance(token_ids, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"token ids must be a sequence of ints, not {type(token_ids).__name__}")
    try:
        return array("q", token_ids)
    except OverflowError:
        raise ValueError("token ids must fit in a signed 64-bit integer") from None
    except TypeError as exc:
        raise TypeError(f"token ids must be a sequence of ints: {exc}") from None


class RadixKey:
    """Token ids (raw, in ``array('q')``) plus the namespace they live in.

    ``extra_key`` namespaces the tree: keys with different extra keys never share nodes (LoRA id,
    cache salt, ...). With ``is_bigram`` the key is read as adjacent pairs of its raw tokens.
    """

    __slots__ = ("_tokens", "_start", "_stop", "extra_key", "is_bigram")

    def __init__(
        self,
        token_ids: TokenIds = (),
        extra_key: Hashable | None = None,
        is_bigram: bool = False,
        limit: int | None = None,
    ):
        """``limit`` caps the raw tokens read (SGLang's ``RadixKey.limit``): the key is the first
        ``limit`` raw tokens of ``token_ids``, as a window (no copy of an ``array('q')``)."""
        self._tokens = _token_array(token_ids)
        self._start = 0
        self._stop = len(self._tokens)
        if limit is not None:
            limit = operator.index(limit)
            if limit < 0:
                raise ValueError(f"limit must be >= 0, not {limit}")
            self._stop = min(limit, self._stop)
        self.extra_key = extra_key
        self.is_bigram = bool(is_bigram)

    @classmethod
    def _window(cls, tokens: array, start: int, stop: int, extra_key: Hashable | None, is_bigram: bool) -> RadixKey:
        key = cls.__new__(cls)
        key._tokens, key._start, key._stop, key.extra_key, key.is_bigram = tokens, start, stop, extra_key, is_bigram
        return key

    @property
    def token_ids(self) -> array:
        """The raw token ids of this key (a copy when the key is a window of a larger array)."""
        if self._start == 0 and self._stop == len(self._tokens):
            return self._tokens
        return self._tokens[self._start : self._stop]

    @property
    def raw_length(self) -> int:
        """Number of raw tokens (``len(self) + 1`` for a non-empty bigram key)."""
        return self._stop - self._start

    def __len__(self) -> int:
        raw = self._stop - self._start
        if self.is_bigram:
            return raw - 1 if raw > 1 else 0
        return raw

    def __iter__(self) -> Iterator[Unit]:
        tokens, start, stop = self._tokens, self._start, self._stop
        if self.is_bigram:
            return zip(tokens[start : stop - 1], tokens[start + 1 : stop]) if stop - start > 1 else iter(())
        return iter(tokens[start:stop])

    def __getitem__(self, index: int | slice) -> Unit | RadixKey:
        """An int gives one unit (a token id, or a pair in bigram mode); a slice gives a key that
        shares this key's tokens (O(1))."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("RadixKey slices must have step 1")
            return self._units(start, max(start, stop))
        length = len(self)
        i = operator.index(index)
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(f"RadixKey index {index} out of range for length {length}")
        position = self._start + i
        if self.is_bigram:
            return (self._tokens[position], self._tokens[position + 1])
        return self._tokens[position]

    def _units(self, start: int, stop: int) -> RadixKey:
        """``self[start:stop]`` for ``0 <= start <= stop <= len(self)``, unchecked (the cache
        knows its bounds and makes one of these per new or split node)."""
        raw_stop = stop + 1 if self.is_bigram and stop > start else stop
        return RadixKey._window(
            self._tokens, self._start + start, self._start + raw_stop, self.extra_key, self.is_bigram
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return (
            self.extra_key == other.extra_key
            and self.is_bigram == other.is_bigram
            and self.raw_length == other.raw_length
            and self.match(other) == len(self)
        )

    __hash__ = None  # type: ignore[assignment]  # equal keys may be windows of different arrays

    def __repr__(self) -> str:
        preview = self._tokens[self._start : min(self._stop, self._start + 10)].tolist()
        more = "..." if self.raw_length > 10 else ""
        return f"RadixKey({preview}{more}, extra_key={self.extra_key!r}, is_bigram={self.is_bigram}, len={len(self)})"

    def as_bigram(self) -> RadixKey:
        """The bigram view of these raw tokens (O(1); ``self`` if it already is one)."""
        if self.is_bigram:
            return self
        return RadixKey._window(self._tokens, self._start, self._stop, self.extra_key, True)

    def compact(self) -> RadixKey:
        """A key whose array holds just its tokens: ``self`` when it already covers its whole array,
        else a copy of its window (so that storing it keeps no larger array alive)."""
        tokens = self.token_ids
        if tokens is self._tokens:
            return self
        return RadixKey._window(tokens, 0, len(tokens), self.extra_key, self.is_bigram)

    def page_aligned(self, page_size: int) -> RadixKey:
        """The longest prefix whose length is a multiple of ``page_size``."""
        if page_size == 1:
            return self
        length = len(self)
        return self if length % page_size == 0 else self[: length - length % page_size]  # type: ignore[return-value]

    def _check_compatible(self, other: RadixKey) -> None:
        if self.extra_key != other.extra_key:
            raise ValueError(
                f"RadixKey operations need the same extra_key, got {self.extra_key!r} and {other.extra_key!r}"
            )
        if self.is_bigram != other.is_bigram:
            raise ValueError("RadixKey operations need both keys in the same (bigram or raw) mode")

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """Units shared at the start of both keys, rounded down to a multiple of ``page_size``."""
        return self.match_at(other, 0, page_size)

    def match_at(self, other: RadixKey, offset: int, page_size: int = 1) -> int:
        """Like ``self.match(other[offset:], page_size)`` without making the window."""
        self._check_compatible(other)
        if offset < 0 or offset > len(other):
            raise IndexError(f"offset {offset} is outside a key of length {len(other)}")
        return self._shared_units(other, offset, page_size)

    def _shared_units(self, other: RadixKey, offset: int, page_size: int) -> int:
        """``match_at`` for callers that know the keys are compatible and ``offset`` in range (the
        cache's walk finds nodes by namespaced child key, so it does)."""
        other_start = other._start + offset
        other_raw = other._stop - other_start
        raw = self._stop - self._start
        matched = common_prefix_length(
            self._tokens, self._start, other._tokens, other_start, raw if raw < other_raw else other_raw
        )
        if self.is_bigram:
            # bigram i agrees iff raw tokens i and i + 1 do
            matched = matched - 1 if matched > 1 else 0
        return matched - matched % page_size if page_size > 1 else matched

    def child_key(self, page_size: int = 1) -> Hashable:
        """Dict key for a node's child: its first ``page_size`` units, namespaced by ``extra_key``.

        A token id (page 1), a tuple of ids, a pair (bigram, page 1) or a tuple of pairs.
        """
        return self.child_key_at(0, page_size)

    def child_key_at(self, offset: int, page_size: int = 1) -> Hashable:
        """``self[offset:].child_key(page_size)`` without making the window."""
        tokens, start = self._tokens, self._start + offset
        # raw tokens needed: page_size units, plus the bigram's second token
        if offset < 0 or self._stop - start < page_size + self.is_bigram:
            raise IndexError(f"child_key needs {page_size} units at {offset}, the key has {len(self)}")
        if self.is_bigram:
            if page_size == 1:
                plain: Hashable = (tokens[start], tokens[start + 1])
            else:
                ids = tokens[start : start + page_size + 1]
                plain = tuple(zip(ids[:-1], ids[1:]))
        elif page_size == 1:
            plain = tokens[start]
        else:
            plain = tuple(tokens[start : start + page_size])
        return plain if self.extra_key is None else (self.extra_key, plain)
