"""Quantized vectors: int8/uint8 with per-dimension ranges, binary/ubinary, Hamming search.

The codes are sentence-transformers' ``quantize_embeddings``, called directly, so a
vector quantized here is the vector a sentence-transformers user gets with the same
ranges:

* ``int8`` / ``uint8``: each dimension's ``[min, max]`` (the *ranges*, ``(2, D)``, from a
  calibration set) cut into 255 steps; ``floor((x - min) / step)`` clipped to ``[0, 255]``,
  minus 128 for ``int8``.
* ``binary`` / ``ubinary``: the sign bit (``x > 0``) packed 8 dimensions a byte
  (``np.packbits``), minus 128 for ``binary``. 8x32 = 32x smaller than float32.

How a quantized vector is *scored* (:func:`comparable`): int8/uint8 codes are compared by
the cosine of the codes read as floats; binary codes by ``D - 2 * hamming``, the dot product
of their +-1 vectors (the cosine is that divided by ``D``: the same ranking as ``-hamming``).

Search over binary codes (:func:`hamming_search`) uses faiss's ``IndexBinaryFlat`` (exact
Hamming distance). With ``rescore`` candidates per query the top candidates by Hamming
distance are re-ranked by the *float* query times each candidate's unpacked 0/1 bits, as
sentence-transformers' ``semantic_search_faiss`` does (its rescoring example): with a fixed
query, ``q . b`` and ``q . (2b - 1)`` differ by the constant ``sum(q)``, so the ranking is
the one of the float query against the +-1 document vector.

The calibration that travels with an export is the small JSON file :data:`QUANTIZATION_FILE`
(:func:`write_quantization`, :func:`read_ranges`; see ``docs/export.md``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.encoding import Encode
from simcse_kit.files import write_json_atomic

__all__ = [
    "PRECISIONS",
    "QUANTIZATION_FILE",
    "VectorPrecision",
    "calibration_ranges",
    "comparable",
    "hamming_search",
    "quantize",
    "read_ranges",
    "rescored_search",
    "write_quantization",
]

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
"""Vector precisions, sentence-transformers' names."""
SCALAR = ("int8", "uint8")
BINARY = ("binary", "ubinary")
QUANTIZATION_FILE = "quantization.json"
"""The export's calibration: per-dimension int8 ranges, written beside ``simcse_config.json``."""
FORMAT = "simcse-kit/quantization"
RESCORE_QUERY_BLOCK = 256  # queries rescored together: block x candidates x D floats in memory


def _st_quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None) -> np.ndarray:
    try:  # sentence-transformers >= 5 moved it under util; the old path warns there
        from sentence_transformers.util import quantize_embeddings
    except ImportError:  # pragma: no cover - sentence-transformers 3.x/4.x
        from sentence_transformers.quantization import quantize_embeddings  # type: ignore[import-not-found,no-redef]
    out = quantize_embeddings(embeddings, precision=precision, ranges=ranges)  # type: ignore[arg-type]
    return np.asarray(out)


def calibration_ranges(embeddings: np.ndarray) -> np.ndarray:
    """Per-dimension ``[min, max]`` of calibration embeddings, sentence-transformers' ranges.

    Args:
        embeddings: ``(N, D)`` float embeddings of the calibration sentences, ``N >= 2``.

    Returns:
        float32 ``(2, D)``: row 0 the minima, row 1 the maxima.

    Raises:
        ValueError: Fewer than two calibration vectors (one vector gives empty ranges).
    """
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if embeddings.ndim != 2 or len(embeddings) < 2:
        raise ValueError(f"calibration needs at least 2 embeddings of shape (N, D), got shape {embeddings.shape}")
    return np.stack([embeddings.min(axis=0), embeddings.max(axis=0)]).astype(np.float32)


def quantize(embeddings: np.ndarray | torch.Tensor, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """sentence-transformers' ``quantize_embeddings`` with the ranges made explicit.

    Args:
        embeddings: ``(N, D)`` float embeddings.
        precision: One of :data:`PRECISIONS`.
        ranges: ``(2, D)`` ranges (:func:`calibration_ranges`); required for int8/uint8,
            so that a batch is never calibrated on itself.

    Returns:
        ``(N, D)`` float32, ``(N, D)`` int8/uint8, or ``(N, ceil(D / 8))`` int8/uint8 packed bits.

    Raises:
        ValueError: An unknown precision, or int8/uint8 without ranges of the right width.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if isinstance(embeddings, torch.Tensor):
        embeddings = embeddings.detach().to(device="cpu", dtype=torch.float32).numpy()
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if precision in SCALAR:
        if ranges is None:
            raise ValueError(f"{precision} quantization needs calibration ranges (2, D)")
        if ranges.shape != (2, embeddings.shape[-1]):
            raise ValueError(f"ranges of shape {ranges.shape} for {embeddings.shape[-1]}-dimensional embeddings")
    return _st_quantize(embeddings, precision, ranges if precision in SCALAR else None)


def unpack_bits(codes: np.ndarray, precision: str, dim: int) -> np.ndarray:
    """``(N, ceil(D / 8))`` binary/ubinary codes -> ``(N, D)`` uint8 bits (0/1)."""
    packed = (codes.astype(np.int16) + 128).astype(np.uint8) if precision == "binary" else codes.astype(np.uint8)
    return np.unpackbits(packed, axis=-1)[..., :dim]


def comparable(codes: np.ndarray, precision: str, dim: int) -> np.ndarray:
    """Quantized codes as the float32 vectors their similarity is computed on.

    int8/uint8: the codes as floats (cosine of the codes). binary/ubinary: +-1 per bit, so
    the dot product of two is ``D - 2 * hamming`` and their cosine ``1 - 2 * hamming / D``.

    Args:
        codes: Output of :func:`quantize`.
        precision: The precision they were quantized to.
        dim: ``D``, the float dimension (packed bits are padded to a whole byte).

    Returns:
        float32 ``(N, D)``.
    """
    if precision in BINARY:
        return unpack_bits(codes, precision, dim).astype(np.float32) * 2 - 1
    return codes.astype(np.float32)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise ConfigError("binary vector search needs faiss: pip install 'simcse-kit[faiss]' (faiss-cpu)") from None
    return faiss


def hamming_search(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` corpus codes nearest each query code by Hamming distance (faiss ``IndexBinaryFlat``).

    Args:
        queries: ``(Q, B)`` ubinary codes (uint8, ``B = ceil(D / 8)``).
        corpus: ``(C, B)`` ubinary codes.
        k: Neighbours per query (at most ``C``).

    Returns:
        ``(distances, indices)``: int32 Hamming distances ascending, int64 corpus rows, ``(Q, min(k, C))``.
    """
    faiss = _faiss()
    index = faiss.IndexBinaryFlat(corpus.shape[1] * 8)
    index.add(np.ascontiguousarray(corpus, dtype=np.uint8))
    distances, indices = index.search(np.ascontiguousarray(queries, dtype=np.uint8), min(k, len(corpus)))
    return distances.astype(np.int32), indices.astype(np.int64)


def rescored_search(queries: np.ndarray, corpus: np.ndarray, k: int, candidates: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Hamming search for ``candidates`` per query, re-ranked by the float query.

    The score of a candidate is ``query . bits`` (float query, the candidate's unpacked 0/1
    bits), sentence-transformers' rescoring; ties keep the Hamming order.

    Args:
        queries: ``(Q, D)`` float query embeddings (binarised here for the Hamming search).
        corpus: ``(C, ceil(D / 8))`` ubinary document codes.
        k: Documents kept per query.
        candidates: Hamming neighbours rescored per query (at least ``k``).
        dim: ``D``.

    Returns:
        ``(scores, indices)``: float32 rescored scores descending and int64 rows, ``(Q, min(k, C))``.
    """
    queries = np.asarray(queries, dtype=np.float32)
    _, found = hamming_search(quantize(queries, "ubinary"), corpus, max(k, candidates))
    kept = min(k, found.shape[1])
    scores = np.empty((len(queries), kept), dtype=np.float32)
    indices = np.empty((len(queries), kept), dtype=np.int64)
    for start in range(0, len(queries), RESCORE_QUERY_BLOCK):
        block = slice(start, start + RESCORE_QUERY_BLOCK)
        bits = np.unpackbits(corpus[found[block]], axis=-1)[..., :dim].astype(np.float32)  # (q, cand, D)
        rescored = np.einsum("qd,qcd->qc", queries[block], bits)
        order = np.argsort(-rescored, axis=1, kind="stable")[:, :kept]
        scores[block] = np.take_along_axis(rescored, order, axis=1)
        indices[block] = np.take_along_axis(found[block], order, axis=1)
    return scores, indices


@dataclass(frozen=True)
class VectorPrecision:
    """The precision vectors are scored at, with what it needs.

    Attributes:
        precision: One of :data:`PRECISIONS`.
        ranges: ``(2, D)`` int8/uint8 calibration ranges (None otherwise).
        rescore: binary/ubinary retrieval: Hamming candidates per query re-ranked by the float
            query (0: rank by Hamming distance alone).
    """

    precision: str = "float32"
    ranges: np.ndarray | None = None
    rescore: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--embedding-precision: choose from {list(PRECISIONS)}, got {self.precision!r}")
        if self.precision in SCALAR and self.ranges is None:
            raise ConfigError(
                f"--embedding-precision {self.precision} needs calibration ranges: --calibration FILE "
                f"(sentences, one a line, or a {QUANTIZATION_FILE}), or a model folder that ships {QUANTIZATION_FILE}"
            )
        if self.rescore < 0 or (self.rescore and self.precision not in BINARY):
            raise ConfigError(f"--rescore {self.rescore}: a count >= 0, and only with a binary/ubinary precision")

    @property
    def is_float(self) -> bool:
        return self.precision == "float32"

    def truncated(self, dim: int | None) -> VectorPrecision:
        """The same precision for the first ``dim`` dimensions (a Matryoshka prefix): a
        prefix's per-dimension ranges are the prefix of the ranges."""
        if dim is None or self.ranges is None:
            return self
        return replace(self, ranges=self.ranges[:, :dim])

    def scored(self, vectors: np.ndarray | torch.Tensor) -> np.ndarray:
        """``(N, D)`` float vectors -> the ``(N, D)`` float32 vectors their quantized codes score as."""
        dim = vectors.shape[-1]
        return comparable(quantize(vectors, self.precision, self._ranges(dim)), self.precision, dim)

    def _ranges(self, dim: int) -> np.ndarray | None:
        if self.ranges is not None and self.ranges.shape[1] != dim:
            raise ConfigError(f"calibration ranges cover {self.ranges.shape[1]} dimensions, the vectors have {dim}")
        return self.ranges

    def encode(self, encode: Encode) -> Encode:
        """``encode`` whose vectors are quantized and read back as :func:`comparable` floats
        (so any cosine evaluator scores the quantized vectors); ``encode`` itself for float32."""
        if self.is_float:
            return encode

        def encode_quantized(sentences: list[str]) -> np.ndarray:
            return self.scored(encode(sentences))

        return encode_quantized

    def search(
        self, queries: np.ndarray, corpus: np.ndarray, k: int, search: Any, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top ``k`` documents per query with vectors at this precision.

        float32: ``search`` itself; int8/uint8: ``search`` (cosine) over the codes as floats;
        binary/ubinary: faiss Hamming search, ``D - 2 * hamming`` as the score, or rescored
        with the float query when :attr:`rescore` is set.

        Args:
            queries: ``(Q, D)`` float query embeddings.
            corpus: ``(C, D)`` float document embeddings.
            k: Documents per query.
            search: The float search ``(queries, corpus, k, device=...) -> (scores, indices)``.
            device: Passed to ``search``.

        Returns:
            ``(scores, indices)`` as torch tensors ``(Q, min(k, C))``, best first.
        """
        if self.precision not in BINARY:
            if not self.is_float:
                queries, corpus = self.scored(queries), self.scored(corpus)
            result: tuple[torch.Tensor, torch.Tensor] = search(queries, corpus, k, device=device)
            return result
        dim = corpus.shape[-1]
        codes = quantize(corpus, "ubinary")  # binary and ubinary codes differ by 128: one Hamming search
        if self.rescore:
            scores, indices = rescored_search(queries, codes, k, self.rescore, dim)
        else:
            distances, indices = hamming_search(quantize(queries, "ubinary"), codes, k)
            scores = (dim - 2 * distances).astype(np.float32)
        return torch.from_numpy(scores), torch.from_numpy(indices)


def write_quantization(path: str | Path, ranges: np.ndarray, count: int, source: str, normalized: bool) -> None:
    """Write :data:`QUANTIZATION_FILE`: the int8 ranges and where they come from.

    Args:
        path: The file to write (atomically).
        ranges: ``(2, D)`` float32 ranges.
        count: Calibration sentences they were computed on.
        source: Which sentences (e.g. ``"training sentences"`` or a file name).
        normalized: Whether the vectors they apply to are unit-normalised (the export's setting).
    """
    ranges = np.asarray(ranges, dtype=np.float32)
    write_json_atomic(
        Path(path),
        {
            "format": FORMAT,
            "version": 1,
            "dim": int(ranges.shape[1]),
            "normalized": bool(normalized),
            "calibration": {"sentences": int(count), "source": source},
            "binary_threshold": 0.0,
            # float32 values as JSON numbers: float(np.float32) round-trips exactly.
            "ranges": {"min": [float(v) for v in ranges[0]], "max": [float(v) for v in ranges[1]]},
        },
    )


def read_ranges(path: str | Path) -> np.ndarray:
    """The ``(2, D)`` float32 ranges of a :data:`QUANTIZATION_FILE`.

    Raises:
        ConfigError: The file is not one (the message names it and what is wrong).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ranges = np.array([data["ranges"]["min"], data["ranges"]["max"]], dtype=np.float32)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a simcse-kit {QUANTIZATION_FILE} ({type(exc).__name__}: {exc})") from None
    if ranges.ndim != 2 or ranges.shape[1] != int(data.get("dim", ranges.shape[1])):
        raise ConfigError(f"{path}: ranges min/max must be two lists of 'dim' numbers")
    return ranges


def calibration_from(path: str | Path, encode: Encode, batch_size: int, limit: int | None = None) -> np.ndarray:
    """Ranges from ``--calibration FILE``: a :data:`QUANTIZATION_FILE`, or sentences one a line
    (encoded with ``encode``, the first ``limit`` of them).

    Raises:
        ConfigError: The file is missing, empty, or holds fewer than two sentences.
    """
    from simcse_kit.evaluation.encoding import encode_once

    path = Path(path)
    if path.suffix == ".json":
        return read_ranges(path)
    try:
        sentences = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise ConfigError(f"--calibration {path}: {exc.strerror or exc}") from None
    if len(sentences) < 2:
        raise ConfigError(f"--calibration {path}: needs at least 2 non-empty lines (sentences), found {len(sentences)}")
    return calibration_ranges(encode_once(encode, sentences[:limit], batch_size).vectors)


def precision_for(precision: str, calibration: np.ndarray | None, rescore: int = 0, dim: int | None = None) -> VectorPrecision:
    """A :class:`VectorPrecision` cut to a Matryoshka prefix of ``dim`` dimensions."""
    return VectorPrecision(precision, calibration if precision in SCALAR else None, rescore).truncated(dim)
