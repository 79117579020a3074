"""Losses of graded pairs and of a teacher's scores: the non-InfoNCE half of the loss core.

Two families, beside :mod:`simcse_kit.core.losses`' contrastive ones:

  * *score ranking* over pairs with graded labels (STS-B's 0-5, SICK's 1-5, any range):
    :func:`cosent_loss` (CoSENT, Su 2022 / Huang et al. 2024) and :func:`angle_loss`
    (AnglE, Li and Li 2024), both :func:`score_ranking_loss` of a pair similarity:
    ``log(1 + sum_{(i, j): y_i < y_j} exp(scale * (s_i - s_j)))``: every pair the labels
    rank below another must have a lower similarity. Only the labels' *order* counts, so
    any monotone normalisation of the scores gives the same loss;
  * *teacher-score distillation* over each anchor's candidates (column 0 its positive,
    then its negatives), from a teacher's scores of the same candidates (a cross-encoder's
    logits, a bi-encoder's cosines): :func:`kl_distillation_loss` (KL between the
    teacher's and the student's softmax, each at its own temperature) and
    :func:`margin_mse_loss` (MSE between the student's and the teacher's margins
    ``positive - negative``, Hofstaetter et al. 2020).

Numerics and masking are those of :mod:`simcse_kit.core.losses`: scores are taken in fp32
(fp64 stays fp64) with autocast off; entries left out of a softmax or a log-sum-exp get
the dtype's own ``finfo.min`` (never ``-1e12``, which is ``-inf`` in fp16); a row's
positive (column 0) is never excluded; when nothing is left to compare the loss is a zero
that still carries the graph, never NaN. The module imports only torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = [
    "SCORE_LOSSES",
    "angle_loss",
    "angle_similarity",
    "candidate_cosines",
    "cosent_loss",
    "kl_distillation_loss",
    "margin_mse_loss",
    "pair_cosines",
    "score_ranking_loss",
]


def _working_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 when an input is fp64: the loss core's precision."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def pair_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each pair ``(a[i], b[i])`` in fp32 (fp64 stays fp64).

    Args:
        a: ``[N, D]`` embeddings of the pairs' first sentences.
        b: ``[N, D]`` embeddings of their second sentences.

    Returns:
        ``[N]`` cosines.
    """
    dtype = _working_dtype(a, b)
    with torch.autocast(device_type=a.device.type, enabled=False):
        return (F.normalize(a.to(dtype), dim=-1) * F.normalize(b.to(dtype), dim=-1)).sum(dim=-1)


def angle_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """AnglE's pair similarity ``|cos(a, b) + sin(a, b)|`` after L2 normalisation.

    Dimension ``k`` and ``k + D/2`` form the real and imaginary part of one complex
    coordinate; ``sin = sum_k (a_im b_re - a_re b_im)`` (AnglE's reference code, as
    sentence-transformers' ``pairwise_angle_sim``: not a geometric angle). An odd width is
    padded with one zero coordinate, as there.

    Args:
        a: ``[N, D]`` embeddings of the pairs' first sentences.
        b: ``[N, D]`` embeddings of their second sentences.

    Returns:
        ``[N]`` similarities in ``[0, sqrt(2)]``.
    """
    dtype = _working_dtype(a, b)
    with torch.autocast(device_type=a.device.type, enabled=False):
        a, b = a.to(dtype), b.to(dtype)
        if a.shape[-1] % 2:
            a, b = F.pad(a, (0, 1)), F.pad(b, (0, 1))
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
        cosines = (a * b).sum(dim=-1)
        a_re, a_im = a.chunk(2, dim=-1)
        b_re, b_im = b.chunk(2, dim=-1)
        sines = (a_im * b_re - a_re * b_im).sum(dim=-1)
        return (cosines + sines).abs()


def score_ranking_loss(similarities: torch.Tensor, scores: torch.Tensor, *, scale: float = 20.0) -> torch.Tensor:
    """CoSENT's ranking loss of pair similarities under graded labels.

    ``log(1 + sum_{(i, j): y_i < y_j} exp(scale * (s_i - s_j)))``: the sum runs over every
    ordered couple of pairs whose labels are strictly ordered (ties say nothing), each term
    penalising a lower-labelled pair that is not less similar. Computed as one log-sum-exp
    over ``[0] + [N*N]`` entries, the unordered couples filled with the dtype's minimum.

    Args:
        similarities: ``[N]`` the model's similarity of each pair (cosines for CoSENT).
        scores: ``[N]`` graded labels, any range (only their order counts).
        scale: the inverse temperature (sentence-transformers' default 20).

    Returns:
        Scalar loss; 0 (with a graph) when no two labels differ.
    """
    if similarities.ndim != 1 or scores.shape != similarities.shape:
        raise ValueError(f"similarities and scores must both be [N]; got {tuple(similarities.shape)} and {tuple(scores.shape)}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    dtype = _working_dtype(similarities)
    with torch.autocast(device_type=similarities.device.type, enabled=False):
        s = similarities.to(dtype) * scale
        y = scores.to(similarities.device)
        lower = y[:, None] < y[None, :]  # [i, j]: pair i ranks below pair j
        diff = (s[:, None] - s[None, :]).masked_fill(~lower, torch.finfo(dtype).min)
        return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), dim=0)


def cosent_loss(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, *, scale: float = 20.0) -> torch.Tensor:
    """CoSENT: :func:`score_ranking_loss` of the pairs' cosines (sentence-transformers' ``CoSENTLoss``).

    Args:
        a: ``[N, D]`` first sentences' embeddings.
        b: ``[N, D]`` second sentences' embeddings.
        scores: ``[N]`` graded labels.
        scale: inverse temperature (default 20).

    Returns:
        Scalar loss.
    """
    return score_ranking_loss(pair_cosines(a, b), scores, scale=scale)


def angle_loss(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, *, scale: float = 20.0) -> torch.Tensor:
    """AnglE: :func:`score_ranking_loss` of :func:`angle_similarity` (sentence-transformers' ``AnglELoss``).

    Args:
        a: ``[N, D]`` first sentences' embeddings.
        b: ``[N, D]`` second sentences' embeddings.
        scores: ``[N]`` graded labels.
        scale: inverse temperature (default 20).

    Returns:
        Scalar loss.
    """
    return score_ranking_loss(angle_similarity(a, b), scores, scale=scale)


SCORE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"cosent": cosent_loss, "angle": angle_loss}
"""The score-ranking losses by their config name (``loss.score_loss``)."""


def candidate_cosines(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Each anchor's cosine with each of its own candidates, in fp32 (fp64 stays fp64).

    Args:
        anchors: ``[N, D]``.
        candidates: ``[N, C, D]``: anchor ``i``'s candidates, its positive first.

    Returns:
        ``[N, C]`` cosines, the student's scores for :func:`kl_distillation_loss` and
        :func:`margin_mse_loss`.
    """
    dtype = _working_dtype(anchors, candidates)
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        a = F.normalize(anchors.to(dtype), dim=-1)
        c = F.normalize(candidates.to(dtype), dim=-1)
        return torch.einsum("nd,ncd->nc", a, c)


def _check_candidates(student: torch.Tensor, teacher: torch.Tensor, exclude: torch.Tensor | None) -> torch.Tensor | None:
    """Shapes checked; ``exclude`` on the student's device with column 0 (the positive) kept."""
    if student.ndim != 2 or teacher.shape != student.shape:
        raise ValueError(f"student and teacher scores must both be [N, C]; got {tuple(student.shape)} and {tuple(teacher.shape)}")
    if exclude is None:
        return None
    if exclude.shape != student.shape:
        raise ValueError(f"exclude must be {tuple(student.shape)}, got {tuple(exclude.shape)}")
    exclude = exclude.to(device=student.device, dtype=torch.bool).clone()
    exclude[:, 0] = False  # a row's positive is never excluded
    return exclude


def kl_distillation_loss(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    *,
    student_temperature: float,
    teacher_temperature: float,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL divergence from the teacher's softmax over each anchor's candidates to the student's.

    ``mean_i KL(p_i || q_i) = mean_i sum_j p_ij (log p_ij - log q_ij)`` with
    ``p_i = softmax_j(teacher_ij / tau_t)`` (no gradient) and
    ``q_i = softmax_j(student_ij / tau_s)``, over the candidates not in ``exclude``. Its
    gradient is that of the soft-target cross-entropy (the teacher's entropy is a
    constant), but its value is 0 exactly when the student matches the teacher.

    Args:
        student_scores: ``[N, C]`` the student's scores (cosines, :func:`candidate_cosines`),
            column 0 each anchor's positive.
        teacher_scores: ``[N, C]`` the teacher's scores of the same candidates.
        student_temperature: ``tau_s`` > 0.
        teacher_temperature: ``tau_t`` > 0.
        exclude: optional ``[N, C]`` bool, candidates outside a row's softmaxes (on both
            sides); column 0 is never excluded.

    Returns:
        Scalar mean over anchors.
    """
    if student_temperature <= 0 or teacher_temperature <= 0:
        raise ValueError(f"temperatures must be > 0, got student {student_temperature}, teacher {teacher_temperature}")
    exclude = _check_candidates(student_scores, teacher_scores, exclude)
    dtype = _working_dtype(student_scores)
    with torch.autocast(device_type=student_scores.device.type, enabled=False):
        student = student_scores.to(dtype) / student_temperature
        with torch.no_grad():
            teacher = teacher_scores.to(device=student.device, dtype=dtype) / teacher_temperature
        if exclude is not None:
            student = student.masked_fill(exclude, torch.finfo(dtype).min)
            teacher = teacher.masked_fill(exclude, float("-inf"))  # p exactly 0 there
        log_q = torch.log_softmax(student, dim=1)
        p = torch.softmax(teacher, dim=1)
        # xlogy: 0 * log 0 = 0 on excluded entries; their log q is finite (dtype min, not -inf).
        return (torch.xlogy(p, p) - p * log_q).sum(dim=1).mean()


def margin_mse_loss(
    student_scores: torch.Tensor, teacher_scores: torch.Tensor, *, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """MarginMSE: the student's margins ``s_i0 - s_ij`` regressed onto the teacher's ``t_i0 - t_ij``.

    ``mean_{(i, j), j >= 1, not excluded} ((s_i0 - s_ij) - (t_i0 - t_ij))^2``, as
    sentence-transformers' ``MarginMSELoss`` (Hofstaetter et al., 2020) with several
    negatives. The scores are used as they are (no temperature): the student's must be on
    the teacher's scale for the margins to be comparable (scale them before if not).

    Args:
        student_scores: ``[N, C]`` column 0 each anchor's positive, columns ``1..C-1`` its
            negatives (``C >= 2``).
        teacher_scores: ``[N, C]`` the teacher's scores of the same candidates (no gradient).
        exclude: optional ``[N, C]`` bool, negatives left out of the mean (column 0 ignored).

    Returns:
        Scalar mean over the (anchor, negative) entries kept; a graph-carrying 0 when none is.
    """
    exclude = _check_candidates(student_scores, teacher_scores, exclude)
    if student_scores.shape[1] < 2:
        columns = student_scores.shape[1]
        raise ValueError(f"margin_mse_loss needs a positive and at least one negative per row; got {columns} column(s)")
    dtype = _working_dtype(student_scores)
    with torch.autocast(device_type=student_scores.device.type, enabled=False):
        student = student_scores.to(dtype)
        teacher = teacher_scores.detach().to(device=student.device, dtype=dtype)
        squared = ((student[:, :1] - student[:, 1:]) - (teacher[:, :1] - teacher[:, 1:])) ** 2
        if exclude is None:
            return squared.mean()
        kept = ~exclude[:, 1:]
        # Sum over the kept entries / their count (at least 1), not squared[kept]: a boolean
        # index reads the mask back to the host (a GPU sync); with none kept this is a 0 with graph.
        return squared.masked_fill(~kept, 0.0).sum() / kept.sum().clamp(min=1)
