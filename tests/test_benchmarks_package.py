"""benchmarks/ is a package run as ``python -m benchmarks.NAME``: no script edits
``sys.path``, every one imports as ``benchmarks.NAME``, and the helpers the scripts share
(``benchmarks/_common.py``) give known answers."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from benchmarks._common import REPO, module_command

SCRIPTS = sorted(p for p in (REPO / "benchmarks").glob("*.py") if p.name != "__init__.py")


def test_no_benchmark_edits_sys_path() -> None:
    edits = [p.name for p in SCRIPTS if "sys.path" in p.read_text(encoding="utf-8")]
    assert not edits, f"benchmarks that edit sys.path: {edits}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_imports_from_the_package(script: Path) -> None:
    module = importlib.import_module(f"benchmarks.{script.stem}")
    assert Path(module.__file__).resolve() == script.resolve()


def test_a_fresh_interpreter_runs_the_module() -> None:
    assert module_command(REPO / "benchmarks" / "gpu.py") == [sys.executable, "-m", "benchmarks.gpu"]


def test_each_run_of_a_batch_times_its_decision_from_its_own_start() -> None:
    """Two runs started together, each deciding 1 s after its start: both took about 1 s,
    although the second is read only once the first has decided."""
    from benchmarks.precision_under_load import run_batch

    line = "12:00:00 INFO simcse_kit.model.precision: precision: cpu: test -> fp32 (auto)"
    command = [sys.executable, "-c", f"import time; time.sleep(1.0); print({line!r}, flush=True)"]
    found = run_batch([command, command], dict(os.environ), full_step=False)
    assert [f["choice"] for f in found] == ["fp32", "fp32"]
    assert [f["facts"] for f in found] == ["cpu: test", "cpu: test"]
    assert all(0.9 <= f["seconds_to_decision"] < 30 for f in found), [f["seconds_to_decision"] for f in found]
