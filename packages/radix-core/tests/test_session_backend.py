"""The nox session really runs the backend it claims to test."""

import importlib.util
import subprocess
import sys
from importlib.metadata import requires

import pytest

import radix_core
from radix_testing.backend_fixtures import expected_backend

EXPECTED_BACKEND = expected_backend()


def test_session_runs_the_expected_backend():
    if EXPECTED_BACKEND is None:
        pytest.skip("RADIX_EXPECT_BACKEND is set by the nox sessions")
    status = radix_core.backend()
    assert status.active == EXPECTED_BACKEND, status.reason
    if EXPECTED_BACKEND == "python":
        assert importlib.util.find_spec("radix_native") is None, "tests-pure must not have radix-native"
    else:
        assert status.native_version == radix_core.__version__


def test_native_extra_pins_this_release():
    native_extra = [req.split(";")[0].strip() for req in requires("radix-core") if "native" in req.partition(";")[2]]
    assert native_extra == [f"radix-native=={radix_core.__version__}"]


def test_importing_radix_core_imports_neither_torch_nor_numpy():
    code = "import sys, radix_core; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
