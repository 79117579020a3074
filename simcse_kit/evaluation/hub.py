"""STS evaluation data from the Hugging Face hub: MTEB's copies of the paper's seven tasks.

``simcse-kit evaluate MODEL --source hub`` reads STS12-16, STS-B and SICK-R through
``datasets.load_dataset(id, revision=..., split="test")`` from the dataset ids MTEB
uses, pinned to MTEB's revisions (:data:`HUB_DATASETS`, the one table of ids). Each
holds one ``test`` split with the columns ``sentence1``, ``sentence2``, ``score``;
STS12-16 hold every subset of a year in one split, which is SimCSE's "all" figure.
The protocol (cosine, Spearman x 100, ``avg`` over seven) and the table are the
SentEval path's: :class:`HubSTSEvaluator` only reads its data from elsewhere.

The hub text is the untokenised, cased original, whereas the SentEval folder holds
Moses-tokenised, lowercased text (STS12-16, STS-B); the same model therefore scores a
little differently on the two (``docs/evaluation.md`` gives the numbers). And MTEB's
SICK-R "test" split is all of SICK (9927 pairs: train, trial and test), not the 4927
SemEval test pairs SimCSE reports: a hub SICK-R figure is MTEB's, not the paper's.

``hub_root`` points the loader at a local folder holding ``<root>/<dataset id>/``
copies in the hub schema (any file ``datasets`` reads whose split is ``test``, e.g.
``test.jsonl``): a mirror for machines without internet, and how the tests run
offline. :func:`write_hub_copy` writes such copies; :func:`read_original_release`
reads the original releases (``shared/data/sts_raw``, ``stsbenchmark``, ``sick``)
that the hub datasets were made from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.sts import STSEvaluator
from simcse_kit.evaluation.sts_readers import STSPairs, load_task, pairs_from_columns, read_sick, read_sts_subset, read_stsb
from simcse_kit.evaluation.suite import TaskSpec, default_suite
from simcse_kit.files import write_text_atomic

__all__ = [
    "HUB_COLUMNS",
    "HUB_DATASETS",
    "HUB_SUITE",
    "HubDataset",
    "HubSTSEvaluator",
    "concat_pairs",
    "load_hub_pairs",
    "read_original_release",
    "senteval_test_pairs",
    "write_hub_copy",
]

HUB_COLUMNS = ("sentence1", "sentence2", "score")  #: the columns of a hub STS dataset (MTEB's schema)


@dataclass(frozen=True)
class HubDataset:
    """One task's dataset on the hub, as MTEB names and pins it.

    Attributes:
        dataset_id: The hub id, e.g. ``"mteb/sts12-sts"``.
        revision: The dataset commit MTEB evaluates (also written to MTEB results).
        mteb_name: MTEB's task name (``"SICK-R"`` for our ``SICKRelatedness``).
    """

    dataset_id: str
    revision: str
    mteb_name: str


HUB_DATASETS: dict[str, HubDataset] = {
    "STS12": HubDataset("mteb/sts12-sts", "a0d554a64d88156834ff5ae9920b964011b16384", "STS12"),
    "STS13": HubDataset("mteb/sts13-sts", "7e90230a92c190f1bf69ae9002b8cea547a64cca", "STS13"),
    "STS14": HubDataset("mteb/sts14-sts", "6031580fec1f6af667f0bd2da0a551cf4f0b2375", "STS14"),
    "STS15": HubDataset("mteb/sts15-sts", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3", "STS15"),
    "STS16": HubDataset("mteb/sts16-sts", "4d8694f8f0e0100860b497b999b3dbed754a0513", "STS16"),
    "STSBenchmark": HubDataset("mteb/stsbenchmark-sts", "b0fddb56ed78048fa8b90373c8a3cfc37b684831", "STSBenchmark"),
    "SICKRelatedness": HubDataset("mteb/sickr-sts", "20a6d6f312dd54037fe07a32d58e5e168867909d", "SICK-R"),
}
"""Our task name -> its hub dataset; the same seven tasks, in the same order, as
:func:`~simcse_kit.evaluation.suite.default_suite` (``evaluate/sts.yaml``)."""

HUB_SUITE: dict[str, TaskSpec] = {name: TaskSpec("hub", d.dataset_id) for name, d in HUB_DATASETS.items()}


def load_hub_pairs(name: str, hub_root: Path | str | None = None) -> STSPairs:
    """The ``test`` pairs of one task, through ``datasets.load_dataset``.

    Args:
        name: A key of :data:`HUB_DATASETS`, e.g. ``"STS12"``.
        hub_root: A local folder with ``<hub_root>/<dataset id>/`` copies; default
            the hub itself (at MTEB's pinned revision).

    Raises:
        KeyError: ``name`` is not a hub task.
        DataError: The dataset cannot be loaded, lacks a column of
            :data:`HUB_COLUMNS`, or holds a bad row (see
            :func:`~simcse_kit.evaluation.sts_readers.pairs_from_columns`).
    """
    import datasets  # slow to import; only this path needs it

    entry = HUB_DATASETS[name]
    if hub_root is None:
        source, revision = entry.dataset_id, entry.revision
    else:
        folder = Path(hub_root) / entry.dataset_id
        if not folder.is_dir():
            raise DataError(f"{where(folder)}: no local copy of {entry.dataset_id} under the hub root")
        source, revision = str(folder), None
    try:
        split = datasets.load_dataset(source, revision=revision, split="test")
    except Exception as exc:  # datasets raises many types (offline, missing split, bad file)
        raise DataError(f"{source}: cannot load the test split ({type(exc).__name__}: {exc})") from exc
    missing = [c for c in HUB_COLUMNS if c not in split.column_names]
    if missing:
        raise DataError(f"{source}: test split lacks column(s) {', '.join(missing)} (has {split.column_names})")
    return pairs_from_columns(split["sentence1"], split["sentence2"], split["score"], source)


class HubSTSEvaluator(STSEvaluator):
    """:class:`~simcse_kit.evaluation.sts.STSEvaluator` on the hub's copies of the tasks.

    Same call, results and table; each task has one split (``test``), so the result
    holds each task's main figure (and ``avg``) but no per-subset details.

    Args:
        tasks: Task names of :data:`HUB_DATASETS` to run; default all seven.
        batch_size: Sentences per ``encode`` call.
        hub_root: A local folder of hub-schema copies (see :func:`load_hub_pairs`);
            default the hub.

    Raises:
        KeyError: A task name is not a hub task.
        DataError: A dataset cannot be loaded or is malformed.
    """

    def __init__(self, tasks: Sequence[str] | None = None, batch_size: int = 64, hub_root: Path | str | None = None) -> None:
        self.hub_root = None if hub_root is None else Path(hub_root)
        super().__init__(self.hub_root or ".", tasks, batch_size, suite=HUB_SUITE)

    def _read(self) -> dict[str, dict[str, STSPairs]]:
        return {t: {"test": load_hub_pairs(t, self.hub_root)} for t in self.specs}


# --------------------------------------------------------------------------- local copies


def concat_pairs(parts: Sequence[STSPairs]) -> STSPairs:
    """The pairs of ``parts`` one after another (a year's subsets -> its test split)."""
    return STSPairs(
        [s for p in parts for s in p.sentences1],
        [s for p in parts for s in p.sentences2],
        np.concatenate([p.scores for p in parts]),
    )


def senteval_test_pairs(data_dir: Path | str) -> dict[str, STSPairs]:
    """The exact test pairs the SentEval path scores, as one split per task.

    STS12-16: every subset concatenated in suite order (what the hub holds);
    STS-B and SICK-R: ``test``. Written with :func:`write_hub_copy`, these make
    the hub path score exactly as the folder path.
    """
    out: dict[str, STSPairs] = {}
    for name, spec in default_suite().items():
        splits = load_task(data_dir, spec)
        out[name] = concat_pairs([splits[s] for s in spec.subsets]) if spec.format == "sts" else splits["test"]
    return out


def read_original_release(data_root: Path | str) -> dict[str, STSPairs]:
    """The seven tasks' test pairs from the original (untokenised, cased) releases.

    ``data_root`` is the shared data folder, holding ``sts_raw/STS1{2..6}-en-test/``
    (STS 2016 files are named ``STS2016.*`` and carry two source columns),
    ``stsbenchmark/sts-test.csv`` and ``sick/SICK.txt`` (test rows: ``SemEval_set``
    = ``TEST``). Subsets are read in suite order, so pair ``i`` is the SentEval
    path's pair ``i`` in its original text.

    Raises:
        DataError: A file is missing or malformed.
    """
    root = Path(data_root)
    out: dict[str, STSPairs] = {}
    for name, spec in default_suite().items():
        if spec.format == "sts":
            folder = root / "sts_raw" / Path(spec.path).name
            prefix = "STS2016" if name == "STS16" else "STS"
            out[name] = concat_pairs(
                [read_sts_subset(folder, s, prefix=prefix, source_columns=name == "STS16") for s in spec.subsets]
            )
    out["STSBenchmark"] = read_stsb(root / "stsbenchmark" / "sts-test.csv")
    out["SICKRelatedness"] = read_sick(root / "sick" / "SICK.txt", semeval_set="TEST")
    return out


def write_hub_copy(root: Path | str, pairs: Mapping[str, STSPairs]) -> dict[str, Path]:
    """Writes each task's pairs as ``<root>/<dataset id>/test.jsonl`` in the hub schema.

    ``HubSTSEvaluator(hub_root=root)`` then reads them as it would the hub.

    Args:
        root: The local hub root.
        pairs: Task name (a key of :data:`HUB_DATASETS`) -> its test pairs.

    Returns:
        Task name -> the file written.
    """
    written: dict[str, Path] = {}
    for name, p in pairs.items():
        path = Path(root) / HUB_DATASETS[name].dataset_id / "test.jsonl"
        rows = (
            json.dumps(dict(zip(HUB_COLUMNS, (a, b, float(s)), strict=True)), ensure_ascii=False)
            for a, b, s in zip(p.sentences1, p.sentences2, p.scores, strict=True)
        )
        write_text_atomic(path, "\n".join(rows) + "\n")
        written[name] = path
    return written
