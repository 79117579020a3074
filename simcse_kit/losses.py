"""The contrastive loss core: InfoNCE (SimCSE form and 2N-view form) and SupCon.

Every function here takes embeddings (and optionally labels, masks or reference
embeddings gathered from other processes) and returns a scalar loss. The module
imports only torch so that the text trainer, the image demo and the tests all call
exactly the same code.

Numerics (part of the contract):
  * similarities are computed in fp32 whatever the input dtype, with autocast off,
    because bf16 logits divided by tau = 0.05 lose most of their mantissa;
  * excluded entries are masked with ``torch.finfo(float32).min``, never ``-1e12``
    (which is ``-inf`` in fp16 and turns a fully-masked row into NaN);
  * SupCon anchors without any positive are dropped from the mean, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "cross_entropy_from_logits",
    "cosine_similarity_matrix",
    "info_nce",
    "info_nce_views",
    "supcon",
    "view_labels",
]


def cosine_similarity_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarities in fp32 (fp64 stays fp64).

    Args:
        a: ``[N, D]`` embeddings.
        b: ``[M, D]`` embeddings.

    Returns:
        ``[N, M]`` matrix of cosine similarities, at least fp32.
    """
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    with torch.autocast(device_type=a.device.type, enabled=False):
        a = F.normalize(a.to(dtype), dim=-1)
        b = F.normalize(b.to(dtype), dim=-1)
        return a @ b.T


def cross_entropy_from_logits(
    logits: torch.Tensor,
    positive: torch.Tensor,
    exclude: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of each row's positive column, with some columns excluded.

    This is the one place where every InfoNCE variant turns logits into a loss.

    Args:
        logits: ``[N, M]`` fp32 logits (similarity / temperature).
        positive: ``[N]`` int64 column of each row's positive.
        exclude: optional ``[N, M]`` bool, True where a column must not take part in
            that row's softmax (self-similarity, false negatives). A row's own
            positive is never excluded.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        Scalar loss, or ``[N]`` per-row losses when ``reduction="none"``.
    """
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if exclude is not None:
        exclude = exclude.clone()
        exclude[torch.arange(logits.shape[0], device=logits.device), positive] = False
        logits = logits.masked_fill(exclude, torch.finfo(logits.dtype).min)
    return F.cross_entropy(logits, positive, reduction=reduction)


def info_nce(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    hard_negatives: torch.Tensor | None = None,
    *,
    temperature: float = 0.05,
    hard_negative_weight: float = 1.0,
    labels: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimCSE's InfoNCE: each anchor against all positives of the batch.

    This is the form of the SimCSE paper (Gao et al., 2021, eq. 1 and 5): logits are
    ``cos(anchors, positives) / tau``, so an anchor has one positive and ``M - 1``
    in-batch negatives (plus ``M`` hard negatives when given). It is *not* NT-Xent
    over 2N views; see :func:`info_nce_views` for that.

    The hard-negative weight is the paper's alpha: anchor ``i``'s own hard negative
    enters its denominator as ``alpha * exp(cos / tau)``, i.e. ``log(alpha)`` is added
    to that one logit. ``alpha = 1`` is the plain loss; the other rows' hard
    negatives are ordinary negatives.

    Args:
        anchors: ``[N, D]`` anchor embeddings (e.g. premises).
        positives: ``[M, D]`` candidate embeddings, ``M >= N`` (more when gathered from
            other processes); anchor ``i``'s positive is row ``labels[i]``.
        hard_negatives: optional ``[M, D]``; anchor ``i``'s own hard negative is row
            ``labels[i]``.
        temperature: tau > 0.
        hard_negative_weight: alpha > 0 applied to each anchor's own hard negative.
        labels: ``[N]`` int64, default ``arange(N)``.
        exclude: optional ``[N, M]`` (or ``[N, 2M]`` with hard negatives) bool mask of
            candidates to drop from each anchor's softmax (false negatives).

    Returns:
        Scalar mean loss over anchors.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n, m = anchors.shape[0], positives.shape[0]
    if labels is None:
        if n != m:
            raise ValueError(f"labels are required when anchors ({n}) and positives ({m}) differ in size")
        labels = torch.arange(n, device=anchors.device)
    logits = cosine_similarity_matrix(anchors, positives) / temperature
    if hard_negatives is not None:
        if hard_negatives.shape[0] != m:
            raise ValueError(f"hard_negatives has {hard_negatives.shape[0]} rows, positives {m}")
        if hard_negative_weight <= 0:
            raise ValueError(f"hard_negative_weight must be > 0, got {hard_negative_weight}")
        hard = cosine_similarity_matrix(anchors, hard_negatives) / temperature
        if hard_negative_weight != 1.0:
            rows = torch.arange(n, device=anchors.device)
            hard = hard.index_put((rows, labels), hard[rows, labels] + math.log(hard_negative_weight))
        logits = torch.cat([logits, hard], dim=1)
    return cross_entropy_from_logits(logits, labels, exclude)


def view_labels(n_rows: int, offset: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """Positive index for a batch ordered ``[a, a, b, b, ...]``: ``[1, 0, 3, 2, ...] + offset``."""
    if n_rows % 2:
        raise ValueError(f"a 2N-view batch needs an even number of rows, got {n_rows}")
    return (torch.arange(n_rows, device=device) ^ 1) + offset


def info_nce_views(
    embeddings: torch.Tensor,
    *,
    temperature: float = 0.05,
    ref_embeddings: torch.Tensor | None = None,
    offset: int = 0,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """InfoNCE over 2N views (NT-Xent), for unsupervised batches ``[a, a, b, b, ...]``.

    Each row's positive is its neighbour (labels ``[1, 0, 3, 2, ...]``), its own
    similarity is masked out, and the other ``2N - 2`` rows are negatives. This is
    unsupervised SimCSE with dropout as the augmentation written symmetrically: every
    view is an anchor once.

    Args:
        embeddings: ``[2N, D]`` local views, pairs adjacent.
        temperature: tau > 0.
        ref_embeddings: optional ``[R, D]`` candidates (all processes' views, gathered);
            default ``embeddings``. The local rows sit at ``offset .. offset + 2N``.
        offset: where the local rows start in ``ref_embeddings``.
        exclude: optional ``[2N, R]`` bool of extra candidates to drop (false negatives).

    Returns:
        Scalar mean loss over the ``2N`` anchors.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    ref = embeddings if ref_embeddings is None else ref_embeddings
    n = embeddings.shape[0]
    rows = torch.arange(n, device=embeddings.device)
    logits = cosine_similarity_matrix(embeddings, ref) / temperature
    self_mask = torch.zeros(n, ref.shape[0], dtype=torch.bool, device=embeddings.device)
    self_mask[rows, rows + offset] = True
    if exclude is not None:
        self_mask |= exclude
    return cross_entropy_from_logits(logits, view_labels(n, offset, embeddings.device), self_mask)


def supcon(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    positive_mask: torch.Tensor | None = None,
    temperature: float = 0.1,
    variant: str = "out",
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al., 2020) over labels or a positive mask.

    For anchor ``i`` with positives ``P(i)`` and all other candidates ``A(i)``:
      * ``L_out`` (default, eq. 2): ``-1/|P(i)| * sum_p log softmax_A(i)(z_i . z_p / tau)``
      * ``L_in`` (eq. 3): ``-log(1/|P(i)| * sum_p softmax_A(i)(z_i . z_p / tau))``
    Anchors with no positive are excluded from the mean; if no anchor has one the
    loss is a zero that still carries the graph.

    With one label per sentence over its two views this equals :func:`info_nce_views`.

    Args:
        embeddings: ``[N, D]`` anchor embeddings (normalised here).
        labels: ``[N]`` class labels; or give ``positive_mask``.
        positive_mask: ``[N, R]`` bool, True where candidate ``j`` is a positive of
            anchor ``i``; the self entry is ignored.
        temperature: tau > 0.
        variant: ``"out"`` or ``"in"``.
        ref_embeddings: optional ``[R, D]`` candidates (gathered); default
            ``embeddings``, with local rows at ``offset``.
        ref_labels: ``[R]`` labels of the candidates when ``ref_embeddings`` is given.
        offset: index of the first local row in ``ref_embeddings``.

    Returns:
        Scalar mean loss over anchors that have at least one positive.
    """
    if variant not in ("out", "in"):
        raise ValueError(f"variant must be 'out' or 'in', got {variant!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    ref = embeddings if ref_embeddings is None else ref_embeddings
    n, r = embeddings.shape[0], ref.shape[0]
    device = embeddings.device
    if positive_mask is None:
        if labels is None:
            raise ValueError("supcon needs labels or positive_mask")
        if ref_labels is None:
            if ref_embeddings is not None:
                raise ValueError("ref_labels are required with ref_embeddings")
            ref_labels = labels
        positive_mask = labels.view(-1, 1) == ref_labels.view(1, -1)
    if positive_mask.shape != (n, r):
        raise ValueError(f"positive_mask must be {(n, r)}, got {tuple(positive_mask.shape)}")
    rows = torch.arange(n, device=device)
    self_mask = torch.zeros(n, r, dtype=torch.bool, device=device)
    self_mask[rows, rows + offset] = True
    positive_mask = positive_mask.to(device=device, dtype=torch.bool) & ~self_mask

    logits = cosine_similarity_matrix(embeddings, ref) / temperature
    logits = logits.masked_fill(self_mask, torch.finfo(logits.dtype).min)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)

    n_pos = positive_mask.sum(dim=1)
    valid = n_pos > 0
    if not bool(valid.any()):
        return embeddings.sum() * 0.0
    if variant == "out":
        # Zero (not -inf/min) where not positive, so the masked sum is exact.
        per_anchor = -(log_prob * positive_mask).sum(dim=1)[valid] / n_pos[valid]
    else:
        pos_log_prob = log_prob.masked_fill(~positive_mask, torch.finfo(log_prob.dtype).min)
        per_anchor = -(torch.logsumexp(pos_log_prob, dim=1)[valid] - n_pos[valid].float().log())
    return per_anchor.mean()
