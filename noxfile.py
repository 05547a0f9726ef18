"""Every build, test and benchmark job of the radix monorepo.

    nox -s lint tests-pure tests-native      # the fast checks
    nox -s bench                             # the main job: the bigram benchmark with --check

Sessions use virtualenv + pip (never uv): pip is what finds this machine's local CPU build of torch.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = "./packages/radix-core"
NATIVE = "./packages/radix-native"
ADAPTER = "./packages/radix-sglang-adapter"
TEST_REQUIREMENTS = ["pytest==9.2.0", "hypothesis==6.170.17", "numpy==2.4.6"]
# The local CPU build; any other pin (or none) pulls a multi-GB CUDA build.
TORCH = "torch==2.13.0"

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_external_run = True


@nox.session(name="lint")
def lint(session: nox.Session) -> None:
    """ruff over every Python file of the repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(name="tests-pure")
def tests_pure(session: nox.Session) -> None:
    """radix-core alone: the Python reference must be the active backend."""
    session.install(CORE, *TEST_REQUIREMENTS)
    session.run("pytest", f"{CORE}/tests", *session.posargs, env={"RADIX_EXPECT_BACKEND": "python"})


@nox.session(name="tests-native")
def tests_native(session: nox.Session) -> None:
    """radix-core with radix-native: the native kernels must be active (a missing module fails).

    torch is here so that the cache is also tested with the tensor values SGLang stores."""
    session.install(f"{CORE}[native]", NATIVE, TORCH, *TEST_REQUIREMENTS)
    session.run("pytest", f"{CORE}/tests", f"{NATIVE}/tests", *session.posargs, env={"RADIX_EXPECT_BACKEND": "native"})


@nox.session(name="bench")
def bench(session: nox.Session) -> None:
    """The main job: byte-exactness proof, then the interleaved speed table, targets checked."""
    session.install(f"{CORE}[native]", NATIVE)
    args = session.posargs or ["--check"]
    session.run("python", "benchmarks/benchmark_convert_to_bigram_key.py", *args)
