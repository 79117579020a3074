"""Experiment tracking through Accelerate's own trackers (``train.report_to``).

What a tracked run logs, all against the optimiser step:

* ``train/loss``, ``train/learning_rate`` (the rate the step used), ``train/grad_norm``
  (before clipping) and ``train/rows_per_second`` (since the previous log; text: sentences)
  at every logged step (step 1 and every ``log_steps``);
* ``train/<name>`` for each counter of the step, when the step has a
  ``metrics() -> dict[str, float]`` method (the text run's: masked false negatives, the
  momentum queue's fill), so the loop itself stays model-agnostic;
* ``eval/<name>`` for every evaluation (STS-B dev score, alignment, uniformity), step 0,
  the untouched model, included: the alignment/uniformity trajectory starts where SimCSE's
  Figure 2 starts;
* the hyper-parameters once, at the start: the resolved config, flattened
  (:func:`simcse_kit.config.run.flat_params`).

TensorBoard writes under the logging folder the accelerator was given (a text run: its
run folder's ``logs/``; view with ``tensorboard --logdir runs/<name>/logs``). wandb is
optional; on a machine without network run it with ``WANDB_MODE=offline`` and
``wandb sync`` later.

Logging reads numbers the loop has computed anyway (plus, without clipping, one gradient
norm per logged step): it draws no random numbers and changes no computation, so a
tracked run trains exactly as an untracked one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.tracking import get_available_trackers
from accelerate.utils import LoggerType

from simcse_kit.config.run import flat_params
from simcse_kit.errors import ConfigError

__all__ = ["PROJECT", "LoopLog", "gradient_norm", "start_tracking", "stop_tracking", "tracker_names"]

logger = logging.getLogger(__name__)

PROJECT = "simcse-kit"  # TensorBoard's folder under the logging folder; wandb's project


def tracker_names(report_to: Sequence[str]) -> list[str]:
    """The trackers ``report_to`` asks for (``"none"`` dropped), each checked to be one of
    Accelerate's and installed here: Accelerate itself would silently skip a missing one.

    Raises:
        ConfigError: an unknown tracker, or one whose package is not installed.
    """
    names = [name.strip().lower() for name in report_to if name.strip().lower() != "none"]
    available = {str(tracker) for tracker in get_available_trackers()}
    for name in names:
        if name not in LoggerType.list():
            raise ConfigError(f"config key 'train.report_to': unknown tracker {name!r}; Accelerate's are {LoggerType.list()}")
        if name != "all" and name not in available:
            hint = "pip install 'simcse-kit[track]'" if name == "tensorboard" else f"pip install {name}"
            raise ConfigError(f"config key 'train.report_to': {name!r} is not installed here ({hint}; or --report-to none)")
    return names


def start_tracking(accelerator: Accelerator, config: Any, run_name: str | None = None) -> bool:
    """Start the accelerator's trackers with ``config`` (a config dataclass) as the run's
    hyper-parameters; True if this call started them.

    A no-op without trackers, when they are already running, and off the main process
    (where Accelerate keeps none).
    """
    if not accelerator.log_with or accelerator.trackers or not accelerator.is_main_process:
        return False
    init_kwargs: dict[str, dict[str, Any]] = {}
    if accelerator.logging_dir is not None:
        # wandb writes into ./wandb unless told: keep its files in the run folder too.
        Path(accelerator.logging_dir).mkdir(parents=True, exist_ok=True)
        init_kwargs["wandb"] = {"dir": str(accelerator.logging_dir)} | ({"name": run_name} if run_name else {})
    accelerator.init_trackers(PROJECT, config=flat_params(config), init_kwargs=init_kwargs)
    logger.info("experiment tracking: %s under %s", ", ".join(t.name for t in accelerator.trackers), accelerator.logging_dir)
    return True


def stop_tracking(accelerator: Accelerator) -> None:
    """Finish and forget the accelerator's trackers (files flushed and closed).

    Not ``accelerator.end_training()``: that also destroys the process group, and seeds
    and sweeps train several runs in one process.
    """
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers.clear()


def gradient_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The total L2 norm of the parameters' gradients, in fp32 (what clipping measures)."""
    norms = [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32) for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


class LoopLog:
    """The training loop's side of tracking (:func:`simcse_kit.training.engine.loop.fit`).

    Inactive, and free, when the accelerator has no trackers and off the main process.
    If the trackers are not running yet it starts them with ``hparams`` (the loop's
    config) and :meth:`close` finishes them; a caller that started them itself (a text
    run, with its whole config) finishes them itself.

    Args:
        accelerator: the run's accelerator (``log_with`` names its trackers).
        hparams: the config dataclass logged as hyper-parameters if the trackers start here.
        step: the loop's step; its ``metrics()`` counters are logged when it has one.
        rows_seen: rows trained on so far (non-zero on resume), for throughput.
        seconds: training seconds so far.
    """

    def __init__(self, accelerator: Accelerator, hparams: Any, step: Any, rows_seen: int = 0, seconds: float = 0.0) -> None:
        self.accelerator = accelerator
        self.active = accelerator.is_main_process and bool(accelerator.log_with)
        self.owns = self.active and start_tracking(accelerator, hparams)
        metrics = getattr(step, "metrics", None)
        self.step_metrics: Callable[[], Mapping[str, float]] | None = metrics if callable(metrics) else None
        self.rows, self.seconds = rows_seen, seconds

    def train(
        self, step: int, loss: float, lr: float, grad_norm: torch.Tensor | float | None, rows_seen: int, seconds: float
    ) -> None:
        """Log a training step's numbers (``seconds``: training time so far, without evaluations)."""
        if not self.active:
            return
        values = {"train/loss": loss, "train/learning_rate": lr}
        if grad_norm is not None:
            values["train/grad_norm"] = float(grad_norm)
        if seconds > self.seconds:
            values["train/rows_per_second"] = (rows_seen - self.rows) / (seconds - self.seconds)
        self.rows, self.seconds = rows_seen, seconds
        if self.step_metrics is not None:
            values |= {f"train/{name}": float(value) for name, value in self.step_metrics().items()}
        self.accelerator.log(values, step=step)

    def evaluation(self, metrics: Mapping[str, float]) -> None:
        """Log an evaluation's metrics at its ``metrics["step"]``."""
        if self.active:
            values = {f"eval/{name}": float(value) for name, value in metrics.items() if name != "step"}
            self.accelerator.log(values, step=int(metrics["step"]))

    def close(self) -> None:
        """Finish the trackers if they were started here."""
        if self.owns:
            stop_tracking(self.accelerator)
