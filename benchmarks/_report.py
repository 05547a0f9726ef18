"""What benchmarks share: the CPU they ran on, and their end (PASS/MISS lines, the JSON file, the exit status)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

Verdicts = list[tuple[str, bool]]


# What /proc/cpuinfo says besides the model name, under the names it is shown with.
CPU_DETAILS = (("family", "cpu family"), ("model", "model"), ("cache", "cache size"))


def cpu_model() -> str:
    """The CPU the numbers were measured on, as Linux names it: a VM may only say "AMD EPYC", so its
    family, model and cache size are added to tell one such machine from another."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    details = ", ".join(f"{label} {fields[key]}" for label, key in CPU_DETAILS if key in fields)
    return f"{name} ({details}), {os.cpu_count()} CPUs" if details else f"{name}, {os.cpu_count()} CPUs"


def report(verdicts: Verdicts, payload: dict, json_path: str | None, check: bool) -> int:
    """Prints each target as PASS or MISS, writes ``payload`` and the targets to ``json_path`` when
    given, and returns the exit status: 1 when ``check`` is set and a target was missed."""
    for text, ok in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    if json_path:
        targets = [{"target": text, "met": ok} for text, ok in verdicts]
        Path(json_path).write_text(json.dumps({**payload, "targets": targets}, indent=2))
    return 1 if check and not all(ok for _, ok in verdicts) else 0
