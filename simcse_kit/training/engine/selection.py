"""The loop's evaluations and the best model they select.

An evaluator is any callable ``evaluator(model) -> dict[str, float]`` with a
``primary_metric`` attribute naming the key that selects the best model (the
sentence-transformers convention) and, optionally, a ``metric_label`` saying what that
metric measures ("SICK trial Spearman x 100"). :class:`Selection` runs it for
:func:`simcse_kit.training.engine.loop.fit` (every ``eval_steps``, at the end and, with
``eval_at_start``, on the untouched model), records the metrics and keeps the best model.

A run folder names what selected it: ``metrics.json`` holds ``dev_metric`` (the key of
each evaluation), ``dev_label`` and ``best_dev_score``; the best model's metadata
``dev_metric``, ``dev_label`` and ``dev_score``. :func:`dev_selection` reads either, and
the ``best_stsb_dev`` / ``stsb_dev`` keys of folders written before the metric was named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from torch import nn

from simcse_kit.model.fastpath.bf16 import MasterWeightAdamW
from simcse_kit.training.engine.checkpoints import Checkpoints, LoopState
from simcse_kit.training.engine.engines import FullCopy
from simcse_kit.training.engine.guards import collapse_reason
from simcse_kit.training.engine.tracking import LoopLog

logger = logging.getLogger(__name__)

# What a run folder written before the dev metric was named holds: its dev score was
# always stored under these keys, whatever the dev data (STS-B dev by default).
LEGACY_DEV_METRIC = "stsb_dev"
LEGACY_DEV_LABEL = "STS-B dev Spearman x 100"


class Evaluator(Protocol):
    """``evaluator(model) -> metrics``; ``metrics[evaluator.primary_metric]`` selects the best."""

    @property
    def primary_metric(self) -> str: ...  # an attribute or a property

    def __call__(self, model: nn.Module) -> dict[str, float]: ...


def metric_label(evaluator: Any) -> str:
    """What ``evaluator``'s primary metric measures: its ``metric_label``, else the key itself."""
    label = getattr(evaluator, "metric_label", None)
    return label if isinstance(label, str) else str(evaluator.primary_metric)


@dataclass(frozen=True)
class DevSelection:
    """What selected a run's best model, as its folder records it.

    Attributes:
        metric: the key of the dev score in each evaluation (``metrics.json``'s ``evals``).
        label: what it measures, e.g. ``"SICK trial Spearman x 100"``.
        best: the best model's score; None where the folder has none (no usable evaluation).
    """

    metric: str
    label: str
    best: float | None


def dev_selection(
    metrics: Mapping[str, Any], meta: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None
) -> DevSelection:
    """The dev selection of a run from its ``metrics.json`` (and, where that lacks it, the
    best model's metadata ``meta``).

    Folders written before the metric was named hold ``best_stsb_dev`` / ``stsb_dev``
    whatever the dev data: the run config's ``data`` section, where given, says what that
    was (``dev_format: sick`` or ``beir``); without it they read as STS-B dev, the default.

    Args:
        metrics: ``metrics.json`` as read (may be empty).
        meta: the best model's ``simcse_config.json`` as read, or None.
        data: the ``data:`` section of the run's ``config.yaml``, or None.
    """
    meta = meta or {}
    for source, score_key in ((metrics, "best_dev_score"), (meta, "dev_score")):
        if "dev_metric" in source:
            score = source.get(score_key)
            label = source.get("dev_label", source["dev_metric"])
            return DevSelection(str(source["dev_metric"]), str(label), None if score is None else float(score))
    score = metrics.get("best_stsb_dev", meta.get(LEGACY_DEV_METRIC))
    return DevSelection(LEGACY_DEV_METRIC, legacy_dev_label(data or {}), None if score is None else float(score))


def legacy_dev_label(data: Mapping[str, Any]) -> str:
    """What an older run's ``stsb_dev`` measured, from its config's ``data`` section."""
    fmt, dev_file = data.get("dev_format") or "stsb", data.get("dev_file")
    if fmt == "sick":
        return "SICK trial Spearman x 100"
    if fmt == "beir" and dev_file:
        return f"{Path(str(dev_file)).name} nDCG@10 x 100"
    return LEGACY_DEV_LABEL


def adopt_legacy_evals(evals: list[dict[str, float]], metric: str) -> int:
    """Put the dev score of evaluations restored from a checkpoint written before the metric
    was named (under ``stsb_dev``, whatever the dev data) under ``metric`` (a retrieval dev
    split had it there too: the copy is dropped), so a resumed run's curve and metrics hold
    one key; returns how many evaluations changed."""
    changed = 0
    if metric == LEGACY_DEV_METRIC:
        return changed
    for entry in evals:
        if LEGACY_DEV_METRIC in entry:
            entry.setdefault(metric, entry.pop(LEGACY_DEV_METRIC))
            changed += 1
    return changed


class Selection:
    """The loop's evaluations: ``evaluator`` on the unwrapped model in eval mode, on the
    main process; the metrics recorded and logged; the best model so far (never a
    collapsed one: :func:`~simcse_kit.training.engine.guards.collapse_reason`) saved through ``checkpoints``.

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
        # rounding (the prepared optimizer wraps the one that holds them), through an fp32
        # copy: the main process alone saves, and casting the trained model itself would
        # unhook it from DDP (MasterWeightAdamW.fp32_model says how).
        masters = getattr(optimizer, "optimizer", optimizer)
        self.fp32_weights: Callable[[nn.Module], AbstractContextManager[nn.Module]] = (
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
                    with self.fp32_weights(unwrapped) as weights:
                        self.checkpoints.save_best(weights, metrics)
        if self.full_copy is not None:
            self.full_copy.release()
        accelerator.wait_for_everyone()
        model.train()

    def resumed(self, state: LoopState) -> None:
        """After a restore: evaluations of an older checkpoint take the evaluator's metric key."""
        if self.evaluator is not None and adopt_legacy_evals(state.evals, self.evaluator.primary_metric):
            logger.info("restored evaluations: their %s is now %s", LEGACY_DEV_METRIC, self.evaluator.primary_metric)

    def warn_if_untouched_best(self, state: LoopState) -> None:
        if self.evaluator is not None and state.best_step == 0 and state.global_step > 0:
            logger.warning(
                "no checkpoint beat the untouched model on %s (%.4f at step 0): the best model IS the base model",
                self.evaluator.primary_metric,
                state.best_score,
            )
