"""Readers of the STS evaluation data: STS12-16 (SentEval layout), STS-B and SICK, and
every split of one suite task.

Every file goes through :func:`simcse_kit.files.read_lines` (UTF-8, BOM dropped, CRLF
accepted, a bad byte named by file and line).

Sentences are whitespace-normalised (``" ".join(s.split())``) because SentEval
tokenises with ``str.split`` and SimCSE's batcher joins the tokens with single
spaces: this reproduces the exact strings the paper's models saw.

STS data layout (``shared/data/senteval``)::

    STS/STS12-en-test/STS.input.<subset>.txt   sentence1 <TAB> sentence2
    STS/STS12-en-test/STS.gs.<subset>.txt      gold 0-5, blank line = unscored pair
    STS/STSBenchmark/sts-{dev,test}.csv        genre, file, year, id, score, s1, s2
    SICK/SICK_test_annotated.txt               header; pair_ID, A, B, relatedness 1-5, ...

and a user's own scored pairs: a table of ``sent0, sent1, score`` (format ``pairs``).

Which tasks run and where their files are is the suite (:mod:`~simcse_kit.evaluation.suite`,
``evaluate/sts.yaml``); the SentEval transfer tasks are read by
:mod:`~simcse_kit.evaluation.transfer_readers`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcse_kit.config.run import PAIR_FORMATS
from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.suite import TaskSpec
from simcse_kit.files import read_lines

__all__ = [
    "EVAL_READERS",
    "PAIR_READERS",
    "STSPairs",
    "load_task",
    "normalize_whitespace",
    "pairs_from_columns",
    "read_pairs",
    "read_sick",
    "read_sts_subset",
    "read_stsb",
]

# Gold-score ranges of the official data.
STS_RANGE = (0.0, 5.0)
SICK_RANGE = (1.0, 5.0)


@dataclass(frozen=True)
class STSPairs:
    """Scored sentence pairs of one subset or split.

    Attributes:
        sentences1: First sentence of each pair, length N.
        sentences2: Second sentence of each pair, length N.
        scores: Gold similarity, float64 array of shape ``(N,)``.
    """

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def _sts_lines(path: Path) -> list[str]:
    """The lines of an STS file; an empty file is an error (it holds no pairs)."""
    lines = [text for _, text in read_lines(path)]
    if not lines:
        raise DataError(f"{where(path)}: file is empty")
    return lines


def normalize_whitespace(sentence: str) -> str:
    """SentEval's tokens joined by single spaces (see the module docstring)."""
    return " ".join(sentence.split())


def _parse_score(text: str, path: Path, line: int, bounds: tuple[float, float]) -> float:
    try:
        score = float(text)
    except ValueError:
        raise DataError(f"{where(path, line)}: gold score {text!r} is not a number") from None
    if not math.isfinite(score):
        raise DataError(f"{where(path, line)}: gold score {text!r} is not finite")
    low, high = bounds
    if not low <= score <= high:
        raise DataError(f"{where(path, line)}: gold score {score:g} is outside the range [{low:g}, {high:g}]")
    return score


def _check_sentence(sentence: str, path: Path, line: int, column: str) -> str:
    sentence = normalize_whitespace(sentence)
    if not sentence:
        raise DataError(f"{where(path, line)}: {column} is empty")
    return sentence


def read_sts_subset(folder: Path | str, subset: str, prefix: str = "STS", source_columns: bool = False) -> STSPairs:
    """Reads one STS12-16 subset: ``STS.input.<subset>.txt`` and ``STS.gs.<subset>.txt``.

    Pairs whose gold line is blank are unscored in the official data and skipped.

    Args:
        folder: The year's folder, e.g. ``<data>/STS/STS12-en-test``.
        subset: e.g. ``"MSRpar"``.
        prefix: The file-name prefix: ``"STS"``, or ``"STS2016"`` for the original
            STS 2016 release.
        source_columns: Accept (and ignore) fields after the two sentences: the
            original STS 2016 input files name each sentence's source there.

    Returns:
        The scored pairs, in file order.

    Raises:
        DataError: A file is missing, empty or not UTF-8; an input line does not
            have exactly 2 tab-separated fields; the files differ in line count; a
            gold score is not a number in [0, 5]; no pair is scored.
    """
    folder = Path(folder)
    input_path = folder / f"{prefix}.input.{subset}.txt"
    gold_path = folder / f"{prefix}.gs.{subset}.txt"
    inputs = _sts_lines(input_path)
    golds = _sts_lines(gold_path)
    if len(golds) != len(inputs):
        first_unmatched = min(len(golds), len(inputs)) + 1
        raise DataError(
            f"{where(gold_path, first_unmatched)}: gold file has {len(golds)} lines but {input_path.name} has {len(inputs)}"
        )
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, (pair, gold) in enumerate(zip(inputs, golds, strict=True), start=1):
        fields = pair.split("\t")
        if len(fields) != 2 and not (source_columns and len(fields) > 2):
            raise DataError(f"{where(input_path, i)}: expected 2 tab-separated sentences, got {len(fields)} fields")
        a = _check_sentence(fields[0], input_path, i, "sentence 1")
        b = _check_sentence(fields[1], input_path, i, "sentence 2")
        if not gold.strip():
            continue
        scores.append(_parse_score(gold.strip(), gold_path, i, STS_RANGE))
        s1.append(a)
        s2.append(b)
    if not scores:
        raise DataError(f"{where(gold_path)}: no scored pairs (every gold line is blank)")
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def read_stsb(path: Path | str, bounds: Sequence[float] | None = None) -> STSPairs:
    """Reads one STS Benchmark split (``sts-train.csv``, ``sts-dev.csv`` or ``sts-test.csv``).

    ``bounds``: the scores' allowed ``[low, high]`` (a training run's ``data.score_range``);
    default STS's [0, 5].

    Fields are tab-separated with quoting disabled (sentences contain bare ``"``):
    genre, file, year, id, score, sentence1, sentence2, then possibly extra
    trailing fields, which are ignored.

    Raises:
        DataError: Missing, empty or non-UTF-8 file; a row with fewer than 7
            fields; a score that is not a number in [0, 5].
    """
    path = Path(path)
    lines = _sts_lines(path)
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    rows = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    for i in range(1, len(lines) + 1):
        try:
            row = next(rows)
        except csv.Error as exc:  # a bare carriage return mid-line, an over-long field
            raise DataError(f"{where(path, i)}: not valid tab-separated text ({exc})") from None
        if len(row) < 7:
            raise DataError(f"{where(path, i)}: expected at least 7 tab-separated fields, got {len(row)}")
        scores.append(_parse_score(row[4].strip(), path, i, STS_RANGE if bounds is None else (bounds[0], bounds[1])))
        s1.append(_check_sentence(row[5], path, i, "sentence 1"))
        s2.append(_check_sentence(row[6], path, i, "sentence 2"))
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


_SICK_COLUMNS = ("sentence_A", "sentence_B", "relatedness_score")


def read_sick(path: Path | str, semeval_set: str | None = None, bounds: Sequence[float] | None = None) -> STSPairs:
    """Reads a SentEval SICK file (``SICK_test_annotated.txt``) for relatedness.

    The first line is a tab-separated header naming at least ``sentence_A``,
    ``sentence_B`` and ``relatedness_score``; columns are found by name.

    Args:
        path: The file.
        semeval_set: Keep only the rows whose ``SemEval_set`` column holds this
            value (``"TEST"`` picks the test pairs out of the full ``SICK.txt``);
            default every row.
        bounds: the scores' allowed ``[low, high]`` (a training run's
            ``data.score_range``); default SICK's [1, 5].

    Raises:
        DataError: Missing, empty or non-UTF-8 file; a header without the needed
            columns; no data rows; a row whose field count differs from the
            header's; a score that is not a number in [1, 5].
    """
    path = Path(path)
    lines = _sts_lines(path)
    header = lines[0].split("\t")
    missing = [c for c in _SICK_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{where(path, 1)}: header lacks column(s) {', '.join(missing)}")
    ia, ib, iscore = (header.index(c) for c in _SICK_COLUMNS)
    if semeval_set is not None and "SemEval_set" not in header:
        raise DataError(f"{where(path, 1)}: header lacks column SemEval_set")
    iset = header.index("SemEval_set") if semeval_set is not None else -1
    if len(lines) == 1:
        raise DataError(f"{where(path)}: no data rows after the header")
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{where(path, i)}: expected {len(header)} tab-separated fields, got {len(fields)}")
        if semeval_set is not None and fields[iset].strip() != semeval_set:
            continue
        scores.append(_parse_score(fields[iscore].strip(), path, i, SICK_RANGE if bounds is None else (bounds[0], bounds[1])))
        s1.append(_check_sentence(fields[ia], path, i, "sentence_A"))
        s2.append(_check_sentence(fields[ib], path, i, "sentence_B"))
    if not scores:
        raise DataError(f"{where(path)}: no rows with SemEval_set {semeval_set!r}")
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def pairs_from_columns(
    sentences1: Sequence[object], sentences2: Sequence[object], scores: Sequence[object], source: str
) -> STSPairs:
    """Checks three parallel columns (e.g. a ``datasets`` split's) and makes them pairs.

    Sentences are whitespace-normalised like every file reader's; a score may be
    any real number (hub datasets rescale: MTEB's SICK-R is 1-5, others 0-5), since
    Spearman and Pearson do not depend on the scale.

    Args:
        sentences1: First sentence of each pair.
        sentences2: Second sentence of each pair.
        scores: Gold similarity of each pair.
        source: What the columns came from, for error messages (a dataset id).

    Raises:
        DataError: The columns differ in length or are empty; a sentence is not
            a non-empty string; a score is not a finite number. The message names
            ``source`` and the row (1-based).
    """
    if not len(sentences1) == len(sentences2) == len(scores):
        raise DataError(f"{source}: columns differ in length ({len(sentences1)}, {len(sentences2)}, {len(scores)})")
    if not scores:
        raise DataError(f"{source}: no pairs")
    s1: list[str] = []
    s2: list[str] = []
    gold: list[float] = []
    for row, (a, b, score) in enumerate(zip(sentences1, sentences2, scores, strict=True), start=1):
        pair = [normalize_whitespace(s) if isinstance(s, str) else "" for s in (a, b)]
        if not all(pair):
            raise DataError(f"{source}: row {row}: sentence1 and sentence2 must be non-empty strings")
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise DataError(f"{source}: row {row}: score {score!r} is not a finite number")
        s1.append(pair[0])
        s2.append(pair[1])
        gold.append(float(score))
    return STSPairs(s1, s2, np.asarray(gold, dtype=np.float64))


def read_pairs(path: Path | str) -> STSPairs:
    """Reads a table of scored pairs, a user's own STS set: columns ``sent0``, ``sent1`` and
    ``score``, in any table format training reads (CSV, TSV, JSONL, Parquet, Arrow, gzip or
    zstd; :func:`simcse_kit.data.readers.read_rows`), on any scale (Spearman reads the order).

    Raises:
        DataError: as the training readers: naming the file, its line (or row) and the problem.
    """
    from simcse_kit.data.readers import read_rows

    rows = read_rows(path, ("sent0", "sent1"), score_column="score")
    return STSPairs(
        [normalize_whitespace(r["sent0"]) for r in rows],
        [normalize_whitespace(r["sent1"]) for r in rows],
        np.asarray([r["score"] for r in rows], dtype=np.float64),
    )


_READER_OF: dict[str, Callable[..., STSPairs]] = {"stsb": read_stsb, "sick": read_sick}
PAIR_READERS: dict[str, Callable[..., STSPairs]] = {fmt: _READER_OF[fmt] for fmt in PAIR_FORMATS}
"""The readers of one scored-pair file by format: what a training run may name as its dev
split (``data.dev_format``) or read sentences from (``data.train_format``). The names are
the config's (:data:`simcse_kit.config.run.PAIR_FORMATS`, which the config checks); a name
without a reader fails here, at import. Each takes the path and, optionally, ``bounds=``
(the scores' allowed range)."""


EVAL_READERS: dict[str, Callable[[Path | str], STSPairs]] = {**PAIR_READERS, "pairs": read_pairs}
"""The readers of one scored-pair file an evaluation reads (a dev split, ``data.dev_format``;
a suite task's file): :data:`PAIR_READERS`' and a table of ``sent0, sent1, score``."""


def load_task(data_dir: Path | str, spec: TaskSpec) -> dict[str, STSPairs]:
    """Reads every split of one STS task.

    Returns:
        Split name -> pairs: the subsets for ``sts``; ``dev`` and ``test`` for
        ``stsb``; ``test`` for ``sick`` and ``pairs``.

    Raises:
        DataError: As the readers.
    """
    base = Path(data_dir) / spec.path
    if spec.format == "sts":
        return {subset: read_sts_subset(base, subset) for subset in spec.subsets}
    if spec.format == "stsb":
        return {split: read_stsb(base / f"sts-{split}.csv") for split in ("dev", "test")}
    if spec.format == "sick":
        return {"test": read_sick(base)}
    if spec.format == "pairs":
        return {"test": read_pairs(base)}
    raise ValueError(f"task format {spec.format!r} is not read from a data folder")
