"""Cleaner and more negatives: false-negative masks from text ids, and a MoCo-style
momentum encoder with a queue of past embeddings (as ESimCSE adds to SimCSE).

False negatives. In-batch negatives assume every other row is a different sentence.
When a batch holds the same text twice (a duplicated corpus line, an NLI premise with
two hypotheses, a hard negative that repeats the positive), the copy is pushed away
from its own twin. :func:`false_negative_mask` marks, for each anchor, every candidate
whose text equals the anchor's or its positive's; the loss core's ``exclude=`` drops
them from the softmax. Texts are compared by a 64-bit hash
(:func:`simcse_kit.batch.text_ids`), which
the collator adds to the batch as ``text_ids`` so it can be gathered across processes
and stored in the queue like any label.

Momentum queue (He et al., 2020; Wu et al., 2022 "ESimCSE"). A copy of the encoder
follows the online encoder as ``theta_k <- m * theta_k + (1 - m) * theta_q`` and
encodes each batch's sentences without a graph; those embeddings go into a FIFO
queue of ``queue_size`` rows that later batches use as extra negatives. The queue
carries no gradient, so the negatives are cheap: no backward through the momentum
encoder, and no memory for its activations. Order within a step follows MoCo's
``forward``: update the momentum encoder from the online one (which the previous
optimiser step changed), compute the loss against the queue as it was, then enqueue
the current batch.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from simcse_kit import distributed
from simcse_kit.batch import model_inputs, view_rows
from simcse_kit.fastpath.internals import momentum_update
from simcse_kit.modeling import compute_dtype

if TYPE_CHECKING:  # objectives imports this module (false_negative_mask)
    from simcse_kit.objectives import SimCSEObjective

__all__ = ["MomentumQueue", "MomentumQueueStep", "false_negative_mask", "similar_candidate_mask"]

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


def false_negative_mask(
    anchor_ids: torch.Tensor,
    candidate_ids: torch.Tensor,
    positive: torch.Tensor,
    self_index: torch.Tensor | None = None,
    candidate_anchor_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidates that share a text with the anchor or with the anchor's positive.

    Candidate ``j`` is masked for anchor ``i`` when its text equals anchor ``i``'s
    text or the text of anchor ``i``'s positive, or (with ``candidate_anchor_ids``)
    when it is the positive of an anchor with the same text as anchor ``i`` (an NLI
    premise seen twice: each of its entailments is a positive of both copies).

    Args:
        anchor_ids: ``[N]`` text id of each anchor.
        candidate_ids: ``[M]`` text id of each candidate column of the logits.
        positive: ``[N]`` int64 column of each anchor's positive (never masked).
        self_index: optional ``[N]`` column holding the anchor itself (2N-view
            losses); never marked here, as the loss masks it on its own.
        candidate_anchor_ids: optional ``[M]``: for a column that is some anchor's
            positive, that anchor's text id; for other columns (hard negatives, queue
            rows) the column's own text id.

    Returns:
        ``[N, M]`` bool, True where candidate ``j`` must not be a negative of anchor
        ``i``; its sum is the number of false negatives removed.
    """
    candidate_ids = candidate_ids.to(anchor_ids.device)
    positive_ids = candidate_ids[positive]
    mask = (candidate_ids[None, :] == anchor_ids[:, None]) | (candidate_ids[None, :] == positive_ids[:, None])
    if candidate_anchor_ids is not None:
        mask |= candidate_anchor_ids.to(anchor_ids.device)[None, :] == anchor_ids[:, None]
    rows = torch.arange(anchor_ids.shape[0], device=anchor_ids.device)
    mask[rows, positive] = False
    if self_index is not None:
        mask[rows, self_index] = False
    return mask


def similar_candidate_mask(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    threshold: float,
    positive: torch.Tensor,
    self_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidates whose cosine with the anchor exceeds ``threshold``: likely paraphrases.

    In a narrow domain (SICK: many sentences differ by a word) an in-batch "negative" is
    often a positive in all but name, and pushing it away teaches the model that related
    sentences differ. Judged on the current embeddings without gradient (the mask is a
    selection, not part of the loss), as false-negative cancellation does in DCLR-style
    debiasing.

    Args:
        anchors: ``[N, D]`` anchor embeddings.
        candidates: ``[M, D]`` candidate embeddings (in-batch rows, then any queue rows).
        threshold: cosine above which a candidate is not used as a negative.
        positive: ``[N]`` column of each anchor's positive (never masked).
        self_index: optional ``[N]`` column holding the anchor itself (never marked here;
            the 2N-view loss masks it on its own).

    Returns:
        ``[N, M]`` bool, True where candidate ``j`` must not be a negative of anchor ``i``.
    """
    with torch.no_grad():
        a = torch.nn.functional.normalize(anchors.detach().float(), dim=-1)
        c = torch.nn.functional.normalize(candidates.detach().float(), dim=-1)
        mask = a @ c.T > threshold
    rows = torch.arange(anchors.shape[0], device=mask.device)
    mask[rows, positive.to(mask.device)] = False
    if self_index is not None:
        mask[rows, self_index.to(mask.device)] = False
    return mask


class MomentumQueue(nn.Module):
    """A momentum copy of the encoder and a FIFO queue of its past embeddings.

    The queue, its text ids, the write pointer and the fill count are buffers, so
    ``state_dict`` holds the whole state; a run registers this module with
    ``accelerator.register_for_checkpointing`` and ``--resume`` restores it.

    Args:
        model: the online encoder (``forward(**inputs) -> [B, D]``); copied, frozen.
        size: queue rows ``Q >= 1``.
        momentum: ``m`` in ``[0, 1)``; ``0`` makes the copy follow the online encoder
            exactly, ESimCSE uses ``0.995``, MoCo ``0.999``.
        dim: embedding width ``D``.
    """

    def __init__(self, model: nn.Module, size: int, momentum: float, dim: int) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"queue size must be >= 1, got {size}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.size = size
        self.momentum = momentum
        self.encoder = copy.deepcopy(model)
        self.encoder.requires_grad_(False)
        self.register_buffer("queue", torch.zeros(size, dim))
        self.register_buffer("queue_ids", torch.zeros(size, dtype=torch.int64))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.int64))
        self.register_buffer("filled", torch.zeros((), dtype=torch.int64))
        # ``filled`` mirrored on the host: it grows by batch sizes (shapes) only, so the
        # queue's slice needs no read-back from the device each step.
        self._filled_rows = 0
        # True once an optimiser step has happened since the last momentum update;
        # a buffer so a resumed run applies the update the interrupted one owed.
        self.register_buffer("pending_update", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def update(self, online: nn.Module) -> None:
        """``theta_k <- m * theta_k + (1 - m) * theta_q`` for every parameter, in one
        multi-tensor call (:func:`simcse_kit.fastpath.internals.momentum_update`)."""
        momentum_update(list(self.encoder.parameters()), list(online.parameters()), self.momentum)

    @torch.no_grad()
    def encode(self, inputs: Batch, training: bool = True) -> torch.Tensor:
        """Momentum-encoder embeddings ``[B, D]`` (fp32, no graph) of tokenised ``inputs``.

        ``training`` keeps dropout on, as the online encoder has it while training
        (MoCo and ESimCSE run the key encoder in train mode too).
        """
        self.encoder.train(training)
        return self.encoder(**inputs).float()

    def negatives(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part of the queue: ``([F, D], [F])`` embeddings and text ids."""
        n = self._filled_rows
        return self.queue[:n], self.queue_ids[:n]

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load as ``nn.Module`` does, then mirror the restored fill on the host (once)."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._filled_rows = int(self.filled)
        return result

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        """Write ``keys [B, D]`` (and their ``ids [B]``) over the oldest rows.

        With ``B > Q`` only the newest ``Q`` rows are kept.
        """
        keys, ids = keys.detach()[-self.size :], ids[-self.size :]
        positions = (self.ptr + torch.arange(keys.shape[0], device=self.queue.device)) % self.size
        self.queue[positions] = keys.to(self.queue.dtype)
        self.queue_ids[positions] = ids.to(self.queue_ids.device)
        self.ptr.copy_((self.ptr + keys.shape[0]) % self.size)
        self.filled.copy_(torch.clamp(self.filled + keys.shape[0], max=self.size))
        self._filled_rows = min(self._filled_rows + keys.shape[0], self.size)


class MomentumQueueStep:
    """A trainer step that adds the queue's negatives to an objective's loss.

    Args:
        objective: a :class:`~simcse_kit.objectives.SimCSEObjective` (``embed``,
            ``loss(embeddings, batch, queue=)``, ``views_per_example``, ``loss_cfg``).
        queue: the :class:`MomentumQueue`, built from the online model before
            ``accelerator.prepare``.
        accelerator: optional; gives ``unwrap_model``, ``autocast`` and
            ``sync_gradients`` (the momentum encoder moves once per optimiser step,
            not per accumulated micro-batch).
    """

    def __init__(self, objective: SimCSEObjective, queue: MomentumQueue, accelerator: Any | None = None) -> None:
        self.objective = objective
        self.queue = queue
        self.accelerator = accelerator

    def metrics(self) -> dict[str, float]:
        """The objective's counters and the queue's fill (rows of negatives it holds now)."""
        return self.objective.metrics() | {"queue_size": float(self.queue.filled)}

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

    def __call__(self, model: nn.Module, batch: Batch, backward: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """One training step against the queue: ``backward(loss)``, the detached loss.

        Without ``backward`` the loss is returned with its graph (as
        :meth:`SimCSEObjective.step <simcse_kit.objectives.SimCSEObjective.step>`).
        """
        online = self.accelerator.unwrap_model(model) if self.accelerator is not None else model
        device = next(online.parameters()).device
        if self.queue.queue.device != device:
            self.queue.to(device)
        if bool(self.queue.pending_update):
            self.queue.update(online)
        embeddings = self.objective.embed(model, batch)
        negatives, negative_ids = self.queue.negatives()
        # Cloned, so the in-place enqueue below never touches a tensor saved for backward.
        queue = (negatives.clone(), negative_ids.clone()) if negatives.shape[0] else None
        loss = self.objective.loss(embeddings, batch, queue=queue)
        # The keys are encoded after the loss used the old queue: view 1 of each example
        # (the positives; in unsup the same sentence as view 0).
        rows = view_rows(batch["input_ids"].shape[0], self.objective.views_per_example(), 1)
        with self.key_autocast(online, device):
            keys = self.queue.encode(model_inputs(batch, rows), training=online.training)
        if "text_ids" in batch:
            ids = batch["text_ids"][rows]
        else:  # masking off: the ids are never compared
            ids = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
        if self.objective.loss_cfg.gather:  # every process keeps the same queue
            keys, _ = distributed.gather_with_grad(keys)
            ids = distributed.gather_labels(ids)
        self.queue.enqueue(keys, ids)
        sync = getattr(self.accelerator, "sync_gradients", True) if self.accelerator is not None else True
        self.queue.pending_update.fill_(bool(sync))
        if backward is None:
            return loss
        backward(loss)
        return loss.detach()
