"""``python -m radix_sglang_adapter doctor``: activate in this process and report every patch point.

Exit status: 0 when activation did what this SGLang needs (or was switched off on purpose),
1 when a patch point that should hold the replacement does not, 2 when activation was refused or
failed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ._patching import BINDING_MODULES, AdapterError, activate


def doctor() -> int:
    import_errors = []
    for module in BINDING_MODULES:  # import what a serving process imports, so its bindings show
        try:
            importlib.import_module(module)
        except Exception as exc:
            import_errors.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
    try:
        report = activate(source="doctor")
    except AdapterError as exc:
        print(f"radix-sglang-adapter: activation refused or failed: {exc}")
        return 2
    print(report.format())
    for error in import_errors:
        print(f"  warning: {error}")
    return 1 if any(point.state == "not patched" for point in report.patch_points) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radix_sglang_adapter", description=__doc__)
    parser.add_argument("command", choices=["doctor"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
