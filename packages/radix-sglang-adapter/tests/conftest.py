"""SGLang must import on this CPU machine before any test module touches it."""

from __future__ import annotations

import itertools
import os
import sys
import time

import pytest
from hypothesis import HealthCheck, settings

from radix_core.testing import backend_name, native_tree  # noqa: F401  (the fixtures)

# The shims that run SGLang's host tier on this CPU, imported from the servers' site directory,
# which stays off the path: its sgl_kernel stand-in is the servers' (SGLang 0.5.10 imports a package).
SERVER_SITE = os.path.join(os.path.dirname(__file__), "sglang_server_site")
sys.path.insert(0, SERVER_SITE)
import sglang_server_shims  # noqa: E402

sys.path.remove(SERVER_SITE)

settings.register_profile("radix", suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
settings.load_profile("radix")

EXPECTED_SGLANG = os.environ.get("RADIX_EXPECT_SGLANG")

try:
    sglang_server_shims.install()
    import sglang.srt.mem_cache.radix_cache  # noqa: F401
except ImportError as exc:
    if EXPECTED_SGLANG:
        raise
    pytest.skip(f"SGLang is not importable here: {exc}", allow_module_level=True)


@pytest.fixture
def ticking_clock(monkeypatch):
    """One clock for both trees that never returns the same time twice: exact eviction orders."""
    ticks = itertools.count(1)
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
