"""Token tables: every training text tokenised once, ahead of training, memory-mapped.

Tokenising in the collator costs a Python tokenizer call per batch (and, in ``unsup``, each
sentence twice: ``[a, a, b, b]``); on a GPU that host work, not the model, sets the pace
(BENCHMARKS.md, "Input pipeline"). So each training file's texts are tokenised once into a
table beside its text cache (:mod:`simcse_kit.data.corpus`): one row per example, one
``input_ids.<column>`` column per distinct (column, prompt) the mode's views read and one
``text_id.<column>`` column per text column (the 64-bit hashes of
:func:`simcse_kit.core.batch.text_ids`). The table is joined to the text rows column-wise,
so selecting, mixing and shuffling examples keep them together, and the collator pads the
rows' ids (:class:`Padding`) instead of calling the tokenizer.

The ids are the tokenizer's own (``tokenizer(texts, truncation=True, max_length=...)``, its
special tokens and truncation), built with ``datasets.map(batched=True, num_proc=...)``.
A table is keyed on what its ids depend on: the text cache it was made from (whose name
carries that file's key), the tokenizer (:func:`tokenizer_fingerprint`), ``max_seq_len``, the
views' prompts and :data:`FORMAT`. It is a folder of Arrow shards (one per ``map`` process)
with a JSON sidecar written last, renamed into place; a lock file lets one process build it
while the others of a run wait and then map it. A dataset without a text cache (in memory,
or a ``hub:`` dataset) is tokenised by ``datasets.map`` too, in memory or in `datasets`' own
cache. A damaged table (a truncated shard, a broken sidecar) is named in one warning and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal, overload

import datasets
import numpy as np
import pyarrow as pa
import torch
from filelock import FileLock, Timeout

from simcse_kit.core.batch import text_ids, view_columns, view_prompts
from simcse_kit.core.modes import negatives_in
from simcse_kit.errors import StorageError
from simcse_kit.files import storage_error, write_text_atomic

logger = logging.getLogger(__name__)

FORMAT = 2  #: bump when a table's contents or layout change: older tables are not reused
IDS = "input_ids."  # + a text column (and its prompt's hash): those texts' token ids
TEXT_ID = "text_id."  # + a text column: its texts' text_ids (false-negative masking)
# Rows per map batch, and so per Arrow record batch of the table. Opening a memory-mapped
# table reads every record batch's header, and each such page fault maps the pages around it
# (kernel read-around): 1,000-row batches made a 10M-row table resident (650 MiB) on open.
MAP_BATCH = 50_000
TOKENIZER_BATCH = 1000  # texts per tokenizer call: Python holds one call's lists at a time
#: Fewer rows than this per map process: starting one costs more than it saves. A pool of 2 pays
#: from about 10,000 rows on (all-MiniLM-L6-v2's tokenizer, this 2-core CPU: 12,500 rows in 1.22 s on
#: 2 processes, 1.40 s on 1; 50,000 in 3.96 s and 6.97 s), which a shard of a corpus often is.
ROWS_PER_PROCESS = 10_000


@dataclass(frozen=True)
class Tokenization:
    """How a run turns texts into token ids.

    Attributes:
        tokenizer: the model's tokenizer (as the run prepared it).
        max_seq_len: tokens per row, at most (``model.max_seq_len``).
        prompts: ``data.prompts`` (``query`` for view 0, ``document`` for the others), or None.
    """

    tokenizer: Any
    max_seq_len: int
    prompts: Mapping[str, str] | None = None

    def sources(self, mode: str, negatives: int = 1) -> list[tuple[str, str]]:
        """Per view of ``mode``, the (column, prompt) its text is made of."""
        prompts = view_prompts(self.prompts, mode, negatives) or ("",) * len(view_columns(mode, negatives))
        return list(zip(view_columns(mode, negatives), prompts, strict=True))


def id_columns(sources: Sequence[tuple[str, str]]) -> list[str]:
    """Per view, its table column: ``input_ids.<column>``, and ``.<hash>`` of the prompt
    where the view has one, so a table made with other prompts is never read as this one's
    (``unsup`` without prompts: both views read ``input_ids.sent0``)."""
    return [IDS + column + (f".{_short_hash(prompt)}" if prompt else "") for column, prompt in sources]


def _short_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What a tokenizer's ids depend on, as a hash: its class, ``name_or_path``, truncation
    side and special tokens, and its whole definition (a fast tokenizer's ``tokenizer.json``:
    vocabulary, normaliser, pre-tokeniser, post-processor such as an appended EOS) or else its
    vocabulary. The backend's truncation and padding settings are left out: each call sets them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
    else:
        definition = tokenizer.get_vocab()
    what = [
        type(tokenizer).__name__,
        str(getattr(tokenizer, "name_or_path", "")),
        getattr(tokenizer, "truncation_side", "right"),
        sorted(tokenizer.all_special_tokens),
        definition,
    ]
    return hashlib.blake2b(json.dumps(what, sort_keys=True).encode(), digest_size=16).hexdigest()


def table_key(dataset_key: str, tokenization: Tokenization, sources: Sequence[tuple[str, str]]) -> str:
    """The key of a token table: the rows it was made from (``dataset_key``) and how they are tokenised."""
    what = [FORMAT, dataset_key, tokenizer_fingerprint(tokenization.tokenizer), tokenization.max_seq_len, list(sources)]
    return hashlib.blake2b(json.dumps(what).encode(), digest_size=16).hexdigest()


def ids_only(tokenizer: Any) -> bool:
    """Whether a batch can be rebuilt from the ids alone: one text's ``token_type_ids``
    (where the tokenizer gives them) are all zeros, as the padded batch's then are. A
    tokenizer that marks a single text otherwise is left to tokenise in the collator."""
    return not any(tokenizer("a").get("token_type_ids") or ())


def _encode(batch: dict[str, list[Any]], tokenization: Tokenization, sources: Sequence[tuple[str, str]]) -> pa.Table:
    """``datasets.map``'s function: a batch of examples' ids (int32 lists) and text ids, as
    Arrow columns (no Python list per row of a map batch)."""
    out: dict[str, pa.Array] = {}
    for name, (column, prompt) in zip(id_columns(sources), sources, strict=True):
        if name not in out:
            texts = [prompt + text for text in batch[column]] if prompt else batch[column]
            out[name] = pa.concat_arrays(
                [_id_lists(tokenization, texts[i : i + TOKENIZER_BATCH]) for i in range(0, len(texts), TOKENIZER_BATCH)]
            )
    for column in dict.fromkeys(column for column, _ in sources):
        out[TEXT_ID + column] = pa.array(text_ids(batch[column]).numpy())
    return pa.table(out)


def _id_lists(tokenization: Tokenization, texts: Sequence[str]) -> pa.Array:
    """``texts``' token ids as one int32 Arrow list per text."""
    ids = tokenization.tokenizer(list(texts), truncation=True, max_length=tokenization.max_seq_len)["input_ids"]
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _features(sources: Sequence[tuple[str, str]]) -> datasets.Features:
    ids = {name: datasets.Sequence(datasets.Value("int32")) for name in dict.fromkeys(id_columns(sources))}
    hashes = {TEXT_ID + column: datasets.Value("int64") for column, _ in sources}
    return datasets.Features(ids | hashes)


def map_processes(rows: int, share: int = 1) -> int:
    """``num_proc`` for tokenising ``rows`` texts: the CPUs this process may use (a ``share``-th of
    them where that many processes build tables at once), one per :data:`ROWS_PER_PROCESS` rows
    (1: in this process, no pool)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus // max(share, 1), rows // ROWS_PER_PROCESS))


@overload
def with_tokens(
    dataset: datasets.Dataset,
    tokenization: Tokenization,
    mode: str,
    text_cache: Path | None = None,
    wait: Literal[True] = True,
    share: int = 1,
) -> datasets.Dataset: ...


@overload
def with_tokens(
    dataset: datasets.Dataset, tokenization: Tokenization, mode: str, text_cache: Path | None, wait: bool, share: int = 1
) -> datasets.Dataset | None: ...


def with_tokens(
    dataset: datasets.Dataset,
    tokenization: Tokenization,
    mode: str,
    text_cache: Path | None = None,
    wait: bool = True,
    share: int = 1,
) -> datasets.Dataset | None:
    """``dataset`` with its token table's columns beside its own (unchanged if it has them,
    or if the tokenizer's batches cannot be rebuilt from ids: :func:`ids_only`).

    Args:
        dataset: all the rows of a training file or hub dataset, in order (the readers'
            columns), or a training set held in memory.
        tokenization: the tokenizer, length and prompts.
        mode: the training mode.
        text_cache: the Arrow text cache ``dataset`` maps: the table is built (or found)
            beside it. None: ``datasets.map`` tokenises ``dataset``, in memory, or, where
            it is memory-mapped (a hub dataset), into `datasets`' cache beside it, keyed on
            its files, rows and columns.
        wait: wait while another process builds this table; False: return None then.
        share: how many processes may be building tables at once (:func:`map_processes`).

    Raises:
        StorageError: the table cannot be written beside ``text_cache``.
    """
    sources = tokenization.sources(mode, negatives_in(dataset.column_names))
    if all(name in dataset.column_names for name in id_columns(sources)) or not ids_only(tokenization.tokenizer):
        return dataset
    if text_cache is not None:
        table = cached_table(dataset, text_cache, tokenization, sources, wait, share)
        if table is None:  # another process is building it (wait=False)
            return None
    else:
        files = [entry["filename"] for entry in dataset.cache_files]
        key = table_key(json.dumps([files, len(dataset), dataset.column_names]), tokenization, sources)
        table = _tokenised(dataset, tokenization, sources, key, map_processes(len(dataset)), keep_in_memory=not files)
    return datasets.concatenate_datasets([dataset, table], axis=1)


def _tokenised(
    dataset: datasets.Dataset,
    tokenization: Tokenization,
    sources: Sequence[tuple[str, str]],
    key: str,
    processes: int,
    **where: Any,
) -> datasets.Dataset:
    """The token columns of ``dataset`` by ``datasets.map`` in ``processes`` processes,
    fingerprinted ``key``; ``where``: where ``map`` keeps them."""
    return dataset.map(
        _encode,
        batched=True,
        batch_size=MAP_BATCH,
        writer_batch_size=MAP_BATCH,
        fn_kwargs={"tokenization": tokenization, "sources": sources},
        remove_columns=dataset.column_names,
        features=_features(sources),
        num_proc=processes if processes > 1 else None,
        new_fingerprint=key,
        desc="tokenising",
        **where,
    )


def cached_table(
    dataset: datasets.Dataset,
    text_cache: Path,
    tokenization: Tokenization,
    sources: Sequence[tuple[str, str]],
    wait: bool = True,
    share: int = 1,
) -> datasets.Dataset | None:
    """The token table of ``dataset`` (the rows of ``text_cache``): found beside it, or built
    there by one process while the others wait (module docstring); None where ``wait`` is False
    and another process is building it."""
    key = table_key(text_cache.stem, tokenization, sources)
    folder = text_cache.parent / f"{text_cache.stem}.tokens-{key}"
    sidecar = folder / "table.json"
    if sidecar.is_file() and (table := _mapped(folder, len(dataset))) is not None:
        return table
    try:
        lock = FileLock(str(folder.parent / f".{folder.name}.lock"))
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        return None
    except OSError as exc:
        raise _table_error(exc, folder) from None
    try:
        if sidecar.is_file():
            if (table := _mapped(folder, len(dataset), warn=True)) is not None:
                return table
            shutil.rmtree(folder)
        _build(dataset, folder, key, tokenization, sources, share)
    finally:
        lock.release()
    table = _mapped(folder, len(dataset))
    if table is None:
        raise StorageError(f"data.cache_dir {folder.parent}: the token table {folder} just written cannot be read back")
    return table


def _mapped(folder: Path, rows: int, warn: bool = False) -> datasets.Dataset | None:
    """The token table in ``folder``, memory-mapped; None where it is damaged (a broken
    sidecar, a truncated shard, other than ``rows`` rows): the caller rebuilds it under the
    lock, where ``warn`` names it in one warning line."""
    try:
        shards = json.loads((folder / "table.json").read_text(encoding="utf-8"))["shards"]
        table = datasets.concatenate_datasets([datasets.Dataset.from_file(str(folder / name)) for name in shards])
        if len(table) != rows:
            raise ValueError(f"{len(table)} rows for {rows} examples")
    except (OSError, ValueError, TypeError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        if warn:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            logger.warning("the token table %s is damaged (%s); rebuilding it", folder, reason)
        return None
    return table


def _build(
    dataset: datasets.Dataset,
    folder: Path,
    key: str,
    tokenization: Tokenization,
    sources: Sequence[tuple[str, str]],
    share: int = 1,
) -> None:
    """Tokenise ``dataset`` into shards in a temporary folder, renamed to ``folder`` once complete."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:
        raise _table_error(exc, folder) from None
    start, cpu = time.perf_counter(), _cpu_seconds()
    processes = map_processes(len(dataset), share)
    try:
        where = {"cache_file_name": str(tmp / "tokens.arrow"), "load_from_cache_file": False}
        _tokenised(dataset, tokenization, sources, key, processes, **where)
        seconds = time.perf_counter() - start
        record = {
            "rows": len(dataset),
            "processes": processes,
            "seconds": seconds,
            "cpu_seconds": _cpu_seconds() - cpu,
            "shards": sorted(p.name for p in tmp.glob("*.arrow")),
        }
        write_text_atomic(tmp / "table.json", json.dumps(record, indent=1))
        os.replace(tmp, folder)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _table_error(exc, folder) from None
        raise
    rate = len(dataset) / max(seconds, 1e-9)
    logger.info("%d rows tokenised in %.1f s (%.0f rows/s, %d process(es)) at %s", len(dataset), seconds, rate, processes, folder)


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (``map``'s worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _table_error(exc: OSError, folder: Path) -> StorageError:
    error = storage_error(exc, folder.parent)
    reason = error if error is not None else f"cannot write the token table there ({exc.strerror or exc})"
    return StorageError(f"data.cache_dir {folder.parent}: {reason}")


@dataclass(frozen=True)
class Padding:
    """How the tokenizer pads a batch (``tokenizer(texts, padding=True)``): to the longest
    row, on ``side``, ids with ``pad_id``, types with ``pad_type_id``, the batch's keys in
    ``keys`` order (``token_type_ids`` only where the tokenizer gives them)."""

    pad_id: int
    pad_type_id: int
    side: str
    keys: tuple[str, ...]

    @classmethod
    def of(cls, tokenizer: Any) -> Padding:
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token: it cannot pad a batch")
        keys = tuple(k for k in tokenizer(["a"]).keys() if k in ("input_ids", "token_type_ids", "attention_mask"))
        return cls(int(tokenizer.pad_token_id), int(tokenizer.pad_token_type_id), tokenizer.padding_side, keys)

    def __call__(self, rows: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """``B`` rows of ids as the padded batch: ``[B, T]`` int64 tensors, ``T`` the longest row.

        Every id is copied in one numpy assignment, not a step per row: this runs for every
        training batch.
        """
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        width = int(lengths.max()) if len(rows) else 0
        tokens = np.arange(width) < lengths[:, None]
        if self.side == "left":
            tokens = tokens[:, ::-1]
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        ids[tokens] = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        out = {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(np.where(tokens, 0, self.pad_type_id)),
            "attention_mask": torch.from_numpy(tokens.astype(np.int64)),
        }
        return {key: out[key] for key in self.keys}
