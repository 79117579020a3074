"""Alignment and uniformity of an embedding space (Wang & Isola, 2020), and the
training-trajectory plot in their plane (SimCSE, Figure 2).

Both are computed on L2-normalised embeddings, as in the paper and in SimCSE's
Figure 2; lower is better for both:

  * alignment ``l_align = E_{(x, y) ~ p_pos} ||f(x) - f(y)||_2^alpha`` (alpha = 2):
    how close positive pairs sit;
  * uniformity ``l_uniform = log E_{x, y ~ p_data} exp(-t ||f(x) - f(y)||_2^2)``
    (t = 2), over all pairs ``i < j``: how evenly the embeddings cover the sphere.

On the unit sphere ``||u - v||^2 = 2 - 2 cos(u, v)``, so alignment lies in ``[0, 4]``
and uniformity in ``[-4, 0]`` (``0``: everything collapsed to one point).

The measures take tensors and need only torch, so the text trainer, the demos and the
tests call the same code; the STS-B geometry of an encoder is
:func:`simcse_kit.evaluation.sts.sts_alignment_uniformity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from simcse_kit.evaluation.plots import pyplot
from simcse_kit.files import save_figure

__all__ = ["alignment", "pair_alignment_uniformity", "plot_trajectory", "uniformity"]


def _as_float(x: torch.Tensor) -> torch.Tensor:
    # fp16/bf16 squared distances lose the small differences uniformity is made of.
    return x.to(torch.promote_types(x.dtype, torch.float32))


def alignment(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0, normalize: bool = True) -> torch.Tensor:
    """Mean ``||x_i - y_i||_2^alpha`` over positive pairs ``(x_i, y_i)``.

    Args:
        x: ``[N, D]`` embeddings of the first element of each positive pair.
        y: ``[N, D]`` embeddings of the second element, row-aligned with ``x``.
        alpha: exponent on the distance (the paper's default, 2).
        normalize: L2-normalise rows first (the definition assumes the unit sphere).

    Returns:
        Scalar (fp32 or fp64), differentiable.
    """
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(f"alignment needs two [N, D] tensors of the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("alignment needs at least one pair")
    x, y = _as_float(x), _as_float(y)
    if normalize:
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    return (x - y).norm(p=2, dim=1).pow(alpha).mean()


def uniformity(x: torch.Tensor, t: float = 2.0, normalize: bool = True) -> torch.Tensor:
    """``log mean_{i<j} exp(-t ||x_i - x_j||_2^2)`` over all distinct pairs of rows.

    Computed as ``logsumexp - log(#pairs)`` so it stays finite when the embeddings
    are spread out (every ``exp`` tiny) and exact at 0 when they collapse.

    Args:
        x: ``[N, D]`` embeddings, ``N >= 2``.
        t: the Gaussian-potential scale (the paper's default, 2).
        normalize: L2-normalise rows first.

    Returns:
        Scalar (fp32 or fp64), differentiable.
    """
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"uniformity needs an [N, D] tensor with N >= 2, got {tuple(x.shape)}")
    x = _as_float(x)
    if normalize:
        x = F.normalize(x, dim=-1)
    sq = torch.pdist(x, p=2).pow(2)  # [N (N - 1) / 2], the pairs i < j
    return torch.logsumexp(-t * sq, dim=0) - torch.log(torch.tensor(float(sq.numel()), dtype=sq.dtype))


def pair_alignment_uniformity(
    embeddings: torch.Tensor,
    index1: torch.Tensor,
    index2: torch.Tensor,
    scores: torch.Tensor,
    threshold: float = 4.0,
) -> dict[str, float]:
    """Alignment and uniformity of a scored pair set such as STS-B dev.

    As in SimCSE (Section 5, Figure 2): alignment over the pairs whose gold score is
    at least ``threshold`` (the positives), uniformity over all sentences.

    Args:
        embeddings: ``[U, D]`` one row per distinct sentence.
        index1: ``[N]`` int64 row of each pair's first sentence.
        index2: ``[N]`` int64 row of each pair's second sentence.
        scores: ``[N]`` gold similarity of each pair.
        threshold: minimum gold score of a positive pair (STS scale 0-5).

    Returns:
        ``{"alignment": float, "uniformity": float, "positive_pairs": float}``.
    """
    scores = torch.as_tensor(scores)
    positive = scores >= threshold
    if not bool(positive.any()):
        raise ValueError(f"no pair has a gold score >= {threshold}")
    index1, index2 = torch.as_tensor(index1), torch.as_tensor(index2)
    with torch.no_grad():
        align = alignment(embeddings[index1[positive]], embeddings[index2[positive]])
        uniform = uniformity(embeddings)
    return {"alignment": float(align), "uniformity": float(uniform), "positive_pairs": float(positive.sum())}


def plot_trajectory(evals: Sequence[dict[str, float]], path: Path, title: str = "") -> Path | None:
    """Plots each evaluation's (uniformity, alignment), coloured by step (PNG).

    Args:
        evals: dicts with ``"step"``, ``"alignment"``, ``"uniformity"`` (others ignored),
            e.g. the trainer's list of dev evaluations.
        path: where to save.
        title: figure title (default ``"STS-B dev"``).

    Returns:
        ``path``, or None when no evaluation carries both values.
    """
    points = [e for e in evals if "alignment" in e and "uniformity" in e]
    if not points:
        return None
    plt = pyplot()
    steps = [e["step"] for e in points]
    x = [e["uniformity"] for e in points]
    y = [e["alignment"] for e in points]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(x, y, color="grey", lw=0.8, zorder=1)
    sc = ax.scatter(x, y, c=steps, cmap="viridis", s=30, zorder=2)
    fig.colorbar(sc, ax=ax, label="step")
    ax.annotate(f"step {steps[0]:g}", (x[0], y[0]), textcoords="offset points", xytext=(4, 4), fontsize=8)  # where it starts
    ax.set(xlabel="uniformity (lower is better)", ylabel="alignment (lower is better)", title=title or "STS-B dev")
    fig.tight_layout()
    return save_figure(fig, path)  # atomic: a run folder never holds half a figure
