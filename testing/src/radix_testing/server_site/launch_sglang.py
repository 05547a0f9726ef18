"""Test-only launcher: ``python launch_sglang.py [--fake-amx] SERVER_ARGS...`` is
``python -m sglang.launch_server SERVER_ARGS...`` (its shims come from sitecustomize, beside this
file). ``--fake-amx`` makes this process's platform report Intel AMX, so SGLang keeps the
``intel_amx`` attention backend that EAGLE's draft needs (see sglang_server_shims)."""

from __future__ import annotations

import os
import sys

from sglang.launch_server import run_server
from sglang.srt.plugins import load_plugins
from sglang.srt.runtime_context import get_platform
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import kill_process_tree

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--fake-amx"]:
        get_platform()._overrides["has_amx"] = True
        args = args[1:]
    load_plugins()
    server_args = prepare_server_args(args)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
