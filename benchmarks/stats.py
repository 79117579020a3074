"""The interval rule: a difference is "better" or "worse" only where its 95% interval excludes 0.

Two bootstraps, both paired (both rows are resampled with the same indices, so what the
two share, the hard test pairs and the easy ones, cancels in the difference):

* :func:`spearman_difference`: two rows of the quality tables, each the per-seed, per-pair
  predicted similarities of every STS task. A replicate draws the seeds with replacement (a
  seed is one trained model: its draw holds across the tasks), then each task's test pairs
  with replacement (the same indices for both rows), and recomputes the average over the
  tasks of the mean over the drawn seeds of Spearman x 100. The difference of the two
  averages is the replicate's value. Rows with as many seeds are paired by seed too (the
  tables run every row with the same seeds, in order: the same data order and the same
  initialisation of what is initialised), so one draw picks seed i of both; rows with
  different seed counts get a draw each.
* :func:`mean_difference`: per-query values of two systems on the same queries (nDCG@10 of
  a model and of BM25): the queries drawn with replacement, the difference of the means.

The interval is the 2.5th and 97.5th percentiles of the replicates (the percentile
bootstrap); the difference reported is the one on the data as they are. The draws are
made in a fixed order from ``numpy.random.default_rng(seed)`` (per replicate: row a's
seeds, row b's seeds unless paired by seed, then each task's pair indices in the tasks' order), so a naive loop
with the same generator reproduces them (``tests/test_stats.py`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import rankdata
from scipy.stats import t as student_t

__all__ = [
    "REPLICATES",
    "Interval",
    "load_rows",
    "mean_difference",
    "save_rows",
    "spearman_difference",
    "spearman_level",
    "verdict",
]

REPLICATES = 2000
"""Bootstrap replicates by default: the 2.5% tails then rest on 50 replicates each."""

BLOCK = 100  # replicates at once: a few (BLOCK, pairs) float64 arrays, 4 MB each for 5,000 pairs
Predictions = Mapping[str, np.ndarray]  # task -> (seeds, pairs) predicted similarities of one row
Gold = Mapping[str, np.ndarray]  # task -> (pairs,) gold scores


@dataclass(frozen=True)
class Interval:
    """A difference (a - b) and its 95% bootstrap interval.

    Attributes:
        difference: a - b on the data as they are.
        low: The 2.5th percentile of the replicates.
        high: The 97.5th percentile.
        replicates: How many replicates the interval rests on.
    """

    difference: float
    low: float
    high: float
    replicates: int

    @property
    def verdict(self) -> str:
        """``better`` (the interval is above 0), ``worse`` (below 0), else ``no difference measured``."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "no difference measured"

    def __str__(self) -> str:
        return f"{self.difference:+.2f} (95% interval {self.low:+.2f} to {self.high:+.2f}): {self.verdict}"


def _rank_pearson(ranked_predictions: np.ndarray, ranked_gold: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis of ranks (gold broadcast against the predictions): Spearman's rho
    with ties averaged; ``(..., S, N)`` with ``(..., N)`` or ``(..., 1, N)`` gives ``(..., S)``."""
    x = ranked_predictions - ranked_predictions.mean(axis=-1, keepdims=True)
    y = ranked_gold - ranked_gold.mean(axis=-1, keepdims=True)
    return (x * y).sum(axis=-1) / np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))


def _counts(draws: np.ndarray, n: int) -> np.ndarray:
    """``(B, n)``: how often each pair is in each replicate's sample (``draws``: ``(B, n)`` indices)."""
    flat = (np.arange(len(draws))[:, None] * n + draws).ravel()
    return np.bincount(flat, minlength=len(draws) * n).reshape(len(draws), n).astype(np.float64)


Grouped = tuple[np.ndarray, int, np.ndarray]  # each pair's tie group, the number of groups, their flat bins


def _grouped(values: np.ndarray) -> Grouped:
    """Each value's tie group (the index of its distinct value, ascending), the number of groups, and the flat
    bin of each (replicate, pair) of a block of :data:`BLOCK` replicates, ``replicate * groups + group``, that
    :func:`_group_ranks` counts into."""
    distinct, group = np.unique(values, return_inverse=True)
    group = group.ravel()
    return group, len(distinct), (np.arange(BLOCK)[:, None] * len(distinct) + group[None, :]).ravel()


def _group_ranks(of: Grouped, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(B, groups)`` twice: how many of each replicate's sampled values fall in each tie group of ``of``, and
    the rank (ties averaged, as ``rankdata``) those values share in the sample.

    A value's rank in a sample is the count of sampled values below it plus (its tie group's count + 1) / 2, so
    it comes from the counts per tie group in O(n), without sorting each sample.
    """
    _, distinct, flat = of
    rows = len(counts)
    per_group = np.bincount(flat[: counts.size], weights=counts.ravel(), minlength=rows * distinct).reshape(rows, -1)
    return per_group, np.cumsum(per_group, axis=1) - per_group + (per_group + 1) / 2


def _sample_spearmans(counts: np.ndarray, gold: Grouped, rows: list[Grouped]) -> np.ndarray:
    """``(B, len(rows))``: each prediction row's Spearman with the gold in each replicate's sample.

    Spearman is the Pearson correlation of the ranks, each pair counted as often as it was drawn. Every sum
    over the sample is a sum over tie groups (the pairs of a group share a rank), so nothing of size ``(B, n)``
    is built per row but the two bin counts: the variance of a row's ranks from its group counts, and its
    covariance with the gold as its ranks times the gold's centred ranks summed per group of the row.
    """
    n = counts.sum(axis=1, keepdims=True)

    def centred(of: Grouped) -> tuple[np.ndarray, np.ndarray]:
        per_group, rank = _group_ranks(of, counts)
        rank = rank - (per_group * rank).sum(axis=1, keepdims=True) / n
        return rank, (per_group * rank * rank).sum(axis=1)

    gold_rank, gold_var = centred(gold)
    weighted = counts * np.take(gold_rank, gold[0], axis=1)
    out = np.empty((len(counts), len(rows)))
    for i, of in enumerate(rows):
        rank, var = centred(of)
        per_group = np.bincount(of[2][: counts.size], weights=weighted.ravel(), minlength=rank.size).reshape(rank.shape)
        out[:, i] = (rank * per_group).sum(axis=1) / np.sqrt(var * gold_var)
    return out


def spearman_average(predictions: Predictions, gold: Gold) -> float:
    """The average over the tasks of the mean over the seeds of Spearman x 100 (what the tables show)."""
    per_task = [100 * _rank_pearson(rankdata(np.atleast_2d(predictions[t]), axis=-1), rankdata(gold[t])).mean() for t in gold]
    return float(np.mean(per_task))


def _checked(a: Predictions, b: Predictions, gold: Gold) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = {}
    for task, g in gold.items():
        if task not in a or task not in b:
            raise ValueError(f"task {task!r} has gold scores but no predictions in {'a' if task not in a else 'b'}")
        pa, pb, g = np.atleast_2d(a[task]).astype(np.float64), np.atleast_2d(b[task]).astype(np.float64), np.asarray(g)
        if not pa.shape[1] == pb.shape[1] == len(g):
            raise ValueError(f"task {task!r}: {pa.shape[1]} and {pb.shape[1]} predictions for {len(g)} gold scores")
        out[task] = (pa, pb, g.astype(np.float64))
    seeds = {len({v[0].shape[0] for v in out.values()}), len({v[1].shape[0] for v in out.values()})}
    if seeds != {1}:
        raise ValueError("a row must have the same seeds on every task")
    return out


def spearman_difference(a: Predictions, b: Predictions, gold: Gold, replicates: int = REPLICATES, seed: int = 0) -> Interval:
    """Row a's Spearman-based average minus row b's, with a paired bootstrap over test pairs and seeds.

    Args:
        a: Task -> ``(seeds_a, pairs)`` predicted similarities of row a (one seed: ``(pairs,)``).
        b: The same for row b (the same seeds in the same order, or its own number of seeds).
        gold: Task -> ``(pairs,)`` gold scores; its tasks are the ones averaged.
        replicates: Bootstrap replicates.
        seed: The generator's seed.

    Returns:
        The difference of the averages and its 95% interval.
    """
    tasks = _checked(a, b, gold)
    observed = spearman_average({t: v[0] for t, v in tasks.items()}, gold) - spearman_average(
        {t: v[1] for t, v in tasks.items()}, gold
    )
    values_a, values_b = _replicates(tasks, replicates, seed)
    return _interval(observed, values_a - values_b)


def spearman_level(a: Predictions, gold: Gold, replicates: int = REPLICATES, seed: int = 0) -> Interval:
    """Row a's Spearman-based average itself (its ``difference`` from 0), with the bootstrap of
    :func:`spearman_difference` (the seeds, then each task's test pairs): the interval a goal
    such as "a 7-task average of at least 80.5" is judged by.

    Args:
        a: Task -> ``(seeds, pairs)`` predicted similarities of the row.
        gold: Task -> ``(pairs,)`` gold scores.
        replicates: Bootstrap replicates.
        seed: The generator's seed (the draws are those of ``spearman_difference(a, a, ...)``).
    """
    tasks = _checked(a, a, gold)
    values, _ = _replicates(tasks, replicates, seed)
    return _interval(spearman_average(a, gold), values)


def _replicates(
    tasks: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], replicates: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each replicate's average of row a and of row b (:func:`_checked`'s ``tasks``), drawn in the module's order."""
    seeds_a, seeds_b = (next(iter(tasks.values()))[i].shape[0] for i in (0, 1))
    # The draws in the documented order, one replicate at a time (cheap); the Spearmans in blocks of replicates,
    # from each sample's counts per pair (a rank needs no sort of the sample: _sample_spearmans).
    rng = np.random.default_rng(seed)
    picks_a, picks_b = np.empty((replicates, seeds_a), np.int64), np.empty((replicates, seeds_b), np.int64)
    draws = {t: np.empty((replicates, len(v[2])), np.int64) for t, v in tasks.items()}
    for r in range(replicates):
        picks_a[r] = rng.integers(0, seeds_a, seeds_a)
        picks_b[r] = picks_a[r] if seeds_a == seeds_b else rng.integers(0, seeds_b, seeds_b)
        for t, (_, _, g) in tasks.items():
            draws[t][r] = rng.integers(0, len(g), len(g))
    groups = {t: (_grouped(g), [_grouped(x) for x in (*pa, *pb)]) for t, (pa, pb, g) in tasks.items()}
    values_a, values_b = np.zeros(replicates), np.zeros(replicates)
    for start in range(0, replicates, BLOCK):
        block = slice(start, start + BLOCK)
        for t, (_, _, g) in tasks.items():
            of_gold, of_rows = groups[t]
            rho = _sample_spearmans(_counts(draws[t][block], len(g)), of_gold, of_rows)
            rho_a, rho_b = rho[:, :seeds_a], rho[:, seeds_a:]
            rows = np.arange(len(rho))[:, None]
            values_a[block] += 100 * rho_a[rows, picks_a[block]].mean(axis=1) / len(tasks)
            values_b[block] += 100 * rho_b[rows, picks_b[block]].mean(axis=1) / len(tasks)
    return values_a, values_b


def mean_difference(a: np.ndarray, b: np.ndarray, replicates: int = REPLICATES, seed: int = 0) -> Interval:
    """mean(a) - mean(b) of per-query values on the same queries, with a paired bootstrap over the queries.

    Args:
        a: ``(queries,)`` values of system a.
        b: ``(queries,)`` values of system b, query for query.
        replicates: Bootstrap replicates.
        seed: The generator's seed.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need the same 1-d shape, got {a.shape} and {b.shape}")
    diff = a - b
    rng = np.random.default_rng(seed)
    values = np.array([diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(replicates)])
    return _interval(float(diff.mean()), values)


def seed_difference(a: Sequence[float], b: Sequence[float]) -> Interval:
    """mean(a) - mean(b) of per-seed scores that are not per-pair data (SentEval accuracies), with Welch's 95%
    t interval over the seeds. A row of one seed (the untouched model: its score is deterministic) adds no
    variance; where neither row varies, the interval is the difference itself. ``replicates``: the seeds."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(x.mean() - y.mean())
    parts = [(float(v.var(ddof=1)) / len(v), len(v) - 1) for v in (x, y) if len(v) > 1]
    se2 = sum(q for q, _ in parts)
    if se2 == 0:
        return Interval(diff, diff, diff, len(x) + len(y))
    df = se2**2 / sum(q**2 / dof for q, dof in parts if q > 0)
    half = float(student_t.ppf(0.975, df)) * se2**0.5
    return Interval(diff, diff - half, diff + half, len(x) + len(y))


def _interval(observed: float, values: np.ndarray) -> Interval:
    low, high = np.percentile(values, [2.5, 97.5])
    return Interval(float(observed), float(low), float(high), len(values))


def verdict(a: Predictions, b: Predictions, gold: Gold, replicates: int = REPLICATES) -> str:
    """ "better", "worse" or "no difference measured": row a against row b by :func:`spearman_difference`."""
    return spearman_difference(a, b, gold, replicates).verdict


# --------------------------------------------------------------------------- per-pair predictions beside a record


def save_rows(path: Path, rows: Mapping[str, Mapping[int, Mapping[str, np.ndarray]]], gold: Gold) -> None:
    """A record's sidecar: each row's per-seed, per-pair cosines (float16: 2 bytes a pair) and the gold scores.

    Args:
        path: The ``.npz`` to write (beside the record: ``<record stem>.npz``).
        rows: Row name -> seed -> task -> ``(pairs,)`` cosines.
        gold: Task -> ``(pairs,)`` gold scores.
    """
    arrays = {f"gold/{t}": np.asarray(g, dtype=np.float32) for t, g in gold.items()}
    for row, seeds in rows.items():
        for seed, tasks in seeds.items():
            arrays |= {f"{row}/{seed}/{t}": np.asarray(v, dtype=np.float16) for t, v in tasks.items()}
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def load_rows(path: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """What :func:`save_rows` wrote: row -> task -> ``(seeds, pairs)`` (seeds in ascending order), and the gold."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    gold = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("gold/")}
    by_row: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for key, value in arrays.items():
        if not key.startswith("gold/"):
            row, seed, task = key.rsplit("/", 2)
            by_row.setdefault(row, {}).setdefault(task, {})[int(seed)] = value
    rows = {r: {t: np.stack([v[s] for s in sorted(v)]) for t, v in tasks.items()} for r, tasks in by_row.items()}
    return rows, gold
