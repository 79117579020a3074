"""The contamination guard: which evaluation sentences a run also trains on.

Every text a run trains on (each dataset's text columns, mined negatives included, and the
teacher's and the guide's sentences) is keyed by :func:`simcse_kit.data.overlap.text_hashes`
(case, punctuation and spacing folded) and compared with every evaluation set the run
reports: the STS suite's test splits, the dev split, retrieval folders. Per task it counts
the distinct test sentences seen in training and the pairs with both sentences seen
(:class:`TaskOverlap`); a task is *contaminated* when at least :data:`CONTAMINATED_SHARE`
of its pairs have both sentences seen (SNLI holds a few of STS12's short captions, "A man
is playing a guitar.": 14 of 3,108 pairs, which is not what the table should flag; STS-B
train holds 1,029 of them). The final table marks a
contaminated task with ``*`` and prints, beside the average, the average over the clean
tasks (:func:`format_marked_table`).

``data.decontaminate`` (:class:`Guard`): ``warn`` reports; ``drop`` removes each training
row that shares a sentence with a test set (with the dev set too only with
``data.decontaminate_dev``); ``error`` refuses the run naming the file, its line and the task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simcse_kit.data.overlap import dataset_keys, normalize, text_hashes
from simcse_kit.data.readers import (
    COLUMNAR,
    NEGATIVE,
    NUMBERED_NEGATIVE,
    TABLE_SUFFIXES,
    read_train_file,
    record_batches,
    table_columns,
)
from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.beir import read_beir
from simcse_kit.evaluation.retrieval_tasks import RETRIEVAL_TASKS
from simcse_kit.evaluation.sts_readers import EVAL_READERS, PAIR_READERS, STSPairs, load_task
from simcse_kit.evaluation.suite import TaskSpec
from simcse_kit.evaluation.tables import STS_COLUMNS, format_rows, format_table
from simcse_kit.files import LineStream, data_suffix, shard_paths

__all__ = [
    "CONTAMINATED_SHARE",
    "MODES",
    "FILE_FORMATS",
    "EvalSet",
    "Guard",
    "TaskOverlap",
    "beir_set",
    "count_overlap",
    "dev_set",
    "file_keys",
    "format_marked_table",
    "format_overlap",
    "members",
    "pair_set",
    "retrieval_sets",
    "suite_sets",
]

logger = logging.getLogger(__name__)

MODES = ("warn", "drop", "error")
CONTAMINATED_SHARE = 0.01
"""A task is contaminated when this share of its pairs has both sentences in training."""
FILTER_BITS = 22
""":func:`members`' bitmap: 4 MiB, about one key in 140 let through against a 30,000-sentence suite."""
MARK = "*"


@dataclass(frozen=True)
class EvalSet:
    """One evaluation split as sentence keys.

    Attributes:
        name: the task (``STS14``), or the dev split (``dev``).
        kind: ``test`` or ``dev``.
        source: the file or folder it was read from.
        pairs: ``uint64 [P, 2]``: the keys of each pair's sentences (a retrieval task's
            judged (query, document) pairs).
        sentences: ``uint64 [S]``: the distinct keys of its sentences, sorted.
    """

    name: str
    kind: str
    source: str
    pairs: np.ndarray
    sentences: np.ndarray


def pair_set(name: str, kind: str, source: str | Path, first: Sequence[str], second: Sequence[str]) -> EvalSet:
    """An :class:`EvalSet` of sentence pairs (``first[i]``, ``second[i]``)."""
    pairs = np.stack([text_hashes(first), text_hashes(second)], axis=1) if first else np.empty((0, 2), np.uint64)
    return EvalSet(name, kind, str(source), pairs, np.unique(pairs))


def _joined(splits: Iterable[STSPairs]) -> tuple[list[str], list[str]]:
    first: list[str] = []
    second: list[str] = []
    for split in splits:
        first += split.sentences1
        second += split.sentences2
    return first, second


def suite_sets(data_dir: str | Path, suite: Mapping[str, TaskSpec]) -> list[EvalSet]:
    """The test split of each suite task: an ``sts`` task's subsets together (the table's
    "all"), an ``stsb`` or ``sick`` task's ``test``."""
    sets = []
    for name, spec in suite.items():
        splits = load_task(data_dir, spec)
        chosen = [splits[s] for s in spec.subsets] if spec.format == "sts" else [splits["test"]]
        sets.append(pair_set(name, "test", Path(data_dir) / spec.path, *_joined(chosen)))
    return sets


def beir_set(folder: str | Path, kind: str = "test", name: str | None = None) -> EvalSet:
    """A BEIR folder's split: every document and judged query; pairs, its positive judgements."""
    task = read_beir(folder, "dev" if kind == "dev" else "test", name)
    judged = [(q, d) for q, docs in task.qrels.items() for d, grade in docs.items() if grade > 0]
    first = [task.queries[q] for q, _ in judged]
    second = [task.corpus[d] for _, d in judged]
    every = np.unique(text_hashes([*task.corpus.values(), *task.queries.values()]))
    base = pair_set(task.name if kind == "test" else "dev", kind, folder, first, second)
    return EvalSet(base.name, kind, base.source, base.pairs, every)


def retrieval_sets(data_root: str | Path) -> list[EvalSet]:
    """The built-in retrieval tasks (:mod:`simcse_kit.evaluation.retrieval_tasks`) from the data
    root: each one's documents, and its judged pairs (gain > 0, the pairs its qrels hold)."""
    sets = []
    for name, build in RETRIEVAL_TASKS.items():
        task = build(Path(data_root))
        judged = [p for p in task.pairs if p[4] > 0]
        base = pair_set(name, "test", data_root, [p[1] for p in judged], [p[3] for p in judged])
        sets.append(EvalSet(name, "test", base.source, base.pairs, np.unique(text_hashes(list(task.corpus.values())))))
    return sets


def dev_set(path: str | Path, fmt: str) -> EvalSet:
    """The dev split a run selects on: a scored-pair file (``stsb``, ``sick``, ``pairs``) or a BEIR folder."""
    if fmt == "beir":
        return beir_set(path, "dev")
    pairs = EVAL_READERS[fmt](path)
    return pair_set("dev", "dev", path, pairs.sentences1, pairs.sentences2)


@dataclass(frozen=True)
class TaskOverlap:
    """What training holds of one evaluation split.

    Attributes:
        task: the split's name.
        kind: ``test`` or ``dev``.
        source: its file or folder.
        sentences_seen: its distinct sentences found in training.
        sentences: its distinct sentences.
        pairs_seen: its pairs with both sentences found in training.
        pairs: its pairs.
        contaminated: at least :data:`CONTAMINATED_SHARE` of its pairs seen.
        training: the training sources that hold any of its sentences.
    """

    task: str
    kind: str
    source: str
    sentences_seen: int
    sentences: int
    pairs_seen: int
    pairs: int
    contaminated: bool
    training: list[str] = field(default_factory=list)


def members(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``np.isin(keys, table)`` for a sorted, distinct ``table`` (any shape of ``keys``).

    Every start of a run asks this of each key of its corpus (10M at 10M rows). ``np.isin`` sorts
    ``keys``, about a second at 10M; a binary search per key in the small evaluation table is
    still 0.9 s. A bitmap of the table's low :data:`FILTER_BITS` bits is looked up first, one
    read a key (0.08 s at 10M keys against 30k): only the keys it lets through, the table's own
    and about ``len(table) / 2**FILTER_BITS`` of the rest, are searched for."""
    if not len(table):
        return np.zeros(keys.shape, dtype=bool)
    low = np.uint64(2**FILTER_BITS - 1)
    slots = np.zeros(2**FILTER_BITS, dtype=bool)
    slots[table & low] = True
    found = slots[keys & low]
    maybe = keys[found]
    found[found] = table[np.searchsorted(table, maybe).clip(max=len(table) - 1)] == maybe
    return found


def count_overlap(split: EvalSet, sources: Mapping[str, np.ndarray]) -> TaskOverlap:
    """``split`` against the keys of each training source (``name -> keys``, any shape)."""
    seen = np.zeros(len(split.sentences), dtype=bool)
    holders = []
    for name, keys in sources.items():
        found = np.zeros(len(split.sentences), dtype=bool)
        flat = keys.ravel()
        found[np.searchsorted(split.sentences, flat[members(flat, split.sentences)])] = True
        if found.any():
            holders.append(name)
        seen |= found
    known = split.sentences[seen]
    both = int(np.isin(split.pairs, known).all(axis=1).sum()) if len(split.pairs) else 0
    n_seen, n = int(seen.sum()), len(split.sentences)
    dirty = both > 0 and both >= CONTAMINATED_SHARE * len(split.pairs)
    return TaskOverlap(split.name, split.kind, split.source, n_seen, n, both, len(split.pairs), dirty, holders)


@dataclass
class Guard:
    """``data.decontaminate`` over a run's training sources (module docstring).

    Args:
        sets: the evaluation splits the run reports.
        mode: ``warn``, ``drop`` or ``error``.
        drop_dev: with ``drop`` (and ``error``), the dev split's sentences count too.
    """

    sets: list[EvalSet]
    mode: str = "warn"
    drop_dev: bool = False
    sources: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"decontaminate mode {self.mode!r}: one of {MODES}")
        guarded = [s for s in self.sets if s.kind == "test" or self.drop_dev]
        self._guarded = np.unique(np.concatenate([s.sentences for s in guarded])) if guarded else np.empty(0, np.uint64)
        # Every evaluation sentence, dev included: a source keeps only these of its keys, all that
        # count_overlap asks of it (a corpus's 10M keys would cost memory and a sort at each start).
        self._known = np.unique(np.concatenate([s.sentences for s in self.sets])) if self.sets else np.empty(0, np.uint64)
        self._owner = {int(k): s.name for s in reversed(guarded) for k in s.sentences}

    def check(
        self, name: str, keys: np.ndarray, texts: Callable[[int], Sequence[str]], path: str | Path | None = None
    ) -> np.ndarray | None:
        """Record a training source's keys (``uint64 [rows, text columns]``) and apply the mode.

        Args:
            name: the source (its file).
            keys: its rows' keys.
            texts: ``texts(row)``: that row's texts, in key order (for the error's message).
            path: the file, to name the row's line in ``error``.

        Returns:
            ``drop``: the rows to keep, when any is dropped; otherwise None (the source as it is).

        Raises:
            DataError: ``error`` and a row shares a sentence with a guarded split.
        """
        by_row = keys if keys.ndim == 2 else keys[:, None]
        known = members(by_row, self._known)
        hit = np.zeros(by_row.shape, dtype=bool)
        hit[known] = members(by_row[known], self._guarded)
        rows = np.asarray(hit.any(axis=1))
        self.sources[name] = np.unique(by_row[known & ~rows[:, None]] if self.mode == "drop" else by_row[known])
        if not rows.any():
            return None
        first = int(np.flatnonzero(rows)[0])
        column = int(np.flatnonzero(hit[first])[0])
        text = texts(first)[column]
        task = self._owner[int(keys[first, column])]
        if self.mode == "error":
            line = find_line(path, text) if path is not None else None
            at = where(path, line) if path is not None else f"{name}, row {first + 1}"
            raise DataError(
                f"{at}: {text!r} is a sentence of evaluation task {task} (data.decontaminate: error; "
                f"{int(rows.sum())} such row(s); 'drop' leaves them out)"
            )
        if self.mode == "warn":
            logger.warning(
                "%s: %d training row(s) share a sentence with an evaluation set (first: %r, in %s); data.decontaminate: "
                "drop leaves them out",
                name, int(rows.sum()), text, task,
            )  # fmt: skip
            return None
        self.dropped[name] = int(rows.sum())
        logger.warning("%s: dropped %d training row(s) that share a sentence with an evaluation set", name, self.dropped[name])
        return np.flatnonzero(~rows)

    def add_texts(self, name: str, texts: Sequence[str]) -> None:
        """Texts a run trains on besides its datasets' rows (the teacher's, the guide's)."""
        keys = text_hashes(texts)
        self.sources[name] = np.unique(keys[members(keys, self._known)])

    def report(self) -> dict[str, Any]:
        """``metrics.json``'s ``contamination``: the mode, each split's :class:`TaskOverlap`, the rows dropped."""
        tasks = {s.name: asdict(count_overlap(s, self.sources)) for s in self.sets}
        for overlap in tasks.values():
            if overlap["contaminated"]:
                logger.warning(
                    "contamination: %s (%s) has %d of %d pairs with both sentences in training, %d of %d sentences (%s)",
                    overlap["task"], overlap["kind"], overlap["pairs_seen"], overlap["pairs"], overlap["sentences_seen"],
                    overlap["sentences"], ", ".join(overlap["training"]),
                )  # fmt: skip
        return {"mode": self.mode, "drop_dev": self.drop_dev, "tasks": tasks, "dropped": dict(self.dropped)}


def find_line(path: str | Path, text: str) -> int | None:
    """The first line of ``path`` whose normalised text holds ``text``'s (a CSV row's field
    too; a Parquet or Arrow file's row holding it as a field), for an error's message; None
    when none does (a field across lines). Streamed: a file of any size, compressed or not."""
    wanted = normalize(text)
    if data_suffix(path) in COLUMNAR:
        with record_batches(Path(path)) as (_, batches):
            rows = (row for batch in batches for row in batch.to_pylist())
            return next((n for n, row in enumerate(rows, 1) if any(_holds(v, wanted) for v in row.values())), None)
    return next((number for number, line in LineStream(path, keep_bad=True) if wanted in normalize(line)), None)


def _holds(value: object, wanted: str) -> bool:
    """Whether a columnar row's field (a text, or a list of them: ``hard_neg``) is ``wanted`` once normalised."""
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and normalize(v) == wanted for v in values)


def format_marked_table(
    results: Mapping[str, float], contamination: Mapping[str, Any] | None, columns: Mapping[str, str] = STS_COLUMNS
) -> str:
    """The STS table with each contaminated task marked ``*``, then the clean tasks' average
    and a footnote per marked task (its pairs seen and the training sources holding them).

    Without ``contamination`` (a run before the guard): :func:`format_table` as it was."""
    if not contamination:
        return format_table(results, columns)
    tasks = contamination.get("tasks", {})
    dirty = [t for t in columns if t in tasks and tasks[t]["contaminated"]]
    marked = {key: header + MARK if key in dirty else header for key, header in columns.items()}
    lines = [format_table(results, marked)]
    shown = [t for t in columns if t != "avg" and t in results]
    clean = [t for t in shown if t not in dirty]
    if dirty:
        value = f"{sum(results[t] for t in clean) / len(clean):.2f}" if clean else "-"
        lines.append(f"Avg. over the {len(clean)} clean task(s) of {len(shown)}: {value}")
    for t in dirty:
        o = tasks[t]
        lines.append(
            f"{MARK} {columns[t]}: {o['pairs_seen']:,} of {o['pairs']:,} pairs and {o['sentences_seen']:,} of "
            f"{o['sentences']:,} sentences also in training ({', '.join(Path(t).name for t in o['training'])})"
        )
    return "\n".join(lines)


FILE_FORMATS = ("auto", "text", "table", "stsb", "sick")


def detect_format(path: Path) -> str:
    """A training file's format (a folder's or pattern's: its first shard's): ``table`` for
    Parquet and Arrow; else from its first line, ``sick`` (a tab-separated header with
    ``sentence_A`` and ``sentence_B``), ``stsb`` (7 or more tab-separated fields, the fifth
    a score); else ``table`` for CSV, TSV and JSONL and ``text`` for the rest."""
    shard = shard_paths(path)[0]
    if data_suffix(shard) in COLUMNAR:
        return "table"
    first: list[str] = []
    for _, line in LineStream(shard):  # the first line only
        first = line.split("\t")
        break
    if {"sentence_A", "sentence_B"} <= set(first):
        return "sick"
    if len(first) >= 7:
        try:
            float(first[4])
            return "stsb"
        except ValueError:
            pass
    return "table" if data_suffix(shard) in TABLE_SUFFIXES else "text"


def file_keys(path: str | Path, fmt: str = "auto", cache_dir: str | Path | None = None) -> tuple[str, np.ndarray]:
    """A training file's format and its rows' keys, ``uint64 [rows, text columns]``.

    ``text``: one sentence a line; ``table``: CSV, TSV, JSONL, Parquet or Arrow with ``sent0``
    (and ``sent1``, and hard negatives: the columns its first shard has), each read as
    training reads it, through its Arrow cache (the keys beside it); ``stsb`` / ``sick``: a
    scored pair file, a row per pair. ``path`` may be a training set's shards (a folder or a
    glob pattern), except for ``stsb`` and ``sick``.

    Raises:
        DataError: as the readers, naming the file and line.
    """
    path = Path(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt in PAIR_READERS:
        pairs = PAIR_READERS[fmt](path)
        return fmt, np.stack([text_hashes(pairs.sentences1), text_hashes(pairs.sentences2)], axis=1)
    if fmt == "text":
        mode = "unsup"
        warn_if_tabular(path)
    else:
        columns = table_columns(shard_paths(path)[0])
        negatives = NEGATIVE in columns or any(NUMBERED_NEGATIVE.fullmatch(c) for c in columns)
        mode = "hardneg" if negatives else "sup" if "sent1" in columns else "unsup"
    return fmt, dataset_keys(read_train_file(path, mode, cache_dir=cache_dir).dataset)


def warn_if_tabular(path: Path, sample: int = 1000) -> None:
    """A text file is one sentence a line; one whose lines mostly hold tabs is more likely a
    headerless table (SICK's ``SICK_train.txt``: ``id, sentence A, sentence B, score, label``),
    whose whole lines would be compared and match nothing: said, not guessed."""
    lines = [
        line
        for shard in shard_paths(path)[:1]
        for _, (_, line) in zip(range(sample), LineStream(shard, keep_bad=True), strict=False)
    ]
    tabbed = sum("\t" in line for line in lines)
    if lines and tabbed * 2 > len(lines):
        logger.warning(
            "%s: read as one sentence a line, but %d of its first %d lines hold tabs: a table without a header? "
            "each whole line is compared, so its sentences match nothing; give it a header, sent0 and sent1 "
            "(a CSV or JSONL table), or SICK's own header line with --format sick",
            path,
            tabbed,
            len(lines),
        )


def format_overlap(overlaps: Sequence[TaskOverlap]) -> str:
    """One line per split: its distinct sentences and pairs also in training (``*``: contaminated)."""

    def share(seen: int, total: int) -> str:
        return f"{seen:,} of {total:,} ({100 * seen / total:.1f}%)" if total else "-"

    rows: list[dict[str, str]] = [
        {
            "task": o.task + (MARK if o.contaminated else ""),
            "sentences": share(o.sentences_seen, o.sentences),
            "pairs": share(o.pairs_seen, o.pairs),
            "in": ", ".join(Path(t).name for t in o.training) or "-",
        }
        for o in overlaps
    ]
    if len(overlaps) > 1:
        rows.append(
            {
                "task": "total",
                "sentences": share(sum(o.sentences_seen for o in overlaps), sum(o.sentences for o in overlaps)),
                "pairs": share(sum(o.pairs_seen for o in overlaps), sum(o.pairs for o in overlaps)),
                "in": "",
            }
        )
    columns = {"task": "task", "sentences": "distinct sentences in training", "pairs": "pairs, both in training", "in": "in"}
    table = format_rows(rows, columns, markdown=True, label="task")
    return table + f"\n{MARK} contaminated: at least {CONTAMINATED_SHARE:.0%} of the pairs have both sentences in training"
