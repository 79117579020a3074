"""Sharded engines (FSDP2, DeepSpeed ZeRO) chosen through Accelerate's own config files.

On CPU: the shipped configs (docs/accelerate/*.yaml) load as Accelerate's and launch with
the environment the kit expects; what does not compose with a sharded engine is refused
with the keys named; a sharded engine asked for where Accelerate would quietly train DDP
(CPU processes) is refused; evaluations and the best model come from the full-weights
copy that a sharded run keeps; SimCSEModel names its layers for FSDP's wrapping; and,
with torch's FSDP2 directly (Accelerate sets it up on GPUs only), 2 gloo processes of the
kit's sharded model and gathering objective train as one process on the whole batch.
With deepspeed directly (its CPU accelerator on gloo; Accelerate gives each CPU process a
world of its own), ZeRO-2 and ZeRO-3 engines of the same pieces train as one process too.

On CUDA only (skipped elsewhere, and said so): ``accelerate launch --config_file
docs/accelerate/fsdp2.yaml`` trains as the plain run does (learning rate, loss, final
weights per step, fp32 with TF32 off) and resumes from its sharded checkpoint. Run it with

    NVIDIA_TF32_OVERRIDE=0 python -m pytest tests/test_engines.py -k cuda -x -q
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType
from conftest import REPO, TinyRun, toy_sentences
from test_loop import Toy, mse_step, save_toy, toy_loader

from simcse_kit.cli import main
from simcse_kit.config.run import LoopConfig
from simcse_kit.errors import ConfigError
from simcse_kit.training.engine.checkpoints import Checkpoints
from simcse_kit.training.engine.engines import Engine, FullCopy, check_engine, engine_of
from simcse_kit.training.engine.loop import fit, prepare

CONFIGS = REPO / "docs" / "accelerate"
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}


# --------------------------------------------------------------------------- the shipped configs


@pytest.mark.parametrize(
    ("name", "kind", "section", "expected"),
    [
        ("fsdp2.yaml", DistributedType.FSDP, "fsdp_config", {"fsdp_version": 2, "fsdp_state_dict_type": "SHARDED_STATE_DICT"}),
        ("zero2.yaml", DistributedType.DEEPSPEED, "deepspeed_config", {"zero_stage": 2}),
        ("zero3.yaml", DistributedType.DEEPSPEED, "deepspeed_config", {"zero_stage": 3, "zero3_save_16bit_model": True}),
    ],
)
def test_shipped_configs_are_accelerates(name: str, kind: DistributedType, section: str, expected: dict[str, object]) -> None:
    config = load_config_from_file(str(CONFIGS / name))
    assert config.distributed_type == kind
    assert getattr(config, section).items() >= expected.items()
    # The recipe decides precision and accumulation: the config must not (an accumulation
    # in it would override train.grad_accum through ACCELERATE_GRADIENT_ACCUMULATION_STEPS).
    assert config.mixed_precision in (None, "no")
    assert "gradient_accumulation_steps" not in getattr(config, section)


def test_fsdp_config_launches_with_fsdp2_environment(tmp_path: Path) -> None:
    """What ``accelerate launch --config_file docs/accelerate/fsdp2.yaml`` hands the processes."""
    probe = tmp_path / "probe.py"
    probe.write_text("import json, os\nprint(json.dumps(dict(os.environ)))\n")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "fsdp2.yaml")]
    command = [*launch, "--num_processes", "1", str(probe)]
    out = subprocess.run(command, env=os.environ | ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    env = json.loads(out.stdout.strip().splitlines()[-1])
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env


# --------------------------------------------------------------------------- what is refused


FSDP2 = Engine("FSDP2", shards_weights=True)
ZERO2 = Engine("DeepSpeed ZeRO-2", steps_in_backward=True, clip=1.0)
ZERO3 = Engine("DeepSpeed ZeRO-3", shards_weights=True, steps_in_backward=True, clip=1.0)


@pytest.mark.parametrize(
    ("engine", "settings", "named"),
    [
        (FSDP2, {"train.bf16_weights": True}, "'train.bf16_weights' = true"),
        (ZERO2, {"train.bf16_weights": True, "train.max_grad_norm": 1.0}, "'train.bf16_weights' = true"),
        (FSDP2, {"train.fast_dropout": True}, "'train.fast_dropout' = true"),
        (FSDP2, {"loss.queue_size": 16}, "'loss.queue_size' = 16"),
        (ZERO3, {"loss.queue_size": 16, "train.max_grad_norm": 1.0}, "'loss.queue_size' = 16"),
        (ZERO2, {"train.grad_cache_chunk": 4, "train.max_grad_norm": 1.0}, "'train.grad_cache_chunk' = 4"),
        (ZERO3, {"train.max_grad_norm": None}, "'train.max_grad_norm' = None but DeepSpeed clips at 1.0"),
        (FSDP2, {"train.grad_accum": 2, "accelerate.gradient_accumulation_steps": 4}, "'train.grad_accum' = 2"),
    ],
)
def test_sharded_engines_refuse_what_does_not_compose(engine: Engine, settings: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^not with {engine.name}: .*{named}".replace("(", r"\(").replace(")", r"\)")):
        check_engine(engine, settings)


def test_an_accumulation_set_by_the_launch_is_refused_under_ddp_too() -> None:
    """The loop counts its steps with train.grad_accum; a launch that makes Accelerate
    accumulate otherwise would train a different schedule, whatever the engine."""
    with pytest.raises(ConfigError, match="'train.grad_accum' = 1 but accelerate launch set gradient accumulation to 4"):
        check_engine(Engine(), {"train.grad_accum": 1, "accelerate.gradient_accumulation_steps": 4})


@pytest.mark.parametrize(
    ("engine", "settings"),
    [
        # auto never turns the CPU fast paths on for CUDA; false is false.
        (FSDP2, {"train.bf16_weights": "auto", "train.fast_dropout": False, "train.max_grad_norm": None}),
        (FSDP2, {"train.grad_cache_chunk": 4, "train.grad_accum": 2, "accelerate.gradient_accumulation_steps": 2}),
        (ZERO2, {"loss.queue_size": 16, "train.max_grad_norm": 1.0}),  # ZeRO-2 keeps the full weights
        (Engine(), {"train.bf16_weights": True, "loss.queue_size": 16, "train.grad_cache_chunk": 4}),  # DDP: all
    ],
)
def test_what_composes_passes(engine: Engine, settings: dict[str, object]) -> None:
    check_engine(engine, settings)


@pytest.mark.parametrize(("variable", "engine"), [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_cpu_run_refuses_a_sharded_engine_it_would_not_get(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, engine: str
) -> None:
    """``accelerate launch --config_file fsdp2.yaml`` on CPU processes: Accelerate sets FSDP
    up on GPUs only and would train DDP; the run says so instead of training."""
    monkeypatch.setenv(variable, "true")
    assert main(["train", str(tiny_run.recipe("run"))]) == 2
    err = capsys.readouterr().err
    assert f"the accelerate config asks for {engine}, but Accelerate runs it on GPUs only and would not use it here" in err
    assert "Traceback" not in err
    assert not (tiny_run.folder / "run").exists(), "a refused start must not create the run folder"


def test_plain_accelerator_is_ddp() -> None:
    from simcse_kit.training.engine.loop import make_accelerator

    assert engine_of(make_accelerator(LoopConfig(), cpu=True)) == Engine()


# --------------------------------------------------------------------------- the full-weights copy


def test_evaluations_and_best_model_come_from_the_refreshed_full_copy(tmp_path: Path) -> None:
    """With sharded weights the main process evaluates and saves an unsharded copy: it must
    be a different module holding exactly the trained weights at every evaluation."""
    cfg = LoopConfig(learning_rate=3e-2, num_epochs=2, eval_steps=3, log_steps=1, progress_bar=False, eval_at_start=False)
    run = prepare(Toy(), toy_loader(), cfg)
    run = dataclasses.replace(run, full_copy=FullCopy(run.model, run.accelerator))
    seen: list[dict[str, torch.Tensor]] = []

    class Copied:
        primary_metric = "score"

        def __call__(self, model: torch.nn.Module) -> dict[str, float]:
            assert model is not run.model and not model.training
            trained = run.model.state_dict()
            for key, value in model.state_dict().items():
                assert torch.equal(value, trained[key]), key
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
            return {"score": float(len(seen) % 3)}  # best: the 2nd evaluation (step 6)

    checkpoints = Checkpoints(tmp_path / "ckpt", tmp_path / "best", save_toy)
    state = fit(run, mse_step, cfg, evaluator=Copied(), checkpoints=checkpoints)
    assert [e["step"] for e in state.evals] == [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 20.0]
    assert state.best_step == 6
    best = torch.load(tmp_path / "best" / "model.pt")
    assert best.keys() == seen[1].keys() and all(torch.equal(best[k], seen[1][k]) for k in best)
    assert not torch.equal(seen[0]["out.weight"], seen[1]["out.weight"]), "the weights moved between evaluations"


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_simcse_model_names_its_layers_for_fsdp(tmp_path: Path, tiny_model_dir: Path, arch: str) -> None:
    """Accelerate's TRANSFORMER_BASED_WRAP reads ``_no_split_modules`` off the model it
    prepares: SimCSEModel passes its encoder's on, so each layer is its own FSDP unit."""
    from tiny_encoders import build_tiny_decoder
    from transformers import AutoModel

    from simcse_kit.model.modeling import SimCSEModel

    folder = tiny_model_dir if arch == "bert" else build_tiny_decoder(arch, tmp_path / arch)
    model = SimCSEModel(AutoModel.from_pretrained(folder), pooler="cls" if arch == "bert" else "last")
    expected = {"bert": "BertLayer", "qwen3": "Qwen3DecoderLayer"}[arch]
    assert expected in model._no_split_modules
    # What Accelerate's wrapping looks for: modules of that class inside the model.
    layers = [m for m in model.modules() if type(m).__name__ == expected]
    assert len(layers) == AutoModel.from_pretrained(folder).config.num_hidden_layers


# --------------------------------------------------------------------------- FSDP2 on CPU, torch directly

WORLD, PER_RANK, STEPS = 2, 4, 3


class FSDP2NoSync:
    """What GradCache asks of the accelerator, as Accelerate does it for FSDP2:
    ``no_sync(model)`` is ``model.set_requires_gradient_sync(False)`` for its duration."""

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes

    @contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]


def toy_pieces(model_dir: str, shard: Callable[[torch.nn.Module], None] | None = None) -> tuple[Any, ...]:
    """What both sharded runs train: the kit's model (``shard`` applied before the optimizer sees
    its parameters), its AdamW, a linear schedule, the sup collator and objective (gather on)."""
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    from simcse_kit.config.run import LossConfig, ModelConfig
    from simcse_kit.data.collate import ContrastiveCollator
    from simcse_kit.model.modeling import SimCSEModel
    from simcse_kit.training.engine.loop import make_optimizer
    from simcse_kit.training.objective.objectives import SimCSEObjective

    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=model_dir, pooler="avg", mlp="train", dropout=0.0))
    model.train()
    if shard is not None:
        shard(model)
    optimizer = make_optimizer(model, LoopConfig(learning_rate=1e-3, weight_decay=0.01))
    schedule = get_linear_schedule_with_warmup(optimizer, 1, STEPS)
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_dir), "sup", 16)
    objective = SimCSEObjective("sup", LossConfig(temperature=0.05, gather=True))
    return model, optimizer, schedule, collate, objective


def share(step: int, rank: int, world: int) -> list[dict[str, str]]:
    """Global batch ``step`` (8 pairs of words of the tiny vocabulary: unknown words would all be
    one [UNK]), this process's share of it; all of it on one process."""
    sentences = toy_sentences(2 * 8 * STEPS)
    batch = [{"sent0": sentences[2 * i], "sent1": sentences[2 * i + 1]} for i in range(8 * step, 8 * step + 8)]
    return batch[rank * PER_RANK : (rank + 1) * PER_RANK] if world > 1 else batch


def fsdp_run(model_dir: str, rank: int, world: int, chunk: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train the kit's model with its objective (cross-process gather on) and AdamW for
    STEPS steps on this process's share of each global batch: sharded layer by layer with
    FSDP2 when ``world`` > 1 (what Accelerate's FSDP2 prepare does on GPUs), plain on one
    process; with ``chunk``, through GradCache in chunks of that many rows. Returns the
    loss per step (mean over processes) and the full final weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from simcse_kit.training.engine.steps import GradCacheStep

    def shard(model: torch.nn.Module) -> None:
        # TRANSFORMER_BASED_WRAP: each of the model's _no_split_modules its own unit, then the root.
        for module in model.modules():
            if type(module).__name__ in (model._no_split_modules or []):
                fully_shard(module)
        fully_shard(model)

    model, optimizer, schedule, collate, objective = toy_pieces(model_dir, shard if world > 1 else None)
    step = GradCacheStep(objective, chunk, FSDP2NoSync(world)) if chunk else objective.step
    losses = []
    for n in range(STEPS):
        loss = step(model, collate(share(n, rank, world)))
        # What Accelerate's clip_grad_norm_ calls for FSDP2: torch's, DTensor-aware.
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if world > 1:
            loss = loss.detach().clone()
            torch.distributed.all_reduce(loss)
            loss /= world
        losses.append(float(loss))
    if world == 1:
        return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Accelerator.get_state_dict's FSDP2 call: the full weights, on rank 0.
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return losses, state


def fsdp_worker(rank: int, model_dir: str, out_dir: str, chunk: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        losses, state = fsdp_run(model_dir, rank, WORLD, chunk)
        if rank == 0:
            torch.save({"losses": losses, "state": state}, Path(out_dir) / "fsdp.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes, each importing the stack and training (~14 s CPU each)
@pytest.mark.parametrize("chunk", [0, 2], ids=["plain", "gradcache"])
def test_fsdp2_on_two_cpu_processes_trains_as_one(tmp_path: Path, tiny_model_dir: Path, chunk: int) -> None:
    """FSDP2 itself runs on CPU processes (gloo), though Accelerate only sets it up on GPUs:
    the kit's model, sharded per layer, with its objective gathering the other process's
    candidates, AdamW, the schedule and clipping, trains as one process on the whole batch
    (loss per step and final full weights, fp32, 1e-5), and the full state dict gathered as
    Accelerate gathers it loads into the unsharded copy (FullCopy) whole. With GradCache
    (chunks of one example), all chunks but the last run without FSDP2's gradient sync."""
    import torch.multiprocessing as mp

    from simcse_kit.model.modeling import SimCSEModel

    mp.spawn(fsdp_worker, args=(str(tiny_model_dir), str(tmp_path), chunk), nprocs=WORLD, join=True)
    got = torch.load(tmp_path / "fsdp.pt")
    want_losses, want_state = fsdp_run(str(tiny_model_dir), 0, 1)  # the plain step: GradCache is exact
    assert len(got["losses"]) == STEPS
    assert len({round(loss, 4) for loss in want_losses}) == STEPS, f"degenerate losses (all [UNK]?): {want_losses}"
    for step, (loss, want) in enumerate(zip(got["losses"], want_losses, strict=True), 1):
        assert abs(loss - want) < 1e-5 * max(1.0, abs(want)), f"loss at step {step}: {loss} != {want}"
    assert got["state"].keys() == want_state.keys()
    for key, want in want_state.items():
        assert torch.allclose(got["state"][key], want, atol=1e-5, rtol=0), (key, (got["state"][key] - want).abs().max())
    # The gathered weights fill an unsharded model completely (FullCopy loads strictly).
    from simcse_kit.config.run import ModelConfig

    copy = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="train", dropout=0.0))
    copy.load_state_dict(got["state"])
    first = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="train", dropout=0.0))
    moved = [k for k, v in first.state_dict().items() if k in want_state and not torch.equal(v, want_state[k])]
    assert moved, "no weight moved: the comparison would prove nothing"


# --------------------------------------------------------------------------- DeepSpeed ZeRO on CPU, deepspeed directly


def zero_run(model_dir: str, rank: int, world: int, stage: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The run of :func:`fsdp_run` (same model, objective with the gather on, AdamW, schedule,
    clipping at 0.5, data) inside a DeepSpeed ZeRO ``stage`` engine, as Accelerate's prepare
    builds it from the kit's optimizer and schedule: the engine's ``backward`` and ``step``
    (which clips, steps the optimizer and the schedule). Returns the loss per step (mean over
    processes) and, on every rank, the full final weights (ZeRO-3's gathered)."""
    import deepspeed

    model, optimizer, schedule, collate, objective = toy_pieces(model_dir)
    config = {
        "train_micro_batch_size_per_gpu": PER_RANK,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # the kit's own AdamW, as Accelerate allows it
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=schedule, config=config)
    losses = []
    for n in range(STEPS):
        loss = objective.step(engine, collate(share(n, rank, world)), engine.backward)
        engine.step()
        loss = loss.detach().clone()
        torch.distributed.all_reduce(loss)
        losses.append(float(loss / world))
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):  # ZeRO-3 holds a shard of each
        state = {k: v.detach().clone() for k, v in engine.module.named_parameters()}
    # Released here, not by the garbage collector at interpreter exit, after the process
    # group is gone: ZeRO-3's optimizer left to that once aborted a process at exit
    # ("terminate called without an active exception", SIGABRT) after a correct run.
    engine.destroy()
    return losses, state


def zero_worker(rank: int, model_dir: str, out_dir: str, stage: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ.update(WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        losses, state = zero_run(model_dir, rank, WORLD, stage)
        if rank == 0:
            torch.save({"losses": losses, "state": state}, Path(out_dir) / "zero.pt")
        gc.collect()  # the engine's cycles, while the group they may use still exists
        torch.distributed.barrier()  # neither process tears its group down while the other works
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing deepspeed and training
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_deepspeed_zero_on_two_cpu_processes_trains_as_one(tmp_path: Path, tiny_model_dir: Path, stage: int) -> None:
    """DeepSpeed's ZeRO-2 and ZeRO-3 run on CPU processes (its CPU accelerator, gloo), though
    Accelerate 1.15 on CPU gives each process a world of its own: the kit's model, objective
    (gathering the other process's candidates), AdamW and schedule inside the engine, on 2
    processes of 4 examples, train as one plain process of 8 (loss per step, final weights,
    fp32, 1e-5). deepspeed is an extra (``.[deepspeed]``); CI installs it."""
    pytest.importorskip("deepspeed")
    import torch.multiprocessing as mp

    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(zero_worker, args=(str(tiny_model_dir), str(tmp_path), stage), nprocs=WORLD, join=True)
    got = torch.load(tmp_path / "zero.pt")
    want_losses, want_state = fsdp_run(str(tiny_model_dir), 0, 1)
    assert len({round(loss, 4) for loss in want_losses}) == STEPS, f"degenerate losses: {want_losses}"
    for step, (loss, want) in enumerate(zip(got["losses"], want_losses, strict=True), 1):
        assert abs(loss - want) < 1e-5 * max(1.0, abs(want)), f"loss at step {step}: {loss} != {want}"
    params = dict(want_state)
    assert got["state"].keys() <= params.keys() and len(got["state"]) > 0
    for key, value in got["state"].items():
        assert torch.allclose(value, params[key], atol=1e-5, rtol=0), (key, (value - params[key]).abs().max())


# --------------------------------------------------------------------------- CUDA only


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def losses_and_weights(out: Path) -> tuple[list[tuple[int, float]], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    losses = [tuple(x) for x in json.loads((out / "metrics.json").read_text())["losses"]]
    return losses, load_file(str(out / "best_model" / "model.safetensors"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: Accelerate sets FSDP up on GPUs only")
@pytest.mark.parametrize("extra", [{"grad_accum": 2, "max_grad_norm": 0.5}, {"mode": "sup", "grad_cache_chunk": 2}])
def test_cuda_fsdp2_trains_as_the_plain_run_and_resumes(tiny_run: TinyRun, extra: dict[str, object]) -> None:
    """``accelerate launch --config_file docs/accelerate/fsdp2.yaml`` on min(2, GPUs) processes
    against the plain one-process run: the same loss per step and final weights (fp32, TF32
    off); then a resume from its step-2 sharded checkpoint ends at the same weights."""
    from conftest import write_train_data
    from test_multiprocess import cli_args

    gpus = min(2, torch.cuda.device_count())
    mode = str(extra.get("mode", "unsup"))
    data = tiny_run.folder / mode
    data.mkdir(exist_ok=True)
    options = {"train_file": write_train_data(data, mode, n=32), "dropout": 0.0, "pooler": "avg", "batch_size": 8,
               "max_steps": 3, "eval_steps": 0, "eval_at_start": "false", "save_steps": 2, "final_eval": "false",
               "log_steps": 1, "mixed_precision": "no", "num_epochs": 2, **extra}  # fmt: skip
    recipe = tiny_run.recipe("recipe")
    env = os.environ | ENV | {"NVIDIA_TF32_OVERRIDE": "0"}

    def train(launcher: list[str], out: Path, *more: str) -> str:
        command = [*launcher, "-m", "simcse_kit.cli", "train", str(recipe), *cli_args(options), "--output-dir", str(out), *more]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    plain, sharded = tiny_run.folder / "plain", tiny_run.folder / "fsdp"
    train([sys.executable], plain)
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "fsdp2.yaml"),
                  "--num_processes", str(gpus), "--main_process_port", str(free_port())]  # fmt: skip
    log = train(accelerate, sharded)
    assert "engine: FSDP2" in log and f"optimiser steps on {gpus} process(es)" in log
    want_loss, want_w = losses_and_weights(plain)
    got_loss, got_w = losses_and_weights(sharded)
    assert [s for s, _ in got_loss] == [s for s, _ in want_loss] == [1, 2, 3]
    for (step, got), (_, want) in zip(got_loss, want_loss, strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), f"loss at step {step}"
    assert got_w.keys() == want_w.keys()
    for key, want in want_w.items():
        assert got_w[key].dtype == torch.float32 and torch.allclose(got_w[key], want, atol=1e-4, rtol=0), key

    # Resume: the finished run less its result, continued from the sharded step-2 checkpoint.
    resumed = tiny_run.folder / "fsdp-resumed"
    shutil.copytree(sharded, resumed)
    (resumed / "metrics.json").unlink()
    shutil.rmtree(resumed / "best_model")
    log = train(accelerate, resumed, "--resume")
    assert "resumed from" in log
    again_loss, again_w = losses_and_weights(resumed)
    assert again_loss[-1][0] == 3
    for key, want in got_w.items():
        assert torch.allclose(again_w[key], want, atol=1e-5, rtol=0), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: FSDP's mixed-precision policy needs GPUs")
def test_cuda_fsdp2_bf16_trains_and_saves_fp32(tiny_run: TinyRun) -> None:
    """A bf16 recipe under FSDP2 becomes FSDP's mixed-precision policy (bf16 compute, fp32
    sharded weights): it trains like the plain bf16-autocast run, and best_model/ is fp32."""
    from conftest import write_train_data
    from test_multiprocess import cli_args

    gpus = min(2, torch.cuda.device_count())
    data = tiny_run.folder / "unsup"
    data.mkdir(exist_ok=True)
    options = {"train_file": write_train_data(data, "unsup", n=32), "dropout": 0.0, "pooler": "avg", "batch_size": 8,
               "max_steps": 4, "eval_steps": 2, "eval_at_start": "false", "final_eval": "false", "log_steps": 1,
               "mixed_precision": "bf16", "bf16_weights": "false", "fast_dropout": "false"}  # fmt: skip
    recipe = tiny_run.recipe("recipe")
    env = os.environ | ENV
    runs = {}
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "fsdp2.yaml"),
                  "--num_processes", str(gpus), "--main_process_port", str(free_port())]  # fmt: skip
    for name, launcher in (("plain", [sys.executable]), ("fsdp", accelerate)):
        out = tiny_run.folder / f"bf16-{name}"
        command = [*launcher, "-m", "simcse_kit.cli", "train", str(recipe), *cli_args(options), "--output-dir", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[name] = losses_and_weights(out)
    (plain_loss, plain_w), (fsdp_loss, fsdp_w) = runs["plain"], runs["fsdp"]
    assert [s for s, _ in fsdp_loss] == [1, 2, 3, 4]
    for (_, got), (_, want) in zip(fsdp_loss, plain_loss, strict=True):
        assert got == pytest.approx(want, rel=5e-2)  # bf16 rounding, in different places
    for key, want in plain_w.items():
        assert fsdp_w[key].dtype == torch.float32, key
        assert torch.allclose(fsdp_w[key], want, atol=2e-2, rtol=0), (key, (fsdp_w[key] - want).abs().max())
