"""Training objectives: how a batch becomes embeddings, and embeddings a loss.

An objective is split in two on purpose: ``embed(model, batch)`` runs the encoder and
``loss(embeddings)`` only touches the loss core. Cross-process gathering, cached
(GradCache) backward and extra negatives all work on that seam without knowing the
model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from simcse_kit import distributed, losses, negatives
from simcse_kit.config import LossConfig

Batch = dict[str, torch.Tensor]


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def embed_batch(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Encode every row of a tokenised batch: ``[B, H]``. Non-model keys are ignored."""
    return model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})


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
    masked_negatives: int = field(default=0, compare=False)  # false negatives dropped so far
    last_masked: int = field(default=0, compare=False)  # ... in the latest loss call

    def views_per_example(self) -> int:
        return {"unsup": 2, "sup": 2, "hardneg": 3}[self.mode]

    def embed(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return embed_batch(model, batch)

    def loss(
        self,
        embeddings: torch.Tensor,
        batch: Batch | None = None,
        extra_negatives: torch.Tensor | None = None,
        extra_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Loss of the batch's embeddings.

        Args:
            embeddings: ``[B, H]`` rows in the collator's order.
            batch: the collated batch; its ``text_ids`` ``[B]`` are required with
                ``loss.mask_false_negatives`` (see :mod:`simcse_kit.negatives`).
            extra_negatives: optional ``[Q, H]`` candidates without gradient (the
                momentum queue), negatives of every anchor.
            extra_ids: ``[Q]`` text ids of ``extra_negatives`` (for masking).
        """
        tau = self.loss_cfg.temperature
        ids = self.row_ids(batch, embeddings.shape[0])
        extra = (extra_negatives, extra_ids)
        if self.mode == "unsup":
            if self.loss_cfg.unsup_loss == "paper":
                positives, offset = self.candidates(embeddings[1::2])
                labels = self.labels(embeddings.shape[0] // 2, offset, embeddings.device)
                anchor_ids = None if ids is None else ids[0::2]
                cand_ids = None if ids is None else self.gathered_ids(ids[1::2])
                positives, exclude = self.with_negatives(positives, cand_ids, anchor_ids, labels, *extra)
                return losses.info_nce(embeddings[0::2], positives, temperature=tau, labels=labels, exclude=exclude)
            ref, offset = self.candidates(embeddings)
            rows = torch.arange(embeddings.shape[0], device=embeddings.device)
            ref_ids = None if ids is None else self.gathered_ids(ids)
            positive = losses.view_labels(embeddings.shape[0], offset, embeddings.device)
            ref, exclude = self.with_negatives(ref, ref_ids, ids, positive, *extra, self_index=rows + offset)
            return losses.info_nce_views(embeddings, temperature=tau, ref_embeddings=ref, offset=offset, exclude=exclude)
        parts = embeddings.chunk(self.views_per_example())
        n = parts[0].shape[0]
        positives, offset = self.candidates(parts[1])
        labels = self.labels(n, offset, embeddings.device)
        id_parts = [None] * 3 if ids is None else [self.gathered_ids(p) for p in ids.chunk(self.views_per_example())]
        anchor_ids = None if ids is None else ids[:n]
        if self.mode == "sup":
            positives, exclude = self.with_negatives(positives, id_parts[1], anchor_ids, labels, *extra, pair_ids=id_parts[0])
            return losses.info_nce(parts[0], positives, temperature=tau, labels=labels, exclude=exclude)
        hard, _ = self.candidates(parts[2])
        alpha = self.loss_cfg.hard_negative_weight
        if extra_negatives is None and ids is None:
            return losses.info_nce(parts[0], positives, hard, temperature=tau, hard_negative_weight=alpha, labels=labels)
        # info_nce pairs hard negatives row for row with the candidates, so the queue
        # joins both blocks, [pos, queue | hard, queue], and its copy in the hard
        # block is masked out.
        m, q = positives.shape[0], 0 if extra_negatives is None else extra_negatives.shape[0]
        tail = hard if extra_negatives is None else torch.cat([extra_negatives.to(hard.dtype), hard])
        tail_ids = id_parts[2] if extra_ids is None or ids is None else torch.cat([extra_ids, id_parts[2]])
        pool, exclude = self.with_negatives(positives, id_parts[1], anchor_ids, labels, tail, tail_ids, pair_ids=id_parts[0])
        if exclude is None:
            exclude = torch.zeros(n, pool.shape[0], dtype=torch.bool, device=embeddings.device)
        exclude = torch.cat([exclude, torch.ones(n, q, dtype=torch.bool, device=embeddings.device)], dim=1)
        return losses.info_nce(
            parts[0],
            pool[: m + q],
            torch.cat([hard, pool[m : m + q]]),
            temperature=tau,
            hard_negative_weight=alpha,
            labels=labels,
            exclude=exclude,
        )

    def gathered_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """All processes' text ids in the order :meth:`candidates` gathers rows."""
        return distributed.gather_labels(ids) if self.loss_cfg.gather else ids

    def row_ids(self, batch: Batch | None, n_rows: int) -> torch.Tensor | None:
        """The batch's ``text_ids`` ``[B]`` when false-negative masking is on, else None."""
        if not self.loss_cfg.mask_false_negatives:
            return None
        if batch is None or "text_ids" not in batch:
            raise ValueError("loss.mask_false_negatives needs the batch's text_ids (ContrastiveCollator(with_text_ids=True))")
        ids = batch["text_ids"]
        if ids.shape[0] != n_rows:
            raise ValueError(f"text_ids has {ids.shape[0]} rows, the embeddings {n_rows}")
        return ids

    def with_negatives(
        self,
        candidates: torch.Tensor,
        candidate_ids: torch.Tensor | None,
        anchor_ids: torch.Tensor | None,
        positive: torch.Tensor,
        extra_negatives: torch.Tensor | None,
        extra_ids: torch.Tensor | None,
        self_index: torch.Tensor | None = None,
        pair_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append the extra negatives to ``candidates [M, H]`` and build the
        false-negative mask ``[N, M + Q]`` (None when masking is off); the number of
        masked entries is added to :attr:`masked_negatives`.

        ``pair_ids`` ``[M]`` is, for each in-batch candidate that is a positive, the
        text id of its anchor; columns beyond it (queue rows, hard negatives) are
        grouped by their own text.
        """
        if extra_negatives is not None:
            candidates = torch.cat([candidates, extra_negatives.to(candidates.dtype)])
        if anchor_ids is None or candidate_ids is None:
            return candidates, None
        if extra_negatives is not None:
            if extra_ids is None:
                raise ValueError("extra_ids are required with extra_negatives when masking false negatives")
            candidate_ids = torch.cat([candidate_ids, extra_ids.to(candidate_ids.device)])
        group = None
        if pair_ids is not None:
            group = torch.cat([pair_ids, candidate_ids[pair_ids.shape[0] :]])
        exclude = negatives.false_negative_mask(anchor_ids, candidate_ids, positive, self_index, group)
        masked = int(exclude.sum())
        self.masked_negatives += masked
        self.last_masked = masked
        return candidates, exclude

    def candidates(self, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """All processes' ``rows`` (with gradient) when ``loss.gather`` is on, and where
        the local ones start; ``(rows, 0)`` on one process."""
        return distributed.gather_with_grad(rows) if self.loss_cfg.gather else (rows, 0)

    @staticmethod
    def labels(n: int, offset: int, device: torch.device) -> torch.Tensor:
        """Anchor ``i``'s positive sits at row ``offset + i`` of the gathered candidates."""
        return torch.arange(n, device=device) + offset

    def step(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.loss(self.embed(model, batch), batch)


StepFn = Callable[[nn.Module, Batch], torch.Tensor]
