"""A small training loop with Accelerate at the edges.

The loop knows nothing about text or images: it takes a model, a DataLoader and a
``step(model, batch) -> loss``. Mixed precision, gradient accumulation and
multi-process come from Accelerate. Dev evaluation every ``eval_steps`` keeps the
best checkpoint, as SimCSE selects on STS-B dev. Every ``save_steps`` the full training
state is checkpointed (atomically) so that ``resume=True`` continues exactly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate import state as accelerate_state
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from simcse_kit.config import TrainConfig
from simcse_kit.optim import MasterWeightAdamW, bf16_training

logger = logging.getLogger(__name__)

EvalFn = Callable[[nn.Module], dict[str, float]]
ImproveFn = Callable[[nn.Module, dict[str, float]], None]
CheckpointFn = Callable[[Path], None]

KEEP_CHECKPOINTS = 2  # the newest complete one, plus one in case the newest is bad
LOOP_STATE = "loop_state.json"  # written last into a checkpoint: its presence marks it complete
LOADER_RNG = "loader_generator.pt"


@dataclass
class LoopState:
    """What the loop has done so far (saved with checkpoints, returned at the end)."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches consumed in the current epoch
    best_score: float = -math.inf
    best_step: int = -1
    examples_seen: int = 0
    train_seconds: float = 0.0
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, [tuple(v) for v in value] if key == "losses" else value)


def make_accelerator(cfg: TrainConfig, cpu: bool | None = None) -> Accelerator:
    """One Accelerator per run; mixed precision and accumulation from the config."""
    if cpu is None:
        cpu = not torch.cuda.is_available()
    # bf16 weights run the model in bf16 outright: autocast on top would only add casts.
    precision = "no" if cfg.bf16_model else cfg.mixed_precision
    # Accelerate keeps one process-wide state and refuses a second Accelerator with another
    # precision; seeds, sweeps and benchmarks train several runs (and other libraries' trainers)
    # in one process. Reset that state but keep the process group (PartialState).
    if accelerate_state.is_initialized() and str(accelerate_state.AcceleratorState().mixed_precision) != precision:
        accelerate_state.AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision=precision, gradient_accumulation_steps=cfg.grad_accum, cpu=cpu)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where the parameters' device allows (on CPU it takes
    a bf16 step's AdamW from ~170 to ~26 ms on the default model); with
    ``cfg.bf16_model`` the model is cast to bf16 (embedding tables excepted) and AdamW
    keeps fp32 masters (:func:`simcse_kit.optim.bf16_training`)."""
    groups = param_groups(model, cfg.weight_decay)
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
    if cfg.bf16_model:
        return bf16_training(model, groups, lr=cfg.learning_rate, fused=fused)
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=fused)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and norm weights (the BERT convention)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def total_steps(cfg: TrainConfig, batches_per_epoch: int) -> int:
    per_epoch = max(1, batches_per_epoch // cfg.grad_accum)
    steps = per_epoch * cfg.num_epochs
    return min(steps, cfg.max_steps) if cfg.max_steps is not None else steps


def checkpoint_step(path: Path) -> int | None:
    """``step-120`` -> 120; anything else (temp or half-deleted folders) -> None."""
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


def _remove_dir(path: Path) -> None:
    """Delete a folder so that a kill midway never leaves a partial ``step-N``:
    it is first renamed to a hidden name that ``latest_checkpoint`` ignores."""
    doomed = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def save_checkpoint(
    accelerator: Accelerator,
    folder: Path,
    state: LoopState,
    loader_rng: torch.Tensor | None,
    on_checkpoint: CheckpointFn | None = None,
) -> Path:
    """Write the full training state to ``folder/step-N`` atomically; keep the newest two.

    Model, optimizer, scheduler, scaler and every process's RNG states come from
    ``accelerator.save_state``; the loop position and best-so-far from ``state``; the
    shuffling generator's state at the start of the current epoch from ``loader_rng``.
    All processes must call this (``save_state`` writes per-process RNG files, so on
    several nodes ``folder`` must be on a shared filesystem).
    """
    final = folder / f"step-{state.global_step}"
    tmp = folder / f".step-{state.global_step}.tmp"  # same name on every process
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".step-*"):  # leftovers of a killed save or delete
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if loader_rng is not None:
            torch.save(loader_rng, tmp / LOADER_RNG)
        if on_checkpoint is not None:
            on_checkpoint(tmp)
        (tmp / LOOP_STATE).write_text(json.dumps(state.state_dict()), encoding="utf-8")
        if final.exists():  # a resumed run passing the same step again
            _remove_dir(final)
        os.replace(tmp, final)
        done = sorted((p for p in folder.iterdir() if checkpoint_step(p) is not None), key=lambda p: checkpoint_step(p) or 0)
        for old in done[:-KEEP_CHECKPOINTS]:
            _remove_dir(old)
        logger.info("saved training state at step %d to %s", state.global_step, final)
    accelerator.wait_for_everyone()
    return final


def fit(
    model: nn.Module,
    step: Callable[[nn.Module, Any], torch.Tensor],
    loader: DataLoader,
    cfg: TrainConfig,
    *,
    accelerator: Accelerator | None = None,
    evaluate: EvalFn | None = None,
    metric: str = "score",
    on_improve: ImproveFn | None = None,
    examples_in: Callable[[Any], int] = lambda batch: len(next(iter(batch.values()))),
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    on_checkpoint: CheckpointFn | None = None,
    on_resume: Callable[[Path, LoopState], None] | None = None,
) -> LoopState:
    """Train ``model`` with AdamW + linear schedule; return the loop state.

    Args:
        model: any ``nn.Module``; ``step`` decides how it is called.
        step: ``step(model, batch) -> scalar loss`` (the prepared model is passed). A
            step with ``handles_backward = True`` is called as
            ``step(model, batch, backward)`` and must call ``backward`` itself.
        loader: training batches; shuffled by the caller.
        cfg: optimiser and loop settings.
        accelerator: reuse one (e.g. built by the caller for ``prepare``); default new.
        evaluate: ``evaluate(unwrapped_model) -> metrics``, called every
            ``cfg.eval_steps`` optimiser steps and at the end, on the main process.
        metric: key of ``evaluate``'s result that selects the best checkpoint.
        on_improve: called with the unwrapped model when ``metric`` improves.
        examples_in: number of training examples in a batch (for throughput).
        checkpoint_dir: where the full training state is saved every
            ``cfg.save_steps`` optimiser steps (``step-N`` folders); None: never.
        resume: continue from the newest checkpoint in ``checkpoint_dir`` (from the
            start if there is none). Model, optimizer, scheduler, RNGs, the position
            in the epoch, the shuffling order and the best-so-far are restored, so a
            resumed run on CPU ends exactly as an uninterrupted one.
        on_checkpoint: called on the main process with the checkpoint's (temporary)
            folder before it is renamed into place, to add files (e.g. a snapshot of
            the best model).
        on_resume: called on the main process with the checkpoint folder and the
            restored state after loading.
    """
    accelerator = accelerator or make_accelerator(cfg)
    set_seed(cfg.seed)
    # The shuffling generator (DataLoader(generator=...)): each epoch's order is drawn
    # from it, so its state at the epoch's start is part of the checkpoint.
    generator: torch.Generator | None = getattr(loader, "generator", None)
    optimizer = make_optimizer(model, cfg)
    master = optimizer if isinstance(optimizer, MasterWeightAdamW) else None
    n_steps = total_steps(cfg, len(loader))
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_steps), n_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    state = LoopState()
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    skip = 0
    if resume and ckpt_dir is not None:
        ckpt = latest_checkpoint(ckpt_dir)
        if ckpt is None:
            logger.info("no checkpoint in %s: starting from the beginning", ckpt_dir)
        else:
            accelerator.load_state(str(ckpt))
            state.load_state_dict(json.loads((ckpt / LOOP_STATE).read_text(encoding="utf-8")))
            if generator is not None and (ckpt / LOADER_RNG).is_file():
                generator.set_state(torch.load(ckpt / LOADER_RNG))
            skip = state.batches_in_epoch
            if on_resume is not None and accelerator.is_main_process:
                on_resume(ckpt, state)
            accelerator.wait_for_everyone()
            logger.info("resumed from %s (step %d, epoch %d, batch %d)", ckpt, state.global_step, state.epoch, skip)

    def run_eval() -> None:
        if evaluate is None:
            return
        model.eval()
        if accelerator.is_main_process:
            metrics = {"step": float(state.global_step), **evaluate(accelerator.unwrap_model(model))}
            state.evals.append(metrics)
            score = metrics[metric]
            logger.info("step %d: %s = %.4f (best %.4f)", state.global_step, metric, score, state.best_score)
            if score > state.best_score:
                state.best_score, state.best_step = score, state.global_step
                if on_improve is not None:
                    unwrapped = accelerator.unwrap_model(model)
                    if master is None:
                        on_improve(unwrapped, metrics)
                    else:  # save the fp32 master weights, not their bf16 rounding
                        with master.fp32_model(unwrapped):
                            on_improve(unwrapped, metrics)
        accelerator.wait_for_everyone()
        model.train()

    handles_backward = getattr(step, "handles_backward", False)
    show_bar = cfg.progress_bar and accelerator.is_local_main_process
    bar = tqdm(total=n_steps, initial=state.global_step, disable=not show_bar, desc="train")
    model.train()
    start = time.perf_counter()
    done = state.global_step >= n_steps  # resumed from a checkpoint of the last step
    for epoch in range(state.epoch, cfg.num_epochs):
        if done:
            break
        state.epoch = epoch
        epoch_rng = generator.get_state() if generator is not None else None
        # On resume, the restored generator redraws this epoch's order and the batches
        # already trained on are skipped, so the data position is exact.
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        state.batches_in_epoch, skip = skip, 0
        for batch in batches:
            with accelerator.accumulate(model):
                if handles_backward:  # e.g. GradCache: it runs its own chunk-wise backward
                    loss = step(model, batch, accelerator.backward)
                else:
                    loss = step(model, batch)
                    accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            state.examples_seen += examples_in(batch) * accelerator.num_processes
            state.batches_in_epoch += 1
            if not accelerator.sync_gradients:
                continue
            state.global_step += 1
            bar.update(1)
            if state.global_step % max(1, cfg.log_steps) == 0 or state.global_step == 1:
                value = loss.detach().float().item()
                state.losses.append((state.global_step, value))
                bar.set_postfix(loss=f"{value:.4f}")
            if cfg.eval_steps and state.global_step % cfg.eval_steps == 0 and state.global_step < n_steps:
                state.train_seconds += time.perf_counter() - start
                run_eval()
                start = time.perf_counter()
            save_now = ckpt_dir is not None and cfg.save_steps > 0 and state.global_step % cfg.save_steps == 0
            if save_now and state.global_step < n_steps:
                state.train_seconds += time.perf_counter() - start
                save_checkpoint(accelerator, ckpt_dir, state, epoch_rng, on_checkpoint)
                start = time.perf_counter()
            if state.global_step >= n_steps:
                done = True
                break
        if done:
            break
    state.train_seconds += time.perf_counter() - start
    bar.close()
    run_eval()
    return state
