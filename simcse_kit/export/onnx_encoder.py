"""Serve an exported ONNX model with onnxruntime, tokenizers and numpy only.

This module imports neither torch nor transformers (a test runs it with both blocked), so
a deployment needs ``pip install onnxruntime tokenizers numpy`` and the export folder::

    from simcse_kit.export.onnx_encoder import OnnxEncoder
    encoder = OnnxEncoder("exports/unsup-minilm")                  # onnx/model.onnx
    vectors = encoder.encode(["A man plays a guitar.", "Hello"])  # [2, D] float32

The graph written by :mod:`simcse_kit.export.onnx` already pools (and normalises, when the
export does), so this module only tokenises, pads and runs it. What it needs besides the
graph is in ``onnx/simcse_onnx.json`` (max length, pad id, input names) and the folder's
``tokenizer.json``. It is one file on purpose: copying it beside a deployment is enough.

Quantized vectors: ``encoder.encode(sentences, precision="int8")`` (or ``uint8``, ``binary``,
``ubinary``) returns sentence-transformers' ``quantize_embeddings`` codes, int8 on the
per-dimension ranges the export ships in ``quantization.json`` (:func:`quantize` is a numpy
twin of that function, so serving needs no sentence-transformers; a test proves them equal).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # tokenizers is imported where an encoder is built, not with this module
    from tokenizers import Encoding

logger = logging.getLogger(__name__)

ONNX_INFO = "onnx/simcse_onnx.json"
"""What the serving side needs besides the graph (written by the export)."""
FP32_FILE = "onnx/model.onnx"  #: the fp32 graph, in the export folder
INT8_FILE = "onnx/model_quantized.onnx"  #: the int8 graph (dynamic quantisation), in the export folder
"""The name Transformers.js loads for ``dtype: "q8"`` (its default on WebAssembly) and the
Hugging Face ONNX convention; exports before issue 35 called it ``onnx/model_qint8.onnx``."""
OUTPUT = "sentence_embedding"
QUANTIZATION_FILE = "quantization.json"
"""The export's int8 calibration (per-dimension ranges; docs/export.md)."""
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
"""What :meth:`OnnxEncoder.encode` can return: float vectors, or int8/uint8/binary/ubinary codes."""

__all__ = ["FP32_FILE", "INT8_FILE", "ONNX_INFO", "OUTPUT", "PRECISIONS", "QUANTIZATION_FILE", "OnnxEncoder", "quantize"]


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """sentence-transformers' ``quantize_embeddings`` in numpy, with explicit ranges.

    Args:
        embeddings: ``[N, D]`` float vectors.
        precision: One of :data:`PRECISIONS`.
        ranges: ``[2, D]`` per-dimension min and max (int8/uint8 only).

    Returns:
        ``[N, D]`` float32 / int8 / uint8 codes, or ``[N, ceil(D / 8)]`` packed sign bits
        (int8 for ``binary``, uint8 for ``ubinary``).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision.endswith("binary"):
        packed = np.packbits(embeddings > 0, axis=-1)
        return packed if precision == "ubinary" else (packed - 128).astype(np.int8)
    if ranges is None:
        raise ValueError(f"{precision} needs the export's {QUANTIZATION_FILE} (per-dimension ranges)")
    # The same float32 arithmetic, in the same order, as sentence-transformers: the same codes.
    ranges = ranges.astype(np.float32, copy=False)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    codes = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
    return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)


class OnnxEncoder:
    """Sentences -> ``[N, D]`` float32 vectors with an exported graph.

    Sentences are tokenised a block at a time and sorted by token count before batching
    (as :class:`simcse_kit.model.inference.Encoder` does, so batches carry little padding), then
    returned in input order.

    Args:
        folder: The export folder (``tokenizer.json`` at its root, ``onnx/`` inside).
        file_name: The graph, relative to ``folder`` (:data:`FP32_FILE` or :data:`INT8_FILE`).
        threads: onnxruntime intra-op threads (None: onnxruntime's default, one per core).
        providers: onnxruntime execution providers (default: the CPU one).

    Attributes:
        ranges: ``[2, D']`` int8 ranges of the folder's ``quantization.json`` (None without one);
            ``D'`` is the export's ``truncate_dim`` where it has one.

    Raises:
        FileNotFoundError: A file the folder must hold is missing (the message names it).
    """

    BLOCK = 4096  # sentences tokenised (and sorted) together

    def __init__(
        self,
        folder: str | os.PathLike[str],
        file_name: str = FP32_FILE,
        threads: int | None = None,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        for needed in (file_name, ONNX_INFO, "tokenizer.json"):
            if not (self.folder / needed).is_file():
                raise FileNotFoundError(f"{self.folder / needed}: missing (not an ONNX export of simcse-kit?)")
        info = json.loads((self.folder / ONNX_INFO).read_text(encoding="utf-8"))
        self.max_seq_len = int(info["max_seq_len"])
        self.pad_id = int(info["pad_token_id"])
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        # tokenizers counts the special tokens its post-processor adds, as transformers does.
        self.tokenizer.enable_truncation(max_length=self.max_seq_len)
        self.tokenizer.no_padding()  # padded per sorted batch below
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.folder / file_name), options, providers=list(providers))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.dim = int(info["dim"])
        self.ranges: np.ndarray | None = None
        if (self.folder / QUANTIZATION_FILE).is_file():
            shipped = json.loads((self.folder / QUANTIZATION_FILE).read_text(encoding="utf-8"))["ranges"]
            self.ranges = np.array([shipped["min"], shipped["max"]], dtype=np.float32)

    def _run(self, encodings: Sequence[Encoding]) -> np.ndarray:
        """One padded batch through the graph: ``[B, D]`` float32."""
        width = max(len(e.ids) for e in encodings)
        feeds = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in self.input_names}
        if "input_ids" in feeds:
            feeds["input_ids"].fill(self.pad_id)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            feeds["input_ids"][row, :n] = enc.ids
            feeds["attention_mask"][row, :n] = 1
            if "token_type_ids" in feeds:
                feeds["token_type_ids"][row, :n] = enc.type_ids
        return self.session.run([OUTPUT], feeds)[0].astype(np.float32, copy=False)

    def encode(self, sentences: Sequence[str], batch_size: int = 32, precision: str = "float32") -> np.ndarray:
        """``N`` sentences -> ``[N, D]`` float32 (``[0, D]`` for none), or their codes at
        ``precision`` (:func:`quantize`; int8/uint8 with the shipped ranges). With quantized
        precisions, the first ``D'`` coordinates are quantized, ``D'`` the shipped ranges'
        width (an export's ``truncate_dim``)."""
        vectors = self._encode(sentences, batch_size)
        if precision == "float32":
            return vectors
        if self.ranges is not None:
            vectors = vectors[:, : self.ranges.shape[1]]
        return quantize(vectors, precision, self.ranges)

    def _encode(self, sentences: Sequence[str], batch_size: int) -> np.ndarray:
        out = np.empty((len(sentences), self.dim), dtype=np.float32)
        for first in range(0, len(sentences), self.BLOCK):
            encodings = self.tokenizer.encode_batch(list(sentences[first : first + self.BLOCK]))
            order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                out[[first + i for i in rows]] = self._run([encodings[i] for i in rows])
        return out

    __call__ = encode
