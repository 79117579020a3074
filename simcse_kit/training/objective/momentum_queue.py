"""More negatives: a MoCo-style momentum encoder with a queue of past embeddings (as
ESimCSE adds to SimCSE).

Momentum queue (He et al., 2020; Wu et al., 2022 "ESimCSE"). A copy of the encoder
follows the online encoder as ``theta_k <- m * theta_k + (1 - m) * theta_q`` and
encodes each batch's sentences without a graph; those embeddings go into a FIFO
queue of ``queue_size`` rows that later batches use as extra negatives. The queue
carries no gradient, so the negatives are cheap: no backward through the momentum
encoder, and no memory for its activations. The queue also stores each row's text id
(:func:`simcse_kit.core.batch.text_ids`), so false-negative masking
(:mod:`simcse_kit.core.masks`) reaches its rows too, and, with a guide (``loss.guide``), each
row's index into the guide's table of the training sentences, so the guide vets them too.

:class:`simcse_kit.training.engine.steps.MomentumQueueStep` is the training step that uses it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from simcse_kit.model.fastpath.internals import momentum_update

__all__ = ["MomentumQueue"]


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
        guide: also keep each row's guide row (``queue_guide_rows``); off, the state holds
            no such buffer, so checkpoints of runs without a guide are unchanged.
    """

    # Buffers (register_buffer in __init__), declared so they read as tensors, not modules.
    queue: torch.Tensor
    queue_ids: torch.Tensor
    queue_guide_rows: torch.Tensor | None
    ptr: torch.Tensor
    filled: torch.Tensor
    pending_update: torch.Tensor

    def __init__(self, model: nn.Module, size: int, momentum: float, dim: int, guide: bool = False) -> None:
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
        # A None buffer is left out of state_dict: a queue without a guide saves what it always saved.
        self.register_buffer("queue_guide_rows", torch.zeros(size, dtype=torch.int64) if guide else None)
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
        multi-tensor call (:func:`simcse_kit.model.fastpath.internals.momentum_update`)."""
        momentum_update(list(self.encoder.parameters()), list(online.parameters()), self.momentum)

    @torch.no_grad()
    def encode(self, inputs: Mapping[str, torch.Tensor], training: bool = True) -> torch.Tensor:
        """Momentum-encoder embeddings ``[B, D]`` (fp32, no graph) of tokenised ``inputs``.

        ``training`` keeps dropout on, as the online encoder has it while training
        (MoCo and ESimCSE run the key encoder in train mode too).
        """
        self.encoder.train(training)
        return self.encoder(**inputs).float()

    def negatives(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The filled part of the queue: ``([F, D], [F], [F] or None)`` embeddings, text ids
        and guide rows (None without a guide)."""
        n = self._filled_rows
        guide = None if self.queue_guide_rows is None else self.queue_guide_rows[:n]
        return self.queue[:n], self.queue_ids[:n], guide

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load as ``nn.Module`` does, then mirror the restored fill on the host (once)."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._filled_rows = int(self.filled)
        return result

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor, guide_rows: torch.Tensor | None = None) -> None:
        """Write ``keys [B, D]`` (and their ``ids [B]``, and with a guide their ``guide_rows
        [B]``) over the oldest rows.

        With ``B > Q`` only the newest ``Q`` rows are kept.
        """
        keys, ids = keys.detach()[-self.size :], ids[-self.size :]
        positions = (self.ptr + torch.arange(keys.shape[0], device=self.queue.device)) % self.size
        self.queue[positions] = keys.to(self.queue.dtype)
        self.queue_ids[positions] = ids.to(self.queue_ids.device)
        if self.queue_guide_rows is not None:
            if guide_rows is None:
                raise ValueError("a queue built with guide=True needs the keys' guide_rows")
            self.queue_guide_rows[positions] = guide_rows[-self.size :].to(self.queue_guide_rows.device)
        self.ptr.copy_((self.ptr + keys.shape[0]) % self.size)
        self.filled.copy_(torch.clamp(self.filled + keys.shape[0], max=self.size))
        self._filled_rows = min(self._filled_rows + keys.shape[0], self.size)
