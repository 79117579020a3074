"""A small training loop with Accelerate at the edges, and the checkpoints it keeps.

The loop knows nothing about text or images. :func:`fit` takes a model, a *step*, a
DataLoader and a :class:`~simcse_kit.config.LoopConfig`:

- a step is any callable ``step(model, batch, backward) -> loss`` that computes the
  loss, calls ``backward(loss)`` itself and returns the detached loss (GradCache calls
  it once on the full-batch loss, then pushes cached gradients through chunks);
- an evaluator is any callable ``evaluator(model) -> dict[str, float]`` with a
  ``primary_metric`` attribute naming the key that selects the best model (the
  sentence-transformers convention), run every ``eval_steps`` and at the end;
- :class:`Checkpoints` owns the run's ``step-N`` folders (the full training state every
  ``save_steps``, so that ``resume=True`` continues exactly) *and* the best model;
- the accelerator's experiment trackers (``cfg.report_to``) get the loop's numbers, the
  step's own ``metrics()`` and every evaluation against the step (:mod:`simcse_kit.tracking`).

Mixed precision, gradient accumulation and multi-process come from Accelerate.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from accelerate import Accelerator
from accelerate import state as accelerate_state
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from simcse_kit.config import AUTO, LoopConfig
from simcse_kit.errors import ConfigError
from simcse_kit.fastpath.bf16 import MasterWeightAdamW, bf16_training
from simcse_kit.fastpath.internals import reset_accelerate_state
from simcse_kit.fileio import atomic_dir, remove_dir, replace_dir, storage_error
from simcse_kit.guards import StepGuard, Stopped, StopSignals, collapse_reason
from simcse_kit.model_checks import check_weights
from simcse_kit.pipeline import loader_options
from simcse_kit.precision import PrecisionChoice, resolve_precision
from simcse_kit.steps import Step
from simcse_kit.tracking import LoopLog, gradient_norm, tracker_names

logger = logging.getLogger(__name__)

SaveModelFn = Callable[[nn.Module, Path, dict[str, float]], None]

KEEP_CHECKPOINTS = 2  # the newest complete one, plus one in case the newest is bad
LOOP_STATE = "loop_state.json"  # written last into a checkpoint: its presence marks it complete
LOADER_RNG = "loader_generator.pt"
BEST_SNAPSHOT = "best_model"  # a checkpoint's hard-linked copy of the best model at its step


class Evaluator(Protocol):
    """``evaluator(model) -> metrics``; ``metrics[evaluator.primary_metric]`` selects the best."""

    primary_metric: str

    def __call__(self, model: nn.Module) -> dict[str, float]: ...


@dataclass
class LoopState:
    """What the loop has done so far (saved with checkpoints, returned at the end)."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches consumed in the current epoch
    best_score: float = -math.inf
    best_step: int = -1
    rows_seen: int = 0  # batch rows trained on, all processes (text: sentences, V per example)
    train_seconds: float = 0.0  # without evaluations and checkpoint saves
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, [tuple(v) for v in value] if key == "losses" else value)


# --------------------------------------------------------------------------- building blocks


C = TypeVar("C", bound=LoopConfig)


def with_concrete_precision(cfg: C, cpu: bool | None = None) -> tuple[C, PrecisionChoice | None]:
    """``cfg`` with ``auto`` precision settings decided for this machine (and the choice,
    with its one-line reason); a config without ``auto`` comes back unchanged with None."""
    fast = getattr(cfg, "fast_dropout", False)
    if AUTO not in (cfg.mixed_precision, cfg.bf16_weights, fast):
        return cfg, None
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    choice = resolve_precision(cfg.mixed_precision, "cpu" if cpu else "cuda", bf16_weights=cfg.bf16_weights, fast_dropout=fast)
    changes: dict[str, Any] = {"mixed_precision": choice.mixed_precision, "bf16_weights": choice.bf16_weights}
    if hasattr(cfg, "fast_dropout"):
        changes["fast_dropout"] = choice.fast_dropout
    return replace(cfg, **changes), choice


def loss_text(value: float) -> str:
    """The progress bar's loss: three significant digits, since a fine-tuned model's unsup
    loss sits at 1e-4..1e-2 and a fixed four decimals would show it as 0.0000."""
    return f"{value:.3g}"


def make_accelerator(cfg: LoopConfig, cpu: bool | None = None, logging_dir: str | Path | None = None) -> Accelerator:
    """One Accelerator per run; mixed precision, accumulation and the experiment trackers
    (``cfg.report_to``, checked: :func:`simcse_kit.tracking.tracker_names`) from the config.

    Args:
        cfg: the loop's settings.
        cpu: force the CPU; default: CPU when CUDA is unavailable.
        logging_dir: where trackers with local files (TensorBoard) write.
    """
    trackers = tracker_names(cfg.report_to)
    if cpu is None:
        cpu = not torch.cuda.is_available()
        if cpu and torch.backends.mps.is_available():
            logger.info("training on the CPU: an MPS device is present, but training is not verified on MPS")
    cfg, _ = with_concrete_precision(cfg, cpu)
    # bf16 weights run the model in bf16 outright: autocast on top would only add casts.
    precision = "no" if cfg.bf16_model else cfg.mixed_precision
    # Accelerate keeps one process-wide state and refuses a second Accelerator with another
    # precision; seeds, sweeps and benchmarks train several runs (and other libraries' trainers)
    # in one process. Reset that state but keep the process group.
    if accelerate_state.is_initialized() and str(accelerate_state.AcceleratorState().mixed_precision) != precision:
        reset_accelerate_state()
    return Accelerator(
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.grad_accum,
        cpu=cpu,
        # Asynchronous host-to-device copies of the (pinned) batches on CUDA.
        dataloader_config=DataLoaderConfiguration(non_blocking=loader_options("cpu" if cpu else "cuda").non_blocking),
        log_with=trackers or None,
        project_config=ProjectConfiguration(logging_dir=str(logging_dir)) if logging_dir is not None else None,
    )


def make_optimizer(model: nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where the parameters' device allows (on CPU it takes
    the default model's AdamW step from ~59 to ~8 ms, benchmarks/adamw_step.py); with
    ``cfg.bf16_model`` the model is cast to bf16 (embedding tables excepted) and AdamW
    keeps fp32 masters (:func:`simcse_kit.fastpath.bf16.bf16_training`), its embedding
    tables' gradients in kept dense buffers as ``cfg.sparse_embedding_grad`` says."""
    groups = param_groups(model, cfg.weight_decay)
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
    if cfg.bf16_model:
        processes = accelerate_state.PartialState().num_processes
        if cfg.sparse_embedding_grad is True and processes > 1:
            raise ConfigError(
                f"config key 'train.sparse_embedding_grad' = true: not with {processes} processes "
                "(DistributedDataParallel expects a sparse table's gradient to be sparse); use auto or false"
            )
        sparse = cfg.sparse_embedding_grad is True or (cfg.sparse_embedding_grad == AUTO and processes == 1)
        return bf16_training(model, groups, sparse_tables=sparse, lr=cfg.learning_rate, fused=fused)
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=fused)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and norm weights (the BERT convention)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def total_steps(cfg: LoopConfig, batches_per_epoch: int) -> int:
    per_epoch = max(1, batches_per_epoch // cfg.grad_accum)
    steps = per_epoch * cfg.num_epochs
    return min(steps, cfg.max_steps) if cfg.max_steps else steps  # None or 0: no limit


def scheduler_ticks_per_step(accelerator: Accelerator, cfg: LoopConfig) -> int:
    """How many times the prepared scheduler moves per optimiser step of :func:`fit`.

    Accelerate's scheduler wrapper steps the schedule once per process at each optimiser
    step (``num_processes`` times; once with ``split_batches``), since it expects a
    schedule sized by the unsharded loader; without ``step_scheduler_with_optimizer`` it
    moves at every call, i.e. every micro-batch. A schedule built for ``n`` optimiser steps
    is made ``n`` times this long, so every process count follows the same rate per step.
    """
    if not accelerator.step_scheduler_with_optimizer:
        return cfg.grad_accum
    return 1 if accelerator.split_batches else accelerator.num_processes


def due_step(cfg: LoopConfig, step: int, n_steps: int) -> bool:
    """Whether optimiser step ``step`` reads the device anyway (log, evaluation, checkpoint
    or last step): where a CUDA run's divergence flags are read back."""
    every = [cfg.eval_steps, cfg.save_steps]
    return is_log_step(cfg, step) or step >= n_steps or any(e and step % e == 0 for e in every)


def is_log_step(cfg: LoopConfig, step: int) -> bool:
    """Whether optimiser step ``step`` records its loss (and reports to trackers): the
    first step, then every ``cfg.log_steps``."""
    return step % max(1, cfg.log_steps) == 0 or step == 1


def batch_rows(batch: Any) -> int:
    """Rows of a batch: of its first tensor for a dict batch (all its tensors share the
    row count), else ``len(batch)``."""
    return len(next(iter(batch.values()))) if isinstance(batch, Mapping) else len(batch)


# --------------------------------------------------------------------------- checkpoints


def checkpoint_step(path: Path) -> int | None:
    """``step-120`` -> 120; anything else (hidden temp or half-deleted folders) -> None."""
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint ``folder/step-N``, or None.

    Only folders named ``step-N`` holding ``loop_state.json`` count: a checkpoint is
    written into a hidden temp folder and renamed into place, so a kill mid-save leaves
    only a temp folder, which is ignored here and deleted by the next save.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir() if checkpoint_step(p) is not None and (p / LOOP_STATE).is_file()]
    return max(done, key=lambda p: checkpoint_step(p) or 0, default=None)


def checkpoint_problem(ckpt: Path) -> str | None:
    """What is wrong with a complete-looking checkpoint folder (a truncated or corrupt
    file: a disk that filled, a copy cut short), or None. Cheap: headers and zip
    directories are read, no tensor."""
    try:
        json.loads((ckpt / LOOP_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{ckpt / LOOP_STATE}: {exc}"
    for path in sorted(ckpt.iterdir()):
        # torch.save writes zip archives, whose directory sits at the end: a cut file has none.
        if path.suffix in (".bin", ".pt", ".pkl") and path.is_file():
            try:
                zipfile.ZipFile(path).close()
            except (OSError, zipfile.BadZipFile) as exc:
                return f"{path}: {exc}"
    for folder in (ckpt, ckpt / BEST_SNAPSHOT):
        try:
            check_weights(folder)
        except ConfigError as exc:
            return str(exc)
    return None


def link_tree(src: Path, dst: Path) -> None:
    """Copy folder ``src`` to ``dst`` as hard links (a copy where linking fails).

    Model folders are only ever replaced whole (built elsewhere, then renamed), never
    edited in place, so files shared by links cannot change under a checkpoint.
    """

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


class Checkpoints:
    """A run's checkpoint folder and its best model.

    The full training state goes to ``folder/step-N`` (the newest :data:`KEEP_CHECKPOINTS`
    kept); the best model so far to ``best_dir``. Each checkpoint carries a hard-linked
    snapshot of ``best_dir`` as it was at that step: after a kill, ``best_dir`` may come
    from steps that the resumed run redoes, and :meth:`restore` puts it back to the
    checkpoint's best-so-far.

    Args:
        folder: where the ``step-N`` folders go.
        best_dir: where the best model goes; None: the best is tracked, not saved.
        save_model: ``save_model(model, folder, metrics)`` writes ``model`` into the empty
            ``folder`` (renamed to ``best_dir`` once written); ``metrics`` are the
            evaluation's, with ``"step"``.
    """

    def __init__(self, folder: str | Path, best_dir: str | Path | None = None, save_model: SaveModelFn | None = None) -> None:
        if (best_dir is None) != (save_model is None):
            raise ValueError("Checkpoints: best_dir and save_model go together")
        self.folder = Path(folder)
        self.best_dir = Path(best_dir) if best_dir is not None else None
        self.save_model = save_model

    def latest(self) -> Path | None:
        return latest_checkpoint(self.folder)

    def intact(self) -> Path | None:
        """The newest checkpoint that passes :func:`checkpoint_problem`, saying which newer
        ones were skipped and why; None if there is none at all.

        Raises:
            ConfigError: there are checkpoints, but none intact.
        """
        done = (
            sorted(
                (p for p in self.folder.iterdir() if checkpoint_step(p) is not None and (p / LOOP_STATE).is_file()),
                key=lambda p: checkpoint_step(p) or 0,
                reverse=True,
            )
            if self.folder.is_dir()
            else []
        )
        problems = []
        for ckpt in done:
            problem = checkpoint_problem(ckpt)
            if problem is None:
                if problems:
                    logger.warning("resuming from %s, the newest intact checkpoint, instead: %s", ckpt, "; ".join(problems))
                return ckpt
            problems.append(f"{ckpt.name} is damaged ({problem})")
        if problems:
            raise ConfigError(
                f"--resume: no intact checkpoint in {self.folder}: {'; '.join(problems)}; start over with --overwrite"
            )
        return None

    def save_best(self, model: nn.Module, metrics: dict[str, float]) -> None:
        """Replace ``best_dir`` whole with ``model`` (main process only)."""
        if self.best_dir is None or self.save_model is None:
            return
        with atomic_dir(self.best_dir) as tmp:
            self.save_model(model, tmp, metrics)

    def save(self, accelerator: Accelerator, state: LoopState, loader_rng: torch.Tensor | None) -> Path:
        """:meth:`write`; a write that fails for the disk's reasons (full, read-only)
        removes the partial temp folder and raises a one-line StorageError naming it."""
        try:
            return self.write(accelerator, state, loader_rng)
        except (OSError, RuntimeError) as exc:
            partial = self.folder / f".step-{state.global_step}.tmp"
            shutil.rmtree(partial, ignore_errors=True)  # it would keep the disk full for the next try
            error = storage_error(exc, partial)
            if error is None:
                raise
            raise error from None

    def write(self, accelerator: Accelerator, state: LoopState, loader_rng: torch.Tensor | None) -> Path:
        """Write the full training state to ``folder/step-N`` atomically; keep the newest two.

        Model, optimizer, scheduler, scaler, registered objects and every process's RNG
        states come from ``accelerator.save_state``; the loop position and best-so-far from
        ``state``; the shuffling generator's state at the start of the current epoch from
        ``loader_rng``. All processes must call this (``save_state`` writes per-process
        files, so on several nodes ``folder`` must be on a shared filesystem).
        """
        final = self.folder / f"step-{state.global_step}"
        # Not fileio.atomic_dir: every process writes into this folder, so its temp name
        # must be the same on all of them (atomic_dir draws a random one).
        tmp = self.folder / f".step-{state.global_step}.tmp"
        if accelerator.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".step-*"):  # leftovers of a killed save or delete
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if loader_rng is not None:
                torch.save(loader_rng, tmp / LOADER_RNG)
            if self.best_dir is not None and self.best_dir.is_dir():
                link_tree(self.best_dir, tmp / BEST_SNAPSHOT)
            (tmp / LOOP_STATE).write_text(json.dumps(state.state_dict()), encoding="utf-8")
            replace_dir(tmp, final)  # a resumed run passing the same step again replaces it
            done = sorted(
                (p for p in self.folder.iterdir() if checkpoint_step(p) is not None), key=lambda p: checkpoint_step(p) or 0
            )
            for old in done[:-KEEP_CHECKPOINTS]:
                remove_dir(old)
            logger.info("saved training state at step %d to %s", state.global_step, final)
        accelerator.wait_for_everyone()
        return final

    def restore(self, accelerator: Accelerator, state: LoopState, generator: torch.Generator | None) -> Path | None:
        """Load the newest checkpoint into the prepared objects, ``state`` and the shuffling
        ``generator``, and put ``best_dir`` back to its snapshot; None if there is none."""
        if accelerator.is_main_process and self.folder.is_dir():
            for stale in self.folder.glob(".step-*"):  # a failed save's leftovers (they may fill the disk)
                shutil.rmtree(stale, ignore_errors=True)
        ckpt = self.intact()
        if ckpt is None:
            logger.info("no checkpoint in %s: starting from the beginning", self.folder)
            return None
        accelerator.load_state(str(ckpt))
        state.load_state_dict(json.loads((ckpt / LOOP_STATE).read_text(encoding="utf-8")))
        if generator is not None and (ckpt / LOADER_RNG).is_file():
            generator.set_state(torch.load(ckpt / LOADER_RNG))
        if accelerator.is_main_process and self.best_dir is not None:
            snapshot = ckpt / BEST_SNAPSHOT
            if snapshot.is_dir():
                with atomic_dir(self.best_dir) as tmp:
                    link_tree(snapshot, tmp)
            elif self.best_dir.exists():  # saved by steps after the checkpoint, before any best
                remove_dir(self.best_dir)
        accelerator.wait_for_everyone()
        logger.info("resumed from %s (step %d, epoch %d, batch %d)", ckpt, state.global_step, state.epoch, state.batches_in_epoch)
        return ckpt


# --------------------------------------------------------------------------- the loop


class Stopwatch:
    """Adds training time to ``state.train_seconds``, without the evaluations and saves
    in between (so a checkpoint holds the time trained up to it)."""

    def __init__(self, state: LoopState) -> None:
        self.state = state
        self.since = time.perf_counter()

    def lap(self) -> None:
        now = time.perf_counter()
        self.state.train_seconds += now - self.since
        self.since = now

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.lap()
        try:
            yield
        finally:
            self.since = time.perf_counter()


def fit(
    model: nn.Module,
    step: Step,
    loader: DataLoader,
    cfg: LoopConfig,
    *,
    accelerator: Accelerator | None = None,
    evaluator: Evaluator | None = None,
    checkpoints: Checkpoints | None = None,
    resume: bool = False,
    signals: StopSignals | None = None,
) -> LoopState:
    """Train ``model`` with AdamW + linear schedule; return the loop state.

    Args:
        model: any ``nn.Module``; ``step`` decides how it is called.
        step: ``step(model, batch, backward) -> detached loss``; it gets the prepared
            model and Accelerate's ``backward`` (loss scaling, accumulation division).
        loader: training batches, shuffled by the caller; a ``generator`` attribute
            (``DataLoader(generator=...)``) is checkpointed so a resume redraws the order.
        cfg: optimiser and loop settings.
        accelerator: reuse one (e.g. built by the caller to register objects for
            checkpointing); default a new one from ``cfg``.
        evaluator: run on the unwrapped model in eval mode every ``cfg.eval_steps``
            optimiser steps and at the end, on the main process; its primary metric
            selects the best model (saved through ``checkpoints``).
        checkpoints: where the best model and, every ``cfg.save_steps``, the full training
            state go; None: nowhere.
        resume: continue from the newest checkpoint (from the start if there is none).
            Model, optimizer, scheduler, RNGs, the position in the epoch, the shuffling
            order and the best-so-far are restored, so a resumed run on CPU ends exactly
            as an uninterrupted one.
        signals: installed stop signals (:class:`~simcse_kit.guards.StopSignals`): on
            SIGTERM, SIGUSR1 or SIGINT the loop finishes the optimiser step, writes a
            checkpoint and raises :class:`~simcse_kit.guards.Stopped`.

    Raises:
        Diverged: the loss (or, but under fp16, the gradient norm) is not finite; raised
            before that step's update, so checkpoints and the best model stay good.
    """
    if evaluator is not None and not isinstance(getattr(evaluator, "primary_metric", None), str):
        raise TypeError("fit: the evaluator needs a primary_metric attribute naming the key that selects the best model")
    accelerator = accelerator or make_accelerator(cfg)
    cfg, _ = with_concrete_precision(cfg, accelerator.device.type == "cpu")
    set_seed(cfg.seed)
    # The shuffling generator: each epoch's order is drawn from it, so its state at the
    # epoch's start is part of the checkpoint.
    generator: torch.Generator | None = getattr(loader, "generator", None)
    # The loader first: the schedule's length is the optimiser steps of the loader each
    # process iterates (a share of the batches on several processes).
    loader = accelerator.prepare(loader)
    n_steps = total_steps(cfg, len(loader))
    if accelerator.is_main_process:
        logger.info("%d optimiser steps on %d process(es), %s", n_steps, accelerator.num_processes, accelerator.device)
    # The model on its device before AdamW is built: bf16 weights' fp32 masters are made
    # from it where it trains (prepare would move the model, not the masters).
    if accelerator.device_placement:
        model = model.to(accelerator.device)
    optimizer = make_optimizer(model, cfg)
    # With bf16 weights the best model is saved from the fp32 masters, not their bf16 rounding.
    fp32_weights = optimizer.fp32_model if isinstance(optimizer, MasterWeightAdamW) else nullcontext
    ticks = scheduler_ticks_per_step(accelerator, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_steps) * ticks, n_steps * ticks)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = LoopState()
    if resume and checkpoints is not None:
        checkpoints.restore(accelerator, state, generator)
    log = LoopLog(accelerator, cfg, step, state.rows_seen, state.train_seconds)
    signals = signals or StopSignals()  # not installed: never requested
    hint = f" (train.learning_rate = {cfg.learning_rate}, train.mixed_precision = {cfg.mixed_precision})"
    guard = StepGuard(
        accelerator, signals, check_grad_norm=cfg.mixed_precision != "fp16", hint=hint, due=lambda s: due_step(cfg, s, n_steps)
    )

    def evaluate() -> None:
        if evaluator is None:
            return
        model.eval()
        if accelerator.is_main_process:
            unwrapped = accelerator.unwrap_model(model)
            metrics = {"step": float(state.global_step), **evaluator(unwrapped)}
            state.evals.append(metrics)
            log.evaluation(metrics)
            score = metrics[evaluator.primary_metric]
            if state.best_step < 0:
                logger.info("step %d: %s = %.4f", state.global_step, evaluator.primary_metric, score)
            else:
                best = f"best {state.best_score:.4f} at step {state.best_step}"
                logger.info("step %d: %s = %.4f (%s)", state.global_step, evaluator.primary_metric, score, best)
            collapsed = collapse_reason(metrics, evaluator.primary_metric)
            if collapsed:
                logger.warning(
                    "step %d: the model looks collapsed (%s); not a candidate for the best model", state.global_step, collapsed
                )
            elif score > state.best_score:
                state.best_score, state.best_step = score, state.global_step
                if checkpoints is not None:
                    with fp32_weights(unwrapped):
                        checkpoints.save_best(unwrapped, metrics)
        accelerator.wait_for_everyone()
        model.train()

    show_bar = cfg.progress_bar and accelerator.is_local_main_process
    bar = tqdm(total=n_steps, initial=state.global_step, disable=not show_bar, desc="train")
    model.train()
    if cfg.eval_at_start and state.global_step == 0 and not state.evals:
        evaluate()  # step 0: the base model is a candidate for "best" like any checkpoint
    clock = Stopwatch(state)
    skip = state.batches_in_epoch  # > 0 only when resumed mid-epoch
    stop = False
    for epoch in range(state.epoch, cfg.num_epochs):
        if state.global_step >= n_steps:  # also: resumed from a checkpoint of the last step
            break
        state.epoch = epoch
        epoch_rng = generator.get_state() if generator is not None else None
        # On resume, the restored generator redraws this epoch's order and the batches
        # already trained on are skipped, so the data position is exact.
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        state.batches_in_epoch, skip = skip, 0
        for batch in batches:
            with accelerator.accumulate(model):
                loss = step(model, batch, accelerator.backward)
                # The gradient norm comes with clipping; without it, it is computed for logged steps only.
                grad_norm = None
                if accelerator.sync_gradients and cfg.max_grad_norm is not None:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                elif log.active and accelerator.sync_gradients and is_log_step(cfg, state.global_step + 1):
                    accelerator.unscale_gradients()  # fp16: the true gradients' norm, as clipping sees it
                    grad_norm = gradient_norm(model.parameters())
                if accelerator.sync_gradients:  # before the update: a non-finite step never reaches the weights
                    stop = guard(state.global_step + 1, loss, grad_norm)
                lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it next)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            state.rows_seen += batch_rows(batch) * accelerator.num_processes
            state.batches_in_epoch += 1
            if not accelerator.sync_gradients:  # mid-accumulation: no optimiser step yet
                continue
            state.global_step += 1
            bar.update(1)
            if is_log_step(cfg, state.global_step):
                # The mean over processes: each computed the loss of its own anchors.
                value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
                state.losses.append((state.global_step, value))
                clock.lap()  # the throughput so far
                log.train(state.global_step, value, lr, grad_norm, state.rows_seen, state.train_seconds)
                bar.set_postfix(loss=loss_text(value))
            last = state.global_step >= n_steps  # the final evaluation follows the loop
            if cfg.eval_steps and state.global_step % cfg.eval_steps == 0 and not last:
                with clock.paused():
                    evaluate()
            if checkpoints is not None and cfg.save_steps > 0 and state.global_step % cfg.save_steps == 0 and not last:
                with clock.paused():
                    checkpoints.save(accelerator, state, epoch_rng)
            if stop:  # a signal: a complete checkpoint of this step, then out (all processes agree on it)
                with clock.paused():
                    saved = checkpoints.save(accelerator, state, epoch_rng) if checkpoints is not None else None
                bar.close()
                log.close()
                raise Stopped(signals.requested or "a stop signal", state.global_step, saved)
            if last:
                break
    clock.lap()
    bar.close()
    evaluate()
    log.close()
    if evaluator is not None and state.best_step == 0 and state.global_step > 0:
        logger.warning(
            "no checkpoint beat the untouched model on %s (%.4f at step 0): the best model IS the base model",
            evaluator.primary_metric,
            state.best_score,
        )
    return state
