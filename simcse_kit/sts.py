"""STS evaluation with the SimCSE paper protocol.

What is computed (SimCSE, Gao et al. 2021, "all" setting of its SentEval fork):
each sentence is encoded, each pair scored by cosine similarity, and the
Spearman correlation with the gold scores reported x 100. For STS12-16 the
main figure is over *all* subsets of a year concatenated; STS-B and SICK-R use
their test sets. ``avg`` is the mean of the seven main figures.

Data is read from a SentEval-layout folder (``shared/data/senteval``)::

    STS/STS12-en-test/STS.input.<subset>.txt   sentence1 <TAB> sentence2
    STS/STS12-en-test/STS.gs.<subset>.txt      gold 0-5, blank line = unscored pair
    STS/STSBenchmark/sts-{dev,test}.csv        genre, file, year, id, score, s1, s2
    SICK/SICK_test_annotated.txt               header; pair_ID, A, B, relatedness 1-5, ...

Sentences are whitespace-normalised (``" ".join(s.split())``) because SentEval
tokenises with ``str.split`` and SimCSE's batcher joins the tokens with single
spaces: this reproduces the exact strings the paper's models saw.

The task table is the constant :data:`DEFAULT_SUITE`; ``evaluate/sts.yaml``
holds the same table as a YAML suite that :func:`load_suite` reads and checks,
so a recipe can evaluate on a different selection of files.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import yaml
from scipy.stats import spearmanr

from simcse_kit.errors import ConfigError, DataError, where

logger = logging.getLogger(__name__)

Encoder = Callable[[list[str]], torch.Tensor | np.ndarray]
"""Maps a batch of N sentences to embeddings of shape ``(N, D)``."""

TaskFormat = Literal["sts", "stsb", "sick"]
FORMATS: tuple[str, ...] = ("sts", "stsb", "sick")

# Gold-score ranges of the official data.
STS_RANGE = (0.0, 5.0)
SICK_RANGE = (1.0, 5.0)

# Detail keys a task reports besides its subsets; subsets may not use these names.
_RESERVED_SUBSETS = frozenset({"all", "mean", "wmean"})


@dataclass(frozen=True)
class TaskSpec:
    """Where one STS task's files are and how to read them.

    Attributes:
        format: ``"sts"`` (STS12-16 input/gold file pairs, one per subset),
            ``"stsb"`` (STS Benchmark ``sts-dev.csv`` and ``sts-test.csv``) or
            ``"sick"`` (one SICK file with a header row).
        path: Relative to the data folder: the task's folder for ``sts`` and
            ``stsb``, the annotated test file for ``sick``.
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
"""The seven tasks of the SimCSE paper, in table order."""

MAIN_TASKS: tuple[str, ...] = tuple(DEFAULT_SUITE)

TABLE_COLUMNS: dict[str, str] = {
    "STS12": "STS12",
    "STS13": "STS13",
    "STS14": "STS14",
    "STS15": "STS15",
    "STS16": "STS16",
    "STSBenchmark": "STS-B",
    "SICKRelatedness": "SICK-R",
    "avg": "Avg.",
}
"""Result key -> column header of :func:`format_table` (the paper's labels)."""


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


# --------------------------------------------------------------------------- readers


def _read_lines(path: Path) -> list[str]:
    """Returns the lines of a UTF-8 text file without their ``\\n`` / ``\\r\\n`` ends.

    ``str.splitlines`` is not used: it also splits on form feeds, ``\\x1c`` and
    U+2028, which occur inside sentences of scraped text.

    Raises:
        DataError: The file is missing, empty or not valid UTF-8.
    """
    if not path.is_file():
        raise DataError(f"{where(path)}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{where(path, line)}: not valid UTF-8 (byte 0x{data[e.start]:02x})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start one
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
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


def read_sts_subset(folder: Path | str, subset: str) -> STSPairs:
    """Reads one STS12-16 subset: ``STS.input.<subset>.txt`` and ``STS.gs.<subset>.txt``.

    Pairs whose gold line is blank are unscored in the official data and skipped.

    Args:
        folder: The year's folder, e.g. ``<data>/STS/STS12-en-test``.
        subset: e.g. ``"MSRpar"``.

    Returns:
        The scored pairs, in file order.

    Raises:
        DataError: A file is missing, empty or not UTF-8; an input line does not
            have exactly 2 tab-separated fields; the files differ in line count; a
            gold score is not a number in [0, 5]; no pair is scored.
    """
    folder = Path(folder)
    input_path = folder / f"STS.input.{subset}.txt"
    gold_path = folder / f"STS.gs.{subset}.txt"
    inputs = _read_lines(input_path)
    golds = _read_lines(gold_path)
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
        if len(fields) != 2:
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
    lines = _read_lines(path)
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


def read_sick(path: Path | str) -> STSPairs:
    """Reads a SentEval SICK file (``SICK_test_annotated.txt``) for relatedness.

    The first line is a tab-separated header naming at least ``sentence_A``,
    ``sentence_B`` and ``relatedness_score``; columns are found by name. CRLF
    line ends are accepted.

    Raises:
        DataError: Missing, empty or non-UTF-8 file; a header without the needed
            columns; no data rows; a row whose field count differs from the
            header's; a score that is not a number in [1, 5].
    """
    path = Path(path)
    lines = _read_lines(path)
    header = lines[0].split("\t")
    missing = [c for c in _SICK_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{where(path, 1)}: header lacks column(s) {', '.join(missing)}")
    ia, ib, iscore = (header.index(c) for c in _SICK_COLUMNS)
    if len(lines) == 1:
        raise DataError(f"{where(path)}: no data rows after the header")
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{where(path, i)}: expected {len(header)} tab-separated fields, got {len(fields)}")
        scores.append(_parse_score(fields[iscore].strip(), path, i, SICK_RANGE))
        s1.append(_check_sentence(fields[ia], path, i, "sentence_A"))
        s2.append(_check_sentence(fields[ib], path, i, "sentence_B"))
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def load_task(data_dir: Path | str, spec: TaskSpec) -> dict[str, STSPairs]:
    """Reads every split of one task.

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
    raise ValueError(f"unknown task format {spec.format!r}")


# --------------------------------------------------------------------------- suite file


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


# --------------------------------------------------------------------------- scoring


def spearman100(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation x 100 (``nan`` if either input is constant)."""
    return float(spearmanr(x, y)[0]) * 100.0


def encode_unique(encode: Encoder, sentences: Sequence[str], batch_size: int) -> np.ndarray:
    """Encodes ``sentences`` (assumed distinct) in batches, longest first.

    Sorting by length keeps padding per batch small; the longest batch goes
    first so an out-of-memory error shows at once. Runs under ``torch.no_grad``
    so an encoder built on a training model keeps no graph.

    Returns:
        float32 array of shape ``(len(sentences), D)`` in the input order.

    Raises:
        ValueError: ``encode`` returned something that is not ``(batch, D)``.
    """
    if not sentences:
        raise ValueError("no sentences to encode")
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    chunks: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = [sentences[i] for i in order[start : start + batch_size]]
            out = encode(batch)
            if isinstance(out, torch.Tensor):
                out = out.detach().to(device="cpu", dtype=torch.float32).numpy()
            out = np.asarray(out, dtype=np.float32)
            if out.ndim != 2 or out.shape[0] != len(batch):
                raise ValueError(f"encode returned shape {out.shape} for {len(batch)} sentences; expected (batch, dim)")
            chunks.append(out)
    emb = np.empty((len(sentences), chunks[0].shape[1]), dtype=np.float32)
    emb[order] = np.concatenate(chunks)
    return emb


def _cosines(emb: np.ndarray, idx1: np.ndarray, idx2: np.ndarray) -> np.ndarray:
    a = emb[idx1].astype(np.float64)
    b = emb[idx2].astype(np.float64)
    # Same eps as torch.cosine_similarity: a zero vector scores 0, not nan.
    norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-8)
    return np.einsum("ij,ij->i", a, b) / norms


def score_splits(
    encode: Encoder, splits: Mapping[str, STSPairs], batch_size: int = 64
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Encodes every distinct sentence of ``splits`` once and scores each pair.

    Returns:
        Split name -> (cosine similarities, gold scores), both of shape ``(N,)``.
    """
    vocab: dict[str, int] = {}
    for pairs in splits.values():
        for s in (*pairs.sentences1, *pairs.sentences2):
            vocab.setdefault(s, len(vocab))
    emb = encode_unique(encode, list(vocab), batch_size)
    if not np.isfinite(emb).all():
        logger.warning("encode returned non-finite embeddings; correlations will be nan")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, pairs in splits.items():
        idx1 = np.fromiter((vocab[s] for s in pairs.sentences1), np.int64, len(pairs))
        idx2 = np.fromiter((vocab[s] for s in pairs.sentences2), np.int64, len(pairs))
        out[name] = (_cosines(emb, idx1, idx2), pairs.scores)
    return out


def task_results(name: str, spec: TaskSpec, scored: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Turns per-split cosines and gold scores into the result entries of one task.

    ``sts``: ``name`` = all subsets concatenated (the paper's figure),
    ``name/mean`` = unweighted mean over subsets, ``name/wmean`` = mean weighted
    by pair count, ``name/<subset>`` each. ``stsb``: ``name`` = test,
    ``name/dev``. ``sick``: ``name`` = test.
    """
    if spec.format == "sts":
        per = {s: spearman100(*scored[s]) for s in spec.subsets}
        sizes = np.array([len(scored[s][1]) for s in spec.subsets], dtype=np.float64)
        values = np.array(list(per.values()))
        res = {
            name: spearman100(
                np.concatenate([scored[s][0] for s in spec.subsets]),
                np.concatenate([scored[s][1] for s in spec.subsets]),
            ),
            f"{name}/mean": float(values.mean()),
            f"{name}/wmean": float((values * sizes).sum() / sizes.sum()),
        }
        res.update({f"{name}/{s}": v for s, v in per.items()})
        return res
    if spec.format == "stsb":
        return {name: spearman100(*scored["test"]), f"{name}/dev": spearman100(*scored["dev"])}
    return {name: spearman100(*scored["test"])}


# --------------------------------------------------------------------------- evaluators


class STSEvaluator:
    """Evaluates an encoder on the STS tasks; a callable returning ``dict[str, float]``.

    Data is read and checked when the evaluator is built, so a bad file fails
    before any training or encoding, and is reused by every call.

    Example::

        evaluator = STSEvaluator("../shared/data/senteval")
        results = evaluator(model.encode)   # {"STS12": 72.1, ..., "avg": 76.3}
        print(format_table(results))

    Args:
        data_dir: The SentEval-layout data folder.
        tasks: Task names to run, in order; default every task of ``suite``.
        batch_size: Sentences per ``encode`` call.
        suite: Task table, e.g. from :func:`load_suite`; default
            :data:`DEFAULT_SUITE`.

    Raises:
        KeyError: A task name is not in the suite.
        DataError: The data folder or a file is missing or malformed.
    """

    primary_metric: str
    """``"avg"`` when all seven paper tasks run, else the first task's name."""

    def __init__(
        self,
        data_dir: Path | str,
        tasks: Sequence[str] | None = None,
        batch_size: int = 64,
        suite: Mapping[str, TaskSpec] | None = None,
    ) -> None:
        suite = DEFAULT_SUITE if suite is None else suite
        names = list(suite) if tasks is None else list(tasks)
        unknown = [t for t in names if t not in suite]
        if unknown:
            raise KeyError(f"unknown STS task(s) {unknown}; known: {list(suite)}")
        if not names:
            raise ValueError("no STS tasks to evaluate")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.data_dir = Path(data_dir)
        if not self.data_dir.is_dir():
            raise DataError(f"{where(self.data_dir)}: SentEval data folder not found")
        self.batch_size = batch_size
        self.specs = {t: suite[t] for t in names}
        self.data = {t: load_task(self.data_dir, spec) for t, spec in self.specs.items()}
        self.primary_metric = "avg" if set(MAIN_TASKS) <= set(names) else names[0]

    def __call__(self, encode: Encoder) -> dict[str, float]:
        """Encodes each task's distinct sentences once and returns the correlations.

        Args:
            encode: Maps a list of N sentences to embeddings ``(N, D)``
                (torch tensor on any device/dtype, or numpy array).

        Returns:
            Spearman x 100: the main figure under each task name, details under
            ``<task>/<detail>`` (see :func:`task_results`), and ``avg`` over the
            seven paper tasks when all of them ran.
        """
        results: dict[str, float] = {}
        for name, spec in self.specs.items():
            start = time.perf_counter()
            scored = score_splits(encode, self.data[name], self.batch_size)
            results.update(task_results(name, spec, scored))
            logger.info("%s: %.2f (%.1fs)", name, results[name], time.perf_counter() - start)
        if all(t in results for t in MAIN_TASKS):
            results["avg"] = float(np.mean([results[t] for t in MAIN_TASKS]))
            logger.info("STS avg: %.2f", results["avg"])
        return results


class STSBDevEvaluator:
    """Spearman x 100 on STS-B dev: the SimCSE checkpoint-selection metric.

    The dev file is read once, at construction; each call only encodes.

    Args:
        data_dir: The SentEval-layout data folder.
        batch_size: Sentences per ``encode`` call.

    Raises:
        DataError: ``STS/STSBenchmark/sts-dev.csv`` is missing or malformed.
    """

    def __init__(self, data_dir: Path | str, batch_size: int = 64) -> None:
        self.path = Path(data_dir) / DEFAULT_SUITE["STSBenchmark"].path / "sts-dev.csv"
        self.batch_size = batch_size
        self.pairs = read_stsb(self.path)

    def __call__(self, encode: Encoder) -> float:
        """Returns the STS-B dev Spearman x 100 of ``encode`` (see :class:`STSEvaluator`)."""
        cos, gold = score_splits(encode, {"dev": self.pairs}, self.batch_size)["dev"]
        return spearman100(cos, gold)


@functools.lru_cache(maxsize=4)
def _dev_evaluator(data_dir: Path, batch_size: int) -> STSBDevEvaluator:
    return STSBDevEvaluator(data_dir, batch_size)


def sts_dev_score(encode: Encoder, data_dir: Path | str, batch_size: int = 64) -> float:
    """STS-B dev Spearman x 100; the parsed dev set is cached per folder."""
    return _dev_evaluator(Path(data_dir).resolve(), batch_size)(encode)


# --------------------------------------------------------------------------- report


def format_table(results: Mapping[str, float]) -> str:
    """Formats results as the SimCSE paper's STS table (2 decimals, ``-`` if absent).

    Example output::

        STS12  STS13  STS14  STS15  STS16  STS-B  SICK-R   Avg.
        68.40  82.41  74.38  80.91  78.56  76.85   72.23  76.25
    """
    headers = list(TABLE_COLUMNS.values())
    cells = [f"{results[key]:.2f}" if key in results else "-" for key in TABLE_COLUMNS]
    widths = [max(len(h), len(c)) for h, c in zip(headers, cells, strict=True)]
    head = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    row = "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
    return f"{head}\n{row}"
