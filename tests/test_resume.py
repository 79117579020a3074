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

import datasets
import pytest
import torch
import yaml
from conftest import REPO, toy_sentences
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from simcse_kit.cli import main as cli_main
from simcse_kit.config import LossConfig, ModelConfig, TrainConfig, load_config, save_config
from simcse_kit.data import ContrastiveCollator
from simcse_kit.fastpath import use_fast_dropout
from simcse_kit.modeling import SimCSEModel
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.sts import DEFAULT_SUITE
from simcse_kit.trainer import LOOP_STATE, fit, latest_checkpoint

# --------------------------------------------------------------------------- helpers


def write_tiny_senteval(folder: Path, pairs: int = 12) -> Path:
    """A SentEval-layout folder with every file of the default suite, ``pairs`` toy
    pairs each: the real one takes minutes to encode 7 times per run on one core."""
    rng = random.Random(0)
    sents = toy_sentences(4 * pairs)

    def pair_rows() -> list[tuple[str, str, float]]:
        return [
            (sents[rng.randrange(len(sents))], sents[rng.randrange(len(sents))], round(rng.uniform(1, 5), 2))
            for _ in range(pairs)
        ]

    for spec in DEFAULT_SUITE.values():
        base = folder / spec.path
        if spec.format == "sts":
            base.mkdir(parents=True, exist_ok=True)
            for subset in spec.subsets:
                rows = pair_rows()
                (base / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows), encoding="utf-8")
                (base / f"STS.gs.{subset}.txt").write_text("".join(f"{s}\n" for _, _, s in rows), encoding="utf-8")
        elif spec.format == "stsb":
            base.mkdir(parents=True, exist_ok=True)
            for split in ("dev", "test"):
                lines = [f"main-news\tfile\t2012\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(pair_rows())]
                (base / f"sts-{split}.csv").write_text("".join(lines), encoding="utf-8")
        else:
            base.parent.mkdir(parents=True, exist_ok=True)
            lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"]
            lines += [f"{i}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(pair_rows())]
            base.write_text("".join(lines), encoding="utf-8")
    return folder


def write_recipe(folder: Path, model_dir: Path, out: Path, **train: object) -> Path:
    """A tiny unsup recipe: 64 sentences, batch 8, 3 epochs = 24 steps, eval every 3."""
    data = folder / "train.txt"
    if not data.exists():
        data.write_text("\n".join(toy_sentences(64)) + "\n", encoding="utf-8")
    senteval = folder / "senteval"
    if not senteval.exists():
        write_tiny_senteval(senteval)
    recipe = {
        "model": {"name_or_path": str(model_dir), "pooler": "cls", "mlp": "train", "max_seq_len": 16, "eval_max_seq_len": 32},
        "data": {"mode": "unsup", "train_file": str(data), "eval_data_dir": str(senteval)},
        "loss": {"temperature": 0.05},
        "train": {
            "output_dir": str(out),
            "batch_size": 8,
            "learning_rate": 1e-3,
            "num_epochs": 3,
            "eval_steps": 3,
            "save_steps": 2,
            "log_steps": 1,
            "seed": 7,
            "progress_bar": False,
        }
        | train,
    }
    path = folder / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


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


def test_sigkill_and_resume_equals_uninterrupted_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    ref_out, cut_out = tmp_path / "ref", tmp_path / "cut"
    ref_recipe = write_recipe(tmp_path, tiny_model_dir, ref_out)
    cut_recipe = write_recipe(tmp_path, tiny_model_dir, cut_out)

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


def test_resume_refuses_a_changed_config(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, tiny_model_dir, out)
    out.mkdir()
    save_config(load_config(recipe), out / "config.yaml")  # as a killed run leaves it
    rc = cli_main(["train", str(recipe), "--resume", "--learning-rate", "0.5", "--progress-bar", "true"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.learning_rate: 0.001 -> 0.5" in err and "progress_bar" not in err
    assert "--resume" in err and str(out / "config.yaml") in err


# --------------------------------------------------------------------------- the loop alone


class Crash(Exception):
    pass


def _fit_run(
    model_dir: Path, out: Path, *, resume: bool, crash_at_eval: int | None, grad_accum: int, fast: bool = False
) -> tuple[object, dict]:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(model_dir), pooler="cls", mlp="train"))
    if fast:  # the recipes' fast path: fast dropout, bf16 weights with fp32 masters
        use_fast_dropout(model)
    dataset = datasets.Dataset.from_dict({"sent0": toy_sentences(40)})
    loader = DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        drop_last=True,
        collate_fn=ContrastiveCollator(tokenizer, "unsup", 16),
        generator=torch.Generator().manual_seed(1),
    )
    cfg = TrainConfig(
        output_dir=str(out),
        batch_size=4,
        learning_rate=1e-3,
        num_epochs=3,
        progress_bar=False,
        eval_steps=2,
        save_steps=3,
        grad_accum=grad_accum,
        mixed_precision="bf16" if fast else "no",
        bf16_weights=fast,
    )
    calls: list[int] = []

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        calls.append(1)
        if len(calls) == crash_at_eval:
            raise Crash
        with torch.no_grad():  # a score that moves with the weights and is not monotone
            return {"score": float(torch.cos(sum(p.sum() for p in m.parameters())))}

    objective = SimCSEObjective("unsup", LossConfig())
    state = fit(model, objective.step, loader, cfg, evaluate=evaluate, checkpoint_dir=out / "ckpt", resume=resume)
    return state, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("grad_accum", "fast"), [(1, False), (2, False), (1, True)])
def test_fit_resume_is_exact(tmp_path: Path, tiny_model_dir: Path, grad_accum: int, fast: bool) -> None:
    """The loop restores weights, optimizer, schedule, RNG (dropout), the shuffled order
    and the position inside the epoch: a crash mid-epoch 1 and a resume end bit-equal.
    With bf16 weights the fp32 masters travel in the optimizer state."""
    ref_state, ref_weights = _fit_run(
        tiny_model_dir, tmp_path / "a", resume=False, crash_at_eval=None, grad_accum=grad_accum, fast=fast
    )
    with pytest.raises(Crash):
        _fit_run(tiny_model_dir, tmp_path / "b", resume=False, crash_at_eval=4, grad_accum=grad_accum, fast=fast)
    steps = sorted(p.name for p in (tmp_path / "b" / "ckpt").iterdir())
    assert steps == ["step-3", "step-6"]  # only the newest two are kept
    state, weights = _fit_run(tiny_model_dir, tmp_path / "b", resume=True, crash_at_eval=None, grad_accum=grad_accum, fast=fast)
    assert state.global_step == ref_state.global_step == 30 // grad_accum
    assert state.losses == ref_state.losses and state.evals == ref_state.evals
    assert (state.best_step, state.best_score, state.examples_seen) == (
        ref_state.best_step,
        ref_state.best_score,
        ref_state.examples_seen,
    )
    for key, value in ref_weights.items():
        assert torch.equal(value, weights[key]), key


def test_resume_without_checkpoint_starts_from_scratch(tmp_path: Path, tiny_model_dir: Path) -> None:
    ref, _ = _fit_run(tiny_model_dir, tmp_path / "a", resume=False, crash_at_eval=None, grad_accum=2)
    again, _ = _fit_run(tiny_model_dir, tmp_path / "b", resume=True, crash_at_eval=None, grad_accum=2)
    assert again.losses == ref.losses


def test_killed_save_leaves_only_ignored_temp_folders(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step-4").mkdir(parents=True)
    (ckpts / "step-4" / LOOP_STATE).write_text("{}")
    (ckpts / ".step-6.tmp").mkdir()  # killed mid-save
    (ckpts / ".step-2.deleting").mkdir()  # killed mid-prune
    (ckpts / "step-8").mkdir()  # no loop_state.json: never renamed into place whole
    assert latest_checkpoint(ckpts) == ckpts / "step-4"
    assert latest_checkpoint(tmp_path / "nothing") is None


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
def test_two_process_sigkill_and_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``torchrun`` with 2 gloo processes (DDP, cross-process negatives, per-process RNG
    files in the checkpoint): killed after its first checkpoint and resumed, it ends
    exactly as an uninterrupted 2-process run."""
    ref_out, cut_out = tmp_path / "ref", tmp_path / "cut"
    ref_recipe = write_recipe(tmp_path, tiny_model_dir, ref_out, max_steps=12)
    cut_recipe = write_recipe(tmp_path, tiny_model_dir, cut_out, max_steps=12)
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
