"""The BM25 baseline: bm25s's scores against Lucene's formula by hand, and `simcse-kit bm25`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simcse_kit.cli import main
from simcse_kit.evaluation.beir import read_beir, write_beir
from simcse_kit.evaluation.retrieval import retrieval_metrics

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")
pytest.importorskip("pytrec_eval")

from simcse_kit.evaluation.bm25 import bm25_run, evaluate_bm25  # noqa: E402 - after the skips

# Words the English stemmer leaves as they are, no stop words: each text is its own tokens.
CORPUS = {
    "d0": "red fox jumps high",
    "d1": "red red car",
    "d2": "blue car parked",
    "d3": "green tree grows high",
    "d4": "fox den",
}
QUERIES = {"d0": "red fox jumps high", "q1": "red car", "q2": "purple"}
QRELS = {"d0": {"d4": 2, "d1": 1}, "q1": {"d1": 3}, "q2": {"d2": 1}}


def _lucene(query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """Lucene's BM25 of every document, by its formula: idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
    tf / (tf + k1 (1 - b + b |d| / avgdl)) summed over the query's distinct words (Lucene 8 on dropped
    classic BM25's constant factor k1 + 1, which ranks the same)."""
    docs = {d: t.split() for d, t in CORPUS.items()}
    avgdl = sum(len(w) for w in docs.values()) / len(docs)
    scores = {}
    for d, words in docs.items():
        s = 0.0
        for term in set(query.split()):
            df = sum(term in w for w in docs.values())
            tf = words.count(term)
            if df and tf:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                s += idf * tf / (tf + k1 * (1 - b + b * len(words) / avgdl))
        scores[d] = s
    return scores


def _task(tmp_path: Path) -> Path:
    return write_beir(tmp_path / "toy", CORPUS, QUERIES, {"test": QRELS})


def test_bm25_run_is_lucenes_formula_without_the_self_match(tmp_path: Path) -> None:
    task = read_beir(_task(tmp_path))
    run = bm25_run(task, k=3)
    for query, text in QUERIES.items():
        expected = {d: s for d, s in _lucene(text).items() if d != query}
        top = sorted(expected, key=lambda d: -expected[d])[:3]
        assert set(run[query]) <= set(expected) and query not in run[query]
        assert len(run[query]) == 3
        for d in top:
            if expected[d] > 0:  # the zero-score tail is in bm25s's tie order
                assert run[query][d] == pytest.approx(expected[d], rel=1e-5), (query, d)
    assert run["d0"]["d4"] == pytest.approx(_lucene("red fox jumps high")["d4"], rel=1e-5)
    # A query with no word in the corpus still has a run, every score 0: it counts.
    assert set(run["q2"].values()) == {0.0}


def test_evaluate_bm25_is_pytrec_evals_metrics_of_that_run(tmp_path: Path) -> None:
    folder = _task(tmp_path)
    task = read_beir(folder)
    expected = retrieval_metrics(task.qrels, bm25_run(task))
    results = evaluate_bm25([folder])
    assert results["toy"] == pytest.approx(100 * expected["ndcg@10"])
    assert results["toy/mrr@10"] == pytest.approx(100 * expected["mrr@10"])
    assert results["avg"] == results["toy"]
    # q1's only judged document is BM25's first: nDCG@10 1 for it.
    per_query = retrieval_metrics(task.qrels, bm25_run(task), per_query=True)
    assert per_query["q1"]["ndcg@10"] == pytest.approx(1.0)


def test_bm25_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _task(tmp_path)
    out = tmp_path / "bm25.json"
    assert main(["bm25", str(folder), "--json", str(out)]) == 0
    assert "nDCG@10" in capsys.readouterr().out
    assert json.loads(out.read_text()) == pytest.approx(evaluate_bm25([folder]))
    assert main(["bm25", str(tmp_path / "missing")]) == 2
    assert "no such retrieval task folder" in capsys.readouterr().err
