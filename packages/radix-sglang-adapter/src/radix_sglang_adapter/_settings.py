"""What both parts of the adapter (the patches and the backend) read: its switches and SGLang's release.

Imported by the .pth startup hook, so it imports neither SGLang nor radix_core: a bad
RADIX_CORE_BACKEND must not become a start-up traceback.
"""

from __future__ import annotations

import importlib.metadata
import os
import re

DISABLE_ENV = "RADIX_SGLANG_ADAPTER_DISABLE"
ACCELERATE_ENV = "RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH"
AUTO_ENV = "RADIX_SGLANG_ADAPTER"
# Releases this adapter was tested against (inclusive); it refuses to touch any other.
TESTED_RELEASES = ((0, 5, 10), (0, 5, 23))
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")

Release = tuple[int, int, int]


class AdapterError(RuntimeError):
    """Activation was refused or failed (only an explicit ``activate()`` raises it)."""


def boolean_env(name: str) -> bool:
    """A strict on/off environment variable; AdapterError for any other value."""
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise AdapterError(f"{name}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> Release | None:
    """``0.5.10.post1`` -> ``(0, 5, 10)``; None for a version without three numbers."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in found.groups()) if found else None  # type: ignore[return-value]


def release_text(release: Release) -> str:
    return ".".join(map(str, release))
