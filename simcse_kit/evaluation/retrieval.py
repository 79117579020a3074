"""Retrieval evaluation: nDCG@10, MRR@10, Recall@1/10/100 and MAP@100 of an encoder.

The metrics come from pytrec_eval (``pip install simcse-kit[retrieval]``), the trec_eval
bindings BEIR and MTEB use, so the numbers are comparable with theirs. The conventions
(the same as BEIR's and MTEB's):

* **Ranking and ties.** trec_eval ranks a query's run by score, ties by document id in
  *descending* string order; every metric here sees that order.
* **MRR@10.** trec_eval's ``recip_rank`` has no cut-off, so the run is first truncated to
  each query's top 10 (in trec_eval's order), then ``recip_rank`` is taken: what BEIR's
  and MTEB's ``MRR@k`` do.
* **Which queries count.** The mean is over the queries of the split's qrels (a query
  without a judgement in the split is not evaluated: :func:`~simcse_kit.evaluation.beir.read_beir`
  does not even encode it). A query whose judgements are all grade 0 counts, scoring 0.
* **Graded relevance.** nDCG uses the grades as gains; recall, MAP and MRR count grade >= 1 as relevant.
* **Self-matches.** A document whose id equals the query's id is dropped from that query's
  run (BEIR's ``ignore_identical_ids``): in a task whose queries are also documents (the
  paraphrase tasks of :mod:`~simcse_kit.evaluation.retrieval_tasks`) a query would
  otherwise find itself first. ``k + 1`` documents are retrieved so ``k`` remain.

Each distinct text is encoded once (queries and documents together when they share no
prompt), sorted by length in batches (:mod:`~simcse_kit.evaluation.encoding`).
"""

from __future__ import annotations

import importlib.util
import logging
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, overload

import numpy as np
import torch

from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.beir import RetrievalTask, read_beir
from simcse_kit.evaluation.encoding import Encode, encode_once
from simcse_kit.evaluation.geometry import alignment, uniformity
from simcse_kit.evaluation.quantization import VectorPrecision
from simcse_kit.evaluation.search import SEARCHES

__all__ = [
    "METRICS",
    "RetrievalDevEvaluator",
    "RetrievalEvaluator",
    "rank",
    "retrieval_metrics",
    "search_task",
]

logger = logging.getLogger(__name__)

METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100")
"""The metrics, primary first."""

# pytrec_eval's measure (parameter string) -> its per-query result key -> our name.
_MEASURES = {"ndcg_cut.10": "ndcg_cut_10", "recall.1,10,100": "recall_", "map_cut.100": "map_cut_100"}
_NAMES = {"ndcg_cut_10": "ndcg@10", "recall_1": "recall@1", "recall_10": "recall@10", "recall_100": "recall@100"}
_NAMES |= {"map_cut_100": "map@100", "recip_rank": "mrr@10"}
MRR_CUTOFF = 10
PROGRESS_MIN_TEXTS = 10_000  #: a progress bar when encoding more texts than this
UNIFORMITY_DOCS = 4096  #: the dev corpus's first documents that uniformity (all pairs) is taken over


def _pytrec_eval() -> types.ModuleType:
    # A missing extra is the user's to fix: one line (ConfigError), checked when an
    # evaluator is built, before any model loads or run folder appears.
    try:
        import pytrec_eval
    except ImportError:
        raise ConfigError("retrieval metrics need pytrec_eval: pip install 'simcse-kit[retrieval]'") from None
    return pytrec_eval


def rank(docs: Mapping[str, float]) -> list[str]:
    """A query's document ids in trec_eval's order: score descending, ties by id descending."""
    return sorted(docs, key=lambda d: (docs[d], d), reverse=True)


@overload
def retrieval_metrics(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]], per_query: Literal[False] = False
) -> dict[str, float]: ...


@overload
def retrieval_metrics(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]], per_query: Literal[True]
) -> dict[str, dict[str, float]]: ...


def retrieval_metrics(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]], per_query: bool = False
) -> dict[str, float] | dict[str, dict[str, float]]:
    """The :data:`METRICS` of a run, by pytrec_eval (0-1 scale).

    Args:
        qrels: Query id -> {document id -> relevance grade (0 = not relevant)}.
        run: Query id -> {document id -> score}, at least the top 100 of each query.
        per_query: Return each query's metrics instead of the means.

    Returns:
        Metric name -> mean over the queries that are in both ``qrels`` and ``run``
        (pytrec_eval's, BEIR's and MTEB's rule); with ``per_query``, query id -> that.
    """
    pytrec_eval = _pytrec_eval()
    qrels = {q: dict(docs) for q, docs in qrels.items()}
    run = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()}
    scores = pytrec_eval.RelevanceEvaluator(qrels, set(_MEASURES)).evaluate(run)
    top = {q: {d: docs[d] for d in rank(docs)[:MRR_CUTOFF]} for q, docs in run.items()}
    for query, result in pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top).items():
        scores[query]["recip_rank"] = result["recip_rank"]
    named = {q: {_NAMES[key]: value for key, value in result.items()} for q, result in scores.items()}
    if per_query:
        return named
    if not named:
        raise ValueError("no query of the run has a judgement in the qrels")
    return {m: float(np.mean([result[m] for result in named.values()])) for m in METRICS}


def search_task(
    task: RetrievalTask,
    encode: Encode,
    *,
    batch_size: int = 128,
    k: int = 100,
    index: str = "exact",
    device: torch.device | str = "cpu",
    query_prompt: str = "",
    document_prompt: str = "",
    progress: bool | None = None,
    vectors: VectorPrecision | None = None,
) -> tuple[dict[str, dict[str, float]], np.ndarray, np.ndarray]:
    """Encodes a task's queries and corpus once and retrieves the top ``k`` of each query.

    Args:
        task: The split to search.
        encode: Maps N texts to ``(N, D)`` embeddings.
        batch_size: Texts per ``encode`` call.
        k: Documents kept per query (self-matches dropped first).
        index: A key of :data:`~simcse_kit.evaluation.search.SEARCHES`.
        device: Where the exact search's products run.
        query_prompt: Text put before every query (e.g. ``"query: "``).
        document_prompt: Text put before every document.
        progress: A progress bar while encoding (default: for more than
            :data:`PROGRESS_MIN_TEXTS` texts).
        vectors: Search with quantized vectors (int8 codes, or binary codes by Hamming
            distance, optionally rescored); default float32.

    Returns:
        ``(run, query_vectors, corpus_vectors)``: query id -> {document id -> cosine},
        and the ``(Q, D)`` / ``(C, D)`` float32 embeddings in the task's order.
    """
    if index not in SEARCHES:
        raise ValueError(f"index must be one of {sorted(SEARCHES)}, got {index!r}")
    query_ids, doc_ids = list(task.queries), list(task.corpus)
    query_texts = [query_prompt + task.queries[q] for q in query_ids]
    doc_texts = [document_prompt + task.corpus[d] for d in doc_ids]
    if progress is None:
        progress = len(query_texts) + len(doc_texts) > PROGRESS_MIN_TEXTS
    embedded = encode_once(encode, [*query_texts, *doc_texts], batch_size, progress=progress)
    query_vectors, doc_vectors = embedded.of(query_texts), embedded.of(doc_texts)
    # One extra: a self-match dropped below still leaves k documents.
    if vectors is None:
        scores, indices = SEARCHES[index](query_vectors, doc_vectors, k + 1, device=device)
    else:
        scores, indices = vectors.search(query_vectors, doc_vectors, k + 1, SEARCHES[index], device)
    run: dict[str, dict[str, float]] = {}
    for row, query in enumerate(query_ids):
        hits = [(doc_ids[i], s) for s, i in zip(scores[row].tolist(), indices[row].tolist(), strict=True) if doc_ids[i] != query]
        run[query] = dict(hits[:k])
    return run, query_vectors, doc_vectors


class RetrievalEvaluator:
    """Retrieval metrics (x 100) of an encoder on BEIR-format tasks.

    Args:
        tasks: Task folders (read now, so a bad folder fails before a model loads) or
            tasks already read.
        split: The qrels split of the folders (``test`` or ``dev``).
        batch_size: Texts per ``encode`` call.
        index: ``"exact"`` (chunked matrix products on ``device``) or ``"faiss"``.
        device: Where the exact search runs.
        prompts: Optional ``{"query": ..., "document": ...}`` texts put before queries
            and documents (the model's own prompts, recorded with it).

    Calling it returns, for each task, nDCG@10 x 100 under the task's name and every
    metric under ``<task>/<metric>``, plus ``avg`` (mean nDCG@10 over the tasks).
    """

    primary_metric = "avg"

    def __init__(
        self,
        tasks: Sequence[str | Path | RetrievalTask],
        split: str = "test",
        batch_size: int = 128,
        index: str = "exact",
        device: torch.device | str = "cpu",
        prompts: Mapping[str, str] | None = None,
    ) -> None:
        if index not in SEARCHES:
            raise ValueError(f"index must be one of {sorted(SEARCHES)}, got {index!r}")
        _pytrec_eval()
        if index == "faiss" and importlib.util.find_spec("faiss") is None:
            raise ConfigError("--index faiss needs faiss: pip install 'simcse-kit[faiss]' (faiss-cpu)")
        read = [t if isinstance(t, RetrievalTask) else read_beir(t, split) for t in tasks]
        self.tasks = {t.name: t for t in read}
        if len(self.tasks) != len(read):
            raise ValueError(f"two retrieval tasks share a name: {[t.name for t in read]}")
        self.batch_size, self.index, self.device = batch_size, index, device
        self.prompts = dict(prompts or {})
        self.vectors: VectorPrecision | None = None  # quantized search (set by the caller once it has ranges)
        self.scored: dict[str, dict[str, float]] = {}  # task -> metrics (0-1) of the last call
        self.seconds: dict[str, float] = {}

    def __call__(self, encode: Encode) -> dict[str, float]:
        results: dict[str, float] = {}
        for name, task in self.tasks.items():
            start = time.perf_counter()
            run, _, _ = search_task(
                task,
                encode,
                batch_size=self.batch_size,
                index=self.index,
                device=self.device,
                query_prompt=self.prompts.get("query", ""),
                document_prompt=self.prompts.get("document", ""),
                vectors=self.vectors,
            )
            self.scored[name] = retrieval_metrics(task.qrels, run)
            self.seconds[name] = time.perf_counter() - start
            results[name] = 100 * self.scored[name]["ndcg@10"]
            results |= {f"{name}/{m}": 100 * v for m, v in self.scored[name].items()}
            logger.info("%s: nDCG@10 %.2f (%d queries, %d documents)", name, results[name], len(task.queries), len(task.corpus))
        results["avg"] = float(np.mean([results[name] for name in self.tasks]))
        return results


class RetrievalDevEvaluator:
    """A retrieval task's dev split as the checkpoint-selection score (``data.dev_format: beir``).

    Reports nDCG@10 x 100 under ``dev_ndcg@10``, its :attr:`primary_metric` (with
    :attr:`metric_label` saying which folder and split, for ``metrics.json``, the model
    card and the curves), with the other metrics beside it, and the geometry of the same encoding: the alignment of the
    (query, relevant document) pairs and the uniformity of the corpus (its first
    :data:`UNIFORMITY_DOCS` documents: uniformity takes every pair).

    Args:
        path: The BEIR-format folder; its ``qrels/dev.tsv`` is used, or ``qrels/test.tsv``
            when it has no dev split (say so in your report: that is selecting on test).
        batch_size: Texts per ``encode`` call.
        prompts: As for :class:`RetrievalEvaluator`.
    """

    primary_metric = "dev_ndcg@10"

    def __init__(self, path: Path | str, batch_size: int = 64, prompts: Mapping[str, str] | None = None) -> None:
        _pytrec_eval()
        self.path = Path(path)
        split = "dev" if (self.path / "qrels" / "dev.tsv").is_file() else "test"
        if split == "test":
            logger.warning("%s has no qrels/dev.tsv: selecting checkpoints on its test split", self.path)
        self.dev_name = f"{self.path.name} {split}"
        self.metric_label = f"{self.dev_name} nDCG@10 x 100"  #: what the primary metric measures
        self.task = read_beir(self.path, split)
        self.batch_size = batch_size
        self.prompts = dict(prompts or {})

    def __call__(self, encode: Encode) -> dict[str, float]:
        run, queries, docs = search_task(
            self.task,
            encode,
            batch_size=self.batch_size,
            query_prompt=self.prompts.get("query", ""),
            document_prompt=self.prompts.get("document", ""),
        )
        metrics = retrieval_metrics(self.task.qrels, run)
        q_row = {q: i for i, q in enumerate(self.task.queries)}
        d_row = {d: i for i, d in enumerate(self.task.corpus)}
        pairs = [(q_row[q], d_row[d]) for q, judged in self.task.qrels.items() for d, g in judged.items() if g > 0]
        q_idx, d_idx = (torch.tensor(list(ix)) for ix in zip(*pairs, strict=True))
        q_t, d_t = torch.from_numpy(queries), torch.from_numpy(docs)
        return {
            **{f"dev_{m}": 100 * v for m, v in metrics.items()},
            "alignment": float(alignment(q_t[q_idx], d_t[d_idx])),
            "uniformity": float(uniformity(d_t[:UNIFORMITY_DOCS])),
        }
