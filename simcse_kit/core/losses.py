"""The contrastive loss core: one general function and three named forms of it.

:func:`contrastive_loss` is the whole computation: one cosine-similarity matrix between
anchors and candidates, one positive per anchor (a column index) or several (a mask),
one exclusion mask and one additive logit bias, then cross-entropy (one positive),
SupCon's ``L_out`` / ``L_in`` (several), or cross-entropy against a soft target
distribution (a teacher's, :func:`similarity_targets`). The named losses only build those inputs:

  * :func:`info_nce`: SimCSE's ``z1 . z2^T`` (N - 1 in-batch negatives), optionally with
    weighted hard negatives;
  * :func:`info_nce_views`: NT-Xent over 2N views ordered ``[a, a, b, b, ...]``;
  * :func:`supcon`: supervised contrastive loss over class ``labels``.

:func:`matryoshka_loss` sums any of them over truncated prefixes of the embeddings
(Matryoshka representation learning, Kusupati et al., 2022).

Names: ``positive_index`` is always a *column* of the candidates; ``labels`` always
means *class* labels. The module imports only torch, so the text objectives, the image
demo and the tests all call exactly the same code.

Numerics (part of the contract):
  * similarities are computed in fp32 whatever the input dtype (fp64 stays fp64), with
    autocast off, because bf16 logits divided by tau = 0.05 lose most of their mantissa;
  * excluded entries are masked with the logits' own ``finfo.min``, never ``-1e12``
    (which is ``-inf`` in fp16 and turns a fully-masked row into NaN);
  * anchors without any positive are dropped from the mean, never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from simcse_kit.core import masks

__all__ = [
    "contrastive_loss",
    "similarity_targets",
    "cosine_similarity_matrix",
    "cross_entropy_from_logits",
    "info_nce",
    "info_nce_views",
    "matryoshka_loss",
    "supcon",
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

    The single-positive tail of :func:`contrastive_loss`, public for callers that build
    their own logits (the temperature and toy demos).

    Args:
        logits: ``[N, M]`` logits (similarity / temperature); below fp32 they are upcast.
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
        # By comparison, not index_put: on CUDA an index assignment reads the device back.
        columns = torch.arange(logits.shape[1], device=logits.device)
        exclude = exclude & (columns[None, :] != positive[:, None])
        logits = logits.masked_fill(exclude, torch.finfo(logits.dtype).min)
    return F.cross_entropy(logits, positive, reduction=reduction)


def _multi_positive(logits: torch.Tensor, positive_mask: torch.Tensor, variant: str, zero: torch.Tensor) -> torch.Tensor:
    """SupCon's ``L_out`` / ``L_in`` of masked ``[N, M]`` logits; anchors without a
    positive dropped, ``zero`` (a graph-carrying 0) when none has one."""
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    n_pos = positive_mask.sum(dim=1)
    valid = n_pos > 0
    if not bool(valid.any()):
        return zero
    if variant == "out":
        # Zero (not -inf/min) where not positive, so the masked sum is exact.
        per_anchor = -(log_prob * positive_mask).sum(dim=1)[valid] / n_pos[valid]
    else:
        pos_log_prob = log_prob.masked_fill(~positive_mask, torch.finfo(log_prob.dtype).min)
        # log |P(i)| in the logits' dtype: an fp32 log(3) would cap fp64 losses at ~1e-8.
        per_anchor = -(torch.logsumexp(pos_log_prob, dim=1)[valid] - n_pos[valid].to(log_prob.dtype).log())
    return per_anchor.mean()


def _soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor, exclude: torch.Tensor | None) -> torch.Tensor:
    """``-sum_j q_ij log softmax(logits)_ij``, mean over rows; ``exclude``d logits get the
    dtype's minimum, so they leave the softmax (their target must be 0: a finite log-prob
    times 0, never ``0 * -inf``)."""
    target = target.to(device=logits.device, dtype=logits.dtype)
    if exclude is not None:
        if bool((target[exclude] > 0).any()):
            raise ValueError("target_probs puts mass on excluded candidates")
        logits = logits.masked_fill(exclude, torch.finfo(logits.dtype).min)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    return -(target * log_prob).sum(dim=1).mean()


def similarity_targets(
    anchors: torch.Tensor, candidates: torch.Tensor, *, temperature: float, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """A teacher's in-batch distribution: ``softmax_i(cos(anchors, candidates) / tau)``
    over the candidates not ``exclude``d (fp32, no gradient), the ``target_probs`` of
    :func:`contrastive_loss` for similarity distillation.

    Args:
        anchors: ``[N, D']`` the teacher's vectors of the anchors (any width ``D'``).
        candidates: ``[M, D']`` the teacher's vectors of the candidates.
        temperature: the teacher's tau > 0 (its own, not the student's).
        exclude: optional ``[N, M]`` bool, candidates outside each anchor's softmax.

    Returns:
        ``[N, M]`` probabilities, rows summing to 1, exactly 0 where excluded.
    """
    if temperature <= 0:
        raise ValueError(f"teacher temperature must be > 0, got {temperature}")
    with torch.no_grad():
        logits = cosine_similarity_matrix(anchors, candidates) / temperature
        if exclude is not None:
            logits = logits.masked_fill(exclude.to(logits.device), float("-inf"))
        return torch.softmax(logits, dim=1)


def contrastive_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    *,
    temperature: float,
    positive_index: torch.Tensor | None = None,
    positive_mask: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
    logit_bias: torch.Tensor | None = None,
    variant: str = "out",
    target_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The general contrastive loss: every InfoNCE and SupCon form here is this call.

    Logits are ``cos(anchors, candidates) / tau + logit_bias`` in fp32 (autocast off);
    entries in ``exclude`` get the dtype's minimum (a row's positives never do); then

      * one positive per anchor (``positive_index``): cross-entropy,
        ``-log softmax_i(logits)[positive_index[i]]``, mean over anchors;
      * several (``positive_mask``), SupCon (Khosla et al., 2020) with ``P(i)`` the
        positives and the softmax over all non-excluded candidates:
        ``L_out`` (eq. 2) ``-1/|P(i)| sum_p log softmax(logits)[p]`` or
        ``L_in`` (eq. 3) ``-log(1/|P(i)| sum_p softmax(logits)[p])``; anchors with no
        positive are dropped from the mean, and with none at all the loss is a zero
        that still carries the graph;
      * a target distribution per anchor (``target_probs``, e.g. a teacher's softmax over
        the same candidates): ``-sum_j q_ij log softmax_i(logits)[j]``, mean over anchors
        (a one-hot ``q`` is exactly the cross-entropy above).

    Args:
        anchors: ``[N, D]`` embeddings.
        candidates: ``[M, D]`` embeddings (positives, negatives, gathered or queued rows).
        temperature: tau > 0.
        positive_index: ``[N]`` int64 column of each anchor's one positive; or
        positive_mask: ``[N, M]`` bool, True at each anchor's positives.
        exclude: optional ``[N, M]`` bool, True where a candidate must not take part in
            that anchor's softmax (the anchor itself, false negatives).
        logit_bias: optional ``[N, M]`` added to the logits after the division by tau;
            ``log(alpha)`` there weights a candidate's ``exp`` by ``alpha`` (SimCSE's
            hard-negative weight, see :func:`simcse_kit.core.masks.weight_bias`).
        variant: ``"out"`` or ``"in"`` (multi-positive only).
        target_probs: ``[N, M]`` probabilities (rows sum to 1, no gradient needed), zero
            on entries in ``exclude``; instead of a positive index or mask.

    Returns:
        Scalar mean loss over anchors (with at least one positive).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if sum(t is not None for t in (positive_index, positive_mask, target_probs)) != 1:
        raise ValueError("contrastive_loss needs exactly one of positive_index, positive_mask and target_probs")
    if variant not in ("out", "in"):
        raise ValueError(f"variant must be 'out' or 'in', got {variant!r}")
    shape = (anchors.shape[0], candidates.shape[0])
    shaped = {"positive_mask": positive_mask, "exclude": exclude, "logit_bias": logit_bias, "target_probs": target_probs}
    for name, t in shaped.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
    logits = cosine_similarity_matrix(anchors, candidates) / temperature
    if logit_bias is not None:
        logits = logits + logit_bias.to(device=logits.device, dtype=logits.dtype)
    if positive_index is not None:
        return cross_entropy_from_logits(logits, positive_index, exclude)
    if target_probs is not None:
        return _soft_cross_entropy(logits, target_probs, exclude)
    assert positive_mask is not None  # exactly one of the three is given (checked above)
    positive_mask = positive_mask.to(device=logits.device, dtype=torch.bool)
    if exclude is not None:
        logits = logits.masked_fill(exclude & ~positive_mask, torch.finfo(logits.dtype).min)
    return _multi_positive(logits, positive_mask, variant, (anchors.sum() + candidates.sum()) * 0.0)


def matryoshka_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    dims: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """:func:`contrastive_loss` summed over prefixes: ``sum_k w_k * L(anchors[:, :d_k], candidates[:, :d_k])``.

    Each term re-normalises its prefix (the loss takes cosines), so the first ``d_k``
    coordinates become an embedding of their own: the model can be truncated to any
    ``d_k`` at inference (Matryoshka representation learning, Kusupati et al., 2022;
    sentence-transformers' ``MatryoshkaLoss``). Masks, positives and biases are the same
    for every prefix: they are decided once, on the full embeddings, by the caller.

    Args:
        anchors: ``[N, D]`` embeddings.
        candidates: ``[M, D]`` embeddings.
        dims: The prefix sizes ``d_k`` (each in ``1..D``); None: the full embedding only,
            exactly :func:`contrastive_loss`.
        weights: ``w_k`` per prefix (default all 1).
        **kwargs: :func:`contrastive_loss`'s keyword arguments.

    Returns:
        Scalar weighted sum.
    """
    if dims is None:
        return contrastive_loss(anchors, candidates, **kwargs)
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"{len(dims)} Matryoshka dims but {len(weights)} weights")
    full = anchors.shape[-1]
    if any(not 1 <= d <= full for d in dims):
        raise ValueError(f"Matryoshka dims {list(dims)} must lie in 1..{full} (the embedding size)")
    terms = [w * contrastive_loss(anchors[:, :d], candidates[:, :d], **kwargs) for d, w in zip(dims, weights, strict=True)]
    return torch.stack(terms).sum()


def info_nce(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    hard_negatives: torch.Tensor | None = None,
    *,
    temperature: float = 0.05,
    hard_negative_weight: float = 1.0,
    positive_index: torch.Tensor | None = None,
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
            other processes); anchor ``i``'s positive is row ``positive_index[i]``.
        hard_negatives: optional ``[M, D]``; anchor ``i``'s own hard negative is row
            ``positive_index[i]``. They become candidates ``M .. 2M - 1``.
        temperature: tau > 0.
        hard_negative_weight: alpha > 0 applied to each anchor's own hard negative.
        positive_index: ``[N]`` int64 row of each anchor's positive, default ``arange(N)``.
        exclude: optional ``[N, M]`` (or ``[N, 2M]`` with hard negatives) bool mask of
            candidates to drop from each anchor's softmax (false negatives).

    Returns:
        Scalar mean loss over anchors.
    """
    n, m = anchors.shape[0], positives.shape[0]
    if positive_index is None:
        if n != m:
            raise ValueError(f"positive_index is required when anchors ({n}) and positives ({m}) differ in size")
        positive_index = torch.arange(n, device=anchors.device)
    candidates, bias = positives, None
    if hard_negatives is not None:
        if hard_negatives.shape[0] != m:
            raise ValueError(f"hard_negatives has {hard_negatives.shape[0]} rows, positives {m}")
        dtype = torch.promote_types(positives.dtype, hard_negatives.dtype)
        candidates = torch.cat([positives.to(dtype), hard_negatives.to(dtype)])
        bias = masks.weight_bias(positive_index + m, 2 * m, hard_negative_weight, anchors)
    return contrastive_loss(
        anchors, candidates, temperature=temperature, positive_index=positive_index, exclude=exclude, logit_bias=bias
    )


def info_nce_views(
    embeddings: torch.Tensor,
    *,
    temperature: float = 0.05,
    ref_embeddings: torch.Tensor | None = None,
    offset: int = 0,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """InfoNCE over 2N views (NT-Xent), for unsupervised batches ``[a, a, b, b, ...]``.

    Each row's positive is its neighbour (``positive_index`` ``[1, 0, 3, 2, ...]``), its
    own similarity is masked out, and the other ``2N - 2`` rows are negatives. This is
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
    ref = embeddings if ref_embeddings is None else ref_embeddings
    n = embeddings.shape[0]
    positive = masks.view_labels(n, offset, embeddings.device)
    mask = masks.self_mask(n, ref.shape[0], offset, embeddings.device)
    if exclude is not None:
        mask |= exclude
    return contrastive_loss(embeddings, ref, temperature=temperature, positive_index=positive, exclude=mask)


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
    """Supervised contrastive loss (Khosla et al., 2020) over class labels or a positive mask.

    Anchor ``i``'s positives are the other candidates with its class label; its own
    row is excluded; see :func:`contrastive_loss` for ``L_out`` / ``L_in``. With one
    label per sentence over its two views this equals :func:`info_nce_views`.

    Args:
        embeddings: ``[N, D]`` anchor embeddings (normalised here).
        labels: ``[N]`` class labels; or give ``positive_mask``.
        positive_mask: ``[N, R]`` bool, True where candidate ``j`` is a positive of
            anchor ``i``; the self entry is ignored.
        temperature: tau > 0.
        variant: ``"out"`` or ``"in"``.
        ref_embeddings: optional ``[R, D]`` candidates (gathered); default
            ``embeddings``, with local rows at ``offset``.
        ref_labels: ``[R]`` class labels of the candidates when ``ref_embeddings`` is given.
        offset: index of the first local row in ``ref_embeddings``.

    Returns:
        Scalar mean loss over anchors that have at least one positive.
    """
    ref = embeddings if ref_embeddings is None else ref_embeddings
    n, r = embeddings.shape[0], ref.shape[0]
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
    own = masks.self_mask(n, r, offset, embeddings.device)
    positive_mask = positive_mask.to(device=embeddings.device, dtype=torch.bool) & ~own
    return contrastive_loss(embeddings, ref, temperature=temperature, positive_mask=positive_mask, exclude=own, variant=variant)
