"""The masks and labels of a batch's contrastive problem: each anchor's positive column
(:func:`view_labels`), its own row (:func:`self_mask`), a weighted column
(:func:`weight_bias`), and false negatives, which in-batch candidates must not count as an
anchor's negatives. All are built by comparing index ranges, never by index assignment
(which on CUDA reads the device back).

In-batch negatives assume every other row is a different sentence. When a batch holds
the same text twice (a duplicated corpus line, an NLI premise with two hypotheses, a hard
negative that repeats the positive), the copy is pushed away from its own twin.
:func:`false_negative_mask` marks, for each anchor, every candidate whose text equals the
anchor's or its positive's; :func:`similar_candidate_mask` marks candidates too close to
the anchor to be a negative; :func:`guided_mask` marks candidates that a frozen guide model
rates above the anchor's positive (GISTEmbed's guided in-sample selection). The loss core's ``exclude=``
(:func:`simcse_kit.core.losses.contrastive_loss`) drops them from the softmax. Texts are
compared by a 64-bit hash (:func:`simcse_kit.core.batch.text_ids`), which the collator adds to
the batch as ``text_ids`` so it can be gathered across processes and stored in the
momentum queue like any label.

Like :mod:`simcse_kit.core.losses` this module imports only torch.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "MARGIN_STRATEGIES",
    "false_negative_mask",
    "guide_threshold",
    "guided_mask",
    "self_mask",
    "similar_candidate_mask",
    "view_labels",
    "weight_bias",
]

MARGIN_STRATEGIES = ("absolute", "relative")
"""How a guide's margin lowers the positive's score into a threshold (:func:`guide_threshold`)."""


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
    columns = torch.arange(mask.shape[1], device=mask.device)[None, :]  # comparison: no device read-back
    mask &= columns != positive.to(mask.device)[:, None]
    if self_index is not None:
        mask &= columns != self_index.to(mask.device)[:, None]
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
    # By comparison, not index assignment: assigning at tensor indices reads the device
    # back on CUDA, once a step.
    columns = torch.arange(mask.shape[1], device=mask.device)[None, :]
    mask &= columns != positive.to(mask.device)[:, None]
    if self_index is not None:
        mask &= columns != self_index.to(mask.device)[:, None]
    return mask


def guide_threshold(positive_scores: torch.Tensor, margin: float, strategy: str) -> torch.Tensor:
    """The score above which a candidate is no negative: ``s_p - margin`` (``"absolute"``)
    or ``s_p - |s_p| * margin`` (``"relative"``: a share of the positive's score), the
    margin strategies of sentence-transformers' ``GISTEmbedLoss`` and ``mine_hard_negatives``.

    Args:
        positive_scores: ``[N, 1]`` (or any shape) the guide's score of each anchor's positive.
        margin: >= 0 lowers the threshold (more is masked); 0: only candidates the guide
            rates strictly above the positive.
        strategy: one of :data:`MARGIN_STRATEGIES`.
    """
    if strategy == "absolute":
        return positive_scores - margin
    if strategy == "relative":
        return positive_scores - positive_scores.abs() * margin
    raise ValueError(f"margin strategy must be one of {MARGIN_STRATEGIES}, got {strategy!r}")


def guided_mask(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    positive: torch.Tensor,
    margin: float = 0.0,
    strategy: str = "absolute",
    self_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidates a guide rates above the anchor's positive, by a margin: likely positives.

    GISTEmbed (Solatorio, 2024; sentence-transformers' ``GISTEmbedLoss``) and NV-Retriever's
    positive-aware filtering: a frozen, stronger model scores the anchor against every
    candidate; one it finds closer than the anchor's own positive (less the margin,
    :func:`guide_threshold`) is more likely an unlabelled positive than a negative. The
    guide's vectors may have any width; they never carry a gradient.

    Args:
        anchors: ``[N, D']`` the guide's vectors of the anchors.
        candidates: ``[M, D']`` the guide's vectors of the candidates (in-batch rows of
            every process, hard negatives, queue rows), in the loss's column order.
        positive: ``[N]`` column of each anchor's positive (its score is the threshold's
            base; never marked).
        margin: see :func:`guide_threshold`.
        strategy: ``"absolute"`` or ``"relative"``.
        self_index: optional ``[N]`` column holding the anchor itself (never marked here;
            the 2N-view loss masks it on its own).

    Returns:
        ``[N, M]`` bool, True where candidate ``j`` must not be a negative of anchor ``i``.
    """
    dtype = torch.promote_types(torch.promote_types(anchors.dtype, candidates.dtype), torch.float32)  # fp64 stays fp64
    with torch.no_grad():
        a = torch.nn.functional.normalize(anchors.detach().to(dtype), dim=-1)
        c = torch.nn.functional.normalize(candidates.detach().to(device=a.device, dtype=dtype), dim=-1)
        scores = a @ c.T
        positive = positive.to(scores.device)
        mask = scores > guide_threshold(scores.gather(1, positive[:, None]), margin, strategy)
    columns = torch.arange(mask.shape[1], device=mask.device)[None, :]  # comparison: no device read-back
    mask &= columns != positive[:, None]
    if self_index is not None:
        mask &= columns != self_index.to(mask.device)[:, None]
    return mask


def view_labels(n_rows: int, offset: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """Positive index for a batch ordered ``[a, a, b, b, ...]``: ``[1, 0, 3, 2, ...] + offset``."""
    if n_rows % 2:
        raise ValueError(f"a 2N-view batch needs an even number of rows, got {n_rows}")
    return (torch.arange(n_rows, device=device) ^ 1) + offset


def self_mask(n_rows: int, n_columns: int, offset: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """``[N, M]`` bool, True at ``(i, offset + i)``: each anchor's own row among the candidates."""
    rows = torch.arange(n_rows, device=device)
    columns = torch.arange(n_columns, device=device)
    return columns[None, :] == rows[:, None] + offset  # no index assignment: no device read-back


def weight_bias(columns: torch.Tensor, n_columns: int, weight: float, like: torch.Tensor) -> torch.Tensor | None:
    """The ``logit_bias`` that weights candidate ``columns[i]`` of anchor ``i`` by ``weight``.

    ``log(weight)`` at ``(i, columns[i])``, 0 elsewhere: in the softmax denominator that
    candidate's ``exp(cos / tau)`` becomes ``weight * exp(cos / tau)``. With ``[N, K]``
    columns, each of anchor ``i``'s ``K`` columns is weighted (its ``K`` own hard negatives).

    Args:
        columns: ``[N]`` int64 column per anchor, or ``[N, K]`` columns per anchor.
        n_columns: ``M``, the number of candidates.
        weight: alpha > 0.
        like: a tensor giving device and (at least fp32) dtype.

    Returns:
        ``[N, M]`` bias, or None when ``weight == 1`` (nothing to add).
    """
    if weight <= 0:
        raise ValueError(f"hard_negative_weight must be > 0, got {weight}")
    if weight == 1.0:
        return None
    dtype = torch.promote_types(like.dtype, torch.float32)
    columns = columns.to(like.device)
    if columns.ndim == 1:
        at = torch.arange(n_columns, device=like.device)[None, :] == columns[:, None]
    else:
        at = (torch.arange(n_columns, device=like.device)[None, None, :] == columns[:, :, None]).any(dim=1)
    # masked_fill, not an index assignment: on CUDA that would read the device back.
    return torch.zeros(columns.shape[0], n_columns, dtype=dtype, device=like.device).masked_fill(at, math.log(weight))
