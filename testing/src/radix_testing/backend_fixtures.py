"""pytest fixtures for suites that test code on radix-core's backends.

Import them into a ``conftest.py``: ``from radix_testing.backend_fixtures import backend_name``
(every backend) or ``native_tree`` (radix-native's tree only); ``python_store_only`` narrows
``backend_name`` to the kernels. Set ``RADIX_EXPECT_BACKEND=native``
in a session that must run native: a missing or fallen-back native backend then fails the test
instead of skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from radix_core import _backend

from .backends import python_reference_only, tree_by_default

EXPECT_BACKEND_ENV = "RADIX_EXPECT_BACKEND"


def expected_backend() -> str | None:
    """The backend this test session promises to run, if it promises one."""
    return os.environ.get(EXPECT_BACKEND_ENV)


@pytest.fixture(params=["python", "native", "native-tree"])
def backend_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test with radix-core's kernels bound to each backend: the Python reference, the
    native kernels, and the native kernels with RadixCache on radix-native's tree (yielded as
    ``"native"`` too: the kernels are the same)."""
    if request.param == "python":
        with python_reference_only():
            yield "python"
        return
    status = _backend.backend()
    if status.active != "native":
        if expected_backend() == "native":
            pytest.fail(f"this session needs the native backend, but: {status.reason}")
        pytest.skip(f"native backend not in use: {status.reason}")
    if request.param == "native-tree" and _backend.native_tree_module() is None:
        if expected_backend() == "native":
            pytest.fail("this session needs radix-native's tree, but it is unusable (see the log)")
        pytest.skip("radix-native's tree is unusable")
    with tree_by_default("native" if request.param == "native-tree" else "python"):
        yield "native"
    after = _backend.backend()
    assert after.active == "native", f"a native kernel fell back to Python during the test: {after.reason}"


# Marks a test (or a module, as ``pytestmark``) of a cache whose tree has a Python store only (the
# tiered and windowed trees): there radix-native's tree would only repeat the native kernels' run.
python_store_only = pytest.mark.parametrize("backend_name", ["python", "native"], indirect=True)


@pytest.fixture
def native_tree() -> Any:
    """radix-native's tree module, for tests of what only that tree has; a session that must run
    native fails without it, others skip."""
    module = _backend.native_tree_module()
    if module is None:
        if expected_backend() == "native":
            pytest.fail(f"this session needs radix-native's tree, but: {_backend.backend().reason}")
        pytest.skip("radix-native's tree is not in use")
    return module
