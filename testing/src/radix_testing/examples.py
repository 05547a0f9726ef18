"""How many examples a property test runs (or a stress test its trials): its full count, or a share
of it where a session's point is something else (the sanitizers, the installed wheels on each
Python). RADIX_HYPOTHESIS_SCALE sets the share (unset: 1, the full count); tests-pure and
tests-native always run the full counts."""

from __future__ import annotations

import os

SCALE = float(os.environ.get("RADIX_HYPOTHESIS_SCALE", "1"))
# Below this a property test hardly searches at all; no test is cut further.
FLOOR = 10


def examples(full: int) -> int:
    """`full` scaled by RADIX_HYPOTHESIS_SCALE, never below FLOOR nor above `full`."""
    return min(full, max(FLOOR, round(full * SCALE)))
