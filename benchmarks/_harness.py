"""The options, start and kept JSON that every harness script shares (on top of ``_common``).

Variants alternate over ``--rounds`` in fresh interpreters; a busy machine is refused unless ``--allow-busy``;
every round is kept in ``results/<script>-<cpu class>.json`` for ``report.py``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import (
    ISA_LIMITS,
    REPO,
    add_allow_dirty,
    check_quiet,
    cpu_class,
    cpu_flags,
    machine,
    refuse_dirty,
    save_results,
    spread,
)

RESULTS = REPO / "benchmarks" / "results"


def add_options(parser: argparse.ArgumentParser, name: str, rounds: int = 3) -> None:
    """``--rounds``, ``--isa``, ``--allow-busy``, ``--json`` and the workers' hidden
    ``--worker`` / ``--offset`` (the round, for scripts that draw fresh data per round)."""
    parser.add_argument("--rounds", type=int, default=rounds, help="alternations of all variants (>= 3 for a kept result)")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native", help="avx2: limit the kernels to AVX2")
    parser.add_argument("--allow-busy", action="store_true", help="run on a busy machine; rounds are flagged")
    parser.add_argument("--json", type=Path, default=None, help=f"default: benchmarks/results/{name}-<cpu class>.json")
    add_allow_dirty(parser)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)


def chosen(parser: argparse.ArgumentParser, text: str, allowed: tuple[str, ...] | list[str]) -> list[str]:
    """The comma-separated variants of ``text``, in order."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(allowed)}")
    return names


def forwarded(args: argparse.Namespace, *options: str) -> list[str]:
    """``--option=value`` for each of ``options`` (dashed names), as the workers get them."""
    return [f"--{name}={getattr(args, name.replace('-', '_'))}" for name in options]


def start(args: argparse.Namespace) -> dict[str, str]:
    """Refuse a busy machine (unless ``--allow-busy``)."""
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.worker is None:  # the parent writes the record: refuse a dirty tree before the rounds
        refuse_dirty(args.allow_dirty)
    check_quiet(args.allow_busy)
    return dict(ISA_LIMITS) if args.isa == "avx2" else {}


def keep(name: str, args: argparse.Namespace, record: dict[str, Any], stem: str = "") -> Path:
    """Write ``record`` with the machine and the arguments to ``--json`` or ``benchmarks/results/<stem>-<cpu class>.json``
    (``stem``: the kept results' name where a script keeps two kinds; default ``name``)."""
    _, flags = cpu_flags()
    klass = "avx2-limited" if args.isa == "avx2" else cpu_class(flags)
    info = machine() | ({"cpu_class": klass, "kernel_limits": ISA_LIMITS} if args.isa == "avx2" else {})
    info["torch_threads"] = args.threads  # the workers' (this process never set its own)
    stem = stem or name
    out = args.json or RESULTS / f"{stem}-{klass}.json"
    command = " ".join(["python -m benchmarks." + name, shlex.join(sys.argv[1:])]).strip()
    full = {"machine": info, "args": vars(args), "command": command, **record}
    save_results(out, full, allow_dirty=args.allow_dirty)
    from benchmarks import report  # the summary is the table BENCHMARKS.md will show

    for spec in (s for s in report.SPECS if s.script == stem):
        print("\n".join(report.md_table(spec.head, spec.rows(full))))
    return out


def values(runs: list[dict[str, Any]], variant: str, key: str) -> list[float]:
    """``key`` of every round of ``variant``, in round order."""
    return [x[key] for x in runs if x["variant"] == variant]


def summary_of(runs: list[dict[str, Any]], variants: list[str], keys: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per variant, :func:`_common.spread` of each of ``keys`` over its rounds."""
    return {v: {k: spread(values(runs, v, k)) for k in keys} for v in variants}


def difference(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """``median(ours) - median(theirs)`` and whether it exceeds the run-to-run spread."""
    a, b = spread(ours), spread(theirs)
    diff = a["median"] - b["median"]
    noise = max(a["max"] - a["min"], b["max"] - b["min"])
    if min(len(ours), len(theirs)) < 2:
        verdict = "spread not measured (1 round)"
    elif abs(diff) <= noise:
        verdict = "within spread"
    else:
        verdict = "higher" if diff > 0 else "lower"
    return {"difference": diff, "spread": noise, "ratio": a["median"] / b["median"], "verdict": verdict}
