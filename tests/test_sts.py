"""Tests for simcse_kit.sts: readers, known-answer correlations, errors, real counts."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from simcse_kit.errors import ConfigError, DataError
from simcse_kit.sts import (
    DEFAULT_SUITE,
    MAIN_TASKS,
    STSBDevEvaluator,
    STSEvaluator,
    TaskSpec,
    format_table,
    load_suite,
    load_task,
    read_sick,
    read_sts_subset,
    read_stsb,
    sts_dev_score,
)

REPO = Path(__file__).parents[1]
SENTEVAL = REPO.parent / "shared" / "data" / "senteval"


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


def write_sts_subset(folder: Path, subset: str, pairs: list[tuple[str, str]], golds: list[str]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    (folder / f"STS.gs.{subset}.txt").write_text("".join(f"{g}\n" for g in golds), encoding="utf-8")


def write_stsb(path: Path, pairs: list[tuple[str, str]], golds: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g:.3f}\t{a}\t{b}"
        + ("\textra\tfields" if i % 2 else "")  # some official rows carry 2 extra fields
        for i, ((a, b), g) in enumerate(zip(pairs, golds, strict=True))
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def write_sick(path: Path, pairs: list[tuple[str, str]], golds: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    lines += [f"{i}\t{a}\t{b}\t{g}\tNEUTRAL" for i, ((a, b), g) in enumerate(zip(pairs, golds, strict=True))]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))  # CRLF like the real file


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


# --------------------------------------------------------------------------- readers


def test_sts_reader_skips_blank_gold_and_normalises_whitespace(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a  b ", " c"), ("d", "e")], ["4", ""])
    pairs = read_sts_subset(tmp_path, "X")
    assert pairs.sentences1 == ["a b"] and pairs.sentences2 == ["c"]
    assert pairs.scores.tolist() == [4.0]


def test_stsb_reader_extra_fields_and_bare_quotes(tmp_path: Path) -> None:
    path = tmp_path / "sts-dev.csv"
    write_stsb(path, [('he said " hi', "b"), ("c", 'd "quoted" e'), ("f", "g")], [0.0, 2.5, 5.0])
    pairs = read_stsb(path)
    assert pairs.sentences1 == ['he said " hi', "c", "f"]
    assert pairs.sentences2 == ["b", 'd "quoted" e', "g"]
    assert pairs.scores.tolist() == [0.0, 2.5, 5.0]


def test_sick_reader_crlf_and_header(tmp_path: Path) -> None:
    path = tmp_path / "SICK_test_annotated.txt"
    write_sick(path, [("A man", "A woman"), ("Kids play", "Children play")], [1.0, 4.5])
    pairs = read_sick(path)
    assert pairs.sentences1 == ["A man", "Kids play"]  # not lowercased, no trailing \r
    assert pairs.sentences2 == ["A woman", "Children play"]
    assert pairs.scores.tolist() == [1.0, 4.5]


def test_yaml_suite_equals_default_suite() -> None:
    assert load_suite(REPO / "evaluate" / "sts.yaml") == DEFAULT_SUITE
    assert tuple(DEFAULT_SUITE) == MAIN_TASKS


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


def test_stsb_dev_evaluator(tmp_path: Path) -> None:
    dev, table = pair_table([0.1, 0.2, 0.3, 0.4], "dev")
    write_stsb(tmp_path / "STS" / "STSBenchmark" / "sts-dev.csv", dev, [0.5, 1.0, 2.0, 1.5])
    expected = (1 - 6 * 2 / (4 * 15)) * 100  # gold ranks 1 2 4 3 -> sum d^2 = 2
    assert STSBDevEvaluator(tmp_path)(VectorEncoder(table)) == pytest.approx(expected)
    assert sts_dev_score(VectorEncoder(table), tmp_path) == pytest.approx(expected)


def test_unknown_task_and_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="STS99"):
        STSEvaluator(tmp_path, tasks=["STS99"])
    with pytest.raises(DataError, match="nowhere"):
        STSEvaluator(tmp_path / "nowhere")


# --------------------------------------------------------------------------- errors


def assert_data_error(fn, *args, where: str) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    assert where in str(info.value), str(info.value)
    return str(info.value)


def test_ragged_input_line(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b"), ("c", "d\te")], ["1", "2"])
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.input.X.txt, line 2")
    assert "3 fields" in msg


def test_gold_count_differs_from_input(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b"), ("c", "d"), ("e", "f")], ["1", "2"])
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.gs.X.txt, line 3")
    assert "2 lines" in msg and "has 3" in msg


@pytest.mark.parametrize(
    ("gold", "problem"),
    [("nan", "not finite"), ("inf", "not finite"), ("5.5", "outside"), ("-0.1", "outside"), ("abc", "not a number")],
)
def test_bad_sts_gold(tmp_path: Path, gold: str, problem: str) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b"), ("c", "d"), ("e", "f")], ["1", "", gold])
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.gs.X.txt, line 3")
    assert problem in msg


def test_sick_range_is_1_to_5(tmp_path: Path) -> None:
    path = tmp_path / "SICK.txt"
    write_sick(path, [("a", "b"), ("c", "d")], [1.0, 0.5])
    msg = assert_data_error(read_sick, path, where="SICK.txt, line 3")
    assert "[1, 5]" in msg


def test_stsb_short_row_and_nan(tmp_path: Path) -> None:
    path = tmp_path / "sts-test.csv"
    path.write_text("g\tf\ty\t1\t2.0\ta\tb\ng\tf\ty\t2\t3.0\ta\n", encoding="utf-8")
    assert_data_error(read_stsb, path, where="sts-test.csv, line 2")
    path.write_text("g\tf\ty\t1\tNaN\ta\tb\n", encoding="utf-8")
    assert_data_error(read_stsb, path, where="sts-test.csv, line 1")


def test_non_utf8_bytes(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b"), ("c", "d")], ["1", "2"])
    (tmp_path / "STS.input.X.txt").write_bytes(b"a\tb\ncaf\xe9\td\n")  # Latin-1 e-acute
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.input.X.txt, line 2")
    assert "UTF-8" in msg


def test_missing_and_empty_files(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b")], ["1"])
    (tmp_path / "STS.gs.X.txt").unlink()
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.gs.X.txt")
    assert "not found" in msg
    (tmp_path / "STS.gs.X.txt").write_text("", encoding="utf-8")
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.gs.X.txt")
    assert "empty" in msg
    (tmp_path / "STS.gs.X.txt").write_text("\n", encoding="utf-8")
    msg = assert_data_error(read_sts_subset, tmp_path, "X", where="STS.gs.X.txt")
    assert "no scored pairs" in msg
    header_only = tmp_path / "SICK.txt"
    header_only.write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\n", encoding="utf-8")
    assert "no data rows" in assert_data_error(read_sick, header_only, where="SICK.txt")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("tasks: [1, 2]", "non-empty mapping"),
        ("other: 1", "single key"),
        ("tasks: {A: {format: csv, path: x}}", "format must be"),
        ("tasks: {A: {format: sts, path: x}}", "subsets"),
        ("tasks: {A: {format: sts, path: x, subsets: [mean]}}", "not all/mean/wmean"),
        ("tasks: {A: {format: sick, path: x, subsets: [a]}}", "only for format sts"),
        ("tasks: {A: {format: sick, path: x, colour: red}}", "unknown key"),
        ("tasks: {A: {format: sick", "not a valid YAML"),
    ],
)
def test_load_suite_rejects_bad_files(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as info:
        load_suite(path)
    assert "suite.yaml" in str(info.value)


# --------------------------------------------------------------------------- real data


def test_real_data_official_scored_pair_counts() -> None:
    assert SENTEVAL.is_dir(), f"SentEval data not found at {SENTEVAL}: the tests expect shared/data beside the checkout"
    counts = {
        name: {split: len(pairs) for split, pairs in load_task(SENTEVAL, spec).items()} for name, spec in DEFAULT_SUITE.items()
    }
    totals = {name: sum(c.values()) for name, c in counts.items() if name.startswith("STS1")}
    assert totals == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186}
    assert counts["STSBenchmark"] == {"dev": 1500, "test": 1379}
    assert counts["SICKRelatedness"] == {"test": 4927}
    assert len(STSBDevEvaluator(SENTEVAL).pairs) == 1500
