"""Readers of the evaluation data: STS (SentEval layout), STS-B, SICK and the SentEval
transfer tasks, plus the STS suite definition.

Every file goes through :func:`simcse_kit.fileio.read_lines` (UTF-8, BOM dropped, CRLF
accepted, a bad byte named by file and line). The only exception to strict UTF-8 is
SentEval's transfer data, some of which predates it (``TREC/train_5500.label``): those
files are decoded whole as Latin-1 when they are not UTF-8.

Sentences are whitespace-normalised (``" ".join(s.split())``) because SentEval
tokenises with ``str.split`` and SimCSE's batcher joins the tokens with single
spaces: this reproduces the exact strings the paper's models saw.

STS data layout (``shared/data/senteval``)::

    STS/STS12-en-test/STS.input.<subset>.txt   sentence1 <TAB> sentence2
    STS/STS12-en-test/STS.gs.<subset>.txt      gold 0-5, blank line = unscored pair
    STS/STSBenchmark/sts-{dev,test}.csv        genre, file, year, id, score, s1, s2
    SICK/SICK_test_annotated.txt               header; pair_ID, A, B, relatedness 1-5, ...

The STS task table is the constant :data:`DEFAULT_SUITE`; ``evaluate/sts.yaml`` holds
the same table as a YAML suite that :func:`load_suite` reads and checks, so a recipe
(``simcse-kit evaluate MODEL --suite FILE``) can evaluate on another selection of files.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from simcse_kit.errors import ConfigError, DataError, where
from simcse_kit.fileio import read_lines

__all__ = [
    "DEFAULT_SUITE",
    "MAIN_TASKS",
    "PAIR_READERS",
    "STSPairs",
    "TRANSFER_TASKS",
    "TaskSpec",
    "TransferTask",
    "load_suite",
    "load_task",
    "load_transfer_task",
    "pairs_from_columns",
    "read_sick",
    "read_sts_subset",
    "read_stsb",
    "stsb_split_path",
]

# "hub": one test split from a Hugging Face dataset (simcse_kit.evaluation.hub), never in a YAML suite.
TaskFormat = Literal["sts", "stsb", "sick", "hub"]
FORMATS: tuple[str, ...] = ("sts", "stsb", "sick")

# Gold-score ranges of the official data.
STS_RANGE = (0.0, 5.0)
SICK_RANGE = (1.0, 5.0)

# Detail keys a task reports besides its subsets; subsets may not use these names.
_RESERVED_SUBSETS = frozenset({"all", "mean", "wmean"})


# --------------------------------------------------------------------------- STS suite


@dataclass(frozen=True)
class TaskSpec:
    """Where one STS task's files are and how to read them.

    Attributes:
        format: ``"sts"`` (STS12-16 input/gold file pairs, one per subset),
            ``"stsb"`` (STS Benchmark ``sts-dev.csv`` and ``sts-test.csv``) or
            ``"sick"`` (one SICK file with a header row) or ``"hub"`` (one
            ``test`` split read through ``datasets``, see
            :mod:`simcse_kit.evaluation.hub`).
        path: Relative to the data folder: the task's folder for ``sts`` and
            ``stsb``, the annotated test file for ``sick``; the dataset id for ``hub``.
        subsets: The subset names for ``sts`` (``STS.input.<subset>.txt``);
            empty for the other formats.
    """

    format: TaskFormat
    path: str
    subsets: tuple[str, ...] = ()


DEFAULT_SUITE: dict[str, TaskSpec] = {
    "STS12": TaskSpec(
        "sts",
        "STS/STS12-en-test",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    ),
    # No SMT subset: its input text is not redistributable (as in SentEval/SimCSE).
    "STS13": TaskSpec("sts", "STS/STS13-en-test", ("FNWN", "headlines", "OnWN")),
    "STS14": TaskSpec(
        "sts",
        "STS/STS14-en-test",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    ),
    "STS15": TaskSpec(
        "sts",
        "STS/STS15-en-test",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
    ),
    "STS16": TaskSpec(
        "sts",
        "STS/STS16-en-test",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    ),
    "STSBenchmark": TaskSpec("stsb", "STS/STSBenchmark"),
    "SICKRelatedness": TaskSpec("sick", "SICK/SICK_test_annotated.txt"),
}
"""The seven tasks of the SimCSE paper, in table order (``evaluate/sts.yaml`` is the same)."""

MAIN_TASKS: tuple[str, ...] = tuple(DEFAULT_SUITE)


def stsb_split_path(data_dir: Path | str, split: str) -> Path:
    """``<data_dir>/STS/STSBenchmark/sts-<split>.csv``, the STS-B file of one split."""
    return Path(data_dir) / DEFAULT_SUITE["STSBenchmark"].path / f"sts-{split}.csv"


def load_suite(path: Path | str) -> dict[str, TaskSpec]:
    """Loads and checks a YAML suite definition such as ``evaluate/sts.yaml``.

    The file holds one key, ``tasks``, mapping each task name to ``format``
    (``sts``, ``stsb`` or ``sick``), ``path`` (relative to the data folder) and,
    for ``sts`` only, a non-empty list ``subsets``::

        tasks:
          STS13: {format: sts, path: STS/STS13-en-test, subsets: [FNWN, headlines, OnWN]}
          STSBenchmark: {format: stsb, path: STS/STSBenchmark}

    Returns:
        Task name -> spec, in file order.

    Raises:
        ConfigError: The file is missing, not YAML, or breaks the rules above;
            the message names the file and the offending task or key.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: suite file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a valid YAML file ({e})") from None
    if not isinstance(raw, dict) or set(raw) != {"tasks"}:
        raise ConfigError(f"{path}: expected a mapping with the single key 'tasks'")
    tasks = raw["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        raise ConfigError(f"{path}: 'tasks' must be a non-empty mapping of task name -> spec")
    suite: dict[str, TaskSpec] = {}
    for name, entry in tasks.items():
        ctx = f"{path}: task {name!r}"
        if not isinstance(name, str) or not name or "/" in name or name == "avg":
            raise ConfigError(f"{ctx}: task names must be non-empty strings without '/', not 'avg'")
        if not isinstance(entry, dict):
            raise ConfigError(f"{ctx}: expected a mapping with format, path[, subsets]")
        unknown = set(entry) - {"format", "path", "subsets"}
        if unknown:
            raise ConfigError(f"{ctx}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        fmt, rel, subsets = entry.get("format"), entry.get("path"), entry.get("subsets")
        if fmt not in FORMATS:
            raise ConfigError(f"{ctx}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if not isinstance(rel, str) or not rel:
            raise ConfigError(f"{ctx}: 'path' must be a non-empty string")
        if fmt == "sts":
            if not isinstance(subsets, list) or not subsets or not all(isinstance(s, str) and s for s in subsets):
                raise ConfigError(f"{ctx}: format sts needs 'subsets', a non-empty list of names")
            bad = sorted(set(subsets) & _RESERVED_SUBSETS)
            if bad or len(set(subsets)) != len(subsets):
                raise ConfigError(f"{ctx}: subset names must be unique and not all/mean/wmean")
            suite[name] = TaskSpec("sts", rel, tuple(subsets))
        else:
            if subsets is not None:
                raise ConfigError(f"{ctx}: 'subsets' is only for format sts")
            suite[name] = TaskSpec(fmt, rel)
    return suite


# --------------------------------------------------------------------------- STS readers


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


def _normalize(sentence: str) -> str:
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
    sentence = _normalize(sentence)
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


def read_stsb(path: Path | str) -> STSPairs:
    """Reads one STS Benchmark split (``sts-dev.csv`` or ``sts-test.csv``).

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
        scores.append(_parse_score(row[4].strip(), path, i, STS_RANGE))
        s1.append(_check_sentence(row[5], path, i, "sentence 1"))
        s2.append(_check_sentence(row[6], path, i, "sentence 2"))
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


_SICK_COLUMNS = ("sentence_A", "sentence_B", "relatedness_score")


def read_sick(path: Path | str, semeval_set: str | None = None) -> STSPairs:
    """Reads a SentEval SICK file (``SICK_test_annotated.txt``) for relatedness.

    The first line is a tab-separated header naming at least ``sentence_A``,
    ``sentence_B`` and ``relatedness_score``; columns are found by name.

    Args:
        path: The file.
        semeval_set: Keep only the rows whose ``SemEval_set`` column holds this
            value (``"TEST"`` picks the test pairs out of the full ``SICK.txt``);
            default every row.

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
        scores.append(_parse_score(fields[iscore].strip(), path, i, SICK_RANGE))
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
        pair = [_normalize(s) if isinstance(s, str) else "" for s in (a, b)]
        if not all(pair):
            raise DataError(f"{source}: row {row}: sentence1 and sentence2 must be non-empty strings")
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise DataError(f"{source}: row {row}: score {score!r} is not a finite number")
        s1.append(pair[0])
        s2.append(pair[1])
        gold.append(float(score))
    return STSPairs(s1, s2, np.asarray(gold, dtype=np.float64))


PAIR_READERS: dict[str, Callable[[Path | str], STSPairs]] = {"stsb": read_stsb, "sick": read_sick}
"""The readers of one scored-pair file by format: what a training run may name as its dev
split (``data.dev_format``) or read sentences from (``data.train_format``)."""


def load_task(data_dir: Path | str, spec: TaskSpec) -> dict[str, STSPairs]:
    """Reads every split of one STS task.

    Returns:
        Split name -> pairs: the subsets for ``sts``; ``dev`` and ``test`` for
        ``stsb``; ``test`` for ``sick``.

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
    raise ValueError(f"task format {spec.format!r} is not read from a data folder")


# --------------------------------------------------------------------------- transfer readers

TRANSFER_TASKS: tuple[str, ...] = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
TREC_CLASSES = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}
BINARY_FILES = {
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),  # SentEval: objective = 1
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}


@dataclass
class TransferTask:
    """One transfer task's texts and labels by split.

    Attributes:
        name: One of :data:`TRANSFER_TASKS`.
        protocol: ``"nested"``, ``"split"`` or ``"kfold"`` (see
            :mod:`simcse_kit.evaluation.transfer`).
        splits: ``"all"`` (nested k-fold tasks) or ``"train"``/``"dev"``/``"test"``
            -> ``(texts, labels)``, labels an int array of shape ``(N,)``; for MRPC
            each text is an ``"A\\tB"`` pair, split by :meth:`pairs`.
        paired: Whether the texts are sentence pairs.
    """

    name: str
    protocol: str
    splits: dict[str, tuple[list[str], np.ndarray]]
    paired: bool = False

    @staticmethod
    def pairs(texts: Sequence[str]) -> tuple[list[str], list[str]]:
        a, b = zip(*(t.split("\t") for t in texts), strict=True) if texts else ((), ())
        return list(a), list(b)


def _transfer_lines(path: Path) -> list[tuple[int, str]]:
    return read_lines(path, what="transfer-task file", latin1_fallback=True)


def _labelled_lines(path: Path, skip: int = 0) -> Iterator[tuple[int, str]]:
    """``(line_number, stripped line)`` of the non-blank lines after ``skip`` header rows."""
    for number, line in _transfer_lines(path)[skip:]:
        if line.strip():
            yield number, line.strip()


def _binary(folder: Path, pos_name: str, neg_name: str) -> tuple[list[str], np.ndarray]:
    texts: list[str] = []
    labels: list[int] = []
    for name, label in ((pos_name, 1), (neg_name, 0)):
        # Blank lines are skipped (SentEval keeps them as empty samples).
        sents = [s for s in (_normalize(line) for _, line in _transfer_lines(folder / name)) if s]
        if not sents:
            raise DataError(f"{where(folder / name)}: no sentences")
        texts += sents
        labels += [label] * len(sents)
    return texts, np.array(labels)


def _sst(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    for number, line in _labelled_lines(path):
        parts = line.rsplit("\t", 1)
        if len(parts) != 2 or parts[1].strip() not in ("0", "1"):
            raise DataError(f"{where(path, number)}: expected 'sentence<TAB>0|1'")
        texts.append(_normalize(parts[0]))
        labels.append(int(parts[1]))
    return texts, np.array(labels)


def _trec(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    for number, line in _labelled_lines(path):
        target, _, rest = line.partition(":")
        fine_and_text = rest.split(" ", 1)
        if target not in TREC_CLASSES or len(fine_and_text) != 2:
            raise DataError(f"{where(path, number)}: expected 'COARSE:fine question', coarse in {list(TREC_CLASSES)}")
        texts.append(_normalize(fine_and_text[1]))
        labels.append(TREC_CLASSES[target])
    return texts, np.array(labels)


def _mrpc(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    for number, line in _labelled_lines(path, skip=1):  # header row first
        fields = line.split("\t")
        if len(fields) != 5 or fields[0] not in ("0", "1"):
            raise DataError(f"{where(path, number)}: expected 5 tab-separated fields (Quality, IDs, two strings)")
        texts.append(_normalize(fields[3]) + "\t" + _normalize(fields[4]))
        labels.append(int(fields[0]))
    return texts, np.array(labels)


def load_transfer_task(data_dir: str | Path, name: str) -> TransferTask:
    """Reads one transfer task from a SentEval-layout ``data_dir``.

    Raises:
        KeyError: ``name`` is not one of :data:`TRANSFER_TASKS`.
        DataError: A file is missing or malformed (naming file and line).
    """
    base = Path(data_dir)
    if name in BINARY_FILES:
        folder, pos, neg = BINARY_FILES[name]
        return TransferTask(name, "nested", {"all": _binary(base / folder, pos, neg)})
    if name == "SST2":
        folder = base / "SST" / "binary"
        splits = {s: _sst(folder / f"sentiment-{s}") for s in ("train", "dev", "test")}
        return TransferTask(name, "split", splits)
    if name == "TREC":
        splits = {"train": _trec(base / "TREC" / "train_5500.label"), "test": _trec(base / "TREC" / "TREC_10.label")}
        return TransferTask(name, "kfold", splits)
    if name == "MRPC":
        folder = base / "MRPC"
        splits = {"train": _mrpc(folder / "msr_paraphrase_train.txt"), "test": _mrpc(folder / "msr_paraphrase_test.txt")}
        return TransferTask(name, "kfold", splits, paired=True)
    raise KeyError(f"unknown transfer task {name!r}; known: {list(TRANSFER_TASKS)}")
