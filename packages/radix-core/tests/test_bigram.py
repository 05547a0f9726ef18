"""convert_to_bigram_key and pack_bigram_keys: identical to the references on every backend."""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core import (
    PACKED_TOKEN_LIMIT,
    convert_to_bigram_key,
    pack_bigram_keys,
    python_convert_to_bigram_key,
    python_pack_bigram_keys,
)
from radix_testing.examples import examples

any_int = st.integers(min_value=-(2**80), max_value=2**80)
token_like = st.one_of(
    any_int,
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.floats(allow_nan=False),
    st.lists(any_int, max_size=2),
    st.frozensets(st.integers(), max_size=2),
)
token_ids = st.integers(min_value=0, max_value=PACKED_TOKEN_LIMIT - 1)


def assert_same_pairs(result, tokens):
    """Equal to the reference, a real list of real tuples, holding the very same item objects."""
    expected = python_convert_to_bigram_key(tokens)
    assert type(result) is list
    assert result == expected
    assert len(result) == max(len(tokens) - 1, 0)
    for i, pair in enumerate(result):
        assert type(pair) is tuple and len(pair) == 2
        assert pair[0] is tokens[i] and pair[1] is tokens[i + 1]


@settings(max_examples=examples(300))
@given(tokens=st.lists(any_int, max_size=300))
def test_int_lists_match_the_reference(backend_name, tokens):
    assert_same_pairs(convert_to_bigram_key(tokens), tokens)


@settings(max_examples=examples(300))
@given(tokens=st.lists(token_like, max_size=40).filter(lambda t: not t or not isinstance(t[0], tuple)))
def test_any_objects_match_the_reference(backend_name, tokens):
    assert_same_pairs(convert_to_bigram_key(tokens), tokens)


@given(tokens=st.lists(any_int, max_size=50))
def test_tuple_input_matches_the_reference(backend_name, tokens):
    tokens = tuple(tokens)
    assert_same_pairs(convert_to_bigram_key(tokens), tokens)


@given(tokens=st.lists(st.integers(), max_size=50))
def test_other_sequences_match_the_reference(backend_name, tokens):
    for seq in (array("q", [t % 2**63 for t in tokens]), range(len(tokens))):
        result = convert_to_bigram_key(seq)
        assert result == python_convert_to_bigram_key(seq)
        assert type(result) is list and all(type(pair) is tuple for pair in result)


@pytest.mark.parametrize("container", [list, tuple])
def test_already_bigram_input_is_returned_as_is(backend_name, container):
    tokens = container([(1, 2), (2, 3)])
    assert convert_to_bigram_key(tokens) is tokens
    single = container([(7, 8)])
    assert convert_to_bigram_key(single) is single


class _TupleSubclass(tuple):
    pass


def test_first_item_tuple_subclass_counts_as_bigram(backend_name):
    tokens = [_TupleSubclass((1, 2)), 5]
    assert convert_to_bigram_key(tokens) is tokens


@pytest.mark.parametrize("tokens", [[], [5], (), (5,)])
def test_fewer_than_two_tokens_give_a_new_empty_list(backend_name, tokens):
    result = convert_to_bigram_key(tokens)
    assert result == [] and type(result) is list and result is not tokens


def test_a_tuple_later_in_the_list_is_just_an_item(backend_name):
    tokens = [1, (2, 3), 4]
    assert_same_pairs(convert_to_bigram_key(tokens), tokens)


@settings(max_examples=examples(300))
@given(tokens=st.lists(token_like, max_size=40).filter(lambda t: not t or not isinstance(t[0], tuple)))
def test_the_pure_path_pairs_what_sglangs_list_comprehension_pairs(tokens):
    """The reference pairs lists and tuples by iterators: the same pairs of the same objects."""
    comprehension = [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)]
    for sequence in (tokens, tuple(tokens)):
        result = python_convert_to_bigram_key(sequence)
        assert type(result) is list and result == comprehension
        assert all(a is c and b is d for (a, b), (c, d) in zip(result, comprehension))


def test_list_subclass_gets_the_reference_semantics(backend_name):
    class Shifted(list):
        def __getitem__(self, i):
            return super().__getitem__(i) + 100

    tokens = Shifted([1, 2, 3])
    assert convert_to_bigram_key(tokens) == [(101, 102), (102, 103)]


@pytest.mark.parametrize("bad", [5, None, 3.5, object()])
def test_non_sequences_raise_a_clear_type_error(backend_name, bad):
    with pytest.raises(TypeError, match="sequence of token ids"):
        convert_to_bigram_key(bad)


def test_int_only_pairs_are_not_gc_tracked_but_container_pairs_are(backend_name):
    result = convert_to_bigram_key([1, 2**70, True])
    assert gc.is_tracked(result)
    if backend_name == "native":
        assert not any(gc.is_tracked(pair) for pair in result)
    with_list = convert_to_bigram_key([[1], 2])
    assert gc.is_tracked(with_list[0])


def test_cycles_through_the_pairs_are_collected(backend_name):
    class Node:
        pass

    node = Node()
    node.pairs = convert_to_bigram_key([node, 1, 2])
    alive = weakref.ref(node)
    del node
    gc.collect()
    assert alive() is None


def test_repeated_calls_leave_reference_counts_unchanged(backend_name):
    tokens = [10**20 + i for i in range(64)]
    before = [sys.getrefcount(t) for t in tokens]
    list_before = sys.getrefcount(tokens)
    for _ in range(2000):
        convert_to_bigram_key(tokens)
    already = [(1, 2)]
    already_before = sys.getrefcount(already)
    for _ in range(2000):
        convert_to_bigram_key(already)
    assert [sys.getrefcount(t) for t in tokens] == before
    assert sys.getrefcount(tokens) == list_before
    assert sys.getrefcount(already) == already_before


def _traced_growth(call, repeats: int = 3000) -> int:
    """Bytes still allocated after the second of two equal runs of `repeats` calls: the first run
    pays what is allocated once (caches, frames kept for reuse), so that only a leak shows in the
    second."""
    tracemalloc.start()
    try:
        for _run in range(2):
            gc.collect()
            start = tracemalloc.get_traced_memory()[0]
            for _ in range(repeats):
                call()
            gc.collect()
            growth = tracemalloc.get_traced_memory()[0] - start
        return growth
    finally:
        tracemalloc.stop()


def test_conversion_does_not_leak_memory(backend_name):
    tokens = list(range(1000, 1500))
    assert _traced_growth(lambda: convert_to_bigram_key(tokens)) < 4096


# --- pack_bigram_keys ---------------------------------------------------------------------


def expected_packed(tokens):
    tokens = list(tokens)
    return [(a << 32) | b for a, b in zip(tokens, tokens[1:])]


@settings(max_examples=examples(300))
@given(tokens=st.lists(token_ids, max_size=200))
def test_pack_matches_the_reference_from_lists_tuples_and_buffers(backend_name, tokens):
    want = expected_packed(tokens)
    for source in (tokens, tuple(tokens), array("q", tokens), array("i", tokens)):
        packed = pack_bigram_keys(source)
        assert type(packed) is array and packed.typecode == "q"
        assert list(packed) == want
        assert packed == python_pack_bigram_keys(source)


@given(tokens=st.lists(token_ids, min_size=1, max_size=100), step=st.integers(1, 4))
def test_pack_reads_strided_buffers(backend_name, tokens, step):
    view = memoryview(array("q", tokens))[::step]
    assert list(pack_bigram_keys(view)) == expected_packed(tokens[::step])


def test_pack_reads_numpy_int64_and_int32(backend_name):
    np = pytest.importorskip("numpy")
    tokens = [0, 5, PACKED_TOKEN_LIMIT - 1, 17]
    for dtype in (np.int64, np.int32):
        assert list(pack_bigram_keys(np.array(tokens, dtype=dtype))) == expected_packed(tokens)
    assert list(pack_bigram_keys(np.array(tokens, dtype=np.int64)[::-1])) == expected_packed(tokens[::-1])
    assert list(pack_bigram_keys([np.int64(3), np.int32(4)])) == expected_packed([3, 4])


def test_pack_writes_into_a_given_int64_buffer(backend_name):
    out = array("q", [-1] * 5)
    assert pack_bigram_keys([1, 2, 3], out=out) is out
    assert list(out) == expected_packed([1, 2, 3]) + [-1, -1, -1]
    np = pytest.importorskip("numpy")
    np_out = np.full(2, -1, dtype=np.int64)
    assert pack_bigram_keys(array("i", [4, 5, 6]), out=np_out) is np_out
    assert np_out.tolist() == expected_packed([4, 5, 6])


@pytest.mark.parametrize(
    "out, error",
    [
        (array("q", [0]), ValueError),
        (array("i", [0, 0, 0]), TypeError),
        (array("d", [0.0] * 3), TypeError),
        (bytes(24), TypeError),
        ([0, 0], TypeError),
    ],
)
def test_pack_rejects_unusable_out_buffers(backend_name, out, error):
    with pytest.raises(error):
        pack_bigram_keys([1, 2, 3], out=out)


@pytest.mark.parametrize("tokens", [[], [7], array("q"), array("i", [7])])
def test_pack_of_fewer_than_two_tokens_is_empty(backend_name, tokens):
    assert pack_bigram_keys(tokens) == array("q")


@pytest.mark.parametrize(
    "tokens",
    [[1, -1], [PACKED_TOKEN_LIMIT, 1], [2**70, 1], [-(2**70)], [2**40], array("q", [1, -5]), array("i", [-1, 0])],
)
def test_pack_rejects_ids_outside_31_bits(backend_name, tokens):
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        pack_bigram_keys(tokens)


@pytest.mark.parametrize(
    "tokens",
    [[1, 2.0], [1, "2"], [None], ["ab"], "abc", b"\x00" * 16, bytearray(16), array("d", [1.0, 2.0]), 5, None],
)
def test_pack_rejects_non_integer_tokens(backend_name, tokens):
    with pytest.raises(TypeError):
        pack_bigram_keys(tokens)


def test_pack_rejects_multi_dimensional_buffers(backend_name):
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="1-D"):
        pack_bigram_keys(np.zeros((2, 2), dtype=np.int64))


def test_pack_accepts_any_int_iterable_like_the_reference(backend_name):
    assert list(pack_bigram_keys(range(4))) == expected_packed(range(4))


def test_pack_does_not_leak_on_success_or_error(backend_name):
    tokens = list(range(300))
    bad = list(range(300)) + [-1]
    out = array("q", [0] * 299)
    out_refs = sys.getrefcount(out)

    def succeed_and_fail():
        pack_bigram_keys(tokens)
        pack_bigram_keys(tokens, out=out)
        try:  # not pytest.raises: on 3.10 the frames it keeps show up as a few KB of growth
            pack_bigram_keys(bad, out=out)
        except ValueError:
            return
        raise AssertionError("a negative token id was accepted")

    assert _traced_growth(succeed_and_fail, repeats=1000) < 4096
    assert sys.getrefcount(out) == out_refs
    for too_short in (array("q"), out):
        with pytest.raises(ValueError):
            pack_bigram_keys(tokens + [1], out=too_short)
        too_short.append(0)  # BufferError if a failed call kept its buffer exported


def test_keyword_calls_keep_the_backend(backend_name):
    """A valid call with the documented keywords never switches a process off native (the
    backend_name fixture checks that after the test)."""
    assert convert_to_bigram_key(tokens=[1, 2, 3]) == [(1, 2), (2, 3)]
    out = array("q", [0, 0])
    assert pack_bigram_keys(tokens=[1, 2, 3], out=out) is out and out.tolist() == [(1 << 32) | 2, (2 << 32) | 3]
    assert pack_bigram_keys([1, 2], out=None).tolist() == [(1 << 32) | 2]
    with pytest.raises(TypeError):
        convert_to_bigram_key(tokens=[1, 2], extra=1)
    with pytest.raises(TypeError):
        convert_to_bigram_key([1, 2], tokens=[1, 2])
