"""The step contract: what the training loop calls once per batch, and a text run's steps.

A *step* is any callable ``step(model, batch, backward) -> loss`` (:class:`Step`): it
computes the loss, calls ``backward(loss)`` itself and returns the detached loss. The loop
(:func:`simcse_kit.training.engine.loop.fit`) passes Accelerate's backward (loss scaling, division by
the accumulation steps) and knows nothing else about the step: the digits demo trains an
image encoder through the same contract. Every step here also takes ``backward=None``,
which means plain ``loss.backward()`` (:func:`backpropagate`), and has ``metrics() ->
dict[str, float]``: the counters a tracked run logs (:mod:`simcse_kit.training.engine.tracking`).

A text run has three steps, all around an :class:`Objective` (the seam
:class:`~simcse_kit.training.objective.objectives.SimCSEObjective` offers: ``embed`` runs the encoder,
``loss`` only the loss core, so the steps below never look inside either):

* the plain step, the objective itself (:meth:`SimCSEObjective.step
  <simcse_kit.training.objective.objectives.SimCSEObjective.step>`): embed, loss, backward;
* :class:`GradCacheStep`: the same loss and gradients for batches larger than activation
  memory allows (the method: :mod:`simcse_kit.training.objective.gradcache`);
* :class:`MomentumQueueStep`: the loss with a momentum encoder's past embeddings as extra
  negatives (the queue: :mod:`simcse_kit.training.objective.momentum_queue`).

:func:`simcse_kit.training.wiring.run.make_step` picks one from the config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from simcse_kit.core import distributed
from simcse_kit.core.batch import model_inputs, view_rows
from simcse_kit.model.modeling import compute_dtype
from simcse_kit.training.objective.gradcache import RngState, chunk_slices, effective_negatives, model_chunk
from simcse_kit.training.objective.momentum_queue import MomentumQueue

__all__ = [
    "Backward",
    "Batch",
    "BatchObjective",
    "GradCacheStep",
    "MomentumQueueStep",
    "Objective",
    "ObjectiveStep",
    "Queue",
    "Step",
    "backpropagate",
]

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
"""A collated batch: ``input_ids``, ``attention_mask`` ``[B, T]``, optional ``text_ids``
``[B]``, ``teacher_rows`` and ``guide_rows`` ``[B]``, a scored mode's ``scores`` ``[N]`` (one per example) and a
packing plan (:mod:`simcse_kit.core.batch`)."""
Backward = Callable[[torch.Tensor], None]
"""``backward(loss)``: Accelerate's in a run, ``loss.backward()`` by default."""


class Queue(NamedTuple):
    """Extra negatives without gradient (the momentum queue): ``[Q, H]`` rows, their ``[Q]``
    text ids (false-negative masking) and ``[Q]`` rows of the guide's table (``loss.guide``)."""

    rows: torch.Tensor
    text_ids: torch.Tensor | None = None
    guide_rows: torch.Tensor | None = None


class Step(Protocol):
    """What the loop calls once per batch: ``backward(loss)``, then the detached loss."""

    def __call__(self, model: nn.Module, batch: Batch, backward: Backward) -> torch.Tensor: ...


class StepSettings(Protocol):
    """What a step reads of ``loss.*``."""

    @property
    def gather(self) -> bool: ...
    @property
    def unsup_loss(self) -> str: ...


class Objective(Protocol):
    """What the steps ask of an objective (a run's :class:`~simcse_kit.training.objective.mixture.MixtureObjective`,
    one per dataset, or one :class:`~simcse_kit.training.objective.objectives.SimCSEObjective`)."""

    @property
    def loss_cfg(self) -> StepSettings: ...

    def of(self, batch: Batch) -> BatchObjective:
        """The objective of ``batch``'s dataset: its mode and views."""
        ...

    def embed(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """``[B, H]`` embeddings of the batch's rows, with a graph."""
        ...

    def loss(self, embeddings: torch.Tensor, batch: Batch | None = None, queue: Queue | None = None) -> torch.Tensor:
        """The scalar loss of ``[B, H]`` embeddings in batch order."""
        ...

    def metrics(self) -> dict[str, float]:
        """The objective's counters."""
        ...


class BatchObjective(Protocol):
    """What a step reads of one batch's objective (:meth:`Objective.of`)."""

    mode: str
    negatives: int

    @property
    def loss_cfg(self) -> StepSettings: ...

    def views_per_example(self) -> int:
        """``V``: rows per example."""
        ...


def backpropagate(loss: torch.Tensor, backward: Backward | None) -> torch.Tensor:
    """``backward(loss)`` (``loss.backward()`` when None), then the detached loss: every step's end."""
    if backward is None:
        loss.backward()
    else:
        backward(loss)
    return loss.detach()


class ObjectiveStep:
    """The part every step around an objective shares: the objective, the accelerator and
    the objective's counters as :meth:`metrics`."""

    def __init__(self, objective: Objective, accelerator: Any | None = None) -> None:
        self.objective = objective
        self.accelerator = accelerator

    def metrics(self) -> dict[str, float]:
        """The objective's counters
        (:meth:`SimCSEObjective.metrics <simcse_kit.training.objective.objectives.SimCSEObjective.metrics>`)."""
        return self.objective.metrics()

    def processes(self) -> int:
        """Processes of the run (1 without an accelerator)."""
        return getattr(self.accelerator, "num_processes", 1) if self.accelerator is not None else 1


class GradCacheStep(ObjectiveStep):
    """A step computing the loss GradCache-style (:mod:`simcse_kit.training.objective.gradcache`).

    Args:
        objective: gives ``embed(model, batch) -> [b, H]``,
            ``loss(embeddings [B, H], batch) -> scalar`` and ``of(batch)``, the batch's own
            objective (its views per example: a chunk holds whole examples).
        chunk_rows: rows (sentences) encoded per chunk; rounded down to whole examples
            (a multiple of the views per example), at least one example.
        accelerator: optional; with several processes all but the last chunk's
            backward run under ``accelerator.no_sync(model)``.

    Calling ``step(model, batch, backward)`` runs the three passes, calls
    ``backward(loss)`` once on the full-batch loss and returns the detached loss.
    """

    def __init__(self, objective: Objective, chunk_rows: int, accelerator: Any | None = None) -> None:
        if chunk_rows < 1:
            raise ValueError(f"grad_cache_chunk must be >= 1, got {chunk_rows}")
        super().__init__(objective, accelerator)
        self.chunk_rows = chunk_rows
        self._logged = False

    def _no_sync(self, model: nn.Module, last: bool) -> Any:
        if last or self.accelerator is None or self.processes() <= 1:
            return nullcontext()
        return self.accelerator.no_sync(model)

    def _log_once(self, objective: BatchObjective, n_rows: int, slices: list[slice]) -> None:
        if self._logged:
            return
        world = self.processes()
        gather = world > 1 and objective.loss_cfg.gather
        n_examples = n_rows // objective.views_per_example()
        unsup_loss = objective.loss_cfg.unsup_loss
        negatives = effective_negatives(objective.mode, n_examples, unsup_loss, world if gather else 1, objective.negatives)
        chunk = slices[0].stop - slices[0].start
        logger.info("GradCache: %d rows in %d chunks of <= %d; %d negatives per anchor", n_rows, len(slices), chunk, negatives)
        self._logged = True

    def __call__(self, model: nn.Module, batch: Batch, backward: Backward | None = None) -> torch.Tensor:
        n_rows = batch["input_ids"].shape[0]
        objective = self.objective.of(batch)
        # Chunks hold whole examples, so a chunk boundary never separates the views of one
        # example (batch.py: rows are example-major); each dataset's batches have their own V.
        slices = chunk_slices(n_rows, self.chunk_rows, objective.views_per_example())
        self._log_once(objective, n_rows, slices)

        # Pass 1: embeddings without a graph, remembering each chunk's RNG state.
        states: list[RngState] = []
        with torch.no_grad():
            parts = []
            for rows in slices:
                states.append(RngState())
                parts.append(self.objective.embed(model, model_chunk(batch, rows)))
        embeddings = torch.cat(parts).detach().requires_grad_()

        # Pass 2: the full-batch loss and d loss / d embeddings (through the trainer's
        # backward, so loss scaling and accumulation division are applied once).
        loss = backpropagate(self.objective.loss(embeddings, batch), backward)
        grad = embeddings.grad
        if grad is None:  # a loss that ignores the embeddings: nothing to propagate
            return loss

        # Pass 3: replay each chunk with a graph and push its cached gradient through.
        for i, (rows, state) in enumerate(zip(slices, states, strict=True)):
            with state.replay(), self._no_sync(model, last=i == len(slices) - 1):
                chunk_embeddings = self.objective.embed(model, model_chunk(batch, rows))
                chunk_embeddings.backward(grad[rows].to(chunk_embeddings.dtype))
        return loss


class MomentumQueueStep(ObjectiveStep):
    """A step that adds the queue's negatives to an objective's loss.

    Order within a step follows MoCo's ``forward``: update the momentum encoder from the
    online one (which the previous optimiser step changed), compute the loss against the
    queue as it was, then enqueue the current batch's keys.

    Args:
        objective: gives ``embed``, ``loss(embeddings, batch, queue=)``, ``loss_cfg`` and
            ``of(batch)``, the batch's own objective (its views per example: the keys are
            each example's view 1).
        queue: the :class:`~simcse_kit.training.objective.momentum_queue.MomentumQueue`, built from the online
            model before ``accelerator.prepare``.
        accelerator: optional; gives ``unwrap_model``, ``autocast`` and
            ``sync_gradients`` (the momentum encoder moves once per optimiser step,
            not per accumulated micro-batch).
    """

    def __init__(self, objective: Objective, queue: MomentumQueue, accelerator: Any | None = None) -> None:
        super().__init__(objective, accelerator)
        self.queue = queue

    def metrics(self) -> dict[str, float]:
        """The objective's counters and the queue's fill (rows of negatives it holds now)."""
        return super().metrics() | {"queue_size": float(self.queue.filled)}

    def key_autocast(self, online: nn.Module, device: torch.device) -> Any:
        """The precision of the key encoder's forward: the online model's.

        The momentum encoder is an fp32 copy, whatever the online model's dtype: its EMA
        step ``(1 - m) x (difference)`` is below bf16's resolution, so in bf16 it would
        never move. When the online model runs in bf16 outright (``train.bf16_weights``),
        the keys are computed under bf16 autocast so they cost what the online forward does.
        """
        if compute_dtype(online) == torch.bfloat16:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        if self.accelerator is not None:
            return self.accelerator.autocast()
        return torch.autocast(device.type, enabled=False)

    def __call__(self, model: nn.Module, batch: Batch, backward: Backward | None = None) -> torch.Tensor:
        online = self.accelerator.unwrap_model(model) if self.accelerator is not None else model
        device = next(online.parameters()).device
        if self.queue.queue.device != device:
            self.queue.to(device)
        if bool(self.queue.pending_update):
            self.queue.update(online)
        embeddings = self.objective.embed(model, batch)
        negatives, negative_ids, guide_rows = self.queue.negatives()
        # Cloned, so the in-place enqueue below never touches a tensor saved for backward.
        guided = None if guide_rows is None else guide_rows.clone()
        queue = Queue(negatives.clone(), negative_ids.clone(), guided) if negatives.shape[0] else None
        loss = self.objective.loss(embeddings, batch, queue=queue)
        # The keys are encoded after the loss used the old queue: view 1 of each example
        # (the positives; in unsup the same sentence as view 0).
        rows = view_rows(batch["input_ids"].shape[0], self.objective.of(batch).views_per_example(), 1)
        with self.key_autocast(online, device):
            keys = self.queue.encode(model_inputs(batch, rows), training=online.training)
        if "text_ids" in batch:
            ids = batch["text_ids"][rows]
        else:  # masking off: the ids are never compared
            ids = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
        # The guide's rows of the keys, so the guide vets the queue's entries as it vets the batch's.
        guide = batch["guide_rows"][rows] if "guide_rows" in batch else None
        if self.objective.loss_cfg.gather:  # every process keeps the same queue
            keys, _ = distributed.gather_with_grad(keys)
            ids = distributed.gather_labels(ids)
            guide = None if guide is None else distributed.gather_labels(guide)
        self.queue.enqueue(keys, ids, guide)
        sync = getattr(self.accelerator, "sync_gradients", True) if self.accelerator is not None else True
        self.queue.pending_update.fill_(bool(sync))
        return backpropagate(loss, backward)
