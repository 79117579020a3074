"""The retrieval tasks built from the shared data, and `simcse-kit evaluate --retrieval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simcse_kit.cli import main
from simcse_kit.evaluation.beir import read_beir, write_beir
from simcse_kit.evaluation.retrieval import RetrievalEvaluator
from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks, gain, pair_task
from simcse_kit.evaluation.sts_readers import read_sick, read_stsb
from simcse_kit.model.inference import load_encoder

pytest.importorskip("pytrec_eval")


def test_pair_task_grades_partners_and_keeps_queries_with_a_strong_one() -> None:
    corpus = {"a": "x", "b": "y", "c": "z", "d": "x", "e": "w"}
    pairs = [
        ("a", "x", "b", "y", 40),  # a strong pair: both sides are queries
        ("a", "x", "c", "z", 26),  # a weaker partner of a: graded, not dropped
        ("a", "x", "d", "x", 50),  # same text: skipped
        ("c", "z", "e", "w", 12),  # c's and e's best partners are below 30: not queries
        ("b", "y", "a", "x", 35),  # the same pair again keeps the larger gain
        ("e", "w", "b", "y", 0),  # gain 0: not written
    ]
    queries, qrels = pair_task(corpus, pairs, query_min_gain=30)
    assert queries == {"a": "x", "b": "y"}
    assert qrels == {"a": {"b": 40, "c": 26}, "b": {"a": 40}}


def test_gain_is_tenths_above_the_floor() -> None:
    assert [gain(g, 0.0) for g in (0.0, 0.2, 3.6, 3.95, 5.0)] == [0, 2, 36, 40, 50]  # 39.5 rounds to even
    assert [gain(g, 1.0) for g in (1.0, 3.6, 4.0, 5.0, 0.9)] == [0, 26, 30, 40, 0]


def _graded(s1: list[str], s2: list[str], scores: list[float], floor: float) -> dict[str, dict[str, int]]:
    """The expected qrels by text, from a naive pass over the pairs: every pair both ways with its gain
    (the larger for a repeated pair), then the sentences whose best partner scores >= 4."""
    partners: dict[str, dict[str, int]] = {}
    for a, b, s in zip(s1, s2, scores, strict=True):
        g = round(10 * (s - floor))
        if a == b or g <= 0:
            continue
        for x, y in ((a, b), (b, a)):
            partners.setdefault(x, {})[y] = max(g, partners.get(x, {}).get(y, 0))
    return {q: p for q, p in partners.items() if max(p.values()) >= round(10 * (4.0 - floor))}


def test_built_tasks_are_graded_pairs_and_deterministic(tmp_path: Path, data_dir: Path) -> None:
    first = build_retrieval_tasks(tmp_path / "a", data_dir)
    second = build_retrieval_tasks(tmp_path / "b", data_dir)
    for name, folder in first.items():
        for file in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
            assert (folder / file).read_bytes() == (second[name] / file).read_bytes(), (name, file)
    stsb = read_stsb(data_dir / "stsbenchmark" / "sts-test.csv")
    sick = read_sick(data_dir / "sick" / "SICK.txt", semeval_set="TEST")
    expected = {
        "stsb-similar": _graded(stsb.sentences1, stsb.sentences2, list(stsb.scores), 0.0),
        "sick-related": _graded(sick.sentences1, sick.sentences2, list(sick.scores), 1.0),
    }
    for name, judged in expected.items():
        task = read_beir(first[name])
        found = {task.corpus[q]: {task.corpus[d]: g for d, g in docs.items()} for q, docs in task.qrels.items()}
        assert found == judged, name
        # Every sentence of the test split is a candidate.
        source = stsb if name == "stsb-similar" else sick
        assert set(task.corpus.values()) == {*source.sentences1, *source.sentences2}
    # The gold score is the gain: SICK's partners of 3 to 3.9 are judged (gain 20-29), not dropped.
    sick_task = read_beir(first["sick-related"])
    assert any(20 <= g < 30 for docs in sick_task.qrels.values() for g in docs.values())
    mrpc = read_beir(first["mrpc-paraphrase"])
    n_judgements = sum(len(docs) for docs in mrpc.qrels.values())
    assert n_judgements == 2 * 1147  # MRPC test: 1147 of 1725 pairs are paraphrases, each asked both ways
    assert {g for docs in mrpc.qrels.values() for g in docs.values()} == {1}
    assert len(mrpc.corpus) == 3395  # distinct sentence ids of MRPC test's 1725 pairs
    assert all(q not in docs for q, docs in mrpc.qrels.items())


def test_retrieval_tasks_command(tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retrieval-tasks", str(tmp_path), "--data-root", str(data_dir), "--tasks", "stsb-similar"]) == 0
    assert (tmp_path / "stsb-similar" / "qrels" / "test.tsv").is_file() and not (tmp_path / "sick-related").exists()
    assert main(["retrieval-tasks", str(tmp_path), "--data-root", str(data_dir), "--tasks", "snli"]) == 2
    assert "unknown task(s) ['snli']" in capsys.readouterr().err


def _toy(folder: Path) -> Path:
    corpus = {f"d{i}": f"the cat number {i} sat on mat {i % 4}" for i in range(12)}
    queries = {"q0": "the cat number 0", "q1": "mat 3", "q2": "a dog"}
    qrels = {"q0": {"d0": 1}, "q1": {"d3": 1, "d7": 2}, "q2": {"d5": 0}}
    return write_beir(folder, corpus, queries, {"test": qrels})


def test_evaluate_retrieval_command(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _toy(tmp_path / "toy")
    out = tmp_path / "r.json"
    argv = ["evaluate", str(tiny_model_dir), "--pooler", "avg", "--retrieval", str(folder), "--json", str(out)]
    assert main([*argv, "--mteb-results", str(tmp_path / "mteb")]) == 0
    table = capsys.readouterr().out
    assert "nDCG@10" in table and "MAP@100" in table and "toy" in table
    results = json.loads(out.read_text())
    # The command gives what the evaluator gives on the same encoder.
    expected = RetrievalEvaluator([folder])(load_encoder(tiny_model_dir, pooler="avg").encode)
    assert results == pytest.approx(expected)
    mteb = json.loads((tmp_path / "mteb" / "toy.json").read_text())
    scores = mteb["scores"]["test"][0]
    assert scores["main_score"] == scores["ndcg_at_10"] == pytest.approx(results["toy"] / 100)
    assert scores["mrr_at_10"] == pytest.approx(results["toy/mrr@10"] / 100)


def test_evaluate_retrieval_rejects_sts_options(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _toy(tmp_path / "toy")
    assert main(["evaluate", str(tiny_model_dir), "--pooler", "avg", "--retrieval", str(folder), "--tasks", "STS12"]) == 2
    assert "--tasks" in capsys.readouterr().err
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\tx\n")
    assert main(["evaluate", str(tiny_model_dir), "--pooler", "avg", "--retrieval", str(folder)]) == 2
    assert "test.tsv, line 2: score 'x' is not an integer" in capsys.readouterr().err


def test_a_run_selects_on_a_beir_dev_split(tmp_path: Path, tiny_run) -> None:  # noqa: ANN001 - conftest's TinyRun
    from conftest import toy_sentences

    from simcse_kit.evaluation.retrieval import RetrievalDevEvaluator

    sents = toy_sentences(40)
    corpus = {f"d{i}": s for i, s in enumerate(sents[:30])}
    queries = {f"q{i}": " ".join(sents[i].split()[:3]) for i in range(10)}
    folder = write_beir(tmp_path / "dev", corpus, queries, {"dev": {f"q{i}": {f"d{i}": 1} for i in range(10)}})
    metrics = tiny_run.train("beir-dev", dev_file=folder, dev_format="beir", num_epochs=1, final_eval=False)
    evals = metrics["evals"]
    # Selected on the folder's dev nDCG@10, and named so (no STS-B key anywhere).
    assert (metrics["dev_metric"], metrics["dev_label"]) == ("dev_ndcg@10", "dev dev nDCG@10 x 100")
    assert len(evals) >= 2 and not any("stsb_dev" in e for e in evals) and "best_stsb_dev" not in metrics
    assert metrics["best_dev_score"] == max(e["dev_ndcg@10"] for e in evals)
    # The saved best model scores what selected it, and says what that was.
    best = load_encoder(tiny_run.folder / "beir-dev")
    assert RetrievalDevEvaluator(folder)(best.encode)["dev_ndcg@10"] == pytest.approx(metrics["best_dev_score"], abs=1e-3)
    meta = json.loads((tiny_run.folder / "beir-dev" / "best_model" / "simcse_config.json").read_text())
    assert (meta["dev_metric"], meta["dev_label"]) == ("dev_ndcg@10", "dev dev nDCG@10 x 100")


def test_evaluate_retrieval_with_faiss_gives_the_exact_numbers(tmp_path: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("faiss")
    folder = _toy(tmp_path / "toy")
    argv = ["evaluate", str(tiny_model_dir), "--pooler", "avg", "--retrieval", str(folder), "--json"]
    assert main([*argv, str(tmp_path / "exact.json")]) == 0
    assert main([*argv, str(tmp_path / "faiss.json"), "--index", "faiss"]) == 0
    exact, faiss = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("exact", "faiss"))
    assert faiss == pytest.approx(exact, abs=1e-4)
