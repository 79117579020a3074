"""Retrieval tasks built from the shared data, in BEIR's format (``simcse-kit retrieval-tasks OUT``).

Each task turns a set of scored sentence pairs into "find this sentence's partners among
all the sentences": the corpus is every distinct sentence of the test split, and a
sentence is a query when one of its partners is a strong match (see below). A query's id
is its own document's id, so the evaluator drops the self-match (see
:mod:`~simcse_kit.evaluation.retrieval`). A pair whose two sentences are the same text is
skipped (its partner would be the dropped self-match).

**Graded relevance.** The gold score is the gain, not a threshold: every partner of a
query is judged with the integer grade ``round(GAIN_PER_POINT * (gold - floor))``, where
``floor`` is the bottom of the task's scale (0 for STS-B's 0-5, 1 for SICK's 1-5), so an
STS-B partner scored 3.6 has gain 36 and a SICK partner scored 3.6 gain 26 (BEIR's qrels
and pytrec_eval take integers; tenths keep the resolution of the gold scores, averages
of 5 or 10 ratings). nDCG@10, the tasks' metric, uses these gains, so retrieving a
partner scored 3 to 3.9 earns most of the gain of one scored 4 or more rather than
counting as wrong. A partner scored at the floor (gain 0) changes no metric here and is
not written. A sentence is a query when its best partner scores at least
:data:`QUERY_MIN_GOLD` (4: "mostly equivalent" on STS-B's scale, "strongly related" on
SICK's; compared as gains, so 3.95 counts): only then is finding a judged partner a fair question, since the judgements are
the test split's pairs and a weaker partner may well rank below unjudged sentences that
are closer. Recall, MAP and MRR count every written judgement (gain >= 1) as relevant.
MRPC has no graded score: a paraphrase pair has gain 1.

Tasks (all test splits):

* ``mrpc-paraphrase`` -- MRPC test (``senteval/MRPC/msr_paraphrase_test.txt``), the pairs
  with Quality 1 (paraphrases), gain 1; document ids are MRPC's own sentence ids.
* ``stsb-similar`` -- STS Benchmark test, untokenised (``stsbenchmark/sts-test.csv``),
  gold 0-5 as gains.
* ``sick-related`` -- SICK test (``sick/SICK.txt``, ``SemEval_set`` TEST), relatedness
  1-5 as gains.

**Not held out from every recipe's data.** These are test splits, but their sentences
also occur in training data: SICK's sentences recur across its splits, and STS-B's train
split shares sentences with MRPC test (both draw on the same news paraphrase source). A
model trained on SICK train or STS-B train has seen these texts, though not as their test
pairs: both sentences of 22% of ``mrpc-paraphrase``'s pairs are in STS-B train, and of 51%
of ``sick-related``'s judged pairs in SICK train (``simcse-kit overlap FILE
--retrieval-tasks``, docs/contamination.md). Never SNLI: ``train/snli_triplets.csv`` is
built from SNLI's dev and test files.

Where BM25 (:mod:`~simcse_kit.evaluation.bm25`) is not clearly below the untouched model,
a task is a smoke test, not evidence: docs/retrieval.md states the rule and which tasks
pass it.

The output is deterministic: ids are assigned in file order (``s0``, ``s1``, ... by first
occurrence, MRPC's ids for MRPC), queries and documents are written in that order, and
the same data give byte-identical files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.beir import write_beir
from simcse_kit.evaluation.sts_readers import read_sick, read_stsb
from simcse_kit.files import read_lines

__all__ = ["GAIN_PER_POINT", "QUERY_MIN_GOLD", "RETRIEVAL_TASKS", "Graded", "build_retrieval_tasks", "gain", "pair_task"]

logger = logging.getLogger(__name__)

GAIN_PER_POINT = 10
"""Integer gain per point of gold score above the scale's floor (tenths of a point)."""

QUERY_MIN_GOLD = 4.0
"""A sentence is a query when a partner's gold score reaches this (on STS-B's and SICK's scales)."""

Pairs = list[tuple[str, str, str, str, int]]  # (id 1, text 1, id 2, text 2, gain) of each judged pair
Corpus = dict[str, str]


@dataclass(frozen=True)
class Graded:
    """A task's documents and judged pairs.

    Attributes:
        corpus: Document id -> text, every candidate sentence.
        pairs: ``(id1, text1, id2, text2, gain)`` of each judged pair (gain >= 0).
        query_min_gain: A sentence is a query when one of its partners has at least this gain.
    """

    corpus: Corpus
    pairs: Pairs
    query_min_gain: int


def gain(gold: float, floor: float) -> int:
    """The integer gain of a gold score: ``round(GAIN_PER_POINT * (gold - floor))``, at least 0."""
    return max(0, round(GAIN_PER_POINT * (gold - floor)))


def pair_task(corpus: Corpus, pairs: Pairs, query_min_gain: int = 1) -> tuple[Corpus, dict[str, dict[str, int]]]:
    """Queries and graded qrels of "find the partners": each sentence asks for the others of its pairs.

    Args:
        corpus: Document id -> text, every candidate sentence.
        pairs: ``(id1, text1, id2, text2, gain)`` of each judged pair (ids in ``corpus``);
            a pair listed twice keeps its larger gain.
        query_min_gain: A sentence is a query only when one of its partners has at least this gain.

    Returns:
        ``(queries, qrels)``: query id (= its document's id) -> text, and query id ->
        {partner id -> gain} (gain 0 left out), both in pair order.
    """
    texts: dict[str, str] = {}
    judged: dict[str, dict[str, int]] = {}
    for id1, text1, id2, text2, grade in pairs:
        if text1 == text2 or id1 == id2 or grade <= 0:
            continue
        for query, text, partner in ((id1, text1, id2), (id2, text2, id1)):
            texts.setdefault(query, text)
            partners = judged.setdefault(query, {})
            partners[partner] = max(grade, partners.get(partner, 0))
    kept = [q for q, partners in judged.items() if max(partners.values()) >= query_min_gain]
    return {q: texts[q] for q in kept}, {q: judged[q] for q in kept}


def _by_text(s1: Sequence[str], s2: Sequence[str], gains: Sequence[int]) -> tuple[Corpus, Pairs]:
    """Ids by first occurrence of each distinct text (``s0``, ``s1``, ...) and every pair with its gain."""
    ids: dict[str, str] = {}
    for a, b in zip(s1, s2, strict=True):
        for text in (a, b):
            ids.setdefault(text, f"s{len(ids)}")
    pairs = [(ids[a], a, ids[b], b, g) for a, b, g in zip(s1, s2, gains, strict=True)]
    return {i: t for t, i in ids.items()}, pairs


def _scored(s1: Sequence[str], s2: Sequence[str], scores: np.ndarray, floor: float) -> Graded:
    corpus, pairs = _by_text(s1, s2, [gain(float(s), floor) for s in scores])
    return Graded(corpus, pairs, gain(QUERY_MIN_GOLD, floor))


def mrpc_paraphrase(data_root: Path) -> Graded:
    """MRPC test: every sentence by MRPC's id; the Quality-1 pairs, gain 1."""
    path = data_root / "senteval" / "MRPC" / "msr_paraphrase_test.txt"
    corpus: Corpus = {}
    pairs: Pairs = []
    for number, line in read_lines(path, "MRPC file")[1:]:  # a header row first
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5 or fields[0] not in ("0", "1"):
            raise DataError(f"{where(path, number)}: expected 5 tab-separated fields (Quality, #1 ID, #2 ID, two strings)")
        quality, id1, id2, text1, text2 = (f.strip() for f in fields)
        for doc_id, text in ((id1, text1), (id2, text2)):
            if corpus.setdefault(doc_id, text) != text:
                raise DataError(f"{where(path, number)}: sentence id {doc_id} has two different texts")
        if quality == "1":
            pairs.append((id1, text1, id2, text2, 1))
    return Graded(corpus, pairs, 1)


def stsb_similar(data_root: Path) -> Graded:
    """STS Benchmark test (untokenised): every sentence; every pair, gold 0-5 as its gain."""
    stsb = read_stsb(data_root / "stsbenchmark" / "sts-test.csv")
    return _scored(stsb.sentences1, stsb.sentences2, stsb.scores, floor=0.0)


def sick_related(data_root: Path) -> Graded:
    """SICK test: every sentence; every pair, relatedness 1-5 as its gain."""
    sick = read_sick(data_root / "sick" / "SICK.txt", semeval_set="TEST")
    return _scored(sick.sentences1, sick.sentences2, sick.scores, floor=1.0)


RETRIEVAL_TASKS: dict[str, Callable[[Path], Graded]] = {
    "mrpc-paraphrase": mrpc_paraphrase,
    "stsb-similar": stsb_similar,
    "sick-related": sick_related,
}
"""Task name -> its builder ``(data root) -> Graded``."""


def build_retrieval_tasks(out: str | Path, data_root: str | Path, tasks: Sequence[str] | None = None) -> dict[str, Path]:
    """Writes each task as a BEIR folder ``out/<task>/`` (``qrels/test.tsv`` only).

    Args:
        out: The parent folder (created).
        data_root: The shared data folder (``senteval/``, ``stsbenchmark/``, ``sick/``).
        tasks: Names from :data:`RETRIEVAL_TASKS` (default all).

    Returns:
        Task name -> its folder.

    Raises:
        ValueError: An unknown task name.
        DataError: A missing or malformed data file.
    """
    names = list(tasks or RETRIEVAL_TASKS)
    unknown = [t for t in names if t not in RETRIEVAL_TASKS]
    if unknown:
        raise ValueError(f"unknown retrieval task(s) {unknown}; choose from {list(RETRIEVAL_TASKS)}")
    written: dict[str, Path] = {}
    for name in names:
        task = RETRIEVAL_TASKS[name](Path(data_root))
        queries, qrels = pair_task(task.corpus, task.pairs, task.query_min_gain)
        written[name] = write_beir(Path(out) / name, task.corpus, queries, {"test": qrels})
        judged = sum(len(partners) for partners in qrels.values())
        logger.info("%s: %d documents, %d queries, %d graded judgements", name, len(task.corpus), len(queries), judged)
    return written
