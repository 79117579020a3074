"""The int8 ranges an export ships (``quantization.json``), from a calibration set.

The calibration set is ``--calibration FILE`` (sentences one a line, or CSV/JSONL rows whose
``sent0`` is read), else the run's own training file; the first
:data:`CALIBRATION_LIMIT` distinct sentences are encoded by the exported model (normalised
as the export is, cut to its ``truncate_dim``) and their per-dimension min/max are the ranges
(:func:`simcse_kit.evaluation.quantization.calibration_ranges`, sentence-transformers' own).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from simcse_kit.data.corpus import BadRows
from simcse_kit.data.readers import TABLE_SUFFIXES, sentence_batches, table_rows
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation.encoding import Encode
from simcse_kit.evaluation.quantization import VectorPrecision, calibration_ranges
from simcse_kit.export.source import ExportSource
from simcse_kit.files import data_suffix, shard_paths

__all__ = ["CALIBRATION_LIMIT", "Calibration", "calibrate", "calibration_sentences", "precision_scores"]

logger = logging.getLogger(__name__)

CALIBRATION_LIMIT = 10_000
"""Sentences encoded for the ranges: a min/max per dimension settles long before (and the
export must not encode a million-line corpus)."""


@dataclass(frozen=True)
class Calibration:
    """Ranges ``(2, D)`` float32, and what they were computed on."""

    ranges: np.ndarray
    count: int
    source: str


def _sentences(path: Path) -> Iterator[str]:
    for shard in shard_paths(path):  # a training set of shards: theirs, in the order training reads them
        if data_suffix(shard) in TABLE_SUFFIXES:
            for row in table_rows(shard, ("sent0",), False, BadRows()):
                yield row["sent0"]
        else:
            for batch in sentence_batches(shard, BadRows()):
                yield from batch["sent0"]


def calibration_sentences(path: str | Path, limit: int = CALIBRATION_LIMIT) -> list[str]:
    """The first ``limit`` distinct sentences of a text, CSV or JSONL file."""
    unique = dict.fromkeys(s for s in _sentences(Path(path)) if s)
    return list(itertools.islice(unique, limit))


def _training_file(source: ExportSource) -> Path | None:
    train_file = source.run_config.get("data", {}).get("train_file") or source.meta.get("train_file")
    if not train_file or str(train_file).startswith("hub:"):
        return None
    path = Path(str(train_file))
    try:
        shard_paths(path)
    except DataError:
        return None
    return path


def calibrate(
    source: ExportSource,
    encode: Callable[[list[str]], torch.Tensor],
    normalize: bool,
    truncate_dim: int | None,
    calibration: str | Path | None = None,
    limit: int = CALIBRATION_LIMIT,
) -> Calibration | None:
    """The export's int8 ranges, or None where there is no calibration set (logged).

    Args:
        source: The exported run or model (its training file is the default set).
        encode: The exported model's float encoder, ``list[str] -> [N, H]``.
        normalize: Whether the export normalises (ranges are of the vectors users get).
        truncate_dim: The export's dimension cut, if any.
        calibration: ``--calibration FILE`` instead of the training file.
        limit: Sentences encoded at most.

    Raises:
        ConfigError: ``calibration`` is given but missing or holds fewer than 2 sentences.
    """
    path = Path(calibration) if calibration is not None else _training_file(source)
    if path is None:
        logger.warning("no calibration set (the run's training file is not here): no quantization.json in the export")
        return None
    if calibration is not None and not path.is_file():
        raise ConfigError(f"--calibration {path}: no such file")
    sentences = calibration_sentences(path, limit)
    if len(sentences) < 2:
        raise ConfigError(f"--calibration {path}: needs at least 2 distinct sentences, found {len(sentences)}")
    vectors = encode(sentences)
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    if truncate_dim is not None:
        vectors = vectors[:, :truncate_dim]
    what = "training sentences" if calibration is None else "calibration file"
    logger.info("int8 ranges from %d %s (%s)", len(sentences), what, path.name)
    return Calibration(calibration_ranges(vectors.float().numpy()), len(sentences), f"{what} {path.name}")


def precision_scores(
    evaluator: Callable[[Encode], Mapping[str, float]],
    encode: Callable[[list[str]], torch.Tensor],
    ranges: np.ndarray,
    normalize: bool,
    truncate_dim: int | None,
) -> dict[str, float]:
    """The evaluator's primary figure (STS-B dev) on float32, int8 and binary vectors, for the
    card; the sentences are encoded once."""
    memo: dict[str, np.ndarray] = {}

    def vectors(sentences: list[str]) -> np.ndarray:
        todo = [s for s in dict.fromkeys(sentences) if s not in memo]
        if todo:
            out = encode(todo)
            if normalize:
                out = torch.nn.functional.normalize(out, dim=-1)
            memo.update(zip(todo, out[:, :truncate_dim].float().numpy(), strict=True))
        return np.stack([memo[s] for s in sentences])

    key = getattr(evaluator, "primary_metric", "avg")
    scores = {}
    for precision in ("float32", "int8", "binary"):
        quantized = VectorPrecision(precision, ranges if precision == "int8" else None)
        scores[precision] = float(evaluator(quantized.encode(vectors))[key])
    return scores


def vector_scores(
    evaluator: Callable[..., Mapping[str, float]] | None,
    data_dir: str | Path | None,
    data_root: str | Path | None,
    encode: Callable[[list[str]], torch.Tensor],
    ranges: np.ndarray,
    normalize: bool,
    truncate_dim: int | None,
) -> dict[str, float] | None:
    """:func:`precision_scores` with the export's STS scorer, or STS-B dev of the data root;
    None (logged) where there is no STS-B dev file to score on."""
    if evaluator is None:
        from simcse_kit.errors import DataError
        from simcse_kit.export.sts_gate import default_scorer

        try:
            evaluator = default_scorer(data_dir, data_root)
        except (ConfigError, DataError) as exc:
            logger.info("no STS-B dev to score the vector precisions on (%s): the card lists sizes only", exc)
            return None
    return precision_scores(evaluator, encode, ranges, normalize, truncate_dim)


def vectors_card(calibration: Calibration, dim: int, scores: Mapping[str, float] | None) -> str:
    """The model card's section on quantized vectors: sizes, quality, the sentence-transformers call."""
    sizes = {"float32": 4 * dim, "int8": dim, "binary": (dim + 7) // 8}
    rows = [f"| {p} | {size} | {'' if scores is None else f'{scores[p]:.2f}'} |" for p, size in sizes.items()]
    return "\n".join(
        [
            "",
            "## Compact vectors",
            "",
            f"`quantization.json` holds per-dimension int8 ranges from {calibration.count} {calibration.source}.",
            "STS-B dev (Spearman x 100) at each precision, by simcse-kit (int8: cosine of the codes; binary:",
            "1 - 2 x Hamming / D):",
            "",
            "| precision | bytes / vector | STS-B dev |",
            "|---|---|---|",
            *rows,
            "",
            "```python",
            "import json",
            "import numpy as np",
            "from sentence_transformers import SentenceTransformer",
            "from sentence_transformers.util import quantize_embeddings",
            "",
            'model = SentenceTransformer("path/to/this/folder")',
            'q = json.load(open("path/to/this/folder/quantization.json"))',
            'ranges = np.array([q["ranges"]["min"], q["ranges"]["max"]], dtype=np.float32)',
            'emb = model.encode(["A man plays a guitar."])',
            'int8 = quantize_embeddings(emb, "int8", ranges=ranges)  # = calibration_embeddings=ranges',
            'binary = quantize_embeddings(emb, "ubinary")  # packed sign bits, for faiss IndexBinaryFlat',
            "```",
            "",
        ]
    )
