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


def records(script: str) -> list[dict[str, Any]]:
    """The kept results of benchmark ``script`` (``benchmarks/results/<script>-<cpu class>.json``),
    one per CPU class, in table order."""
    kept = [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"{script}-*.json"))]
    order = {name: i for i, name in enumerate(CLASS_ORDER)}
    return sorted(kept, key=lambda r: order.get(r["machine"]["cpu_class"], len(order)))


def throughput_records() -> list[dict[str, Any]]:
    """The kept training-throughput results, one per CPU class, in table order."""
    return records("train_throughput")


def _cell(summary: dict[str, Any], variant: str) -> str:
    if variant not in summary:
        return "–"
    s = summary[variant]["sentences_per_s"]
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if not r else f"**{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f})"


def _decided(record: dict[str, Any]) -> str:
    auto = [x for x in record["runs"] if x["variant"] == "kit-auto"]
    return _precision(auto[0]["precision"]) if auto else "–"


def _precision(p: dict[str, Any]) -> str:
    """``fp32``, or ``bf16`` with what comes with it (``+ bf16 weights + fast dropout``)."""
    if p["mixed_precision"] == "no":
        return "fp32"
    extras = [
        name for name, on in (("bf16 weights", p.get("bf16_weights")), ("fast dropout", p.get("fast_dropout"))) if on is True
    ]
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
            'gradient clipping at 1.0 on both sides. "ST best" is the faster sentence-transformers setting '
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


# --------------------------------------------------------------------------- the harness scripts' tables


def _range(s: dict[str, float] | None, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    """``median (min–max)`` of a :func:`_common.spread` summary, times ``scale``."""
    if not s:
        return "–"
    m, lo, hi = (scale * s[k] for k in ("median", "min", "max"))
    return f"{m:.{digits}f}{unit} ({lo:.{digits}f}–{hi:.{digits}f})"


def _claim(d: dict[str, Any]) -> str:
    """A difference with its spread and verdict: ``+12 MiB (spread 40): within spread``."""
    return f"{d['difference']:+.0f} MiB (spread {d['spread']:.0f}): {d['verdict']}"


def _note(rec: dict[str, Any], script: str, extra: str = "") -> str:
    """The line under a table: the CPU class, machine, rounds, commit, date, versions and command."""
    m, a = rec["machine"], rec["args"]
    command = rec.get("command") or f"python -m benchmarks.{script}"
    return (
        f"- {m['cpu_class']}: {CLASS_TEXT.get(m['cpu_class'], m['cpu_class'])}; {m['cpu']}, {a['threads']} threads, "
        f"{a['rounds']} rounds{extra}, commit {m['commit']}, {m['date_utc']}; torch {m['versions']['torch']}; `{command}`"
    )


def _missing(script: str) -> str:
    return (
        f"Not measured under the harness yet: no `benchmarks/results/{script}-*.json`. "
        f"`python -m benchmarks.{script}` on a quiet machine keeps one; `python -m benchmarks.report` then fills this block."
    )


def _variants(rec: dict[str, Any]) -> list[str]:
    return list(rec["summary"])


def _first(rec: dict[str, Any], variant: str) -> dict[str, Any]:
    """The first kept round of ``variant``."""
    return next(x for x in rec["runs"] if x["variant"] == variant)


def flops_table() -> str:
    kept = records("flops")
    if not kept:
        return _missing("flops")
    rows = [
        "| CPU class | variant | precision | GFLOP/s | share of its peak | bf16 peak GFLOP/s | fp32 peak GFLOP/s | runs busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec in kept:
        s, klass = rec["summary"], rec["machine"]["cpu_class"]
        peaks = [_range(s.get(p, {}).get("gflops"), 0) for p in ("peak-bf16", "peak-fp32")]
        for v in (v for v in _variants(rec) if v.startswith("kit-")):
            own = s[v]["own_peak"].removeprefix("peak-")
            share = s[v]["share_of_own_peak"]
            share_text = (
                f"**{100 * share['median']:.1f}%** of {own} ({100 * share['min']:.1f}–{100 * share['max']:.1f}%)"
                if share
                else f"– ({own} peak not measured)"
            )
            rows.append(
                f"| {klass} | {v} | {_precision(s[v]['precision'])} | {_range(s[v]['gflops'], 0)} | {share_text} | "
                f"{peaks[0]} | {peaks[1]} | {_busy(rec)} |"
            )
    a = kept[0]["args"]
    return "\n".join(
        [
            f"Matmul GFLOP/s of the training loop as a run executes it (the unsup recipe, batch {a['batch_size']}, max length "
            f"{a['max_seq_len']}, a fresh batch of wiki1m_head every step, packed as the run packs it; FLOPs counted on "
            "exactly the measured batches), and its share of the matmul peak of the precision it ran in "
            f"({a['n']}^3, measured in the same round): the real run's share of the peak. Median of the rounds (range).",
            "",
            *rows,
            "",
            *(_note(r, "flops", f" x {r['args']['steps']} steps (after {r['args']['warmup']})") for r in kept),
        ]
    )


BOUNDS = ("bound_only_matmul_ms", "bound_matmul_at_peak_ms")


def profile_table() -> str:
    kept = records("profile_step")
    if not kept:
        return _missing("profile_step")
    rows = [
        "| CPU class | setting | precision | step ms | matmul/linear share of the step | matmul kernels, % of bf16 peak "
        "| whole step, % of bf16 peak | bound: all but matmul free | bound: matmuls at the peak | runs busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in kept:
        klass = rec["machine"]["cpu_class"]
        for setting, s in rec["summary"].items():
            step = s["median_ms"]["median"]
            bounds = [
                f"{s[k]['median']:.0f} ms ({step / s[k]['median']:.2f}x)"
                for k in ("bound_only_matmul_ms", "bound_matmul_at_peak_ms")
            ]
            rows.append(
                f"| {klass} | {setting} | {_precision(s['precision'])} | {_range(s['median_ms'], 0)} | "
                f"{_range(s['share_matmul/linear'], 1, 100, '%')} | {_range(s['matmul_fraction_of_peak'], 1, 100, '%')} | "
                f"{_range(s['step_fraction_of_peak'], 1, 100, '%')} (steady state) | {bounds[0]} | {bounds[1]} | {_busy(rec)} |"
            )
    return "\n".join(
        [
            f"One training step by operator class (`torch.profiler`), a **steady state**: "
            f"{kept[0]['figure'].removeprefix('steady state: ')}. "
            "Median of the rounds (range); shares of the bf16 matmul peak measured in the same round; the bounds are "
            "the step time if every class but matmul/linear cost nothing, and if the product kernels ran at the peak.",
            "",
            *rows,
            "",
            *(_note(r, "profile_step", f", batch {r['args']['batch_size']}, length {r['args']['max_seq_len']}") for r in kept),
        ]
    )


def encode_table() -> str:
    kept = records("encode_throughput")
    if not kept:
        return _missing("encode_throughput")
    rows = ["| CPU class | variant | sentences/s | STS-B test | min cosine vs st-fp32 | runs busy |", "|---|---|---|---|---|---|"]
    ratios = ["| CPU class | ratio (paired by round) | median (range) |", "|---|---|---|"]
    for rec in kept:
        klass = rec["machine"]["cpu_class"]
        for v, s in rec["summary"].items():
            cos = f"{s['min_cos_vs_st_fp32']['min']:.5f}" if "min_cos_vs_st_fp32" in s else "–"
            rows.append(
                f"| {klass} | {v} | {_range(s['sentences_per_s'])} | {s['stsb_test']['median']:.2f} | {cos} | {_busy(rec)} |"
            )
        for name, r in rec["ratios"].items():
            if r:
                ratios.append(f"| {klass} | {name} | **{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f}) |")
    a = kept[0]["args"]
    return "\n".join(
        [
            f"Encoding throughput on the STS-B dev + test sentences, batch {a['batch_size']}, max length {a['max_seq_len']}: "
            "sentences/s, median of the rounds (range); the smallest cosine over the rounds with st-fp32's vectors.",
            "",
            *rows,
            "",
            *ratios,
            "",
            *(_note(r, "encode_throughput") for r in kept),
        ]
    )


def memory_table() -> str:
    kept = records("memory")
    if not kept:
        return _missing("memory")
    rows = ["| CPU class | point | peak RSS MiB | sentences/s | runs busy |", "|---|---|---|---|---|"]
    claims = ["| CPU class | difference | peak RSS |", "|---|---|---|"]
    for rec in kept:
        klass = rec["machine"]["cpu_class"]
        for v, s in rec["summary"].items():
            rows.append(f"| {klass} | {v} | {_range(s['peak_rss_mib'], 0)} | {_range(s['sentences_per_s'])} | {_busy(rec)} |")
        claims += [f"| {klass} | {name} | {_claim(d)} |" for name, d in rec["comparisons"].items()]
    a = kept[0]["args"]
    return "\n".join(
        [
            f"Peak RSS of the unsup recipe's training loop ({a['precision']}, max length {a['max_seq_len']}) per batch: "
            f"`b<batch>` plain, `b<batch>-gc<chunk>` GradCache; median of the rounds (range). A difference is claimed "
            "only where it exceeds the run-to-run spread (the larger range of the two), else it is *within spread*.",
            "",
            *rows,
            "",
            *claims,
            "",
            *(_note(r, "memory") for r in kept),
        ]
    )


def gradcache_rss_table() -> str:
    kept = records("gradcache_rss")
    if not kept:
        return _missing("gradcache_rss")
    rows = [
        "| CPU class | variant | peak RSS MiB | RSS after the last step MiB | s/step | peak RSS vs default | after vs default |",
        "|---|---|---|---|---|---|---|",
    ]
    for rec in kept:
        klass, comp = rec["machine"]["cpu_class"], rec["comparisons"]
        for v, s in rec["summary"].items():
            c = comp.get(v)
            vs = [_claim(c[k]) if c else "–" for k in ("peak_rss_mib", "after_last_mib")]
            rows.append(
                f"| {klass} | {v} | {_range(s['peak_rss_mib'], 0)} | {_range(s['after_last_mib'], 0)} | "
                f"{_range(s['s_per_step'], 2)} | {vs[0]} | {vs[1]} |"
            )
    a = kept[0]["args"]
    chunks = f"GradCache chunks of {a['chunk']} rows" if a["chunk"] else "no GradCache"
    return "\n".join(
        [
            f"Resident memory of the unsup recipe at batch {a['batch_size']}, {chunks}, {a['steps']} steps, per "
            "`train.mmap_threshold_mib` setting; median of the rounds (range). A difference from `default` is claimed "
            "only where it exceeds the run-to-run spread (the larger range of the two), else it is *within spread*.",
            "",
            *rows,
            "",
            *(_note(r, "gradcache_rss") for r in kept),
        ]
    )


def gradcache_vs_cmnrl_table(kept: list[dict[str, Any]] | None = None) -> str:
    """The block, from the kept results or from ``kept`` (the script prints its own run with it)."""
    kept = records("gradcache_vs_cmnrl") if kept is None else kept
    if not kept:
        return _missing("gradcache_vs_cmnrl")
    rows = ["| CPU class | variant | precision | sentences/s | peak RSS MiB | runs busy |", "|---|---|---|---|---|---|"]
    pairs = ["| CPU class | simcse-kit / CachedMNRL | speed (paired by round) | peak RSS |", "|---|---|---|---|"]
    for rec in kept:
        klass = rec["machine"]["cpu_class"]
        for v, s in rec["summary"].items():
            rows.append(
                f"| {klass} | {v} | {_precision(_first(rec, v)['precision'])} | {_range(s['sentences_per_s'])} | "
                f"{_range(s['peak_rss_mib'], 0)} | "
                f"{_busy(rec)} |"
            )
        for name, c in rec["comparisons"].items():
            r = c["speed_ratio"]
            pairs.append(f"| {klass} | {name} | **{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f}) | {_claim(c['rss'])} |")
    a = kept[0]["args"]
    return "\n".join(
        [
            f"GradCache side by side: unsup SimCSE at batch {a['batch_size']}, max length {a['max_seq_len']}, "
            f"{a['chunk']} sequences per forward pass on both sides; median of the rounds (range). A peak-RSS "
            "difference is claimed only where it exceeds the run-to-run spread, else it is *within spread*.",
            "",
            *rows,
            "",
            *pairs,
            "",
            *(_note(r, "gradcache_vs_cmnrl", f" x {r['args']['steps']} steps") for r in kept),
        ]
    )


BENCH, README = REPO / "BENCHMARKS.md", REPO / "README.md"
# Each block's name, what makes it, and the file it lives in.
def gpu_records(pattern: str = "gpu-*.json") -> list[tuple[Path, dict[str, Any]]]:
    """benchmarks/gpu.py's kept results (``benchmarks/results/gpu-*.json``), by file name."""
    return [(path, json.loads(path.read_text())) for path in sorted(RESULTS.glob(pattern))]


def gpu_table() -> str:
    """benchmarks/gpu.py's kept runs: per device and job, every variant against the peer."""
    rows = [
        "| device | results file | job | variant | sentences/s, median (min–max) | vs sentence-transformers, same workers | "
        "peak memory MiB | MFU (bf16 peak) | rounds |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for path, rec in gpu_records():
        if rec.get("smoke") or not rec.get("jobs") or rec["args"].get("sync_debug"):
            continue
        for job, data in rec["jobs"].items():
            summary = data["summary"]
            variants = [v for v in summary if "/" not in v]
            for v in variants:
                workers = v.rpartition("-w")[2]
                ratio = summary.get(f"{v}/st-w{workers}")
                mfu = summary[v]["mfu"]
                mfu_text = "–" if mfu is None else f"{100 * mfu['median']:.1f}%"
                n = summary[v]["sentences_per_s"]["n"]
                rows.append(
                    f"| {rec['device']} | {path.stem} | {job} | {v} | {_cell(summary, v)} | {_ratio(ratio) if ratio else '–'} | "
                    f"{summary[v]['peak_memory_mib']:.0f} | {mfu_text} | {n} |"
                )
    return "\n".join(rows)


def gpu_headline() -> str:
    """The README's GPU sentence: the like-for-like runs (both sides clip, same workers)."""
    lines = []
    for _, rec in gpu_records("gpu-*-clip.json"):
        for job, data in rec["jobs"].items():
            for key, r in data["summary"].items():
                if "/" in key:
                    kit, peer = key.split("/")
                    lines.append(
                        f"- {rec['device']}, {job}: simcse-kit (`{kit}`) trains at **{r['median']:.2f}x** "
                        f"({r['min']:.2f}–{r['max']:.2f}) the sentence-transformers trainer (`{peer}`, bf16), "
                        f"same DataLoader workers and gradient clipping (median of {r['n']} paired rounds)."
                    )
    return "\n".join(lines)


def gpu_syncs_table() -> str:
    """benchmarks/gpu.py --sync-debug: device-to-host reads per timed step, and where."""
    rows = [
        "| file | job | variant | reads per step | where (first library frame: count over the timed steps) |",
        "|---|---|---|---:|---|",
    ]
    for path, rec in gpu_records():
        if not rec["args"].get("sync_debug"):
            continue
        for job, data in rec["jobs"].items():
            for run in data["runs"]:
                where = {k: n for k, n in (run["syncs"] or {}).items() if "set_sync_debug_mode" not in k}
                per_step = sum(where.values()) / run["steps"]
                text = "; ".join(f"`{k}`: {n}" for k, n in where.items()) or "none"
                rows.append(f"| {path.name} | {job} | {run['variant']} | {per_step:g} | {text} |")
    return "\n".join(rows)


BLOCKS: dict[str, tuple[Callable[[], str], Path]] = {
    "train-throughput": (throughput_table, BENCH),
    "speed-headline": (headline, README),
    "flops": (flops_table, BENCH),
    "profile-step": (profile_table, BENCH),
    "encode-throughput": (encode_table, BENCH),
    "memory": (memory_table, BENCH),
    "gradcache-rss": (gradcache_rss_table, BENCH),
    "gradcache-vs-cmnrl": (gradcache_vs_cmnrl_table, BENCH),
    "gpu": (gpu_table, BENCH),
    "gpu-headline": (gpu_headline, README),
    "gpu-syncs": (gpu_syncs_table, BENCH),
}
FILES = (BENCH, README)


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated block replaced by what the JSON gives now."""
    for name, (make, _) in BLOCKS.items():
        text = _pattern(name).sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(3), text)
    return text


def problems(texts: dict[Path, str]) -> list[str]:
    """What is wrong with the generated blocks of ``texts`` (file -> its text): a block
    missing from its file, empty, or different from what the JSON gives now."""
    out = []
    for name, (_, home) in BLOCKS.items():
        found = _pattern(name).search(texts.get(home, ""))
        if found is None:
            out.append(f"{home.name}: the block {name} is missing (<!-- generated:{name} --> ... <!-- /generated:{name} -->)")
        elif not found.group(2).strip():
            out.append(f"{home.name}: the block {name} is empty")
    out += [f"{path.name}: stale generated blocks" for path, text in texts.items() if render(text) != text]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check: exit 1 where a block is missing, empty or stale")
    args = parser.parse_args()
    texts = {path: path.read_text() for path in FILES}
    if args.check:
        found = problems(texts)
        for problem in found:
            print(f"{problem}: run python -m benchmarks.report", file=sys.stderr)
        return 1 if found else 0
    for path, old in texts.items():
        new = render(old)
        if new != old:
            path.write_text(new)
    missing = [p for p in problems({path: path.read_text() for path in FILES}) if "missing" in p]
    for problem in missing:
        print(problem, file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
