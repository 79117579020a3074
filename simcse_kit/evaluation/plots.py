"""Figures of a run: matplotlib on its file-only backend, and the training curves.

:func:`plot_training_curves` draws a run's ``training_curves.png``: the training loss and
the dev score against the optimiser step, the best checkpoint marked in both panels. (The
alignment/uniformity trajectory lives with its measures:
:func:`simcse_kit.evaluation.geometry.plot_trajectory`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simcse_kit.files import save_figure

__all__ = ["plot_training_curves", "pyplot", "training_curves"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: runs draw into files on servers and CI
    without a display. Imported on first use, since most commands draw nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def training_curves(
    losses: Sequence[tuple[int, float]],
    evals: Sequence[Mapping[str, float]],
    metric: str,
    best_step: int | None = None,
    title: str = "",
    label: str | None = None,
) -> Any:
    """The figure of :func:`plot_training_curves` (two axes: loss above, ``metric`` below).

    Args:
        losses: ``(step, loss)`` of each logged step (the trainer's ``LoopState.losses``).
        evals: each evaluation's metrics with ``"step"`` (``LoopState.evals``; step 0 is
            the untouched model).
        metric: the key of ``evals`` to draw, the one that selects the best checkpoint.
        best_step: the best checkpoint's step, marked in both panels; None or < 0: unmarked.
        title: figure title.
        label: what ``metric`` measures, the lower axis' label (e.g. "SICK trial
            Spearman x 100"); None: ``metric``.

    Returns:
        The matplotlib figure (not yet saved).
    """
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5.5), sharex=True)
    top.plot([s for s, _ in losses], [v for _, v in losses], color="tab:blue", lw=1.0)
    top.set(ylabel="training loss", title=title or "training curves")
    values = [v for _, v in losses]
    if values and min(values) > 0 and max(values) > 20 * min(values):
        # A fine-tuned model's contrastive loss spans decades (1e-4..1e-2): linear hides it.
        top.set_yscale("log")
    points = [(e["step"], e[metric]) for e in evals if metric in e]
    bottom.plot([s for s, _ in points], [v for _, v in points], color="tab:green", marker="o", ms=3, lw=1.0)
    bottom.set(xlabel="step", ylabel=label or metric)
    best = [v for s, v in points if s == best_step] if best_step is not None and best_step >= 0 else []
    if best:
        for ax in (top, bottom):
            ax.axvline(best_step, color="tab:red", ls="--", lw=0.8)
        bottom.plot([best_step], best[:1], marker="*", ms=12, color="tab:red", ls="none", label=f"best: step {best_step}")
        bottom.legend(loc="best")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_training_curves(
    losses: Sequence[tuple[int, float]],
    evals: Sequence[Mapping[str, float]],
    path: str | Path,
    metric: str,
    best_step: int | None = None,
    title: str = "",
    label: str | None = None,
) -> Path | None:
    """Save the training curves (loss and ``metric``, labelled ``label``, against the step,
    best step marked) as an image (format from the suffix; atomic).

    Returns:
        ``path``, or None when there is nothing to draw (no loss and no evaluation).
    """
    if not losses and not any(metric in e for e in evals):
        return None
    return save_figure(training_curves(losses, evals, metric, best_step, title, label), path)
