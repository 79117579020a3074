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


@pytest.mark.parametrize("full_step", [False, True])
def test_each_run_of_a_batch_times_its_decision_from_its_own_start(full_step: bool) -> None:
    """Two runs started together, the first deciding 2 s after its start, the second 0.3 s
    after its own: each records its own time, not the time the reader reached it."""
    from benchmarks.precision_under_load import run_batch

    line = "12:00:00 INFO simcse_kit.model.precision: precision: cpu: test -> fp32 (auto)"
    slow, fast = ([sys.executable, "-c", f"import time; time.sleep({s}); print({line!r}, flush=True)"] for s in (2.0, 0.3))
    found = run_batch([slow, fast], dict(os.environ), full_step=full_step)
    assert [(f["choice"], f["facts"], f["returncode"] == 0 or not full_step) for f in found] == [("fp32", "cpu: test", True)] * 2
    seconds = [f["seconds_to_decision"] for f in found]
    assert 1.9 <= seconds[0] < 30 and 0.25 <= seconds[1] < 1.5, seconds
