"""A 2-D toy that shows what the temperature does to the features (``simcse-kit demo toy``).

100 points in the plane, labelled by quadrant (four classes of 25), are mapped by
``Linear(2, 10) -> Linear(10, 2) -> Tanh`` and trained with InfoNCE: each anchor gets
one positive from its own class and three negatives, one from each other class,
redrawn every step; the rest of the batch is excluded from its softmax. The logits go
through the loss core's ``cross_entropy_from_logits`` (the function every InfoNCE of
the text trainer ends in), or through ``info_nce`` itself with ``similarity="cosine"``.

The default similarity is the dot product of the tanh features: the tanh bounds it to
``[-2, 2]``, so the features' length matters and the temperature decides how hard the
loss pushes them out (with cosine the tanh would be irrelevant). Plain SGD keeps the
gradient's ``1 / tau`` scale, which is part of what the temperature does (Adam would
normalise it away).

What to expect (default settings): at tau near 1 every negative weighs the same, and
merging two classes costs the loss as little as separating them, so uniformity is
poor; a moderate tau (0.5 to 0.05) puts the four classes in four corners, the most
uniform layout the square allows; at tau = 0.001 the gradients are 1000x larger, the
tanh saturates at once and all features collapse into one corner.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from simcse_kit.core.losses import cross_entropy_from_logits, info_nce
from simcse_kit.evaluation.geometry import alignment, uniformity
from simcse_kit.files import save_figure

logger = logging.getLogger(__name__)

TEMPERATURES = (0.99, 0.5, 0.05, 0.01, 0.001)


@dataclass
class ToyResult:
    """One temperature's run.

    Attributes:
        temperature: tau.
        features: ``[100, 2]`` tanh outputs after training (not normalised).
        labels: ``[100]`` quadrant classes.
        alignment: mean ``||f(x) - f(y)||^2`` over same-class pairs (normalised).
        uniformity: ``log mean exp(-2 ||f(x) - f(y)||^2)`` over all pairs (normalised).
        corner_fraction: share of points with ``|x| > 0.95`` and ``|y| > 0.95``.
        final_loss: the last step's loss.
    """

    temperature: float
    features: torch.Tensor
    labels: torch.Tensor
    alignment: float
    uniformity: float
    corner_fraction: float
    final_loss: float


def quadrant_points(n_per_class: int = 25, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_per_class`` points in each quadrant, uniform in ``[0.05, 1]`` away from each axis.

    Returns:
        ``[4n, 2]`` points and ``[4n]`` labels (0: +x+y, 1: -x+y, 2: -x-y, 3: +x-y).
    """
    g = torch.Generator().manual_seed(seed)
    signs = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
    mag = 0.05 + 0.95 * torch.rand(4, n_per_class, 2, generator=g)
    points = (mag * signs[:, None, :]).reshape(-1, 2)
    labels = torch.arange(4).repeat_interleave(n_per_class)
    return points, labels


def toy_encoder() -> nn.Module:
    """The issue's encoder: no activation between the two linear layers, tanh on top."""
    return nn.Sequential(nn.Linear(2, 10), nn.Linear(10, 2), nn.Tanh())


def sample_candidates(labels: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One same-class positive and one negative from each other class, per anchor.

    Args:
        labels: ``[N]`` class of each point.
        generator: drives the draws.

    Returns:
        ``positive`` ``[N]`` int64 index of each anchor's positive, and ``exclude``
        ``[N, N]`` bool, False only at the anchor's positive and its negatives.
    """
    n = labels.shape[0]
    classes = labels.unique()
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(n, dtype=torch.bool)
    keep = torch.zeros(n, n, dtype=torch.bool)
    noise = torch.rand(n, n, generator=generator)
    # Random choice per row = argmax of uniform noise over the allowed columns.
    positive = noise.masked_fill(~same | eye, -1.0).argmax(dim=1)
    keep[torch.arange(n), positive] = True
    for c in classes:
        in_c = (labels == c)[None, :].expand(n, n)
        neg = noise.masked_fill(~in_c | same, -1.0).argmax(dim=1)  # rows of class c get no negative from c
        rows = labels != c
        keep[rows.nonzero().squeeze(1), neg[rows]] = True
    return positive, ~keep


def corner_fraction(features: torch.Tensor, level: float = 0.95) -> float:
    """Share of rows of ``[N, 2]`` features with both coordinates beyond ``level`` in size."""
    return float((features.abs() > level).all(dim=1).float().mean())


def toy_loss(
    features: torch.Tensor, positive: torch.Tensor, exclude: torch.Tensor, temperature: float, similarity: str
) -> torch.Tensor:
    """InfoNCE of ``[N, 2]`` features against their sampled positive and negatives.

    Args:
        features: ``[N, 2]`` encoder outputs.
        positive: ``[N]`` column of each anchor's positive.
        exclude: ``[N, N]`` bool, True for candidates outside the anchor's softmax.
        temperature: tau.
        similarity: ``"dot"`` (``f_i . f_j``) or ``"cosine"``.
    """
    if similarity == "cosine":
        return info_nce(features, features, positive_index=positive, exclude=exclude, temperature=temperature)
    if similarity != "dot":
        raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
    return cross_entropy_from_logits(features @ features.T / temperature, positive, exclude)


def train_toy(temperature: float, steps: int = 1000, lr: float = 0.05, seed: int = 0, similarity: str = "dot") -> ToyResult:
    """Train a fresh toy encoder with InfoNCE at ``temperature`` (full batch, SGD).

    The data, the initial weights and the candidate draws depend only on ``seed``, so
    every temperature starts from the same point.
    """
    points, labels = quadrant_points(seed=seed)
    torch.manual_seed(seed)
    model = toy_encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + 1)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        positive, exclude = sample_candidates(labels, generator)
        features = model(points)  # [N, 2]
        loss = toy_loss(features, positive, exclude, temperature, similarity)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        features = model(points)
        same = (labels[:, None] == labels[None, :]).triu(diagonal=1)
        i, j = same.nonzero(as_tuple=True)
        align = float(alignment(features[i], features[j]))
        uniform = float(uniformity(features))
    return ToyResult(temperature, features, labels, align, uniform, corner_fraction(features), float(loss.detach()))


def plot_toy(results: Sequence[ToyResult], path: Path) -> Path:
    """One panel per temperature: the features in the plane, coloured by class (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points, labels = quadrant_points()
    fig, axes = plt.subplots(1, len(results) + 1, figsize=(3.2 * (len(results) + 1), 3.6))
    axes[0].scatter(points[:, 0], points[:, 1], c=labels, cmap="tab10", vmin=0, vmax=9, s=12)
    axes[0].set_title("input (4 quadrant classes)", fontsize=9)
    for ax, r in zip(axes[1:], results, strict=True):
        f = r.features.numpy()
        ax.scatter(f[:, 0], f[:, 1], c=r.labels.numpy(), cmap="tab10", vmin=0, vmax=9, s=12, alpha=0.7)
        ax.set_title(f"tau={r.temperature:g}\nalign={r.alignment:.3f} unif={r.uniformity:.3f}", fontsize=9)
    for ax in axes:
        ax.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), aspect="equal")
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
    fig.tight_layout()
    return save_figure(fig, path)


def run(
    temperatures: Sequence[float] = TEMPERATURES,
    steps: int = 1000,
    seed: int = 0,
    similarity: str = "dot",
    output_dir: Path | None = Path("runs/demos/toy"),
) -> list[ToyResult]:
    """Train at each temperature, print a table, save ``toy.png`` under ``output_dir``."""
    results = []
    for tau in temperatures:
        results.append(train_toy(tau, steps=steps, seed=seed, similarity=similarity))
        logger.info("tau=%g done", tau)
    print(f"{'tau':>7}  {'loss':>8}  {'alignment':>9}  {'uniformity':>10}  {'in corners':>10}")
    for r in results:
        print(f"{r.temperature:7g}  {r.final_loss:8.4f}  {r.alignment:9.4f}  {r.uniformity:10.4f}  {r.corner_fraction:10.0%}")
    if output_dir is not None:
        path = plot_toy(results, Path(output_dir) / "toy.png")
        print(f"figure: {path}")
    return results
