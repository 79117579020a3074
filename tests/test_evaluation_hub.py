"""Evaluation data in the hub's schema (MTEB's STS datasets) and results in MTEB's format.

Offline: the hub copies are built here from ``../shared/data`` and read through
``datasets.load_dataset`` on a local folder (``hub_root``), never the network.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr

from simcse_kit.cli import main
from simcse_kit.errors import DataError
from simcse_kit.evaluation import MAIN_TASKS, STSEvaluator
from simcse_kit.evaluation.hub import (
    HUB_DATASETS,
    HubSTSEvaluator,
    load_hub_pairs,
    read_original_release,
    senteval_test_pairs,
    write_hub_copy,
)
from simcse_kit.evaluation.mteb import write_mteb_results
from simcse_kit.evaluation.sts_readers import STSPairs, pairs_from_columns

# Official test-pair counts (data README); the full SICK.txt release lacks 21 of SICK-R's 4927.
SENTEVAL_COUNTS = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STSBenchmark": 1379,
    "SICKRelatedness": 4927,
}
RAW_SICK_TEST = 4906


def hashed_features(keys: list[list[str]], dim: int = 512) -> np.ndarray:
    """Count vectors of hashed string features: cheap and deterministic (18k pairs in <1 s)."""
    out = np.zeros((len(keys), dim))
    for i, feats in enumerate(keys):
        for f in feats:
            out[i, zlib.crc32(f.encode()) % dim] += 1.0
    return out


def words_encoder(sentences: list[str]) -> np.ndarray:
    """Bag of lowercased words: sees tokenisation (``don't`` vs ``do n't``)."""
    return hashed_features([s.lower().split() for s in sentences])


def letters_encoder(sentences: list[str]) -> np.ndarray:
    """Character trigrams of the lowercased letters and digits only: blind to tokenisation
    and case, so the original and the SentEval text of a pair encode the same."""
    keys = [re.sub(r"[^0-9a-z]", "", s.lower()) for s in sentences]
    return hashed_features([[k[i : i + 3] for i in range(max(len(k) - 2, 1))] for k in keys])


def letter_keys(pairs: STSPairs) -> list[tuple[str, str, float]]:
    """Each pair as (letters of sentence 1, letters of sentence 2, gold), for matching across
    tokenisations."""
    key = lambda s: re.sub(r"[^0-9a-z]", "", s.lower())  # noqa: E731
    return [(key(a), key(b), g) for a, b, g in zip(pairs.sentences1, pairs.sentences2, pairs.scores, strict=True)]


@pytest.fixture(scope="module")
def senteval(data_dir: Path) -> Path:
    return data_dir / "senteval"


@pytest.fixture(scope="module")
def same_pairs_root(tmp_path_factory: pytest.TempPathFactory, senteval: Path) -> Path:
    """Hub-schema copies of exactly the pairs the SentEval path reads."""
    root = tmp_path_factory.mktemp("hub-same")
    write_hub_copy(root, senteval_test_pairs(senteval))
    return root


def test_hub_schema_copy_scores_equal_the_folder_path(senteval: Path, same_pairs_root: Path) -> None:
    folder = STSEvaluator(senteval)(words_encoder)
    hub_eval = HubSTSEvaluator(hub_root=same_pairs_root)
    assert {t: len(p["test"]) for t, p in hub_eval.data.items()} == SENTEVAL_COUNTS
    hub = hub_eval(words_encoder)
    assert set(hub) == {*MAIN_TASKS, "avg"}  # one split per task: no subset details
    for task in (*MAIN_TASKS, "avg"):
        assert hub[task] == pytest.approx(folder[task], abs=0.01), task
        assert 10 < hub[task] < 90  # a real correlation, not a degenerate constant
    assert hub_eval.primary_metric == "avg"


def test_original_release_is_the_senteval_pairs_untokenised(data_dir: Path, senteval: Path, tmp_path: Path) -> None:
    raw = read_original_release(data_dir)
    same = senteval_test_pairs(senteval)
    assert {t: len(p) for t, p in raw.items()} == SENTEVAL_COUNTS | {"SICKRelatedness": RAW_SICK_TEST}
    for task in MAIN_TASKS[:-1]:  # STS12-16 and STS-B: the same pairs, in the same order
        np.testing.assert_array_equal(raw[task].scores, same[task].scores)
    assert raw["STS12"].sentences1[0] != same["STS12"].sentences1[0]  # cased, untokenised text
    # Every raw SICK test pair is a SentEval SICK-R pair (up to tokenisation), same gold.
    sick = set(letter_keys(same["SICKRelatedness"]))
    assert all(k in sick for k in letter_keys(raw["SICKRelatedness"]))

    write_hub_copy(tmp_path, raw)
    hub = HubSTSEvaluator(MAIN_TASKS[:-1], hub_root=tmp_path)
    folder = STSEvaluator(senteval, MAIN_TASKS[:-1])
    # Blind to tokenisation and case, the raw text scores as the SentEval text...
    hub_letters, folder_letters = hub(letters_encoder), folder(letters_encoder)
    for task in MAIN_TASKS[:-1]:
        assert hub_letters[task] == pytest.approx(folder_letters[task], abs=0.01), task
    # ... and a bag of words, which sees tokenisation, does not (STS12 moves most).
    assert abs(hub(words_encoder)["STS12"] - folder(words_encoder)["STS12"]) > 1.0


def test_load_hub_pairs_reads_the_hub_schema_and_names_bad_data(tmp_path: Path) -> None:
    folder = tmp_path / HUB_DATASETS["STS13"].dataset_id
    folder.mkdir(parents=True)
    rows = [{"sentence1": "a  cat", "sentence2": "a dog", "score": 3.5}, {"sentence1": "x", "sentence2": "y", "score": 1}]
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    pairs = load_hub_pairs("STS13", tmp_path)
    assert pairs.sentences1 == ["a cat", "x"] and pairs.sentences2 == ["a dog", "y"]  # whitespace-normalised
    np.testing.assert_array_equal(pairs.scores, [3.5, 1.0])

    (folder / "test.jsonl").write_text(json.dumps({"sentence1": "a", "sentence2": "b", "gold": 1.0}), encoding="utf-8")
    with pytest.raises(DataError, match=r"sts13-sts: test split lacks column\(s\) score"):
        load_hub_pairs("STS13", tmp_path)
    with pytest.raises(DataError, match="no local copy of mteb/sts12-sts"):
        load_hub_pairs("STS12", tmp_path)
    with pytest.raises(KeyError):
        HubSTSEvaluator(["STS17"], hub_root=tmp_path)


def test_pairs_from_columns_checks_rows() -> None:
    with pytest.raises(DataError, match="src: row 2: score nan is not a finite number"):
        pairs_from_columns(["a", "b"], ["c", "d"], [1.0, float("nan")], "src")
    with pytest.raises(DataError, match="src: row 1: sentence1 and sentence2 must be non-empty"):
        pairs_from_columns(["  "], ["c"], [1.0], "src")
    with pytest.raises(DataError, match="columns differ in length"):
        pairs_from_columns(["a"], ["c", "d"], [1.0], "src")


# Four pairs whose cosines are known: 1, 0.8, 0, -0.6 (unit 2-d vectors).
VECTORS = {"p": (1.0, 0.0), "q": (0.8, 0.6), "r": (0.0, 1.0), "s": (-0.6, 0.8)}
GOLD = [5.0, 2.0, 3.0, 0.0]


def vectors_encoder(sentences: list[str]) -> np.ndarray:
    return np.array([VECTORS[s] for s in sentences])


def test_mteb_results_follow_mtebs_schema_on_a_0_1_scale(tmp_path: Path) -> None:
    pairs = STSPairs(["p"] * 4, ["p", "q", "r", "s"], np.array(GOLD))
    write_hub_copy(tmp_path / "hub", {"STS12": pairs, "SICKRelatedness": pairs})
    evaluator = HubSTSEvaluator(["STS12", "SICKRelatedness"], hub_root=tmp_path / "hub")
    with pytest.raises(ValueError, match="not been run"):
        write_mteb_results(tmp_path / "mteb", evaluator)
    results = evaluator(vectors_encoder)
    written = write_mteb_results(tmp_path / "mteb", evaluator)
    assert {p.name for p in written.values()} == {"STS12.json", "SICK-R.json"}  # MTEB's task names

    doc = json.loads((tmp_path / "mteb" / "STS12.json").read_text())
    assert doc["task_name"] == "STS12" and doc["dataset_revision"] == HUB_DATASETS["STS12"].revision
    assert set(doc) == {"dataset_revision", "task_name", "mteb_version", "scores", "evaluation_time", "kg_co2_emissions"}
    (score,) = doc["scores"]["test"]
    # Ranks of the cosines (4, 3, 2, 1) vs gold (4, 2, 3, 1): Spearman = 1 - 6*2/(4*15) = 0.8.
    assert score["cosine_spearman"] == pytest.approx(0.8) and score["main_score"] == score["cosine_spearman"]
    assert score["cosine_pearson"] == pytest.approx(pearsonr([1.0, 0.8, 0.0, -0.6], GOLD)[0])
    assert score["hf_subset"] == "default" and score["languages"] == ["eng-Latn"]
    assert results["STS12"] == pytest.approx(100 * score["main_score"])  # our table: x 100
    assert json.loads((tmp_path / "mteb" / "SICK-R.json").read_text())["task_name"] == "SICK-R"


def test_evaluate_command_with_hub_source_and_mteb_results(
    tmp_path: Path, tiny_model_dir: Path, same_pairs_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_hub_copy(tmp_path / "hub", {"STS16": first_pairs(same_pairs_root, "STS16")})
    argv = ["evaluate", str(tiny_model_dir), "--pooler", "cls", "--source", "hub", "--hub-root", str(tmp_path / "hub")]
    argv += ["--tasks", "STS16", "--json", str(tmp_path / "r.json"), "--mteb-results", str(tmp_path / "mteb")]
    assert main(argv) == 0
    ours = json.loads((tmp_path / "r.json").read_text())
    mteb = json.loads((tmp_path / "mteb" / "STS16.json").read_text())
    assert ours["STS16"] == pytest.approx(100 * mteb["scores"]["test"][0]["main_score"])
    assert "STS16" in capsys.readouterr().out

    # The options that belong to the other source are refused by the command, before any work.
    assert main(["evaluate", str(tiny_model_dir), "--source", "hub", "--suite", "sts"]) == 2
    assert "--suite selects SentEval-layout files; it does not apply to --source hub" in capsys.readouterr().err
    assert main(["evaluate", str(tiny_model_dir), "--data-dir", str(tmp_path), "--hub-root", str(tmp_path)]) == 2
    assert "--hub-root only applies to --source hub" in capsys.readouterr().err
    assert main(["evaluate", str(tiny_model_dir), "--source", "hub", "--tasks", "STS17"]) == 2
    assert "unknown task(s) ['STS17']; choose from ['STS12'" in capsys.readouterr().err


def first_pairs(root: Path, task: str, n: int = 40) -> STSPairs:
    """The first ``n`` pairs of a task in a hub root (a tiny BERT encodes them in a second)."""
    p = load_hub_pairs(task, root)
    return STSPairs(p.sentences1[:n], p.sentences2[:n], p.scores[:n])
