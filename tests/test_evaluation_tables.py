"""Tests for simcse_kit.evaluation.tables: the one formatter, by exact expected text."""

from __future__ import annotations

from simcse_kit.evaluation import STS_COLUMNS, TRANSFER_COLUMNS, format_rows, format_seed_table, format_table, suite_columns


def test_plain_rows_right_justified_to_widest_cell() -> None:
    text = format_rows([{"a": 1.0, "b": "x"}, {"a": -12.345}], {"a": "A", "b": "Bee"})
    assert text == "     A  Bee\n  1.00    x\n-12.35    -"


def test_transfer_table() -> None:
    results = {"MR": 80.0, "CR": 85.5, "SUBJ": 94.25, "MPQA": 89.0, "SST2": 85.04, "TREC": 88.6, "MRPC": 74.3}
    assert format_table(results, TRANSFER_COLUMNS) == (
        "   MR     CR   SUBJ   MPQA    SST   TREC   MRPC  Avg.\n80.00  85.50  94.25  89.00  85.04  88.60  74.30     -"
    )


def test_seed_table_markdown() -> None:
    per_seed = {1: {"STS12": 70.0, "avg": 75.0, "best_stsb_dev": 80.0}, 2: {"STS12": 72.0, "avg": 77.0}}
    mean, std = {"STS12": 71.0, "avg": 76.0}, {"STS12": 1.4142, "avg": 1.4142}
    assert format_seed_table(per_seed, mean, std) == "\n".join(
        [
            "| seed | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            "| 1 | 70.00 | - | - | - | - | - | - | 75.00 |",
            "| 2 | 72.00 | - | - | - | - | - | - | 77.00 |",
            "| mean ± std | 71.00 ± 1.41 | - | - | - | - | - | - | 76.00 ± 1.41 |",
        ]
    )


def test_suite_columns() -> None:
    assert suite_columns(["STS12", "SICKRelatedness"]) is STS_COLUMNS
    assert suite_columns(["Mine", "STSBenchmark"]) == {"Mine": "Mine", "STSBenchmark": "STS-B", "avg": "Avg."}
