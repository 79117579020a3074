"""Alignment and uniformity on STS-B (``simcse-kit align-uniform MODEL``), and the
training-trajectory plot in the alignment-uniformity plane (SimCSE, Figure 2).

As in SimCSE: alignment over STS-B pairs with a gold score of at least 4 (the
positives), uniformity over all sentences of the split; both on L2-normalised
embeddings, lower is better (see :mod:`simcse_kit.geometry`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from simcse_kit.fileio import save_figure
from simcse_kit.geometry import EmbeddingRecorder

if TYPE_CHECKING:
    from simcse_kit.sts import Encoder, STSPairs

logger = logging.getLogger(__name__)


def sts_alignment_uniformity(
    encode: Encoder,
    pairs: STSPairs,
    threshold: float = 4.0,
    batch_size: int = 128,
) -> dict[str, float]:
    """Alignment, uniformity and Spearman x 100 of ``encode`` on one STS-B split.

    Every distinct sentence is encoded once; the same embeddings give all three.

    Args:
        encode: ``encode(list[str]) -> [B, D]``.
        pairs: an :class:`simcse_kit.sts.STSPairs`.
        threshold: minimum gold score of a positive pair.
        batch_size: sentences per ``encode`` call.

    Returns:
        ``{"alignment", "uniformity", "positive_pairs", "spearman"}``.
    """
    from simcse_kit.sts import score_splits, spearman100

    recorder = EmbeddingRecorder(encode)
    cos, gold = score_splits(recorder, {"split": pairs}, batch_size)["split"]
    geo = recorder.pair_alignment_uniformity(pairs.sentences1, pairs.sentences2, pairs.scores, threshold)
    return geo | {"spearman": spearman100(cos, gold)}


def align_uniform_model(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path = "../shared/data/senteval",
    split: str = "dev",
    threshold: float = 4.0,
    json_out: str | Path | None = None,
    batch_size: int = 128,
) -> dict[str, float]:
    """Load any model (as ``simcse-kit evaluate`` does) and print its STS-B geometry."""
    from simcse_kit.errors import ConfigError
    from simcse_kit.modeling import load_encoder
    from simcse_kit.sts import DEFAULT_SUITE, read_stsb

    if split not in ("dev", "test", "train"):
        raise ConfigError(f"--split must be dev, test or train, got {split!r}")
    # Read the data first: a bad data folder fails before the model loads.
    pairs = read_stsb(Path(data_dir) / DEFAULT_SUITE["STSBenchmark"].path / f"sts-{split}.csv")
    encoder = load_encoder(model, pooler=pooler)
    result = sts_alignment_uniformity(encoder.encode, pairs, threshold, batch_size)
    print(f"STS-B {split}: {len(pairs)} pairs, {int(result['positive_pairs'])} with gold >= {threshold:g}")
    print(f"alignment  {result['alignment']:.4f}   (lower is better)")
    print(f"uniformity {result['uniformity']:.4f}   (lower is better)")
    print(f"spearman   {result['spearman']:.2f}")
    if json_out is not None:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def plot_trajectory(evals: Sequence[dict[str, float]], path: Path, title: str = "") -> Path | None:
    """Plot each evaluation's (uniformity, alignment), coloured by step (PNG).

    Args:
        evals: dicts with ``"step"``, ``"alignment"``, ``"uniformity"`` (others ignored),
            e.g. ``LoopState.evals``.
        path: where to save.
        title: figure title.

    Returns:
        ``path``, or None when no evaluation carries both values.
    """
    points = [e for e in evals if "alignment" in e and "uniformity" in e]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e["step"] for e in points]
    x = [e["uniformity"] for e in points]
    y = [e["alignment"] for e in points]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(x, y, color="grey", lw=0.8, zorder=1)
    sc = ax.scatter(x, y, c=steps, cmap="viridis", s=30, zorder=2)
    fig.colorbar(sc, ax=ax, label="step")
    ax.set(xlabel="uniformity (lower is better)", ylabel="alignment (lower is better)", title=title or "STS-B dev")
    fig.tight_layout()
    return save_figure(fig, path)  # atomic: a run folder never holds half a figure
