"""The loss core on images (``simcse-kit demo digits``).

A small CNN is trained on scikit-learn's bundled 8x8 digits (1,797 images, no
download) with supervised contrastive learning (SupCon ``L_out``, Khosla et al.,
2020): two randomly shifted views of each image, every same-class view in the batch a
positive. The loss is :func:`simcse_kit.core.losses.supcon`, the function the text
objectives use, and the loop is :func:`simcse_kit.training.engine.loop.fit`, the text trainer's.

The learned features (the encoder output, below the projection head, as in SupCon)
are then judged by a linear probe (logistic regression on frozen features) against

  * the same encoder, randomly initialised and frozen, and
  * the same encoder trained with plain cross-entropy,

with raw pixels as a reference. A t-SNE plot of the test features is saved.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from simcse_kit.config.run import LoopConfig
from simcse_kit.core.losses import supcon
from simcse_kit.files import save_figure
from simcse_kit.training.engine.loop import fit, make_accelerator, prepare
from simcse_kit.training.engine.steps import Backward, Batch, Step

logger = logging.getLogger(__name__)


@dataclass
class DigitsConfig:
    """Settings of the digits demo (defaults: about a minute on one CPU thread)."""

    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    temperature: float = 0.1
    feature_dim: int = 128
    projection_dim: int = 64
    test_size: float = 0.25
    seed: int = 0
    tsne: bool = True


@dataclass
class DigitsResult:
    """Linear-probe test accuracies (fractions) and where the figure went."""

    accuracies: dict[str, float]
    train_seconds: dict[str, float] = field(default_factory=dict)
    n_train: int = 0
    n_test: int = 0
    figure: Path | None = None


class DigitsEncoder(nn.Module):
    """``[B, 1, 8, 8]`` images -> ``[B, feature_dim]`` features."""

    def __init__(self, feature_dim: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, feature_dim),
            nn.ReLU(),
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(pixels)


class DigitsModel(nn.Module):
    """Encoder + head: an MLP projection for SupCon, a linear classifier for cross-entropy."""

    def __init__(self, encoder: DigitsEncoder, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(pixels))


def projection_head(feature_dim: int, projection_dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, projection_dim))


def load_digits_split(test_size: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as ``[N, 1, 8, 8]`` floats in ``[0, 1]``, stratified split.

    Returns:
        ``x_train``, ``y_train``, ``x_test``, ``y_test``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=test_size, random_state=seed, stratify=digits.target)
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


def random_shift(images: torch.Tensor, generator: torch.Generator, max_shift: int = 1) -> torch.Tensor:
    """Translate each ``[B, 1, 8, 8]`` image by up to ``max_shift`` pixels (zero fill)."""
    b, _, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (b, 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


class ViewsCollator:
    """``[(image, label), ...]`` -> ``{"pixels": [V*B, 1, 8, 8], "labels": [V*B]}``.

    With ``views = 2`` the rows are ``[view1 of all; view2 of all]``, each a random
    shift: SupCon's two augmentations per image.
    """

    def __init__(self, views: int, seed: int = 0) -> None:
        self.views = views
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
        images = torch.stack([x for x, _ in items])
        labels = torch.stack([y for _, y in items])
        pixels = torch.cat([random_shift(images, self.generator) for _ in range(self.views)])
        return {"pixels": pixels, "labels": labels.repeat(self.views)}


def supcon_step(temperature: float) -> Step:
    """A :func:`fit` step: SupCon L_out over all views."""

    def step(model: nn.Module, batch: Batch, backward: Backward) -> torch.Tensor:
        loss = supcon(model(batch["pixels"]), batch["labels"], temperature=temperature, variant="out")
        backward(loss)
        return loss.detach()

    return step


def cross_entropy_step(model: nn.Module, batch: Batch, backward: Backward) -> torch.Tensor:
    """A :func:`fit` step: the supervised baseline."""
    loss = F.cross_entropy(model(batch["pixels"]), batch["labels"])
    backward(loss)
    return loss.detach()


def train_digits_model(model: DigitsModel, step: Step, views: int, x: torch.Tensor, y: torch.Tensor, cfg: DigitsConfig) -> float:
    """Train ``model`` in place with :func:`simcse_kit.training.engine.loop.fit`; return seconds."""
    loop_cfg = LoopConfig(
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_ratio=0.0,
        num_epochs=cfg.epochs,
        seed=cfg.seed,
        eval_steps=0,
        log_steps=10,
        progress_bar=False,
    )
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,  # SupCon wants full batches; the last partial one would be small
        collate_fn=ViewsCollator(views, cfg.seed),
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    state = fit(prepare(model, loader, loop_cfg, make_accelerator(loop_cfg, cpu=True)), step, loop_cfg)
    logger.info("trained %d steps in %.1fs, last loss %.4f", state.global_step, state.train_seconds, state.losses[-1][1])
    return state.train_seconds


@torch.no_grad()
def features(encoder: nn.Module, x: torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Frozen ``[N, feature_dim]`` features of un-augmented images."""
    encoder.eval()
    return torch.cat([encoder(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]).numpy()


def linear_probe(f_train: np.ndarray, y_train: np.ndarray, f_test: np.ndarray, y_test: np.ndarray) -> float:
    """Test accuracy of a logistic regression on standardised frozen features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
    probe.fit(f_train, y_train)
    return float(probe.score(f_test, y_test))


def plot_tsne(panels: dict[str, np.ndarray], labels: np.ndarray, path: Path, seed: int = 0) -> Path:
    """One t-SNE panel per feature set, points coloured and marked by digit (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.5))
    for ax, (title, feats) in zip(np.atleast_1d(axes), panels.items(), strict=True):
        xy = TSNE(n_components=2, init="pca", perplexity=30, random_state=seed).fit_transform(feats)
        scatter = ax.scatter(xy[:, 0], xy[:, 1], c=labels, cmap="tab10", vmin=-0.5, vmax=9.5, s=8)
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(scatter, ax=axes, ticks=range(10), label="digit")
    return save_figure(fig, path, dpi=110)


def run(cfg: DigitsConfig | None = None, output_dir: Path | None = Path("runs/demos/digits")) -> DigitsResult:
    """Train SupCon and cross-entropy encoders, probe all, plot t-SNE, print the table."""
    cfg = cfg or DigitsConfig()
    x_train, y_train, x_test, y_test = load_digits_split(cfg.test_size, cfg.seed)
    ytr, yte = y_train.numpy(), y_test.numpy()

    # The random baseline is the SupCon encoder's own initialisation, frozen.
    torch.manual_seed(cfg.seed)
    random_encoder = DigitsEncoder(cfg.feature_dim)
    supcon_model = DigitsModel(DigitsEncoder(cfg.feature_dim), projection_head(cfg.feature_dim, cfg.projection_dim))
    supcon_model.encoder.load_state_dict(random_encoder.state_dict())
    ce_model = DigitsModel(DigitsEncoder(cfg.feature_dim), nn.Linear(cfg.feature_dim, 10))
    ce_model.encoder.load_state_dict(random_encoder.state_dict())

    seconds = {
        "supcon": train_digits_model(supcon_model, supcon_step(cfg.temperature), 2, x_train, y_train, cfg),
        "cross_entropy": train_digits_model(ce_model, cross_entropy_step, 1, x_train, y_train, cfg),
    }
    feats = {
        "supcon": (features(supcon_model.encoder, x_train), features(supcon_model.encoder, x_test)),
        "random": (features(random_encoder, x_train), features(random_encoder, x_test)),
        "cross_entropy": (features(ce_model.encoder, x_train), features(ce_model.encoder, x_test)),
        "pixels": (x_train.flatten(1).numpy(), x_test.flatten(1).numpy()),
    }
    accuracies = {name: linear_probe(tr, ytr, te, yte) for name, (tr, te) in feats.items()}
    result = DigitsResult(accuracies, seconds, len(ytr), len(yte))

    print(format_digits_table(result, cfg))
    if output_dir is not None and cfg.tsne:
        start = time.perf_counter()
        panels = {
            f"SupCon encoder (probe {accuracies['supcon']:.1%})": feats["supcon"][1],
            f"random frozen encoder (probe {accuracies['random']:.1%})": feats["random"][1],
            f"cross-entropy encoder (probe {accuracies['cross_entropy']:.1%})": feats["cross_entropy"][1],
        }
        result.figure = plot_tsne(panels, yte, Path(output_dir) / "digits_tsne.png", cfg.seed)
        logger.info("t-SNE in %.1fs", time.perf_counter() - start)
        print(f"t-SNE of test features: {result.figure}")
    return result


def format_digits_table(result: DigitsResult, cfg: DigitsConfig) -> str:
    """Markdown table of linear-probe test accuracies."""
    names = {
        "supcon": f"SupCon L_out (tau={cfg.temperature:g}), {cfg.epochs} epochs",
        "random": "same encoder, random init, frozen",
        "cross_entropy": f"cross-entropy, {cfg.epochs} epochs",
        "pixels": "raw pixels (reference)",
    }
    lines = [
        f"Linear probe on frozen {cfg.feature_dim}-d features, 8x8 digits: {result.n_train} train / {result.n_test} test images",
        "",
        "| encoder | probe test accuracy | train seconds |",
        "|---|---:|---:|",
    ]
    for key, label in names.items():
        secs = f"{result.train_seconds[key]:.1f}" if key in result.train_seconds else "-"
        lines.append(f"| {label} | {result.accuracies[key]:.2%} | {secs} |")
    return "\n".join(lines)
