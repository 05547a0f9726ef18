"""One fixture runs each kernel-level test on both backends (the multidict pattern).

nox sets RADIX_EXPECT_BACKEND: in a native session a missing or fallen-back native backend is a
failure, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

import radix_core
from radix_core import _backend

EXPECTED_BACKEND = os.environ.get("RADIX_EXPECT_BACKEND")

# backend_name only selects a mode, so sharing it across the examples of one test is what we want.
settings.register_profile("radix", suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
settings.load_profile("radix")


@pytest.fixture(params=["python", "native"])
def backend_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with the public dispatchers bound to one backend."""
    if request.param == "python":
        monkeypatch.setattr(_backend, "native_kernels", None)
        yield "python"
        return
    status = radix_core.backend()
    if status.active != "native":
        if EXPECTED_BACKEND == "native":
            pytest.fail(f"this session needs the native backend, but: {status.reason}")
        pytest.skip(f"native backend not in use: {status.reason}")
    yield "native"
    after = radix_core.backend()
    assert after.active == "native", f"a native kernel fell back to Python during the test: {after.reason}"
