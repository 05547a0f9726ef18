"""The raw kernel contract that radix_core's dispatcher relies on (tested through radix_core too)."""

from array import array

import pytest

import radix_core
import radix_native


def test_release_and_abi_match_radix_core():
    assert radix_native.__version__ == radix_core.__version__
    assert radix_native.KERNEL_ABI == radix_core._backend.NATIVE_KERNEL_ABI


@pytest.mark.parametrize("tokens", [array("q", [1, 2]), range(3), iter([1, 2]), "ab", None, 5])
def test_bigram_kernel_leaves_other_inputs_to_the_reference(tokens):
    assert radix_native.convert_to_bigram_key(tokens) is NotImplemented


class _List(list):
    pass


def test_bigram_kernel_leaves_subclasses_to_the_reference():
    assert radix_native.convert_to_bigram_key(_List([1, 2])) is NotImplemented


@pytest.mark.parametrize("tokens", [range(3), iter([1, 2]), array("d", [1.0]), array("h", [1, 2]), b"ab", None])
def test_pack_kernel_leaves_other_inputs_to_the_reference(tokens):
    assert radix_native.pack_bigram_keys(tokens) is NotImplemented
