"""Mined hard negatives for pair data (issue 16): pairs only vs pairs + mined vs SNLI's own.

Three ways to train the default model on ``snli_triplets.csv`` (premise, entailment,
contradiction), each with the repo's recipe, one epoch, STS-B dev selection from step 0:

* ``sup``: ``train/sup.yaml``, the (premise, entailment) pairs with in-batch negatives;
* ``sup+mined``: ``train/hardneg.yaml`` on the pairs with a ``hard_neg`` column mined by
  ``simcse-kit mine`` (default model, its defaults: top-10 by cosine over every distinct
  sent0/sent1 of the file, margin 0 so nothing scored above the positive, the best one
  left); SNLI's contradictions are dropped before mining, so this is what a user with
  pairs only can do;
* ``hardneg``: ``train/hardneg.yaml`` as is, SNLI's human-written contradictions.

Each runs ``--seeds`` (default 1,2,3) into ``OUTPUT_DIR/<config>/seed-N`` (a finished seed
is reused); the table (mean ± sample std: 7-task average, STS-B test, dev) is printed and
saved with the raw numbers in ``OUTPUT_DIR/mining.{md,json}``.

Usage::

    .venv/bin/python -m benchmarks.mining                         # ~35 min on 2 cores
    .venv/bin/python -m benchmarks.mining --seeds 1 --steps 4     # smoke run
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

from benchmarks._common import DATA, REPO, machine, setup_run
from benchmarks.st_peers import dev_curve

TRIPLETS = DATA / "train" / "snli_triplets.csv"
CONFIGS = ("sup", "sup+mined", "hardneg")
logger = logging.getLogger("mining")


def mined_file(out: Path) -> Path:
    """``snli_triplets.csv`` without its contradictions, re-mined (cached in ``out``)."""
    from simcse_kit.data import read_rows
    from simcse_kit.fileio import write_text_atomic
    from simcse_kit.mining import mine_file

    target = out / "snli_pairs_mined.csv"
    if target.is_file():
        return target
    pairs = out / "snli_pairs.csv"
    rows = read_rows(TRIPLETS, ("sent0", "sent1"))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=("sent0", "sent1"), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(pairs, text.getvalue())
    tick = time.perf_counter()
    mine_file(pairs, target)
    logger.info("mined %s in %.0f s", target, time.perf_counter() - tick)
    return target


def run_config(name: str, args: argparse.Namespace, out: Path) -> dict[int, dict[str, float]]:
    from simcse_kit.config import load_config
    from simcse_kit.experiments import run_seeds

    recipe = "sup" if name == "sup" else "hardneg"
    opts = {"output_dir": str(out / name), "eval_steps": str(args.eval_steps), "progress_bar": "false"}
    if name == "sup+mined":
        opts["train_file"] = str(mined_file(out))
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    cfg = load_config(REPO / "train" / f"{recipe}.yaml", opts)
    summary = run_seeds(cfg, args.seeds, quiet=True)
    per_seed = {int(s): t for s, t in summary["per_seed"].items()}
    for seed, table in per_seed.items():  # what training did, whether or not selection kept the base model
        metrics = json.loads((out / name / f"seed-{seed}" / "metrics.json").read_text(encoding="utf-8"))
        table |= {"best_step": float(metrics["best_step"])} | dev_curve(metrics)
    return per_seed


def markdown(rows: dict[str, dict[int, dict[str, float]]]) -> tuple[str, dict[str, Any]]:
    from simcse_kit.experiments import aggregate

    keys = ("avg", "STSBenchmark", "best_stsb_dev", "best_step", "dev_trained", "dev_end")
    lines = [
        "| config | seeds | 7-task avg | STS-B test | STS-B dev (selection) | best step | dev: best trained | dev: end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stats: dict[str, Any] = {}
    for name, per_seed in rows.items():
        mean, std = aggregate(list(per_seed.values()))
        stats[name] = {"mean": mean, "std": std, "per_seed": {str(k): v for k, v in per_seed.items()}}
        digits = {"best_step": 0}
        cells = [
            f"{mean[k]:.{digits.get(k, 2)}f} ± {std[k]:.{digits.get(k, 2)}f}"
            if len(per_seed) > 1
            else f"{mean[k]:.{digits.get(k, 2)}f}"
            for k in keys
        ]
        lines.append(f"| {name} | {len(per_seed)} | " + " | ".join(cells) + " |")
    if {"sup", "sup+mined"} <= set(stats):
        gain = stats["sup+mined"]["mean"]["avg"] - stats["sup"]["mean"]["avg"]
        lines.append("")
        lines.append(f"mined negatives vs pairs only: {gain:+.2f} on the 7-task average")
    return "\n".join(lines), stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="max optimiser steps per run (default: one epoch)")
    parser.add_argument("--eval-steps", type=int, default=25, help="STS-B dev every N steps (and at the end)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "mining")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_run(args.threads)

    from simcse_kit.experiments import parse_seeds

    args.seeds = parse_seeds(args.seeds)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = {}
    for name in args.configs:
        logger.info("=== %s", name)
        rows[name] = run_config(name, args, args.output_dir)
    table, stats = markdown(rows)
    budget = f"steps={args.steps or 'one epoch'}, eval_steps={args.eval_steps}"
    header = f"STS Spearman x 100, mean ± sample std over seeds {args.seeds} ({budget}); {time.perf_counter() - start:.0f} s"
    print(header + "\n\n" + table)
    (args.output_dir / "mining.md").write_text(header + "\n\n" + table + "\n", encoding="utf-8")
    meta = {"machine": machine(), "seeds": args.seeds, "steps": args.steps}
    (args.output_dir / "mining.json").write_text(json.dumps(meta | {"results": stats}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
