"""Regenerate every table of BENCHMARKS.md, docs/benchmark_details.md and the README's figures from
``benchmarks/results/*.json``.

A block sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` and is
replaced whole from its :class:`Spec`. BENCHMARKS.md keeps one headline table a section (issue 47:
under 30 KB); the full tables (every row, seed and round) and the reasoning live in
docs/benchmark_details.md. ``--check`` exits 1 where a block is missing, empty or stale, or where a
kept record has no provenance (the commit, a dirty-tree flag and the threads that
``_common.save_results`` stamps; only :data:`LEGACY` records are let through, and marked)
(``tests/test_benchmark_report.py`` runs it). Edit the JSON's producer, never a block.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks._common import REPO, SOUND_TASKS, lines_label, spread
from benchmarks.stats import Interval, load_rows, seed_difference, spearman_difference, spearman_level

RESULTS = REPO / "benchmarks" / "results"
BENCH, README, DETAILS = REPO / "BENCHMARKS.md", REPO / "README.md", REPO / "docs" / "benchmark_details.md"
FILES = (BENCH, README, DETAILS)
CLASS_ORDER = ("avx2", "avx2-limited", "avx512_bf16", "amx")  # the CPU classes in table order
STS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg")
STS_HEAD = "STS12|STS13|STS14|STS15|STS16|STS-B|SICK-R|Avg."
SPREAD = "A difference is claimed only where it exceeds the run-to-run spread (the larger range of the two)."
Record = dict[str, Any]
Row = list[str]

# Records kept before save_results stamped provenance (commit, dirty flag, threads): the check tolerates them
# and the tables mark them "record predates provenance; to be re-run". This list may only shrink: a re-run
# record has provenance and must leave it (the check says so), and no new name may join it (issue 49:
# records that cannot drift).
LEGACY = frozenset({
    "gpu-h100-bertbase-l32", "gpu-h100-bertbase", "gpu-h100-syncs-1-before",
    "gpu-h100-syncs-2-masks-and-guard", "gpu-h100-syncs-3-final", "lora-h100-minilm", "lora-h100-mpnet",
    "mining-h100", "multi-h100", "scores-h100",
})  # fmt: skip
PROVENANCE_KEYS = ("commit", "dirty", "threads")


NO_INTERVAL = "no interval (record predates per-pair data)"


def _per_pair(rec: Record, names: Sequence[str]) -> Path | str:
    """The per-pair sidecar of ``rec`` (``results/<record>.npz``) holding rows ``names``, or why they have no
    interval: the record has no sidecar, or it lacks one of them."""
    path = RESULTS / f"{rec.get('_file', '')}.npz"
    if not path.is_file():
        return NO_INTERVAL
    missing = [r for r in names if r not in _sidecar(path)[0]]
    if missing:
        return f"no interval (no per-pair data for `{missing[0]}`)"
    return path


# The bootstraps are deterministic (seed 0) and the slowest part of a report: a verdict shown in two blocks (a
# summary and its full table), or generated again by the check, is computed once.
@functools.lru_cache(maxsize=64)
def _difference(path: Path, a: str, b: str) -> Interval:
    rows, gold = _sidecar(path)
    return spearman_difference(rows[a], rows[b], gold)


@functools.lru_cache(maxsize=64)
def _level(path: Path, row: str) -> Interval:
    rows, gold = _sidecar(path)
    return spearman_level(rows[row], gold)


def interval_verdict(rec: Record, a: str, b: str, lead: str = "interval rule, 7-task average: ") -> str:
    """The interval rule on rows ``a`` - ``b`` of ``rec``: their 7-task averages' difference with its 95% interval
    (a paired bootstrap over the test pairs and the seeds, ``benchmarks.stats``) and "better", "worse" or "no
    difference measured", after ``lead``; where the record has no per-pair data for them, it says so."""
    path = _per_pair(rec, (a, b))
    if isinstance(path, str):
        return path
    return f"{lead}{_difference(path, a, b)}"


def goal_verdict(rec: Record, row: str, goal: float) -> str:
    """Row ``row``'s 7-task average against ``goal`` by its 95% interval (the seeds and the test pairs drawn:
    ``benchmarks.stats.spearman_level``): "reaches" where the interval lies at or above it, "misses" where below,
    else the goal lies inside the interval; where the record has no per-pair data for it, it says so."""
    path = _per_pair(rec, (row,))
    if isinstance(path, str):
        return f"against {goal}: {path}"
    got = _level(path, row)
    if got.low >= goal:
        verdict = f"reaches {goal}"
    elif got.high < goal:
        verdict = f"misses {goal}"
    else:
        verdict = f"{goal} lies inside the interval: not shown reached"
    return f"95% interval {got.low:.2f} to {got.high:.2f} (seeds and test pairs drawn): {verdict}"


@functools.lru_cache(maxsize=8)
def _sidecar(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return load_rows(path)


def provenance_note(rec: Record) -> str:
    """What a table says of a record's provenance: nothing where it is clean, else why it is not evidence."""
    stamp = rec.get("provenance")
    if not stamp:
        legacy = rec.get("_file") in LEGACY
        return " (record predates provenance; to be re-run)" if legacy else " (no provenance: report --check refuses it)"
    if stamp.get("dirty"):
        return " (written from a dirty tree: not evidence; to be re-run)"
    other = sorted({c for made in (rec.get("runs_made_at") or {}).values() for c in made if c != stamp.get("commit")})
    note = f" (reuses runs made at another commit: {', '.join(c[:12] for c in other)})" if other else ""
    # A table resumed on another machine: the record names the last one; its runs name their own ("unknown" is
    # a run stamped before runs named their CPU, already marked by its commit).
    here = rec.get("machine", {}).get("cpu")
    cpus = sorted({c for made in (rec.get("runs_made_on") or {}).values() for c in made if c not in (here, "unknown")})
    return note + (f" (some runs made on another CPU: {', '.join(cpus)})" if cpus else "")


def provenance_problems() -> list[str]:
    """Kept records the check refuses: no provenance (unless in :data:`LEGACY`), an incomplete one, and
    :data:`LEGACY` names that no longer apply (the list only shrinks)."""
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        stamp = json.loads(path.read_text()).get("provenance")
        if stamp is None and path.stem not in LEGACY:
            out.append(f"{path.name}: no provenance (commit, dirty, threads): re-run it; only its runner writes a record")
        elif stamp is not None and path.stem in LEGACY:
            out.append(f"{path.name}: has provenance now: remove {path.stem!r} from report.LEGACY")
        elif stamp is not None and (missing := [k for k in PROVENANCE_KEYS if k not in stamp]):
            out.append(f"{path.name}: provenance lacks {missing}: re-run it")
    present = {path.stem for path in RESULTS.glob("*.json")}
    out += [f"report.LEGACY names {name!r}, which has no record: remove it" for name in sorted(LEGACY - present)]
    return out


def records(script: str) -> list[Record]:
    """The kept results of ``script`` (``results/<script>-*.json``), CPU classes in table order."""
    kept = [json.loads(p.read_text()) | {"_file": p.stem} for p in sorted(RESULTS.glob(f"{script}-*.json"))]
    order = {name: i for i, name in enumerate(CLASS_ORDER)}
    return sorted(kept, key=lambda r: order.get(r["machine"].get("cpu_class", ""), len(order)))


# --------------------------------------------------------------------------- cells


def _cell(summary: dict[str, Any], variant: str) -> str:
    return _range(summary[variant]["sentences_per_s"]) if variant in summary else "–"


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if not r else f"**{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f})"


def _range(s: dict[str, float] | None, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    """``median (min–max)`` of a ``_common.spread`` summary, times ``scale``."""
    if not s:
        return "–"
    m, lo, hi = (scale * s[k] for k in ("median", "min", "max"))
    return f"{m:.{digits}f}{unit} ({lo:.{digits}f}–{hi:.{digits}f})"


def _claim(d: dict[str, Any]) -> str:
    """A difference with its spread and verdict: ``+12 MiB (spread 40): within spread``."""
    return f"{d['difference']:+.0f} MiB (spread {d['spread']:.0f}): {d['verdict']}"


def _precision(p: dict[str, Any]) -> str:
    """``fp32``, or ``bf16`` with what comes with it (``+ bf16 weights + fast dropout``)."""
    if p["mixed_precision"] == "no":
        return "fp32"
    extras = [n for n, on in (("bf16 weights", p.get("bf16_weights")), ("fast dropout", p.get("fast_dropout"))) if on is True]
    return " + ".join([p["mixed_precision"], *extras])


def _decided(rec: Record) -> str:
    auto = [x for x in rec["runs"] if x["variant"] == "kit-auto"]
    return _precision(auto[0]["precision"]) if auto else "–"


def _busy(runs: Sequence[Record]) -> str:
    """How many of ``runs`` other processes made busy, and the largest share of the machine they took."""
    busy = sum(1 for x in runs if x["activity"]["busy"])
    return f"{busy}/{len(runs)} (max {100 * max(x['activity']['other_cpu_share'] for x in runs):.0f}%)"


def _ms(mean: dict[str, float], std: dict[str, float], key: str, n: int) -> str:
    """``mean ± std`` over seeds (the mean alone for one seed), ``–`` where absent."""
    if key not in mean:
        return "–"
    return f"{mean[key]:.2f} ± {std[key]:.2f}" if n > 1 and key in std else f"{mean[key]:.2f}"


def _class(rec: Record) -> str:
    return rec["machine"]["cpu_class"]


def _a(kept: list[Record], key: str) -> Any:
    return kept[0]["args"][key]


# --------------------------------------------------------------------------- the machine line


def shown_command(command: str, full: bool = True) -> str:
    """``command`` as a table shows it. Where the record was first written (``--json``, outside the checkout so the
    next run's tree stays clean) is not part of how it was measured: the line gives the command that remakes it in
    results/. Without ``full`` (BENCHMARKS.md) where that machine kept its data, caches, runs and record is left to
    the full line."""
    command = re.sub(r" --json[ =]\S+", "", command)
    return command if full else re.sub(r" --(output-dir|data-root|teacher-cache-dir|work|out)[ =]\S+", "", command)


def machine_line(rec: Record, label: str = "", full: bool = True, host: bool = True, command: bool = True) -> str:
    """Where, when and how ``rec`` was measured: date, CPU and ISA flags, threads, GPU and driver,
    load, library versions, commit and command, all from its JSON. Without ``full`` (BENCHMARKS.md, which stays short)
    the ISA flags, library versions and the command's local paths are left to the full tables' lines; a limit on the
    kernels stays. Without ``host`` the CPU is left out (a GPU record's short line), without ``command`` the
    command (lines whose files follow, each with its own)."""
    m, args = rec["machine"], rec.get("args") or {}
    flags = (m.get("isa_flags") or [k for k, on in (m.get("flags") or {}).items() if on]) if full else []
    threads = args.get("threads") or m.get("threads") or m.get("torch_threads")
    limit = ("; " if flags else "") + "kernels limited to AVX2" if m.get("kernel_limits") else ""
    detail = ", ".join(flags) + limit
    cpu = " ".join(filter(None, (m["cpu"], m.get("cpu_generation"))))  # records before the generation was kept: the name
    threads_said = f", {threads} thread{'s' * (threads > 1)}" if threads else ""
    where = [(f"{cpu} ({detail})" if detail else cpu) + threads_said] if host else []
    gpu = rec.get("device") if rec.get("device", "cpu") != "cpu" else m.get("gpu")
    if gpu:
        where.append(f"{gpu}, driver {m.get('gpu_driver', '?')}")
    if (m.get("load_avg_1min") or 0) > (m.get("cores") or 1):
        where.append(f"1-min load average {m['load_avg_1min']:g} (a shared machine)")
    libraries = m.get("versions") or rec.get("versions") or {"torch": m.get("torch")}
    libs = ", ".join(f"{k} {v}" for k, v in libraries.items() if v and v != "-" and k not in ("simcse-kit", "accelerate"))
    where += [libs] if full and libs else []
    commit = f"; commit {m['commit']}" if m.get("commit") else ""
    shown = f"; `{shown_command(rec['command'], full)}`" if command else ""
    return f"- {label}{m['date_utc']}: {'; '.join(where)}{commit}{shown}{provenance_note(rec)}"


# --------------------------------------------------------------------------- the renderer


@dataclasses.dataclass(frozen=True)
class Spec:
    """Block ``name``: a table of ``head`` over ``rows`` of each record of ``results/<script>-*.json``,
    ``intro`` above it, ``after`` and the machine lines below."""

    name: str
    script: str
    head: str | Sequence[str]
    rows: Callable[[Record], Iterable[Row]]
    intro: str | Callable[[list[Record]], str] = ""
    after: Callable[[list[Record]], list[str]] | None = None
    machines: bool = True
    home: Path = DETAILS
    command: str = ""  # what makes a record, where it is not `python -m benchmarks.<script>`
    files: tuple[str, ...] = ()  # only these records (file stems), where a headline needs one of several


def md_table(head: str | Sequence[str], rows: Iterable[Row]) -> list[str]:
    head = head.split("|") if isinstance(head, str) else head
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def render_spec(spec: Spec) -> str:
    kept = [r for r in records(spec.script) if not spec.files or r["_file"] in spec.files]
    if not kept:
        command = spec.command or f"python -m benchmarks.{spec.script}"
        copy = ""
        if command.startswith("python -m benchmarks.quality "):  # written beside its runs (--output-dir), not into results/
            copy = f" (copy its `{spec.script}.json` to `benchmarks/results/{spec.script}-cpu.json`)"
        return (
            f"Not measured under the harness yet: no `benchmarks/results/{spec.script}-*.json`. "
            f"`{command}` on a quiet machine keeps one{copy}; `python -m benchmarks.report` then fills this block."
        )
    intro = spec.intro(kept) if callable(spec.intro) else spec.intro
    out = ([intro, ""] if intro else []) + md_table(spec.head, (row for rec in kept for row in spec.rows(rec)))
    after = spec.after(kept) if spec.after else []
    out += ["", *after] if after else []
    if spec.machines:
        out += ["", *(machine_line(r, _class_label(r), full=spec.home != BENCH) for r in kept)]
    return "\n".join(out)


def _class_label(rec: Record) -> str:
    """``<CPU class>, `` before a speed record's machine line (its rows may be of several classes)."""
    return f"{_class(rec)}, " if "cpu_class" in rec["machine"] and "runs" in rec else ""


# --------------------------------------------------------------------------- CPU speed and memory


def _throughput_rows(rec: Record) -> Iterable[Row]:
    s, r = rec["summary"], rec["ratios"]
    variants = [_cell(s, v) for v in ("st-fp32", "st-bf16", "kit-fp32", "kit-bf16", "kit-auto")]
    best = f"{_ratio(r.get('kit-auto/st-best'))} vs {r.get('st-best', '–')}"
    yield [_class(rec), *variants, _decided(rec), _ratio(r.get("kit-fp32/st-fp32")), best, _busy(rec["runs"])]


def _encode_rows(rec: Record) -> Iterable[Row]:
    for v, s in rec["summary"].items():
        cos = f"{s['min_cos_vs_st_fp32']['min']:.5f}" if "min_cos_vs_st_fp32" in s else "–"
        ratio = _ratio(rec["ratios"].get(f"{v}/st-fp32"))
        yield [_class(rec), v, _range(s["sentences_per_s"]), ratio, f"{s['stsb_test']['median']:.2f}", cos, _busy(rec["runs"])]


THROUGHPUT_FULL = Spec(
    "train-throughput-full", "train_throughput",
    "CPU class|ST fp32|ST bf16|kit fp32|kit bf16|kit auto|auto decided|kit fp32 / ST fp32|kit auto / ST best|runs busy",
    _throughput_rows,
    "Sentences/s, median of the rounds (range); ratios paired within each round. Unsup SimCSE, all-MiniLM-L6-v2, "
    'batch 64, max length 32, gradient clipping at 1.0 on both sides. "ST best": the faster sentence-transformers '
    "setting on that CPU.",
)  # fmt: skip


def _encode_summary_rows(rec: Record) -> Iterable[Row]:
    """One row a CPU class: each precision's kit / ST ratio, and how far kit's STS-B test score is from ST's."""
    summary, ratios = rec["summary"], rec["ratios"]
    gaps = [
        summary[f"kit-{p}"]["stsb_test"]["median"] - summary[f"st-{p}"]["stsb_test"]["median"]
        for p in ("fp32", "bf16")
        if f"kit-{p}" in summary and f"st-{p}" in summary
    ]
    ratio = [_ratio(ratios.get(f"kit-{p}/st-{p}")) for p in ("fp32", "bf16")]
    yield [_class(rec), *ratio, " / ".join(f"{g:+.2f}" for g in gaps), _busy(rec["runs"])]


ENCODE = Spec(
    "encode-throughput", "encode_throughput",
    "CPU class|variant|sentences/s|vs st-fp32 (paired)|STS-B test|min cosine vs st-fp32|runs busy",
    _encode_rows,
    lambda kept: f"The STS-B dev + test sentences at batch {_a(kept, 'batch_size')}, max length "
    f"{_a(kept, 'max_seq_len')}: median of the rounds (range).",
)  # fmt: skip
ENCODE_SUMMARY = Spec(
    "encode-summary", "encode_throughput",
    "CPU class|fp32: kit / ST|bf16: kit / ST|STS-B, kit − ST (fp32 / bf16)|runs busy",
    _encode_summary_rows,
    lambda kept: f"simcse-kit's sentences/s over `SentenceTransformer.encode`'s at the same precision (STS-B dev + "
    f"test, batch {_a(kept, 'batch_size')}, max length {_a(kept, 'max_seq_len')}); median (range) of paired rounds.",
    home=BENCH,
)  # fmt: skip
MEMORY = Spec(
    "memory", "memory", "CPU class|point|peak RSS MiB|sentences/s|runs busy",
    lambda rec: ([_class(rec), v, _range(s["peak_rss_mib"], 0), _range(s["sentences_per_s"]), _busy(rec["runs"])]
                 for v, s in rec["summary"].items()),
    lambda kept: f"Peak RSS of the unsup recipe's training loop ({_a(kept, 'precision')}, max length "
    f"{_a(kept, 'max_seq_len')}): `b<batch>` plain, `b<batch>-gc<chunk>` GradCache; median of the rounds (range). " + SPREAD,
    after=lambda kept: md_table("CPU class|difference|peak RSS", ([_class(r), n, _claim(d)] for r in kept
                                                                   for n, d in r["comparisons"].items())),
)  # fmt: skip


def _corpus_rows(rec: Record) -> Iterable[Row]:
    for r in rec["runs"]:
        cold = r["cache"] == "cold" and "cache_build_rows_per_s" in r
        build = f"{r['cache_build_rows_per_s'] / 1000:.0f}k" if cold else "–"
        tokens = f"{r['token_table_rows_per_s'] / 1000:.1f}k" if cold and "token_table_rows_per_s" in r else "–"
        phases = [r["started_s"], r["data_s"] - r["started_s"], r["ready_s"] - r["data_s"] if "ready_s" in r else None]
        cells = ["–" if x is None else f"{x:.1f}" for x in [*phases, r.get("first_step_s")]]
        load = f"{r['activity']['load_avg_before']:.0f}"
        anon = f"{r['peak_anon_mib']:.0f}" if "peak_anon_mib" in r else "–"
        yield [f"{r['lines']:,}", r["variant"], r["cache"], *cells, f"{r['peak_rss_mib']:.0f}", anon, build, tokens, load]


def _corpus_checks(kept: list[Record]) -> list[str]:
    """The claims: memory and warm start at the largest size, two processes, a bad row."""
    out = []
    for rec in kept:
        if "runs_machine" in rec:  # --checks-only: the table came from an earlier command
            m = rec["runs_machine"]
            table = f"{m['date_utc']}, commit {m['commit']}, `{rec['runs_command']}`"
            out.append(f"- The table: {table}; the lines below: the last line's.")
        warm = {r["lines"]: r for r in rec["runs"] if r["variant"] == "kit" and r["cache"] == "warm"}
        if len(warm) > 1:
            small, big = warm[min(warm)], warm[max(warm)]
            private = (
                f" (private memory {big['peak_anon_mib'] - small['peak_anon_mib']:+.0f} MiB; the rest is pages of the "
                "memory-mapped caches the first batches read)"
                if "peak_anon_mib" in big and "peak_anon_mib" in small
                else ""
            )
            out.append(
                f"- `kit`, warm, {big['lines']:,} lines against {small['lines']:,}: peak RSS "
                f"{big['peak_rss_mib'] - small['peak_rss_mib']:+.0f} MiB{private}; "
                f"first optimiser step {big['first_step_s']:.1f} s "
                f"after the process started ({big['started_s']:.1f} s of it imports, {big['data_s'] - big['started_s']:.2f} s "
                f"the data, {big['ready_s'] - big['data_s']:.1f} s the model and optimiser, "
                f"{big['first_step_s'] - big['ready_s']:.1f} s "
                "the run folder, the trackers and the step; 1-min load average "
                f"{big['activity']['load_avg_before']:.0f} on {rec['machine']['cores']} cores)."
            )
        procs = {r["processes"]: r for r in rec.get("processes", [])}
        if {1, 2} <= procs.keys():
            one, each = procs[1]["peak_rss_mib"], procs[2]["children_peak_mib"]
            out.append(
                f"- Two processes (`torchrun`, 1 thread each, warm cache) on {procs[2]['rows']:,} rows: peak RSS "
                f"{' and '.join(f'{x:.0f}' for x in each)} MiB per process, one process alone {one:.0f} MiB "
                f"({100 * (max(each) / one - 1):+.0f}%)."
            )
        bad = rec.get("bad_rows")
        if bad:
            new, skip, over = bad["error_new_folder"], bad["skip"], bad["error_over_run"]
            said = new["said"][-1].split(": error: ", 1)[-1] if new["said"] else "–"
            out.append(
                f"- A bad row (invalid UTF-8) at line {bad['bad_line']:,} of {bad['lines']:,}: `data.bad_rows: error` exits "
                f"{new['rc']} after {new['seconds']:.0f} s with `{said}`; no run folder written"
                f"{'' if not new['folder_written'] else ' (one was written)'}, and over a finished run (`--overwrite`) "
                f"exit {over['rc']}, its best model and metrics.json "
                f"{'unchanged' if over['best_model_and_metrics_untouched'] else 'CHANGED'}. `skip`: exit {skip['rc']}, "
                f"{skip['steps']} steps trained, metrics.json `skipped_rows: {skip['skipped_rows']}`."
            )
    return out


CORPUS = Spec(
    "corpus-scale", "corpus_scale",
    "lines|variant|cache|imports s|data s|model s|first step at s|peak RSS MiB|private MiB|cache build rows/s|"
    "token table rows/s|load avg",
    _corpus_rows,
    "One fresh process each, one round, in order: `kit` is `simcse-kit train unsup` (the main job's model, batch 64, "
    "2 steps); `st` is sentence-transformers' path (`datasets.load_dataset('text')`, the `(text, text)` pairs, "
    "`SentenceTransformerTrainer` with MNRL, batch 64, 2 steps); `lists`: the old whole-file Python lists (load only). "
    "Seconds from the start of the process: imports, then reading (cold: building the text cache, then the token table "
    "with its processes), then model and optimiser; "
    "`first step at`: the end of the first optimiser step. Peak RSS counts the pages of the memory-mapped caches the "
    "run touched (page cache: clean, shared between processes, given back under memory pressure); `private`: the "
    "largest anonymous memory (`RssAnon`) polled. The load average is the machine's before the run.",
    after=_corpus_checks,
)  # fmt: skip
CORPUS_WARM = dataclasses.replace(
    CORPUS, name="corpus-scale-warm", script="corpus_scale_warm",
    intro="The warm runs again on the caches above (`--warm-only`), with the private memory polled:",
    command="python -m benchmarks.corpus_scale --warm-only --checks --lines 100000 --lines 1000000 --lines 10000000",
)  # fmt: skip


def _paired_ratio(runs: list[Record], variant: str) -> dict[str, float] | None:
    """First step of a 2-process ``variant`` over the 1-process run of its layout, paired by round; None for another
    variant or where the record has no such pair."""
    one = {r["round"]: r["first_step_s"] for r in runs if r["variant"] == variant.replace("-2p", "-1p")}
    if not variant.endswith("-2p") or not one:
        return None
    return spread([r["first_step_s"] / one[r["round"]] for r in runs if r["variant"] == variant])


def _shard_rows(rec: Record) -> Iterable[Row]:
    runs, encode = rec["runs"], spread(rec["encode_batch_rows_per_cpu_s"])
    for variant in dict.fromkeys(r["variant"] for r in runs):
        of = [r for r in runs if r["variant"] == variant]
        table = spread([r["table_rows_per_cpu_s"] for r in of])
        label = f"{lines_label(of[0]['lines'])}, {variant} ({of[0]['tables']})"
        build = f"{_range(table, 0)}: {table['median'] / encode['median']:.0%} of {encode['median']:,.0f}"
        first = _range(spread([r["first_step_s"] for r in of]))
        yield [label, first, _ratio(_paired_ratio(runs, variant)), build, _busy(of)]


def _shard_intro(kept: list[Record]) -> str:
    rounds = "/".join(str(n) for n in sorted({len({r["round"] for r in rec["runs"]}) for rec in kept}))
    return (
        f"`simcse-kit train unsup`, cold; 1 process × 2 threads or 2 × 1; median (range) of {rounds} rounds; the "
        "build against `encode_batch` alone on its texts."
    )


SHARDS = Spec(
    "corpus-shards", "corpus_shards",
    "lines, layout-processes (parts)|first step at s|2 processes / 1|table rows/CPU-s: of encode_batch's|runs busy",
    _shard_rows,
    _shard_intro,
    command="python -m benchmarks.corpus_scale --shards 20 --lines 1000000",
)  # fmt: skip
SHARD_GOALS = (0.6, 0.8)  # issue 50: 2 processes / 1 at most, on every round; each build's share of encode_batch's


def _shard_goal_rows(rec: Record) -> Iterable[Row]:
    """A record's cold starts side by side (one file, the shards with 1 and 2 processes), the shards' 2 / 1 ratio and
    the slowest layout's table build, each against its goal."""
    runs, encode = rec["runs"], spread(rec["encode_batch_rows_per_cpu_s"])["median"]
    layouts = list(dict.fromkeys(r["variant"] for r in runs))

    def median(variant: str, key: str) -> float:
        return spread([r[key] for r in runs if r["variant"] == variant])["median"]

    first = " · ".join(f"{median(v, 'first_step_s'):.0f}" if v in layouts else "–" for v in ("file-1p", "shards-1p", "shards-2p"))
    ratio = _paired_ratio(runs, "shards-2p")
    share = {v: median(v, "table_rows_per_cpu_s") / encode for v in layouts}
    low = min(share, key=share.__getitem__)
    met = ("not met", "met")
    fast = ratio is not None and ratio["max"] <= SHARD_GOALS[0]
    yield [lines_label(runs[0]["lines"]), first, f"{_ratio(ratio)}: {met[fast]}",
           f"{share[low]:.0%} ({low}): {met[share[low] >= SHARD_GOALS[1]]}", _busy(runs)]  # fmt: skip


SHARDS_SUMMARY = Spec(
    "corpus-shards-summary", "corpus_shards",
    "lines|first step at s: file-1p · shards-1p · shards-2p|shards, 2 processes / 1 (goal ≤ 0.6x)|slowest build, "
    "of encode_batch's rows/CPU-s (goal ≥ 80%)|runs busy",
    _shard_goal_rows,
    lambda kept: _shard_intro(kept) + " A goal is met only where every round meets it (the ratio) or the slowest "
    "layout's median does (the build).",
    home=BENCH,
    command=SHARDS.command,
)  # fmt: skip


def _pipeline_rows(rec: Record) -> Iterable[Row]:
    for mode, s in rec["summary"].items():
        table = s["table"][0] if s["table"] else None  # the first (cold) build of this checkout's table
        build = first = "–"
        if table:
            build = f"{table['rows'] / table['cpu_seconds'] / 1000:.1f}k ({table['processes']} process)"
            first = f"{table['rows'] / (table['cpu_seconds'] + table['rows'] / s['new']['median']):,.0f}"
        yield [_class(rec), mode, _range(s["old"], 0), _range(s["new"], 0), _ratio(s["ratio"]), build, first, _busy(rec["runs"])]


PIPELINE = Spec(
    "pipeline", "pipeline",
    "CPU class|mode|baseline, examples/CPU-s|token table, examples/CPU-s|new / baseline (paired)|table build, rows/CPU-s|"
    "first epoch with the build, examples/CPU-s|runs busy",
    _pipeline_rows,
    lambda kept: f"Read, tokenise, collate and plan the packing of batches of 64 from the run's loader (`make_loader`, no "
    f"workers, one thread), all-MiniLM-L6-v2 at max length 32: the baseline (commit {kept[0]['baseline']}, the tokenizer "
    "called per batch) against this checkout (ids from the token table). Median of the rounds (range), each a fresh "
    "process; the ratio is paired within each round. The table is built once per file (and tokenizer, length, prompts): "
    "its rate is the first round's build; the last column counts it in the first epoch (unsup: 11,914 sentences; sup and "
    "hardneg: 5,864 triplets).",
)  # fmt: skip


def _backbone_rows(rec: Record) -> Iterable[Row]:
    for v, s in rec["summary"].items():
        yield [rec["device"], rec["model"], v, f"{s['trainable']:,}", _range(s["peak_mib"], 0), _range(s["s_per_step"], 3)]


BACKBONE = Spec(
    "backbone-memory", "backbone_memory", "device|model|variant|trainable parameters|peak MiB|s/step",
    _backbone_rows,
    lambda kept: f"One unsup step at batch {_a(kept, 'batch_size')} (twice as many rows), max length "
    f"{_a(kept, 'max_seq_len')}, bf16 autocast on CUDA, fp32 on a CPU: full fine-tuning or LoRA (r 8, query and value), "
    "`train.gradient_checkpointing` off or on (`-gc`; MPNet: checkpointed per block by the kit, transformers has none "
    "for it); median of the rounds (range). Peak MiB: CUDA's peak allocation on CUDA; on a CPU each variant runs in a "
    "fresh process and the peak is its RSS.",
)  # fmt: skip


# --------------------------------------------------------------------------- GPU


def _gpu_rows(rec: Record) -> Iterable[Row]:
    if rec.get("smoke") or rec["args"].get("sync_debug"):
        return
    for job, data in rec["jobs"].items():
        summary = data["summary"]
        for v in (v for v in summary if "/" not in v):
            ratio, mfu = summary.get(f"{v}/st-w{v.rpartition('-w')[2]}"), summary[v]["mfu"]
            yield [
                rec["_file"].removeprefix("gpu-"), job, v, _cell(summary, v), _ratio(ratio) if ratio else "–",
                f"{summary[v]['peak_memory_mib']:.0f}", "–" if mfu is None else f"{100 * mfu['median']:.1f}%",
            ]  # fmt: skip


def _sync_rows(rec: Record) -> Iterable[Row]:
    for job, data in rec["jobs"].items() if rec["args"].get("sync_debug") else ():
        for run in data["runs"]:
            where = {k: n for k, n in (run["syncs"] or {}).items() if "set_sync_debug_mode" not in k}
            text = "; ".join(f"`{k.split(' ')[0]}` x{n}" for k, n in where.items()) or "none"
            per_step = f"{sum(where.values()) / run['steps']:g}"
            yield [rec["_file"].removeprefix("gpu-h100-syncs-"), job, run["variant"], per_step, text]


def _dated(kept: list[Record], sync_debug: bool, full: bool = True) -> list[str]:
    """Each file's date and command (the files share one machine); ``full`` as in :func:`shown_command`."""
    chosen = (r for r in kept if bool(r["args"].get("sync_debug")) == sync_debug)
    return [f"- {r['_file']}: {r['machine']['date_utc']}; `{shown_command(r['command'], full)}`" for r in chosen]


def _gpu_machine(kept: list[Record], full: bool) -> list[str]:
    """Per GPU and commit, one machine line (with the records' provenance note), then each of their files' date and
    command; ``full`` as in :func:`machine_line`, and without it the host CPU is left to the full tables' lines."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for rec in (r for r in kept if not r["args"].get("sync_debug")):
        key = (rec.get("device", ""), rec["machine"].get("commit", ""), provenance_note(rec))
        groups.setdefault(key, []).append(rec)
    return [
        line
        for recs in groups.values()
        for line in (machine_line(recs[0], full=full, host=full, command=False), *_dated(recs, False, full))
    ]


GPU = Spec(
    "gpu", "gpu", "file|job|variant|sentences/s|vs sentence-transformers, same workers|peak MiB|MFU (bf16 peak)",
    _gpu_rows,
    lambda kept: f"Median of {_a(kept, 'rounds')} rounds (range); `-wN`: DataLoader workers; `pack`/`pad`: packing on/off; "
    "`padc`: padded with `train.compile: true`. MFU: matmul FLOPs of the real tokens over the dense bf16 peak.",
    after=lambda kept: _gpu_machine(kept, full=True),
    machines=False,
)  # fmt: skip
GPU_SYNCS = Spec(
    "gpu-syncs", "gpu-h100-syncs", "stage|job|variant|reads per step|where (first library frame x times over the timed steps)",
    _sync_rows,
    "Device-to-host reads per timed step (`--sync-debug`), before and after the fixes:",
    after=lambda kept: _dated(kept, True),
    machines=False,
)  # fmt: skip


# --------------------------------------------------------------------------- quality


def _quality_verdict(kept: list[Record], full: bool = True) -> list[str]:
    """Per family, simcse-kit's row chosen on dev against the peer (the interval rule, 7-task and transfer averages);
    under the full table, then, every trained row's scores below the base (the headline leaves them to its prose)."""
    res, lines = kept[0]["results"], []
    for family in ("unsup", "hardneg"):
        kit = {n: r["mean"] for n, r in res.items() if n.startswith(f"kit-{family}")}
        best, peer = max(kit, key=lambda n: kit[n]["best_stsb_dev"]), res[f"st-{family}"]["mean"]["avg"]
        chosen = f"`{best}` (simcse-kit's best on STS-B dev)" if len(kit) > 1 else f"simcse-kit `{best}`"
        lines.append(
            f"- {family}: {chosen} {kit[best]['avg']:.2f}, sentence-transformers {peer:.2f}; "
            f"{interval_verdict(kept[0], best, f'st-{family}')}."
        )
        lines += _transfer_gap(res, best, f"st-{family}")
    return lines + (_trained_below_base(kept) if full else [])


def _main_job_rows(rec: Record) -> Iterable[Row]:
    for name, label in (("kit-unsup", "`train/unsup.yaml`"), ("base", "all-MiniLM-L6-v2 untouched")):
        r = rec["results"][name]
        yield [f"{label} ({r['n']} seed{'s' * (r['n'] > 1)})", *(_ms(r["mean"], r["std"], k, r["n"]) for k in STS)]


def _best_step(per_seed: dict[str, dict[str, float]]) -> str:
    """Mean best step, with each seed's (a mean of 0 and 75 hides a kept base model)."""
    steps = [t["best_step"] for t in per_seed.values() if "best_step" in t]
    if len(steps) != len(per_seed) or not steps:
        return "–"
    mean = f"{sum(steps) / len(steps):.0f}"
    return mean if len(steps) == 1 else f"{mean} ({', '.join(f'{s:.0f}' for s in steps)})"


def _domain_tables(rec: Record) -> dict[str, Record]:
    return {k: v for k, v in rec["results"].items() if not k.startswith("selection_")}


def _domain_rows(rec: Record) -> Iterable[Row]:
    for name, s in _domain_tables(rec).items():
        m, sd, n = s["mean"], s["std"], len(s["per_seed"])
        lr = "–" if s["learning_rate"] is None else f"{s['learning_rate']:g}"
        cells = [_ms(m, sd, k, n) for k in (s["target"], "avg", "transfer:avg", "best_stsb_dev")]
        yield [name, lr, str(n), *cells, _best_step(s["per_seed"]), _ms(m, sd, "retrieval:avg", n), _guard_cell(name, s)]


class DomainChoice(NamedTuple):
    """One domain of a domain or teacher record: its rows, the kit row chosen on dev (never on test), the base row
    and the best peer on the domain's test set (``target``), with those three rows' test scores."""

    domain: str
    rows: dict[str, Record]
    target: str
    best: str
    base: str
    peer: str
    score: float
    base_score: float
    peer_score: float

    @property
    def peer_kept_base(self) -> bool:
        """Whether the peer kept the untouched model in every seed, so that it scores as the base (as shown)."""
        gap = f"{self.score - self.base_score:+.2f}"
        return _kept_base(self.rows[self.peer]) and gap == f"{self.score - self.peer_score:+.2f}"


def _domain_choices(rec: Record) -> Iterable[DomainChoice]:
    """:class:`DomainChoice` per domain of ``rec``."""
    stats = _domain_tables(rec)
    for domain in dict.fromkeys(s["domain"] for s in stats.values()):
        of = {n: s for n, s in stats.items() if s["domain"] == domain}
        target = next(iter(of.values()))["target"]
        best = max((n for n, s in of.items() if s["kind"] == "kit"), key=lambda n: of[n]["mean"]["best_stsb_dev"])
        base = next(n for n, s in of.items() if s["kind"] == "base")
        peer = max((n for n, s in of.items() if s["kind"] == "st"), key=lambda n: of[n]["mean"][target])
        yield DomainChoice(domain, of, target, best, base, peer, *(of[n]["mean"][target] for n in (best, base, peer)))


def _domain_verdict(kept: list[Record]) -> list[str]:
    """Per domain: the kit row chosen on dev against base and the best peer; then its SentEval transfer average
    against the base and the best peer by the interval rule, where the record scored it; then every trained row's
    scores below the domain's base."""
    lines = []
    for c in _domain_choices(kept[0]):
        # A peer that kept the untouched model in every seed scores as the base: one comparison, said once.
        same, over_base = c.peer_kept_base, f"{c.score - c.base_score:+.2f} over the base"
        gaps = (
            f"{over_base} and the best peer `{c.peer}`, which kept it in every seed"
            if same
            else f"{over_base}, {c.score - c.peer_score:+.2f} over the best peer `{c.peer}`"
        )
        lines.append(
            f"- {c.domain}: chosen on dev `{c.best}`, {c.target} {c.score:.2f}: {gaps} "
            f"({interval_verdict(kept[0], c.best, c.peer)}); 7-task average {c.rows[c.best]['mean']['avg']:.2f}."
        )
        for other in (c.base,) if same else (c.base, c.peer):
            lines += _transfer_gap(c.rows, c.best, other)
        lines += [line for n, s in c.rows.items() if _trained(n, s) for line in _below_base(c.rows, n, c.base)]
    return lines


def _kept_base(row: Record) -> bool:
    """Whether every seed of ``row`` kept the untouched model (best step 0), so that it scores as the base."""
    steps = [s.get("best_step") for s in row.get("per_seed", {}).values()]
    return bool(steps) and all(step == 0 for step in steps)


def _domain_headline(kept: list[Record]) -> list[str]:
    """:func:`_domain_verdict` for BENCHMARKS.md, one line per domain under the table of its test scores: the chosen
    row against the best peer only, on the 7-task and the transfer averages (the gaps to the base are in the
    details)."""
    lines = []
    for c in _domain_choices(kept[0]):
        gaps = [interval_verdict(kept[0], c.best, c.peer, lead=""), _transfer_difference(c.rows, c.best, c.peer)]
        said = "; SentEval transfer avg ".join(g for g in gaps if g)
        peer = f"`{c.peer}`" + " (kept the base)" * c.peer_kept_base
        lines.append(f"- {c.domain}: `{c.best}` (chosen on dev) − the best peer {peer}: 7-task avg {said}.")
    return lines


def _mining_rows(rec: Record) -> Iterable[Row]:
    """The mining, negatives and scores tables: each row's rows, seeds, averages, best step, nDCG@10 over the sound
    tasks and the guard's count of test pairs trained on."""
    for name, s in rec["results"].items():
        n, rows = _seeds(s), f"{s['rows']:,}" if s.get("rows") else "–"
        cells = [_ms(s["mean"], s["std"], k, n) for k in ("avg", "STSBenchmark", "best_stsb_dev")]
        yield [name, rows, str(n), *cells, _best_step(s["per_seed"]), _sound_ndcg(s), _guard_cell(name, s)]


def _gaps(kept: list[Record], ours: str, others: Mapping[str, str]) -> list[str]:
    """Row ``ours`` − each row of ``others`` the record has (with its note, if any): the
    difference of the means on the 7-task average and on nDCG@10 over :data:`SOUND_TASKS`."""
    m = {n: s["mean"] for n, s in kept[0]["results"].items()}
    if ours not in m:
        return []
    return [
        f"- `{ours}` − `{o}`{f' ({note})' if note else ''}: {m[ours]['avg'] - m[o]['avg']:+.2f} on the 7-task average, "
        f"{_sound(m[ours]) - _sound(m[o]):+.2f} nDCG@10 (sound tasks); {interval_verdict(kept[0], ours, o)}"
        for o, note in others.items()
        if o in m
    ]


def _sound(mean: Mapping[str, float]) -> float:
    """nDCG@10 over :data:`SOUND_TASKS` of one table (a row's mean, or one seed's)."""
    return sum(mean[f"retrieval:{t}"] for t in SOUND_TASKS) / len(SOUND_TASKS)


def _avg_and_sound(rec: Record) -> Iterable[Row]:
    """Per row of a quality record: its name, seeds, 7-task average, nDCG@10 over the sound tasks and SentEval
    transfer average."""
    for name, s in rec["results"].items():
        n = _seeds(s)
        yield [name, str(n), _ms(s["mean"], s["std"], "avg", n), _sound_ndcg(s), _ms(s["mean"], s["std"], "transfer:avg", n)]


def _mining_verdict(kept: list[Record]) -> list[str]:
    return _gaps(kept, "sup+mined", {"sup-4509": "the same rows", "sup": "all rows"}) + _trained_below_base(kept)


def _negatives_rows(rec: Record) -> Iterable[Row]:
    """:func:`_mining_rows` with each row's SentEval transfer average before the guard's count."""
    for row, s in zip(_mining_rows(rec), rec["results"].values(), strict=True):
        yield [*row[:-1], _ms(s["mean"], s["std"], "transfer:avg", _seeds(s)), row[-1]]


def _negatives_verdict(kept: list[Record]) -> list[str]:
    res = kept[0]["results"]
    k3, k1 = res["hardneg-k3"]["mean"], res["hardneg-k1"]["mean"]
    rule = interval_verdict(kept[0], "hardneg-k3", "hardneg-k1")
    return [f"- k = 3 − k = 1 (the same rows): {k3['avg'] - k1['avg']:+.2f} on the 7-task average, "
            f"{_sound(k3) - _sound(k1):+.2f} nDCG@10 (sound tasks); {rule}",
            *_transfer_gap(res, "hardneg-k3", "hardneg-k1"), *_trained_below_base(kept)]  # fmt: skip


GUIDE_TASKS = ("mrpc-paraphrase", "stsb-similar", "sick-related")  # simcse_kit.evaluation.retrieval_tasks.RETRIEVAL_TASKS


def _guide_rows(rec: Record) -> Iterable[Row]:
    for name, s in rec["results"].items():
        m, sd, n = s["mean"], s["std"], len(s["per_seed"])
        keys = ("avg", "STSBenchmark", "best_stsb_dev", *(f"retrieval:{t}" for t in GUIDE_TASKS), "retrieval:avg")
        cells = [_ms(m, sd, k, n) for k in keys]
        masked = f"{m['guide_masked']:,.0f}" if "guide_masked" in m else "–"
        transfer = _ms(m, sd, "transfer:avg", n)
        yield [name, str(n), *cells[:3], _best_step(s["per_seed"]), *cells[3:], transfer, masked, _guard_cell(name, s)]


def _guide_verdict(kept: list[Record], below: tuple[str, ...] | None = None) -> list[str]:
    """The guided row against the unguided one and the peer; then the trained rows below the base (only ``below``'s,
    where given: the headline keeps the guided row's, the full table every row's)."""
    res, ours = kept[0]["results"], "kit-hardneg-guide"
    transfer = [line for other in ("kit-hardneg", "st-gist") if other in res for line in _transfer_gap(res, ours, other)]
    if below is None:
        lower = _trained_below_base(kept)
    else:
        lower = [line for name in below if name in res for line in _below_base(res, name)]
    return _gaps(kept, ours, {"kit-hardneg": "", "st-gist": ""}) + transfer + lower


def _where(rec: Record) -> str:
    """The machine a quality record trained on, in a table cell: the GPU's name, else ``CPU``."""
    gpu = rec["machine"].get("gpu") if rec["machine"].get("device", "cpu") != "cpu" else None
    return str(gpu).removeprefix("NVIDIA ").split()[0] if gpu else "CPU"


def _multi_rows(rec: Record) -> Iterable[Row]:
    for name, s in rec["results"].items():
        m, sd, n = s["mean"], s["std"], len(s["per_seed"])
        keys = (*STS, "best_stsb_dev", "retrieval:avg")
        yield [_where(rec), name, str(n), *(_ms(m, sd, k, n) for k in keys), _best_step(s["per_seed"]), _guard_cell(name, s)]


QUALITY_GOAL = 80.5  # the 7-task average the shipped general recipe must reach (all-mpnet-base-v2: 80.53)


def _multi_verdict(kept: list[Record]) -> list[str]:
    """Per record: the mixture against each one-dataset row, and each teacher row against the
    80.5 goal and the base's nDCG@10 (where the record measured it)."""
    lines = []
    for rec in kept:
        lines += [f"- {_where(rec)}: {g[2:]}" for g in _gaps([rec], "kit-multi", {"kit-unsup": "", "kit-hardneg": ""})]
        res = rec["results"]
        base = res.get("base", {}).get("mean", {})
        for name, r in res.items():
            if not name.startswith("kit-multi-teacher") or len(r["per_seed"]) < 3:
                continue
            avg, std = r["mean"]["avg"], r["std"].get("avg", 0.0)
            verdict = goal_verdict(rec, name, QUALITY_GOAL)
            each = [f"{seed['avg']:.2f}" for seed in r["per_seed"].values() if "avg" in seed]
            seeds = f" (seeds: {', '.join(each)})" if each else ""
            ndcg = "nDCG@10 not measured"
            if all(f"retrieval:{t}" in m for t in SOUND_TASKS for m in (r["mean"], base)):
                got, want = _sound(r["mean"]), _sound(base)
                ndcg = (
                    f"nDCG@10 (sound tasks) {got:.2f} against the base's {want:.2f}, {'at least' if got >= want else 'below'} it"
                )
            seen = f"; test pairs trained on: {count}" if (count := _seen(r)) != "0" else ""
            lines.append(f"- {_where(rec)}: `{name}` averages {avg:.2f} ± {std:.2f} over {len(r['per_seed'])} seeds{seeds}, "
                         f"{verdict}; {ndcg}{seen}")  # fmt: skip
    return lines


SHORT = dict(zip(STS[:-1], STS_HEAD.split("|")[:-1], strict=True))  # STSBenchmark -> STS-B
SHORT |= {"avg": "7-task avg", "transfer:avg": "SentEval transfer avg"}


def _seen(s: Record) -> str:
    """The contamination guard's count for a row: ``0`` where it trains on no test pair (both sentences), else each
    task's share of such pairs; where the record predates the guard, which of its datasets hold test sentences."""
    seen = s.get("test_pairs_seen")
    if seen is None:
        return "not counted (record predates the guard)"
    hit = {t: v for t, v in seen.items() if v[0]}
    if not hit:
        return "0"
    worst = max(hit, key=lambda t: hit[t][0] / hit[t][1])
    share = 100 * hit[worst][0] / hit[worst][1]
    tasks = f"{len(hit)} task{'s' * (len(hit) > 1)}"
    count = f"{sum(a for a, _ in hit.values()):,} in {tasks}, at most {share:.1f}% ({SHORT.get(worst, worst)})"
    return count + _clean_average(s, seen)


CONTAMINATED_SHARE = 0.01  # simcse_kit.evaluation.contamination's (a test keeps them equal; importing it loads torch)


def _clean_average(s: Record, seen: Mapping[str, list[int]]) -> str:
    """Where the guard calls a task contaminated (:data:`CONTAMINATED_SHARE` of its pairs trained on, as the run's
    final table marks it), the average over the clean tasks, mean ± sample std over the seeds, naming them when
    few; nothing where every task is clean (the 7-task average is then that average)."""
    tasks = [t for t in STS[:-1] if t in seen]
    clean = [t for t in tasks if not (seen[t][0] and seen[t][0] >= CONTAMINATED_SHARE * seen[t][1])]
    if len(clean) == len(tasks):
        return ""
    if not clean:
        return "; no clean task"
    per_seed = [sum(p[t] for t in clean) / len(clean) for p in s["per_seed"].values()]
    which = ", ".join(SHORT[t] for t in clean) if len(clean) <= 2 else f"{len(clean)} of {len(tasks)}"
    return f"; clean-task avg {_mean_sd(per_seed)} ({which})"


CLEAN_RECIPE = "kit-multi-teacher-t0.1-wiki+snli"  # train/teacher/multi.yaml


def _sound_ndcg(s: Record) -> str:
    """nDCG@10 over :data:`SOUND_TASKS` (mrpc-paraphrase is a smoke test), mean ± sample std over the seeds."""
    per_seed = [_sound(seed) for seed in s["per_seed"].values() if all(f"retrieval:{t}" in seed for t in SOUND_TASKS)]
    return _mean_sd(per_seed) if per_seed else "–"


def _clean_rows(rec: Record) -> Iterable[Row]:
    for name, s in rec["results"].items():
        n = _seeds(s)
        cells = [_ms(s["mean"], s["std"], k, n) for k in ("avg", "SICKRelatedness")]
        dev, transfer = (_ms(s["mean"], s["std"], k, n) for k in ("best_stsb_dev", "transfer:avg"))
        yield [name, str(n), *cells, _sound_ndcg(s), transfer, dev, _guard_cell(name, s)]


def _clean_verdict(kept: list[Record]) -> list[str]:
    """The clean general-purpose recipe against the 80.5 goal (its interval), each peer (the interval rule and the seed
    spread) and the untouched base (every average it lowers is said)."""
    lines = []
    for rec in kept:
        res = rec["results"]
        if CLEAN_RECIPE not in res:
            continue
        ours, sd = res[CLEAN_RECIPE]["mean"], res[CLEAN_RECIPE]["std"]
        each = ", ".join(f"{seed['avg']:.2f}" for seed in res[CLEAN_RECIPE]["per_seed"].values())
        lines.append(f"- `{CLEAN_RECIPE}` averages {ours['avg']:.2f} ± {sd['avg']:.2f} (seeds: {each}), "
                     f"{goal_verdict(rec, CLEAN_RECIPE, QUALITY_GOAL)}.")  # fmt: skip
        for peer, s in res.items():
            if s["kind"] != "st":
                continue
            gap, spread_ = _seed_gap(res[CLEAN_RECIPE], s, "avg")
            beyond = "beyond" if abs(gap) > spread_ else "within"
            lines.append(f"- `{CLEAN_RECIPE}` − `{peer}`: {gap:+.2f}, {beyond} the seed spread ({spread_:.2f}, the larger "
                         f"std); {interval_verdict(rec, CLEAN_RECIPE, peer)}.")  # fmt: skip
            lines += _transfer_gap(res, CLEAN_RECIPE, peer)
        lines += _below_base(res, CLEAN_RECIPE)
    return lines


def _seed_gap(a: Record, b: Record, key: str) -> tuple[float, float]:
    """Row ``a``'s mean of ``key`` minus row ``b``'s, and the larger of their seed stds (the spread a gap must
    exceed)."""
    return a["mean"][key] - b["mean"][key], max(a["std"].get(key, 0.0), b["std"].get(key, 0.0))


def _transfer_difference(res: Record, row: str, other: str) -> str | None:
    """``row``'s SentEval transfer average against ``other``'s by the interval rule, or None where either lacks it:
    the accuracies are not per-pair data, so the interval is Welch's t over the seeds' averages
    (:func:`stats.seed_difference`)."""
    key = "transfer:avg"
    seeds = [[s[key] for s in res[r].get("per_seed", {}).values() if key in s] for r in (row, other)]
    if not all(seeds):
        return None
    i = seed_difference(*seeds)
    return f"{i.difference:+.2f} (95% interval {i.low:+.2f} to {i.high:+.2f}): {i.verdict}"


def _transfer_gap(res: Record, row: str, other: str) -> list[str]:
    """:func:`_transfer_difference` as a verdict line of its own (none where it is None)."""
    gap = _transfer_difference(res, row, other)
    return [f"- SentEval transfer avg, `{row}` − `{other}`: {gap}."] if gap else []


BELOW_BASE = "below the untouched base"


def _below_base(res: Record, row: str, base_row: str = "base") -> list[str]:
    """Every STS average, sound retrieval task and transfer average on which row ``row``'s mean falls below the
    untouched base's (row ``base_row``) by at least the shown 0.01, each with the row's seed std, so a reader sees
    whether the drop is inside its noise."""
    base, ours, sd = res.get(base_row, {}).get("mean", {}), res[row]["mean"], res[row].get("std", {})
    keys = (*STS, *(f"retrieval:{t}" for t in SOUND_TASKS), "transfer:avg")
    below = [f"{SHORT.get(k, k.replace('retrieval:', 'nDCG@10 '))} {ours[k] - base[k]:+.2f} (std {sd.get(k, 0.0):.2f})"
             for k in keys if k in base and k in ours and round(ours[k] - base[k], 2) < 0]  # fmt: skip
    return [f"- `{row}` {BELOW_BASE}: {', '.join(below)}."] if below else []


def _trained(name: str, s: Record) -> bool:
    """Whether row ``name`` of a quality record was trained (not the base, nor a teacher); older records name the
    kind only by the row's name."""
    return s.get("kind", name) not in ("base", "teacher")


def _guard_cell(name: str, s: Record) -> str:
    """A table's "test pairs trained on" cell: the guard's count (:func:`_seen`) for a trained row, "–" for the
    untouched base and teacher."""
    return _seen(s) if _trained(name, s) else "–"


def _trained_below_base(kept: list[Record]) -> list[str]:
    """:func:`_below_base` for every trained row of a record."""
    res = kept[0]["results"]
    return [line for name, s in res.items() if _trained(name, s) for line in _below_base(res, name)]


def _teacher_general_rows(rec: Record) -> Iterable[Row]:
    for name, s in rec["results"].items():
        n, lr = _seeds(s), "–" if s.get("learning_rate") is None else f"{s['learning_rate']:g}"
        cells = [_ms(s["mean"], s["std"], k, n) for k in (*STS, "best_stsb_dev")]
        transfer = _ms(s["mean"], s["std"], "transfer:avg", n)
        yield [name, lr, str(n), *cells, _sound_ndcg(s), transfer, _best_step(s["per_seed"]), _guard_cell(name, s)]


def _teacher_general_verdict(kept: list[Record]) -> list[str]:
    """The distilled recipe against the untouched student and the peer (the interval rule), and what it lowers."""
    res, lines = kept[0]["results"], []
    for other in ("base", "st-mse"):
        if "kit-similarity" in res and other in res:
            gap = res["kit-similarity"]["mean"]["avg"] - res[other]["mean"]["avg"]
            lines.append(f"- `kit-similarity` − `{other}`: {gap:+.2f}; {interval_verdict(kept[0], 'kit-similarity', other)}.")
            lines += _transfer_gap(res, "kit-similarity", other)
    return lines + (_below_base(res, "kit-similarity") if "kit-similarity" in res else [])


def _transfer_note(rec: Record) -> str:
    """How a record's SentEval transfer column was scored, or that it was not; the teacher is named only where the
    record's command has one. A record from before the probe normalised every vector (no ``transfer_normalize``)
    scored simcse-kit folders raw and the ``Normalize``-ended models unit: its gaps between the two are not clean."""
    if not (k := rec.get("transfer_kfold")):
        return "not scored in this record (`--transfer-kfold`)."
    scored = rec.get("transfer_teacher") or "--teacher " not in rec.get("command", "")
    teacher = "" if scored else "; the teacher not scored (`--transfer-teacher`)"
    raw = (
        "; simcse-kit rows raw, the others unit vectors (raw: 0.12 lower for the same weights), so gaps between the two "
        "are not clean"
    )
    return f"{k}-fold{teacher}{'' if rec.get('transfer_normalize') else raw}."


def _fixed(values: Iterable[float]) -> list[str]:
    return [f"{v:.2f}" for v in values]


def _quality_rows(rec: Record) -> Iterable[Row]:
    """The quality table: each row's STS tasks, dev selection, SentEval transfer average and the guard's count of test
    pairs trained on."""
    for name, r in rec["results"].items():
        cells = (_ms(r["mean"], r["std"], k, r["n"]) for k in (*STS, "best_stsb_dev", "transfer:avg"))
        yield [name, str(r["n"]), *cells, _guard_cell(name, r)]


QUALITY = Spec(
    "quality", "sts",
    f"config|seeds|{STS_HEAD}|STS-B dev (selection)|SentEval transfer avg|test pairs trained on", _quality_rows,
    lambda kept: "Spearman x 100 by cosine, mean ± sample std over the seeds. SentEval transfer: "
    + _transfer_note(kept[0]),
    after=_quality_verdict,
)  # fmt: skip


def _lora_rows(rec: Record) -> Iterable[Row]:
    for name, r in rec["results"].items():
        lr = "–" if r.get("learning_rate") is None else f"{r['learning_rate']:g}"
        cells = (_ms(r["mean"], r["std"], k, r["n"]) for k in (*STS, "best_stsb_dev"))
        yield [Path(rec["model"]).name, name, lr, str(r["n"]), *cells]


def _lora_verdict(kept: list[Record]) -> list[str]:
    """Per backbone and recipe, LoRA's 7-task average against full fine-tuning and against the peer's LoRA."""
    lines = []
    for rec in kept:
        avg = {n: r["mean"]["avg"] for n, r in rec["results"].items()}
        for mode in ("unsup", "hardneg"):
            ours = f"kit-lora-{mode}"
            if ours in avg:
                versus = [f"{avg[ours] - avg[o]:+.2f} against `{o}`, {interval_verdict(rec, ours, o)}"
                          for o in (f"kit-{mode}", f"st-lora-{mode}") if o in avg]  # fmt: skip
                lines.append(f"- {Path(rec['model']).name}, {mode}: `{ours}` averages {avg[ours]:.2f} ({', '.join(versus)}).")
    return lines


MAIN_JOB = Spec("main-job", "sts", f"model|{STS_HEAD}", _main_job_rows, machines=False, home=README)


def _lora_step_rows(rec: Record) -> Iterable[Row]:
    from benchmarks._common import paired_ratios

    for v, s in rec["summary"].items():
        backbone, mode, side = v.split(":")
        ratio = paired_ratios(rec["runs"], v, f"{backbone}:{mode}:kit-full", metric="s_per_step")
        cells = [f"{s['trainable']['median']:,.0f}", _range(s["peak_rss_mib"], 0), _range(s["s_per_step"], 2), _ratio(ratio)]
        yield [Path(backbone).name, mode, side, *cells]


LORA_STEPS = Spec(
    "lora-steps", "train_lora", "backbone|recipe|variant|trained parameters|peak RSS MiB|s/step|s/step vs kit-full",
    _lora_step_rows,
    lambda kept: f"Batch {_a(kept, 'batch_size')}, max length {_a(kept, 'max_seq_len')}, fp32, clipping at 1.0; LoRA r "
    f"{_a(kept, 'lora_r')} (alpha 16, dropout 0.1, query and value), the peer with the same `LoraConfig`; each variant "
    f"in a fresh process, {_a(kept, 'steps')} timed steps after {_a(kept, 'warmup')}, {_a(kept, 'rounds')} rounds "
    "alternated: median (range); the ratio is paired within each round. Padded batches on both sides (no packing). Peak "
    "RSS: the whole process (model, data, optimizer); simcse-kit's full count leaves out BERT's pooler layer (mean pooling "
    "never uses it).",
)  # fmt: skip
LORA = Spec(
    "lora", "lora", f"model|config|lr|seeds|{STS_HEAD}|STS-B dev (selection)", _lora_rows,
    "Spearman x 100 by cosine, mean ± sample std over the seeds; lr: the rate chosen on STS-B dev (one seed, dev only).",
    after=_lora_verdict, command="python -m benchmarks.quality lora --retrieval-tasks none --parallel 2 --threads 1",
)  # fmt: skip
DOMAIN_HEAD = (
    "row|lr|seeds|domain test (SICK-R / STS-B)|7-task avg|SentEval transfer avg|dev (selection)|best step|nDCG@10 avg|"
    "test pairs trained on"
)
DOMAIN = Spec(
    "domain", "domain", DOMAIN_HEAD, _domain_rows, lambda kept: "SentEval transfer: " + _transfer_note(kept[0]),
    after=_domain_verdict,
)  # fmt: skip
TEACHER = dataclasses.replace(DOMAIN, name="teacher", script="teacher")
TEACHER_GENERAL = Spec(
    "teacher-general", "teacher_general",
    f"row|lr|seeds|{STS_HEAD}|STS-B dev (selection)|nDCG@10 (stsb-similar, sick-related)|SentEval transfer avg|best step|"
    "test pairs trained on",
    _teacher_general_rows,
    lambda kept: "Spearman x 100 by cosine, mean ± sample std over the seeds; lr: chosen on STS-B dev (one seed, dev "
    "only), the same sweep for both rows; `teacher`: all-mpnet-base-v2 itself. SentEval transfer: the mean accuracy of "
    "`simcse-kit transfer`'s seven tasks, "
    + _transfer_note(kept[0]),
    after=_teacher_general_verdict,
    command="python -m benchmarks.quality teacher_general --teacher /path/to/all-mpnet-base-v2 --parallel 2 --threads 1",
)  # fmt: skip
MINING_HEAD = "config|rows|seeds|7-task avg|STS-B test|STS-B dev (selection)|best step|nDCG@10 (stsb-similar, sick-related)"
MINING = Spec("mining", "mining", MINING_HEAD + "|test pairs trained on", _mining_rows, after=_mining_verdict)
GUIDE = Spec(
    "guide", "guide",
    "row|seeds|7-task avg|STS-B test|STS-B dev (selection)|best step|" + "|".join(f"nDCG@10 {t}" for t in GUIDE_TASKS)
    + "|nDCG@10 avg|SentEval transfer avg|entries masked by the guide|test pairs trained on",
    _guide_rows, lambda kept: "SentEval transfer: " + _transfer_note(kept[0]), after=_guide_verdict,
    command="python -m benchmarks.quality guide --guide /path/to/all-mpnet-base-v2 --parallel 2 --threads 1",
)  # fmt: skip
NEGATIVES = Spec(
    "negatives", "negatives",
    MINING_HEAD + "|SentEval transfer avg|test pairs trained on",
    _negatives_rows, lambda kept: "SentEval transfer: " + _transfer_note(kept[0]), after=_negatives_verdict,
)  # fmt: skip
MULTI = Spec(
    "multi", "multi", f"machine|config|seeds|{STS_HEAD}|STS-B dev (selection)|nDCG@10 avg|best step|test pairs trained on",
    _multi_rows,
    "One dataset a run against all four in one run (`train/multi.yaml`), and the four with all-mpnet-base-v2 as "
    "teacher (`kit-multi-teacher`: τ 0.5; `-t0.1`, `-t0.05`: that τ; `-no-sick`, `-no-snli`, `-wiki+stsb`, "
    "`-wiki+snli`: τ 0.1 on those datasets only, the last being `train/teacher/multi.yaml`; `st-mse-wiki+snli`, "
    "`st-mnrl-wiki+snli`: sentence-transformers on its rows). Every mixture with STS-B's or SICK's sentences trains "
    "on test sentences of STS12–16 or SICK-R (docs/contamination.md). Spearman x 100 and nDCG@10 x 100 of the "
    "built-in retrieval tasks, mean ± sample std over the seeds; compare nDCG@10 within one record only (the tasks' "
    "relevance became graded after the 2026-11-27 records).",
    after=_multi_verdict, command="python -m benchmarks.quality multi --parallel 2 --threads 1",
)  # fmt: skip
SCORES = Spec(
    "scores", "scores", MINING.head, _mining_rows,
    command="python -m benchmarks.quality scores --teacher /path/to/all-mpnet-base-v2 --parallel 2 --threads 1",
)  # fmt: skip


def _scored_rows(rec: Record) -> Iterable[Row]:
    for name, s in rec["results"].items():
        m, sd, n = s["mean"], s["std"], len(s["per_seed"])
        lr = "–" if s["learning_rate"] is None else f"{s['learning_rate']:g}"
        cells = [_ms(m, sd, k, n) for k in ("STSBenchmark", "SICKRelatedness", "avg", "transfer:avg", "best_stsb_dev")]
        yield [name, lr, str(n), *cells, _best_step(s["per_seed"]), _guard_cell(name, s)]


def _scored_verdict(kept: list[Record]) -> list[str]:
    """Per score loss: the kit against the sentence-transformers trainer, and both against the base, on STS-B test;
    then the SentEval transfer averages by the interval rule, where the record scored them."""
    res = kept[0]["results"]
    m = {n: s["mean"] for n, s in res.items()}
    base, lines = m["base"]["STSBenchmark"], []
    for loss in ("cosent", "angle"):
        kit, st = m.get(f"kit-{loss}"), m.get(f"st-{loss}")
        if kit and st:
            lines.append(
                f"- {loss}: STS-B test {kit['STSBenchmark']:.2f} (simcse-kit) against {st['STSBenchmark']:.2f} "
                f"(sentence-transformers), {kit['STSBenchmark'] - st['STSBenchmark']:+.2f}; over the base ({base:.2f}) "
                f"{kit['STSBenchmark'] - base:+.2f} and {st['STSBenchmark'] - base:+.2f}; 7-task average "
                f"{kit['avg']:.2f} against {st['avg']:.2f} ({interval_verdict(kept[0], f'kit-{loss}', f'st-{loss}')})."
            )
            lines += _transfer_gap(res, f"kit-{loss}", f"st-{loss}")
        fp32 = m.get(f"kit-{loss}-fp32")
        if fp32 and st:  # the same precision as the peer on a CPU
            lines.append(
                f"- {loss}, simcse-kit in fp32: STS-B test {fp32['STSBenchmark']:.2f} against {st['STSBenchmark']:.2f}, "
                f"{fp32['STSBenchmark'] - st['STSBenchmark']:+.2f}; 7-task average {fp32['avg']:.2f} "
                f"({interval_verdict(kept[0], f'kit-{loss}-fp32', f'st-{loss}')})."
            )
            lines += _transfer_gap(res, f"kit-{loss}-fp32", f"st-{loss}")
    return lines


def _scored_summary_verdict(kept: list[Record]) -> list[str]:
    """The headline's lines: each simcse-kit row against the peer with its loss, on the 7-task average and the
    SentEval transfer average by the interval rule; the STS-B test scores are in the table above them."""
    res, lines = kept[0]["results"], []
    for loss, precision in itertools.product(("cosent", "angle"), ("", "-fp32")):
        kit, st = f"kit-{loss}{precision}", f"st-{loss}"
        if kit in res and st in res:
            lines += [f"- `{kit}` − `{st}`: {interval_verdict(kept[0], kit, st)}.", *_transfer_gap(res, kit, st)]
    return lines


SCORED = Spec(
    "scored", "scored",
    "row|lr|seeds|STS-B test|SICK-R|7-task avg|SentEval transfer avg|STS-B dev (selection)|best step|test pairs trained on",
    _scored_rows,
    lambda kept: "Spearman x 100 by cosine, mean ± sample std over the seeds; lr: the rate chosen on STS-B dev (one "
    "seed, dev only). SentEval transfer: " + _transfer_note(kept[0]),
    after=_scored_verdict,
    command="python -m benchmarks.quality scored --steps 359 --eval-steps 60 --retrieval-tasks none --parallel 2 --threads 1",
)  # fmt: skip
RETRIEVAL = Spec(
    "retrieval", "domain", "task|nDCG@10|MRR@10|R@1|R@10|R@100|MAP@100",
    lambda rec: ([t, *_fixed(rec["results"]["sick-base"]["mean"][f"retrieval:{t}/{k}"]
                            for k in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100"))]
                 for t in rec["retrieval_tasks"]),
    "all-MiniLM-L6-v2 untouched, exact search, x 100 (the base row of the domain table's run):",
)  # fmt: skip


def _onnx_rows(rec: Record) -> Iterable[Row]:
    torch_sps = rec["table_median"]["torch fp32"]["sentences_per_s_b128"]
    for name, r in rec["table_median"].items():
        sps = r["sentences_per_s_b128"]
        yield [name, f"{sps:.0f}", f"{sps / torch_sps:.2f}x", f"{r['latency_ms_b1']:.2f}", f"{r['sts_avg']:.2f}"]


ONNX = Spec(
    "onnx", "onnx_speed", "backend|batch 128, sentences/s|vs torch|batch 1, ms|7-task STS",
    _onnx_rows,
    lambda kept: f"Medians of {kept[0]['rounds']} alternating rounds; throughput on the {kept[0]['n_sentences']:,} "
    f"STS-B dev+test sentences at batch {kept[0]['batch_size']}, latency on {kept[0]['latency_sentences']} of them "
    "one at a time. Cold start in a fresh interpreter, peak RSS after encoding 1,024 sentences:",
    after=lambda kept: md_table("encoder|import → first vector|with interpreter start|peak RSS", (
        [n, f"{c['cold_start_s']:.2f} s", f"{c['cold_start_with_interpreter_s']:.2f} s", f"{c['peak_rss_mib']:.0f} MiB"]
        for n, c in kept[0]["cold_start_median"].items())),
    home=BENCH,
)  # fmt: skip


# --------------------------------------------------------------------------- BENCHMARKS.md's headlines
# One table a section (issue 47): a few columns of the full table above, or one cell per variant; the full
# table, with every row, seed and round, is the block of the same record in docs/benchmark_details.md.


def _pick(rows: Callable[[Record], Iterable[Row]], *columns: int) -> Callable[[Record], Iterable[Row]]:
    """``rows`` with only the cells at ``columns``."""
    return lambda rec: ([row[i] for i in columns] for row in rows(rec))


def _pivot(rows: Iterable[Row], key: int, value: int, columns: Sequence[str]) -> Iterable[Row]:
    """One row per distinct first ``key`` cells, with the ``value`` cell of the row whose cell ``key`` names each
    of ``columns`` (``–`` where none); a row whose cell ``key`` is not in ``columns`` is left to the full table."""
    table: dict[tuple[str, ...], dict[str, str]] = {}
    for row in rows:
        table.setdefault(tuple(row[:key]), {})[row[key]] = row[value]
    return ([*k, *(cells.get(c, "–") for c in columns)] for k, cells in table.items())


def _or_no_interval(verdict: Callable[[list[Record]], list[str]]) -> Callable[[list[Record]], list[str]]:
    """``verdict``'s lines, or one line where none of them has an interval: the headline table holds the
    numbers, and the full lines stay under the full table."""

    def lines(kept: list[Record]) -> list[str]:
        out = verdict(kept)
        gaps = [line for line in out if BELOW_BASE not in line]
        if gaps and all(NO_INTERVAL in line for line in gaps):
            below = [line for line in out if BELOW_BASE in line]
            return ["- No interval on these differences: the record predates per-pair data.", *below]
        return out

    return lines


def _seeds(s: Record) -> int:
    return int(s["n"]) if "n" in s else len(s.get("per_seed") or {}) or 1


def _means(*keys: str) -> Callable[[Record], Iterable[Row]]:
    """Per row of a quality record: its name, its seeds and ``keys`` as mean ± sample std."""
    return lambda rec: ([n, str(_seeds(s)), *(_ms(s["mean"], s["std"], k, _seeds(s)) for k in keys)]
                        for n, s in rec["results"].items())  # fmt: skip


def _domain_pivot(columns: Sequence[str]) -> Callable[[Record], Iterable[Row]]:
    """Per domain, its test set's score for each row (``sick-st-mnrl``: column ``st-mnrl``)."""

    def rows(rec: Record) -> Iterable[Row]:
        cells = ([f"{s['domain']}: {s['target']}", n.removeprefix(f"{s['domain']}-"),
                  _ms(s["mean"], s["std"], s["target"], _seeds(s))] for n, s in _domain_tables(rec).items())  # fmt: skip
        return _pivot(cells, 1, 2, columns)

    return rows


def _lora_pivot(rec: Record) -> Iterable[Row]:
    """Per backbone and recipe, the 7-task average of full fine-tuning and LoRA, simcse-kit and the peer."""
    cells = ([Path(rec["model"]).name, *n.rsplit("-", 1)[::-1], _ms(s["mean"], s["std"], "avg", _seeds(s))]
             for n, s in rec["results"].items() if n != "base")  # fmt: skip
    return _pivot(cells, 2, 3, ("kit", "kit-lora", "st", "st-lora"))


def _scored_pivot(rec: Record) -> Iterable[Row]:
    """Per score loss, STS-B test of simcse-kit (auto, and fp32) and of the sentence-transformers trainer."""
    cells = ([n.split("-")[1], n.replace(f"-{n.split('-')[1]}", ""), _ms(s["mean"], s["std"], "STSBenchmark", _seeds(s))]
             for n, s in rec["results"].items() if n != "base")  # fmt: skip
    return _pivot(cells, 1, 2, ("kit", "st", "kit-fp32"))


def _interval(d: Record) -> str:
    return f"{d['ndcg@10']:+.2f} ({d['low']:+.2f} to {d['high']:+.2f})"


def _bm25_rows(rec: Record) -> Iterable[Row]:
    for task, t in rec["tasks"].items():
        yield [task, f"{t['bm25']['ndcg@10']:.2f}", f"{t['model']['ndcg@10']:.2f}", _interval(t["difference"]), t["verdict"]]


def _also_rows(rec: Record) -> Iterable[Row]:
    """Each model scored beside the judged one: its nDCG@10 and its paired differences from BM25 and from it."""
    for task, t in rec["tasks"].items():
        for name, a in t.get("also", {}).items():
            d = a["minus_model"]
            verdict = Interval(d["ndcg@10"], d["low"], d["high"], d["replicates"]).verdict
            yield [task, name, f"{a['ndcg@10']:.2f}", _interval(a["minus_bm25"]), _interval(d), verdict]


def _bm25_tasks(kept: list[Record], verdict: str) -> str:
    """The tasks the rule gave ``verdict`` (``sound`` or ``smoke test``), as code, or ``none``."""
    return ", ".join(f"`{n}`" for n, t in kept[0]["tasks"].items() if t["verdict"] == verdict) or "none"


def _bm25_verdict(kept: list[Record]) -> list[str]:
    """Which tasks an nDCG@10 claim may rest on."""
    sound, smoke = _bm25_tasks(kept, "sound"), _bm25_tasks(kept, "smoke test")
    return [f"- Sound: {sound}. Smoke test (no retrieval claim rests on it): {smoke}."]


def _gpu_pivot(rec: Record) -> Iterable[Row]:
    """Per file, job and workers: each kit variant's sentences/s over the peer's with the same workers."""
    # A variant without the peer beside it (no ratio) is left to the full table.
    cells = (
        [row[0], row[1], row[2].rpartition("-w")[2], row[2].split("-")[1], row[4]] for row in _gpu_rows(rec) if row[4] != "–"
    )
    return _pivot(cells, 3, 4, ("pad", "pack", "padc"))


MEMORY_SUMMARY = Spec(
    "memory-summary", "memory", "CPU class|difference|peak RSS",
    lambda rec: ([_class(rec), n, _claim(d)] for n, d in rec["comparisons"].items()),
    lambda kept: f"Peak RSS of the unsup recipe's training loop ({_a(kept, 'precision')}, max length "
    f"{_a(kept, 'max_seq_len')}), `b<batch>` plain, `b<batch>-gc<chunk>` GradCache. " + SPREAD,
    home=BENCH,
)  # fmt: skip
QUALITY_SUMMARY = Spec(
    "quality-summary", "sts", "config|seeds|Avg.|SentEval transfer avg|STS-B dev (selection)",
    _means("avg", "transfer:avg", "best_stsb_dev"),
    after=_or_no_interval(lambda kept: _quality_verdict(kept, full=False)), home=BENCH,
)  # fmt: skip
DOMAIN_SUMMARY = Spec(
    "domain-summary", "domain", "domain: test set|base|domain (simcse-kit)|st-mnrl|st-tsdae|st-ct",
    _domain_pivot(("base", "domain", "st-mnrl", "st-tsdae", "st-ct")),
    "The domain's test set:", after=_or_no_interval(_domain_headline), home=BENCH,
)  # fmt: skip
MINING_SUMMARY = Spec(
    "mining-summary", "negatives", "config|seeds|7-task avg|nDCG@10 (sound tasks)|SentEval transfer avg",
    _pick(_negatives_rows, 0, 2, 3, 7, 8),
    after=_or_no_interval(_negatives_verdict), home=BENCH,
)  # fmt: skip
MULTI_SUMMARY = Spec(
    "multi-summary", "multi", "config|seeds|Avg.|SICK-R|nDCG@10 (stsb-similar, sick-related)|SentEval transfer avg|"
    "STS-B dev (selection)|test pairs trained on",
    _clean_rows,
    lambda kept: "Wikipedia and the SNLI triplets, one epoch, one rate for all; peers: MNRL, and MSE from the same "
    "teacher (PCA). Last column: test pairs with both sentences in training (the guard). SentEval transfer: "
    + _transfer_note(kept[0]),
    after=_clean_verdict, files=("multi-clean-cpu",), home=BENCH,
)  # fmt: skip
SCORED_SUMMARY = Spec(
    "scored-summary", "scored", "loss|simcse-kit (auto)|sentence-transformers|simcse-kit fp32", _scored_pivot,
    lambda kept: f"STS-B test (the untouched base: {kept[0]['results']['base']['mean']['STSBenchmark']:.2f}):",
    after=_or_no_interval(_scored_summary_verdict), home=BENCH,
)  # fmt: skip
GUIDE_SUMMARY = Spec(
    "guide-summary", "guide", "row|seeds|7-task avg|nDCG@10 (sound tasks)|SentEval transfer avg", _avg_and_sound,
    after=_or_no_interval(lambda kept: _guide_verdict(kept, below=("kit-hardneg-guide",))), home=BENCH,
)  # fmt: skip
SCORES_SUMMARY = Spec(
    "scores-summary", "scores", "config|seeds|7-task avg|STS-B test", _means("avg", "STSBenchmark"),
    home=BENCH,
)  # fmt: skip
TEACHER_SUMMARY = Spec(
    "teacher-summary", "teacher",
    "domain: test set|base|teacher|kit-unsup|kit-similarity|kit-embedding|kit-similarity+simcse|st-mse",
    _domain_pivot(("base", "teacher", "kit-unsup", "kit-similarity", "kit-embedding", "kit-similarity+simcse", "st-mse")),
    "The domain's test set:", after=_or_no_interval(_domain_headline), home=BENCH,
)  # fmt: skip
THROUGHPUT = dataclasses.replace(
    THROUGHPUT_FULL, name="train-throughput",
    head="CPU class|kit auto, sentences/s|auto decided|kit fp32 / ST fp32|kit auto / ST best|runs busy",
    rows=_pick(_throughput_rows, 0, 5, 6, 7, 8, 9), home=BENCH,
    intro="Unsup SimCSE, all-MiniLM-L6-v2, batch 64, max length 32, clipping on both sides; median (range) of "
    'rounds, ratios paired per round; "ST best": the peer\'s faster setting.',
)  # fmt: skip
PIPELINE_SUMMARY = Spec(
    "pipeline-summary", "pipeline",
    "CPU class|mode|token table / baseline (paired)|first epoch with the build, examples/CPU-s|runs busy",
    _pick(_pipeline_rows, 0, 1, 4, 6, 7),
    lambda kept: f"Examples per CPU-second from the run's loader, against the tokenizer called per batch (commit "
    f"{kept[0]['baseline']}); median of the rounds (range), the ratio paired within each round:",
    home=BENCH,
)  # fmt: skip
GPU_SUMMARY = dataclasses.replace(
    GPU, name="gpu-summary", head="file|job|workers|kit pad|kit pack|kit padc (compiled)", rows=_gpu_pivot,
    intro=lambda kept: f"simcse-kit's sentences/s over the peer's with the same DataLoader workers, median of "
    f"{_a(kept, 'rounds')} paired rounds (range):",
    after=lambda kept: _gpu_machine(kept, full=False), home=BENCH,
)  # fmt: skip
BACKBONE_SUMMARY = dataclasses.replace(
    BACKBONE, name="backbone-summary", head="model|variant|peak MiB|s/step", rows=_pick(_backbone_rows, 1, 2, 4, 5),
    intro=lambda kept: f"One unsup step at batch {_a(kept, 'batch_size')} on CUDA; `lora8`: LoRA r 8; `-gc`: "
    "gradient checkpointing:",
    home=BENCH,
)  # fmt: skip
LORA_SUMMARY = Spec(
    "lora-summary", "lora", "model|recipe|kit full|kit LoRA|st full|st LoRA", _lora_pivot,
    "7-task average, each row at its rate chosen on STS-B dev:",
    after=_or_no_interval(_lora_verdict), command=LORA.command, home=BENCH,
)  # fmt: skip
BM25 = Spec(
    "bm25", "retrieval_baseline", "task|BM25 nDCG@10|model nDCG@10|model − BM25 (95% interval)|verdict", _bm25_rows,
    lambda kept: f"{_a(kept, 'model')} untouched (exact search, fp32) against BM25 (bm25s defaults, not tuned), x 100; "
    f"the difference is paired over the queries ({next(iter(kept[0]['tasks'].values()))['difference']['replicates']} "
    f"bootstrap replicates). Sound: the model leads by at least {_a(kept, 'margin'):g} points and the interval "
    "excludes 0; else a smoke test.",
    after=_bm25_verdict, home=BENCH,
)  # fmt: skip
BM25_ALSO = Spec(
    "bm25-also", "retrieval_baseline",
    "task|model|nDCG@10|− BM25 (95% interval)|− the untouched model (95% interval)|against the untouched model",
    _also_rows,
    lambda kept: f"Other models untouched on the same tasks, beside {_a(kept, 'model')} (the model the rule judges "
    "tasks by; they are not judged by it); exact search, fp32, x 100. Both differences are paired over the queries "
    f"as above; no claim rests on a smoke test's rows ({_bm25_tasks(kept, 'smoke test')}).",
)  # fmt: skip


# --------------------------------------------------------------------------- compact vectors (issue 51)

COMPACT_PRECISIONS = ("float32", "int8", "binary", "binary+rescore")
COMPACT_MODELS = {"base": "base", "main": "post hoc", "qat": "QAT"}  # record model name -> column


def _compact_sidecars(kept: list[Record]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Row -> task -> ``(seeds, pairs)`` over every seed's record (seeds ascending), and the gold."""
    import numpy as np

    by_row: dict[str, dict[str, dict[int, Any]]] = {}
    gold: dict[str, Any] = {}
    for rec in kept:
        seed = rec["args"].get("seed") or 0
        rows, gold = _sidecar(RESULTS / f"{rec['_file']}.npz")
        for row, tasks in rows.items():
            for task, values in tasks.items():
                by_row.setdefault(row, {}).setdefault(task, {})[0 if row.startswith("base ") else seed] = values[0]
    return {r: {t: np.stack([v[s] for s in sorted(v)]) for t, v in tasks.items()} for r, tasks in by_row.items()}, gold


def _compact_cells(kept: list[Record]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """(model, dim, precision) -> its row of each seed's record."""
    cells: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for rec in kept:
        for row in rec["rows"]:
            cells.setdefault((row["model"], row["dim"], row["precision"]), []).append(row)
    return cells


def _mean_sd(values: list[float]) -> str:
    import statistics

    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def compact_block() -> str:
    """The compact-vector table: bytes, 7-task STS average of each model (mean ± std over the seeds),
    recall@10 against the float top 10, search time; then the issue's goals, each with its interval."""
    kept = records("compact")
    if not kept:
        return "Not measured under the harness yet: `python -m benchmarks.compact` (docstring) keeps the records."
    cells, timing = _compact_cells(kept), {(t["dim"], t["precision"]): t for rec in kept for t in rec.get("search", [])}
    dims = sorted({dim for _, dim, _ in cells}, reverse=True)
    seeds = sorted({rec["args"]["seed"] for rec in kept if rec["args"].get("seed") is not None})
    head = ["dim", "vectors", "bytes", *(f"STS {c}" for c in COMPACT_MODELS.values())]
    head += [f"nDCG@10 {c}" for c in COMPACT_MODELS.values()]
    head.append(f"s / 1k queries over {next(iter(timing.values()))['corpus']:,}" if timing else "search")
    rows = []
    for dim, precision in ((d, p) for d in dims for p in COMPACT_PRECISIONS):
        of = {m: cells.get((m, dim, precision), []) for m in COMPACT_MODELS}
        sts = [_mean_sd([r["sts_avg"] for r in of[m]]) if of[m] else "–" for m in COMPACT_MODELS]
        ndcg = [_mean_sd([r["retrieval_ndcg@10"]["avg"] for r in of[m]]) if of[m] else "–" for m in COMPACT_MODELS]
        t = timing.get((dim, precision))
        speed = f"{t['seconds_per_1000_queries']:.3f} ({min(t['rounds']):.3f}–{max(t['rounds']):.3f})" if t else "–"
        size = next(r["bytes_per_vector"] for rs in of.values() for r in rs)
        rows.append([str(dim), precision, str(size), *sts, *ndcg, speed])
    intro = (
        f"Base: all-MiniLM-L6-v2 untouched; post hoc: the main job (seeds {', '.join(map(str, seeds))}) quantized after "
        "training; QAT: trained with `--loss.quantization binary`. Clean 7-task STS average and nDCG@10 on the sound "
        "retrieval tasks, mean ± std over seeds; search: median (range) of rounds. "
        "[How each is scored](docs/benchmark_details.md#compact-vectors)."
    )
    out = [intro, "", *md_table(head, rows), "", *_compact_goals(dims[:1]), ""]
    quality = [r for r in kept if r["rows"]]
    first = [machine_line(quality[0] | {"command": _compact_command(quality[0])}, full=False)] if quality else []
    lines = [line + _compact_seeds(quality) for line in first]
    lines += [machine_line(r | {"command": _compact_command(r)}, full=False) for r in kept if not r["rows"]]
    return "\n".join([*out, *lines])


def _compact_seeds(quality: list[Record]) -> str:
    """What the quality records after the first ran, beside its command: each seed, and the models it scored
    beyond the first's; the details' commands where another argument or the CPU differs."""
    first = quality[0]

    def setting(rec: Record) -> tuple[Any, ...]:
        args = {k: v for k, v in rec["args"].items() if k not in ("seed", "models")}
        return sorted(args.items()), rec["machine"].get("cpu"), rec["machine"].get("cpu_class")

    others = [r for r in quality[1:] if r["args"].get("seed") is not None]
    if not others:
        return ""
    if any(setting(r) != setting(first) for r in others):
        return " Other seeds: their commands and machines in the details."
    said = []
    for rec in others:
        extra = [m for m in rec["args"].get("models", []) if m not in first["args"].get("models", [])]
        said.append(f"{rec['args']['seed']}" + (f" (+ `--models {' '.join(extra)}`)" if extra else ""))
    return f" Seeds {', '.join(said)}: same command and machine (details)."


def compact_details() -> str:
    """Every row of every compact-vector record: each STS task, each retrieval task, recall@10 against float."""
    kept = [rec for rec in records("compact") if rec["rows"]]
    if not kept:
        return "Not measured under the harness yet: `python -m benchmarks.compact` (docstring) keeps the records."
    tasks = list(kept[0]["rows"][0]["sts"])
    retrieval = [t for t in kept[0]["rows"][0]["retrieval_ndcg@10"] if t != "avg"]
    head = ["model", "seed", "dim", "vectors", *tasks, "STS avg", *(f"{t} nDCG@10" for t in retrieval), "R@10 vs float"]
    rows = [
        [r["model"], "–" if r["seed"] is None else str(r["seed"]), str(r["dim"]), r["precision"]]
        + [f"{r['sts'][t]:.2f}" for t in tasks]
        + [f"{r['sts_avg']:.2f}", *(f"{r['retrieval_ndcg@10'][t]:.2f}" for t in retrieval), f"{r['recall@10_vs_float']:.2f}"]
        for rec in kept
        for r in rec["rows"]
    ]
    first = kept[0]["rows"][0]
    intro = (
        f"Recall@10 against the model's own float32 top 10: {first['queries']:,} queries over {first['recall_corpus']:,} "
        "documents (Wikipedia and SentEval sentences, none of them an STS sentence)."
    )
    dims = sorted({r["dim"] for rec in kept for r in rec["rows"]}, reverse=True)
    goals = _compact_goals(dims)
    lines = [intro, "", *md_table(head, rows), "", *goals, ""]
    return "\n".join(lines + [machine_line(r | {"command": _compact_command(r)}) for r in kept])


def _compact_command(rec: Record) -> str:
    a = rec["args"]
    seed = f" --seed {a['seed']}" if a.get("seed") is not None else ""
    only = " --search-only" if a.get("search_only") else ""
    models = f" --models {' '.join(a['models'])}" if a["models"] else ""
    train = f" --train {a['train']}" if a.get("train") else ""
    return f"python -m benchmarks.compact{seed}{only}{models}{train} --search-corpus {a['search_corpus']}"


def _compact_goals(dims: list[int]) -> list[str]:
    """The issue's three goals at each dimension, by how much each is met or missed, with the interval."""
    head = "Goals (7-task average, 95% interval, paired bootstrap over seeds and pairs):"
    return [head, *(line for dim in dims for line in _compact_dim_goals(dim))]


def _missed(by: float) -> str:
    """How far a goal was missed, with a third decimal where two would round a real miss to 0.00."""
    return f"missed by {by:.3f}" if 0 < by < 0.005 else f"missed by {by:.2f}"


@functools.cache
def _compact_dim_goals(dim: int) -> tuple[str, ...]:
    """The goal lines of one dimension: bootstrapped once, though BENCHMARKS.md and the details both show them."""
    rows, gold = _compact_sidecars(records("compact"))
    lines = []
    for model in ("main", "qat"):
        fp32 = rows.get(f"{model} {dim} float32")
        for precision, limit in (("int8", 0.3), ("binary+rescore", 1.0)):
            other = rows.get(f"{model} {dim} {precision}")
            if fp32 is None or other is None:
                continue
            d = spearman_difference(fp32, other, gold)
            met = "met" if d.difference <= limit else _missed(d.difference - limit)
            lines.append(
                f"- {dim} dims, {COMPACT_MODELS[model]}: {precision} {-d.difference:+.2f} against float32 "
                f"({-d.high:+.2f} to {-d.low:+.2f}); goal within {limit}: {met}."
            )
    qat, post = rows.get(f"qat {dim} binary"), rows.get(f"main {dim} binary")
    if qat is not None and post is not None:
        d = spearman_difference(qat, post, gold)
        met = "met" if d.difference >= 1.0 and d.low > 0 else _missed(max(0.0, 1.0 - d.difference))
        lines.append(
            f"- {dim} dims: QAT binary {d.difference:+.2f} against post-hoc binary ({d.low:+.2f} to {d.high:+.2f}), "
            f"{d.verdict}; goal at least +1.0 beyond the spread: {met}."
        )
    return tuple(lines)


# --------------------------------------------------------------------------- README sentences


def headline() -> str:
    """The README's speed sentence per CPU class, like for like and against the best peer."""
    lines = []
    for rec in records("train_throughput"):
        r, bits = rec["ratios"], []
        if auto := r.get("kit-auto/st-best"):
            bits.append(
                f"the recipe (`auto` → {_decided(rec)}) trains at **{auto['median']:.2f}x** sentence-transformers' "
                f"faster setting there ({r['st-best'].replace('st-', '')})"
            )
        if fp32 := r.get("kit-fp32/st-fp32"):
            bits.append(f"fp32 against fp32 **{fp32['median']:.2f}x**")
        n = rec["args"]["rounds"]
        klass = {"avx2": "AVX2 only", "avx2-limited": "AVX2 kernels only"}.get(_class(rec), _class(rec))
        lines.append(f"- {klass}: {'; '.join(bits)} (median of {n} paired rounds).")
    return "\n".join(lines)


def gpu_headline() -> str:
    """The README's GPU sentence: every record with provenance that runs the like-for-like pair at the CUDA default
    of 8 DataLoader workers (both sides clip), so a second run of the same comparison shows beside the first."""
    return "\n".join(
        f"- {rec['device']}, {job}: simcse-kit (`kit-pad-w8`) trains at **{r['median']:.2f}x** ({r['min']:.2f}–"
        f"{r['max']:.2f}) the sentence-transformers trainer (`st-w8`, bf16), same DataLoader workers and gradient "
        f"clipping (median of {r['n']} paired rounds; `{rec['_file']}`)."
        for rec in records("gpu") if rec.get("provenance")
        for job, data in rec["jobs"].items() if (r := data["summary"].get("kit-pad-w8/st-w8"))
    )  # fmt: skip


SPECS: tuple[Spec, ...] = (QUALITY, LORA, MAIN_JOB, DOMAIN, MINING, NEGATIVES, GUIDE, SCORES, SCORED, TEACHER)
SPECS += (TEACHER_GENERAL, THROUGHPUT, PIPELINE, ENCODE, MEMORY, MULTI, CORPUS, CORPUS_WARM, SHARDS, GPU, GPU_SYNCS, RETRIEVAL)
SPECS += (ONNX, BACKBONE, LORA_STEPS)
SPECS += (QUALITY_SUMMARY, DOMAIN_SUMMARY, MINING_SUMMARY, MULTI_SUMMARY, SCORED_SUMMARY, GUIDE_SUMMARY, SCORES_SUMMARY)
SPECS += (TEACHER_SUMMARY, PIPELINE_SUMMARY, GPU_SUMMARY, BACKBONE_SUMMARY, LORA_SUMMARY, SHARDS_SUMMARY)
SPECS += (BM25, BM25_ALSO, MEMORY_SUMMARY, ENCODE_SUMMARY, THROUGHPUT_FULL)
BLOCKS: dict[str, tuple[Callable[[], str], Path]] = {s.name: (functools.partial(render_spec, s), s.home) for s in SPECS}
BLOCKS |= {
    "speed-headline": (headline, README),
    "gpu-headline": (gpu_headline, README),
    "compact": (compact_block, BENCH),
    "compact-details": (compact_details, DETAILS),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated block replaced by what the JSON gives now."""
    for name, (make, _) in BLOCKS.items():
        text = _pattern(name).sub(functools.partial(_fill, make()), text)
    return text


def _fill(block: str, found: re.Match[str]) -> str:
    return found.group(1) + block + "\n" + found.group(3)


def problems(texts: dict[Path, str]) -> list[str]:
    """What is wrong with the generated blocks of ``texts`` (file -> text): missing, empty or stale."""
    out = []
    for name, (_, home) in BLOCKS.items():
        found = _pattern(name).search(texts.get(home, ""))
        if found is None:
            out.append(f"{home.name}: the block {name} is missing (<!-- generated:{name} --> ... <!-- /generated:{name} -->)")
        elif not found.group(2).strip():
            out.append(f"{home.name}: the block {name} is empty")
    out += [f"{path.name}: stale generated blocks" for path, text in texts.items() if render(text) != text]
    return out + provenance_problems()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check: exit 1 where a block is missing, empty or stale, or a record has no provenance",
    )
    texts = {path: path.read_text() for path in FILES}
    if parser.parse_args().check:
        for problem in (found := problems(texts)):
            print(problem if "LEGACY" in problem or "provenance" in problem else f"{problem}: run python -m benchmarks.report",
                  file=sys.stderr)  # fmt: skip
        return 1 if found else 0
    for path, old in texts.items():
        if (new := render(old)) != old:
            path.write_text(new)
    missing = [p for p in problems({path: path.read_text() for path in FILES}) if "missing" in p]
    for problem in missing:
        print(problem, file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
