"""The lexical baseline of every retrieval table: BM25 by ``bm25s`` (``pip install simcse-kit[retrieval]``).

A retrieval task is evidence about an encoder only where a bag of words does clearly
worse; :func:`evaluate_bm25` scores BEIR-format folders with BM25 through the same
metrics and conventions as :class:`~simcse_kit.evaluation.retrieval.RetrievalEvaluator`
(pytrec_eval, self-matches dropped, the same keys), so its row sits beside a model's.

The settings are fixed, not tuned per task: bm25s's defaults (Lucene's BM25, k1 1.5,
b 0.75), lower-cased words of two or more characters, bm25s's English stop words, and
the Snowball English stemmer (PyStemmer), i.e. the usual strong BM25 baseline (BEIR's
Elasticsearch runs stem too). A query none of whose words is in the corpus still has a
run (every score 0, trec_eval's tie order), so it counts, scoring what that order gives.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.beir import RetrievalTask, read_beir
from simcse_kit.evaluation.retrieval import retrieval_metrics

__all__ = ["bm25_run", "evaluate_bm25"]

logger = logging.getLogger(__name__)


def _bm25s() -> tuple[types.ModuleType, Any]:
    """bm25s and an English Snowball stemmer, or the one line that says how to install them."""
    try:
        import bm25s
        import Stemmer
    except ImportError:
        raise ConfigError("the BM25 baseline needs bm25s and PyStemmer: pip install 'simcse-kit[retrieval]'") from None
    return bm25s, Stemmer.Stemmer("english")


def bm25_run(task: RetrievalTask, k: int = 100) -> dict[str, dict[str, float]]:
    """BM25's top ``k`` documents of each query of ``task`` (its own id dropped, as the encoders' runs do).

    Args:
        task: The split to search.
        k: Documents kept per query.

    Returns:
        Query id -> {document id -> BM25 score}.
    """
    bm25s, stemmer = _bm25s()
    doc_ids, query_ids = list(task.corpus), list(task.queries)
    words = {"stopwords": "en", "stemmer": stemmer, "show_progress": False}
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([task.corpus[d] for d in doc_ids], **words), show_progress=False)
    # As words, not ids: a query's ids would index its own vocabulary, not the corpus's.
    query_words = bm25s.tokenize([task.queries[q] for q in query_ids], return_ids=False, **words)
    # One extra: a self-match dropped below still leaves k documents.
    rows, scores = retriever.retrieve(query_words, k=min(k + 1, len(doc_ids)), show_progress=False)
    run: dict[str, dict[str, float]] = {}
    for query, found, score in zip(query_ids, rows.tolist(), scores.tolist(), strict=True):
        hits = [(doc_ids[i], s) for i, s in zip(found, score, strict=True) if doc_ids[i] != query]
        run[query] = dict(hits[:k])
    return run


def evaluate_bm25(tasks: Sequence[str | Path | RetrievalTask], split: str = "test") -> dict[str, float]:
    """BM25's retrieval metrics (x 100) on BEIR-format tasks, keyed as a model's are.

    Args:
        tasks: Task folders or tasks already read.
        split: The qrels split of the folders.

    Returns:
        nDCG@10 under each task's name, every metric under ``<task>/<metric>``, and
        ``avg`` (mean nDCG@10 over the tasks), as
        :class:`~simcse_kit.evaluation.retrieval.RetrievalEvaluator` returns them.
    """
    _bm25s()  # a missing extra fails before any folder is read
    results: dict[str, float] = {}
    for task in (t if isinstance(t, RetrievalTask) else read_beir(t, split) for t in tasks):
        start = time.perf_counter()
        scored = retrieval_metrics(task.qrels, bm25_run(task))
        results[task.name] = 100 * scored["ndcg@10"]
        results |= {f"{task.name}/{m}": 100 * v for m, v in scored.items()}
        logger.info("%s: BM25 nDCG@10 %.2f (%.1f s)", task.name, results[task.name], time.perf_counter() - start)
    names = [key for key in results if "/" not in key]
    results["avg"] = float(np.mean([results[name] for name in names]))
    return results
