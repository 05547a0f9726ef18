"""The raw kernel contract that radix_core's dispatcher relies on (tested through radix_core too)."""

import importlib.metadata
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


class _Index:
    def __index__(self):
        return 1


class _SpoofedTuple:
    @property  # type: ignore[misc]
    def __class__(self):
        return tuple


@pytest.mark.parametrize("tokens", [[True, 2], [_SpoofedTuple(), 1], [_Index(), 1], [2.0, 1]])
def test_bigram_kernel_reads_only_exact_int_or_tuple_heads(tokens):
    """isinstance(tokens[0], tuple) may run code or be spoofed: those first items go to the reference."""
    assert radix_native.convert_to_bigram_key(tokens) is NotImplemented


@pytest.mark.parametrize("tokens", [[1, _Index()], (1, True)])
def test_pack_kernel_reads_only_exact_ints(tokens):
    assert radix_native.pack_bigram_keys(tokens) is NotImplemented


@pytest.mark.parametrize("tokens", [[1, 2**70], [-1, 2], (2**31, 0)])
def test_pack_kernel_rejects_ids_outside_31_bits(tokens):
    with pytest.raises(ValueError, match="token ids must be in"):
        radix_native.pack_bigram_keys(tokens)


def test_kernels_take_positional_arguments_only():
    """radix_core's dispatcher binds keywords to positions before calling a kernel."""
    with pytest.raises(TypeError):
        radix_native.pack_bigram_keys(tokens=[1, 2])
    assert radix_native.pack_bigram_keys([1, 2], None).tolist() == [(1 << 32) | 2]


def test_pack_leaves_an_out_that_overlaps_its_input_to_the_reference():
    tokens = array("q", [1, 2, 3, 4])
    view = memoryview(tokens)
    assert radix_native.pack_bigram_keys(view, view[1:]) is NotImplemented
    assert tokens.tolist() == [1, 2, 3, 4], "nothing written"


def test_common_prefix_length_of_an_index_too_large_is_the_reference_index_error():
    with pytest.raises(IndexError):
        radix_native.common_prefix_length(array("q", [1]), 2**70, array("q", [1]), 0, 1)


def test_pip_show_tells_the_kernel_abi():
    summary = importlib.metadata.metadata("radix-native")["Summary"]
    assert f"kernel ABI {radix_native.KERNEL_ABI}" in summary


class _PropertyNode(radix_core.cache.TreeNode):
    __slots__ = ()

    @property  # type: ignore[misc]
    def children(self):  # reading it would run Python code
        return {}


class _Namespace:
    pass


def _one_edge_tree(root: object, extra_key: object = None) -> object:
    edge = radix_core.cache.TreeNode(radix_core.RadixKey([5, 6], extra_key), None, None)
    root.children = {5 if extra_key is None else (extra_key, 5): edge}
    return edge


@pytest.mark.parametrize("case", ["no slots", "slot shadowed by a property", "namespace of Python objects"])
def test_descend_leaves_objects_it_cannot_read_without_python_to_the_reference(case):
    key = radix_core.RadixKey([5, 6, 7])
    if case == "no slots":
        root = type("Plain", (), {})()
        _one_edge_tree(root)
    elif case == "slot shadowed by a property":
        root = object.__new__(_PropertyNode)
    else:
        namespace = _Namespace()
        root = radix_core.cache.TreeNode(radix_core.RadixKey(), None, None)
        _one_edge_tree(root, namespace)
        key = radix_core.RadixKey([5, 6, 7], namespace)
    assert radix_native.descend(root, key, 0, 1) is NotImplemented


def test_descend_reads_a_tree_of_radix_core():
    root = radix_core.cache.TreeNode(radix_core.RadixKey(), None, None)
    edge = _one_edge_tree(root)
    assert radix_native.descend(root, radix_core.RadixKey([5, 6, 7]), 0, 1) == ([edge], [2])
