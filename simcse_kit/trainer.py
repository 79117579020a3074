"""A small training loop with Accelerate at the edges.

The loop knows nothing about text or images: it takes a model, a DataLoader and a
``step(model, batch) -> loss``. Mixed precision, gradient accumulation and
multi-process come from Accelerate. Dev evaluation every ``eval_steps`` keeps the
best checkpoint, as SimCSE selects on STS-B dev.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from simcse_kit.config import TrainConfig

logger = logging.getLogger(__name__)

EvalFn = Callable[[nn.Module], dict[str, float]]
ImproveFn = Callable[[nn.Module, dict[str, float]], None]


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
    return Accelerator(mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum, cpu=cpu)


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
) -> LoopState:
    """Train ``model`` with AdamW + linear schedule; return the loop state.

    Args:
        model: any ``nn.Module``; ``step`` decides how it is called.
        step: ``step(model, batch) -> scalar loss`` (the prepared model is passed).
        loader: training batches; shuffled by the caller.
        cfg: optimiser and loop settings.
        accelerator: reuse one (e.g. built by the caller for ``prepare``); default new.
        evaluate: ``evaluate(unwrapped_model) -> metrics``, called every
            ``cfg.eval_steps`` optimiser steps and at the end, on the main process.
        metric: key of ``evaluate``'s result that selects the best checkpoint.
        on_improve: called with the unwrapped model when ``metric`` improves.
        examples_in: number of training examples in a batch (for throughput).
    """
    accelerator = accelerator or make_accelerator(cfg)
    set_seed(cfg.seed)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate)
    n_steps = total_steps(cfg, len(loader))
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_steps), n_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    state = LoopState()

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
                    on_improve(accelerator.unwrap_model(model), metrics)
        accelerator.wait_for_everyone()
        model.train()

    bar = tqdm(total=n_steps, disable=not (cfg.progress_bar and accelerator.is_local_main_process), desc="train")
    model.train()
    start = time.perf_counter()
    done = False
    for epoch in range(cfg.num_epochs):
        state.epoch = epoch
        for batch in loader:
            with accelerator.accumulate(model):
                loss = step(model, batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            state.examples_seen += examples_in(batch) * accelerator.num_processes
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
            if state.global_step >= n_steps:
                done = True
                break
        if done:
            break
    state.train_seconds += time.perf_counter() - start
    bar.close()
    run_eval()
    return state
