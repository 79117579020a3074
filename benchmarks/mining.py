"""Mined hard negatives for pair data (issue 16): pairs only vs pairs + mined vs SNLI's own.

Ways to train the default model on ``snli_triplets.csv`` (premise, entailment,
contradiction; 5,864 rows), each with the repo's recipe, one epoch, STS-B dev selection
from step 0:

* ``sup``: ``train/sup.yaml``, all the (premise, entailment) pairs with in-batch negatives;
* ``sup+mined``: ``train/hardneg.yaml`` on the pairs with a ``hard_neg`` column mined by
  ``simcse-kit mine`` (default model, its defaults: top-10 by cosine over every distinct
  sent0/sent1 of the file, margin 0 so nothing scored above the positive, the best one
  left); SNLI's contradictions are dropped before mining, so this is what a user with
  pairs only can do. A row with no candidate below its positive is left out (as
  ``simcse-kit mine`` and sentence-transformers do): 4,509 of the 5,864 rows remain;
* ``sup-4509``: ``train/sup.yaml`` on exactly those rows' (premise, entailment) pairs (the
  mined file read in ``sup`` mode: its ``hard_neg`` column unused), so ``sup+mined``
  against ``sup-4509`` is like for like (issue 22): the same pairs, the same number of
  steps and, with the same seed, the same batches; only the mined negative differs. This
  rather than keeping all 5,864 rows with a fallback negative for the 1,355 without a
  mined one: any fallback (a random sentence, a candidate above the positive) is another
  kind of negative, and the row would measure a mix of the two;
* ``hardneg``: ``train/hardneg.yaml`` as is, SNLI's human-written contradictions.

Besides the 7-task STS table, every run's selected model (and the untouched model, row
``base``) gets nDCG@10 on the built-in retrieval tasks (``simcse-kit retrieval-tasks``:
MRPC, STS-B and SICK test pairs, built from the data root into ``OUTPUT_DIR/retrieval-tasks``;
never SNLI, whose dev and test files ``snli_triplets.csv`` is built from: refused).

Each runs ``--seeds`` (default 1,2,3) into ``OUTPUT_DIR/<config>/seed-N`` (a finished seed
is reused; ``--parallel N`` makes N runs at once, each in a fresh interpreter logging to
``OUTPUT_DIR/logs/``); the table (mean ± sample std) and the number of rows each config
trains on are printed and saved with the raw numbers in ``OUTPUT_DIR/mining.{md,json}``.
The data root: ``--data-root``, else ``SIMCSE_KIT_DATA``, else ``../shared/data``.

Usage::

    .venv/bin/python -m benchmarks.mining                         # ~45 min on 2 cores
    .venv/bin/python -m benchmarks.mining --seeds 1 --steps 4     # smoke run
    python -m benchmarks.mining --data-root .devdata --parallel 6 --output-dir runs/gpu-tables/mining   # a GPU box
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, setup_run
from benchmarks.table_runs import Job, add_table_options, execute, prepare_tables, retrieval_keys, table_meta

CONFIGS = ("sup", "sup-4509", "sup+mined", "hardneg")
TRIPLETS = ("train", "snli_triplets.csv")  # under the data root
logger = logging.getLogger("mining")


def mined_file(out: Path, triplets: Path) -> Path:
    """``triplets`` without its contradictions, re-mined (cached in ``out``)."""
    from simcse_kit.data.readers import read_rows
    from simcse_kit.files import write_text_atomic
    from simcse_kit.training.mining import mine_file

    target = out / "snli_pairs_mined.csv"
    if target.is_file():
        return target
    pairs = out / "snli_pairs.csv"
    rows = read_rows(triplets, ("sent0", "sent1"))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=("sent0", "sent1"), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(pairs, text.getvalue())
    tick = time.perf_counter()
    mine_file(pairs, target)
    logger.info("mined %s in %.0f s", target, time.perf_counter() - tick)
    return target


def config_overrides(name: str, args: argparse.Namespace, mined: Path) -> tuple[Path, dict[str, str]]:
    """The recipe and overrides of config ``name`` (see the module's docstring)."""
    recipe = "sup" if name in ("sup", "sup-4509") else "hardneg"
    opts = {"eval_steps": str(args.eval_steps), "progress_bar": "false", "data_root": str(args.data_root)}
    if name in ("sup-4509", "sup+mined"):
        opts["train_file"] = str(mined)
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    return REPO / "train" / f"{recipe}.yaml", opts


def training_rows(name: str, args: argparse.Namespace, mined: Path) -> int:
    """How many examples config ``name`` trains on (read as its run reads them)."""
    from simcse_kit.config.run import load_config
    from simcse_kit.training.run import load_training_data

    recipe, opts = config_overrides(name, args, mined)
    return len(load_training_data(load_config(recipe, opts)))


def config_job(name: str, seed: int, args: argparse.Namespace, mined: Path) -> Job:
    recipe, opts = config_overrides(name, args, mined)
    out = args.output_dir / name
    return Job(f"{name}/seed-{seed}", "kit", str(recipe), opts, seed, str(out), retrieval=tuple(args.tasks))


def cell(mean: dict[str, float], std: dict[str, float], key: str, n: int) -> str:
    if key not in mean:
        return "–"
    digits = 0 if key == "best_step" else 2
    return f"{mean[key]:.{digits}f} ± {std[key]:.{digits}f}" if n > 1 else f"{mean[key]:.{digits}f}"


def markdown(rows: dict[str, dict[int, dict[str, float]]], counts: dict[str, int] | None = None) -> tuple[str, dict[str, Any]]:
    """The table (``counts``: the rows each config trains on) and its raw numbers."""
    from simcse_kit.training.experiments import aggregate

    counts = counts or {}
    stats: dict[str, Any] = {}
    for name, per_seed in rows.items():
        mean, std = aggregate(list(per_seed.values()))
        stats[name] = {"mean": mean, "std": std, "rows": counts.get(name), "per_seed": {str(k): v for k, v in per_seed.items()}}
    retrieval = retrieval_keys(stats)
    keys = ("avg", "STSBenchmark", "best_stsb_dev", "best_step", "dev_trained", "dev_end", *retrieval)
    head = ["config", "rows", "seeds", "7-task avg", "STS-B test", "STS-B dev (selection)", "best step", "dev: best trained"]
    head += ["dev: end", *(f"nDCG@10 {k.removeprefix('retrieval:')}" for k in retrieval)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, per_seed in rows.items():
        mean, std = stats[name]["mean"], stats[name]["std"]
        count = f"{counts[name]:,}" if name in counts else "–"
        lines.append(
            f"| {name} | {count} | {len(per_seed)} | " + " | ".join(cell(mean, std, k, len(per_seed)) for k in keys) + " |"
        )
    if counts:
        lines += ["", "Rows trained on: " + "; ".join(f"{n} {c:,}" for n, c in counts.items()) + "."]
    for ours, theirs, what in (("sup+mined", "sup-4509", "the same rows"), ("sup+mined", "sup", "all rows")):
        if {ours, theirs} <= set(stats):
            gain = stats[ours]["mean"]["avg"] - stats[theirs]["mean"]["avg"]
            line = f"mined negatives vs pairs only on {what} (`{ours}` − `{theirs}`): {gain:+.2f} on the 7-task average"
            if "retrieval:avg" in stats[ours]["mean"] and "retrieval:avg" in stats[theirs]["mean"]:
                line += f", {stats[ours]['mean']['retrieval:avg'] - stats[theirs]['mean']['retrieval:avg']:+.2f} on mean nDCG@10"
            lines += ["", line]
    return "\n".join(lines), stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--steps", "--max-steps", type=int, default=None, help="max optimiser steps per run (default: one epoch)")
    parser.add_argument("--eval-steps", type=int, default=25, help="STS-B dev every N steps (and at the end)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "mining")
    add_table_options(parser)
    args = parser.parse_args()
    setup_run(args.threads)

    from simcse_kit.training.experiments import parse_seeds

    prepare_tables(args, ["/".join(TRIPLETS)])
    args.seeds = parse_seeds(args.seeds)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    triplets = args.data_root.joinpath(*TRIPLETS)
    names = args.task_names
    mined = mined_file(args.output_dir, triplets) if {"sup-4509", "sup+mined"} & set(args.configs) else triplets
    base = Job(
        "base",
        "base",
        out=str(args.output_dir / "base"),
        retrieval=tuple(args.tasks),
        eval_data_dir=str(args.data_root / "senteval"),
    )
    jobs = {(name, seed): config_job(name, seed, args, mined) for name in args.configs for seed in args.seeds}
    tables = execute([base, *jobs.values()], args.parallel, args.threads, args.output_dir / "logs", args.keep_going)
    rows = {"base": {0: tables["base"]}} if "base" in tables else {}
    for name in args.configs:
        done = {s: tables[jobs[name, s].name] for s in args.seeds if jobs[name, s].name in tables}
        if done:
            rows[name] = done
    lost = [j.name for j in [base, *jobs.values()] if j.name not in tables]
    counts = {name: training_rows(name, args, mined) for name in args.configs}
    table, stats = markdown(rows, counts)
    budget = f"steps={args.steps or 'one epoch'}, eval_steps={args.eval_steps}"
    header = (
        f"STS Spearman x 100 and retrieval nDCG@10 x 100 ({', '.join(names) or 'no task'}), mean ± sample std over "
        f"seeds {args.seeds} ({budget}); {time.perf_counter() - start:.0f} s"
    )
    if lost:
        table += f"\n\nRuns that FAILED, left out (logs in {args.output_dir / 'logs'}): {', '.join(lost)}"
    print(header + "\n\n" + table)
    (args.output_dir / "mining.md").write_text(header + "\n\n" + table + "\n", encoding="utf-8")
    meta = table_meta(args) | {"rows": counts}
    (args.output_dir / "mining.json").write_text(json.dumps(meta | {"results": stats}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
