"""Tests for simcse_kit.evaluation.sts_readers: STS/STS-B/SICK and transfer-task readers,
the suite file, bad-file errors naming file and line, and the official counts."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation import (
    MAIN_TASKS,
    TRANSFER_TASKS,
    load_suite,
    load_task,
    load_transfer_task,
    read_sick,
    read_sts_subset,
    read_stsb,
)
from simcse_kit.evaluation.suite import default_suite, suite_file

REPO = Path(__file__).parents[1]
SENTEVAL = REPO.parent / "shared" / "data" / "senteval"


# --------------------------------------------------------------------------- file writers (shared with the STS tests)


def write_sts_subset(folder: Path, subset: str, pairs: list[tuple[str, str]], golds: list[str]) -> None:
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


# --------------------------------------------------------------------------- STS readers


def test_sts_reader_skips_blank_gold_and_normalises_whitespace(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a  b ", " c"), ("d", "e")], ["4", ""])
    pairs = read_sts_subset(tmp_path, "X")
    assert pairs.sentences1 == ["a b"] and pairs.sentences2 == ["c"]
    assert pairs.scores.tolist() == [4.0]


def test_sts_reader_drops_bom_and_crlf(tmp_path: Path) -> None:
    write_sts_subset(tmp_path, "X", [("a", "b")], ["1"])
    (tmp_path / "STS.input.X.txt").write_bytes("\ufeffcaf\u00e9 \u2028x\tb\r\nc\td\r\n".encode())
    (tmp_path / "STS.gs.X.txt").write_bytes(b"1\r\n2\r\n")
    pairs = read_sts_subset(tmp_path, "X")
    # U+2028 inside a sentence is whitespace to str.split, not a line break.
    assert pairs.sentences1 == ["caf\u00e9 x", "c"] and pairs.sentences2 == ["b", "d"]


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


def test_default_suite_is_the_shipped_file() -> None:
    """The paper's table has one home, ``evaluate/sts.yaml`` (a wheel's ``suite_files/``)."""
    assert suite_file() == REPO / "evaluate" / "sts.yaml"  # a checkout reads the repo's file
    assert default_suite() == load_suite(REPO / "evaluate" / "sts.yaml")
    assert MAIN_TASKS == ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
    assert default_suite()["STS13"].subsets == ("FNWN", "headlines", "OnWN")  # no SMT: not redistributable
    assert default_suite()["SICKRelatedness"].path == "SICK/SICK_test_annotated.txt"
    suite = default_suite()
    suite.pop("STS12")  # a caller's copy: the next call reads the table whole again
    assert tuple(default_suite()) == MAIN_TASKS


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


def test_missing_empty_and_folder_files(tmp_path: Path) -> None:
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
    (tmp_path / "sts-dev.csv").mkdir()
    assert "is a folder" in assert_data_error(read_stsb, tmp_path / "sts-dev.csv", where="sts-dev.csv")


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


# --------------------------------------------------------------------------- transfer readers

# SentEval's sizes (MR 10662, CR 3775, SUBJ 10000, MPQA 10606, SST2 67349/872/1821,
# TREC 5452/500, MRPC 4076/1725) less the blank lines SentEval keeps as samples.
TRANSFER_COUNTS = {
    "MR": {"all": (5331, 5331)},
    "CR": {"all": (1366, 2405)},
    "SUBJ": {"all": (5000, 5000)},
    "MPQA": {"all": (7292, 3311)},
    "SST2": {"train": (29780, 37569), "dev": (428, 444), "test": (912, 909)},
    "TREC": {"train": (86, 1162, 1250, 1223, 835, 896), "test": (9, 138, 94, 65, 81, 113)},
    "MRPC": {"train": (1323, 2753), "test": (578, 1147)},
}


@pytest.mark.parametrize("name", TRANSFER_TASKS)
def test_transfer_readers_match_official_counts(data_dir: Path, name: str) -> None:
    task = load_transfer_task(data_dir / "senteval", name)
    for split, per_class in TRANSFER_COUNTS[name].items():
        texts, labels = task.splits[split]
        assert tuple(np.bincount(labels).tolist()) == per_class
        sentences = [s for t in texts for s in t.split("\t")] if task.paired else texts
        assert len(texts) == len(labels) and all(s and s == " ".join(s.split()) for s in sentences)
    if name == "MRPC":
        a, b = task.pairs(task.splits["train"][0][:1])
        assert a[0].startswith("Amrozi accused his brother") and b[0].startswith("Referring to him as only")
    if name == "TREC":  # Latin-1 file, coarse label, fine label dropped
        assert task.splits["train"][0][0] == "How did serfdom develop in and then leave Russia ?"
        assert task.splits["train"][1][0] == 1  # DESC


def test_transfer_latin1_fallback_and_bom(tmp_path: Path) -> None:
    (tmp_path / "TREC").mkdir()
    (tmp_path / "TREC" / "train_5500.label").write_bytes(b"DESC:manner How caf\xe9 ?\r\nNUM:dist How far ?\n")
    (tmp_path / "TREC" / "TREC_10.label").write_bytes("\ufeffNUM:dist How \u00e9 far ?\n".encode())
    task = load_transfer_task(tmp_path, "TREC")
    assert task.splits["train"][0] == ["How caf\u00e9 ?", "How far ?"]  # Latin-1 byte 0xe9, CRLF gone
    assert task.splits["test"][0] == ["How \u00e9 far ?"]  # UTF-8, BOM dropped


def test_malformed_transfer_file_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "TREC").mkdir()
    (tmp_path / "TREC" / "train_5500.label").write_text("DESC:manner How ?\nWHAT:x bad label\n", encoding="utf-8")
    (tmp_path / "TREC" / "TREC_10.label").write_text("NUM:dist How far ?\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train_5500.label, line 2"):
        load_transfer_task(tmp_path, "TREC")
    with pytest.raises(DataError, match="not found"):
        load_transfer_task(tmp_path, "MR")
    with pytest.raises(KeyError):
        load_transfer_task(tmp_path, "SNLI")


# --------------------------------------------------------------------------- real data


def test_real_data_official_scored_pair_counts() -> None:
    assert SENTEVAL.is_dir(), f"SentEval data not found at {SENTEVAL}: the tests expect shared/data beside the checkout"
    counts = {
        name: {split: len(pairs) for split, pairs in load_task(SENTEVAL, spec).items()} for name, spec in default_suite().items()
    }
    totals = {name: sum(c.values()) for name, c in counts.items() if name.startswith("STS1")}
    assert totals == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186}
    assert counts["STSBenchmark"] == {"dev": 1500, "test": 1379}
    assert counts["SICKRelatedness"] == {"test": 4927}
    assert not any(math.isnan(s) for pairs in load_task(SENTEVAL, default_suite()["STSBenchmark"]).values() for s in pairs.scores)
