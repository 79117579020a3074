"""Regenerate the speed tables of BENCHMARKS.md and README.md from the kept JSON.

Every number in a generated block comes from ``benchmarks/results/*.json`` (written by the
benchmark scripts, kept in the repository), so a table and its data cannot drift apart:
``tests/test_benchmark_report.py`` runs ``--check`` and fails when a block differs from what
the JSON gives. A block sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``
and is replaced whole; edit the JSON's producer, never the block.

Usage::

    .venv/bin/python -m benchmarks.report            # rewrite the blocks
    .venv/bin/python -m benchmarks.report --check    # exit 1 if any block is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# CPU classes in the order the tables list them.
CLASS_ORDER = ("avx2", "avx2-limited", "avx512_bf16", "amx")
CLASS_TEXT = {
    "avx2": "AVX2 only (no native bf16)",
    "avx2-limited": "AVX2 kernels only (a newer CPU limited to AVX2 by "
    "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)",
    "avx512_bf16": "avx512_bf16 (native bf16 matmul, no AMX)",
    "amx": "AMX",
}


def throughput_records() -> list[dict[str, Any]]:
    """The kept training-throughput results, one per CPU class, in table order."""
    records = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("train_throughput-*.json"))]
    order = {name: i for i, name in enumerate(CLASS_ORDER)}
    return sorted(records, key=lambda r: order.get(r["machine"]["cpu_class"], len(order)))


def _cell(summary: dict[str, Any], variant: str) -> str:
    if variant not in summary:
        return "–"
    s = summary[variant]["sentences_per_s"]
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if not r else f"**{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f})"


def _decided(record: dict[str, Any]) -> str:
    auto = [x for x in record["runs"] if x["variant"] == "kit-auto"]
    if not auto:
        return "–"
    p = auto[0]["precision"]
    if p["mixed_precision"] == "no":
        return "fp32"
    extras = [name for name, on in (("bf16 weights", p["bf16_weights"]), ("fast dropout", p["fast_dropout"])) if on is True]
    return " + ".join([p["mixed_precision"], *extras])


def _busy(record: dict[str, Any]) -> str:
    busy = sum(1 for x in record["runs"] if x["activity"]["busy"])
    worst = max(x["activity"]["other_cpu_share"] for x in record["runs"])
    return f"{busy} of {len(record['runs'])} (max {100 * worst:.0f}% of the CPU)"


def throughput_table() -> str:
    rows = [
        "| CPU class | ST fp32 | ST bf16 | kit fp32 | kit bf16 | kit auto | auto decided | "
        "kit fp32 / ST fp32 | kit auto / ST best | runs busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for rec in throughput_records():
        m, s, r = rec["machine"], rec["summary"], rec["ratios"]
        best = r.get("st-best", "–")
        rows.append(
            f"| {m['cpu_class']} | {_cell(s, 'st-fp32')} | {_cell(s, 'st-bf16')} | {_cell(s, 'kit-fp32')} | "
            f"{_cell(s, 'kit-bf16')} | {_cell(s, 'kit-auto')} | {_decided(rec)} | {_ratio(r.get('kit-fp32/st-fp32'))} | "
            f"{_ratio(r.get('kit-auto/st-best'))} vs {best} | {_busy(rec)} |"
        )
        a = rec["args"]
        notes.append(
            f"- {m['cpu_class']}: {CLASS_TEXT.get(m['cpu_class'], m['cpu_class'])}; {m['cpu']}, {a['threads']} threads, "
            f"{a['rounds']} rounds x {a['steps']} steps (after {a['warmup']}), commit {m['commit']}, {m['date_utc']}; "
            f"torch {m['versions']['torch']}, sentence-transformers {m['versions']['sentence-transformers']}; "
            f"`{_command(a)}`"
        )
    return "\n".join(
        [
            "Sentences/s, median of the rounds (range in brackets); ratios are taken within each round "
            "(paired) and summarised the same way. Unsup SimCSE, all-MiniLM-L6-v2, batch 64, max length 32, "
            "gradient clipping at 1.0 on both sides. \"ST best\" is the faster sentence-transformers setting "
            "measured on that CPU.",
            "",
            *rows,
            "",
            *notes,
        ]
    )


def _command(args: dict[str, Any]) -> str:
    parts = ["python -m benchmarks.train_throughput"]
    if args.get("isa") == "avx2":
        parts.append("--isa avx2")
    parts.append(f"--variants {args['variants']}")
    if args["rounds"] != 3:
        parts.append(f"--rounds {args['rounds']}")
    return " ".join(parts)


def headline() -> str:
    """The README's speed sentence per CPU class, like for like and against the best peer."""
    lines = []
    for rec in throughput_records():
        r = rec["ratios"]
        auto, fp32 = r.get("kit-auto/st-best"), r.get("kit-fp32/st-fp32")
        klass = rec["machine"]["cpu_class"]
        bits = []
        if auto:
            bits.append(
                f"the recipe (`auto` → {_decided(rec)}) trains at **{auto['median']:.2f}x** sentence-transformers' "
                f"faster setting there ({r['st-best'].replace('st-', '')})"
            )
        if fp32:
            bits.append(f"fp32 against fp32 **{fp32['median']:.2f}x**")
        n = rec["args"]["rounds"]
        lines.append(f"- {CLASS_TEXT.get(klass, klass).split(' (')[0]}: " + "; ".join(bits) + f" (median of {n} paired rounds).")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"train-throughput": throughput_table, "speed-headline": headline}
FILES = (REPO / "BENCHMARKS.md", REPO / "README.md")


def render(text: str) -> str:
    """``text`` with every generated block replaced by what the JSON gives now."""
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check: exit 1 where a block is stale")
    args = parser.parse_args()
    stale = []
    for path in FILES:
        old = path.read_text()
        new = render(old)
        if new != old:
            stale.append(path.name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale generated blocks in {', '.join(stale)}: run python -m benchmarks.report", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
