"""benchmarks/retrieval_baseline.py: the models scored beside the judged one (``--also``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")
pytest.importorskip("pytrec_eval")

from benchmarks import retrieval_baseline  # noqa: E402 - after the skips
from simcse_kit.evaluation.beir import write_beir  # noqa: E402

WORDS = "red fox jumps high car blue parked green tree grows den dog cat runs".split()
CORPUS = {f"d{i}": " ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(4)) for i in range(12)}
QUERIES = {"d0": CORPUS["d0"], "d5": CORPUS["d5"], "q1": "red car", "q2": "green dog"}
QRELS = {"d0": {"d4": 2, "d1": 1}, "d5": {"d6": 3}, "q1": {"d1": 3, "d2": 1}, "q2": {"d9": 1}}


def _bag_of_words(texts: list[str]) -> np.ndarray:
    return np.array([[float(w in t.split()) for w in WORDS] for t in texts], dtype=np.float32)


def _hashed(texts: list[str]) -> np.ndarray:
    """Vectors unrelated to the words (seeded by each text's hash): a model that ranks differently."""
    seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in texts]
    return np.stack([np.random.default_rng(s).standard_normal(8) for s in seeds]).astype(np.float32)


def test_also_is_scored_against_bm25_and_the_judged_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import simcse_kit.evaluation.retrieval_tasks as tasks_module
    import simcse_kit.model.inference as inference

    encoders = {"judged": _bag_of_words, "/m/same": _bag_of_words, "/m/other": _hashed}
    monkeypatch.setattr(inference, "load_encoder", lambda name, device: SimpleNamespace(encode=encoders[name]))
    monkeypatch.setattr(
        tasks_module,
        "build_retrieval_tasks",
        lambda out, root: {"toy": write_beir(out / "toy", CORPUS, QUERIES, {"test": QRELS})},
    )
    task: dict[str, Any] = retrieval_baseline.measure("judged", tmp_path, tmp_path, also=["/m/same", "/m/other"])["toy"]
    same, other = task["also"]["same"], task["also"]["other"]  # keyed by folder name
    # The judged model scored again under another name: its metrics, no difference from it, BM25's difference.
    assert {k: same[k] for k in task["model"]} == task["model"]
    assert same["minus_model"] | {"replicates": 0} == {"ndcg@10": 0.0, "low": 0.0, "high": 0.0, "replicates": 0}
    assert same["minus_bm25"] == task["difference"]
    # Another model: differences paired query for query, so their means are the means' differences.
    assert other["ndcg@10"] != task["model"]["ndcg@10"]
    assert other["minus_model"]["ndcg@10"] == pytest.approx(other["ndcg@10"] - task["model"]["ndcg@10"])
    assert other["minus_bm25"]["ndcg@10"] == pytest.approx(other["ndcg@10"] - task["bm25"]["ndcg@10"])
    assert other["minus_model"]["low"] <= other["minus_model"]["ndcg@10"] <= other["minus_model"]["high"]


def test_also_refuses_two_models_the_record_would_key_alike(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"folders named \['model'\]"):
        retrieval_baseline.measure("judged", tmp_path, tmp_path, also=["/a/model", "/b/model"])
