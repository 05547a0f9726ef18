"""The end every benchmark shares: its targets as PASS/MISS lines, the JSON file, the exit status."""

from __future__ import annotations

import json
from pathlib import Path

Verdicts = list[tuple[str, bool]]


def report(verdicts: Verdicts, payload: dict, json_path: str | None, check: bool) -> int:
    """Prints each target as PASS or MISS, writes ``payload`` and the targets to ``json_path`` when
    given, and returns the exit status: 1 when ``check`` is set and a target was missed."""
    for text, ok in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    if json_path:
        targets = [{"target": text, "met": ok} for text, ok in verdicts]
        Path(json_path).write_text(json.dumps({**payload, "targets": targets}, indent=2))
    return 1 if check and not all(ok for _, ok in verdicts) else 0
