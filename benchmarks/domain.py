"""Domain adaptation (issue 16): unsupervised SimCSE on a domain's own unlabelled sentences.

For each domain (``--domains``: ``sick``, ``stsb``) the default model is trained by
``train/domain/<domain>.yaml`` (the distinct sentences of the domain's training split,
scores unused; checkpoint selection on the domain's dev split) and compared, on the
domain's test set and on the 7-task average, with:

* ``base``: the default model untouched (one evaluation, shared by both domains);
* ``<d>-wiki``: the same budget on the general corpus (wiki1m_head), same dev selection;
* ``<d>-domain``: the recipe as is;
* ``<d>-domain-rep``: + ESimCSE word repetition (``data.word_repetition`` 0.32);
* ``<d>-mix50``: the domain sentences with wiki1m_head making up half the set.

Each configuration runs ``--seeds`` (default 1,2,3) into ``OUTPUT_DIR/<config>/seed-N``
(a finished seed is reused); the markdown table (mean ± sample std) is printed and
saved with the raw numbers in ``OUTPUT_DIR/domain.{md,json}``.

Usage::

    .venv/bin/python benchmarks/domain.py                      # 3 seeds, both domains: hours on 2 cores
    .venv/bin/python benchmarks/domain.py --domains sick --seeds 1 --steps 20   # smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, WIKI, machine, setup_run  # noqa: E402
from results import run_base  # noqa: E402

TARGET = {"sick": "SICKRelatedness", "stsb": "STSBenchmark"}  # the domain's test column of the STS table
VARIANTS: dict[str, dict[str, str]] = {
    "wiki": {"train_file": str(WIKI), "train_format": "auto"},
    "domain": {},
    "domain-rep": {"word_repetition": "0.32"},
    "mix50": {"mix_file": str(WIKI), "mix_ratio": "0.5"},
}

logger = logging.getLogger("domain")


def run_variant(domain: str, overrides: dict[str, str], args: argparse.Namespace, out: Path) -> dict[int, dict[str, float]]:
    from simcse_kit.config import load_config
    from simcse_kit.experiments import run_seeds

    opts = overrides | {"output_dir": str(out), "eval_steps": str(args.eval_steps), "progress_bar": "false"}
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    cfg = load_config(REPO / "train" / "domain" / f"{domain}.yaml", opts)
    summary = run_seeds(cfg, args.seeds, quiet=True)
    return {int(s): t for s, t in summary["per_seed"].items()}


def markdown(rows: dict[str, tuple[str, dict[int, dict[str, float]]]]) -> tuple[str, dict[str, Any]]:
    from simcse_kit.experiments import aggregate

    lines = ["| config | seeds | domain test | 7-task avg | dev (selection) |", "|---|---:|---:|---:|---:|"]
    stats: dict[str, Any] = {}
    for name, (target, per_seed) in rows.items():
        mean, std = aggregate(list(per_seed.values()))
        stats[name] = {"target": target, "mean": mean, "std": std, "per_seed": {str(k): v for k, v in per_seed.items()}}
        cells = [
            "–" if k not in mean else f"{mean[k]:.2f} ± {std[k]:.2f}" if len(per_seed) > 1 else f"{mean[k]:.2f}"
            for k in (target, "avg", "best_stsb_dev")
        ]
        lines.append(f"| {name} ({target}) | {len(per_seed)} | " + " | ".join(cells) + " |")
    return "\n".join(lines), stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", nargs="+", default=list(TARGET), choices=list(TARGET))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="max optimiser steps per run (default: the recipe's epoch)")
    parser.add_argument("--eval-steps", type=int, default=25, help="dev every N steps (and at the end)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "domain")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_run(args.threads)

    from simcse_kit.experiments import parse_seeds

    args.seeds = parse_seeds(args.seeds)
    start = time.perf_counter()
    rows: dict[str, tuple[str, dict[int, dict[str, float]]]] = {}
    base = run_base(args, args.output_dir / "base")
    for domain in args.domains:
        rows[f"{domain}-base"] = (TARGET[domain], base)
        for variant in args.variants:
            name = f"{domain}-{variant}"
            logger.info("=== %s", name)
            rows[name] = (TARGET[domain], run_variant(domain, VARIANTS[variant], args, args.output_dir / name))
    table, stats = markdown(rows)
    budget = f"steps={args.steps or 'one epoch'}, eval_steps={args.eval_steps}"
    header = f"STS Spearman x 100, mean ± sample std over seeds {args.seeds} ({budget}); {time.perf_counter() - start:.0f} s"
    print(header + "\n\n" + table)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "domain.md").write_text(header + "\n\n" + table + "\n", encoding="utf-8")
    meta = {"machine": machine(), "seeds": args.seeds, "steps": args.steps}
    (args.output_dir / "domain.json").write_text(json.dumps(meta | {"results": stats}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
