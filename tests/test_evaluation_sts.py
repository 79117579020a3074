"""Tests for simcse_kit.evaluation.sts: known-answer correlations, the STS and STS-B dev
evaluators, and the ``evaluate`` command with a custom ``--suite``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fake_encoder, toy_sentences
from scipy.stats import spearmanr
from test_evaluation_readers import write_sick, write_sts_subset, write_stsb

from simcse_kit.errors import DataError
from simcse_kit.evaluation import (
    MAIN_TASKS,
    DevEvaluator,
    STSEvaluator,
    TaskSpec,
    alignment,
    format_table,
    load_suite,
    uniformity,
)

# --------------------------------------------------------------------------- fixtures


class VectorEncoder:
    """An ``encode`` whose embeddings are looked up in a table, so cosines are known.

    Records every sentence it is asked for, to check deduplication and batching.
    """

    def __init__(self, table: dict[str, list[float]], as_tensor: bool = False) -> None:
        self.table = table
        self.as_tensor = as_tensor
        self.seen: list[str] = []
        self.batch_sizes: list[int] = []

    def __call__(self, batch: list[str]) -> np.ndarray | torch.Tensor:
        self.seen.extend(batch)
        self.batch_sizes.append(len(batch))
        out = np.array([self.table[s] for s in batch], dtype=np.float32)
        return torch.from_numpy(out).to(torch.bfloat16) if self.as_tensor else out


def pair_table(cosines: list[float], tag: str) -> tuple[list[tuple[str, str]], dict]:
    """Pairs ``(a, b)`` with cos(a, b) = the given value, of varying sentence lengths.

    The lengths differ so that the evaluator's longest-first batching reorders them;
    a wrong un-sort would then change the answers.
    """
    pairs, table = [], {}
    for i, c in enumerate(cosines):
        a = f"{tag} first {i}" + " x" * (7 * i % 5)
        b = f"{tag} second {i}" + " y" * (3 * i % 7)
        table[a] = [1.0, 0.0]
        table[b] = [c, math.sqrt(1.0 - c * c)]
        pairs.append((a, b))
    return pairs, table


# Two subsets with known answers (cosines and golds strictly monotone, no ties):
#   A: cos .1 .2 .3 vs gold 1 2 3  -> rho = +1
#   B: cos .4 .5    vs gold 5 4    -> rho = -1
#   all: cos ranks 1..5 vs gold ranks 1 2 3 5 4, sum d^2 = 2 -> 1 - 6*2/(5*24) = 0.9
#   mean = (100 - 100) / 2 = 0;  wmean = (3*100 + 2*(-100)) / 5 = 20
KNOWN = {"T": 90.0, "T/mean": 0.0, "T/wmean": 20.0, "T/A": 100.0, "T/B": -100.0}


def write_known_task(root: Path) -> dict[str, list[float]]:
    """Writes task T (subsets A, B) with unscored pairs that would spoil the answer."""
    pairs_a, table_a = pair_table([0.1, 0.9, 0.2, 0.3], "A")  # pair 2 (cos .9) unscored
    pairs_b, table_b = pair_table([-0.9, 0.4, 0.5], "B")  # pair 1 (cos -.9) unscored
    write_sts_subset(root / "T", "A", pairs_a, ["1", "", "2.0", "3"])
    write_sts_subset(root / "T", "B", pairs_b, ["  ", "5", "4.000"])
    return {**table_a, **table_b}


KNOWN_SUITE = {"T": TaskSpec("sts", "T", ("A", "B"))}


# --------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("as_tensor", [False, True])
def test_all_mean_wmean_known_answers(tmp_path: Path, as_tensor: bool) -> None:
    table = write_known_task(tmp_path)
    evaluator = STSEvaluator(tmp_path, batch_size=2, suite=KNOWN_SUITE)
    results = evaluator(VectorEncoder(table, as_tensor=as_tensor))
    assert results.keys() == KNOWN.keys()  # no "avg": the 7 paper tasks did not all run
    # bf16 rounds the cosines but keeps their order, and Spearman only sees ranks.
    for key, value in KNOWN.items():
        assert results[key] == pytest.approx(value, abs=1e-9), key


def test_spearman_matches_naive_loop(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n, dim = 40, 5
    pairs = [(f"left {i}" + " w" * (i % 9), f"right {i}") for i in range(n)]
    golds = rng.uniform(0, 5, n).round(2)
    write_sts_subset(tmp_path / "T", "A", pairs, [f"{g:.2f}" for g in golds])
    table = {s: rng.normal(size=dim).tolist() for pair in pairs for s in pair}

    def cosine(u: list[float], v: list[float]) -> float:
        dot = sum(x * y for x, y in zip(u, v, strict=True))
        return dot / math.sqrt(sum(x * x for x in u) * sum(y * y for y in v))

    naive = [cosine(table[a], table[b]) for a, b in pairs]
    expected = spearmanr(naive, golds)[0] * 100
    suite = {"T": TaskSpec("sts", "T", ("A",))}
    results = STSEvaluator(tmp_path, batch_size=7, suite=suite)(VectorEncoder(table))
    assert results["T"] == pytest.approx(expected, abs=1e-6)
    assert results["T/A"] == results["T"] == results["T/mean"] == results["T/wmean"]


def test_each_sentence_encoded_once_per_task(tmp_path: Path) -> None:
    table = {"s": [1.0, 0.0], "t": [0.6, 0.8], "u": [0.0, 1.0], "v": [0.8, 0.6]}
    # Repeated sentences within and across subsets.
    write_sts_subset(tmp_path / "T", "A", [("s", "t"), ("s", "u"), ("t", "u")], ["1", "2", "3"])
    write_sts_subset(tmp_path / "T", "B", [("s", "v"), ("u", "v"), ("s", "t")], ["1", "2", "3"])
    encoder = VectorEncoder(table)
    STSEvaluator(tmp_path, batch_size=3, suite=KNOWN_SUITE)(encoder)
    assert sorted(encoder.seen) == ["s", "t", "u", "v"]
    assert max(encoder.batch_sizes) <= 3


def write_full_suite(root: Path) -> tuple[dict[str, TaskSpec], dict[str, list[float]], dict]:
    """All 7 paper task names on tiny files, each with a known main figure."""
    table: dict[str, list[float]] = {}
    suite: dict[str, TaskSpec] = {}
    expected: dict[str, float] = {}
    up, down = [1, 2, 3, 4], [4, 3, 2, 1]
    for k, name in enumerate(MAIN_TASKS[:5]):
        pairs, t = pair_table([0.1, 0.2, 0.3, 0.4], name)
        table |= t
        golds = up if k % 2 == 0 else down
        write_sts_subset(root / name, "only", pairs, [str(g) for g in golds])
        suite[name] = TaskSpec("sts", name, ("only",))
        expected[name] = 100.0 if k % 2 == 0 else -100.0
    dev, t_dev = pair_table([0.1, 0.2, 0.3], "dev")
    test, t_test = pair_table([0.1, 0.2, 0.3], "test")
    table |= t_dev | t_test
    write_stsb(root / "B" / "sts-dev.csv", dev, [3.0, 2.0, 1.0])
    write_stsb(root / "B" / "sts-test.csv", test, [1.0, 2.0, 3.0])
    suite["STSBenchmark"] = TaskSpec("stsb", "B")
    expected |= {"STSBenchmark": 100.0, "STSBenchmark/dev": -100.0}
    sick, t_sick = pair_table([0.1, 0.2, 0.3], "sick")
    table |= t_sick
    write_sick(root / "S.txt", sick, [1.0, 3.0, 2.0])  # rho = 1 - 6*2/(3*8) = 0.5
    suite["SICKRelatedness"] = TaskSpec("sick", "S.txt")
    expected["SICKRelatedness"] = 50.0
    expected["avg"] = (100 - 100 + 100 - 100 + 100 + 100 + 50) / 7
    return suite, table, expected


def test_full_suite_keys_avg_and_table(tmp_path: Path) -> None:
    suite, table, expected = write_full_suite(tmp_path)
    evaluator = STSEvaluator(tmp_path, suite=suite)
    assert evaluator.primary_metric == "avg"
    results = evaluator(VectorEncoder(table))
    for key, value in expected.items():
        assert results[key] == pytest.approx(value), key
    assert "STS12/mean" in results and "STS16/only" in results
    assert format_table(results) == (
        " STS12    STS13   STS14    STS15   STS16   STS-B  SICK-R   Avg.\n"
        "100.00  -100.00  100.00  -100.00  100.00  100.00   50.00  35.71"
    )
    assert format_table({"STS12": 1.234}).splitlines()[1].split() == ["1.23"] + ["-"] * 7


def test_unknown_task_and_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="STS99"):
        STSEvaluator(tmp_path, tasks=["STS99"])
    with pytest.raises(DataError, match="nowhere"):
        STSEvaluator(tmp_path / "nowhere")


# --------------------------------------------------------------------------- STS-B dev evaluator


def test_dev_evaluator_known_answer(tmp_path: Path) -> None:
    dev, table = pair_table([0.1, 0.2, 0.3, 0.4], "dev")
    write_stsb(tmp_path / "STS" / "STSBenchmark" / "sts-dev.csv", dev, [0.5, 4.0, 2.0, 4.5])
    evaluator = DevEvaluator(tmp_path, batch_size=3)
    assert (evaluator.primary_metric, evaluator.metric_label) == ("stsb_dev", "STS-B dev Spearman x 100")
    encoder = VectorEncoder(table)
    results = evaluator(encoder)
    assert results.keys() == {"stsb_dev", "alignment", "uniformity"}
    assert results["stsb_dev"] == pytest.approx((1 - 6 * 2 / (4 * 15)) * 100)  # gold ranks 1 3 2 4 -> sum d^2 = 2
    # Positives (gold >= 4): pairs 1 and 3, cos .2 and .4; unit vectors: |a - b|^2 = 2 - 2 cos.
    assert results["alignment"] == pytest.approx(((2 - 0.4) + (2 - 0.8)) / 2, rel=1e-6)
    emb = torch.tensor([table[s] for pair in dev for s in pair])
    assert results["uniformity"] == pytest.approx(float(uniformity(emb)), rel=1e-6)
    assert sorted(encoder.seen) == sorted(table) and max(encoder.batch_sizes) <= 3  # one pass


def write_pairs_table(path: Path, pairs: list[tuple[str, str]], golds: list[float]) -> None:
    """``pairs`` and ``golds`` as a user's own STS set: a CSV of sent0, sent1, score."""
    import csv as csv_module

    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv_module.writer(f)
        writer.writerow(["sent0", "sent1", "score"])
        writer.writerows([a, b, g] for (a, b), g in zip(pairs, golds, strict=True))


def test_a_pairs_table_scores_as_the_same_pairs_in_stsb_format(tmp_path: Path) -> None:
    """``pairs`` (a user's table of sent0, sent1, score) as dev and as a suite task gives what the
    same pairs give in STS-B's own format; on another scale (x 20) the same Spearman and the same
    alignment, its positives taken from 80% of its range up (gold 4 of 0-5)."""
    dev, table = pair_table([0.1, 0.2, 0.3, 0.4, 0.6], "dev")
    golds = [0.0, 4.0, 2.0, 4.5, 5.0]
    write_stsb(tmp_path / "STS" / "STSBenchmark" / "sts-dev.csv", dev, golds)
    write_pairs_table(tmp_path / "mine.csv", dev, golds)
    write_pairs_table(tmp_path / "mine100.csv", dev, [20 * g for g in golds])
    want = DevEvaluator(tmp_path, batch_size=3)(VectorEncoder(table))
    for name in ("mine.csv", "mine100.csv"):
        evaluator = DevEvaluator(tmp_path, batch_size=3, path=tmp_path / name, fmt="pairs")
        assert (evaluator.primary_metric, evaluator.metric_label) == ("pairs_dev", f"{name} Spearman x 100")
        got = evaluator(VectorEncoder(table))
        assert got["pairs_dev"] == pytest.approx(want["stsb_dev"]) and got["alignment"] == pytest.approx(want["alignment"])
        assert got["uniformity"] == pytest.approx(want["uniformity"])
    write_stsb(tmp_path / "STS" / "STSBenchmark" / "sts-test.csv", dev, golds)
    suite = {"B": TaskSpec("stsb", "STS/STSBenchmark"), "P": TaskSpec("pairs", str(tmp_path / "mine100.csv"))}
    results = STSEvaluator(tmp_path, batch_size=3, suite=suite)(VectorEncoder(table))
    assert results["P"] == pytest.approx(results["B"]) and results["P"] == pytest.approx(want["stsb_dev"])
    (tmp_path / "bad.csv").write_text("sent0,sent1,score\na,b,1\nc,d,high\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.csv, line 3: score 'high' \(column 'score'\) is not a number"):
        DevEvaluator(tmp_path, path=tmp_path / "bad.csv", fmt="pairs")


def test_dev_evaluator_one_encoding_matches_definitions_on_real_dev(data_dir: Path) -> None:
    evaluator = DevEvaluator(data_dir / "senteval")
    assert len(evaluator.pairs) == 1500
    encode = fake_encoder()
    calls: list[int] = []

    def counting(sentences: list[str]) -> torch.Tensor:
        calls.append(len(sentences))
        return encode(sentences)

    results = evaluator(counting)
    pairs = evaluator.pairs
    unique = sorted(set(pairs.sentences1) | set(pairs.sentences2))
    assert sum(calls) == len(unique)  # every distinct sentence encoded exactly once

    # Direct: encode all distinct sentences, then the definitions.
    emb = encode(unique)
    row = {s: i for i, s in enumerate(unique)}
    i1 = torch.tensor([row[s] for s in pairs.sentences1])
    i2 = torch.tensor([row[s] for s in pairs.sentences2])
    cos = torch.nn.functional.cosine_similarity(emb[i1].double(), emb[i2].double()).numpy()
    assert results["stsb_dev"] == pytest.approx(spearmanr(cos, pairs.scores)[0] * 100, abs=1e-6)
    pos = torch.as_tensor(pairs.scores >= 4.0)
    assert results["alignment"] == pytest.approx(float(alignment(emb[i1[pos]], emb[i2[pos]])), rel=1e-5)
    assert results["uniformity"] == pytest.approx(float(uniformity(emb)), rel=1e-5)


# --------------------------------------------------------------------------- the evaluate command


def test_evaluate_command_with_custom_suite(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simcse_kit.cli import main
    from simcse_kit.model.inference import load_encoder

    sents = toy_sentences(16)
    write_sts_subset(tmp_path / "data" / "T", "A", list(zip(sents[:8], sents[8:], strict=True)), [f"{i % 5}" for i in range(8)])
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text("tasks:\n  Mine: {format: sts, path: T, subsets: [A]}\n", encoding="utf-8")
    out = tmp_path / "res.json"
    argv = ["evaluate", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(tmp_path / "data")]
    assert main([*argv, "--suite", str(suite_file), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got.keys() == {"Mine", "Mine/mean", "Mine/wmean", "Mine/A"}
    # Same numbers as the evaluator called directly on the same model.
    encoder = load_encoder(tiny_model_dir, pooler="avg")
    expected = STSEvaluator(tmp_path / "data", batch_size=128, suite=load_suite(suite_file))(encoder.encode)
    assert got == expected
    head, row = capsys.readouterr().out.strip().splitlines()[-2:]
    assert head.split() == ["Mine", "Avg."] and row.split() == [f"{got['Mine']:.2f}", "-"]
    # --tasks is checked against the suite given, and a task of the default suite is not in it.
    assert main([*argv, "--suite", str(suite_file), "--tasks", "STS12"]) == 2
    assert "unknown task(s) ['STS12']" in capsys.readouterr().err
