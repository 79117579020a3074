"""Sentence hashes that ignore case, punctuation and spacing: the contamination guard's key.

Two texts are "the same sentence" when :func:`normalize` makes them equal: Unicode case
folding (``str.casefold``), then every punctuation character (Unicode category ``P*``)
and every whitespace character removed. Removing rather than collapsing the spaces is
what makes SentEval's tokenised files ("it 's a dog", "do n't") meet the raw text ("It's
a dog.", "don't"); on the shipped data this definition gives the counts of issue 49 for
SICK (2,533 of 4,927 test pairs, 3,742 of 5,006 distinct test sentences) and 4,831 of
12,544 STS12-16 pairs for STS-B train (docs/contamination.md gives what the other
definitions give).

A sentence's key is the 64-bit xxh3 of its normalised UTF-8 (:func:`text_hashes`): stable
across processes and machines, so a training file's hashes are computed once, as its
Arrow cache is built (:mod:`simcse_kit.data.corpus`), and kept beside the cache
(:func:`hashes_file`): a warm run reads 8 bytes a text and hashes nothing.
"""

from __future__ import annotations

import logging
import os
import string
import sys
import tempfile
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from xxhash import xxh3_64_intdigest

__all__ = ["HASHES_SUFFIX", "dataset_keys", "hashes_file", "normalize", "row_hashes", "save_keys", "text_columns", "text_hashes"]

logger = logging.getLogger(__name__)

HASHES_SUFFIX = ".hashes.npy"
"""Beside a text cache ``<name>.arrow``: ``<name>.hashes.npy``, ``uint64 [rows, text columns]``."""


@cache
def _table() -> dict[int, None]:
    """``str.translate``'s table deleting every punctuation and whitespace character (built
    on first use: a pass over every code point, a third of a second)."""
    dropped = (c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c))[0] == "P" or chr(c).isspace())
    return dict.fromkeys(dropped)


_ASCII_DROPPED = bytes(c for c in range(128) if unicodedata.category(chr(c))[0] == "P" or chr(c).isspace())
_ASCII_LOWER = bytes.maketrans(string.ascii_uppercase.encode(), string.ascii_lowercase.encode())
SEPARATOR = "\0"  # joins a batch's ASCII texts into one string; no text of a checked file holds it


def normalize(text: str) -> str:
    """``text`` case-folded, without punctuation (``P*``) and without whitespace (module docstring)."""
    return text.casefold().translate(_table())


def _key(normalized: bytes) -> int:
    return xxh3_64_intdigest(normalized)


def text_hashes(texts: Sequence[str]) -> np.ndarray:
    """The 64-bit key of each text: xxh3 of its :func:`normalize`'d UTF-8.

    Args:
        texts: N texts.

    Returns:
        ``uint64 [N]``.

    The texts are normalised together, never one Python step per character: the ASCII
    ones (most of a corpus) as one string lowered and stripped by ``bytes.translate``
    (for ASCII, ``casefold`` is ``lower`` and the dropped characters are ASCII's
    punctuation and whitespace); the others as one string case-folded, then stripped as
    code points (UTF-32) through a table of every code point. A test checks both against
    :func:`normalize`, text by text.
    """
    out = np.empty(len(texts), dtype=np.uint64)
    ascii_rows = [i for i, text in enumerate(texts) if text.isascii()]
    other = [i for i, text in enumerate(texts) if not text.isascii()]
    if ascii_rows:
        out[ascii_rows] = _ascii_keys([texts[i] for i in ascii_rows])
    if other:
        out[other] = _unicode_keys([texts[i] for i in other])
    return out


def _ascii_keys(texts: list[str]) -> list[int]:
    joined = SEPARATOR.join(texts)
    if joined.count(SEPARATOR) != len(texts) - 1:  # a text holds the separator: one by one
        return [_key(normalize(t).encode()) for t in texts]
    # One pass of bytes.translate: lower-cased and stripped together.
    parts = joined.encode("ascii").translate(_ASCII_LOWER, _ASCII_DROPPED).split(SEPARATOR.encode())
    return list(map(_key, parts))


def _unicode_keys(texts: list[str]) -> list[int]:
    joined = SEPARATOR.join(texts).casefold()  # casefold maps each character alone, and never to NUL
    try:
        points = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    except UnicodeEncodeError:  # a lone surrogate: no UTF-32 for it
        return [_key(normalize(t).encode("utf-8", "surrogatepass")) for t in texts]
    kept = points[~_dropped_points()[points]].tobytes().decode("utf-32-le")
    parts = kept.split(SEPARATOR)
    if len(parts) != len(texts):  # a text holds the separator: one by one
        return [_key(normalize(t).encode()) for t in texts]
    return [_key(part.encode()) for part in parts]


@cache
def _dropped_points() -> np.ndarray:
    """``bool [0x110000]``: True at each code point :func:`normalize` removes."""
    dropped = np.zeros(sys.maxunicode + 1, dtype=bool)
    dropped[list(_table())] = True
    return dropped


def row_hashes(columns: Iterable[pa.Array | Sequence[str]]) -> np.ndarray:
    """Per row, the key of each text column: ``uint64 [rows, columns]``."""
    keys = [text_hashes(c.to_pylist() if isinstance(c, pa.Array) else c) for c in columns]
    return np.stack(keys, axis=1) if keys else np.empty((0, 0), dtype=np.uint64)


def hashes_file(cache_file: str | Path) -> Path:
    """Where the row hashes of a text cache ``<name>.arrow`` are kept."""
    path = Path(cache_file)
    return path.with_name(path.stem + HASHES_SUFFIX)


def text_columns(dataset: datasets.Dataset) -> list[str]:
    """The columns of ``dataset`` that hold texts (not scores, token ids or text ids)."""
    return [name for name, kind in dataset.features.items() if isinstance(kind, datasets.Value) and kind.dtype == "string"]


def dataset_keys(dataset: datasets.Dataset, batch_rows: int = 10_000) -> np.ndarray:
    """``uint64 [rows, text columns]``: the keys of ``dataset``'s texts, read from beside its
    text cache (:func:`hashes_file`) or, for a dataset without one (in memory, a cache built
    before the keys were kept), computed here.

    ``dataset`` is a reader's (:func:`simcse_kit.data.readers.load_train_dataset`): its rows
    are its caches' first rows (a file's, or its shards' one after the other), in order
    (``max_train_samples`` selects a prefix)."""
    columns = text_columns(dataset)
    found = []  # each text cache's keys, in order: a file's one, or one per shard
    for filename in dict.fromkeys(entry["filename"] for entry in dataset.cache_files):
        path = hashes_file(filename)
        if path.is_file():
            found.append(np.load(path, mmap_mode="r"))
        elif Path(filename).with_suffix(".json").is_file():  # a text cache: its sidecar beside it
            # A text cache built before its keys were kept: computed once, kept for the next run.
            whole = datasets.Dataset.from_file(filename)
            found.append(_computed(whole, text_columns(whole), batch_rows))
            try:
                save_keys(path, found[-1])
            except OSError as exc:
                logger.warning("%s: the sentence keys not kept (%s); the next run computes them again", path, exc)
    if found and all(k.ndim == 2 and k.shape[1] == len(columns) for k in found):
        keys = np.concatenate(found) if len(found) > 1 else found[0]
        if len(keys) >= len(dataset):
            return np.asarray(keys[: len(dataset)])
    return _computed(dataset, columns, batch_rows)


def _computed(dataset: datasets.Dataset, columns: list[str], batch_rows: int) -> np.ndarray:
    parts = [row_hashes(batch[c] for c in columns) for batch in dataset.select_columns(columns).iter(batch_size=batch_rows)]
    return np.concatenate(parts) if parts else np.empty((0, len(columns)), dtype=np.uint64)


def save_keys(path: Path, keys: np.ndarray) -> None:
    """``keys`` to ``path`` (``.npy``), renamed into place: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, keys)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
