"""Retrieval evaluation: BEIR folders, chunked search, pytrec_eval metrics, the evaluators."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation.beir import read_beir, write_beir
from simcse_kit.evaluation.retrieval import RetrievalDevEvaluator, RetrievalEvaluator, rank, retrieval_metrics
from simcse_kit.evaluation.search import exact_search, faiss_search

pytest.importorskip("pytrec_eval")

# --- metrics --------------------------------------------------------------------------

# q1: graded relevance and a tie (d2, d3 at 0.9: trec_eval puts the larger id, d3, first);
# q2: judged, but no relevant document; q3: its one relevant document ranked 11th (outside
# MRR@10 and Recall@10, inside Recall@100 and MAP@100); q5: no judgement, not counted.
QRELS = {"q1": {"d1": 2, "d2": 1, "d3": 0}, "q2": {"d4": 0}, "q3": {"d5": 1}}
RUN = {
    "q1": {"d1": 0.5, "d2": 0.9, "d3": 0.9, "d6": 0.1},
    "q2": {"d4": 0.8, "d1": 0.3},
    "q3": {**{f"x{i}": 1.0 - i / 10 for i in range(10)}, "d5": 0.01},
    "q5": {"d1": 1.0},
}


def test_metrics_hand_computed() -> None:
    # q1 ranks d3 (grade 0), d2 (1), d1 (2), d6: gains 0, 1, 2 at ranks 1-3.
    ndcg_q1 = (1 / math.log2(3) + 2 / math.log2(4)) / (2 + 1 / math.log2(3))
    map_q1 = (1 / 2 + 2 / 3) / 2  # relevant at ranks 2 and 3
    per_query = retrieval_metrics(QRELS, RUN, per_query=True)
    assert set(per_query) == {"q1", "q2", "q3"}
    assert per_query["q1"] == pytest.approx(
        {"ndcg@10": ndcg_q1, "mrr@10": 0.5, "recall@1": 0.0, "recall@10": 1.0, "recall@100": 1.0, "map@100": map_q1}
    )
    assert all(v == 0 for v in per_query["q2"].values())
    assert per_query["q3"] == pytest.approx(
        {"ndcg@10": 0.0, "mrr@10": 0.0, "recall@1": 0.0, "recall@10": 0.0, "recall@100": 1.0, "map@100": 1 / 11}
    )
    means = retrieval_metrics(QRELS, RUN)
    assert means == pytest.approx(
        {
            "ndcg@10": ndcg_q1 / 3,
            "mrr@10": 0.5 / 3,
            "recall@1": 0.0,
            "recall@10": 1 / 3,
            "recall@100": 2 / 3,
            "map@100": (map_q1 + 1 / 11) / 3,
        }
    )


def test_rank_breaks_ties_as_trec_eval() -> None:
    assert rank({"a": 1.0, "c": 1.0, "b": 2.0}) == ["b", "c", "a"]


def _naive(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """The six metrics by their textbook definitions (trec_eval's gains: the grade itself)."""
    per_query = []
    for q, judged in qrels.items():
        ranked = rank(run[q])
        relevant = {d for d, g in judged.items() if g > 0}
        gains = [judged.get(d, 0) for d in ranked]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
        ideal = sorted(judged.values(), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        hits = [d in relevant for d in ranked]
        first = next((i for i, h in enumerate(hits[:10]) if h), None)
        precisions = [sum(hits[: i + 1]) / (i + 1) for i, h in enumerate(hits[:100]) if h]
        n_rel = max(len(relevant), 1)
        per_query.append(
            {
                "ndcg@10": dcg / idcg if idcg else 0.0,
                "mrr@10": 0.0 if first is None else 1 / (first + 1),
                **{f"recall@{k}": sum(hits[:k]) / n_rel for k in (1, 10, 100)},
                "map@100": sum(precisions) / n_rel,
            }
        )
    return {m: float(np.mean([r[m] for r in per_query])) for m in per_query[0]}


def test_metrics_match_textbook_definitions_on_a_random_run() -> None:
    rng = random.Random(0)
    docs = [f"d{i}" for i in range(300)]
    qrels = {f"q{i}": {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 6))} for i in range(40)}
    # Scores rounded to 2 decimals: many ties, broken by id.
    run = {q: {d: round(rng.random(), 2) for d in rng.sample(docs, 150)} for q in qrels}
    ours = retrieval_metrics(qrels, run)
    assert ours == pytest.approx(_naive(qrels, run), abs=1e-12)
    assert 0 < ours["mrr@10"] < 1  # not a degenerate run


def test_metrics_without_overlap_raise() -> None:
    with pytest.raises(ValueError, match="no query"):
        retrieval_metrics({"q1": {"d1": 1}}, {"q9": {"d1": 1.0}})


# --- search -----------------------------------------------------------------------------


def test_exact_search_matches_full_matrix_argsort() -> None:
    g = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(37, 16, generator=g), torch.randn(1000, 16, generator=g)
    scores, indices = exact_search(queries, corpus, 10, query_chunk=8, corpus_chunk=64)
    full = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(corpus, dim=1).T
    expected = torch.argsort(full, dim=1, descending=True)[:, :10]
    assert torch.equal(indices, expected)
    assert torch.allclose(scores, torch.gather(full, 1, expected), atol=1e-6)
    # k above the corpus size: every document, still sorted.
    scores, indices = exact_search(queries[:2], corpus[:5], 10, corpus_chunk=2)
    assert indices.shape == (2, 5) and torch.equal(indices, torch.argsort(full[:2, :5], dim=1, descending=True))


def test_faiss_search_matches_exact() -> None:
    pytest.importorskip("faiss")
    g = torch.Generator().manual_seed(1)
    queries, corpus = torch.randn(20, 8, generator=g), torch.randn(300, 8, generator=g)
    _, exact = exact_search(queries, corpus, 5)
    _, approx = faiss_search(queries, corpus, 5)
    assert torch.equal(exact, approx)


# --- BEIR folders -----------------------------------------------------------------------


def _task(folder: Path) -> Path:
    corpus = {f"d{i}": f"document number {i} about topic {i % 3}" for i in range(6)}
    queries = {"q0": "document number 0 about topic 0", "q1": "document number 4", "q2": "never judged"}
    return write_beir(folder, corpus, queries, {"test": {"q0": {"d0": 1}, "q1": {"d4": 2, "d1": 0}}, "dev": {"q0": {"d3": 1}}})


def test_read_beir_round_trip(tmp_path: Path) -> None:
    task = read_beir(_task(tmp_path / "toy"))
    assert task.name == "toy"
    assert task.corpus["d2"] == "document number 2 about topic 2"
    assert list(task.queries) == ["q0", "q1"]  # q2 has no judgement in test: not evaluated
    assert task.qrels == {"q0": {"d0": 1}, "q1": {"d4": 2, "d1": 0}}
    assert read_beir(tmp_path / "toy", "dev").qrels == {"q0": {"d3": 1}}


def test_read_beir_title_joined_as_beir(tmp_path: Path) -> None:
    folder = _task(tmp_path / "t")
    (folder / "corpus.jsonl").write_text('{"_id": "d0", "title": "Title", "text": "body"}\n{"_id": "d1", "text": "x"}\n')
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    assert read_beir(folder).corpus == {"d0": "Title body", "d1": "x"}


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("corpus.jsonl", '{"_id": "d0", "text": "a"}\n{"_id": "d1", "text": \n', r"corpus.jsonl, line 2: not valid JSON"),
        ("corpus.jsonl", '{"_id": "d0", "text": "a"}\n{"_id": "d0", "text": "b"}\n', r"line 2: duplicate _id 'd0'"),
        ("corpus.jsonl", '{"text": "a"}\n', r"corpus.jsonl, line 1: missing or empty '_id'"),
        ("queries.jsonl", '{"_id": "q0", "text": 3}\n', r"queries.jsonl, line 1: 'text' must be a string"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq0\td0\n", r"test.tsv, line 2: expected 3 tab-separated"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq0\td0\thigh\n", r"test.tsv, line 2: score 'high' is not an integer"),
        ("qrels/test.tsv", "q0\td0\t1\n", r"test.tsv, line 1: expected the header"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq0\td99\t1\n", r"corpus-id 'd99' is not in corpus.jsonl"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq7\td0\t1\n", r"query-id 'q7' is not in queries.jsonl"),
    ],
)
def test_read_beir_bad_rows_name_file_and_line(tmp_path: Path, file: str, text: str, message: str) -> None:
    folder = _task(tmp_path / "t")
    (folder / file).write_text(text)
    with pytest.raises(DataError, match=message):
        read_beir(folder)


def test_read_beir_missing_split(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"qrels/train.tsv: qrels file not found \(this folder has splits \['dev', 'test'\]\)"):
        read_beir(_task(tmp_path / "t"), "train")


# --- evaluators -------------------------------------------------------------------------


def _one_hot_by_topic(calls: list[list[str]]):
    """Each text -> one-hot of its last word's hash: 'topic k' texts share a direction."""

    def encode(texts: list[str]) -> torch.Tensor:
        calls.append(list(texts))
        out = torch.zeros(len(texts), 8)
        for i, t in enumerate(texts):
            out[i, sum(map(ord, t.split()[-1])) % 8] = 1.0
            out[i] += 0.01 * torch.arange(8) * len(t)  # a small, length-dependent tie breaker
        return out

    return encode


def test_retrieval_evaluator_matches_metrics_of_its_run(tmp_path: Path) -> None:
    folder = _task(tmp_path / "toy")
    calls: list[list[str]] = []
    evaluator = RetrievalEvaluator([folder], batch_size=4)
    results = evaluator(_one_hot_by_topic(calls))
    encoded = [t for batch in calls for t in batch]
    # Each distinct text once: q0's text is also d0's.
    assert sorted(encoded) == sorted({*read_beir(folder).corpus.values(), "document number 4"})
    # The reference run: the full cosine matrix, sorted.
    task = read_beir(folder)
    encode = _one_hot_by_topic([])
    q = torch.nn.functional.normalize(encode(list(task.queries.values())), dim=1)
    d = torch.nn.functional.normalize(encode(list(task.corpus.values())), dim=1)
    full = (q @ d.T).tolist()
    run = {qid: {did: full[i][j] for j, did in enumerate(task.corpus) if did != qid} for i, qid in enumerate(task.queries)}
    expected = retrieval_metrics(task.qrels, run)
    assert results["toy"] == pytest.approx(100 * expected["ndcg@10"], abs=1e-4)
    assert results["toy/mrr@10"] == pytest.approx(100 * expected["mrr@10"], abs=1e-4)
    assert results["avg"] == results["toy"]


def test_self_match_dropped(tmp_path: Path) -> None:
    # Queries that are documents: q "a" must not find itself, only its paraphrase "b".
    texts = {"a": "x one", "b": "y one", "c": "z four"}
    folder = write_beir(tmp_path / "para", texts, texts, {"test": {"a": {"b": 1}, "b": {"a": 1}}})
    results = RetrievalEvaluator([folder])(_one_hot_by_topic([]))
    # Without the rule "a" ranks itself first and b second: MRR 0.5 instead of 1.
    assert results["para/mrr@10"] == pytest.approx(100.0)


def test_prompts_reach_queries_and_documents(tmp_path: Path) -> None:
    folder = _task(tmp_path / "toy")
    calls: list[list[str]] = []
    RetrievalEvaluator([folder], prompts={"query": "query: ", "document": "passage: "})(_one_hot_by_topic(calls))
    encoded = {t for batch in calls for t in batch}
    assert "query: document number 4" in encoded and "passage: document number 4 about topic 1" in encoded
    assert all(t.startswith(("query: ", "passage: ")) for t in encoded)


def test_dev_evaluator_uses_dev_split(tmp_path: Path) -> None:
    folder = _task(tmp_path / "toy")
    dev = RetrievalDevEvaluator(folder)
    assert dev.task.qrels == {"q0": {"d3": 1}}
    result = dev(_one_hot_by_topic([]))
    assert dev.primary_metric == "dev_ndcg@10" and "stsb_dev" not in result
    assert result["alignment"] >= 0 and np.isfinite(result["uniformity"])


def test_missing_extras_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _task(tmp_path / "toy")
    monkeypatch.setitem(sys.modules, "faiss", None)  # an import of it raises ImportError
    with pytest.raises(ConfigError, match=r"--index faiss needs faiss: pip install 'simcse-kit\[faiss\]'"):
        RetrievalEvaluator([folder], index="faiss")
    monkeypatch.setitem(sys.modules, "pytrec_eval", None)
    with pytest.raises(ConfigError, match=r"pip install 'simcse-kit\[retrieval\]'"):
        RetrievalEvaluator([folder])
    with pytest.raises(ConfigError, match="pytrec_eval"):
        RetrievalDevEvaluator(folder)
