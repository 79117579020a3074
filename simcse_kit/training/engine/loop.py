"""A small training loop with Accelerate at the edges.

The loop knows nothing about text or images. As in accelerate's examples, the caller
builds what is trained before the loop: an Accelerator (:func:`make_accelerator`, the
precision already decided), then :func:`prepare` seeds and builds AdamW and the linear
schedule, and ``accelerator.prepare`` takes them with the model and the DataLoader.
:func:`fit` then only loops:

- a step is any callable ``step(model, batch, backward) -> loss`` that computes the
  loss, calls ``backward(loss)`` itself and returns the detached loss (GradCache calls
  it once on the full-batch loss, then pushes cached gradients through chunks);
- an evaluator is any callable ``evaluator(model) -> dict[str, float]`` with a
  ``primary_metric`` attribute naming the key that selects the best model (the
  sentence-transformers convention), run every ``eval_steps`` and at the end;
- :class:`~simcse_kit.training.engine.checkpoints.Checkpoints` owns the run's ``step-N`` folders (the
  full training state every ``save_steps``, so that ``resume=True`` continues exactly)
  *and* the best model;
- the accelerator's experiment trackers (``cfg.report_to``) get the loop's numbers, the
  step's own ``metrics()`` and every evaluation against the step (:mod:`simcse_kit.training.engine.tracking`).

Mixed precision, gradient accumulation and multi-process come from Accelerate.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate import state as accelerate_state
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, ProjectConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from simcse_kit.config.run import AUTO, LoopConfig
from simcse_kit.data.pipeline import loader_options
from simcse_kit.errors import ConfigError
from simcse_kit.model.fastpath.bf16 import bf16_training
from simcse_kit.model.fastpath.internals import reset_accelerate_state
from simcse_kit.training.engine.checkpoints import Checkpoints, LoopState
from simcse_kit.training.engine.engines import Engine, FullCopy, check_engine, check_requested, engine_of
from simcse_kit.training.engine.guards import StepGuard, Stopped, StopSignals
from simcse_kit.training.engine.selection import Evaluator, Selection
from simcse_kit.training.engine.steps import Step
from simcse_kit.training.engine.tracking import LoopLog, gradient_norm, tracker_names

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- building blocks


def loss_text(value: float) -> str:
    """The progress bar's loss: three significant digits, since a fine-tuned model's unsup
    loss sits at 1e-4..1e-2 and a fixed four decimals would show it as 0.0000."""
    return f"{value:.3g}"


def make_accelerator(cfg: LoopConfig, cpu: bool | None = None, logging_dir: str | Path | None = None) -> Accelerator:
    """One Accelerator per run; mixed precision, accumulation and the experiment trackers
    (``cfg.report_to``, checked: :func:`simcse_kit.training.engine.tracking.tracker_names`) from the config.

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
    if AUTO in (cfg.mixed_precision, cfg.bf16_weights):
        # Decided once, by the caller, before anything records the config (a text run:
        # simcse_kit.training.wiring.folder.with_concrete_precision); optimiser and loop read the same values.
        raise ValueError(
            f"make_accelerator: mixed_precision = {cfg.mixed_precision!r}, bf16_weights = {cfg.bf16_weights!r}: "
            "decide 'auto' for this machine first (simcse_kit.model.precision.resolve_precision)"
        )
    check_requested(cpu)  # Accelerate itself would fail (DeepSpeed) or quietly not shard (FSDP)
    # bf16 weights run the model in bf16 outright: autocast on top would only add casts.
    precision = "no" if cfg.bf16_model else cfg.mixed_precision
    # Accelerate keeps one process-wide state and refuses a second Accelerator with another
    # precision; seeds, sweeps and benchmarks train several runs (and other libraries' trainers)
    # in one process. Reset that state but keep the process group.
    if accelerate_state.is_initialized() and str(accelerate_state.AcceleratorState().mixed_precision) != precision:
        reset_accelerate_state()
    return Accelerator(
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.collective_timeout_s))],
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.grad_accum,
        cpu=cpu,
        # Asynchronous host-to-device copies of the (pinned) batches on CUDA.
        dataloader_config=DataLoaderConfiguration(non_blocking=loader_options("cpu" if cpu else "cuda").non_blocking),
        log_with=trackers or None,
        project_config=ProjectConfiguration(logging_dir=str(logging_dir)) if logging_dir is not None else None,
    )


def start_processes(cfg: LoopConfig, cpu: bool | None = None) -> None:
    """Under a launcher (``WORLD_SIZE`` > 1: torchrun, ``accelerate launch``), join the
    launch's process group now, with ``cfg.collective_timeout_s`` as every collective's
    timeout; one process: nothing. Whatever starts the group first sets its timeout (the
    precision's agreement, the teacher's cache, the Accelerator all reuse it), so a text
    run calls this before any of them."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        cpu = not torch.cuda.is_available() if cpu is None else cpu
        accelerate_state.PartialState(cpu=cpu, timeout=timedelta(seconds=cfg.collective_timeout_s))


def make_optimizer(model: nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where the parameters' device allows (the per-parameter
    loop it replaces is several times slower on CPU); with
    ``cfg.bf16_model`` the model is cast to bf16 (embedding tables excepted) and AdamW
    keeps fp32 masters (:func:`simcse_kit.model.fastpath.bf16.bf16_training`), its embedding
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
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def total_steps(cfg: LoopConfig, batches_per_epoch: int) -> int:
    """The optimiser steps of a run: ``ceil(batches_per_epoch / grad_accum)`` an epoch (Accelerate
    also steps on an epoch's last, shorter accumulation: the end of the loader syncs the
    gradients), times the epochs, cut to ``cfg.max_steps`` when set."""
    per_epoch = max(1, math.ceil(batches_per_epoch / cfg.grad_accum))
    steps = per_epoch * cfg.num_epochs
    return min(steps, cfg.max_steps) if cfg.max_steps else steps  # None or 0: no limit


def scheduler_ticks_per_step(accelerator: Accelerator, cfg: LoopConfig) -> int:
    """How many times the prepared scheduler moves per optimiser step of :func:`fit`.

    Under DeepSpeed the engine steps the schedule itself, once per optimiser step (the
    prepared scheduler's own ``step`` does nothing).

    Accelerate's scheduler wrapper steps the schedule once per process at each optimiser
    step (``num_processes`` times; once with ``split_batches``), since it expects a
    schedule sized by the unsharded loader; without ``step_scheduler_with_optimizer`` it
    moves at every call, i.e. every micro-batch. A schedule built for ``n`` optimiser steps
    is made ``n`` times this long, so every process count follows the same rate per step.
    """
    if engine_of(accelerator).steps_in_backward:
        return 1
    if not accelerator.step_scheduler_with_optimizer:
        return cfg.grad_accum
    return 1 if accelerator.split_batches else accelerator.num_processes


def due_step(cfg: LoopConfig, step: int, n_steps: int) -> bool:
    """Whether optimiser step ``step`` reads the device anyway (log, evaluation, checkpoint
    or last step): where a CUDA run's divergence flags are read back."""
    return is_log_step(cfg, step) or step >= n_steps or due(cfg.eval_steps, step) or due(cfg.save_steps, step)


def is_log_step(cfg: LoopConfig, step: int) -> bool:
    """Whether optimiser step ``step`` records its loss (and reports to trackers): the
    first step, then every ``cfg.log_steps``."""
    return step % max(1, cfg.log_steps) == 0 or step == 1


def batch_rows(batch: Any) -> int:
    """Rows of a batch: of its first tensor for a dict batch (all its tensors share the
    row count), else ``len(batch)``."""
    return len(next(iter(batch.values()))) if isinstance(batch, Mapping) else len(batch)


# --------------------------------------------------------------------------- the caller's side


@dataclass
class Prepared:
    """What :func:`fit` trains: the accelerator and what it prepared (:func:`prepare`).

    Attributes:
        accelerator: the run's Accelerator.
        model: the model as ``accelerator.prepare`` returned it (``step`` gets this one).
        optimizer: AdamW over the model's parameter groups, prepared.
        scheduler: the linear warm-up and decay, prepared.
        loader: the training batches, prepared (a share of them on each process).
        n_steps: the optimiser steps the loop takes (the schedule's length).
        generator: the loader's shuffling generator (``DataLoader(generator=...)``): each
            epoch's order is drawn from it, so its state is checkpointed; None: no such one.
        engine: how the processes hold the model (DDP, FSDP, DeepSpeed: :mod:`simcse_kit.training.engine.engines`).
        full_copy: with sharded weights, the unsharded copy that evaluations and the best
            model use (:class:`~simcse_kit.training.engine.engines.FullCopy`); None otherwise.
    """

    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: DataLoader
    n_steps: int
    generator: torch.Generator | None
    engine: Engine
    full_copy: FullCopy | None


def prepare(model: nn.Module, loader: DataLoader, cfg: LoopConfig, accelerator: Accelerator | None = None) -> Prepared:
    """Seed, build AdamW and the linear schedule, and prepare them with ``model`` and ``loader``.

    The order of accelerate's examples: optimizer and schedule exist before
    ``accelerator.prepare`` sees them, the schedule sized by the prepared loader.

    Args:
        model: any ``nn.Module``.
        loader: training batches, shuffled by the caller (a ``generator`` attribute is
            checkpointed so that a resume redraws the order).
        cfg: optimiser and loop settings, precision decided.
        accelerator: the run's (e.g. built by the caller to register objects for
            checkpointing); default a new one from ``cfg``.
    """
    accelerator = accelerator or make_accelerator(cfg)
    engine = engine_of(accelerator)
    check_engine(engine, loop_settings(cfg, accelerator))
    set_seed(cfg.seed)
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
    ticks = scheduler_ticks_per_step(accelerator, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_steps) * ticks, n_steps * ticks)
    # Taken before prepare shards the weights (FSDP shards the module in place).
    full_copy = FullCopy(model, accelerator) if engine.shards_weights else None
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if engine.name != "DDP" and accelerator.is_main_process:
        logger.info("engine: %s", engine.name)
    return Prepared(accelerator, model, optimizer, scheduler, loader, n_steps, generator, engine, full_copy)


def loop_settings(cfg: LoopConfig, accelerator: Accelerator) -> dict[str, Any]:
    """The loop's settings that :func:`~simcse_kit.training.engine.engines.check_engine` checks."""
    return {
        "train.bf16_weights": cfg.bf16_weights,
        "train.max_grad_norm": cfg.max_grad_norm,
        "train.grad_accum": cfg.grad_accum,
        "accelerate.gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
    }


# --------------------------------------------------------------------------- the loop


def epoch_batches(run: Prepared, cfg: LoopConfig, state: LoopState) -> Iterator[tuple[torch.Tensor | None, Any]]:
    """The micro-batches left to train on, each with the shuffling generator's state at
    the start of its epoch (what a checkpoint keeps, so a resume redraws that order).

    Picks up at ``state``'s epoch and batch: on resume the restored generator redraws the
    epoch's order and the batches already trained on are skipped, so the data position is
    exact. No new epoch starts once ``run.n_steps`` steps are done.
    """
    skip = state.batches_in_epoch  # > 0 only when resumed mid-epoch
    for epoch in range(state.epoch, cfg.num_epochs):
        if state.global_step >= run.n_steps:  # also: resumed from a checkpoint of the last step
            return
        state.epoch = epoch
        epoch_rng = run.generator.get_state() if run.generator is not None else None
        batches = run.accelerator.skip_first_batches(run.loader, skip) if skip else run.loader
        state.batches_in_epoch, skip = skip, 0
        for batch in batches:
            yield epoch_rng, batch


def step_grad_norm(run: Prepared, cfg: LoopConfig, wanted: bool) -> torch.Tensor | None:
    """At an optimiser step, the gradient norm: it comes with clipping (``cfg.max_grad_norm``);
    without clipping it is computed only when ``wanted`` (a logged step). None otherwise."""
    if not run.accelerator.sync_gradients:
        return None
    if run.engine.steps_in_backward:
        # DeepSpeed clipped (its gradient_clipping, checked equal to max_grad_norm) and
        # stepped inside backward; this is the norm it measured.
        norm = run.accelerator.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm or 0.0)  # max_norm unused
        return None if norm is None else torch.as_tensor(norm, dtype=torch.float32)
    if cfg.max_grad_norm is not None:
        return run.accelerator.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm)
    if run.engine.shards_weights and wanted:
        # Each process holds a shard of every gradient: the total norm is Accelerate's
        # (DTensor-aware) clipping's, with a bound that never clips.
        return run.accelerator.clip_grad_norm_(run.model.parameters(), float("inf"))
    if wanted:
        run.accelerator.unscale_gradients()  # fp16: the true gradients' norm, as clipping sees it
        return gradient_norm(run.model.parameters())
    return None


def step_guard(accelerator: Accelerator, cfg: LoopConfig, n_steps: int, signals: StopSignals | None) -> StepGuard:
    """The loop's check at each optimiser step: a stop requested through ``signals`` (None:
    never), a non-finite loss or (but under fp16, whose loss scaler skips such steps by
    design) gradient norm, read back on one CUDA device only on :func:`due_step` steps;
    the message names the settings worth checking."""
    hint = f" (train.learning_rate = {cfg.learning_rate}, train.mixed_precision = {cfg.mixed_precision})"
    check_grad_norm, due = cfg.mixed_precision != "fp16", partial(due_step, cfg, n_steps=n_steps)
    return StepGuard(accelerator, signals or StopSignals(), check_grad_norm=check_grad_norm, hint=hint, due=due)


def due(every: int, step: int) -> bool:
    """Whether something done every ``every`` optimiser steps (0: never) is due at ``step``."""
    return every > 0 and step % every == 0


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


class Progress:
    """What the loop shows and records per optimiser step: the progress bar and, every
    ``cfg.log_steps``, the loss (in the state, and for the trackers: :class:`LoopLog`)."""

    def __init__(self, run: Prepared, cfg: LoopConfig, step: Step, state: LoopState) -> None:
        self.accelerator, self.cfg = run.accelerator, cfg
        self.log = LoopLog(run.accelerator, cfg, step, state.rows_seen, state.train_seconds)
        show_bar = cfg.progress_bar and run.accelerator.is_local_main_process
        self.bar = tqdm(total=run.n_steps, initial=state.global_step, disable=not show_bar, desc="train")

    def wants_grad_norm(self, state: LoopState) -> bool:
        """Whether the coming optimiser step is logged to trackers (its gradient norm with it)."""
        return self.log.active and is_log_step(self.cfg, state.global_step + 1)

    def record(self, state: LoopState, loss: torch.Tensor, lr: float, grad_norm: torch.Tensor | None, clock: Stopwatch) -> None:
        self.bar.update(1)
        if is_log_step(self.cfg, state.global_step):
            # The mean over processes: each computed the loss of its own anchors.
            value = self.accelerator.reduce(loss.detach().float(), reduction="mean").item()
            state.losses.append((state.global_step, value))
            clock.lap()  # the throughput so far
            self.log.train(state.global_step, value, lr, grad_norm, state.rows_seen, state.train_seconds)
            self.bar.set_postfix(loss=loss_text(value))

    def close(self) -> None:
        self.bar.close()
        self.log.close()


def fit(
    run: Prepared,
    step: Step,
    cfg: LoopConfig,
    *,
    evaluator: Evaluator | None = None,
    checkpoints: Checkpoints | None = None,
    resume: bool = False,
    signals: StopSignals | None = None,
) -> LoopState:
    """Train ``run.model`` for ``run.n_steps`` optimiser steps; return the loop state.

    ``step`` gets the prepared model and Accelerate's ``backward``. ``evaluator`` runs every
    ``cfg.eval_steps`` and at the end, selecting the best model (:class:`~simcse_kit.training.engine.selection.Selection`);
    ``checkpoints`` keeps it, and the full training state every ``cfg.save_steps``, which
    ``resume`` continues from exactly (model, optimizer, schedule, RNGs, data position, best).
    Installed ``signals`` (SIGTERM, SIGUSR1, SIGINT) end the optimiser step, write a checkpoint
    and raise :class:`~simcse_kit.training.engine.guards.Stopped`.

    Raises:
        Diverged: the loss (or, but under fp16, the gradient norm) is not finite; raised
            before that step's update, so checkpoints and the best model stay good.
    """
    accelerator, model, optimizer, state = run.accelerator, run.model, run.optimizer, LoopState()
    if resume and checkpoints is not None:
        checkpoints.restore(accelerator, state, run.generator)
    progress = Progress(run, cfg, step, state)
    guard = step_guard(accelerator, cfg, run.n_steps, signals)
    evaluate = Selection(accelerator, model, optimizer, evaluator, checkpoints, progress.log, run.full_copy)
    evaluate.resumed(state)
    model.train()
    if cfg.eval_at_start and state.global_step == 0 and not state.evals:
        evaluate(state)  # step 0: the base model is a candidate for "best" like any checkpoint
    clock = Stopwatch(state)
    for epoch_rng, batch in epoch_batches(run, cfg, state):
        with accelerator.accumulate(model):
            loss = step(model, batch, accelerator.backward)
            grad_norm = step_grad_norm(run, cfg, progress.wants_grad_norm(state))
            # Before the update: a non-finite step never reaches the weights.
            stop = accelerator.sync_gradients and guard(state.global_step + 1, loss, grad_norm)
            lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it next)
            optimizer.step()
            run.scheduler.step()
            optimizer.zero_grad()
        state.rows_seen += batch_rows(batch) * accelerator.num_processes
        state.batches_in_epoch += 1
        if not accelerator.sync_gradients:  # mid-accumulation: no optimiser step yet
            continue
        state.global_step += 1
        progress.record(state, loss, lr, grad_norm, clock)
        last = state.global_step >= run.n_steps  # the final evaluation follows the loop
        if due(cfg.eval_steps, state.global_step) and not last:
            with clock.paused():
                evaluate(state)
        saved = None
        if checkpoints is not None and (stop or (due(cfg.save_steps, state.global_step) and not last)):
            with clock.paused():
                saved = checkpoints.save(accelerator, state, epoch_rng)
        if stop:  # a signal: a complete checkpoint of this step, then out (all processes agree on it)
            progress.close()
            raise Stopped(guard.signals.requested or "a stop signal", state.global_step, saved)
        if last:
            break
    clock.lap()
    progress.bar.close()
    evaluate(state)  # the final model is a candidate too
    progress.log.close()
    evaluate.warn_if_untouched_best(state)
    return state
