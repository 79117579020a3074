"""STS evaluation with the SimCSE paper protocol, and the STS-B dev evaluator.

What is computed (SimCSE, Gao et al. 2021, "all" setting of its SentEval fork):
each sentence is encoded, each pair scored by cosine similarity, and the
Spearman correlation with the gold scores reported x 100. For STS12-16 the
main figure is over *all* subsets of a year concatenated; STS-B and SICK-R use
their test sets. ``avg`` is the mean of the seven main figures.

Evaluators are callables ``evaluator(encode) -> dict[str, float]`` with a
``primary_metric`` attribute, as in sentence-transformers; data are read (and a
bad file reported) when the evaluator is built, before any encoding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.encoding import Embedded, Encode, encode_once
from simcse_kit.evaluation.geometry import pair_alignment_uniformity
from simcse_kit.evaluation.sts_readers import EVAL_READERS, STSPairs, load_task
from simcse_kit.evaluation.suite import MAIN_TASKS, TaskSpec, default_suite, stsb_split_path

__all__ = [
    "DevEvaluator",
    "STSEvaluator",
    "main_split",
    "score_splits",
    "spearman100",
    "sts_alignment_uniformity",
    "task_results",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- scoring


def spearman100(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation x 100 (``nan`` if either input is constant)."""
    return float(spearmanr(x, y)[0]) * 100.0


def _cosines(emb: np.ndarray, idx1: np.ndarray, idx2: np.ndarray) -> np.ndarray:
    a = emb[idx1].astype(np.float64)
    b = emb[idx2].astype(np.float64)
    # Same eps as torch.cosine_similarity: a zero vector scores 0, not nan.
    norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-8)
    return np.einsum("ij,ij->i", a, b) / norms


def _encode_pairs(encode: Encode, pairs: Iterable[STSPairs], batch_size: int) -> Embedded:
    """Every distinct sentence of ``pairs`` encoded once."""
    embedded = encode_once(encode, (s for p in pairs for s in (*p.sentences1, *p.sentences2)), batch_size)
    if not np.isfinite(embedded.vectors).all():
        logger.warning("encode returned non-finite embeddings; correlations will be nan")
    return embedded


def score_splits(
    encode: Encode, splits: Mapping[str, STSPairs], batch_size: int = 64
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Encodes every distinct sentence of ``splits`` once and scores each pair.

    Returns:
        Split name -> (cosine similarities, gold scores), both of shape ``(N,)``.
    """
    embedded = _encode_pairs(encode, splits.values(), batch_size)
    return {
        name: (_cosines(embedded.vectors, embedded.index(p.sentences1), embedded.index(p.sentences2)), p.scores)
        for name, p in splits.items()
    }


def main_split(spec: TaskSpec, scored: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The (cosines, gold scores) behind a task's main figure: all subsets of an
    ``sts`` task concatenated (SimCSE's "all", and MTEB's test split), else ``test``."""
    if spec.format == "sts":
        return (
            np.concatenate([scored[s][0] for s in spec.subsets]),
            np.concatenate([scored[s][1] for s in spec.subsets]),
        )
    return scored["test"]


def task_results(name: str, spec: TaskSpec, scored: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Turns per-split cosines and gold scores into the result entries of one task.

    ``sts``: ``name`` = all subsets concatenated (the paper's figure),
    ``name/mean`` = unweighted mean over subsets, ``name/wmean`` = mean weighted
    by pair count, ``name/<subset>`` each. ``stsb``: ``name`` = test,
    ``name/dev``. ``sick`` and ``hub``: ``name`` = test.
    """
    main = {name: spearman100(*main_split(spec, scored))}
    if spec.format == "sts":
        per = {s: spearman100(*scored[s]) for s in spec.subsets}
        sizes = np.array([len(scored[s][1]) for s in spec.subsets], dtype=np.float64)
        values = np.array(list(per.values()))
        res = main | {
            f"{name}/mean": float(values.mean()),
            f"{name}/wmean": float((values * sizes).sum() / sizes.sum()),
        }
        res.update({f"{name}/{s}": v for s, v in per.items()})
        return res
    if spec.format == "stsb":
        return main | {f"{name}/dev": spearman100(*scored["dev"])}
    return main


def sts_alignment_uniformity(encode: Encode, pairs: STSPairs, threshold: float = 4.0, batch_size: int = 128) -> dict[str, float]:
    """Alignment, uniformity and Spearman x 100 of ``encode`` on one STS split.

    Every distinct sentence is encoded once; the same embeddings give all three.
    As in SimCSE (Figure 2): alignment over the pairs with a gold score of at least
    ``threshold``, uniformity over all distinct sentences (see
    :func:`~simcse_kit.evaluation.geometry.pair_alignment_uniformity`).

    Args:
        encode: Maps a list of N sentences to ``(N, D)`` embeddings.
        pairs: The scored pairs, e.g. STS-B dev.
        threshold: Minimum gold score of a positive pair.
        batch_size: Sentences per ``encode`` call.

    Returns:
        ``{"alignment", "uniformity", "positive_pairs", "spearman"}``.
    """
    embedded = _encode_pairs(encode, [pairs], batch_size)
    idx1, idx2 = embedded.index(pairs.sentences1), embedded.index(pairs.sentences2)
    spearman = spearman100(_cosines(embedded.vectors, idx1, idx2), pairs.scores)
    geo = pair_alignment_uniformity(
        torch.from_numpy(embedded.vectors),
        torch.from_numpy(idx1),
        torch.from_numpy(idx2),
        torch.as_tensor(pairs.scores),
        threshold,
    )
    return geo | {"spearman": spearman}


# --------------------------------------------------------------------------- evaluators


class STSEvaluator:
    """Evaluates an encoder on the STS tasks; a callable returning ``dict[str, float]``.

    Data is read and checked when the evaluator is built, so a bad file fails
    before any training or encoding, and is reused by every call.

    Example::

        evaluator = STSEvaluator("../shared/data/senteval")
        results = evaluator(model.encode)   # {"STS12": 72.1, ..., "avg": 76.3}
        print(format_table(results))

    Args:
        data_dir: The SentEval-layout data folder.
        tasks: Task names to run, in order; default every task of ``suite``.
        batch_size: Sentences per ``encode`` call.
        suite: Task table, e.g. from :func:`~simcse_kit.evaluation.suite.load_suite`;
            default the paper's seven (:func:`~simcse_kit.evaluation.suite.default_suite`).

    Raises:
        KeyError: A task name is not in the suite.
        DataError: The data folder or a file is missing or malformed.
    """

    primary_metric: str
    """``"avg"`` when all seven paper tasks run, else the first task's name."""

    scored: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
    """The last call's cosines and gold scores: task -> split -> ``((N,), (N,))``
    (what :mod:`~simcse_kit.evaluation.mteb` reports besides Spearman)."""

    seconds: dict[str, float]
    """The last call's encoding-and-scoring time of each task."""

    def __init__(
        self,
        data_dir: Path | str,
        tasks: Sequence[str] | None = None,
        batch_size: int = 64,
        suite: Mapping[str, TaskSpec] | None = None,
    ) -> None:
        suite = default_suite() if suite is None else suite
        names = list(suite) if tasks is None else list(tasks)
        unknown = [t for t in names if t not in suite]
        if unknown:
            raise KeyError(f"unknown STS task(s) {unknown}; known: {list(suite)}")
        if not names:
            raise ValueError("no STS tasks to evaluate")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.specs = {t: suite[t] for t in names}
        self.data = self._read()
        self.primary_metric = "avg" if set(MAIN_TASKS) <= set(names) else names[0]
        self.scored = {}
        self.seconds = {}

    def _read(self) -> dict[str, dict[str, STSPairs]]:
        """Every task's splits, read from the SentEval-layout ``data_dir`` (a subclass
        reads them from elsewhere: :class:`~simcse_kit.evaluation.hub.HubSTSEvaluator`)."""
        if not self.data_dir.is_dir():
            raise DataError(f"{where(self.data_dir)}: SentEval data folder not found")
        return {t: load_task(self.data_dir, spec) for t, spec in self.specs.items()}

    def __call__(self, encode: Encode) -> dict[str, float]:
        """Encodes each task's distinct sentences once and returns the correlations.

        Args:
            encode: Maps a list of N sentences to embeddings ``(N, D)``
                (torch tensor on any device/dtype, or numpy array).

        Returns:
            Spearman x 100: the main figure under each task name, details under
            ``<task>/<detail>`` (see :func:`task_results`), and ``avg`` over the
            seven paper tasks when all of them ran.
        """
        results: dict[str, float] = {}
        for name, spec in self.specs.items():
            start = time.perf_counter()
            self.scored[name] = score_splits(encode, self.data[name], self.batch_size)
            results.update(task_results(name, spec, self.scored[name]))
            self.seconds[name] = time.perf_counter() - start
            logger.info("%s: %.2f (%.1fs)", name, results[name], self.seconds[name])
        if all(t in results for t in MAIN_TASKS):
            results["avg"] = float(np.mean([results[t] for t in MAIN_TASKS]))
            logger.info("STS avg: %.2f", results["avg"])
        return results


DEV_METRICS: dict[str, tuple[str, str]] = {
    "stsb": ("stsb_dev", "STS-B dev"),
    "sick": ("sick_dev", "SICK trial"),
    "pairs": ("pairs_dev", "dev pairs"),
}
"""Per dev-file format: the key its Spearman x 100 is reported under and the split's
name (SICK's scored dev split is SICK_trial.txt; a ``pairs`` table is named by its file)."""
POSITIVE_SHARE = 0.8
"""Where a positive pair starts, as a share of the dev scores' range: gold 4 of STS-B's 0-5,
SimCSE's alignment threshold, carried to a ``pairs`` table's own scale."""


class DevEvaluator:
    """STS-B dev: the SimCSE checkpoint-selection score and the embedding geometry.

    One encoding of the dev sentences gives Spearman x 100 (``stsb_dev``, the
    primary metric) and the alignment (gold >= 4 pairs) and uniformity of SimCSE's
    Figure 2. The dev file is read once, at construction; each call only encodes.

    Another scored-pair file may take STS-B dev's place (a domain's own dev split, such
    as SICK trial): its score then goes under that format's own key (``sick_dev``:
    :data:`DEV_METRICS`), :attr:`primary_metric` names it and :attr:`metric_label` says
    what it is ("SICK trial Spearman x 100"), for ``metrics.json``, the model card and
    the curves; :attr:`path` says which file it was.

    Args:
        data_dir: The SentEval-layout data folder.
        batch_size: Sentences per ``encode`` call.
        path: The dev file instead of ``STS/STSBenchmark/sts-dev.csv``.
        fmt: Its format, a key of :data:`~simcse_kit.evaluation.sts_readers.EVAL_READERS`
            (``pairs``: a table of ``sent0, sent1, score`` on any scale; its positives for
            the alignment are the pairs from :data:`POSITIVE_SHARE` of its score range up).

    Raises:
        DataError: The dev file is missing or malformed.
    """

    primary_metric: str
    dev_name: str  # the dev split, e.g. "STS-B dev"
    metric_label: str  # what the primary metric measures, e.g. "STS-B dev Spearman x 100"

    def __init__(self, data_dir: Path | str, batch_size: int = 64, path: Path | str | None = None, fmt: str = "stsb") -> None:
        self.path = stsb_split_path(data_dir, "dev") if path is None else Path(path)  #: the dev file
        self.batch_size = batch_size
        self.pairs = EVAL_READERS[fmt](self.path)
        self.primary_metric, self.dev_name = DEV_METRICS[fmt]
        self.threshold = 4.0  # gold >= 4 of 0-5 (STS-B) or 1-5 (SICK), as SimCSE's Figure 2
        if fmt == "pairs":
            self.dev_name = self.path.name
            low, high = float(self.pairs.scores.min()), float(self.pairs.scores.max())
            self.threshold = low + POSITIVE_SHARE * (high - low)
        self.metric_label = f"{self.dev_name} Spearman x 100"

    def __call__(self, encode: Encode) -> dict[str, float]:
        """``{primary_metric, "alignment", "uniformity"}`` of ``encode`` on the dev pairs."""
        result = sts_alignment_uniformity(encode, self.pairs, self.threshold, self.batch_size)
        logger.info("%s alignment %.4f, uniformity %.4f", self.dev_name, result["alignment"], result["uniformity"])
        return {self.primary_metric: result["spearman"], "alignment": result["alignment"], "uniformity": result["uniformity"]}
