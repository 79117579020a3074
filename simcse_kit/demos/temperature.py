"""What the temperature does to the contrastive loss (``simcse-kit temperature``).

For one anchor with similarities ``s = [s_pos, s_neg1, ...]`` the InfoNCE loss is
``-log softmax(s / tau)_0``. Its gradient with respect to a negative's similarity is
``P_j / tau`` (``P = softmax(s / tau)``): hard negatives (high ``s_j``) get most of the
weight, and the smaller tau the more so (Wang & Liu, 2021, "hardness-aware"). The
loss and the gradient come from the loss core (``losses.cross_entropy_from_logits``)
and autograd, never from a re-derived formula.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from simcse_kit.core.losses import cross_entropy_from_logits
from simcse_kit.files import save_figure

logger = logging.getLogger(__name__)

DEFAULT_SIMILARITIES = (0.5, 0.25, -0.45, -0.1)
DEFAULT_TEMPERATURES = (1.0, 0.5, 0.2, 0.1, 0.05)


@dataclass
class TemperatureRow:
    """One temperature's numbers for one anchor.

    Attributes:
        temperature: tau.
        probabilities: softmax over ``s / tau``, positive first, length ``K``.
        loss: ``-log probabilities[0]``.
        gradients: ``d loss / d s``, length ``K``; the positive's is ``-(1 - P_0) / tau``,
            each negative's is ``P_j / tau`` (its weight).
    """

    temperature: float
    probabilities: list[float]
    loss: float
    gradients: list[float]

    @property
    def negative_weights(self) -> list[float]:
        return self.gradients[1:]


def temperature_row(similarities: Sequence[float], temperature: float) -> TemperatureRow:
    """Loss, softmax and gradient of one anchor's InfoNCE at one temperature.

    Args:
        similarities: ``[K]`` cosine similarities, the positive first, then ``K - 1``
            negatives.
        temperature: tau > 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if len(similarities) < 2:
        raise ValueError("need the positive's similarity and at least one negative's")
    # fp64 so the tiny probabilities at tau = 0.01 print as what they are.
    s = torch.tensor([list(similarities)], dtype=torch.float64, requires_grad=True)  # [1, K]
    logits = s / temperature
    loss = cross_entropy_from_logits(logits, torch.zeros(1, dtype=torch.long))
    (grad,) = torch.autograd.grad(loss, s)
    probs = torch.softmax(logits.detach(), dim=1)
    return TemperatureRow(temperature, probs[0].tolist(), float(loss.detach()), grad[0].tolist())


def temperature_table(similarities: Sequence[float], temperatures: Sequence[float]) -> list[TemperatureRow]:
    """:func:`temperature_row` for each temperature."""
    return [temperature_row(similarities, t) for t in temperatures]


def format_temperature_table(similarities: Sequence[float], rows: Sequence[TemperatureRow]) -> str:
    """A fixed-width table: tau, loss, softmax P_j and negative weights P_j / tau."""
    k = len(similarities)
    sims = "  ".join(f"{s:+.2f}" for s in similarities)
    head = ["tau", "loss"] + ["P_pos" if j == 0 else f"P_neg{j}" for j in range(k)] + [f"w_neg{j}" for j in range(1, k)]
    lines = [f"similarities (positive first): {sims}", "  ".join(f"{h:>9}" for h in head)]
    for r in rows:
        cells = [f"{r.temperature:9.4g}", f"{r.loss:9.4g}"]
        cells += [f"{p:9.4g}" for p in r.probabilities]
        cells += [f"{w:9.4g}" for w in r.negative_weights]
        lines.append("  ".join(cells))
    lines.append("w_negj = d loss / d s_j = P_j / tau: the weight of negative j in the gradient")
    return "\n".join(lines)


def hardness_curve(similarities: Sequence[float], temperature: float, grid: torch.Tensor, negative: int = 1) -> torch.Tensor:
    """Gradient weight on one negative as its similarity sweeps ``grid``, others fixed.

    Args:
        similarities: ``[K]`` similarities, positive first.
        temperature: tau.
        grid: ``[G]`` values for ``similarities[negative]``.
        negative: index (``>= 1``) of the negative that moves.

    Returns:
        ``[G]`` weights ``P_negative / tau``.
    """
    if not 1 <= negative < len(similarities):
        raise ValueError(f"negative must index a negative (1..{len(similarities) - 1}), got {negative}")
    s = torch.tensor(list(similarities), dtype=torch.float64).repeat(len(grid), 1)  # [G, K]
    s[:, negative] = grid.to(torch.float64)
    s.requires_grad_(True)
    loss = cross_entropy_from_logits(s / temperature, torch.zeros(len(grid), dtype=torch.long), reduction="sum")
    (grad,) = torch.autograd.grad(loss, s)  # rows are independent, so a sum gives each row's gradient
    return grad[:, negative].detach()


def plot_hardness(similarities: Sequence[float], temperatures: Sequence[float], path: Path) -> Path:
    """Plot the weight on a negative against its similarity, one curve per tau (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.linspace(-1.0, 1.0, 201, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for tau in temperatures:
        w = hardness_curve(similarities, tau, grid)
        axes[0].plot(grid.numpy(), w.numpy(), label=f"tau={tau:g}")
        # Normalised by its maximum: the shape (how peaked on hard negatives) is what tau changes.
        axes[1].plot(grid.numpy(), (w / w.max()).numpy(), label=f"tau={tau:g}")
    others = ", ".join(f"{s:+.2f}" for s in similarities[2:])
    axes[0].set(
        xlabel="similarity of the negative s_neg",
        ylabel="gradient weight P_neg / tau",
        yscale="log",
        title=f"s_pos={similarities[0]:+.2f}, other negatives {others}",
    )
    axes[0].set_ylim(bottom=1e-6)  # below that the curves only show underflow
    axes[1].set(xlabel="similarity of the negative s_neg", ylabel="weight / max weight", title="hardness awareness")
    for ax in axes:
        ax.axvline(similarities[0], color="grey", lw=0.8, ls="--")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def run(
    similarities: Sequence[float] = DEFAULT_SIMILARITIES,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
    output_dir: Path | None = Path("runs/demos/temperature"),
) -> list[TemperatureRow]:
    """Print the table; save ``hardness.png`` under ``output_dir`` (skipped if None)."""
    rows = temperature_table(similarities, temperatures)
    print(format_temperature_table(similarities, rows))
    if output_dir is not None:
        path = plot_hardness(similarities, temperatures, Path(output_dir) / "hardness.png")
        print(f"hardness-awareness plot: {path}")
    return rows
