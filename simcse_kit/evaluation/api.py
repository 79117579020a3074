"""The evaluation commands as functions: load any model, evaluate, print, save JSON.

``simcse-kit evaluate`` (:func:`evaluate_model`), ``simcse-kit transfer``
(:func:`evaluate_transfer`) and ``simcse-kit align-uniform`` (:func:`align_uniform_model`).
Each reads its data *before* loading the model, so a bad data folder fails at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from simcse_kit.devices import resolve_device
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.encoding import prompted, truncated
from simcse_kit.evaluation.hub import HubSTSEvaluator
from simcse_kit.evaluation.mteb import mteb_retrieval_result, write_mteb_results
from simcse_kit.evaluation.readers import TaskSpec, load_suite, read_stsb, stsb_split_path
from simcse_kit.evaluation.retrieval import RetrievalEvaluator
from simcse_kit.evaluation.sts import STSEvaluator, sts_alignment_uniformity
from simcse_kit.evaluation.tables import RETRIEVAL_COLUMNS, TRANSFER_COLUMNS, format_rows, format_table, suite_columns
from simcse_kit.evaluation.transfer import TransferEvaluator
from simcse_kit.fileio import check_writable, write_json_atomic
from simcse_kit.inference import load_encoder
from simcse_kit.recipes import senteval_dir

__all__ = ["align_uniform_model", "evaluate_model", "evaluate_retrieval", "evaluate_transfer"]

logger = logging.getLogger(__name__)


def evaluate_model(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    suite: Mapping[str, TaskSpec] | str | Path | None = None,
    json_out: str | Path | None = None,
    batch_size: int = 128,
    precision: str = "no",
    source: str = "senteval",
    hub_root: str | Path | None = None,
    mteb_results: str | Path | None = None,
    device: str = "auto",
    truncate_dim: int | None = None,
) -> dict[str, float]:
    """Spearman x 100 on the STS tasks for MODEL; prints the paper-style table.

    Args:
        model: Anything :func:`simcse_kit.inference.load_encoder` takes.
        pooler: Pooler for a plain HF model.
        data_dir: The SentEval-layout data folder; default ``senteval`` under the data root
            (``SIMCSE_KIT_DATA``, else ``../shared/data`` beside a source checkout).
        tasks: Task names of the suite to run (default all).
        suite: A task table or a YAML suite file (e.g. ``evaluate/sts.yaml``);
            default :data:`~simcse_kit.evaluation.readers.DEFAULT_SUITE`.
        json_out: Where to write the results (JSON), if anywhere.
        batch_size: Sentences per forward pass.
        precision: Inference autocast: ``"no"``, ``"bf16"`` or ``"fp16"``.
        source: ``"senteval"`` (the tokenised files in ``data_dir``) or ``"hub"``
            (MTEB's copies through ``datasets``, see :mod:`~simcse_kit.evaluation.hub`).
        hub_root: For ``source="hub"``: a local folder of hub-schema copies
            instead of the hub.
        mteb_results: A folder to write one MTEB-format JSON per task into
            (see :mod:`~simcse_kit.evaluation.mteb`), if any.
        device: Where to encode: ``auto`` (CUDA, else MPS, else CPU), ``cpu``,
            ``cuda``, ``cuda:N`` or ``mps``.
        truncate_dim: Score the first this many coordinates of each embedding only
            (a Matryoshka model at a smaller size).

    Returns:
        Each task's main figure under its name (``STS12`` ... ``SICKRelatedness``),
        details under ``<task>/<detail>`` (SentEval source only), and the 7-task
        average under ``avg``.

    Raises:
        ConfigError: An unknown ``source``, or a suite or hub root given with the
            other source.
    """
    if source not in ("senteval", "hub"):
        raise ConfigError(f"--source must be senteval or hub, got {source!r}")
    if source == "hub" and suite is not None:
        raise ConfigError("--suite selects SentEval-layout files; it does not apply to --source hub")
    if source == "senteval" and hub_root is not None:
        raise ConfigError("--hub-root only applies to --source hub")
    if isinstance(suite, str | Path):
        suite = load_suite(suite)
    if mteb_results is not None:
        check_writable(mteb_results, "--mteb-results", folder=True)  # before the evaluation, not after it
    # Read the data first: a bad data folder fails before the model loads.
    evaluator = (
        HubSTSEvaluator(tasks, batch_size, hub_root)
        if source == "hub"
        else STSEvaluator(senteval_dir(data_dir, None), tasks=tasks, batch_size=batch_size, suite=suite)
    )
    columns = suite_columns(list(evaluator.specs))
    results = _run(evaluator, model, pooler, precision, columns, json_out, device, truncate_dim)
    if mteb_results is not None:
        write_mteb_results(mteb_results, evaluator)
    return results


def _run(
    evaluator: Callable[[Callable], dict[str, float]],
    model: str | Path,
    pooler: str | None,
    precision: str,
    columns: Mapping[str, str],
    json_out: str | Path | None,
    device: str = "auto",
    truncate_dim: int | None = None,
) -> dict[str, float]:
    """Load MODEL on ``device``, run ``evaluator`` on its encode function, print the table, save JSON."""
    if json_out is not None:
        check_writable(json_out, "--json")  # a read-only or full place fails before the evaluation
    encoder = load_encoder(model, pooler=pooler, precision=precision, device=device)
    start = time.perf_counter()
    # A model with prompts reads STS sentences as queries (both sides), as e5 advises.
    results = evaluator(truncated(prompted(encoder.encode, encoder.prompts.get("query", "")), truncate_dim))
    logger.info("evaluated %s in %.1fs", model, time.perf_counter() - start)
    print(format_table(results, columns))
    if json_out is not None:
        write_json_atomic(Path(json_out), results)
    return results


def evaluate_retrieval(
    model: str | Path,
    tasks: Sequence[str | Path],
    *,
    pooler: str | None = None,
    split: str = "test",
    json_out: str | Path | None = None,
    batch_size: int = 128,
    precision: str = "no",
    index: str = "exact",
    device: str = "auto",
    mteb_results: str | Path | None = None,
    truncate_dim: int | None = None,
) -> dict[str, float]:
    """nDCG@10, MRR@10, Recall@1/10/100, MAP@100 (x 100) of MODEL on BEIR-format task
    folders (:class:`~simcse_kit.evaluation.retrieval.RetrievalEvaluator`); prints one row
    per task.

    Args:
        model: Anything :func:`simcse_kit.inference.load_encoder` takes.
        tasks: BEIR-format folders (read before the model loads).
        pooler: Pooler for a plain HF model.
        split: The qrels split (``test`` or ``dev``).
        json_out: Where to write the results (JSON), if anywhere.
        batch_size: Texts per forward pass.
        precision: Inference autocast: ``"no"``, ``"bf16"``, ``"fp16"`` or ``"auto"``.
        index: ``"exact"`` (chunked matrix products) or ``"faiss"``.
        device: Where the model encodes and the exact search runs.
        mteb_results: A folder to write one MTEB-format ``<task>.json`` per task into, if any.
        truncate_dim: Search with the first this many coordinates of each embedding only.

    Returns:
        nDCG@10 under each task's name, every metric under ``<task>/<metric>``, ``avg``.
    """
    device = str(resolve_device(device))  # 'auto' becomes the device the search runs on too
    evaluator = RetrievalEvaluator(tasks, split, batch_size, index, device)
    encoder = load_encoder(model, pooler=pooler, device=device, precision=precision)
    evaluator.prompts = encoder.prompts  # queries and documents get the model's own prompts
    start = time.perf_counter()
    results = evaluator(truncated(encoder.encode, truncate_dim))
    logger.info("evaluated %s in %.1fs", model, time.perf_counter() - start)
    rows = [{"task": name, **{m: results[f"{name}/{m}"] for m in RETRIEVAL_COLUMNS if m != "task"}} for name in evaluator.tasks]
    print(format_rows(rows, RETRIEVAL_COLUMNS))
    if json_out is not None:
        write_json_atomic(Path(json_out), results)
    if mteb_results is not None:
        for name, metrics in evaluator.scored.items():
            result = mteb_retrieval_result(name, metrics, evaluator.seconds[name], split)
            write_json_atomic(Path(mteb_results) / f"{name}.json", result)
    return results


def evaluate_transfer(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    kfold: int = 10,
    max_train_samples: int | None = None,
    mrpc_features: str = "senteval",
    json_out: str | Path | None = None,
    batch_size: int = 128,
    device: str = "auto",
) -> dict[str, float]:
    """SentEval transfer accuracies of MODEL (see
    :class:`~simcse_kit.evaluation.transfer.TransferEvaluator`); prints the table,
    optionally saves JSON."""
    evaluator = TransferEvaluator(senteval_dir(data_dir, None), tasks, kfold, batch_size, max_train_samples, mrpc_features)
    return _run(evaluator, model, pooler, "no", TRANSFER_COLUMNS, json_out, device)


def align_uniform_model(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path | None = None,
    split: str = "dev",
    threshold: float = 4.0,
    json_out: str | Path | None = None,
    batch_size: int = 128,
    device: str = "auto",
) -> dict[str, float]:
    """Alignment, uniformity and Spearman x 100 of MODEL on one STS-B split; prints them.

    Returns:
        ``{"alignment", "uniformity", "positive_pairs", "spearman"}`` (see
        :func:`~simcse_kit.evaluation.sts.sts_alignment_uniformity`).
    """
    if split not in ("dev", "test", "train"):
        raise ConfigError(f"--split must be dev, test or train, got {split!r}")
    pairs = read_stsb(stsb_split_path(senteval_dir(data_dir, None), split))
    if json_out is not None:
        check_writable(json_out, "--json")
    encoder = load_encoder(model, pooler=pooler, device=device)
    result = sts_alignment_uniformity(encoder.encode, pairs, threshold, batch_size)
    print(f"STS-B {split}: {len(pairs)} pairs, {int(result['positive_pairs'])} with gold >= {threshold:g}")
    print(f"alignment  {result['alignment']:.4f}   (lower is better)")
    print(f"uniformity {result['uniformity']:.4f}   (lower is better)")
    print(f"spearman   {result['spearman']:.2f}")
    if json_out is not None:
        write_json_atomic(Path(json_out), result)
    return result
