"""A differential fuzz of the three kernels through the dispatcher, on hostile inputs.

Every input is built twice from one recipe, so that inputs which change while being read start the
same for both calls: once through the dispatcher (native in a native session), once through the
Python reference. Both must give the same outcome: the same result (pairs holding items at the
same positions of their own input), or the same exception type. The backend_name fixture then
checks that nothing switched the process off native.
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core import (
    common_prefix_length,
    convert_to_bigram_key,
    pack_bigram_keys,
    python_common_prefix_length,
    python_convert_to_bigram_key,
    python_pack_bigram_keys,
)
from radix_testing.examples import examples

np = pytest.importorskip("numpy")


class SpoofedTuple:
    """isinstance(x, tuple) is True through __class__; type(x) is not tuple."""

    @property  # type: ignore[misc]
    def __class__(self):
        return tuple


class RaisingIndex:
    def __index__(self):
        raise ValueError("no index for you")


class RaisingEq:
    def __eq__(self, other):
        raise RuntimeError("no comparison for you")

    __hash__ = object.__hash__


class GrowingIndex:
    """Appends to the list it sits in every time it is read as an index."""

    def __init__(self, value, home):
        self.value, self.home = value, home

    def __index__(self):
        self.home.append(7)
        return self.value


class ShrinkingIndex(GrowingIndex):
    def __index__(self):
        if self.home:
            self.home.pop()
        return self.value


class IntList(list):
    pass


ITEM_KINDS = [
    "int",
    "big",
    "negative",
    "bool",
    "np64",
    "np32",
    "spoofed",
    "raising_index",
    "raising_eq",
    "growing",
    "shrinking",
    "str",
]


def make_item(kind: str, value: int, home: list):
    return {
        "int": lambda: value,
        "big": lambda: value + 2**40,
        "negative": lambda: -value - 1,
        "bool": lambda: bool(value % 2),
        "np64": lambda: np.int64(value),
        "np32": lambda: np.int32(value),
        "spoofed": SpoofedTuple,
        "raising_index": RaisingIndex,
        "raising_eq": RaisingEq,
        "growing": lambda: GrowingIndex(value, home),
        "shrinking": lambda: ShrinkingIndex(value, home),
        "str": lambda: str(value),
    }[kind]()


CONTAINERS = [
    "list",
    "tuple",
    "list_subclass",
    "array",
    "np64",
    "np32",
    "np64_strided",
    "np_uint64",
    "np_float",
    "np_2d",
]
recipes = st.tuples(
    st.sampled_from(CONTAINERS),
    st.lists(st.tuples(st.sampled_from(ITEM_KINDS), st.integers(0, 2**31 - 1)), max_size=12),
)
plain_recipes = st.tuples(
    st.sampled_from(CONTAINERS), st.lists(st.tuples(st.just("int"), st.integers(0, 9)), max_size=12)
)


def build(recipe):
    container, items = recipe
    home: list = []
    home.extend(make_item(kind, value, home) for kind, value in items)
    values = [value for _, value in items]
    return {
        "list": lambda: home,
        "tuple": lambda: tuple(home),
        "list_subclass": lambda: IntList(home),
        "array": lambda: array("q", values),
        "np64": lambda: np.array(values, dtype=np.int64),
        "np32": lambda: np.array(values, dtype=np.int32) if all(v < 2**31 for v in values) else np.array(values),
        "np64_strided": lambda: np.array(values * 2, dtype=np.int64)[::2],
        "np_uint64": lambda: np.array(values, dtype=np.uint64),
        "np_float": lambda: np.array(values, dtype=np.float64),
        "np_2d": lambda: np.array([values, values], dtype=np.int64),
    }[container]()


def outcome(call, *args):
    try:
        return "ok", call(*args)
    except Exception as error:
        return "raised", type(error)


def pair_positions(result, tokens, items_before):
    """Where a conversion's items come from: "the input itself", or for each pair the positions of
    its two items among the input's items as they were before the call."""
    if result is tokens:
        return "the input itself"
    if not isinstance(result, list):
        return result
    where = {id(item): i for i, item in enumerate(items_before)}
    return [tuple(where.get(id(x), repr(x)) for x in pair) for pair in result]


def converted(convert, recipe):
    tokens = build(recipe)
    try:
        items = list(tokens)
    except Exception:
        items = []
    kind, result = outcome(convert, tokens)
    return kind, pair_positions(result, tokens, items) if kind == "ok" else result


@settings(max_examples=examples(400))
@given(recipe=recipes)
def test_conversion_of_hostile_inputs_matches_the_reference(backend_name, recipe):
    assert converted(convert_to_bigram_key, recipe) == converted(python_convert_to_bigram_key, recipe)


def packed(pack, recipe, out_kind):
    tokens = build(recipe)
    out = None
    if out_kind == "fresh":
        out = np.zeros(max(len(tokens), 1), dtype=np.int64)
    elif out_kind == "overlapping" and isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.ndim == 1:
        out = tokens[1:] if tokens.flags.writeable else None
    args = (tokens,) if out is None else (tokens, out)
    kind, result = outcome(pack, *args)
    if kind == "raised":
        return kind, result
    return kind, type(result).__name__, list(result), None if out is None else list(out)


@settings(max_examples=examples(400))
@given(recipe=recipes, out_kind=st.sampled_from(["none", "fresh", "overlapping"]))
def test_packing_of_hostile_inputs_matches_the_reference(backend_name, recipe, out_kind):
    assert packed(pack_bigram_keys, recipe, out_kind) == packed(python_pack_bigram_keys, recipe, out_kind)


@settings(max_examples=examples(200))
@given(recipe=plain_recipes)
def test_packing_into_its_own_input_gives_the_reference_answer(backend_name, recipe):
    assert packed(pack_bigram_keys, recipe, "overlapping") == packed(python_pack_bigram_keys, recipe, "overlapping")


offsets = st.one_of(
    st.integers(-3, 14),
    st.integers(2**62, 2**80),
    st.integers(-(2**80), -(2**62)),
    st.builds(np.int64, st.integers(0, 12)),
    st.booleans(),
    st.just(RaisingIndex()),
    st.just(2.0),
)


@settings(max_examples=examples(400))
@given(a=plain_recipes, b=plain_recipes, a_start=offsets, b_start=offsets, length=offsets)
def test_prefix_lengths_of_hostile_arguments_match_the_reference(backend_name, a, b, a_start, b_start, length):
    def run(kernel):
        return outcome(kernel, build(a), a_start, build(b), b_start, length)

    assert run(common_prefix_length) == run(python_common_prefix_length)
