"""The image demo, the 2-D toy, the temperature table and their commands."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from simcse_kit.cli import main
from simcse_kit.demos import digits, temperature, toy

SIMS = (0.5, 0.25, -0.45, -0.1)


# --------------------------------------------------------------------------- temperature


@pytest.mark.parametrize(("tau", "loss"), [(1.0, 0.9986), (0.5, 0.7214), (0.05, 0.0067)])
def test_temperature_table_known_losses(tau: float, loss: float) -> None:
    row = temperature.temperature_row(SIMS, tau)
    assert row.loss == pytest.approx(loss, abs=5e-5)


def test_temperature_row_by_hand() -> None:
    tau = 0.5
    e = [math.exp(s / tau) for s in SIMS]
    p = [v / sum(e) for v in e]
    row = temperature.temperature_row(SIMS, tau)
    assert row.probabilities == pytest.approx(p, rel=1e-12)
    assert row.loss == pytest.approx(-math.log(p[0]), rel=1e-12)
    # d loss / d s_j = P_j / tau for negatives, -(1 - P_0) / tau for the positive.
    assert row.negative_weights == pytest.approx([pj / tau for pj in p[1:]], rel=1e-12)
    assert row.gradients[0] == pytest.approx(-(1 - p[0]) / tau, rel=1e-12)
    # Hand values at tau = 0.5: the hardest negative (s = 0.25) weighs 0.5896, the easiest 0.1454.
    assert row.negative_weights == pytest.approx([0.5896, 0.1454, 0.2928], abs=1e-4)


def test_small_tau_concentrates_weight_on_the_hardest_negative() -> None:
    share = []
    for tau in (1.0, 0.5, 0.05):
        w = temperature.temperature_row(SIMS, tau).negative_weights
        share.append(w[0] / sum(w))
    assert share[0] < share[1] < share[2] and share[2] > 0.99


def test_hardness_curve_matches_rows_and_rises() -> None:
    grid = torch.tensor([-0.5, 0.0, 0.25, 0.6])
    curve = temperature.hardness_curve(SIMS, 0.05, grid)
    assert float(curve[2]) == pytest.approx(temperature.temperature_row(SIMS, 0.05).negative_weights[0], rel=1e-10)
    assert bool((curve[1:] > curve[:-1]).all())


def test_temperature_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["temperature", "--temperatures", "1", "0.5", "0.05", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0.9986" in out and "0.7214" in out and "0.006721" in out
    assert (tmp_path / "hardness.png").stat().st_size > 1000
    assert main(["temperature", "--similarities", "0.5", "--output-dir", str(tmp_path)]) == 2
    assert main(["temperature", "--temperatures", "0", "--output-dir", str(tmp_path)]) == 2


# --------------------------------------------------------------------------- toy


def test_toy_candidates_one_positive_and_one_negative_per_other_class() -> None:
    _, labels = toy.quadrant_points()
    positive, exclude = toy.sample_candidates(labels, torch.Generator().manual_seed(3))
    keep = ~exclude
    assert bool((keep.sum(dim=1) == 4).all())
    assert bool((labels[positive] == labels).all()) and bool((positive != torch.arange(100)).all())
    for i in range(100):
        negatives = [j for j in keep[i].nonzero().squeeze(1).tolist() if j != positive[i]]
        assert sorted(labels[negatives].tolist()) == sorted({0, 1, 2, 3} - {int(labels[i])})


def test_toy_loss_is_the_core_info_nce() -> None:
    # The cosine variant is info_nce itself; check the dot variant by a naive loop.
    g = torch.Generator().manual_seed(0)
    _, labels = toy.quadrant_points()
    positive, exclude = toy.sample_candidates(labels, g)
    f = torch.tanh(torch.randn(100, 2, generator=g, dtype=torch.float64))
    naive = 0.0
    for i in range(100):
        cols = [int(positive[i])] + [j for j in (~exclude[i]).nonzero().squeeze(1).tolist() if j != positive[i]]
        logits = torch.stack([f[i] @ f[j] for j in cols]) / 0.5
        naive += float(-torch.log_softmax(logits, 0)[0]) / 100
    assert float(toy.toy_loss(f, positive, exclude, 0.5, "dot")) == pytest.approx(naive, rel=1e-10)


def test_toy_temperature_story() -> None:
    results = {tau: toy.train_toy(tau) for tau in (0.99, 0.5, 0.001)}
    # Moderate tau spreads the classes out: clearly better uniformity than tau = 0.99.
    assert results[0.5].uniformity < results[0.99].uniformity - 0.3
    # tau = 0.001: the tanh saturates, every feature ends up in a corner (|x|, |y| > 0.95).
    assert results[0.001].corner_fraction > 0.95
    # ...and they collapse there together: uniformity close to its worst value, 0.
    assert results[0.001].uniformity > -0.1


def test_toy_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "toy", "--temperatures", "0.5", "0.05", "--steps", "100", "--output-dir", str(tmp_path)]
    assert main(args) == 0
    assert "uniformity" in capsys.readouterr().out
    assert (tmp_path / "toy.png").stat().st_size > 1000


# --------------------------------------------------------------------------- digits


def test_random_shift_by_hand() -> None:
    image = torch.zeros(1, 1, 8, 8)
    image[0, 0, 3, 4] = 1.0

    # Offsets (dy, dx) in 0..2 over the 1-padded image: (0, 2) moves the pixel down 1 and left 1.
    g = torch.Generator().manual_seed(0)
    offsets = torch.randint(0, 3, (1, 2), generator=torch.Generator().manual_seed(0))
    shifted = digits.random_shift(image, g)
    dy, dx = offsets[0].tolist()
    assert shifted.shape == image.shape
    assert shifted[0, 0, 3 + 1 - dy, 4 + 1 - dx] == 1.0 and shifted.sum() == 1.0


def test_views_collator_layout() -> None:
    x, y, _, _ = digits.load_digits_split()
    batch = digits.ViewsCollator(2, seed=0)([(x[i], y[i]) for i in range(5)])
    assert batch["pixels"].shape == (10, 1, 8, 8)
    assert batch["labels"].tolist() == y[:5].tolist() * 2


def test_digits_supcon_probe_beats_random_encoder(capsys: pytest.CaptureFixture[str]) -> None:
    result = digits.run(digits.DigitsConfig(epochs=5, tsne=False), output_dir=None)
    acc = result.accuracies
    # Reduced budget (5 epochs, ~5 s); the full demo (30 epochs) is in BENCHMARKS.md.
    assert acc["supcon"] > acc["random"] + 0.02
    assert acc["supcon"] > 0.97
    assert result.n_train + result.n_test == 1797
    assert "| SupCon L_out" in capsys.readouterr().out
