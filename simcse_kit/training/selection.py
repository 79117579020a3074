"""The loop's evaluations and the best model they select.

An evaluator is any callable ``evaluator(model) -> dict[str, float]`` with a
``primary_metric`` attribute naming the key that selects the best model (the
sentence-transformers convention). :class:`Selection` runs it for
:func:`simcse_kit.training.loop.fit` (every ``eval_steps``, at the end and, with
``eval_at_start``, on the untouched model), records the metrics and keeps the best model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from torch import nn

from simcse_kit.model.fastpath.bf16 import MasterWeightAdamW
from simcse_kit.training.checkpoints import Checkpoints, LoopState
from simcse_kit.training.engines import FullCopy
from simcse_kit.training.guards import collapse_reason
from simcse_kit.training.tracking import LoopLog

logger = logging.getLogger(__name__)


class Evaluator(Protocol):
    """``evaluator(model) -> metrics``; ``metrics[evaluator.primary_metric]`` selects the best."""

    primary_metric: str

    def __call__(self, model: nn.Module) -> dict[str, float]: ...


class Selection:
    """The loop's evaluations: ``evaluator`` on the unwrapped model in eval mode, on the
    main process; the metrics recorded and logged; the best model so far (never a
    collapsed one: :func:`~simcse_kit.training.guards.collapse_reason`) saved through ``checkpoints``.

    Args:
        accelerator: the run's Accelerator.
        model: the prepared model (evaluated unwrapped, then put back in train mode).
        optimizer: the prepared optimizer (with bf16 weights it holds the fp32 masters).
        evaluator: None: nothing is evaluated, nothing selected.
        checkpoints: where the best model is saved; None: it is tracked, not saved.
        log: the loop's trackers (every evaluation's metrics are logged).
        full_copy: with sharded weights (FSDP, ZeRO-3), the unsharded copy that is
            refreshed from the shards (all processes take part), then evaluated and saved
            on the main process; None: the prepared model is unwrapped instead.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        evaluator: Evaluator | None,
        checkpoints: Checkpoints | None,
        log: LoopLog,
        full_copy: FullCopy | None = None,
    ) -> None:
        if evaluator is not None and not isinstance(getattr(evaluator, "primary_metric", None), str):
            raise TypeError("fit: the evaluator needs a primary_metric attribute naming the key that selects the best model")
        self.accelerator, self.model, self.evaluator, self.checkpoints, self.log = accelerator, model, evaluator, checkpoints, log
        self.full_copy = full_copy
        # With bf16 weights the best model is saved from the fp32 masters, not their bf16
        # rounding (the prepared optimizer wraps the one that holds them).
        masters = getattr(optimizer, "optimizer", optimizer)
        self.fp32_weights: Callable[[nn.Module], AbstractContextManager[Any]] = (
            masters.fp32_model if isinstance(masters, MasterWeightAdamW) else nullcontext
        )

    def __call__(self, state: LoopState) -> None:
        if self.evaluator is None:
            return
        accelerator, model, metric = self.accelerator, self.model, self.evaluator.primary_metric
        model.eval()
        # Sharded weights: every process sends its shards (a collective), the main process
        # evaluates the whole model. Otherwise each process holds it all already.
        full = self.full_copy.refresh(model) if self.full_copy is not None else None
        if accelerator.is_main_process:
            unwrapped = full if full is not None else accelerator.unwrap_model(model)
            unwrapped.eval()
            metrics = {"step": float(state.global_step), **self.evaluator(unwrapped)}
            state.evals.append(metrics)
            self.log.evaluation(metrics)
            score = metrics[metric]
            if state.best_step < 0:
                logger.info("step %d: %s = %.4f", state.global_step, metric, score)
            else:
                best = f"best {state.best_score:.4f} at step {state.best_step}"
                logger.info("step %d: %s = %.4f (%s)", state.global_step, metric, score, best)
            collapsed = collapse_reason(metrics, metric)
            if collapsed:
                logger.warning(
                    "step %d: the model looks collapsed (%s); not a candidate for the best model", state.global_step, collapsed
                )
            elif score > state.best_score:
                state.best_score, state.best_step = score, state.global_step
                if self.checkpoints is not None:
                    with self.fp32_weights(unwrapped):
                        self.checkpoints.save_best(unwrapped, metrics)
        if self.full_copy is not None:
            self.full_copy.release()
        accelerator.wait_for_everyone()
        model.train()

    def warn_if_untouched_best(self, state: LoopState) -> None:
        if self.evaluator is not None and state.best_step == 0 and state.global_step > 0:
            logger.warning(
                "no checkpoint beat the untouched model on %s (%.4f at step 0): the best model IS the base model",
                self.evaluator.primary_metric,
                state.best_score,
            )
