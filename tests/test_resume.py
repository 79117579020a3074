"""Checkpoint and resume: a run killed with SIGKILL and resumed ends exactly as an
uninterrupted one (CPU, fixed seed), and no kill leaves a half-written checkpoint or
model where a resume or a user would pick it up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, TinyRun
from safetensors.torch import load_file

from simcse_kit.cli import main as cli_main
from simcse_kit.config.run import load_config, save_config
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.checkpoints import LOOP_STATE, latest_checkpoint

# --------------------------------------------------------------------------- helpers


def train_cmd(recipe: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "simcse_kit.cli", "train", str(recipe), *extra]


ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}

# Timing figures in metrics.json differ between any two runs; everything else must not.
TIMING = ("train_seconds", "examples_per_second", "sentences_per_second")


def run_metrics(out: Path) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: v for k, v in metrics.items() if k not in TIMING}


def assert_nothing_half_written(out: Path) -> None:
    """What a resume or a user would pick up is whole: every ``step-N`` checkpoint and
    the best model (temp folders are hidden, and ignored by ``latest_checkpoint``)."""
    for ckpt in (out / "checkpoints").glob("step-*"):
        assert (ckpt / LOOP_STATE).is_file(), f"incomplete checkpoint {ckpt}"
        assert (ckpt / "model.safetensors").is_file(), f"checkpoint without weights {ckpt}"
    best = out / "best_model"
    if best.exists():
        SimCSEModel.load(best)  # loads: config, weights and head all there
    if (out / "config.yaml").exists():
        yaml.safe_load((out / "config.yaml").read_text())


def kill_when(proc: subprocess.Popen, ready: callable, delay: float = 0.0, timeout: float = 120.0) -> None:
    """SIGKILL ``proc`` ``delay`` seconds after ``ready()`` holds; fail if it ends first."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"training ended (rc {proc.returncode}) before it could be killed; see the log"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(delay)
    assert proc.poll() is None, "training ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def newest_step(out: Path) -> int:
    ckpt = latest_checkpoint(out / "checkpoints")
    return int(ckpt.name.split("-")[1]) if ckpt is not None else 0


# --------------------------------------------------------------------------- the real kill


@pytest.mark.slow  # four training subprocesses: the reference, two SIGKILLed, the resume to the end (~30 s CPU)
def test_sigkill_and_resume_equals_uninterrupted_run(tmp_path: Path, tiny_run: TinyRun) -> None:
    ref_out, cut_out = tmp_path / "ref", tmp_path / "cut"
    ref_recipe, cut_recipe = tiny_run.recipe("ref"), tiny_run.recipe("cut")

    # The uninterrupted reference runs in a subprocess like the killed ones: in-process, state
    # left by earlier tests (Accelerate, autocast) changed the last bits of the losses.
    ref = subprocess.run(train_cmd(ref_recipe), env=ENV, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]

    # The killed runs log to a file (a full, unread pipe would stall them).
    log = (tmp_path / "killed.log").open("w")
    # Kill 1: right after the first checkpoint is in place.
    proc = subprocess.Popen(train_cmd(cut_recipe), env=ENV, stdout=subprocess.DEVNULL, stderr=log)
    kill_when(proc, lambda: newest_step(cut_out) >= 2)
    assert not (cut_out / "metrics.json").exists()
    assert_nothing_half_written(cut_out)
    first = newest_step(cut_out)

    # Without --resume the unfinished run is not silently restarted over.
    rc = cli_main(["train", str(cut_recipe)])
    assert rc == 2

    # Kill 2: the resumed run, at an arbitrary moment after it passed the next checkpoint
    # (mid-step, mid-eval, mid-save: wherever the delay lands).
    proc = subprocess.Popen(train_cmd(cut_recipe, "--resume"), env=ENV, stdout=subprocess.DEVNULL, stderr=log)
    kill_when(proc, lambda: newest_step(cut_out) > first, delay=random.Random(os.getpid()).uniform(0.0, 0.1))
    assert not (cut_out / "metrics.json").exists()
    assert_nothing_half_written(cut_out)

    # Resume to the end.
    log.close()
    done = subprocess.run(train_cmd(cut_recipe, "--resume"), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stderr

    assert run_metrics(cut_out) == run_metrics(ref_out)
    want = load_file(str(ref_out / "best_model" / "model.safetensors"))
    got = load_file(str(cut_out / "best_model" / "model.safetensors"))
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert json.loads((cut_out / "best_model" / "simcse_config.json").read_text())["step"] == run_metrics(ref_out)["best_step"]
    assert_nothing_half_written(cut_out)

    # A finished run is not resumed again.
    assert cli_main(["train", str(cut_recipe), "--resume"]) == 2


def test_resume_refuses_a_changed_config(tmp_path: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    recipe = tiny_run.recipe("run")
    out.mkdir()
    save_config(load_config(recipe), out / "config.yaml")  # as a killed run leaves it
    rc = cli_main(["train", str(recipe), "--resume", "--learning-rate", "0.5", "--progress-bar", "true"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.learning_rate: 0.001 -> 0.5" in err and "progress_bar" not in err
    assert "--resume" in err and str(out / "config.yaml") in err


# --------------------------------------------------------------------------- two processes


def torchrun_cmd(recipe: Path, *extra: str) -> list[str]:
    # --standalone: a free rendezvous port, so parallel test runs do not collide.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "simcse_kit.cli",
        "train",
        str(recipe),
        *extra,
    ]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every worker it started (workers get their own session)."""
    import psutil

    tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    for p in tree:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    proc.wait()


@pytest.mark.slow
def test_two_process_sigkill_and_resume(tmp_path: Path, tiny_run: TinyRun) -> None:
    """``torchrun`` with 2 gloo processes (DDP, cross-process negatives, per-process RNG
    files in the checkpoint): killed after its first checkpoint and resumed, it ends
    exactly as an uninterrupted 2-process run."""
    ref_out, cut_out = tmp_path / "ref", tmp_path / "cut"
    ref_recipe, cut_recipe = tiny_run.recipe("ref", max_steps=12), tiny_run.recipe("cut", max_steps=12)
    done = subprocess.run(torchrun_cmd(ref_recipe), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    with (tmp_path / "killed.log").open("w") as log:
        proc = subprocess.Popen(torchrun_cmd(cut_recipe), env=ENV, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 120
        while newest_step(cut_out) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
            time.sleep(0.005)
        kill_tree(proc)
    assert not (cut_out / "metrics.json").exists()
    assert_nothing_half_written(cut_out)
    assert sorted(p.name for p in latest_checkpoint(cut_out / "checkpoints").glob("random_states_*.pkl")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]

    done = subprocess.run(torchrun_cmd(cut_recipe, "--resume"), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stderr
    assert run_metrics(cut_out) == run_metrics(ref_out)
    want = load_file(str(ref_out / "best_model" / "model.safetensors"))
    got = load_file(str(cut_out / "best_model" / "model.safetensors"))
    assert all(torch.equal(want[k], got[k]) for k in want)
