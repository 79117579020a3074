"""``simcse-kit overlap FILE...``: which evaluation sentences a user's training files hold
(:mod:`simcse_kit.evaluation.contamination`), the check every training run makes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import add_data_options
from simcse_kit.config.recipes import data_root, find_recipe, senteval_dir
from simcse_kit.errors import ConfigError


def cmd_overlap(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation.contamination import (
        beir_set,
        count_overlap,
        file_keys,
        format_overlap,
        retrieval_sets,
        suite_sets,
    )
    from simcse_kit.evaluation.suite import default_suite, load_suite
    from simcse_kit.files import write_json_atomic

    suite = default_suite() if args.suite is None else load_suite(find_recipe(args.suite, "evaluate"))
    unknown = [t for t in args.tasks or () if t not in suite]
    if unknown:
        raise ConfigError(f"--tasks: unknown task(s) {unknown}; the suite has {list(suite)}")
    suite = {name: spec for name, spec in suite.items() if args.tasks is None or name in args.tasks}
    sets = suite_sets(senteval_dir(args.data_dir, args.data_root), suite)
    sets += [beir_set(folder) for folder in args.beir or ()]
    if args.retrieval_tasks:
        root = data_root(args.data_root)
        if root is None:
            raise ConfigError("--retrieval-tasks: no data root: pass --data-root DIR or set SIMCSE_KIT_DATA")
        sets += retrieval_sets(root)
    sources = {}
    for path in args.files:
        fmt, keys = file_keys(path, args.format, args.cache_dir)
        sources[str(path)] = keys
        print(f"{path}: {fmt}, {len(keys):,} rows, {len(set(keys.ravel().tolist())):,} distinct sentences")
    overlaps = [count_overlap(split, sources) for split in sets]
    print(format_overlap(overlaps))
    if args.json is not None:
        write_json_atomic(args.json, {"files": list(sources), "tasks": {o.task: vars(o) for o in overlaps}})
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser(
        "overlap",
        help="count the evaluation sentences (STS suite, retrieval tasks) that training files also hold",
        description="Sentences are compared with case, punctuation and whitespace folded (docs/contamination.md).",
    )
    p.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="training files, folders or quoted glob patterns of shards (text, CSV, TSV, JSONL, Parquet, Arrow, "
        "gzip/zstd; STS-B or SICK)",
    )
    p.add_argument(
        "--format",
        default="auto",
        choices=("auto", "text", "table", "stsb", "sick"),
        help="how to read every FILE (auto: a SICK or STS-B file from its first line, else by suffix)",
    )
    add_data_options(p, "SentEval-layout data folder of the suite")
    p.add_argument("--suite", default=None, help="YAML task table, or a built-in suite's name (default: the paper's 7)")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of the suite's tasks (default: all)")
    p.add_argument("--beir", action="append", type=Path, default=None, metavar="DIR", help="a BEIR folder too (repeatable)")
    p.add_argument("--retrieval-tasks", action="store_true", help="the built-in retrieval tasks too (simcse-kit retrieval-tasks)")
    p.add_argument("--cache-dir", type=Path, default=None, help="where text and CSV files are cached (as data.cache_dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the counts here")
    p.set_defaults(func=cmd_overlap, extra_ok=False)
