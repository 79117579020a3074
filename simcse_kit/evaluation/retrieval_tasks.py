"""Retrieval tasks built from the shared data, in BEIR's format (``simcse-kit retrieval-tasks OUT``).

Each task turns a set of sentence pairs into "find this sentence's partner among all the
sentences": the corpus is every distinct sentence of the test split, each sentence of a
positive pair is a query, and its partner is the (grade 1) relevant document. A query's
id is its own document's id, so the evaluator drops the self-match (see
:mod:`~simcse_kit.evaluation.retrieval`); a sentence in several positive pairs has all
its partners relevant. A pair whose two sentences are the same text is skipped (its
partner would be the dropped self-match).

Tasks (all test splits; none is a recipe's training file, but STS-B train holds 22% of
``mrpc-paraphrase``'s pairs and SICK train 49% of ``sick-related``'s: ``simcse-kit overlap
FILE --retrieval-tasks``, docs/contamination.md):

* ``mrpc-paraphrase`` — MRPC test (``senteval/MRPC/msr_paraphrase_test.txt``), pairs with
  Quality 1 (paraphrases); document ids are MRPC's own sentence ids.
* ``stsb-similar`` — STS Benchmark test, untokenised (``stsbenchmark/sts-test.csv``),
  pairs with gold score >= 4 (0-5 scale: "mostly equivalent" or better).
* ``sick-related`` — SICK test (``sick/SICK.txt``, ``SemEval_set`` TEST), pairs with
  relatedness >= 4 (1-5 scale).

Never SNLI: ``train/snli_triplets.csv`` is built from SNLI's dev and test files.

The output is deterministic: ids are assigned in file order (``s0``, ``s1``, ... by first
occurrence, MRPC's ids for MRPC), queries and documents are written in that order, and
the same data give byte-identical files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from simcse_kit.errors import DataError, where
from simcse_kit.evaluation.beir import write_beir
from simcse_kit.evaluation.sts_readers import read_sick, read_stsb
from simcse_kit.files import read_lines

__all__ = ["RETRIEVAL_TASKS", "SIMILAR_THRESHOLD", "build_retrieval_tasks", "pair_task"]

logger = logging.getLogger(__name__)

SIMILAR_THRESHOLD = 4.0
"""Gold score from which an STS-B or SICK pair counts as a relevant (query, document) pair."""

Pairs = list[tuple[str, str, str, str]]  # (id 1, text 1, id 2, text 2) of each positive pair
Corpus = dict[str, str]


def pair_task(corpus: Corpus, pairs: Pairs) -> tuple[Corpus, dict[str, dict[str, int]]]:
    """Queries and qrels of "find the partner": each sentence of each pair asks for the other.

    Args:
        corpus: Document id -> text, every candidate sentence.
        pairs: ``(id1, text1, id2, text2)`` of each positive pair (ids in ``corpus``).

    Returns:
        ``(queries, qrels)``: query id (= its document's id) -> text, and query id ->
        {partner id -> 1}, both in pair order.
    """
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for id1, text1, id2, text2 in pairs:
        if text1 == text2 or id1 == id2:
            continue
        for query, text, partner in ((id1, text1, id2), (id2, text2, id1)):
            queries.setdefault(query, text)
            qrels.setdefault(query, {})[partner] = 1
    return queries, qrels


def _by_text(s1: Sequence[str], s2: Sequence[str], keep: Sequence[bool]) -> tuple[Corpus, Pairs]:
    """Ids by first occurrence of each distinct text (``s0``, ``s1``, ...) and the kept pairs."""
    ids: dict[str, str] = {}
    for a, b in zip(s1, s2, strict=True):
        for text in (a, b):
            ids.setdefault(text, f"s{len(ids)}")
    pairs = [(ids[a], a, ids[b], b) for a, b, k in zip(s1, s2, keep, strict=True) if k]
    return {i: t for t, i in ids.items()}, pairs


def mrpc_paraphrase(data_root: Path) -> tuple[Corpus, Pairs]:
    """MRPC test: every sentence by MRPC's id; the Quality-1 pairs."""
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
            pairs.append((id1, text1, id2, text2))
    return corpus, pairs


def stsb_similar(data_root: Path) -> tuple[Corpus, Pairs]:
    """STS Benchmark test (untokenised): every sentence; the pairs with gold >= 4."""
    stsb = read_stsb(data_root / "stsbenchmark" / "sts-test.csv")
    return _by_text(stsb.sentences1, stsb.sentences2, list(stsb.scores >= SIMILAR_THRESHOLD))


def sick_related(data_root: Path) -> tuple[Corpus, Pairs]:
    """SICK test: every sentence; the pairs with relatedness >= 4."""
    sick = read_sick(data_root / "sick" / "SICK.txt", semeval_set="TEST")
    return _by_text(sick.sentences1, sick.sentences2, list(sick.scores >= SIMILAR_THRESHOLD))


RETRIEVAL_TASKS: dict[str, Callable[[Path], tuple[Corpus, Pairs]]] = {
    "mrpc-paraphrase": mrpc_paraphrase,
    "stsb-similar": stsb_similar,
    "sick-related": sick_related,
}
"""Task name -> its builder ``(data root) -> (corpus, positive pairs)``."""


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
        corpus, pairs = RETRIEVAL_TASKS[name](Path(data_root))
        queries, qrels = pair_task(corpus, pairs)
        written[name] = write_beir(Path(out) / name, corpus, queries, {"test": qrels})
        logger.info("%s: %d documents, %d queries, %d positive pairs", name, len(corpus), len(queries), len(pairs))
    return written
