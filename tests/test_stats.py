"""benchmarks/stats.py: the paired bootstraps behind every verdict, against naive loops and known cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from benchmarks.stats import Interval, mean_difference, spearman_average, spearman_difference, verdict


def _rows(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Two tasks of 40 and 25 pairs; row a with 3 seeds, row b with 2, both gold plus noise (b noisier)."""
    rng = np.random.default_rng(seed)
    gold = {"T1": rng.uniform(0, 5, 40).round(1), "T2": rng.uniform(1, 5, 25).round(1)}
    a = {t: g + rng.normal(0, 1.0, (3, len(g))) for t, g in gold.items()}
    b = {t: g + rng.normal(0, 2.0, (2, len(g))) for t, g in gold.items()}
    return a, b, gold


def _naive(a: dict[str, np.ndarray], b: dict[str, np.ndarray], gold: dict[str, np.ndarray], replicates: int) -> np.ndarray:
    """The documented draw order, one scipy Spearman at a time."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(replicates):
        sa = rng.integers(0, len(a["T1"]), len(a["T1"]))
        sb = sa if len(a["T1"]) == len(b["T1"]) else rng.integers(0, len(b["T1"]), len(b["T1"]))
        per_task = []
        for t, g in gold.items():
            idx = rng.integers(0, len(g), len(g))
            rho_a = np.mean([spearmanr(a[t][s][idx], g[idx]).statistic for s in sa])
            rho_b = np.mean([spearmanr(b[t][s][idx], g[idx]).statistic for s in sb])
            per_task.append(100 * (rho_a - rho_b))
        out.append(np.mean(per_task))
    return np.array(out)


@pytest.mark.parametrize("seeds_b", [2, 3])  # a draw of its own; paired with row a's seeds
def test_spearman_difference_matches_a_naive_loop(seeds_b: int) -> None:
    a, b, gold = _rows()
    b = {t: np.vstack([p, p[:1] + 0.5])[:seeds_b] for t, p in b.items()}
    got = spearman_difference(a, b, gold, replicates=60)
    values = _naive(a, b, gold, 60)
    low, high = np.percentile(values, [2.5, 97.5])
    assert (got.low, got.high) == pytest.approx((low, high), abs=1e-9)
    observed = np.mean([100 * (np.mean([spearmanr(p, gold[t]).statistic for p in a[t]])
                               - np.mean([spearmanr(p, gold[t]).statistic for p in b[t]])) for t in gold])  # fmt: skip
    assert got.difference == pytest.approx(observed, abs=1e-9)
    assert spearman_average(a, gold) - spearman_average(b, gold) == pytest.approx(observed, abs=1e-9)


def test_identical_rows_measure_no_difference() -> None:
    a, _, gold = _rows()
    got = spearman_difference(a, a, gold, replicates=200)
    # Paired by pair and by seed: every replicate compares a row with itself.
    assert (got.low, got.high, got.difference) == (0.0, 0.0, 0.0)
    assert got.verdict == "no difference measured"
    # Two seeds against the same two swapped: still no difference, but now an interval from the seed draw.
    swapped = {t: p[[1, 0, 2]] for t, p in a.items()}
    loose = spearman_difference(a, swapped, gold, replicates=200)
    assert loose.low < 0 < loose.high and loose.verdict == "no difference measured"


def test_gold_against_noise_is_better_and_the_reverse_worse() -> None:
    _, b, gold = _rows()
    perfect = {t: g[None, :] for t, g in gold.items()}
    assert verdict(perfect, b, gold, replicates=300) == "better"
    assert verdict(b, perfect, gold, replicates=300) == "worse"


def test_two_rows_of_the_same_noise_on_few_pairs_measure_no_difference() -> None:
    rng = np.random.default_rng(3)
    gold = {"T": rng.uniform(0, 5, 30)}
    a = {"T": gold["T"] + rng.normal(0, 1.5, (3, 30))}
    b = {"T": gold["T"] + rng.normal(0, 1.5, (3, 30))}
    got = spearman_difference(a, b, gold, replicates=300)
    assert got.verdict == "no difference measured" and got.low < 0 < got.high


def test_mean_difference_matches_a_naive_loop() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 50), rng.uniform(0, 1, 50)
    got = mean_difference(a, b, replicates=100, seed=7)
    draw = np.random.default_rng(7)
    values = []
    for _ in range(100):
        idx = draw.integers(0, 50, 50)
        values.append(sum(a[i] - b[i] for i in idx) / 50)
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])), abs=1e-12)
    assert got.difference == pytest.approx(a.mean() - b.mean())
    assert mean_difference(a + 1, a, replicates=50).verdict == "better"


def test_interval_verdicts_and_bad_input() -> None:
    assert [Interval(0.5, lo, hi, 10).verdict for lo, hi in ((0.1, 1), (-1, -0.1), (-0.1, 1))] == [
        "better", "worse", "no difference measured"]  # fmt: skip
    a, b, gold = _rows()
    with pytest.raises(ValueError, match="task 'T2'"):
        spearman_difference(a, {"T1": b["T1"]}, gold)
    with pytest.raises(ValueError, match="predictions for 40 gold scores"):
        spearman_difference({**a, "T1": a["T1"][:, :39]}, b, gold)
