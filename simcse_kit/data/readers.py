r"""Training data: validated readers of training files and their `datasets` wrapping.

Files are streamed with :class:`simcse_kit.files.LineStream` (UTF-8, a byte-order mark as
Excel writes it dropped, ``\r\n`` or ``\n``) and checked here row by row, so an error
names the file and line; training writes the checked rows into a memory-mapped Arrow
cache (:mod:`simcse_kit.data.corpus`), so a corpus of any size is read in constant
memory. Formats, by training mode:

  * ``unsup``: a text file, one sentence a line; blank lines are skipped.
  * ``sup``: CSV or JSONL with columns ``sent0, sent1`` (extra columns are ignored).
  * ``hardneg``: CSV or JSONL with ``sent0, sent1, hard_neg``; or ``k`` hard negatives
    per example: JSONL ``"hard_neg": [..k texts..]``, or CSV (or JSONL) columns
    ``hard_neg_1 .. hard_neg_k``. ``k`` is the file's: every row must have the same
    number (a fixed ``V = 2 + k`` views per example keeps the batch layout one reshape);
    the dataset's columns are :func:`simcse_kit.core.modes.hard_negative_columns` of ``k``
    (``hard_neg`` for one, as before) and :func:`negatives_of` reads ``k`` back.
    With a teacher's scores of each row's candidates (``loss.distill``), ``1 + k`` numbers,
    the positive's first: JSONL ``"scores": [s_pos, s_neg_1, .., s_neg_k]``; CSV columns
    ``score_pos`` and, per negative column, its name with ``hard_`` made ``score_``
    (``score_neg`` beside ``hard_neg``, ``score_neg_1 .. score_neg_k`` beside
    ``hard_neg_1 .. hard_neg_k``). The dataset's column :data:`TEACHER_SCORES` holds the list.
  * ``hub:<id>``: a hub dataset (users with internet), same columns, split ``train``.

The table formats are CSV (``.csv``; a header separated by semicolons, as Excel saves CSV
where the decimal separator is a comma, makes the file's separator ``;`` and its scores'
decimal separator ``,``; one separated by tabs, tabs), TSV (``.tsv``: CSV's rules,
tab-separated), JSONL (``.jsonl``, ``.json``), Parquet (``.parquet``: one row an example,
the JSONL keys as its columns; a ``hard_neg`` column may hold lists) and Arrow (``.arrow``,
the same columns: the IPC stream ``datasets`` saves, or an IPC file; a ``save_to_disk``
folder is its ``data-*.arrow`` shards). A text, CSV, TSV or JSONL file may be
gzip- or zstd-compressed (``train.jsonl.gz``, ``wiki.txt.zst``: :func:`simcse_kit.files.open_binary`).
A dataset may be several files, its *shards* (:func:`simcse_kit.files.shard_paths`: a glob
pattern, a folder, or a list; a single file is a list of one): they are read in that order,
one after the other, as one dataset of rows, and an error names the shard and its line
(a Parquet file's row). ``k`` is then the first shard's, and every shard's rows must have it.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from simcse_kit.core import modes
from simcse_kit.core.batch import VIEW_COLUMNS
from simcse_kit.data.corpus import (
    SUBFOLDER,
    BadRows,
    Corpus,
    Report,
    batched,
    cached_corpus,
    each_shard,
    launch_slot,
    shown,
    union,
)
from simcse_kit.data.tokens import Tokenization, with_tokens
from simcse_kit.errors import DataError, where
from simcse_kit.files import (
    BOM,
    LineStream,
    check_not_utf16,
    check_readable,
    compression_of,
    data_suffix,
    json_object,
    not_utf8,
    nul_error,
    open_binary,
    shard_paths,
)

#: A dataset's files: a file, a glob pattern or a folder of shards, or a list of them
#: (:func:`simcse_kit.files.shard_paths`).
Source = str | Path | Sequence[str | Path]

logger = logging.getLogger(__name__)

# The columns a training file of each mode must have: those its views are read from.
COLUMNS: dict[str, tuple[str, ...]] = {mode: tuple(dict.fromkeys(cols)) for mode, cols in VIEW_COLUMNS.items()}
#: The suffixes (:func:`simcse_kit.files.data_suffix`) of table formats; any other file is text, one sentence a line.
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet", ".arrow")
COLUMNAR = {".parquet": "a Parquet", ".arrow": "an Arrow"}  #: formats of rows in record batches, by suffix


def read_sentences(path: Source) -> list[str]:
    """One sentence a line; blank lines skipped; an empty file is an error.

    A list, for small files; training reads the same rows into the Arrow cache
    (:func:`read_train_file`)."""
    paths = shard_paths(path)
    sentences = [s for shard in paths for batch in sentence_batches(shard, BadRows()) for s in batch["sent0"]]
    _enough_sentences(_named(path, paths), len(sentences))
    return sentences


def _named(source: Source, paths: list[Path]) -> str:
    """How a whole-dataset message names ``source``: as given, or (a list) by its shards."""
    return str(source) if isinstance(source, str | Path) else shown(paths)


def _enough_sentences(path: object, n: int) -> None:
    if not n:
        raise DataError(f"{path}: no sentences (the file is empty or blank)")
    if n < 2:
        raise DataError(f"{path}: only one sentence; contrastive training needs at least two (in-batch negatives)")


def _enough_rows(path: object, n: int) -> None:
    if n < 2:
        raise DataError(f"{path}: {n} usable row(s); contrastive training needs at least two")


BOM_BYTES = BOM.encode("utf-8")
BLOCK_BYTES = 2**20  #: a text corpus is read in blocks of whole lines of about this size
#: A plain text corpus over this size is cached in byte ranges of about this size, built by
#: the processes of a launch at once (:func:`byte_ranges`); smaller files are one cache.
RANGE_BYTES = 2**27


def sentence_batches(path: Path, bad: BadRows, part: tuple[int, int] | None = None) -> Iterator[dict[str, list[str]]]:
    """The non-blank lines of a text file, stripped, as ``{"sent0": [...]}`` batches of
    about :data:`BLOCK_BYTES` of text; ``part``: only the lines of that byte range
    (:func:`byte_ranges`), numbered as in the whole file.

    Whole blocks are decoded and split at once (no Python step per line but the strip):
    a corpus is read at the speed of ``str.split``. A block that is not valid UTF-8 is
    decoded again line by line, so the bad line is named and (``skip``) only it is left out.
    """
    start, end = part or (0, None)
    with open_binary(path) as fh:
        lines_before = _newlines_before(fh, start)
        left = None if end is None else end - start
        rest = b""
        while True:
            chunk = fh.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
            left = None if left is None else left - len(chunk)
            data = rest + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)  # whole lines; at the end, what is left
            if not data:
                return
            if cut == 0:  # a line longer than a block: read on
                rest = data
                continue
            block, rest = data[:cut], data[cut:]
            if lines_before == 0:
                check_not_utf16(path, block)
            if lines_before == 0 and block.startswith(BOM_BYTES):
                block = block[len(BOM_BYTES) :]
            if lines_before == 0 and b"\n" not in block.rstrip(b"\n") and b"\r" in block.rstrip(b"\r\n"):
                # Old Mac line ends: the whole file would be one line (and "only one sentence").
                raise DataError(
                    f"{where(path)}: its lines end in a bare carriage return (classic Mac line ends) and none in a "
                    "newline; convert them to newlines (tr '\\r' '\\n')"
                )
            sentences = _block_sentences(path, block, lines_before, bad)
            lines_before += block.count(b"\n")
            if sentences:
                yield {"sent0": sentences}
            if not chunk:
                return


def _newlines_before(fh: Any, start: int) -> int:
    """Read ``fh`` up to byte ``start`` (a range's first line), counting its line ends: the lines before the range."""
    count = 0
    while start > 0:
        chunk = fh.read(min(BLOCK_BYTES * 8, start))
        if not chunk:
            break
        count += chunk.count(b"\n")
        start -= len(chunk)
    return count


def byte_ranges(path: Path, size: int) -> list[tuple[int, int]]:
    """A plain text file of more than ``size`` bytes as ranges of about ``size`` bytes, each
    starting at a line's start: parts built like shards, each by the process that takes it
    (:func:`simcse_kit.data.corpus.each_shard`). A smaller file is one range."""
    total = path.stat().st_size
    cuts = [0]
    with path.open("rb") as fh:
        for at in range(size, total, size):
            if at <= cuts[-1]:
                continue  # a line longer than a range: the next cut is past it
            fh.seek(at - 1)  # the byte before: a range starts just after a newline
            fh.readline()
            if fh.tell() < total:
                cuts.append(fh.tell())
    return list(zip(cuts, [*cuts[1:], total], strict=True))


def _block_sentences(path: Path, block: bytes, lines_before: int, bad: BadRows) -> list[str]:
    """The stripped non-blank lines of ``block``, whose first line is line ``lines_before + 1``."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        if "\0" in text:  # valid UTF-8, but no text file holds NULs (a C-speed search of the block)
            raise nul_error(path, lines_before + text[: text.index("\0")].count("\n") + 1)
        return [s for s in (line.strip() for line in text.split("\n")) if s]
    sentences = []
    for number, raw in enumerate(block.split(b"\n"), start=lines_before + 1):
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            bad(not_utf8(path, number, raw[exc.start]))
            continue
        if text:
            sentences.append(text)
    return sentences


def _check_row(path: object, number: int, row: Mapping[str, object], columns: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for col in columns:
        value = row.get(col)
        if value is None:
            raise DataError(f"{where(path, number)}: missing value for column {col!r}")
        if not isinstance(value, str):
            raise DataError(f"{where(path, number)}: column {col!r} must be text, got {type(value).__name__}")
        if not value.strip():
            raise DataError(f"{where(path, number)}: empty value in column {col!r}")
        out[col] = value.strip()
    return out


def scale_score(score: float, score_range: Sequence[float] | None) -> float:
    """``score`` mapped from ``score_range`` ``[low, high]`` onto [0, 1]; as it is without a range."""
    if score_range is None:
        return score
    low, high = score_range
    return (score - low) / (high - low)


def check_score(value: object, path: object, number: int | None, column: str, score_range: Sequence[float] | None) -> float:
    """One row's graded label: a finite number (or its text), inside ``score_range`` when
    one is declared, returned scaled onto [0, 1] (:func:`scale_score`).

    Raises:
        DataError: naming the file and line: a missing, non-numeric or non-finite score,
            or one outside the declared range.
    """
    if value is None:
        raise DataError(f"{where(path, number)}: missing value for column {column!r}")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DataError(f"{where(path, number)}: column {column!r} must be a number, got {type(value).__name__}")
    try:
        score = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise DataError(f"{where(path, number)}: score {value!r} (column {column!r}) is not a number") from None
    except OverflowError:  # a JSON integer past float's range: quoting its digits would fill the screen
        digits = len(str(abs(value))) if isinstance(value, int) else "many"
        too_large = f"is an integer of {digits} digits, past float's range"
        raise DataError(f"{where(path, number)}: score (column {column!r}) {too_large}") from None
    if not math.isfinite(score):
        raise DataError(f"{where(path, number)}: score {value!r} (column {column!r}) is not finite")
    if score_range is not None and not score_range[0] <= score <= score_range[1]:
        low, high = score_range
        raise DataError(f"{where(path, number)}: score {score:g} is outside data.score_range [{low:g}, {high:g}]")
    return scale_score(score, score_range)


def _csv_records(reader: Iterator[list[str]], path: Path) -> Iterator[list[str]]:
    """Iterate a ``csv.reader``, turning its errors (a bare carriage return inside a
    field, a field over ``csv.field_size_limit()``) into a DataError naming the line."""
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"{where(path, getattr(reader, 'line_num', None))}: not valid CSV ({exc})") from None
        yield record


NEGATIVE = "hard_neg"
"""The hard-negative column: one text, or (JSONL) a list of ``k`` texts."""
NUMBERED_NEGATIVE = re.compile(r"hard_neg_(\d+)")
"""The numbered hard-negative columns, ``hard_neg_1 .. hard_neg_k``."""


def negatives_of(columns: Sequence[str]) -> int:
    """``k``, the hard negatives per example of a dataset with these columns (1 without any)."""
    return modes.negatives_in(columns)


def _numbered_negatives(path: Path, number: int, keys: Sequence[str]) -> list[str]:
    """The ``hard_neg_1 .. hard_neg_k`` names among ``keys`` as the file spells them, in the
    order of their numbers; zero-padded numbers are the same numbers (``hard_neg_01 ..
    hard_neg_10`` sort as text in the order they count). A gap, a number given twice
    (``hard_neg_2`` and ``hard_neg_02``) or a ``hard_neg`` beside them is an error naming the line."""
    numbered = sorted((int(m.group(1)), key) for key in keys if (m := NUMBERED_NEGATIVE.fullmatch(key)))
    if not numbered:
        return []
    if [n for n, _ in numbered] != list(range(1, len(numbered) + 1)):
        raise DataError(
            f"{where(path, number)}: hard-negative columns must be hard_neg_1 .. hard_neg_k, each number once and without gaps, "
            f"got {[key for _, key in numbered]}"
        )
    if NEGATIVE in keys:
        raise DataError(f"{where(path, number)}: both {NEGATIVE!r} and hard_neg_1 .. hard_neg_{len(numbered)}; keep one form")
    return [key for _, key in numbered]


def _json_negatives(path: Path, number: int, obj: dict[str, object]) -> list[object]:
    """A JSONL row's hard negatives: ``hard_neg`` (a text or a list of texts) or
    ``hard_neg_1 .. hard_neg_k``."""
    numbered = _numbered_negatives(path, number, list(obj))
    if numbered:
        return [obj[key] for key in numbered]
    value = obj.get(NEGATIVE)
    if value is None:
        raise DataError(f"{where(path, number)}: missing value for column {NEGATIVE!r} (a text or a list of texts)")
    if isinstance(value, list):
        if not value:
            raise DataError(f"{where(path, number)}: column {NEGATIVE!r} is an empty list; give at least one hard negative")
        return list(value)
    return [value]


TEACHER_SCORES = "scores"
"""The column of a row's teacher scores ``[s_pos, s_neg_1, .., s_neg_k]`` (JSONL, the
dataset); a CSV file spreads them over :func:`score_columns`."""


def score_columns(negative_columns: Sequence[str]) -> list[str]:
    """A CSV file's teacher-score columns for these negative columns: ``score_pos``, then
    each negative's name with ``hard_`` made ``score_`` (``hard_neg_2`` -> ``score_neg_2``)."""
    return ["score_pos", *(f"score_{name.removeprefix('hard_')}" for name in negative_columns)]


def check_teacher_scores(value: object, path: object, number: int | None, k: int) -> list[float]:
    """One row's teacher scores: a list of ``1 + k`` finite numbers (the positive's first).

    Raises:
        DataError: naming the file and line: not a list, the wrong length, or an entry
            that is not a finite number.
    """
    if value is None:
        raise DataError(f"{where(path, number)}: missing value for column {TEACHER_SCORES!r} (a list [s_pos, s_neg_1, ..])")
    if not isinstance(value, list):
        got = type(value).__name__
        raise DataError(f"{where(path, number)}: column {TEACHER_SCORES!r} must be a list [s_pos, s_neg_1, ..], got {got}")
    if len(value) != 1 + k:
        raise DataError(
            f"{where(path, number)}: {len(value)} teacher score(s) for a positive and {k} hard negative(s); "
            f"give {1 + k}, the positive's first"
        )
    return [check_score(v, path, number, f"{TEACHER_SCORES}[{i}]", None) for i, v in enumerate(value)]


def _with_negatives(
    path: Path, number: int, row: dict[str, str], values: list[object], k: int, first: str = "the file's first row has"
) -> dict[str, str]:
    """``row`` plus its ``k`` hard negatives under :func:`modes.hard_negative_columns`, checked
    (``first``: the row ``k`` was read from, for the message)."""
    if len(values) != k:
        raise DataError(
            f"{where(path, number)}: {len(values)} hard negative(s), {first} {k}; "
            "every row needs the same number (mine more with simcse-kit mine --num-negatives, or drop the row)"
        )
    names = modes.hard_negative_columns(k)
    named = dict(zip(names, values, strict=True))
    return row | _check_row(path, number, named, names)


def read_rows(
    path: Source,
    columns: tuple[str, ...],
    hard_negatives: bool = False,
    score_column: str | None = None,
    score_range: Sequence[float] | None = None,
    teacher_scores: bool = False,
) -> list[dict[str, Any]]:
    """Read CSV or TSV (header row), JSONL (one object a line) or Parquet and check the columns.

    Args:
        path: the file, or its shards (:func:`simcse_kit.files.shard_paths`).
        columns: the text columns each row must have (non-empty strings).
        hard_negatives: each row also gets its ``k`` hard negatives (``k`` read off the
            file, the same in every row; module docstring), named
            :func:`simcse_kit.core.modes.hard_negative_columns` of ``k``; ``columns`` are
            then the others (``sent0, sent1``).
        score_column: also a numeric column, the pair's graded label
            (:func:`check_score`), returned as a float; None: text columns only.
        score_range: the scores' declared ``[low, high]``, mapped onto [0, 1]; None: as read.
        teacher_scores: with ``hard_negatives``, each row also gets its teacher scores
            (:data:`TEACHER_SCORES`, ``1 + k`` floats; :func:`check_teacher_scores`).

    A list, for small files; training reads the same rows into the Arrow cache
    (:func:`read_train_file`).
    """
    paths = shard_paths(path)

    def read(shard: Path, bad: BadRows, k: int) -> Iterator[dict[str, Any]]:
        return table_rows(shard, columns, hard_negatives, bad, score_column, score_range, teacher_scores, k)

    rows = list(shard_rows(paths, BadRows(), read))
    _enough_rows(_named(path, paths), len(rows))
    return rows


def shard_rows(
    paths: Sequence[Path], bad: BadRows, read: Callable[[Path, BadRows, int], Iterator[dict[str, Any]]]
) -> Iterator[dict[str, Any]]:
    """The rows of each shard in turn, ``read(shard, bad, k)`` with ``k`` the hard negatives
    per row of the rows read so far (0 before the first): every shard must have the first's."""
    k = 0
    for path in paths:
        for row in read(path, bad, k):
            k = k or negatives_of(list(row))
            yield row


def table_rows(
    path: Path,
    columns: tuple[str, ...],
    hard_negatives: bool,
    bad: BadRows,
    score_column: str | None = None,
    score_range: Sequence[float] | None = None,
    teacher_scores: bool = False,
    k: int = 0,
) -> Iterator[dict[str, Any]]:
    """The checked rows of a CSV, TSV, JSONL or Parquet file (:func:`read_rows`), streamed; a
    bad row goes to ``bad``, a problem of the whole file (no header, a header without the
    columns) raises. ``k``: the hard negatives per row an earlier shard had (0: the file's own)."""
    if teacher_scores and not hard_negatives:
        raise ValueError("teacher scores are of a row's positive and hard negatives: read them with hard_negatives")
    score = (score_column, score_range)
    suffix = data_suffix(path)
    if suffix in (".jsonl", ".json"):
        return _jsonl_rows(path, columns, hard_negatives, bad, *score, teacher_scores=teacher_scores, k=k)
    if suffix in COLUMNAR:
        return _columnar_rows(path, columns, hard_negatives, bad, *score, teacher_scores=teacher_scores, k=k)
    delimiter = "\t" if suffix == ".tsv" else ","
    return _csv_rows(path, columns, hard_negatives, bad, *score, teacher_scores=teacher_scores, k=k, delimiter=delimiter)


def _scored(
    path: Path, number: int, row: dict[str, Any], fields: Mapping[str, object], score: tuple[str | None, Any]
) -> dict[str, Any]:
    """``row`` with its score column checked and scaled (:func:`check_score`), when the mode has one."""
    column, score_range = score if score else (None, None)
    if column is not None:
        row[column] = check_score(fields.get(column), path, number, column, score_range)
    return row


def _object_row(
    path: Path, number: int, obj: dict[str, Any], columns: tuple[str, ...], hard_negatives: bool, score: Any, k: int, first: str
) -> tuple[dict[str, Any], int]:
    """A JSONL object's or a Parquet row's checked row, and ``k`` (this row's where it was 0)."""
    row = _scored(path, number, dict(_check_row(path, number, obj, columns)), obj, score[:2])
    if hard_negatives:
        values = _json_negatives(path, number, obj)
        k = k or len(values)
        row = dict(_with_negatives(path, number, row, values, k, first))
        if score[2]:
            row[TEACHER_SCORES] = check_teacher_scores(obj.get(TEACHER_SCORES), path, number, k)
    return row, k


def _required(columns: tuple[str, ...], score: tuple[Any, ...]) -> list[str]:
    """The columns every row needs: the mode's, and the score's where the format has one."""
    return [*columns, score[0]] if score and score[0] else list(columns)


EARLIER_SHARD = "the first shard's rows have"  # where k came from when an earlier shard set it
FIRST_ROW = "the file's first row has"


def _jsonl_rows(
    path: Path,
    columns: tuple[str, ...],
    hard_negatives: bool,
    bad: BadRows,
    *score: Any,
    teacher_scores: bool = False,
    k: int = 0,
) -> Iterator[dict[str, Any]]:
    required = _required(columns, score) + ([NEGATIVE] if hard_negatives else [])
    keys = f" with keys {[*required, TEACHER_SCORES] if teacher_scores else required}"
    lines = LineStream(path, keep_bad=bad.policy == "skip")
    first = EARLIER_SHARD if k else FIRST_ROW
    for number, text in lines:
        if lines.bad is not None:
            error, lines.bad = lines.bad, None
            bad(error)
            continue
        if not text.strip():
            continue
        try:
            obj = json_object(text, path, number, keys)
            row, k = _object_row(path, number, obj, columns, hard_negatives, (*score, teacher_scores), k, first)
        except DataError as exc:
            bad(exc)
            continue
        yield row


PARQUET_BATCH_ROWS = 10_000  #: rows of a Parquet file decoded at once
ARROW_FILE_MAGIC = b"ARROW1"  # opens an Arrow IPC *file*; a stream (what datasets writes) opens with a message


@contextlib.contextmanager
def record_batches(path: Path) -> Iterator[tuple[list[str], Iterator[pa.RecordBatch]]]:
    """The column names and record batches of a Parquet file, or of an Arrow IPC file: the
    stream format ``datasets`` writes (``save_to_disk``'s ``data-*.arrow``) or the file format
    (Feather v2, ``pyarrow.ipc.new_file``)."""
    import pyarrow.parquet as pq

    suffix = data_suffix(path)
    kind = COLUMNAR[suffix]
    if compression_of(path) is not None:
        raise DataError(f"{where(path)}: {kind} file compresses its own columns; give it uncompressed")
    with contextlib.ExitStack() as stack:
        try:
            if suffix == ".parquet":
                parquet = stack.enter_context(pq.ParquetFile(path))
                names, batches = parquet.schema_arrow.names, parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
            else:
                source = stack.enter_context(pa.memory_map(str(path)))
                if source.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC:
                    ipc = stack.enter_context(pa.ipc.open_file(source))
                    names, batches = ipc.schema.names, (ipc.get_batch(i) for i in range(ipc.num_record_batches))
                else:
                    source.seek(0)
                    stream = stack.enter_context(pa.ipc.open_stream(source))
                    names, batches = stream.schema.names, iter(stream)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{where(path)}: not {kind} file ({reason})") from None
        yield names, _named_errors(batches, path, kind)


def _named_errors(batches: Iterator[pa.RecordBatch], path: Path, kind: str) -> Iterator[pa.RecordBatch]:
    """``batches``, a damaged one (a truncated file) raising a DataError naming the file, not pyarrow's error."""
    try:
        yield from batches
    except (OSError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"{where(path)}: not {kind} file past its first rows ({reason})") from None


def table_columns(path: Path) -> list[str]:
    """A table file's column names, read from its start only: a Parquet or Arrow file's
    schema, a JSONL file's first object's keys, a CSV's or TSV's header (a ``.csv`` header
    that is one field holding semicolons or tabs split by them, as :func:`table_rows` would).
    ``[]`` for a file without any (empty, or a first JSONL line that is not an object): its
    reader says what is wrong with it."""
    suffix = data_suffix(path)
    if suffix in COLUMNAR:
        with record_batches(path) as (names, _):
            return list(names)
    text = ""
    for _, text in LineStream(path):  # leaving the loop closes the file
        if text.strip():
            break
    if suffix in (".jsonl", ".json"):
        try:
            obj = json.loads(text)
        except ValueError:
            return []
        return list(obj) if isinstance(obj, dict) else []
    header = [h.strip() for h in next(csv.reader([text], delimiter="\t" if suffix == ".tsv" else ","), [])]
    for separator in (";", "\t") if len(header) == 1 else ():
        if separator in header[0]:
            return [h.strip() for h in next(csv.reader([header[0]], delimiter=separator))]
    return header


def _columnar_rows(
    path: Path,
    columns: tuple[str, ...],
    hard_negatives: bool,
    bad: BadRows,
    *score: Any,
    teacher_scores: bool = False,
    k: int = 0,
) -> Iterator[dict[str, Any]]:
    """A Parquet or Arrow file's rows (:func:`record_batches`), each checked as a JSONL object
    (:func:`_object_row`), numbered from 1."""
    with record_batches(path) as (names, batches):
        missing = [c for c in _required(columns, score) if c not in names]
        if hard_negatives and NEGATIVE not in names and not any(NUMBERED_NEGATIVE.fullmatch(n) for n in names):
            missing.append(f"{NEGATIVE} (or hard_neg_1 .. hard_neg_k)")
        if teacher_scores and TEACHER_SCORES not in names:
            missing.append(TEACHER_SCORES)
        if missing:
            raise DataError(f"{where(path)}: columns {names} lack {missing}")
        first = EARLIER_SHARD if k else FIRST_ROW
        number = 0
        for batch in batches:
            for obj in batch.to_pylist():
                number += 1
                try:
                    row, k = _object_row(path, number, obj, columns, hard_negatives, (*score, teacher_scores), k, first)
                except DataError as exc:
                    bad(exc)
                    continue
                yield row


def _header_separator(header: list[str], required: Sequence[str]) -> str | None:
    """The separator, other than the comma, that splits ``header`` (one field when read with
    commas) into fields holding the ``required`` columns: ``;`` (Excel saves CSV so where the
    decimal separator is a comma) or a tab (a TSV named ``.csv``); None for neither."""
    if len(header) != 1:
        return None
    for separator in (";", "\t"):
        fields = next(csv.reader([header[0]], delimiter=separator))
        if separator in header[0] and set(required) <= {f.strip() for f in fields}:
            return separator
    return None


def _decimal_point(text: str) -> str:
    """``text`` with its decimal comma made a point ("4,5" -> "4.5"), where it has one comma and no point."""
    return text.replace(",", ".") if text.count(",") == 1 and "." not in text else text


def _csv_rows(
    path: Path,
    columns: tuple[str, ...],
    hard_negatives: bool,
    bad: BadRows,
    *score: Any,
    teacher_scores: bool = False,
    k: int = 0,
    delimiter: str = ",",
) -> Iterator[dict[str, Any]]:
    required = _required(columns, score)
    lines = LineStream(path, keep_bad=bad.policy == "skip")
    texts = (text + "\n" for _, text in lines)
    reader = csv.reader(texts, delimiter=delimiter)
    records = _csv_records(reader, path)
    try:
        header = [h.strip() for h in next(records)]
    except StopIteration:
        raise DataError(f"{path}: empty file; expected a header row with {list(required)}") from None
    if lines.bad is not None:  # the header is the file's: no row to skip
        raise lines.bad
    separator = _header_separator(header, required) if delimiter == "," else None
    if separator is not None:  # the header says how the whole file is separated: read it again so
        texts.close()
        logger.info("%s: its header is separated by %r, not commas: reading the file so", path, separator)
        yield from _csv_rows(path, columns, hard_negatives, bad, *score, teacher_scores=teacher_scores, k=k, delimiter=separator)
        return
    # Unnamed columns are not read (Excel saves the empty columns of a sheet it has formatted as ",,"),
    # so only a name given twice is refused: a zip of header and fields would keep the last copy.
    repeated = sorted({h for h in header if h and header.count(h) > 1})
    if repeated:
        raise DataError(f"{where(path, 1)}: header {header} repeats column(s) {repeated}; name each column once")
    missing = [c for c in required if c not in header]
    negative_names: list[str] = []
    if hard_negatives:
        negative_names = _numbered_negatives(path, 1, header) or ([NEGATIVE] if NEGATIVE in header else [])
        if not negative_names:
            missing.append(f"{NEGATIVE} (or hard_neg_1 .. hard_neg_k)")
    teacher_columns = score_columns(negative_names) if teacher_scores and negative_names else []
    missing += [c for c in teacher_columns if c not in header]
    # A semicolon CSV's numbers have a decimal comma ("4,5"); only the score columns are numbers.
    decimal_comma = [c for c in [score[0], *teacher_columns] if c] if delimiter == ";" else []
    if missing:
        raise DataError(f"{where(path, 1)}: header {header} lacks column(s) {missing}")
    if k and negative_names and len(negative_names) != k:
        raise DataError(
            f"{where(path, 1)}: {len(negative_names)} hard-negative column(s), {EARLIER_SHARD} {k}; "
            "every shard needs the same number"
        )
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # skipped: the reader goes on at the next line
            lines.bad = None
            bad(DataError(f"{where(path, reader.line_num)}: not valid CSV ({exc})"))
            continue
        number = reader.line_num
        if lines.bad is not None:  # a line of this record is not UTF-8
            error, lines.bad = lines.bad, None
            bad(error)
            continue
        if not any(field.strip() for field in record):
            continue
        try:
            if len(record) != len(header):
                raise DataError(f"{where(path, number)}: {len(record)} fields, header has {len(header)}")
            fields = dict(zip(header, record, strict=True))
            for c in decimal_comma:
                fields[c] = _decimal_point(fields[c])
            row = _scored(path, number, dict(_check_row(path, number, fields, columns)), fields, score)
            if hard_negatives:
                row = _with_negatives(path, number, row, [fields[name] for name in negative_names], len(negative_names))
            if teacher_columns:
                row[TEACHER_SCORES] = [check_score(fields[c], path, number, c, None) for c in teacher_columns]
        except DataError as exc:
            bad(exc)
            continue
        yield row


def read_train_file(
    source: Source,
    mode: str,
    bad_rows: str = "error",
    cache_dir: str | Path | None = None,
    score_range: Sequence[float] | None = None,
    teacher_scores: bool = False,
    tokens: Tokenization | None = None,
) -> Corpus:
    """A local training file (or its shards) for ``mode``, checked, as a memory-mapped
    dataset (the Arrow cache of :mod:`simcse_kit.data.corpus`: built on the first read,
    reused while the files are unchanged; one cache per shard, the processes of a launch
    building different shards at once).

    Args:
        source: the file, or its shards: a glob pattern, a folder or a list
            (text, CSV, TSV, JSONL or Parquet, compressed or not; module docstring).
        mode: ``unsup``, ``sup`` or ``hardneg``.
        bad_rows: ``error``: a bad row stops the read, naming the file, the line and
            the problem; ``skip``: bad rows are left out, counted and the first few logged.
        cache_dir: where the cache goes (default: the `datasets` cache, ``$HF_DATASETS_CACHE``).
        score_range: a scored mode's declared score range (:func:`check_score`).
        teacher_scores: ``hardneg`` rows also carry their teacher scores (:data:`TEACHER_SCORES`).
        tokens: also each file's token table (:func:`simcse_kit.data.tokens.with_tokens`), built
            with its cache.

    Raises:
        DataError: a bad row (``error``), a bad file, shards of different hard-negative
            counts, or fewer than two rows.
    """
    paths = shard_paths(source)
    name = _named(source, paths)
    sentences = mode == "unsup" and data_suffix(paths[0]) not in TABLE_SUFFIXES
    enough = _enough_sentences if sentences else _enough_rows
    negatives = mode == modes.NEGATIVES_MODE
    base = tuple(c for c in COLUMNS[mode] if c != NEGATIVE) if negatives else COLUMNS[mode]
    score = modes.mode(mode).score_column
    ranged = list(score_range) if score_range is not None else None
    what: dict[str, object] = {"rows": "table", "columns": list(base), "hard_negatives": negatives, "score": score}
    what |= {"score_range": ranged} | ({TEACHER_SCORES: True} if teacher_scores else {})  # the old key without scores

    # Each shard is one part; a large plain text file is parts of whole lines (byte ranges).
    items: list[tuple[Path, tuple[int, int] | None]] = [(path, None) for path in paths]
    if sentences and len(paths) == 1 and compression_of(paths[0]) is None:
        ranges = byte_ranges(check_readable(paths[0]), RANGE_BYTES)
        items = [(paths[0], r) for r in ranges] if len(ranges) > 1 else items

    def rows(path: Path, part: tuple[int, int] | None) -> Callable[[BadRows], Iterator[dict[str, list[Any]]]]:
        if sentences:
            return lambda bad: sentence_batches(path, bad, part)
        return lambda bad: batched(table_rows(path, base, negatives, bad, score, score_range, teacher_scores))

    read_as: dict[str, object] = {"rows": "sentences"} if sentences else what  # a part's key adds its byte range
    duplicates = "sent0" if sentences else None  # counted in an unsup text corpus
    share = launch_slot()[1] if len(items) > 1 else 1  # the launch's processes build token tables at once

    def read(
        item: tuple[Path, tuple[int, int] | None], wait: bool, check: Callable[[Report], None] | None = None
    ) -> Corpus | None:
        path, part = item
        part_what = read_as | {"bytes": list(part)} if part else read_as
        return cached_corpus(path, rows(path, part), part_what, bad_rows, cache_dir, duplicates, check, wait)

    def tokenised(corpus: Corpus, wait: bool) -> Corpus | None:
        if tokens is None or not corpus.report.rows:
            return corpus
        joined = with_tokens(corpus.dataset, tokens, mode, corpus.cache_files[0], wait, share)
        return None if joined is None else dataclasses.replace(corpus, dataset=joined)

    if len(items) == 1:  # refused before its cache is kept
        one = read(items[0], True, lambda report: enough(name, report.rows))
        assert one is not None, "a read that waits returns the corpus"
        joined = tokenised(one, True)
        assert joined is not None, "a read that waits returns the corpus"
        return joined
    # Every part's rows are checked before any token table is built: a bad row on the last line of
    # a 10M-line file stops the run in under a minute, not after 16 parts' token tables (13 min).
    texts = dict(zip(items, each_shard(items, read), strict=True))
    parts = each_shard(items, lambda item, wait: tokenised(texts[item], wait))
    if negatives:  # each shard's own count, checked as the shards are joined
        counts = [(path, negatives_of(p.report.columns)) for path, p in zip(paths, parts, strict=True) if p.report.rows]
        for path, k in counts:
            if k != counts[0][1]:
                raise DataError(f"{path}: {k} hard negative(s) a row, the first shard's rows have {counts[0][1]}")
    corpus = union(parts, duplicates)
    enough(name, corpus.report.rows)
    return corpus


def skipped_rows(dataset: datasets.Dataset) -> int:
    """Bad rows skipped reading the training files behind ``dataset`` (their cache sidecars)."""
    total = 0
    # A file can be listed more than once: joined to a token table of several shards, the
    # text table is cut into one block per shard, each naming the same file.
    for filename in dict.fromkeys(entry["filename"] for entry in dataset.cache_files):
        sidecar = Path(filename).with_suffix(".json")
        if sidecar.parent.name == SUBFOLDER and sidecar.is_file():
            total += int(json.loads(sidecar.read_text(encoding="utf-8")).get("skipped", 0))
    return total


def scored_dataset(
    sent0: Sequence[str], sent1: Sequence[str], scores: Sequence[float], score_range: Sequence[float] | None = None
) -> datasets.Dataset:
    """Scored pairs already read and checked (an STS-B or SICK file, say) as a ``scored``
    training set: columns ``sent0, sent1, score``, the scores mapped from ``score_range``
    onto [0, 1] (as they are without one)."""
    column = modes.mode("scored").score_column
    assert column is not None
    return datasets.Dataset.from_dict(
        {"sent0": list(sent0), "sent1": list(sent1), column: [scale_score(float(s), score_range) for s in scores]}
    )


HUB_CHECK_ROWS = 10_000  #: rows of a hub dataset checked at once


def _checked_texts(ds: datasets.Dataset, source: str, columns: Sequence[str], bad: BadRows) -> datasets.Dataset:
    """A hub dataset's text ``columns`` checked as a file's rows are (:func:`_check_row`: each a
    text, not blank; rows counted from 1): a bad row raises naming it, or (``bad_rows: skip``)
    is left out; the texts are stripped, as a file's are."""
    keep: list[int] = []
    unstripped = False
    for start in range(0, len(ds), HUB_CHECK_ROWS):
        batch = ds[start : start + HUB_CHECK_ROWS]
        for i, values in enumerate(zip(*(batch[c] for c in columns), strict=True), start):
            try:
                checked = _check_row(source, i + 1, dict(zip(columns, values, strict=True)), tuple(columns))
            except DataError as exc:
                bad(exc)
                continue
            keep.append(i)
            unstripped = unstripped or list(checked.values()) != list(values)
    if len(keep) < len(ds):
        logger.warning("%s: %d bad row(s) skipped (data.bad_rows: skip)", source, len(ds) - len(keep))
        ds = ds.select(keep)
    _enough_rows(source, len(ds))
    if unstripped:
        ds = ds.map(_strip_texts, batched=True, fn_kwargs={"columns": list(columns)}, desc="stripping texts")
    return ds


def _strip_texts(batch: dict[str, list[Any]], columns: list[str]) -> dict[str, list[str]]:
    return {c: [text.strip() for text in batch[c]] for c in columns}


def load_train_dataset(
    source: Source,
    mode: str,
    max_samples: int | None = None,
    sentences: Sequence[str] | None = None,
    bad_rows: str = "error",
    cache_dir: str | Path | None = None,
    score_range: Sequence[float] | None = None,
    teacher_scores: bool = False,
    tokens: Tokenization | None = None,
) -> datasets.Dataset:
    """The training set for ``mode`` as a `datasets.Dataset` with columns ``COLUMNS[mode]``
    (a ``hardneg`` file's ``k`` negatives as :func:`simcse_kit.core.modes.hard_negative_columns`;
    a scored mode's score column, a float: :func:`check_score` under ``score_range``; with
    ``teacher_scores`` (``hardneg`` only) the rows' :data:`TEACHER_SCORES`, ``1 + k`` floats).

    A local file is memory-mapped from its Arrow cache (:func:`read_train_file`, with
    ``bad_rows`` and ``cache_dir``); a hub dataset is `datasets`' own cache.
    ``sentences``: an ``unsup`` corpus already read (the distinct sentences of a scored
    pair file, say); ``source`` then only names it. ``tokens``: also the token table's
    columns (:func:`simcse_kit.data.tokens.with_tokens`: a local file's beside its cache).
    """
    columns = COLUMNS[mode]
    negatives = mode == modes.NEGATIVES_MODE  # k hard negatives, k read off the data
    score_column = modes.mode(mode).score_column
    if teacher_scores and not negatives:
        raise ValueError(f"teacher scores are of each row's positive and hard negatives (mode hardneg); mode is {mode!r}")
    if sentences is not None:
        if mode != "unsup":
            raise ValueError(f"a sentence list is an unsup corpus; mode is {mode!r}")
        ds = datasets.Dataset.from_dict({"sent0": list(sentences)})
    elif isinstance(source, str) and source.startswith("hub:"):
        try:
            ds = datasets.load_dataset(source[4:], split="train")
        except Exception as exc:  # offline, unknown id, no train split: many exception types
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{source}: cannot load this hub dataset ({reason})") from None
        if negatives:
            ds = _numbered_columns(ds, source)
            columns = modes.hardneg(negatives_of(ds.column_names)).columns
        wanted = columns if score_column is None else (*columns, score_column)
        wanted = (*wanted, TEACHER_SCORES) if teacher_scores else wanted
        missing = [c for c in wanted if c not in ds.column_names]
        if missing:
            raise DataError(f"{source}: dataset lacks column(s) {missing}; has {ds.column_names}")
        ds = _checked_texts(ds.select_columns(list(wanted)), source, columns, BadRows(bad_rows))
        if score_column is not None:  # checked and scaled as a file's, rows counted from 1
            checked = [check_score(v, source, i, score_column, score_range) for i, v in enumerate(ds[score_column], 1)]
            ds = ds.remove_columns(score_column).add_column(score_column, checked)
        if teacher_scores:  # checked as a file's, rows counted from 1
            per_row = negatives_of(ds.column_names)
            checked_lists = [check_teacher_scores(v, source, i, per_row) for i, v in enumerate(ds[TEACHER_SCORES], 1)]
            ds = ds.remove_columns(TEACHER_SCORES).add_column(TEACHER_SCORES, checked_lists)
    else:
        corpus = read_train_file(source, mode, bad_rows, cache_dir, score_range, teacher_scores, tokens)
        ds = corpus.dataset
        if corpus.report.duplicates:
            # Kept (a corpus is what it is), but two copies in one batch are each
            # other's negatives: say so, and how to mask them.
            logger.warning(
                "%s: %d duplicated sentence(s) kept; copies in one batch act as negatives (set loss.mask_false_negatives)",
                source,
                corpus.report.duplicates,
            )
    if tokens is not None:  # of all the rows, before a selection (a file's has its table already)
        ds = with_tokens(ds, tokens, mode)
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    k = f", {negatives_of(ds.column_names)} hard negatives each" if negatives else ""
    logger.info("loaded %d training examples (%s%s) from %s", len(ds), mode, k, source)
    return ds


def _numbered_columns(ds: datasets.Dataset, source: str) -> datasets.Dataset:
    """A hub dataset whose ``hard_neg`` holds lists of ``k`` texts, as ``hard_neg_1 ..
    hard_neg_k`` (a list of one: ``hard_neg``); other datasets unchanged."""
    if NEGATIVE not in ds.column_names or len(ds) == 0 or not isinstance(ds[0][NEGATIVE], list):
        return ds
    k = len(ds[0][NEGATIVE])
    names = modes.hard_negative_columns(k)

    def split(batch: dict[str, list[object]], indices: list[int]) -> dict[str, list[object]]:
        # Batched through `datasets` (its cache for a hub dataset): the column is never one Python list.
        out: dict[str, list[object]] = {name: [] for name in names}
        for number, value in zip(indices, batch[NEGATIVE], strict=True):
            if not isinstance(value, list) or len(value) != k or k == 0:
                count = len(value) if isinstance(value, list) else "not a list of"
                raise DataError(
                    f"{source}: row {number}: {count} hard negative(s), the first row has {k}; every row needs the same"
                )
            for name, text in zip(names, value, strict=True):
                out[name].append(text)
        return out

    return ds.map(split, batched=True, with_indices=True, remove_columns=[NEGATIVE], desc="hard negatives")
