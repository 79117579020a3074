"""``simcse-kit retrieval-tasks``: the retrieval tasks built from the shared data, written
as BEIR folders (:mod:`simcse_kit.evaluation.retrieval_tasks`); ``simcse-kit bm25``: the
lexical baseline's row on such folders (:mod:`simcse_kit.evaluation.bm25`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import add_json, check_output, show
from simcse_kit.errors import ConfigError


def cmd_retrieval_tasks(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config.recipes import data_root
    from simcse_kit.evaluation.retrieval_tasks import RETRIEVAL_TASKS, build_retrieval_tasks

    unknown = [t for t in args.tasks or () if t not in RETRIEVAL_TASKS]
    if unknown:
        raise ConfigError(f"--tasks: unknown task(s) {unknown}; choose from {list(RETRIEVAL_TASKS)}")
    root = data_root(args.data_root)
    if root is None:
        raise ConfigError("no data root: pass --data-root DIR or set SIMCSE_KIT_DATA")
    for name, folder in build_retrieval_tasks(args.out, root, args.tasks).items():
        print(f"{name}: {folder}  (simcse-kit evaluate MODEL --retrieval {folder})")
    return 0


def cmd_bm25(args: argparse.Namespace, extra: list[str]) -> int:
    """``bm25 DIR ...``: BM25's row per task folder, the columns of ``evaluate --retrieval``."""
    from simcse_kit.evaluation.bm25 import evaluate_bm25
    from simcse_kit.evaluation.tables import RETRIEVAL_COLUMNS, format_rows

    check_output(args.json)
    results = evaluate_bm25(args.folders, split=args.split)
    tasks = [key for key in results if "/" not in key and key != "avg"]
    rows: list[dict[str, float | str]] = [
        {"task": name, **{m: results[f"{name}/{m}"] for m in RETRIEVAL_COLUMNS if m != "task"}} for name in tasks
    ]
    show(format_rows(rows, RETRIEVAL_COLUMNS), results, args.json)
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser(
        "retrieval-tasks", help="write the retrieval tasks built from the shared data (MRPC, STS-B, SICK) as BEIR folders"
    )
    p.add_argument("out", type=Path, help="parent folder; each task goes to OUT/<task>/")
    p.add_argument("--tasks", nargs="+", default=None, help="mrpc-paraphrase stsb-similar sick-related (default: all)")
    p.add_argument("--data-root", type=Path, default=None, help="the shared data folder (default: as for evaluate)")
    p.set_defaults(func=cmd_retrieval_tasks, extra_ok=False)

    p = add_parser("bm25", help="the BM25 baseline (bm25s) on BEIR-format folders: the metrics of evaluate --retrieval")
    p.add_argument("folders", nargs="+", type=Path, metavar="DIR", help="BEIR-format task folders")
    p.add_argument("--split", default="test", help="the qrels split (qrels/SPLIT.tsv)")
    add_json(p)
    p.set_defaults(func=cmd_bm25, extra_ok=False)
