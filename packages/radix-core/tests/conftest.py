"""Every kernel-level test runs on both backends through one fixture (the multidict pattern)."""

from hypothesis import HealthCheck, settings

from radix_testing.backend_fixtures import backend_name, native_tree  # noqa: F401  (the fixtures)
from radix_testing.clock import ticking_clock  # noqa: F401  (the fixture)
from radix_testing.examples import examples

# backend_name only selects a mode, so sharing it across the examples of one test is what we want.
# A test without its own count runs Hypothesis's default 100, scaled like the others (examples).
settings.register_profile(
    "radix",
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    deadline=None,
    max_examples=examples(100),
)
settings.load_profile("radix")
