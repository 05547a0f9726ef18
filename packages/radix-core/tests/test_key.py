"""RadixKey and the common-prefix kernel, on both backends."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix_core import RadixKey, common_prefix_length, python_common_prefix_length

small_tokens = st.lists(st.integers(0, 3), max_size=60)
int64 = st.integers(-(2**63), 2**63 - 1)


def naive_common_prefix(a, b):
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return shared


@given(a=small_tokens, b=small_tokens, a_start=st.integers(0, 5), b_start=st.integers(0, 5))
def test_common_prefix_length_matches_a_naive_scan(backend_name, a, b, a_start, b_start):
    a_start, b_start = min(a_start, len(a)), min(b_start, len(b))
    length = min(len(a) - a_start, len(b) - b_start)
    want = naive_common_prefix(a[a_start:], b[b_start:])
    assert common_prefix_length(array("q", a), a_start, array("q", b), b_start, length) == want
    assert python_common_prefix_length(a, a_start, b, b_start, length) == want


@given(tokens=st.lists(int64, min_size=1, max_size=300), data=st.data())
def test_common_prefix_length_finds_any_single_difference(backend_name, tokens, data):
    position = data.draw(st.integers(0, len(tokens) - 1))
    other = array("q", tokens)
    other[position] = other[position] ^ 1
    assert common_prefix_length(array("q", tokens), 0, other, 0, len(tokens)) == position


@pytest.mark.parametrize("a_start, b_start, length", [(-1, 0, 1), (0, -1, 1), (0, 0, -1), (0, 0, 5), (3, 0, 2)])
def test_common_prefix_length_rejects_ranges_outside_the_buffers(backend_name, a_start, b_start, length):
    with pytest.raises(IndexError):
        common_prefix_length(array("q", [1, 2, 3, 4]), a_start, array("q", [1, 2, 3, 4]), b_start, length)


def test_key_accepts_token_sequences_and_shares_an_int64_array():
    tokens = array("q", [5, 6, 7])
    assert RadixKey(tokens).token_ids is tokens
    for source in ([5, 6, 7], (5, 6, 7), range(5, 8), array("i", [5, 6, 7])):
        assert RadixKey(source).token_ids == tokens
    np = pytest.importorskip("numpy")
    assert RadixKey(np.array([5, 6, 7])).token_ids == tokens


@pytest.mark.parametrize(
    "bad, error",
    [
        ([1, 2.5], TypeError),
        (["a"], TypeError),
        ("abc", TypeError),
        (b"abc", TypeError),
        ([2**64], ValueError),
        (None, TypeError),
        (5, TypeError),
    ],
)
def test_key_rejects_non_integer_tokens(bad, error):
    with pytest.raises(error):
        RadixKey(bad)


@given(tokens=small_tokens, limit=st.integers(0, 70), bigram=st.booleans())
def test_limit_reads_the_first_raw_tokens_without_copying(tokens, limit, bigram):
    ids = array("q", tokens)
    key = RadixKey(ids, is_bigram=bigram, limit=limit)
    assert key == RadixKey(tokens[:limit], is_bigram=bigram)
    assert key.raw_length == min(limit, len(tokens)) and key._tokens is ids


@pytest.mark.parametrize("limit", [-1, 1.5, "3"])
def test_bad_limits_are_rejected(limit):
    with pytest.raises((ValueError, TypeError)):
        RadixKey([1, 2, 3], limit=limit)


def test_slices_are_windows_over_the_same_tokens():
    key = RadixKey(list(range(10)), extra_key="lora-1")
    tail = key[3:]
    assert tail._tokens is key._tokens and tail.extra_key == "lora-1"
    assert list(tail) == list(range(3, 10)) and len(tail) == 7
    assert list(key[2:5]) == [2, 3, 4] and list(key[7:2]) == []
    assert key[-1] == 9 and key[0] == 0
    with pytest.raises(IndexError):
        key[10]
    with pytest.raises(ValueError):
        key[::2]
    window = key[2:5].compact()
    assert window._tokens == array("q", [2, 3, 4]) and window == key[2:5]
    whole = RadixKey(array("q", [1, 2]))
    assert whole.compact() is whole


@given(tokens=st.lists(st.integers(0, 9), max_size=20), start=st.integers(0, 25), stop=st.integers(0, 25))
def test_bigram_view_reads_adjacent_pairs_without_copying(tokens, start, stop):
    raw = RadixKey(tokens)
    view = raw.as_bigram()
    pairs = list(zip(tokens, tokens[1:]))
    assert view._tokens is raw._tokens and view.is_bigram and not raw.is_bigram
    assert len(view) == len(pairs) and list(view) == pairs
    assert list(view[start:stop]) == pairs[start:stop]
    assert len(view[start:stop]) == len(pairs[start:stop])
    if pairs:
        assert view[0] == pairs[0] and view[-1] == pairs[-1]
    assert view.as_bigram() is view


@given(a=small_tokens, b=small_tokens, bigram=st.booleans(), page_size=st.sampled_from([1, 2, 4]))
def test_match_is_the_shared_prefix_rounded_down_to_pages(backend_name, a, b, bigram, page_size):
    key_a, key_b = RadixKey(a, is_bigram=bigram), RadixKey(b, is_bigram=bigram)
    units_a, units_b = list(key_a), list(key_b)
    shared = naive_common_prefix(units_a, units_b)
    assert key_a.match(key_b, page_size) == shared - shared % page_size
    assert key_a[1:].match(key_b[1:], page_size) == key_b[1:].match(key_a[1:], page_size)


def test_match_refuses_keys_from_different_namespaces_or_modes():
    with pytest.raises(ValueError, match="extra_key"):
        RadixKey([1, 2], extra_key="a").match(RadixKey([1, 2], extra_key="b"))
    with pytest.raises(ValueError, match="bigram"):
        RadixKey([1, 2]).match(RadixKey([1, 2], is_bigram=True))


def test_page_aligned_keeps_whole_pages():
    key = RadixKey(range(10))
    assert key.page_aligned(1) is key and list(key.page_aligned(4)) == list(range(8))
    assert len(RadixKey(range(10), is_bigram=True).page_aligned(4)) == 8


def test_child_keys_are_units_namespaced_by_extra_key():
    assert RadixKey([7, 8, 9]).child_key() == 7
    assert RadixKey([7, 8, 9]).child_key(2) == (7, 8)
    assert RadixKey([7, 8, 9], is_bigram=True).child_key() == (7, 8)
    assert RadixKey([7, 8, 9], is_bigram=True).child_key(2) == ((7, 8), (8, 9))
    assert RadixKey([7, 8, 9], extra_key="salt").child_key() == ("salt", 7)
    assert RadixKey([7, 8, 9])[1:].child_key() == 8
    with pytest.raises(IndexError):
        RadixKey([7], is_bigram=True).child_key()


def test_equality_compares_units_namespace_and_mode():
    assert RadixKey([1, 2, 3])[1:] == RadixKey([2, 3])
    assert RadixKey([1, 2]) != RadixKey([1, 2], extra_key="x")
    assert RadixKey([1, 2]) != RadixKey([1, 2], is_bigram=True)
    assert RadixKey([1, 2]) != RadixKey([1, 2, 3])
