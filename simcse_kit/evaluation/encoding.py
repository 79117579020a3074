"""Encode each distinct sentence once: the one home of that rule.

Every evaluator (STS, the STS-B dev evaluator, transfer, alignment/uniformity) asks
:func:`encode_once` for its embeddings, so a sentence that occurs in several pairs,
subsets or splits costs one forward pass, and every evaluator batches the same way.

The batching is part of the numbers: a model's output for a sentence can differ in
the last bits with the other sentences of its batch (padding length picks the
kernel). Sentences are sorted by character length, longest first, then cut into
``batch_size`` batches: padding per batch stays small, and an out-of-memory error
shows on the first batch rather than the last. The transfer evaluator batched in
alphabetical order until 2026-12 (its records before then): each batch padded to the
longest of a random 128 sentences, and encoding was most of the probe's time. The two
orders differ by ~3e-7 per embedding, enough to flip a logistic-regression prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from simcse_kit.errors import ConfigError

__all__ = ["Embedded", "Encode", "encode_once", "encode_unique", "prompted", "truncated"]

Encode = Callable[[list[str]], "torch.Tensor | np.ndarray"]
"""Maps a batch of N sentences to embeddings of shape ``(N, D)`` (a torch tensor on any
device and dtype, or a numpy array)."""


def encode_unique(encode: Encode, sentences: Sequence[str], batch_size: int, progress: bool = False) -> np.ndarray:
    """Encodes ``sentences`` (distinct) in batches, longest first, under ``torch.no_grad``.

    ``no_grad`` so that an encoder built on a model in training keeps no graph.

    Args:
        encode: The encoder, called once per batch of at most ``batch_size`` sentences.
        sentences: U distinct sentences.
        batch_size: Sentences per ``encode`` call.
        progress: Show a progress bar over the batches (long encodes, e.g. a corpus).

    Returns:
        float32 array of shape ``(U, D)``, row ``i`` the embedding of ``sentences[i]``.

    Raises:
        ValueError: No sentences, a batch size below 1, or ``encode`` returned
            something that is not ``(batch, D)``.
    """
    if not sentences:
        raise ValueError("no sentences to encode")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perm = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))  # by character length; ties in input order
    chunks: list[np.ndarray] = []
    with torch.no_grad():
        for start in tqdm(range(0, len(perm), batch_size), desc="encoding", unit="batch", disable=not progress):
            batch = [sentences[i] for i in perm[start : start + batch_size]]
            out = encode(batch)
            if isinstance(out, torch.Tensor):
                out = out.detach().to(device="cpu", dtype=torch.float32).numpy()
            out = np.asarray(out, dtype=np.float32)
            if out.ndim != 2 or out.shape[0] != len(batch):
                raise ValueError(f"encode returned shape {out.shape} for {len(batch)} sentences; expected (batch, dim)")
            chunks.append(out)
    emb = np.empty((len(sentences), chunks[0].shape[1]), dtype=np.float32)
    emb[perm] = np.concatenate(chunks)  # back to the input order
    return emb


@dataclass(frozen=True)
class Embedded:
    """The embeddings of a set of distinct sentences, with each sentence's row.

    Attributes:
        vectors: float32 array of shape ``(U, D)``, one row per distinct sentence.
        rows: Sentence -> its row in ``vectors``, in first-seen order.
    """

    vectors: np.ndarray
    rows: dict[str, int]

    def index(self, sentences: Sequence[str]) -> np.ndarray:
        """int64 array of shape ``(N,)``: the row of each of ``sentences``.

        Raises:
            KeyError: A sentence was not encoded.
        """
        return np.fromiter((self.rows[s] for s in sentences), np.int64, len(sentences))

    def of(self, sentences: Sequence[str]) -> np.ndarray:
        """float32 array of shape ``(N, D)``: the embedding of each of ``sentences``, in order."""
        return self.vectors[self.index(sentences)]


def encode_once(encode: Encode, sentences: Iterable[str], batch_size: int, progress: bool = False) -> Embedded:
    """Encodes each distinct sentence of ``sentences`` once (see :func:`encode_unique`).

    Args:
        encode: Maps a list of N sentences to ``(N, D)`` embeddings.
        sentences: Any number of sentences, repeats allowed (e.g. every first and
            second sentence of every pair of a task).
        batch_size: Sentences per ``encode`` call.
        progress: Show a progress bar over the batches.

    Returns:
        The distinct sentences' embeddings and rows; ``embedded.of(sentences)``
        gives them back in the input order.
    """
    rows: dict[str, int] = {}
    for s in sentences:
        rows.setdefault(s, len(rows))
    return Embedded(encode_unique(encode, list(rows), batch_size, progress), rows)


def truncated(encode: Encode, dim: int | None) -> Encode:
    """``encode`` keeping the first ``dim`` coordinates of each embedding (a Matryoshka
    model used at a smaller size); ``encode`` itself for None. Every evaluator scores by
    cosine, so the prefix is re-normalised there.

    Raises:
        ConfigError: ``dim`` below 1 (now) or above the embedding size (at the first call).
    """
    if dim is None:
        return encode
    if dim < 1:
        raise ConfigError(f"--truncate-dim must be >= 1, got {dim}")

    def encode_prefix(sentences: list[str]) -> torch.Tensor | np.ndarray:
        out = encode(sentences)
        if out.shape[-1] < dim:
            raise ConfigError(f"--truncate-dim {dim}: the model's embeddings have only {out.shape[-1]} dimensions")
        return out[:, :dim]

    return encode_prefix


def prompted(encode: Encode, prompt: str) -> Encode:
    """``encode`` with ``prompt`` put before every sentence (a model's query prompt, used
    on both sides of a symmetric task such as STS, as e5's authors advise); ``encode``
    itself for ``""``."""
    if not prompt:
        return encode

    def encode_prompted(sentences: list[str]) -> torch.Tensor | np.ndarray:
        return encode([prompt + s for s in sentences])

    return encode_prompted
