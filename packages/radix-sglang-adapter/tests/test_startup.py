"""Automatic activation reaches a spawned SGLang child, and the doctor tells what it sees."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

import radix_sglang_adapter as adapter
from radix_testing import sglang_harness as sg
from radix_testing.spawn_targets import report_patching_in_sglang_child


def run_in_spawned_child(monkeypatch, load_plugins: bool, **env: str) -> dict:
    """Start a child the way SGLang starts its scheduler (spawn), with `env` in its environment."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(report_patching_in_sglang_child, (load_plugins,))


@pytest.mark.skipif(not sg.CALLS_CONVERT, reason="the startup hook is the way in for SGLang without plugins")
def test_startup_hook_patches_a_spawned_child_that_never_calls_activate(monkeypatch):
    child = run_in_spawned_child(monkeypatch, load_plugins=False, **{adapter.AUTO_ENV: "1"})
    assert child["state"] == "active"
    assert child["activated_by"] == "startup hook (RADIX_SGLANG_ADAPTER=1)"
    assert child["radix_cache_bound"], "radix_cache bound the replacement at import"


@pytest.mark.skipif(not sg.CALLS_CONVERT, reason="only SGLang with the function can be patched")
def test_without_the_opt_in_a_spawned_child_stays_untouched(monkeypatch):
    monkeypatch.delenv(adapter.AUTO_ENV, raising=False)
    child = run_in_spawned_child(monkeypatch, load_plugins=False)
    assert child["state"] == "inactive" and not child["radix_cache_bound"]


@pytest.mark.skipif(sg.CALLS_CONVERT, reason="SGLang 0.5.10 has no plugin system")
def test_sglang_plugin_activates_a_spawned_child_that_never_calls_activate(monkeypatch):
    monkeypatch.delenv(adapter.AUTO_ENV, raising=False)
    child = run_in_spawned_child(monkeypatch, load_plugins=True)
    assert child["state"] == "active" and child["activated_by"] == "SGLang plugin"


def test_kill_switch_wins_over_automatic_activation(monkeypatch):
    child = run_in_spawned_child(
        monkeypatch, load_plugins=not sg.CALLS_CONVERT, **{adapter.AUTO_ENV: "1", adapter.DISABLE_ENV: "1"}
    )
    assert child["state"] == "disabled" and not child["radix_cache_bound"]


def run_doctor(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -m radix_sglang_adapter doctor` in a fresh interpreter (shim loaded by sitecustomize)."""
    (tmp_path / "sitecustomize.py").write_text("from radix_testing import sglang_cpu_shim\nsglang_cpu_shim.install()\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    child_env = {name: value for name, value in os.environ.items() if name != adapter.DISABLE_ENV}
    child_env.update(PYTHONPATH=path, **env)
    command = [sys.executable, "-W", "ignore", "-m", "radix_sglang_adapter", "doctor"]
    return subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=300)


def test_doctor_reports_every_patch_point(tmp_path):
    result = run_doctor(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert f"SGLang: {sg.SGLANG_VERSION}" in result.stdout
    if sg.CALLS_CONVERT:
        for module in ("utils", "radix_cache", "swa_radix_cache", "hiradix_cache"):
            assert f"patched  sglang.srt.mem_cache.{module}.convert_to_bigram_key" in result.stdout
    else:
        assert "not in this release  sglang.srt.mem_cache.utils.convert_to_bigram_key" in result.stdout


def test_doctor_with_the_kill_switch_says_so(tmp_path):
    result = run_doctor(tmp_path, **{adapter.DISABLE_ENV: "1"})
    assert result.returncode == 0 and "disabled" in result.stdout


def test_doctor_fails_on_an_unusable_setting(tmp_path):
    result = run_doctor(tmp_path, **{adapter.DISABLE_ENV: "maybe"})
    assert result.returncode == 2 and "not a boolean" in result.stdout


@pytest.mark.skipif(not sg.CALLS_CONVERT, reason="the startup hook is the way in for SGLang without plugins")
def test_an_unknown_opt_in_value_leaves_the_child_untouched(monkeypatch):
    child = run_in_spawned_child(monkeypatch, load_plugins=False, **{adapter.AUTO_ENV: "perhaps"})
    assert child["state"] == "inactive" and not child["radix_cache_bound"]
