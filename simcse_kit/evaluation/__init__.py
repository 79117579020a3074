"""Evaluation: STS, retrieval and SentEval transfer evaluators, alignment/uniformity, plots, tables.

Modules, each with one role:

* :mod:`~simcse_kit.evaluation.suite` — the STS suite: the paper's seven tasks read from
  the shipped ``evaluate/sts.yaml`` (:func:`default_suite`), or any suite file;
* :mod:`~simcse_kit.evaluation.sts_readers` — STS / STS-B / SICK files;
* :mod:`~simcse_kit.evaluation.transfer_readers` — the SentEval transfer-task files;
* :mod:`~simcse_kit.evaluation.encoding` — encode each distinct sentence once;
* :mod:`~simcse_kit.evaluation.sts` — Spearman scoring, :class:`STSEvaluator`, and
  :class:`DevEvaluator` (STS-B dev score + geometry, for checkpoint selection);
* :mod:`~simcse_kit.evaluation.transfer` — :class:`TransferEvaluator`;
* :mod:`~simcse_kit.evaluation.geometry` — alignment, uniformity, the trajectory plot;
* :mod:`~simcse_kit.evaluation.tables` — the one table formatter;
* :mod:`~simcse_kit.evaluation.hub` — the same STS tasks from the Hugging Face hub
  (MTEB's dataset ids), and local copies in the hub's schema;
* :mod:`~simcse_kit.evaluation.mteb` — STS results in MTEB's JSON format;
* :mod:`~simcse_kit.evaluation.beir`, :mod:`~simcse_kit.evaluation.search`,
  :mod:`~simcse_kit.evaluation.retrieval` — retrieval on BEIR-format folders
  (:class:`RetrievalEvaluator`, pytrec_eval's metrics), ``docs/retrieval.md``;
* :mod:`~simcse_kit.evaluation.api` — a model by name or folder, evaluated
  (:func:`evaluate_model`, :func:`evaluate_retrieval`, :func:`align_uniform_model`,
  :func:`run_evaluator`); the
  commands that print and save the results are :mod:`simcse_kit.cli`'s.

Every evaluator is a callable ``evaluator(encode) -> dict[str, float]`` with a
``primary_metric`` attribute, where ``encode(list[str])`` returns ``(N, D)`` embeddings.
"""

from simcse_kit.evaluation.api import align_uniform_model, evaluate_model, evaluate_retrieval, run_evaluator
from simcse_kit.evaluation.beir import RetrievalTask, read_beir, write_beir
from simcse_kit.evaluation.encoding import Embedded, Encode, encode_once, encode_unique
from simcse_kit.evaluation.geometry import alignment, pair_alignment_uniformity, plot_trajectory, uniformity
from simcse_kit.evaluation.hub import HUB_DATASETS, HubSTSEvaluator
from simcse_kit.evaluation.mteb import write_mteb_results
from simcse_kit.evaluation.retrieval import RetrievalDevEvaluator, RetrievalEvaluator, retrieval_metrics
from simcse_kit.evaluation.sts import DevEvaluator, STSEvaluator, spearman100, sts_alignment_uniformity
from simcse_kit.evaluation.sts_readers import STSPairs, load_task, read_sick, read_sts_subset, read_stsb
from simcse_kit.evaluation.suite import MAIN_TASKS, TaskSpec, default_suite, load_suite, stsb_split_path
from simcse_kit.evaluation.tables import (
    RETRIEVAL_COLUMNS,
    STS_COLUMNS,
    TRANSFER_COLUMNS,
    format_rows,
    format_seed_table,
    format_table,
    suite_columns,
)
from simcse_kit.evaluation.transfer import TransferEvaluator
from simcse_kit.evaluation.transfer_readers import TRANSFER_TASKS, TransferTask, load_transfer_task

__all__ = [
    "HUB_DATASETS",
    "MAIN_TASKS",
    "RETRIEVAL_COLUMNS",
    "STS_COLUMNS",
    "TRANSFER_COLUMNS",
    "TRANSFER_TASKS",
    "DevEvaluator",
    "Embedded",
    "HubSTSEvaluator",
    "Encode",
    "STSEvaluator",
    "RetrievalDevEvaluator",
    "RetrievalEvaluator",
    "RetrievalTask",
    "STSPairs",
    "TaskSpec",
    "TransferEvaluator",
    "TransferTask",
    "align_uniform_model",
    "alignment",
    "default_suite",
    "encode_once",
    "encode_unique",
    "evaluate_model",
    "evaluate_retrieval",
    "format_rows",
    "format_seed_table",
    "format_table",
    "load_suite",
    "load_task",
    "load_transfer_task",
    "pair_alignment_uniformity",
    "plot_trajectory",
    "read_sick",
    "read_sts_subset",
    "read_beir",
    "read_stsb",
    "retrieval_metrics",
    "run_evaluator",
    "spearman100",
    "sts_alignment_uniformity",
    "stsb_split_path",
    "suite_columns",
    "uniformity",
    "write_beir",
    "write_mteb_results",
]
