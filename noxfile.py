"""Every build, test and benchmark job of the radix monorepo.

    nox -s lint tests-pure tests-native                           # no SGLang needed
    nox -s tests-sglang tests-adapter-pure tests-adapter-native   # against real SGLang wheels (CPU)
    nox -s bench                                                  # the main job

Sessions use virtualenv/venv + pip (never uv): pip is what finds this machine's local CPU build of
torch. SGLang environments (~2.4 GB each) are built once per release under .nox/ and shared by
every session that needs that release; those sessions install or remove radix-native inside them.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = "./packages/radix-core"
NATIVE = "./packages/radix-native"
ADAPTER = "./packages/radix-sglang-adapter"
TEST_REQUIREMENTS = ["pytest==9.2.0", "hypothesis==6.170.17", "numpy==2.4.6"]
# The local CPU build; any other pin (or none) pulls a multi-GB CUDA build.
TORCH = "torch==2.13.0"
MATPLOTLIB = "matplotlib==3.11.2"

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_external_run = True


@nox.session(name="lint")
def lint(session: nox.Session) -> None:
    """ruff over every Python file of the repository; mypy over the shipped Python packages."""
    session.install("ruff==0.17.6", "mypy==2.4.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy", "--ignore-missing-imports", f"{CORE}/src/radix_core", f"{ADAPTER}/src/radix_sglang_adapter")


@nox.session(name="tests-pure")
@nox.session(name="tests-native")
def tests(session: nox.Session) -> None:
    """radix-core's tests without radix-native (-pure) or with it (-native).

    -pure asserts the Python reference is active; -native that the native kernels are (a missing
    module fails). torch is in -native so the cache is also tested with SGLang's tensor values,
    and matplotlib (radix-core[plot]) so the replay's plot is drawn; -pure has neither."""
    if session.name == "tests-native":
        session.install(f"{CORE}[native,plot]", NATIVE, TORCH, MATPLOTLIB, *TEST_REQUIREMENTS)
        suites, expected = [f"{CORE}/tests", f"{NATIVE}/tests"], "native"
    else:
        session.install(CORE, *TEST_REQUIREMENTS)
        suites, expected = [f"{CORE}/tests"], "python"
    session.run("pytest", *suites, *session.posargs, env={"RADIX_EXPECT_BACKEND": expected})


# AddressSanitizer and UndefinedBehaviorSanitizer, every report fatal.
SANITIZERS = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
SANITIZED_TESTS = [
    f"{NATIVE}/tests",
    *(f"{CORE}/tests/{name}" for name in ("test_bigram.py", "test_key.py", "test_hostile_inputs.py")),
]


@nox.session(name="tests-sanitizers")
def tests_sanitizers(session: nox.Session) -> None:
    """radix-native built with ASan and UBSan; its kernel tests and the differential fuzz through
    radix_core run under them, and any report fails the session."""
    session.install(CORE, *TEST_REQUIREMENTS)
    session.install(
        NATIVE,
        "--config-settings=build-dir=build/sanitizers",  # never the release build's CMake cache
        "--config-settings=cmake.build-type=RelWithDebInfo",
        f"--config-settings=cmake.define.CMAKE_CXX_FLAGS={SANITIZERS}",
        "--config-settings=cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined",
    )
    # Located, not imported: without ASan loaded first the module refuses to load.
    where = (
        "import glob, os, importlib.util as u; "
        "print(*glob.glob(os.path.join(os.path.dirname(u.find_spec('radix_native').origin), '_kernels*')))"
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
    }
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *SANITIZED_TESTS, *session.posargs, env=env)


@nox.session(name="bench")
def bench(session: nox.Session) -> None:
    """The main job: the bundled Mooncake trace replayed over a capacity sweep, pure vs native (the
    same prefix length for every request, checked), then the bigram benchmark (byte-exactness,
    then the interleaved speed table, targets checked; arguments go to it)."""
    session.install(f"{CORE}[native]", NATIVE)
    session.run("python", "benchmarks/benchmark_replay.py", "--check")
    session.run("python", "benchmarks/benchmark_convert_to_bigram_key.py", *(session.posargs or ["--check"]))


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
# What SGLang's request objects import besides (schedule_batch -> its OpenAI protocol module), with
# the openai client each release pins.
OPENAI_PROTOCOL_DEPS = ["sniffio==1.3.1", "partial-json-parser==0.2.1.1.post7", "jiter==0.19.0", "distro==1.9.0"]
SGLANG_RELEASES = {
    "0.5.10": ["openai==2.6.1", *OPENAI_PROTOCOL_DEPS],
    "0.5.23": ["openai==2.8.0", *OPENAI_PROTOCOL_DEPS],
}
NATIVE_WHEELS = ROOT / ".nox" / "_wheels"


def sglang_python(session: nox.Session, release: str) -> str:
    """The interpreter of the shared environment for one SGLang release, built if missing or stale."""
    env_dir = ROOT / ".nox" / f"sglang-{release}"
    python = env_dir / "bin" / "python"
    wanted = [TORCH, f"sglang=={release}", *SGLANG_CPU_DEPS, *SGLANG_RELEASES[release], *TEST_REQUIREMENTS]
    stamp = env_dir / "radix-requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(wanted):
        session.log(f"reusing {env_dir}")
        return str(python)
    shutil.rmtree(env_dir, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(env_dir), external=True)
    constraints = env_dir / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(constraints)]
    session.run(*pip, TORCH, external=True)
    session.run(*pip, "--no-deps", f"sglang=={release}", *SGLANG_CPU_DEPS, *SGLANG_RELEASES[release], external=True)
    session.run(*pip, *TEST_REQUIREMENTS, external=True)
    stamp.write_text("\n".join(wanted))
    return str(python)


def native_wheel(session: nox.Session) -> str:
    """radix-native built once per source state, then installed into every environment needing it."""
    sources = hashlib.sha256()
    for path in sorted((ROOT / NATIVE).rglob("*")):
        if path.is_file() and "build" not in path.relative_to(ROOT / NATIVE).parts:
            sources.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    out_dir = NATIVE_WHEELS / sources.hexdigest()[:16]
    wheels = sorted(out_dir.glob("radix_native-*.whl"))
    if not wheels:
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out_dir), NATIVE]
        session.run(*pip_wheel, external=True)
        wheels = sorted(out_dir.glob("radix_native-*.whl"))
    return str(wheels[-1])


def install_radix(session: nox.Session, python: str, native: bool) -> None:
    """This checkout's radix-core and adapter, with or without radix-native, into a shared env."""
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    session.run(*pip, "install", "--quiet", "--no-deps", "--force-reinstall", CORE, ADAPTER, external=True)
    if native:
        session.run(*pip, "install", "--quiet", "--no-deps", "--force-reinstall", native_wheel(session), external=True)
    else:
        session.run(*pip, "uninstall", "--quiet", "--yes", "radix-native", external=True)


DIFFERENTIAL_TEST = f"{ADAPTER}/tests/test_radix_cache_vs_sglang.py"
ADAPTER_TESTS = [f"{ADAPTER}/tests", "--ignore", DIFFERENTIAL_TEST]


def run_sglang_tests(session: nox.Session, release: str, native: bool, tests: list[str]) -> None:
    python = sglang_python(session, release)
    install_radix(session, python, native)
    env = {"RADIX_EXPECT_BACKEND": "native" if native else "python", "RADIX_EXPECT_SGLANG": release}
    session.run(python, "-m", "pytest", *tests, *session.posargs, env=env, external=True)


@nox.session(name="tests-sglang", venv_backend="none")
def tests_sglang(session: nox.Session) -> None:
    """radix-core's RadixCache against SGLang 0.5.23's own, operation by operation, both backends."""
    run_sglang_tests(session, "0.5.23", True, [DIFFERENTIAL_TEST])


@nox.session(name="tests-adapter-pure", venv_backend="none")
@nox.session(name="tests-adapter-native", venv_backend="none")
@nox.parametrize("sglang", list(SGLANG_RELEASES))
def tests_adapter(session: nox.Session, sglang: str) -> None:
    """The adapter in real SGLang wheels on CPU, without radix-native (-pure) or with it (-native)."""
    run_sglang_tests(session, sglang, session.name.startswith("tests-adapter-native"), ADAPTER_TESTS)


@nox.session(name="bench-radix-cache", venv_backend="none")
def bench_radix_cache(session: nox.Session) -> None:
    """radix-core (pure, native) vs SGLang 0.5.23's RadixCache on EAGLE workloads; writes the plot."""
    python = sglang_python(session, "0.5.23")
    install_radix(session, python, native=True)
    session.run(python, "-m", "pip", "install", "--quiet", MATPLOTLIB, external=True)
    args = session.posargs or ["--check", "--plot", "docs/radix_cache_benchmark.png"]
    session.run(python, "-W", "ignore", "benchmarks/benchmark_radix_cache.py", *args, external=True)


@nox.session(name="bench-sglang-backend", venv_backend="none")
def bench_sglang_backend(session: nox.Session) -> None:
    """--radix-cache-backend radix vs SGLang 0.5.23's default cache and RadixCache on the Mooncake trace."""
    python = sglang_python(session, "0.5.23")
    install_radix(session, python, native=True)
    args = session.posargs or ["--check"]
    session.run(python, "-W", "ignore", "benchmarks/benchmark_sglang_backend.py", *args, external=True)


@nox.session(name="bench-sglang-path", venv_backend="none")
def bench_sglang_path(session: nox.Session) -> None:
    """SGLang 0.5.10's EAGLE cache paths with the adapter off, on (pure) and on (native)."""
    python = sglang_python(session, "0.5.10")
    install_radix(session, python, native=True)
    args = session.posargs or ["--check"]
    session.run(python, "-W", "ignore", "benchmarks/benchmark_sglang_cache_path.py", *args, external=True)
