"""The benchmarks are scripts, not a package: their directory goes on sys.path for the tests to import them
(last, so that it shadows nothing installed)."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))
