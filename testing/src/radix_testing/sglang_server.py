"""Test-only: SGLang 0.5.23's real HTTP server on this CPU, serving one at a time, and what its log says.

A server is ``python server_site/launch_sglang.py`` with a dummy-weight tiny Llama (the same
weights on every start, so two servers' greedy outputs compare token for token); that directory's
sitecustomize loads the CPU shims in every server process (see sglang_server_shims there). Used by
the end-to-end tests and benchmark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import pkgutil
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

SITE = Path(__file__).resolve().parent / "server_site"
VOCAB = 32000
READY = "The server is fired up and ready to roll!"
START_TIMEOUT_S = 180
# A tiny float32 Llama: a CPU forward costs little, the cache sees real token ids and pages.
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
EAGLE_DRAFT_CONFIG = {**TARGET_CONFIG, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
# The same size with every layer sliding-window attention (a window of 16 tokens): a Mellum, whose
# attention applies the window on the CPU. SGLang serves it on its one-tier SWA pool ("pure SWA").
PURE_SWA_CONFIG = {
    **{key: value for key, value in TARGET_CONFIG.items() if key != "rope_theta"},
    "architectures": ["MellumForCausalLM"],
    "model_type": "mellum",
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "sliding_attention"],
    "mlp_layer_types": ["dense", "dense"],
    "attention_bias": False,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "rope_parameters": {
        kind: {"rope_type": "default", "rope_theta": 10000.0} for kind in ("full_attention", "sliding_attention")
    },
}
# The same with one full-attention layer beside the sliding-window one: a hybrid model, cached in
# two pools (full and SWA). Its attention must read SWA layers through the full-to-SWA index map,
# which SGLang's intel_amx backend does (torch_native reads them at full-pool indices).
HYBRID_SWA_CONFIG = {**PURE_SWA_CONFIG, "layer_types": ["sliding_attention", "full_attention"]}
MODELS = {
    "llama": TARGET_CONFIG,
    "eagle-draft": EAGLE_DRAFT_CONFIG,
    "pure-swa": PURE_SWA_CONFIG,
    "hybrid-swa": HYBRID_SWA_CONFIG,
}
# SGLang's model modules that define those architectures.
TEST_MODEL_MODULES = ("llama", "llama_eagle", "mellum")


@functools.cache
def unused_model_modules() -> str:
    """SGLang's other model modules, comma-separated for SGLANG_DISABLED_MODEL_ARCHS: its model
    registry otherwise imports all of them (over 250) in every server's scheduler."""
    spec = importlib.util.find_spec("sglang.srt.models")
    modules = pkgutil.iter_modules(spec.submodule_search_locations)
    return ",".join(sorted(name for _, name, package in modules if not package and name not in TEST_MODEL_MODULES))


def write_models(directory: Path) -> dict[str, Path]:
    """The directories (a config.json each) of the test models (MODELS), by name, under ``directory``."""
    paths = {}
    for name, config in MODELS.items():
        path = paths[name] = directory / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1))
    return paths


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """One server: which cache serves (``none`` = --disable-radix-cache, ``default`` = SGLang's own,
    ``radix-native`` / ``radix-python`` = --radix-cache-backend radix on that radix-core backend)."""

    cache: str
    model: str = "llama"  # or "pure-swa" (page 1, as SGLang's pure-SWA allocator takes), "hybrid-swa" (MODELS)
    page_size: int = 1
    max_total_tokens: int = 8192
    chunked_prefill_size: int | None = None
    max_running_requests: int = 8
    speculative: str | None = None  # None, "EAGLE" or "STANDALONE"
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    tree: str | None = None  # a radix server's RADIX_CORE_TREE (None: unset, radix-core's default)
    # How SGLang starts its scheduler and detokenizer: by fork (the launcher's --fork, a quicker
    # start), or by spawn as SGLang itself does (each process imports SGLang and the adapter anew).
    spawn: bool = False

    @property
    def name(self) -> str:
        spec = f"-{self.speculative.lower()}" if self.speculative else ""
        hicache = ""
        if "--enable-hierarchical-cache" in self.flags:
            policy = self.flags[self.flags.index("--hicache-write-policy") + 1]
            layout = self.flags[self.flags.index("--hicache-mem-layout") + 1]
            hicache = f"-hicache-{policy}-{layout}"
        tree = f"-{self.tree}tree" if self.tree is not None else ""
        spawned = "-spawned" if self.spawn else ""
        model = "" if self.model == "llama" else f"-{self.model}"
        return f"{self.cache}{tree}{model}-page{self.page_size}{spec}{hicache}{spawned}"

    def arguments(self, models: dict[str, Path], port: int) -> list[str]:
        """The launcher's arguments. intel_amx is the CPU attention backend with an EAGLE draft
        backend and the one that reads a hybrid model's SWA layers through their own pool, kept by
        ``--fake-amx`` (see sglang_server_shims); plain serving uses torch_native."""
        amx = bool(self.speculative) or self.model == "hybrid-swa"
        arguments = ["--fake-amx"] if amx else []
        arguments += [] if self.spawn else ["--fork"]
        arguments += [
            *["--model-path", str(models[self.model])],
            *["--load-format", "dummy", "--device", "cpu"],
            *["--skip-tokenizer-init", "--sampling-backend", "pytorch", "--dtype", "float32"],
            *["--grammar-backend", "none", "--host", "127.0.0.1", "--port", str(port)],
            *["--attention-backend", "intel_amx" if amx else "torch_native"],
            *["--max-total-tokens", str(self.max_total_tokens), "--page-size", str(self.page_size)],
            *["--max-running-requests", str(self.max_running_requests)],
            *["--random-seed", "0", "--sleep-on-idle", "--disable-cuda-graph"],
        ]
        if self.chunked_prefill_size is not None:
            arguments += ["--chunked-prefill-size", str(self.chunked_prefill_size)]
        if self.cache == "none":
            arguments.append("--disable-radix-cache")
        elif self.cache.startswith("radix-"):
            arguments += ["--radix-cache-backend", "radix"]
        if self.speculative:
            draft_model = models["eagle-draft" if self.speculative == "EAGLE" else self.model]  # STANDALONE: its own
            arguments += ["--speculative-algorithm", self.speculative]
            arguments += [
                "--speculative-draft-model-path",
                str(draft_model),
                "--speculative-draft-load-format",
                "dummy",
            ]
            arguments += ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1"]
            arguments += ["--speculative-num-draft-tokens", "3"]
        return arguments + list(self.flags)

    def environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "SGLANG_USE_CPU_ENGINE": "1",  # SGLang's is_cpu() is False without it
            "OMP_NUM_THREADS": "1",  # two servers' worth of threads on two cores make timings swing
            # The model's torch.compile'd functions run eagerly: compiling them (a C++ build per
            # server) made a server's first request take 10-20 s on this CPU; the same on every server.
            "TORCH_COMPILE_DISABLE": "1",
            "SGLANG_DISABLED_MODEL_ARCHS": unused_model_modules(),
            "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",  # a KV leak at idle is an error
            **dict(self.env),
        }
        if self.model != "llama":  # outputs that depend on the whole window (sglang_server_shims)
            env["RADIX_TEST_DUMMY_WEIGHT_RANGE"] = "0.3"
        env.pop("RADIX_CORE_TREE", None)
        if self.cache.startswith("radix-"):
            env["RADIX_CORE_BACKEND"] = self.cache.removeprefix("radix-")
            if self.tree is not None:
                env["RADIX_CORE_TREE"] = self.tree
        return env

    @property
    def radix_core_tree(self) -> str:
        """The tree a radix server's cache must run on: radix-native's unless told otherwise, which
        only the native backend has (a hybrid model's windowed tree has a Python store only)."""
        python = self.cache == "radix-python" or self.tree == "python" or self.model == "hybrid-swa"
        return "python" if python else "native"


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message ends with its log's last lines."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A running server: ``with Server(config, models, log) as server: server.generate(...)``."""

    def __init__(self, config: ServerConfig, models: dict[str, Path], log: Path):
        self.config = config
        self.models = models
        self.log = log
        self.port = 0
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        """Launches the server without waiting for it: a caller that knows which server comes next
        starts it while the current one serves (start-up is mostly imports, on the core a request
        stream leaves idle, and a stop mostly waits). ``with`` starts it if not started yet."""
        if self.process is not None:
            return self
        self.log.unlink(missing_ok=True)  # never read a previous run's "fired up"
        self.port = free_port()
        command = [sys.executable, str(SITE / "launch_sglang.py"), *self.config.arguments(self.models, self.port)]
        env = self.config.environment()
        with self.log.open("wb") as out:
            # A group of its own: the kill of last resort in stop() must not reach this process.
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def __enter__(self) -> Server:
        self.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in self.log_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerFailed(f"{self.config.name} did not start:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to the launcher only: a signal to its whole group reads as a scheduler crash.
        Then whatever of its group is left is killed: a launcher stopped while it was starting
        (before SGLang's handlers were in) leaves its children behind."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its group: start_new_session
        self.process.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def post(self, path: str, payload: dict | None = None, timeout: float = 300) -> dict:
        data = json.dumps(payload or {}).encode()
        request = urllib.request.Request(self.url(path), data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except OSError as exc:  # HTTP errors and dropped connections (a crashed scheduler)
            raise ServerFailed(f"{self.config.name}: POST {path} failed ({exc}):\n{self.log_tail()}") from exc
        return json.loads(body) if body.strip().startswith((b"{", b"[")) else {"text": body.decode()}

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def metric(self, name: str) -> float:
        """A Prometheus counter's total over its labels (the server needs ``--enable-metrics``)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=60) as response:
            lines = response.read().decode().splitlines()
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))

    def generate(self, input_ids: list[int], max_new_tokens: int) -> Completion:
        answer = self.post("/generate", request_body(input_ids, max_new_tokens))
        return Completion(tuple(answer["output_ids"]), answer["meta_info"]["cached_tokens"])

    def stream(self, input_ids: list[int], max_new_tokens: int, timeout: float = 600):
        """A streaming /generate, opened: its response yields ``data: {...}`` lines, chunk by chunk."""
        body = json.dumps({**request_body(input_ids, max_new_tokens), "stream": True}).encode()
        request = urllib.request.Request(self.url("/generate"), data=body, headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(request, timeout=timeout)

    def generate_and_disconnect(self, input_ids: list[int], max_new_tokens: int) -> None:
        """A streaming request the client drops after its first token: the server aborts it
        (SGLang does so 2 s after the disconnect, if the request is still running)."""
        with self.stream(input_ids, max_new_tokens) as response:
            response.readline()


# How many servers start while one serves: a start is mostly one process's imports, on one core,
# and a test server (forked scheduler) starts in about as long as two serve.
STARTED_AHEAD = 2


class Lineup:
    """Servers used one at a time in a known order: ``with Lineup(servers) as lineup: for server in
    lineup: ...`` gives each one ready and stops it after its turn; once one is ready the next
    STARTED_AHEAD start. On the way out every server is stopped, started ahead or not."""

    def __init__(self, servers: list[Server]):
        self.servers = servers

    def __enter__(self) -> Lineup:
        return self

    def __exit__(self, *exc_info) -> None:
        for server in self.servers:
            server.stop()

    def __iter__(self) -> Iterator[Server]:
        for turn, server in enumerate(self.servers):
            with server:
                for upcoming in self.servers[turn + 1 : turn + 1 + STARTED_AHEAD]:
                    upcoming.start()  # a no-op for one started already
                yield server


@dataclasses.dataclass(frozen=True)
class Completion:
    output_ids: tuple[int, ...]
    cached_tokens: int


def request_body(input_ids: list[int], max_new_tokens: int) -> dict:
    """Greedy, a fixed length (no stop token), so two servers' outputs compare token for token."""
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    return {"input_ids": list(input_ids), "sampling_params": sampling}


# ----- What a server's log says -------------------------------------------------------------------

CACHE_LINE = re.compile(r"Tree cache initialized: source=(\S+) impl=(\w+)")
RADIX_CORE_LINE = re.compile(r"runs on radix-core (\w+)")
RADIX_TREE_LINE = re.compile(r"runs on radix-core .*, tree=(\w+)")
TREE_CORE_LINE = re.compile(r"Init Unified Radix Cache\..* Tree Core: (\w+)")
# SGLang's log names no level: lines like these mean something went wrong, unless known benign.
PROBLEM = re.compile(r"Traceback|Error|Exception|memory leak detected|double free|use-after-free")
BENIGN_ON_THIS_CPU = (
    "Ignore import error when loading sglang.srt.models.",  # models needing kernels a Llama does not
    "OpenAI Responses API (/v1/responses) disabled",  # openai_harmony is not installed
)


def cache_impl(log: str) -> str | None:
    """The class SGLang built as its tree cache, from its "Tree cache initialized" line."""
    found = CACHE_LINE.search(log)
    return found.group(2) if found else None


def radix_core_backend(log: str) -> str | None:
    """The radix-core backend ("native" or "python") the adapter's backend reported at build."""
    found = RADIX_CORE_LINE.search(log)
    return found.group(1) if found else None


def radix_core_tree(log: str) -> str | None:
    """The tree ("python" or "native") the adapter's backend reported its RadixCache on."""
    found = RADIX_TREE_LINE.search(log)
    return found.group(1) if found else None


def tree_core(log: str) -> str | None:
    """The TreeCore class under SGLang's UnifiedRadixCache, from its init line."""
    found = TREE_CORE_LINE.search(log)
    return found.group(1) if found else None


def log_problems(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if PROBLEM.search(line) and not any(benign in line for benign in BENIGN_ON_THIS_CPU)
    ]
