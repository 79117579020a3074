"""Hard-negative mining for pair data: ``sent0, sent1`` -> ``sent0, sent1, hard_neg``.

Each anchor (``sent0``) gets, as its hard negative, a sentence of the file's own corpus
(every distinct ``sent0`` and ``sent1``) that the current model finds close to it but not
*too* close: a candidate scored within ``margin`` of the anchor's positive, or above it,
is likely a paraphrase the pairs do not list (a false negative) and is skipped. This is
sentence-transformers' ``absolute_margin``: keep ``cos(a, c) <= cos(a, p) - margin``.

Why not ``sentence_transformers.util.mine_hard_negatives``: it takes a
``SentenceTransformer``, while MODEL here is anything :func:`load_encoder` opens (a
simcse-kit folder with its own pooler and MLP, a plain HF model with ``--pooler``); making
each of those a ``SentenceTransformer`` means an export round trip per call, and the
search it would save us is the dozen lines of :func:`mine_negatives`. Its semantics
(``range_max`` as top-k, ``absolute_margin``, ``sampling_strategy`` top/random) are kept.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from simcse_kit.config import DEFAULT_MODEL
from simcse_kit.data import read_rows
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.fileio import check_writable, write_text_atomic
from simcse_kit.inference import load_encoder

logger = logging.getLogger(__name__)

__all__ = ["SAMPLING_STRATEGIES", "mine_file", "mine_negatives"]

SAMPLING_STRATEGIES = ("top", "random")
OUT_COLUMNS = ("sent0", "sent1", "hard_neg")
_BLOCK = 1024  # anchors scored at once: bounds the [block, corpus] similarity matrix


def mine_negatives(
    pairs: Sequence[tuple[str, str]],
    encode: Callable[[Sequence[str]], torch.Tensor],
    top_k: int = 10,
    margin: float = 0.0,
    sampling_strategy: str = "top",
    seed: int = 0,
    progress: bool = True,
) -> list[str | None]:
    """One hard negative per pair, from the corpus of all the pairs' sentences.

    A candidate is never the anchor, its positive, or any sentence paired with that
    anchor in another row (compared as exact text, so a duplicate of the positive is
    excluded too). Of the ``top_k`` highest-scoring other sentences, those with
    ``cos(a, c) > cos(a, p) - margin`` are dropped; ``"top"`` takes the best one left and
    ``"random"`` one of them at random (seeded).

    Args:
        pairs: ``N`` (anchor, positive) pairs.
        encode: sentences -> ``[M, D]`` embeddings.
        top_k: candidates ranked per anchor before the margin (ST's ``range_max``).
        margin: ST's ``absolute_margin``; 0 skips only candidates scored above the positive.
        sampling_strategy: ``"top"`` or ``"random"``.
        seed: for ``"random"``.
        progress: show a progress bar over anchor blocks.

    Returns:
        ``N`` negatives; ``None`` where no candidate qualifies.
    """
    if sampling_strategy not in SAMPLING_STRATEGIES:
        raise ConfigError(f"--sampling-strategy {sampling_strategy!r}: must be one of {SAMPLING_STRATEGIES}")
    if top_k < 1:
        raise ConfigError(f"--top-k {top_k}: must be >= 1")
    if not math.isfinite(margin):  # nan compares false with everything: no candidate would ever be dropped
        raise ConfigError(f"--margin {margin}: must be a finite number")
    corpus = list(dict.fromkeys(s for pair in pairs for s in pair))
    index = {text: i for i, text in enumerate(corpus)}
    # Everything an anchor is paired with in any row, itself included: none is a negative.
    related: dict[str, set[int]] = defaultdict(set)
    for anchor, positive in pairs:
        related[anchor].update((index[anchor], index[positive]))
    emb = torch.nn.functional.normalize(encode(corpus).float(), dim=-1)
    anchors = torch.tensor([index[a] for a, _ in pairs])
    positives = torch.tensor([index[p] for _, p in pairs])
    generator = torch.Generator().manual_seed(seed)
    out: list[str | None] = []
    k = min(top_k, len(corpus))
    for start in tqdm(range(0, len(pairs), _BLOCK), desc="mining", unit="block", disable=not progress):
        rows = slice(start, start + _BLOCK)
        scores = emb[anchors[rows]] @ emb.T  # [block, corpus]
        bound = scores.gather(1, positives[rows, None]) - margin  # cos(a, p) - margin, [block, 1]
        for r, (anchor, _) in enumerate(pairs[rows]):
            scores[r, list(related[anchor])] = float("-inf")
        # As ST's range_max: the top k of the ranking (positives aside), then the margin.
        top, ids = scores.topk(k, dim=1)
        keep = torch.isfinite(top) & (top <= bound)
        for r in range(top.shape[0]):
            valid = ids[r][keep[r]]
            if valid.numel() == 0:
                out.append(None)
                continue
            pick = 0 if sampling_strategy == "top" else int(torch.randint(valid.numel(), (1,), generator=generator))
            out.append(corpus[int(valid[pick])])
    return out


def mine_file(
    pairs_path: str | Path,
    out_path: str | Path,
    model: str | None = None,
    pooler: str | None = None,
    top_k: int = 10,
    margin: float = 0.0,
    sampling_strategy: str = "top",
    seed: int = 0,
    batch_size: int = 128,
    device: str = "auto",
) -> dict[str, int]:
    """``simcse-kit mine``: read ``sent0, sent1`` pairs, write ``sent0, sent1, hard_neg``.

    Rows for which no candidate qualifies are left out (and counted), as
    sentence-transformers does: a ``hardneg`` file needs a negative in every row.

    Returns:
        ``{"rows": written, "skipped": rows without a negative}``.
    """
    if not math.isfinite(margin):
        raise ConfigError(f"--margin {margin}: must be a finite number")
    if Path(out_path).resolve() == Path(pairs_path).resolve():  # the pairs would be replaced by their mined copy
        raise ConfigError(f"{out_path}: the output is the input file {pairs_path}; write the mined pairs to another file")
    if Path(out_path).is_dir():  # found only at the rename, after the work, otherwise
        raise ConfigError(f"{out_path}: is a folder; give the path of a file to write the mined pairs to")
    check_writable(out_path, "--out")  # before the model is loaded and the file encoded
    rows = read_rows(pairs_path, ("sent0", "sent1"))
    encoder = load_encoder(model or DEFAULT_MODEL, pooler=pooler, device=device)
    pairs = [(r["sent0"], r["sent1"]) for r in rows]
    negatives = mine_negatives(pairs, lambda s: encoder.encode(s, batch_size=batch_size), top_k, margin, sampling_strategy, seed)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(OUT_COLUMNS)
    kept = [(a, p, n) for (a, p), n in zip(pairs, negatives, strict=True) if n is not None]
    if not kept:  # an empty hardneg file would only fail later, at training
        raise DataError(
            f"{pairs_path}: no row got a hard negative ({len(pairs)} row(s), {len(set(s for p in pairs for s in p))} "
            f"distinct sentence(s); every candidate is one of the row's own sentences or within --margin); "
            f"nothing written to {out_path}"
        )
    writer.writerows(kept)
    write_text_atomic(out_path, buffer.getvalue())
    skipped = len(pairs) - len(kept)
    if skipped:
        logger.warning("%d of %d row(s) had no candidate within top-%d below the margin; left out", skipped, len(pairs), top_k)
    logger.info("wrote %d rows with hard negatives to %s", len(kept), out_path)
    return {"rows": len(kept), "skipped": skipped}
