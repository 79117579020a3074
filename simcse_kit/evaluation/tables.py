"""Result tables: the one formatter behind the STS, transfer and seeds tables.

A table is a list of rows (``dict`` of result key -> value) and an ordered mapping
of result key -> column header. Numbers print with 2 decimals (the papers' style),
strings as they are, a missing key as ``-``. Two layouts: aligned plain text for the
console, and markdown for reports (README, BENCHMARKS, ``seeds.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "RETRIEVAL_COLUMNS",
    "STS_COLUMNS",
    "TRANSFER_COLUMNS",
    "format_rows",
    "format_seed_table",
    "format_table",
    "suite_columns",
]

Cell = float | int | str

STS_COLUMNS: dict[str, str] = {
    "STS12": "STS12",
    "STS13": "STS13",
    "STS14": "STS14",
    "STS15": "STS15",
    "STS16": "STS16",
    "STSBenchmark": "STS-B",
    "SICKRelatedness": "SICK-R",
    "avg": "Avg.",
}
"""STS result key -> column header (the SimCSE paper's Table 1 labels)."""

TRANSFER_COLUMNS: dict[str, str] = {
    "MR": "MR",
    "CR": "CR",
    "SUBJ": "SUBJ",
    "MPQA": "MPQA",
    "SST2": "SST",
    "TREC": "TREC",
    "MRPC": "MRPC",
    "avg": "Avg.",
}
"""Transfer result key -> column header (the SimCSE paper's Table B.1 labels)."""


RETRIEVAL_COLUMNS: dict[str, str] = {
    "task": "task",
    "ndcg@10": "nDCG@10",
    "mrr@10": "MRR@10",
    "recall@1": "R@1",
    "recall@10": "R@10",
    "recall@100": "R@100",
    "map@100": "MAP@100",
}
"""Retrieval metric -> column header; one row per task (x 100, nDCG@10 the primary metric)."""


def _cell(value: Cell | None) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else f"{value:.2f}"


def format_rows(
    rows: Sequence[Mapping[str, Cell]],
    columns: Mapping[str, str],
    *,
    markdown: bool = False,
    label: str | None = None,
) -> str:
    """Formats rows of results as a table, one column per entry of ``columns``.

    Args:
        rows: Each row's values by result key; keys not in ``columns`` are ignored.
        columns: Result key -> header, in column order.
        markdown: A markdown table (``| a | b |``, numeric columns right-aligned)
            instead of plain text right-justified to the widest cell.
        label: The key of a column of row labels (e.g. ``"seed"``), left-aligned
            in markdown.

    Returns:
        The header line, (markdown: a rule line,) then one line per row.
    """
    headers = list(columns.values())
    cells = [[_cell(row.get(key)) for key in columns] for row in rows]
    if markdown:
        rule = "|" + "".join("---|" if key == label else "---:|" for key in columns)
        lines = ["| " + " | ".join(headers) + " |", rule]
        return "\n".join(lines + ["| " + " | ".join(line) + " |" for line in cells])
    widths = [max(len(text) for text in column) for column in zip(headers, *cells, strict=True)]
    return "\n".join("  ".join(text.rjust(w) for text, w in zip(line, widths, strict=True)) for line in [headers, *cells])


def format_table(results: Mapping[str, float], columns: Mapping[str, str] = STS_COLUMNS) -> str:
    """One row of results in plain text; by default the SimCSE paper's STS table.

    Example output::

        STS12  STS13  STS14  STS15  STS16  STS-B  SICK-R   Avg.
        68.40  82.41  74.38  80.91  78.56  76.85   72.23  76.25

    Args:
        results: Result key -> value, e.g. an evaluator's output.
        columns: :data:`STS_COLUMNS`, :data:`TRANSFER_COLUMNS`, or
            :func:`suite_columns` of a custom suite.
    """
    return format_rows([results], columns)


def suite_columns(tasks: Sequence[str]) -> dict[str, str]:
    """The STS table's columns for a suite's tasks: the paper's table when every task is
    one of its seven, else one column per task (then ``avg``)."""
    if all(t in STS_COLUMNS for t in tasks):
        return STS_COLUMNS
    return {t: STS_COLUMNS.get(t, t) for t in tasks} | {"avg": STS_COLUMNS["avg"]}


def format_seed_table(
    per_seed: Mapping[int, Mapping[str, float]],
    mean: Mapping[str, float],
    std: Mapping[str, float],
    columns: Mapping[str, str] = STS_COLUMNS,
) -> str:
    """A markdown table: one row per seed, then ``mean ± std`` of each column.

    Args:
        per_seed: Seed -> that run's results.
        mean: Result key -> mean over seeds.
        std: Result key -> standard deviation over seeds.
        columns: Result key -> header; default the STS table's.
    """
    rows: list[dict[str, Cell]] = [{**table, "seed": str(seed)} for seed, table in per_seed.items()]
    rows.append({"seed": "mean ± std", **{k: f"{mean[k]:.2f} ± {std[k]:.2f}" for k in columns if k in mean}})
    return format_rows(rows, {"seed": "seed", **columns}, markdown=True, label="seed")
