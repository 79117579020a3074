"""STS results in MTEB's format, to compare runs with the MTEB tooling and leaderboard.

``simcse-kit evaluate MODEL --mteb-results DIR`` writes one ``DIR/<MTEB task>.json`` per
task, laid out as MTEB (>= 1.12) writes its own results::

    {"dataset_revision": "a0d5...", "task_name": "STS12", "mteb_version": "1.12.0",
     "scores": {"test": [{"cosine_pearson": 0.79, "cosine_spearman": 0.72,
                          "pearson": 0.79, "spearman": 0.72, "main_score": 0.72,
                          "hf_subset": "default", "languages": ["eng-Latn"]}]},
     "evaluation_time": 3.2, "kg_co2_emissions": null}

Scores are on MTEB's 0-1 scale (our tables print Spearman x 100). ``main_score`` is
``cosine_spearman``, MTEB's main score for STS; ``pearson``/``spearman`` use the model's
similarity, which for every simcse-kit model is the cosine. The pairs are the test split
MTEB evaluates (a year's subsets concatenated), so a ``--source hub`` run is directly
comparable with MTEB; a ``--source senteval`` run scores the tokenised, lowercased text
(see ``docs/evaluation.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import pearsonr, spearmanr

from simcse_kit.evaluation.hub import HUB_DATASETS
from simcse_kit.evaluation.sts import STSEvaluator, main_split
from simcse_kit.files import write_json_atomic

__all__ = ["MTEB_SCHEMA_VERSION", "mteb_retrieval_result", "mteb_task_result", "write_mteb_results"]

MTEB_SCHEMA_VERSION = "1.12.0"
"""The MTEB release whose results layout these files follow; MTEB's loader picks its
parser by ``mteb_version`` (older files had no ``hf_subset``/``languages``)."""


def mteb_task_result(task: str, cosines: np.ndarray, gold: np.ndarray, seconds: float) -> dict[str, Any]:
    """One task's result object, as MTEB writes it.

    Args:
        task: Our task name, a key of :data:`~simcse_kit.evaluation.hub.HUB_DATASETS`.
        cosines: Cosine similarity of each test pair, shape ``(N,)``.
        gold: Gold score of each pair, shape ``(N,)``.
        seconds: The task's evaluation time.

    Returns:
        The JSON-ready mapping (scores on a 0-1 scale).
    """
    entry = HUB_DATASETS[task]
    pearson = float(pearsonr(cosines, gold)[0])
    spearman = float(spearmanr(cosines, gold)[0])
    scores = {
        "cosine_pearson": pearson,
        "cosine_spearman": spearman,
        "pearson": pearson,
        "spearman": spearman,
        "main_score": spearman,
        "hf_subset": "default",
        "languages": ["eng-Latn"],
    }
    return {
        "dataset_revision": entry.revision,
        "task_name": entry.mteb_name,
        "mteb_version": MTEB_SCHEMA_VERSION,
        "scores": {"test": [scores]},
        "evaluation_time": seconds,
        "kg_co2_emissions": None,
    }


def mteb_retrieval_result(task: str, metrics: dict[str, float], seconds: float, split: str = "test") -> dict[str, Any]:
    """A retrieval task's result object, as MTEB writes it (``main_score`` = ``ndcg_at_10``).

    Args:
        task: The task's name (a user's own folder: no MTEB dataset revision).
        metrics: :data:`~simcse_kit.evaluation.retrieval.METRICS` on a 0-1 scale
            (``"ndcg@10"`` is written as MTEB's ``"ndcg_at_10"``).
        seconds: The task's evaluation time.
        split: The qrels split evaluated.
    """
    scores: dict[str, Any] = {name.replace("@", "_at_"): value for name, value in metrics.items()}
    scores |= {"main_score": metrics["ndcg@10"], "hf_subset": "default", "languages": ["eng-Latn"]}
    return {
        "dataset_revision": None,
        "task_name": task,
        "mteb_version": MTEB_SCHEMA_VERSION,
        "scores": {split: [scores]},
        "evaluation_time": seconds,
        "kg_co2_emissions": None,
    }


def write_mteb_results(out_dir: Path | str, evaluator: STSEvaluator) -> dict[str, Path]:
    """Writes ``<out_dir>/<MTEB task name>.json`` for each task of the evaluator's last call.

    Args:
        out_dir: The results folder (created if needed).
        evaluator: An evaluator that has been called, so that its ``scored`` and
            ``seconds`` hold the run; tasks MTEB does not have (a custom suite's)
            are skipped with no file.

    Returns:
        Task name -> the file written.

    Raises:
        ValueError: The evaluator has not been called yet.
    """
    if not evaluator.scored:
        raise ValueError("the evaluator has not been run: call it before writing its results")
    written: dict[str, Path] = {}
    for task, scored in evaluator.scored.items():
        if task not in HUB_DATASETS:
            continue
        cosines, gold = main_split(evaluator.specs[task], scored)
        path = Path(out_dir) / f"{HUB_DATASETS[task].mteb_name}.json"
        write_json_atomic(path, mteb_task_result(task, cosines, gold, evaluator.seconds[task]))
        written[task] = path
    return written
