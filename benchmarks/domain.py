"""Domain adaptation (issue 16): unsupervised SimCSE on a domain's own unlabelled sentences.

For each domain (``--domains``: ``sick``, ``stsb``) the default model is trained by
``train/domain/<domain>.yaml`` (the distinct sentences of the domain's training split,
scores unused; checkpoint selection on the domain's dev split, the untouched model at
step 0 included) and compared, on the domain's test set, on the 7-task average and on
the built-in retrieval tasks (nDCG@10 of the selected model, issue 27), with:

* ``base``: the default model untouched (one evaluation, shared by both domains);
* simcse-kit variants (``--variants``, default ``domain`` only; the others are chosen
  explicitly): ``<d>-domain``, the recipe as is; ``<d>-wiki``, the same budget on the
  general corpus (wiki1m_head), same dev selection; ``<d>-domain-rep``, + ESimCSE word
  repetition (``data.word_repetition`` 0.32); ``<d>-mix50``, the domain sentences with
  wiki1m_head making up half the set; ``<d>-tau0.1`` (temperature 0.1) and
  ``<d>-fnt0.8`` (in-batch negatives whose cosine with the anchor exceeds 0.8 dropped,
  ``loss.false_negative_threshold``);
* sentence-transformers peers (``--peers``, default all three; ``none`` to skip), trained
  by ``st_peers.py`` on the SAME domain sentences with the recipe's budget (one epoch,
  batch 64, max length 32) and the same dev selection and final evaluators:
  ``<d>-st-mnrl`` (MultipleNegativesRankingLoss on (s, s), ST's unsupervised SimCSE),
  ``<d>-st-tsdae`` (DenoisingAutoEncoderLoss, TSDAE's deletion noise split on
  whitespace: no nltk here) and ``<d>-st-ct`` (ContrastiveTensionLossInBatchNegatives).
  ``--st-precision auto`` (default): ``bf16=True`` on a GPU, fp32 (its own default) on a
  CPU; the kit's recipes say ``auto`` (bf16 on a GPU and where a CPU computes it natively).

The learning rate is tuned alike for every row, kit or peer (issue 22): first a sweep,
each row at each of ``--learning-rates`` for one seed (``--sweep-seed``), dev only (no test
table: ``OUTPUT_DIR/sweep/<row>/lr<rate>/``); the rate whose run has the best dev score of
the selected model is chosen (``table_runs.choose_learning_rate``: ties, as when every
rate keeps the untouched model, go to the best trained checkpoint's dev score); then the
row runs ``--seeds`` at that rate into ``OUTPUT_DIR/<row>/lr<rate>/seed-N``. A single
learning rate skips the sweep.

A finished run is reused (a command stopped by a time limit continues where it was);
``--parallel N`` makes N runs at once, each in a fresh interpreter logging to
``OUTPUT_DIR/logs/`` (on CUDA all on the GPU; ``--threads`` each). The data root:
``--data-root``, else ``SIMCSE_KIT_DATA``, else ``../shared/data``; every path (domain
data, dev, the STS table, the retrieval tasks built into ``OUTPUT_DIR/retrieval-tasks``)
is read under it. The markdown table (mean ± sample std; the chosen learning rate; the
best step, where 0 means the untouched model was kept) and the sweep's dev scores are
printed and saved with the raw numbers in ``OUTPUT_DIR/domain.{md,json}``. Below the
table, per domain: the simcse-kit row with the best mean dev score (never chosen on
test), its gain on the domain's test over ``base`` and over the best peer (the peer with
the highest domain-test mean: the hardest comparison), against the issue's goals (>= +1.0
over base, >= +0.5 over the best peer). ``--eval-data-dir`` swaps the STS folder of the
final table (smoke tests; the dev split stays the recipe's).

Usage::

    .venv/bin/python -m benchmarks.domain                      # sweep + 3 seeds, both domains: many hours on 2 cores
    .venv/bin/python -m benchmarks.domain --variants domain tau0.1 fnt0.8 --peers none
    .venv/bin/python -m benchmarks.domain --domains sick --seeds 1 --learning-rates 3e-5 --max-steps 20 --peers mnrl   # smoke
    # the one-seed dev-only sweep of SWEEP's variants at the recipe's learning rate (~30 min on 2 cores)
    .venv/bin/python -m benchmarks.domain --dev-only --seeds 1
    # a GPU box, the data carried into the repo's .devdata/
    python -m benchmarks.domain --data-root .devdata --parallel 8 --output-dir runs/gpu-tables/domain
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, setup_run
from benchmarks.st_peers import LOSSES, dev_curve, resolve_precision
from benchmarks.table_runs import (
    Job,
    add_sweep_options,
    add_table_options,
    prepare_tables,
    retrieval_keys,
    sweep_and_run,
    table_job,
    table_meta,
)

TARGET = {"sick": "SICKRelatedness", "stsb": "STSBenchmark"}  # the domain's test column of the STS table
WIKI = "{data_root}/train/wiki1m_head.txt"  # resolved against the data root by load_config
VARIANTS: dict[str, dict[str, str]] = {
    "wiki": {"train_file": WIKI, "train_format": "auto"},
    "domain": {},
    "domain-rep": {"word_repetition": "0.32"},
    "mix50": {"mix_file": WIKI, "mix_ratio": "0.5"},
    "tau0.1": {"temperature": "0.1"},
    **{f"fnt{t}": {"false_negative_threshold": t} for t in ("0.9", "0.8", "0.7", "0.6", "0.5")},
    "tau0.2": {"temperature": "0.2"},
}
# The one-seed dev-only sweep (--dev-only) behind the choice of rows; see BENCHMARKS.md.
# (Its "lr1e-5" variant is gone: every row's learning rate is now swept, --learning-rates.)
SWEEP = ("fnt0.9", "fnt0.8", "fnt0.7", "fnt0.6", "fnt0.5", "tau0.1", "tau0.2", "domain-rep", "mix50")
GOAL_OVER_BASE, GOAL_OVER_PEER = 1.0, 0.5  # issue 16: domain-test gains of the dev-selected kit row

logger = logging.getLogger("domain")

Rows = dict[str, tuple[str, str, dict[int, dict[str, float]]]]  # name -> (domain, kind, per-seed tables)


def recipe(domain: str) -> Path:
    return REPO / "train" / "domain" / f"{domain}.yaml"


def domain_overrides(overrides: dict[str, str], args: argparse.Namespace) -> dict[str, str]:
    """``overrides`` with this command's budget, data root and STS folder."""
    opts = overrides | {"eval_steps": str(args.eval_steps), "progress_bar": "false", "data_root": str(args.data_root)}
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    if args.eval_data_dir is not None:  # only when set: the finished runs' configs stay equal
        opts["eval_data_dir"] = str(args.eval_data_dir)
    return opts


def domain_config(domain: str, overrides: dict[str, str], args: argparse.Namespace, out: Path) -> Any:
    """The domain recipe with ``overrides``, this run's budget and output folder."""
    from simcse_kit.config import load_config

    return load_config(recipe(domain), domain_overrides(overrides, args) | {"output_dir": str(out)})


def row_job(domain: str, row: str, lr: float, seed: int, sweep: bool, args: argparse.Namespace) -> Job:
    """The run of ``row`` (a kit variant, or ``st-<loss>``: a peer on the recipe as is) at
    learning rate ``lr``: one seed of the dev-only sweep, or of the table."""
    peer = row.removeprefix("st-") if row.startswith("st-") else ""
    overrides = domain_overrides(({} if peer else VARIANTS[row]) | {"learning_rate": str(lr)}, args)
    return table_job(f"{domain}-{row}", lr, seed, sweep, args, recipe(domain), overrides, peer)


def cell(mean: dict[str, float], std: dict[str, float], key: str, n: int) -> str:
    if key not in mean:
        return "–"
    return f"{mean[key]:.2f} ± {std[key]:.2f}" if n > 1 else f"{mean[key]:.2f}"


def best_step_cell(per_seed: dict[int, dict[str, float]]) -> str:
    """Mean best step, with each seed's when there are several (a mean of 0 and 75 hides a kept base model)."""
    steps = [t["best_step"] for t in per_seed.values() if "best_step" in t]
    if len(steps) != len(per_seed) or not steps:
        return "–"
    mean = f"{sum(steps) / len(steps):.0f}"
    return mean if len(steps) == 1 else f"{mean} ({', '.join(f'{s:.0f}' for s in steps)})"


def dev_only(args: argparse.Namespace) -> str:
    """Each variant on each domain with ``train.final_eval`` off (training and dev
    evaluations only) into ``OUTPUT_DIR/sweep/<d>-<variant>/seed-N``; the dev table."""
    from simcse_kit.experiments import run_seeds
    from simcse_kit.selection import dev_selection

    lines = [
        "| domain | variant | seed | dev at step 0 | dev: best trained | dev: end | best step | masked negatives |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for domain in args.domains:
        for variant in (v for v in args.variants if v != "none"):
            out = args.output_dir / "sweep" / f"{domain}-{variant}"
            logger.info("=== dev only: %s-%s", domain, variant)
            run_seeds(domain_config(domain, VARIANTS[variant] | {"final_eval": "false"}, args, out), args.seeds)
            for seed in args.seeds:
                metrics = json.loads((out / f"seed-{seed}" / "metrics.json").read_text(encoding="utf-8"))
                curve, at_start = dev_curve(metrics), metrics["evals"][0][dev_selection(metrics).metric]
                lines.append(
                    f"| {domain} | {variant} | {seed} | {at_start:.2f} | {curve['dev_trained']:.2f} | "
                    f"{curve['dev_end']:.2f} | {metrics['best_step']} | {metrics['masked_negatives']} |"
                )
    return "\n".join(lines)


def markdown(rows: Rows, lrs: dict[str, float] | None = None) -> tuple[str, dict[str, Any]]:
    """The domain table (``lrs``: each row's learning rate, chosen on dev) and its raw numbers."""
    from simcse_kit.experiments import aggregate

    lrs = lrs or {}
    stats: dict[str, Any] = {}
    for name, (domain, kind, per_seed) in rows.items():
        mean, std = aggregate(list(per_seed.values()))
        stats[name] = {
            "domain": domain,
            "kind": kind,
            "target": TARGET[domain],
            "learning_rate": lrs.get(name),
            "mean": mean,
            "std": std,
            "per_seed": {str(k): v for k, v in per_seed.items()},
        }
    retrieval = retrieval_keys(stats)
    head = ["config", "lr", "seeds", "domain test", "7-task avg", "dev (selection)", "best step", "dev: best trained", "dev: end"]
    head += [f"nDCG@10 {k.removeprefix('retrieval:')}" for k in retrieval]
    timed = any("train_seconds" in s["mean"] for s in stats.values())  # training time, where the runs recorded it
    head += ["train s"] if timed else []
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, (domain, _, per_seed) in rows.items():
        target, mean, std, n = TARGET[domain], stats[name]["mean"], stats[name]["std"], len(per_seed)
        cells = [cell(mean, std, k, n) for k in (target, "avg", "best_stsb_dev")]
        curve = [cell(mean, std, k, n) for k in ("dev_trained", "dev_end", *retrieval, *(["train_seconds"] if timed else []))]
        lr = f"{lrs[name]:g}" if name in lrs else "–"
        lines.append(
            f"| {name} ({target}) | {lr} | {n} | "
            + " | ".join(cells)
            + f" | {best_step_cell(per_seed)} | "
            + " | ".join(curve)
            + " |"
        )
    for domain in dict.fromkeys(domain for domain, _, _ in rows.values()):
        line, summary = selection(domain, stats)
        if line:
            lines += ["", line]
            stats[f"selection_{domain}"] = summary
    return "\n".join(lines), stats


def sweep_markdown(sweep: dict[str, dict[float, dict[str, float]]], chosen: dict[str, float]) -> str:
    """The learning-rate sweep: each row's dev score of the selected model (and of the
    best trained checkpoint) per learning rate, and the rate chosen on it."""
    rates = list(dict.fromkeys(lr for by_lr in sweep.values() for lr in by_lr))
    lines = [
        "| row | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | chosen |",
        "|---|" + "---:|" * (len(rates) + 1),
    ]
    for name, by_lr in sweep.items():
        cells = [
            f"{by_lr[lr]['best_stsb_dev']:.2f} ({by_lr[lr].get('dev_trained', float('nan')):.2f})" if lr in by_lr else "–"
            for lr in rates
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {chosen[name]:g} |")
    return "\n".join(lines)


def selection(domain: str, stats: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The kit row chosen on dev, and its domain-test gains over base and the best peer."""
    target = TARGET[domain]
    of = {name: s for name, s in stats.items() if s.get("domain") == domain}
    kit = {name: s for name, s in of.items() if s["kind"] == "kit"}
    peers = {name: s for name, s in of.items() if s["kind"] == "st"}
    base = next((s for s in of.values() if s["kind"] == "base"), None)
    if not kit or base is None:
        return "", {}
    # Chosen on the dev split (mean over seeds), as the recipe selects checkpoints; never on test.
    best = max(kit, key=lambda n: kit[n]["mean"]["best_stsb_dev"])
    score = kit[best]["mean"][target]
    over_base = score - base["mean"][target]
    summary: dict[str, Any] = {"best_on_dev": best, "gain_over_base": over_base, "meets_base_goal": over_base >= GOAL_OVER_BASE}
    line = (
        f"{domain}: best simcse-kit row on dev `{best}` (dev {kit[best]['mean']['best_stsb_dev']:.2f}): {target} "
        f"{score:.2f}, {over_base:+.2f} over base {base['mean'][target]:.2f} "
        f"({'meets' if over_base >= GOAL_OVER_BASE else 'does NOT meet'} the +{GOAL_OVER_BASE:.1f} goal)"
    )
    if peers:
        # The strongest peer on the domain test: the hardest comparison for the kit row.
        peer = max(peers, key=lambda n: peers[n]["mean"][target])
        over_peer = score - peers[peer]["mean"][target]
        summary |= {"best_peer": peer, "gain_over_peer": over_peer, "meets_peer_goal": over_peer >= GOAL_OVER_PEER}
        verdict = "meets" if over_peer >= GOAL_OVER_PEER else "does NOT meet"
        line += (
            f", {over_peer:+.2f} over the best peer `{peer}` {peers[peer]['mean'][target]:.2f} "
            f"({verdict} the +{GOAL_OVER_PEER:.1f} goal)"
        )
    else:
        line += "; no sentence-transformers peer in this table"
    avg_change = kit[best]["mean"]["avg"] - base["mean"]["avg"]
    summary["avg_change_over_base"] = avg_change
    return line + f"; 7-task average {kit[best]['mean']['avg']:.2f} ({avg_change:+.2f} vs base)", summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", nargs="+", default=list(TARGET), choices=list(TARGET))
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=[*VARIANTS, "none"],
        help="simcse-kit rows (none: peers only); default: domain, or with --dev-only the sweep's",
    )
    parser.add_argument(
        "--peers",
        nargs="+",
        default=list(LOSSES[:3]),
        choices=[*LOSSES[:3], "none"],
        help="sentence-transformers rows (none: skip)",
    )
    add_sweep_options(parser)
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "domain")
    parser.add_argument(
        "--dev-only", action="store_true", help="the variants without the final table: dev curves only (a cheap sweep)"
    )
    add_table_options(parser)
    args = parser.parse_args()
    if args.variants is None:
        args.variants = list(SWEEP) if args.dev_only else ["domain"]
    peers = [] if "none" in args.peers else list(dict.fromkeys(args.peers))
    setup_run(args.threads)

    from simcse_kit.experiments import parse_seeds, parse_values

    prepare_tables(args)
    args.seeds = parse_seeds(args.seeds)
    start = time.perf_counter()
    if args.dev_only:
        table = dev_only(args)
        print(f"dev only, seeds {args.seeds}; {time.perf_counter() - start:.0f} s\n\n{table}")
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "sweep.md").write_text(table + "\n", encoding="utf-8")
        return
    names = args.task_names
    lrs = parse_values("learning rate", args.learning_rates)
    logs = args.output_dir / "logs"
    row_names = {
        f"{d}-{r}": (d, r)
        for d in args.domains
        for r in [*(v for v in args.variants if v != "none"), *(f"st-{p}" for p in peers)]
    }
    senteval = str(args.eval_data_dir or args.data_root / "senteval")
    base = Job(name="base", kind="base", out=str(args.output_dir / "base"), retrieval=tuple(args.tasks), eval_data_dir=senteval)
    made = sweep_and_run(
        {name: functools.partial(row_job, d, r, args=args) for name, (d, r) in row_names.items()}, lrs, args, [base]
    )
    chosen, sweep = made.chosen, made.sweep
    rows: Rows = {}
    for domain in args.domains:
        if "base" in made.extra:
            rows[f"{domain}-base"] = (domain, "base", {0: made.extra["base"]})
        for name, per_seed in made.rows.items():
            d, r = row_names[name]
            if d == domain:
                rows[name] = (domain, "st" if r.startswith("st-") else "kit", per_seed)
    table, stats = markdown(rows, chosen)
    precision = resolve_precision(args.st_precision)
    budget = f"steps={args.steps or 'one epoch'}, eval_steps={args.eval_steps}, sentence-transformers in {precision}"
    header = (
        f"STS Spearman x 100 and retrieval nDCG@10 x 100 ({', '.join(names) or 'no task'}), mean ± sample std over "
        f"seeds {args.seeds} ({budget}); "
        + (
            f"every row's learning rate chosen from {[f'{lr:g}' for lr in lrs]} on dev (seed {args.sweep_seed}, dev only)"
            if len(lrs) > 1
            else f"learning rate {lrs[0]:g} for every row (no sweep)"
        )
        + f"; {time.perf_counter() - start:.0f} s"
    )
    sweep_table = sweep_markdown(sweep, chosen) if len(lrs) > 1 else ""
    if made.lost:
        sweep_table += f"\n\nRuns that FAILED, left out (logs in {logs}): {', '.join(made.lost)}"
    text = (
        header
        + "\n\n"
        + table
        + (
            "\n\nThe learning-rate sweep (dev of the selected model; in brackets, of the best trained checkpoint):\n\n"
            + sweep_table
            if sweep_table
            else ""
        )
    )
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "domain.md").write_text(text + "\n", encoding="utf-8")
    meta = table_meta(args) | {
        "st_precision": precision,
        "learning_rates": lrs,
        "chosen_learning_rates": chosen,
        "sweep": {name: {f"{lr:g}": t for lr, t in by_lr.items()} for name, by_lr in sweep.items()},
    }
    (args.output_dir / "domain.json").write_text(json.dumps(meta | {"results": stats}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
