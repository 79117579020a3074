"""Readers of the SentEval transfer tasks (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC).

Every file goes through :func:`simcse_kit.files.read_lines`; SentEval's transfer data
is the one exception to strict UTF-8, since some of it predates it
(``TREC/train_5500.label``): those files are decoded whole as Latin-1 when they are not
UTF-8. Sentences are whitespace-normalised as the STS readers' are
(:func:`~simcse_kit.evaluation.sts_readers.normalize_whitespace`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.sts_readers import normalize_whitespace
from simcse_kit.files import read_lines

__all__ = ["TRANSFER_TASKS", "TransferTask", "load_transfer_task"]
TRANSFER_TASKS: tuple[str, ...] = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")  #: SentEval's transfer tasks, in its order
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
        sents = [s for s in (normalize_whitespace(line) for _, line in _transfer_lines(folder / name)) if s]
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
        texts.append(normalize_whitespace(parts[0]))
        labels.append(int(parts[1]))
    return texts, np.array(labels)


def _trec(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    for number, line in _labelled_lines(path):
        target, _, rest = line.partition(":")
        fine_and_text = rest.split(" ", 1)
        if target not in TREC_CLASSES or len(fine_and_text) != 2:
            raise DataError(f"{where(path, number)}: expected 'COARSE:fine question', coarse in {list(TREC_CLASSES)}")
        texts.append(normalize_whitespace(fine_and_text[1]))
        labels.append(TREC_CLASSES[target])
    return texts, np.array(labels)


def _mrpc(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    for number, line in _labelled_lines(path, skip=1):  # header row first
        fields = line.split("\t")
        if len(fields) != 5 or fields[0] not in ("0", "1"):
            raise DataError(f"{where(path, number)}: expected 5 tab-separated fields (Quality, IDs, two strings)")
        texts.append(normalize_whitespace(fields[3]) + "\t" + normalize_whitespace(fields[4]))
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
        sst = base / "SST" / "binary"
        splits = {s: _sst(sst / f"sentiment-{s}") for s in ("train", "dev", "test")}
        return TransferTask(name, "split", splits)
    if name == "TREC":
        splits = {"train": _trec(base / "TREC" / "train_5500.label"), "test": _trec(base / "TREC" / "TREC_10.label")}
        return TransferTask(name, "kfold", splits)
    if name == "MRPC":
        mrpc = base / "MRPC"
        splits = {"train": _mrpc(mrpc / "msr_paraphrase_train.txt"), "test": _mrpc(mrpc / "msr_paraphrase_test.txt")}
        return TransferTask(name, "kfold", splits, paired=True)
    raise KeyError(f"unknown transfer task {name!r}; known: {list(TRANSFER_TASKS)}")
