"""SGLang must import on this CPU machine before any test module touches it."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from radix_testing import sglang_server_shims
from radix_testing.backend_fixtures import backend_name, native_tree  # noqa: F401  (the fixtures)
from radix_testing.clock import ticking_clock  # noqa: F401  (the fixture)

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
