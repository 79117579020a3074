"""Training files of any size: validated once into a memory-mapped Arrow cache.

A training file is read as a stream of checked rows (:mod:`simcse_kit.data.readers`)
and written, in record batches of :data:`RECORD_ROWS` rows, into an Arrow file that
`datasets.Dataset.from_file` memory-maps. Python holds one batch, never the corpus: the
rows live in the operating system's page cache, shared by every process of a run that
maps the same file, and a process touches only the pages of the examples it reads.

The cache is keyed on what the rows depend on: the file's absolute path, size and
modification time, a hash of its first and last MiB, the columns asked for, how bad rows
are handled and :data:`FORMAT`. A dataset of several shards (:func:`simcse_kit.files.shard_paths`)
has one cache per shard, and the processes of a launch build different shards at once
(:func:`each_shard`): each takes the shards no other process is building, starting from its
own share, then waits for the rest; the run maps the union, in the shards' order. A second run
with the same file starts from the cache without reading the file; an edited file (or shard)
gets a new key and is read again. Each cache
file has a JSON sidecar with what the read found (rows, skipped rows and the first few
reasons, duplicates, ``k``), written last: a cache without its sidecar is incomplete and
is not used. Both are renamed into place, and a lock file beside them lets one process
build while the others (the rest of a multi-process run) wait and then map its cache.
A damaged cache (a truncated Arrow file, a broken sidecar) is named in one warning and rebuilt.
The repeats of a sharded corpus's sentences across its shards are counted on the shards' keys
once and kept beside the first shard's cache (:func:`repeats_file`), so a warm start sorts no keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from filelock import FileLock, Timeout

from simcse_kit.data.overlap import hashes_file, row_hashes, save_keys
from simcse_kit.errors import DataError, StorageError
from simcse_kit.files import storage_error, write_text_atomic

logger = logging.getLogger(__name__)

FORMAT = 2  #: bump when the rows a file gives or the cache's layout change: older caches are not reused
BATCH_ROWS = 10_000  #: rows held in Python while building: about 1-2 MB of short sentences
#: Rows per record batch of the cache: opening it reads every batch's header, and each such
#: page fault maps the pages around it, so small batches would page in much of a large corpus.
RECORD_ROWS = 50_000
SHOWN_BAD_ROWS = 5  #: bad rows named in the log (and the sidecar) when they are skipped
EDGE_BYTES = 2**20  # the head and tail hashed into the cache key
SUBFOLDER = "simcse_kit_train"
REPEATS_SUFFIX = ".repeats.txt"  #: beside a sharded corpus's first cache: its repeats across the parts

BAD_ROWS = ("error", "skip")


@dataclass
class BadRows:
    """What to do with a bad row: ``error`` raises its DataError (the file, the line and
    the problem), ``skip`` counts it and names the first :data:`SHOWN_BAD_ROWS` in the log."""

    policy: str = "error"
    count: int = 0
    shown: list[str] = field(default_factory=list)

    def __call__(self, error: DataError) -> None:
        if self.policy != "skip":
            raise error
        self.count += 1
        if len(self.shown) < SHOWN_BAD_ROWS:
            self.shown.append(str(error))
            logger.warning("skipped bad row: %s", error)


@dataclass(frozen=True)
class Report:
    """What reading a training file found (the cache's sidecar).

    Attributes:
        rows: the examples kept.
        skipped: bad rows skipped (``data.bad_rows: skip``).
        shown: the first skipped rows' errors.
        duplicates: repeated texts among the rows (``unsup`` text files; 0 otherwise).
        columns: the dataset's columns.
        seconds: how long the read took when the cache was built.
    """

    rows: int
    skipped: int
    shown: list[str]
    duplicates: int
    columns: list[str]
    seconds: float


@dataclass(frozen=True)
class Corpus:
    """A training file as a memory-mapped dataset, with its :class:`Report`.

    Attributes:
        dataset: the rows, memory-mapped from ``cache_files``.
        report: what the read found.
        cache_files: the Arrow file, or each shard's in order.
        cache_hit: every cache was already there (nothing was read).
    """

    dataset: datasets.Dataset
    report: Report
    cache_files: tuple[Path, ...]
    cache_hit: bool


def default_cache_dir() -> Path:
    """``$HF_DATASETS_CACHE`` as set now (else `datasets`' default), where `datasets` keeps
    its own caches: beside the data may be read-only."""
    return Path(os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE)


def cache_key(paths: Path | Sequence[Path], what: dict[str, object]) -> str:
    """The cache key of the shards ``paths`` (a file: a list of one) read as ``what`` (module docstring)."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    stats = [path.stat() for path in paths]
    ids = [[str(path.resolve()), stat.st_size, stat.st_mtime_ns] for path, stat in zip(paths, stats, strict=True)]
    # One file keeps the key it always had (its cache is reused); shards list theirs in order.
    head = [FORMAT, *ids[0], what] if len(ids) == 1 else [FORMAT, ids, what]
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps(head, sort_keys=True).encode())
    for path, stat in zip(paths, stats, strict=True):
        with path.open("rb") as fh:
            digest.update(fh.read(EDGE_BYTES))
            if stat.st_size > EDGE_BYTES:
                fh.seek(max(EDGE_BYTES, stat.st_size - EDGE_BYTES))
                digest.update(fh.read())
    return digest.hexdigest()


def shown(paths: Sequence[Path]) -> str:
    """How a log line names a dataset's files: the file, or the first shard and how many there are."""
    return str(paths[0]) if len(paths) == 1 else f"{paths[0]} and {len(paths) - 1} more shard(s)"


def cached_corpus(
    paths: Path | Sequence[Path],
    rows: Callable[[BadRows], Iterator[dict[str, list[str]]]],
    what: dict[str, object],
    bad_rows: str = "error",
    cache_dir: str | Path | None = None,
    count_duplicates: str | None = None,
    check: Callable[[Report], None] | None = None,
    wait: bool = True,
) -> Corpus | None:
    """The rows of ``paths`` as a memory-mapped dataset: from the cache, or read with ``rows`` and cached.

    Args:
        paths: the training file (or a shard).
        rows: ``rows(bad) -> checked rows`` as column batches (:func:`batched`); each
            bad row goes to ``bad`` (which raises or counts it), file-level problems raise.
        what: how the file is read (columns, mode): part of the cache key.
        bad_rows: ``error`` or ``skip``.
        cache_dir: where the cache goes (default :func:`default_cache_dir`).
        count_duplicates: count repeated values of this column (kept in the report).
        check: called on the report before the cache is kept; raises to refuse the file
            (too few rows), so a refused file leaves no cache.
        wait: wait while another process builds this cache; False: return None then.

    Raises:
        DataError: a bad row (``error``), a file-level problem, or ``check``'s refusal.
        StorageError: the cache folder cannot be written.
    """
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = folder / SUBFOLDER
    paths = [paths] if isinstance(paths, Path) else list(paths)
    key = cache_key(paths, what | {"bad_rows": bad_rows})
    name = f"{paths[0].stem[:40]}-{key}"
    arrow, sidecar = folder / f"{name}.arrow", folder / f"{name}.json"
    if arrow.is_file() and sidecar.is_file() and (found := _hit(paths, arrow, sidecar, check)) is not None:
        return found
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f".{name}.lock"))
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        return None
    except OSError as exc:
        raise _cache_error(exc, folder) from None
    # One builder: the other processes of a run (or other runs) wait here, then map its cache;
    # a bad row stops each of them in turn with the same error.
    try:
        if arrow.is_file() and sidecar.is_file():
            found = _hit(paths, arrow, sidecar, check, warn=True)
            if found is not None:
                return found
            sidecar.unlink(missing_ok=True)  # first: a cache without its sidecar is never used
        return _build_cache(paths, rows, folder, arrow, sidecar, bad_rows, count_duplicates, check)
    finally:
        lock.release()


def _hit(
    paths: list[Path], arrow: Path, sidecar: Path, check: Callable[[Report], None] | None, warn: bool = False
) -> Corpus | None:
    """The cache of ``paths``, or None where it is damaged (a truncated Arrow file, a broken
    sidecar, fewer rows than the sidecar says): the caller rebuilds it under the lock, where
    ``warn`` names it in one warning line."""
    try:
        report = Report(**json.loads(sidecar.read_text(encoding="utf-8")))
        dataset = _mapped(arrow, report)
        if len(dataset) != report.rows or dataset.column_names != report.columns:
            raise ValueError(f"{len(dataset)} rows {dataset.column_names}, its sidecar says {report.rows} {report.columns}")
    except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSErrors
        if warn:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            logger.warning("the training data's cache %s is damaged (%s); rebuilding it from %s", arrow, reason, shown(paths))
        return None
    if check is not None:
        check(report)
    _log_skipped(paths, report)
    return Corpus(dataset, report, (arrow,), cache_hit=True)


def launch_slot() -> tuple[int, int]:
    """This process's ``LOCAL_RANK`` among the ``LOCAL_WORLD_SIZE`` processes of a launch on this machine, as
    torchrun and ``accelerate launch`` set them (``(0, 1)`` outside a launch)."""
    return int(os.environ.get("LOCAL_RANK", 0)), max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def each_shard(
    parts: Sequence[tuple[Path, tuple[int, int] | None]],
    get: Callable[[tuple[Path, tuple[int, int] | None], bool], Corpus | None],
) -> list[Corpus]:
    """``get(part, wait)`` of every part of a dataset (a shard, or a byte range of a large file:
    ``(file, (start, end))``, None for the whole file), in order, the processes of a launch
    building different parts at once.

    Each process first asks for every shard without waiting (``get`` returns None where another
    process holds the shard's lock: it is building that one), starting at its own share of the
    list (:func:`launch_slot`), then waits for the ones it skipped. No process plans for the others: the locks share the
    work, so the same holds on a node-local cache folder (each node builds its copy) and on a shared one.
    """
    rank, size = launch_slot()
    first = len(parts) * rank // size
    order = [*range(first, len(parts)), *range(first)]
    found = {i: got for i in order if (got := get(parts[i], False)) is not None}
    for i in order:
        if i not in found:
            got = get(parts[i], True)
            assert got is not None, "a get that waits returns the part"
            found[i] = got
    return [found[i] for i in range(len(parts))]


def union(parts: Sequence[Corpus], duplicates_of: str | None = None) -> Corpus:
    """The shards' corpora as one, rows in the shards' order (a shard whose rows were all skipped adds
    none); the report sums theirs, and ``duplicates_of`` counts its repeats across the shards too."""
    kept = [part for part in parts if part.report.rows]
    duplicates = _repeats_across(kept, duplicates_of) if duplicates_of is not None and kept else 0
    report = Report(
        rows=sum(p.report.rows for p in parts),
        skipped=sum(p.report.skipped for p in parts),
        shown=[line for p in parts for line in p.report.shown][:SHOWN_BAD_ROWS],
        duplicates=duplicates,
        columns=kept[0].report.columns if kept else [],
        seconds=sum(p.report.seconds for p in parts),
    )
    dataset = datasets.concatenate_datasets([p.dataset for p in kept]) if kept else datasets.Dataset.from_dict({})
    files = tuple(f for p in parts for f in p.cache_files)
    return Corpus(dataset, report, files, cache_hit=all(p.cache_hit for p in parts))


def repeats_file(parts: Sequence[Corpus], column: str) -> Path:
    """Where the count of ``column``'s repeats across ``parts`` is kept: beside the first part's cache, named
    by a digest of the parts' cache names (each names its file's state), so other parts get another file."""
    names = [str(column), *(p.cache_files[0].name for p in parts)]
    digest = hashlib.blake2b("\n".join(names).encode(), digest_size=16).hexdigest()
    return parts[0].cache_files[0].with_name(f"union-{digest}{REPEATS_SUFFIX}")


def _repeats_across(parts: Sequence[Corpus], column: str) -> int:
    """:func:`repeats` of ``column`` over every part's keys together, counted once and kept
    (:func:`repeats_file`): a warm start of a 10M-row corpus reads one number instead of
    loading and sorting 10M keys again."""
    path = repeats_file(parts, column)
    try:
        return int(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not counted yet, or a damaged file: counted again
        pass
    at = parts[0].report.columns.index(column)
    count = repeats(np.concatenate([np.load(hashes_file(p.cache_files[0]), mmap_mode="r")[:, at] for p in parts]))
    try:
        write_text_atomic(path, f"{count}\n")
    except OSError as exc:  # a read-only cache folder (a StorageError): the next start counts again
        logger.info("the count of repeated sentences not kept at %s (%s)", path, exc)
    return count


def _build_cache(
    paths: list[Path],
    rows: Callable[[BadRows], Iterator[dict[str, list[str]]]],
    folder: Path,
    arrow: Path,
    sidecar: Path,
    bad_rows: str,
    count_duplicates: str | None,
    check: Callable[[Report], None] | None,
) -> Corpus:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{arrow.name}.", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise _cache_error(exc, folder) from None
    try:
        report, keys = _build(Path(tmp), rows, BadRows(bad_rows), count_duplicates)
        if check is not None:
            check(report)
        os.replace(tmp, arrow)
        save_keys(hashes_file(arrow), keys)  # before the sidecar: a cache with a sidecar has its keys
        write_text_atomic(sidecar, json.dumps(asdict(report), indent=1))
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        # A write that failed (full disk, read-only folder); not a read of the training file.
        if isinstance(exc, OSError) and not (exc.filename and Path(exc.filename) in paths):
            raise _cache_error(exc, folder) from None
        raise
    if report.skipped:
        logger.warning("%s: %d bad row(s) skipped (data.bad_rows: skip)", shown(paths), report.skipped)
    rate = report.rows / max(report.seconds, 1e-9)
    logger.info("%s: %d rows cached in %.1f s (%.0f rows/s) at %s", shown(paths), report.rows, report.seconds, rate, arrow)
    return Corpus(_mapped(arrow, report), report, (arrow,), cache_hit=False)


def _mapped(arrow: Path, report: Report) -> datasets.Dataset:
    """The cache ``arrow`` memory-mapped (a shard whose every row was skipped: no file to map, no rows)."""
    return datasets.Dataset.from_file(str(arrow)) if report.rows else datasets.Dataset.from_dict({})


def _build(
    tmp: Path, rows: Callable[[BadRows], Iterator[dict[str, list[str]]]], bad: BadRows, count_duplicates: str | None
) -> tuple[Report, np.ndarray]:
    """Write the checked rows to ``tmp`` in Arrow batches; the report of what was read and
    the rows' sentence keys (:func:`simcse_kit.data.overlap.row_hashes` of the text columns),
    computed on the way, so the contamination guard never reads the corpus again (and the
    repeats of ``count_duplicates`` are counted on them)."""
    start = time.perf_counter()
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    keys: list[np.ndarray] = []  # 8 bytes a text: its normalised sentence's key
    pending: list[pa.RecordBatch] = []  # Arrow batches not yet written, fewer than RECORD_ROWS rows
    n = 0
    columns: list[str] = []
    kinds: list[pa.DataType] = []
    with pa.OSFile(str(tmp), "wb") as sink:
        for batch in rows(bad):
            if writer is None:
                columns = list(batch)
                kinds = [_arrow_type(batch[name][0]) for name in columns]
                schema = pa.schema(list(zip(columns, kinds, strict=True)))
                writer = pa.ipc.new_stream(sink, schema)
            pending.append(pa.record_batch([pa.array(batch[c], k) for c, k in zip(columns, kinds, strict=True)], names=columns))
            if sum(len(b) for b in pending) >= RECORD_ROWS:
                _write_together(writer, pending)
            keys.append(row_hashes(batch[c] for c, k in zip(columns, kinds, strict=True) if k == pa.string()))
            n += len(batch[columns[0]])
        if writer is not None:
            _write_together(writer, pending)
            writer.close()
    every = np.concatenate(keys) if keys else np.empty((0, 0), dtype=np.uint64)
    texts = [c for c, k in zip(columns, kinds, strict=True) if k == pa.string()]
    duplicates = repeats(every[:, texts.index(count_duplicates)]) if count_duplicates is not None and n else 0
    return Report(n, bad.count, bad.shown, duplicates, columns, time.perf_counter() - start), every


def repeats(keys: np.ndarray) -> int:
    """How many of ``keys`` repeat an earlier one (the sentence keys of :mod:`simcse_kit.data.overlap`:
    copies that differ in case, punctuation or spacing count as repeats too)."""
    ordered = np.sort(keys)
    return int(np.count_nonzero(ordered[1:] == ordered[:-1]))


def _write_together(writer: pa.ipc.RecordBatchStreamWriter, pending: list[pa.RecordBatch]) -> None:
    """Write ``pending`` as one record batch, and empty it."""
    if pending:
        writer.write_batch(pa.Table.from_batches(pending).combine_chunks().to_batches()[0])
        pending.clear()


def _arrow_type(value: object) -> pa.DataType:
    """A column's Arrow type from its first value: text as strings, a scored mode's score
    (a float) as float64, a row's teacher scores (a list of floats) as a list of float64."""
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, list):
        return pa.list_(pa.float64())
    return pa.string()


def batched(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, list[Any]]]:
    """Rows as column batches of :data:`BATCH_ROWS`."""
    batch: dict[str, list[Any]] = {}
    size = 0
    for row in rows:
        if not batch:
            batch = {name: [] for name in row}
        for name, value in row.items():
            batch[name].append(value)
        size += 1
        if size == BATCH_ROWS:
            yield batch
            batch, size = {}, 0
    if size:
        yield batch


def _log_skipped(paths: list[Path], report: Report) -> None:
    """On a cache hit, what the build said of the skipped rows."""
    for message in report.shown:
        logger.warning("skipped bad row: %s", message)
    if report.skipped:
        logger.warning("%s: %d bad row(s) skipped (data.bad_rows: skip)", shown(paths), report.skipped)


def _cache_error(exc: OSError, folder: Path) -> StorageError:
    error = storage_error(exc, folder)
    if error is not None:
        return StorageError(f"data.cache_dir {folder}: {error}")
    return StorageError(f"data.cache_dir {folder}: cannot write the training data's cache there ({exc.strerror or exc})")
