"""Evaluate a model by name or folder: load it, run an evaluator on its encode function.

:func:`evaluate_model` (the STS tasks), :func:`evaluate_retrieval` (BEIR-format
folders) and :func:`align_uniform_model` (the geometry of STS pairs) return their results;
:func:`run_evaluator` runs any evaluator on a model.
Each reads its data *before* loading the model, so a bad data folder fails at once.
Printing tables and writing ``--json`` are the commands' (:mod:`simcse_kit.cli`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from simcse_kit.config.recipes import senteval_dir
from simcse_kit.evaluation.encoding import Encode, prompted, truncated
from simcse_kit.evaluation.hub import HubSTSEvaluator
from simcse_kit.evaluation.mteb import mteb_retrieval_result, write_mteb_results
from simcse_kit.evaluation.quantization import (
    QUANTIZATION_FILE,
    SCALAR,
    VectorPrecision,
    calibration_from,
    precision_for,
    read_ranges,
)
from simcse_kit.evaluation.retrieval import RetrievalEvaluator
from simcse_kit.evaluation.sts import STSEvaluator, sts_alignment_uniformity
from simcse_kit.evaluation.sts_readers import STSPairs
from simcse_kit.evaluation.suite import TaskSpec, load_suite
from simcse_kit.files import write_json_atomic
from simcse_kit.model.devices import resolve_device
from simcse_kit.model.inference import load_encoder

__all__ = ["Quantized", "align_uniform_model", "evaluate_model", "evaluate_retrieval", "run_evaluator"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quantized:
    """Which quantized vectors to score, before a model is loaded (``evaluate --embedding-precision``).

    Attributes:
        precision: float32, int8, uint8, binary or ubinary (sentence-transformers' names).
        calibration: int8/uint8: a ``quantization.json`` or a file of sentences, one a line,
            whose embeddings give the per-dimension ranges; default the model folder's own
            ``quantization.json`` (an export ships one).
        rescore: binary retrieval: Hamming candidates per query re-ranked by the float query.
        batch_size: Calibration sentences per forward pass.
    """

    precision: str = "float32"
    calibration: str | Path | None = None
    rescore: int = 0
    batch_size: int = 128

    def resolve(self, encode: Encode, model: str | Path, truncate_dim: int | None) -> VectorPrecision:
        """The :class:`~simcse_kit.evaluation.quantization.VectorPrecision` for a loaded model;
        ranges come from the full embeddings, then are cut to ``truncate_dim``."""
        ranges = None
        if self.precision in SCALAR:
            shipped = Path(model) / QUANTIZATION_FILE
            if self.calibration is not None:
                ranges = calibration_from(self.calibration, encode, self.batch_size)
            elif shipped.is_file():
                ranges = read_ranges(shipped)
                logger.info("int8 ranges from %s", shipped)
        return precision_for(self.precision, ranges, self.rescore, truncate_dim)


def run_evaluator(
    evaluator: Callable[[Encode], dict[str, float]],
    model: str | Path,
    *,
    pooler: str | None = None,
    precision: str = "no",
    device: str | torch.device = "auto",
    truncate_dim: int | None = None,
    quantized: Quantized | None = None,
    trust_remote_code: bool = False,
) -> dict[str, float]:
    """Load MODEL on ``device`` and run ``evaluator`` on its encode function.

    A model with prompts reads the sentences as queries (both sides of an STS pair),
    as e5 advises.

    Args:
        evaluator: ``evaluator(encode) -> dict[str, float]``, ``encode(list[str])``
            giving ``(N, D)`` embeddings.
        model: Anything :func:`simcse_kit.model.inference.load_encoder` takes.
        pooler: Pooler for a plain HF model.
        precision: Inference autocast: ``"no"``, ``"bf16"``, ``"fp16"`` or ``"auto"``.
        device: Where to encode: ``auto`` (CUDA, else MPS, else CPU), ``cpu``,
            ``cuda``, ``cuda:N``, ``mps``, or a ``torch.device`` (a training process's own).
        truncate_dim: Score the first this many coordinates of each embedding only
            (a Matryoshka model at a smaller size).
        quantized: Score quantized vectors (int8 codes, binary codes) instead of floats.
        trust_remote_code: Run the model folder's own code (``auto_map``); otherwise such
            a folder is refused.

    Returns:
        The evaluator's results.
    """
    encoder = load_encoder(model, pooler=pooler, precision=precision, device=device, trust_remote_code=trust_remote_code)
    start = time.perf_counter()
    encode = prompted(encoder.encode, encoder.prompts.get("query", ""))
    vectors = (quantized or Quantized()).resolve(encode, model, truncate_dim)
    results = evaluator(vectors.encode(truncated(encode, truncate_dim)))
    logger.info("evaluated %s in %.1fs", model, time.perf_counter() - start)
    return results


def evaluate_model(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    suite: Mapping[str, TaskSpec] | str | Path | None = None,
    batch_size: int = 128,
    precision: str = "no",
    source: str = "senteval",
    hub_root: str | Path | None = None,
    mteb_results: str | Path | None = None,
    device: str = "auto",
    truncate_dim: int | None = None,
    quantized: Quantized | None = None,
    trust_remote_code: bool = False,
) -> dict[str, float]:
    """Spearman x 100 on the STS tasks for MODEL.

    Args:
        model: Anything :func:`simcse_kit.model.inference.load_encoder` takes.
        pooler: Pooler for a plain HF model.
        data_dir: The SentEval-layout data folder; default ``senteval`` under the data root
            (``SIMCSE_KIT_DATA``, else ``../shared/data`` beside a source checkout).
        tasks: Task names of the suite to run (default all).
        suite: With ``source="senteval"``: a task table or a YAML suite file (e.g.
            ``evaluate/sts.yaml``); default the paper's seven
            (:func:`~simcse_kit.evaluation.suite.default_suite`).
        batch_size: Sentences per forward pass.
        precision: Inference autocast: ``"no"``, ``"bf16"``, ``"fp16"`` or ``"auto"``.
        source: ``"senteval"`` (the tokenised files in ``data_dir``), else ``"hub"``
            (MTEB's copies through ``datasets``, see :mod:`~simcse_kit.evaluation.hub`).
        hub_root: With ``source="hub"``: a local folder of hub-schema copies
            instead of the hub.
        mteb_results: A folder to write one MTEB-format JSON per task into
            (see :mod:`~simcse_kit.evaluation.mteb`), if any.
        device: Where to encode (as :func:`run_evaluator`).
        truncate_dim: Score the first this many coordinates of each embedding only.
        quantized: Score quantized vectors (see :class:`Quantized`).
        trust_remote_code: Run the model folder's own code (as :func:`run_evaluator`).

    Returns:
        Each task's main figure under its name (``STS12`` ... ``SICKRelatedness``),
        details under ``<task>/<detail>`` (SentEval source only), and the 7-task
        average under ``avg``.
    """
    if isinstance(suite, str | Path):
        suite = load_suite(suite)
    # Read the data first: a bad data folder fails before the model loads.
    evaluator = (
        HubSTSEvaluator(tasks, batch_size, hub_root)
        if source == "hub"
        else STSEvaluator(senteval_dir(data_dir, None), tasks=tasks, batch_size=batch_size, suite=suite)
    )
    results = run_evaluator(
        evaluator,
        model,
        pooler=pooler,
        precision=precision,
        device=device,
        truncate_dim=truncate_dim,
        trust_remote_code=trust_remote_code,
        quantized=quantized,
    )
    if mteb_results is not None:
        write_mteb_results(mteb_results, evaluator)
    return results


def evaluate_retrieval(
    model: str | Path,
    tasks: Sequence[str | Path],
    *,
    pooler: str | None = None,
    split: str = "test",
    batch_size: int = 128,
    precision: str = "no",
    index: str = "exact",
    device: str = "auto",
    mteb_results: str | Path | None = None,
    truncate_dim: int | None = None,
    quantized: Quantized | None = None,
    trust_remote_code: bool = False,
) -> dict[str, float]:
    """nDCG@10, MRR@10, Recall@1/10/100, MAP@100 (x 100) of MODEL on BEIR-format task
    folders (:class:`~simcse_kit.evaluation.retrieval.RetrievalEvaluator`).

    Args:
        model: Anything :func:`simcse_kit.model.inference.load_encoder` takes.
        tasks: BEIR-format folders (read before the model loads).
        pooler: Pooler for a plain HF model.
        split: The qrels split (``test`` or ``dev``).
        batch_size: Texts per forward pass.
        precision: Inference autocast: ``"no"``, ``"bf16"``, ``"fp16"`` or ``"auto"``.
        index: ``"exact"`` (chunked matrix products) or ``"faiss"``.
        device: Where the model encodes and the exact search runs.
        mteb_results: A folder to write one MTEB-format ``<task>.json`` per task into, if any.
        truncate_dim: Search with the first this many coordinates of each embedding only.
        quantized: Search quantized vectors (see :class:`Quantized`): int8 codes, or binary
            codes by Hamming distance through faiss, optionally rescored by the float query.
        trust_remote_code: Run the model folder's own code (as :func:`run_evaluator`).

    Returns:
        nDCG@10 under each task's name (in ``tasks`` order), every metric under
        ``<task>/<metric>``, ``avg``.
    """
    device = str(resolve_device(device))  # 'auto' becomes the device the search runs on too
    evaluator = RetrievalEvaluator(tasks, split, batch_size, index, device)
    encoder = load_encoder(model, pooler=pooler, device=device, precision=precision, trust_remote_code=trust_remote_code)
    evaluator.prompts = encoder.prompts  # queries and documents get the model's own prompts
    evaluator.vectors = (quantized or Quantized()).resolve(encoder.encode, model, truncate_dim)
    start = time.perf_counter()
    results = evaluator(truncated(encoder.encode, truncate_dim))
    logger.info("evaluated %s in %.1fs", model, time.perf_counter() - start)
    if mteb_results is not None:
        for name, metrics in evaluator.scored.items():
            result = mteb_retrieval_result(name, metrics, evaluator.seconds[name], split)
            write_json_atomic(Path(mteb_results) / f"{name}.json", result)
    return results


def align_uniform_model(
    model: str | Path,
    pairs: STSPairs,
    *,
    pooler: str | None = None,
    threshold: float = 4.0,
    batch_size: int = 128,
    device: str = "auto",
    trust_remote_code: bool = False,
) -> dict[str, float]:
    """Alignment, uniformity and Spearman x 100 of MODEL on scored pairs (Wang & Isola 2020).

    Args:
        model: Anything :func:`simcse_kit.model.inference.load_encoder` takes.
        pairs: Scored pairs, e.g. one STS-B split (read before the model loads).
        pooler: Pooler for a plain HF model.
        threshold: Minimum gold score of a positive pair.
        batch_size: Sentences per forward pass.
        device: Where to encode (as :func:`run_evaluator`).
        trust_remote_code: Run the model folder's own code (as :func:`run_evaluator`).

    Returns:
        ``{"alignment", "uniformity", "positive_pairs", "spearman"}`` (see
        :func:`~simcse_kit.evaluation.sts.sts_alignment_uniformity`).
    """
    encoder = load_encoder(model, pooler=pooler, device=device, trust_remote_code=trust_remote_code)
    return sts_alignment_uniformity(encoder.encode, pairs, threshold, batch_size)
