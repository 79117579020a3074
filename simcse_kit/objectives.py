"""Training objectives: how a batch becomes embeddings, and embeddings a loss.

An objective is split in two on purpose: ``embed(model, batch)`` runs the encoder and
``loss(embeddings)`` only touches the loss core. Cross-process gathering, cached
(GradCache) backward and extra negatives all work on that seam without knowing the
model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from simcse_kit import losses
from simcse_kit.config import LossConfig

Batch = dict[str, torch.Tensor]


def embed_batch(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Encode every row of a tokenised batch: ``[B, H]``."""
    return model(**batch)


@dataclass
class SimCSEObjective:
    """The three SimCSE losses on the row order produced by ContrastiveCollator.

    ``unsup``: ``[2N, H]`` rows ``[a, a, b, b, ...]`` -> 2N-view InfoNCE
    (``unsup_loss="views"``) or SimCSE code's ``z1 . z2^T`` (``"paper"``).
    ``sup``: ``[2N, H]`` = ``[z1; z2]`` -> InfoNCE with in-batch negatives.
    ``hardneg``: ``[3N, H]`` = ``[z1; z2; z3]`` -> InfoNCE with weighted hard negatives.
    """

    mode: str
    loss_cfg: LossConfig

    def views_per_example(self) -> int:
        return {"unsup": 2, "sup": 2, "hardneg": 3}[self.mode]

    def embed(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return embed_batch(model, batch)

    def loss(self, embeddings: torch.Tensor) -> torch.Tensor:
        tau = self.loss_cfg.temperature
        if self.mode == "unsup":
            if self.loss_cfg.unsup_loss == "paper":
                return losses.info_nce(embeddings[0::2], embeddings[1::2], temperature=tau)
            return losses.info_nce_views(embeddings, temperature=tau)
        parts = embeddings.chunk(self.views_per_example())
        if self.mode == "sup":
            return losses.info_nce(parts[0], parts[1], temperature=tau)
        return losses.info_nce(
            parts[0], parts[1], parts[2], temperature=tau, hard_negative_weight=self.loss_cfg.hard_negative_weight
        )

    def step(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.loss(self.embed(model, batch))


StepFn = Callable[[nn.Module, Batch], torch.Tensor]
