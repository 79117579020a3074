"""Several processes train exactly as one: ``simcse-kit train`` under ``torchrun``.

A run on 2 gloo processes (and on 2 "machines" of one process each, rendezvous on
127.0.0.1) against one process with the same global batch, dropout 0: the same learning
rate at every step (TensorBoard's ``train/learning_rate``), the same loss at every step
(metrics.json's ``losses``, the mean over processes) and the same final weights
(``best_model``, saved at the last step), to fp32 tolerance. Each launch turns on as many
of the options as compose: ``--max-steps``, gradient accumulation, GradCache, the
momentum queue, false-negative masking, warm-up.

The sharded loader, Accelerate's gradient averaging, GradCache's ``no_sync``, the queue's
gather and the schedule are what is checked here against one process; the objective's
own gather is checked at the loss level in tests/test_distributed.py.

The same comparison runs at every precision ``auto`` can pick on a CPU (fp32, bf16
autocast, bf16 weights with fp32 masters; forced, so any CPU runs them) with the step-0
and periodic evaluations and checkpoints on; and a rank killed mid-run must end every
launcher, failed, within a bound, its rank named.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import REPO, TinyRun, write_train_data
from safetensors.torch import load_file

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

pytestmark = pytest.mark.slow  # every test launches torchrun: 3 to 5 fresh interpreters each

ENV_EXTRA = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
TOL = 1e-5  # fp32: the same sums, only grouped differently across processes

# mode -> the options one launch combines (config keys as on the command line). Every
# launch: 32 examples, global batch 8, --max-steps below the epoch's steps where the
# epoch is longer, warm-up over the first step(s), tensorboard for the learning rate.
CASES = {
    # 32 sentences / 8 = 4 micro-batches an epoch, 2 per step; 2 epochs capped at 3 steps.
    "unsup": {"grad_accum": 2, "num_epochs": 2, "max_steps": 3, "queue_size": 12, "momentum": 0.5,
              "mask_false_negatives": "true"},
    # GradCache in chunks of 2 rows (1 example) inside each process's 4 examples.
    "sup": {"grad_accum": 2, "num_epochs": 2, "max_steps": 3, "grad_cache_chunk": 2, "mask_false_negatives": "true"},
    "hardneg": {"num_epochs": 1, "max_steps": 3, "queue_size": 8, "momentum": 0.9, "mask_false_negatives": "true",
                "hard_negative_weight": 2.0},
}  # fmt: skip


def overrides(runs: TinyRun, mode: str, name: str) -> dict[str, object]:
    """The run's config keys: ``CASES[mode]`` plus what makes it comparable and cheap."""
    train_file = runs.folder / mode
    train_file.mkdir(exist_ok=True)
    return {
        "mode": mode,
        "train_file": write_train_data(train_file, mode, n=32),
        "output_dir": runs.folder / name,
        "dropout": 0.0,  # the same network on every process and in the reference
        "pooler": "avg",
        "batch_size": 8,
        "learning_rate": 1e-3,
        "warmup_ratio": 0.34,  # one warm-up step of three
        "eval_steps": 0,  # only at the end: best_model holds the final weights
        "eval_at_start": "false",
        "save_steps": 0,
        "final_eval": "false",
        "log_steps": 1,
        "report_to": "tensorboard",
        **CASES[mode],
    }


def cli_args(options: dict[str, object]) -> list[str]:
    return [token for key, value in options.items() for token in (f"--{key}", str(value))]


def torchrun(nnodes: int, nproc: int, recipe: Path, options: dict[str, object]) -> list[list[str]]:
    """The command of each "machine": ``nnodes`` torchrun agents of ``nproc`` processes,
    meeting through a c10d rendezvous on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc)]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "simcse-test"]
    train = ["-m", "simcse_kit.cli", "train", str(recipe), *cli_args(options)]
    return [[*launcher, *rendezvous, *train] for _ in range(nnodes)]


def launch(commands: list[list[str]], processes: int, timeout: float = 300) -> None:
    """Run the commands side by side (the "machines"); fail with the first one's log,
    or unless the run says it trained on ``processes`` processes."""
    env = os.environ | ENV_EXTRA
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    # Two agents that failed to meet would each train alone, and like the reference.
    assert f"optimiser steps on {processes} process(es)" in "".join(outputs), outputs[0][-4000:]


def results(out: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]], dict[str, torch.Tensor]]:
    """``(learning rate per step, loss per step, final weights)`` of a finished run."""
    events = event_accumulator.EventAccumulator(str(out / "logs" / "simcse-kit"))
    events.Reload()
    lrs = [(e.step, e.value) for e in events.Scalars("train/learning_rate")]
    losses = [tuple(x) for x in json.loads((out / "metrics.json").read_text())["losses"]]
    weights = load_file(str(out / "best_model" / "model.safetensors"))
    head = out / "best_model" / "simcse_head.safetensors"
    if head.exists():
        weights |= {f"head.{k}": v for k, v in load_file(str(head)).items()}
    return lrs, losses, weights


def assert_same_training(got: Path, want: Path, steps: int, base_model: Path) -> None:
    got_lr, got_loss, got_w = results(got)
    want_lr, want_loss, want_w = results(want)
    assert [s for s, _ in want_lr] == list(range(1, steps + 1))
    # The learning rate of every step (a schedule stepped once per process ran out at
    # step steps / processes and trained the rest at 0).
    assert [s for s, _ in got_lr] == [s for s, _ in want_lr]
    for (step, lr), (_, ref) in zip(got_lr, want_lr, strict=True):
        assert lr == pytest.approx(ref, rel=1e-6, abs=1e-12), f"learning rate at step {step}: {lr} != {ref}"
    assert [s for s, _ in got_loss] == [s for s, _ in want_loss]
    for (step, loss), (_, ref) in zip(got_loss, want_loss, strict=True):
        assert abs(loss - ref) < TOL * max(1.0, abs(ref)), f"loss at step {step}: {loss} != {ref}"
    assert got_w.keys() == want_w.keys()
    for key, ref in want_w.items():
        assert torch.allclose(got_w[key], ref, atol=TOL, rtol=0), (key, (got_w[key] - ref).abs().max())
    base = load_file(str(base_model / "model.safetensors"))
    assert any(not torch.equal(base[k], want_w[k]) for k in base), "no weight moved: the comparison would prove nothing"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> TinyRun:
    """One folder for the module's runs, so a one-process reference is trained once."""
    return TinyRun(tmp_path_factory.mktemp("multiprocess"), tiny_model_dir)


def reference(runs: TinyRun, mode: str) -> Path:
    """The one-process run of ``mode``, in a subprocess like the launches (same
    environment), trained once per module."""
    options = overrides(runs, mode, f"{mode}-1proc")
    out = Path(options["output_dir"])
    if not (out / "metrics.json").exists():
        launch([[sys.executable, "-m", "simcse_kit.cli", "train", str(runs.recipe(f"{mode}-recipe")), *cli_args(options)]], 1)
    return out


@pytest.mark.parametrize("mode", list(CASES))
def test_two_processes_train_as_one(runs: TinyRun, mode: str) -> None:
    want = reference(runs, mode)
    options = overrides(runs, mode, f"{mode}-2proc")
    launch(torchrun(1, 2, runs.recipe(f"{mode}-recipe"), options), 2)
    assert_same_training(Path(options["output_dir"]), want, CASES[mode]["max_steps"], runs.model_dir)


def test_two_machines_train_as_one(runs: TinyRun) -> None:
    """``torchrun --nnodes 2 --nproc_per_node 1`` twice, as two machines would run it."""
    want = reference(runs, "unsup")
    options = overrides(runs, "unsup", "unsup-2nodes")
    launch(torchrun(2, 1, runs.recipe("unsup-recipe"), options), 2)
    assert_same_training(Path(options["output_dir"]), want, CASES["unsup"]["max_steps"], runs.model_dir)


# --------------------------------------------------------------------------- every precision


# precision -> the options that force it on any CPU (``auto`` picks by the machine: bf16
# weights on one with native bf16, fp32 on one without). fp16 with loss scaling exists only
# on CUDA: Accelerate on the CPU takes "fp16" as fp32 without a scaler (no autocast, no
# GradScaler), so a CPU launch would only repeat the fp32 row; see docs/distributed.md.
PRECISIONS = {
    "fp32": {"mixed_precision": "no"},
    "bf16-autocast": {"mixed_precision": "bf16", "bf16_weights": "false", "fast_dropout": "false"},
    # What auto picks on a CPU with native bf16: bf16 weights, fp32 masters, fast dropout.
    "bf16-weights": {"mixed_precision": "bf16", "bf16_weights": "true", "fast_dropout": "true"},
}
PRECISION_STEPS = 4
# bf16: the two processes' gradients are summed in bf16 (DDP reduces the model's own
# dtype), one process sums over the whole batch in one matmul. Measured on the tiny
# model, native and AVX2-emulated bf16: losses within 4e-4 (autocast) and 1.7e-3 (bf16
# weights) of the reference, step-2 weights within 3e-3 (one bf16 rounding). The learning
# rate is compared exactly, as in fp32.
PRECISION_TOL = {"fp32": TOL, "bf16-autocast": 2e-2, "bf16-weights": 2e-2}


def precision_overrides(runs: TinyRun, precision: str, name: str) -> dict[str, object]:
    """An unsup run at ``precision`` with everything a real run has on: the step-0
    evaluation, an evaluation and a checkpoint every 2 steps, the divergence guard (always
    on), over 4 steps (no warm-up: every step moves the weights). The tiny SentEval of the recipe is the dev set."""
    options = overrides(runs, "unsup", name)
    options.update({
        "grad_accum": 1, "num_epochs": 1, "max_steps": PRECISION_STEPS, "warmup_ratio": 0.0,
        "eval_at_start": "true", "eval_steps": 2, "save_steps": 2, **PRECISIONS[precision],
    })  # fmt: skip
    for key in ("queue_size", "momentum"):  # the queue is covered above; this is about precision
        options.pop(key)
    return options


def evaluations(out: Path) -> list[tuple[int, float]]:
    return [(int(e["step"]), float(e["stsb_dev"])) for e in json.loads((out / "metrics.json").read_text())["evals"]]


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_two_processes_train_as_one_at_every_precision(runs: TinyRun, precision: str) -> None:
    """2 processes against 1 at each precision ``auto`` can pick on a CPU, with step-0 and
    periodic evaluations and checkpoints on: the same learning rate and (to the precision's
    tolerance) the same loss at every step, the same evaluations at the same steps, a
    checkpoint at step 2 holding the same weights.

    Before the fix, bf16 weights died at the first step after the step-0 evaluation: saving
    the best model cast the live parameters to fp32 and back on the main process, which gave
    them new gradient accumulators; DDP's hooks sat on the old ones, so the main process's
    backward sent no gradient while the other waited in DDP's all-reduce (gloo: "Received data
    size doesn't match expected size").
    """
    recipe = runs.recipe("unsup-recipe")
    options = precision_overrides(runs, precision, f"{precision}-1proc")
    want = Path(options["output_dir"])
    launch([[sys.executable, "-m", "simcse_kit.cli", "train", str(recipe), *cli_args(options)]], 1)
    options = precision_overrides(runs, precision, f"{precision}-2proc")
    got = Path(options["output_dir"])
    launch(torchrun(1, 2, recipe, options), 2)

    got_lr, got_loss, _ = results(got)
    want_lr, want_loss, _ = results(want)
    assert [s for s, _ in want_lr] == list(range(1, PRECISION_STEPS + 1))
    assert [s for s, _ in got_lr] == [s for s, _ in want_lr]
    assert [lr for _, lr in got_lr] == pytest.approx([lr for _, lr in want_lr], rel=1e-6, abs=1e-12)
    tol = PRECISION_TOL[precision]
    assert [s for s, _ in got_loss] == [s for s, _ in want_loss] == list(range(1, PRECISION_STEPS + 1))
    for (step, loss), (_, ref) in zip(got_loss, want_loss, strict=True):
        assert abs(loss - ref) < tol * max(1.0, abs(ref)), f"{precision}: loss at step {step}: {loss} != {ref}"
    got_evals, want_evals = evaluations(got), evaluations(want)
    assert [s for s, _ in got_evals] == [s for s, _ in want_evals] == [0, 2, 4]
    for (step, score), (_, ref) in zip(got_evals, want_evals, strict=True):
        assert abs(score - ref) < max(tol, 1e-4) * 100, f"{precision}: STS-B dev at step {step}: {score} != {ref}"
    got_w = load_file(str(got / "checkpoints" / "step-2" / "model.safetensors"))
    want_w = load_file(str(want / "checkpoints" / "step-2" / "model.safetensors"))
    assert got_w.keys() == want_w.keys()
    for key, ref in want_w.items():
        assert got_w[key].dtype == ref.dtype
        diff = (got_w[key].float() - ref.float()).abs().max()
        assert diff <= max(tol, 1e-5) * max(1.0, float(ref.float().abs().max())), (key, diff)
    start = load_file(str(runs.model_dir / "model.safetensors"))
    assert any(not torch.equal(start[k], want_w[f"encoder.{k}"].float()) for k in start if f"encoder.{k}" in want_w), (
        "no weight moved by step 2: the comparison would prove nothing"
    )


# --------------------------------------------------------------------------- a rank that dies

DEAD_RANK_BOUND_S = 90  # torchrun's agent polls its workers every few seconds and gives a SIGTERMed worker 30 s


def worker_of_rank(launcher: subprocess.Popen[str], rank: int, deadline: float) -> psutil.Process:
    """The ``simcse_kit.cli`` worker process with ``RANK=rank`` that torchrun started."""
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.environ().get("RANK") == str(rank) and "simcse_kit.cli" in child.cmdline():
                    return child
        time.sleep(0.2)
    raise AssertionError(f"no worker of rank {rank} appeared")


@pytest.mark.parametrize("nnodes", [1, 2])
def test_a_rank_that_dies_ends_the_run_in_bounded_time_naming_it(runs: TinyRun, nnodes: int) -> None:
    """SIGKILL of rank 1 in the middle of a bf16-weights run (after the step-0 evaluation saved
    a best model and after the first checkpoint, so in the steps' collectives; before the
    fix the run never got there): every launcher ends, failed,
    within ``DEAD_RANK_BOUND_S``, no worker is left behind, and the output names rank 1 and
    the signal. On one machine torchrun's agent sees the dead worker and stops the other; on
    two "machines" the survivor's collective fails on the closed connection and its own
    agent ends it."""
    options = precision_overrides(runs, "bf16-weights", f"killed-{nnodes}nodes")
    options.update({"num_epochs": 100, "max_steps": 400, "eval_steps": 0})  # the step-0 evaluation saves a best model
    out = Path(options["output_dir"])
    env = os.environ | ENV_EXTRA
    commands = torchrun(nnodes, 2 // nnodes, runs.recipe("unsup-recipe"), options)
    launchers = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step-2").is_dir():
            assert all(p.poll() is None for p in launchers) and time.monotonic() < deadline, "no checkpoint at step 2"
            time.sleep(0.1)
        victim = worker_of_rank(launchers[-1], 1, deadline)
        workers = [w for p in launchers for w in psutil.Process(p.pid).children(recursive=True)]
        victim.kill()
        killed = time.monotonic()
        outputs = [p.communicate(timeout=DEAD_RANK_BOUND_S)[0] for p in launchers]
        took = time.monotonic() - killed
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode != 0 for p in launchers), [o[-2000:] for o in outputs]
    assert not (out / "metrics.json").exists()
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"workers left running: {alive}"
    text = "\n".join(outputs)
    assert re.search(r"rank\s*: 1 \(local_rank: \d\)\s*\n\s*exitcode\s*: -9", text), text[-3000:]
    assert "Signal 9 (SIGKILL)" in text, text[-3000:]
    print(f"{nnodes} machine(s): every launcher ended {took:.1f} s after rank 1 was killed")


# --------------------------------------------------------------------------- one precision per launch

# Run as the torchrun worker instead of ``-m simcse_kit.cli``: the hardware check of each
# rank forced by the environment, then the CLI itself; each rank writes what it trained with.
FORCED_CHECK_WORKER = """
import json, os, sys
from pathlib import Path
from simcse_kit.cli import main
from simcse_kit.model import precision
from simcse_kit.training.wiring import run as run_module

rank = int(os.environ["RANK"])
native = os.environ[f"FORCE_BF16_RANK{rank}"] == "native"
facts = f"forced on rank {rank}: {'native' if native else 'no native'} bf16"
precision.cpu_bf16_support = lambda: precision.CpuSupport(native, facts, {"forced": True})
build_run = run_module.build_run


def recording_build_run(*args, **kwargs):
    run = build_run(*args, **kwargs)
    train = run.cfg.train
    dtypes = sorted({str(p.dtype) for p in run.model.parameters()})
    record = {"precision": [train.mixed_precision, train.bf16_weights, train.fast_dropout], "dtypes": dtypes}
    Path(os.environ["RECORD_DIR"], f"rank{rank}.json").write_text(json.dumps(record))
    return run


run_module.build_run = recording_build_run
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("rank0_native", [True, False], ids=["rank0-bf16", "rank0-fp32"])
def test_every_rank_follows_rank_0s_precision(runs: TinyRun, rank0_native: bool) -> None:
    """``auto`` on 2 processes whose hardware checks disagree (rank 1 forced to the other
    answer): both train with rank 0's choice, bf16 weights on both or fp32 on both, and
    metrics.json says rank 0 decided. Before, each rank decided alone and one launch could
    train bf16 weights on one rank and fp32 on the other."""
    name = f"agree-{'bf16' if rank0_native else 'fp32'}"
    options = overrides(runs, "unsup", name)
    options.update({"max_steps": 1, "num_epochs": 1, "grad_accum": 1, "mixed_precision": "auto",
                    "bf16_weights": "auto", "fast_dropout": "auto", "report_to": "none"})  # fmt: skip
    for key in ("queue_size", "momentum"):
        options.pop(key)
    worker = runs.folder / "forced_check_worker.py"
    worker.write_text(FORCED_CHECK_WORKER)
    record = runs.folder / f"{name}-ranks"
    record.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", str(worker),
               "train", str(runs.recipe("unsup-recipe")), *cli_args(options)]  # fmt: skip
    forced = {"FORCE_BF16_RANK0": "native" if rank0_native else "none", "FORCE_BF16_RANK1": "none" if rank0_native else "native"}
    env = os.environ | ENV_EXTRA | forced | {"RECORD_DIR": str(record)}
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    want = ["bf16", True, True] if rank0_native else ["no", False, False]
    dtypes = ["torch.bfloat16"] if rank0_native else ["torch.float32"]
    for rank in (0, 1):
        got = json.loads((record / f"rank{rank}.json").read_text())
        assert got["precision"] == want, (rank, got)
        # bf16 weights keep the embedding tables fp32 (fastpath.bf16): the rest is bf16
        assert set(dtypes) <= set(got["dtypes"]) and (rank0_native or got["dtypes"] == dtypes), (rank, got)
    assert "this process (rank 1) would decide" in done.stdout, done.stdout[-4000:]
    decided = json.loads((Path(options["output_dir"]) / "metrics.json").read_text())["precision"]
    assert decided["decided_by"] == f"rank 0 of 2: cpu: forced on rank 0: {'native' if rank0_native else 'no native'} bf16"
    assert [decided["mixed_precision"], decided["bf16_weights"], decided["fast_dropout"]] == want
    assert decided["hardware"] == {"forced": True}


# --------------------------------------------------------------------------- one writer for the run folder


def test_overwrite_with_checkpoints_on_two_processes_starts_over_once(runs: TinyRun) -> None:
    """``--overwrite`` of a finished 2-process run with checkpoints, on 2 processes: only the
    main process prepares the run folder (the others wait for its outcome), so the old
    checkpoints are removed once, and the new run trains as one process does from scratch
    (the same losses and weights as the reference: nothing resumed from the old state);
    only its own checkpoints are left. Before: every rank prepared the folder, and the
    second's removal of the checkpoints raced the first's."""
    want = reference(runs, "unsup")
    options = overrides(runs, "unsup", "unsup-overwrite") | {"save_steps": 1}
    out = Path(options["output_dir"])
    first = options | {"num_epochs": 4, "max_steps": 6, "learning_rate": 5e-3}  # other weights, later checkpoints
    launch(torchrun(1, 2, runs.recipe("unsup-recipe"), first), 2)
    old = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir())
    assert len(old) == 2 and old[0] > CASES["unsup"]["max_steps"], old
    commands = torchrun(1, 2, runs.recipe("unsup-recipe"), options)
    launch([[*command, "--overwrite"] for command in commands], 2)
    assert_same_training(out, want, CASES["unsup"]["max_steps"], runs.model_dir)
    new = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir())
    assert new and max(new) <= CASES["unsup"]["max_steps"], new  # the new run's own, none of the old run's
    assert not [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".lock"]
