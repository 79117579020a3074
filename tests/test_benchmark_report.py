"""The speed tables in BENCHMARKS.md and README.md are generated from the kept JSON
(benchmarks/results/), so a number and its data cannot drift apart (issue 22): every
block is present, filled and current; a hand-made record gives exactly the table it
should; a memory difference is claimed only beyond the run-to-run spread."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import memory, report
from benchmarks._harness import difference, summary_of

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# The scripts whose JSON report.py turns into tables (the harness scripts).
HARNESS = ("train_throughput", "encode_throughput", "memory", "train_lora")
MACHINE = {"cpu": "Test CPU", "cpu_class": "avx2", "commit": "abc1234", "date_utc": "2026-11-24 07:00 UTC"}
MACHINE |= {"versions": {"torch": "2.13.0"}}
NO = report.NO_INTERVAL  # the verdicts of records without per-pair data
CLEAN = {"commit": "abc1234" + "0" * 33, "dirty": False, "threads": 2}


def test_generated_blocks_match_the_kept_json() -> None:
    # The compact goals bootstrap 2,000 replicates over the STS pairs: about 25 s on a quiet 2-core machine, so
    # the limit leaves room for a loaded one (a hang still fails).
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--check"], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr


def test_every_block_is_present_and_every_result_has_three_rounds() -> None:
    texts = {path: path.read_text() for path in report.FILES}
    assert report.problems(texts) == []
    for name in ("train-throughput", "speed-headline"):  # measured: a bold headline figure
        text = texts[report.BLOCKS[name][1]]
        block = text.split(f"<!-- generated:{name} -->\n", 1)[1].split(f"<!-- /generated:{name} -->", 1)[0]
        assert "**" in block and len(block.strip().splitlines()) >= 2, f"the {name} block is empty"
    assert sorted(RESULTS.glob("train_throughput-*.json")), "no kept training-throughput results"
    for path in (p for script in HARNESS for p in sorted(RESULTS.glob(f"{script}-*.json"))):
        record = json.loads(path.read_text())
        rounds = {run["round"] for run in record["runs"]}
        assert len(rounds) >= 3, f"{path.name}: {len(rounds)} rounds"
        # Each round is kept whole: every variant measured in every round, with its CPU activity.
        variants = {run["variant"] for run in record["runs"]}
        assert len(record["runs"]) == len(rounds) * len(variants), path.name
        assert all("other_cpu_share" in run["activity"] for run in record["runs"]), path.name
        for key in ("cpu", "cpu_class", "isa_flags", "torch_threads", "versions", "load_avg_1min"):
            assert key in record["machine"], (path.name, key)


def _provenance_ok(problems: list[str]) -> list[str]:
    """``problems`` without the records the check refuses for their provenance (a test of its own below)."""
    return [p for p in problems if "provenance" not in p and "LEGACY" not in p]


@pytest.mark.parametrize(("home", "name"), [(report.BENCH, "memory-summary"), (report.DETAILS, "memory")])
def test_a_missing_or_empty_block_fails_the_check(home: Path, name: str) -> None:
    """In BENCHMARKS.md and in docs/benchmark_details.md alike (issue 47: one generator, one check)."""
    texts = {path: report.render(path.read_text()) for path in report.FILES}
    assert _provenance_ok(report.problems(texts)) == []
    start, end = f"<!-- generated:{name} -->\n", f"<!-- /generated:{name} -->"
    before, rest = texts[home].split(start, 1)
    emptied = before + start + end + rest.split(end, 1)[1]
    assert _provenance_ok(report.problems(texts | {home: emptied})) == [
        f"{home.name}: the block {name} is empty",
        f"{home.name}: stale generated blocks",
    ]
    removed = texts[home].replace(start, "")
    assert _provenance_ok(report.problems(texts | {home: removed})) == [
        f"{home.name}: the block {name} is missing (<!-- generated:{name} --> ... <!-- /generated:{name} -->)"
    ]
    # A filled block that disagrees with the JSON (a number edited by hand) is stale.
    edited = texts[home].replace(start, start + "9.99x ")
    assert _provenance_ok(report.problems(texts | {home: edited})) == [f"{home.name}: stale generated blocks"]
    readme = texts[report.README].replace("<!-- generated:speed-headline -->\n", "<!-- generated:speed-headline -->\n9.99x ")
    assert _provenance_ok(report.problems(texts | {report.README: readme})) == ["README.md: stale generated blocks"]


def test_the_check_covers_the_details_page() -> None:
    """The full tables moved to docs/benchmark_details.md stay generated and checked: the page is one of the
    files the report writes and checks, it holds blocks, and it is in the site's table of contents."""
    assert report.DETAILS in report.FILES and report.DETAILS == REPO / "docs" / "benchmark_details.md"
    homes = {name: home for name, (_, home) in report.BLOCKS.items()}
    assert {"quality", "multi", "gpu", "lora", "corpus-scale"} <= {n for n, h in homes.items() if h == report.DETAILS}
    assert {"quality-summary", "bm25", "train-throughput"} <= {n for n, h in homes.items() if h == report.BENCH}
    details = report.DETAILS.read_text()
    for name in (n for n, h in homes.items() if h == report.DETAILS):
        assert f"<!-- generated:{name} -->" in details, name
    assert "benchmark_details" in (REPO / "docs" / "index.md").read_text()


def test_benchmarks_md_stays_under_30_kb() -> None:
    """Issue 47: a page a reader can take in: one claim and a headline table a section, the rest in docs/."""
    assert len((REPO / "BENCHMARKS.md").read_bytes()) <= 30_000


def test_the_bm25_block_shows_the_record() -> None:
    """Each task's BM25 and model nDCG@10, the paired difference with its interval and the verdict, as the
    record of benchmarks/retrieval_baseline.py keeps them, in BENCHMARKS.md's Retrieval section."""
    record = json.loads((RESULTS / "retrieval_baseline-cpu.json").read_text())
    task = record["tasks"]["sick-related"]
    d = task["difference"]
    row = (
        f"| sick-related | {task['bm25']['ndcg@10']:.2f} | {task['model']['ndcg@10']:.2f} | "
        f"{d['ndcg@10']:+.2f} ({d['low']:+.2f} to {d['high']:+.2f}) | {task['verdict']} |"
    )
    assert row in report.render_spec(report.BM25)
    text = report.BENCH.read_text()
    retrieval = text.split("\n## Retrieval\n", 1)[1].split("\n## ", 1)[0]
    assert "<!-- generated:bm25 -->" in retrieval and row in retrieval
    verdicts = {t["verdict"] for t in record["tasks"].values()}
    assert verdicts <= {"sound", "smoke test"} and f"`{next(iter(record['tasks']))}`" in retrieval


def test_the_bm25_also_block_shows_each_model_beside_the_judged_one() -> None:
    """A model scored with --also: its nDCG@10, both paired differences and the interval rule's verdict
    against the judged model, per task, in benchmark_details' Retrieval section."""
    record = json.loads((RESULTS / "retrieval_baseline-cpu.json").read_text())
    (name, also), *_ = record["tasks"]["sick-related"]["also"].items()
    b, d = also["minus_bm25"], also["minus_model"]
    verdict = "better" if d["low"] > 0 else "worse" if d["high"] < 0 else "no difference measured"
    row = (
        f"| sick-related | {name} | {also['ndcg@10']:.2f} | {b['ndcg@10']:+.2f} ({b['low']:+.2f} to {b['high']:+.2f}) | "
        f"{d['ndcg@10']:+.2f} ({d['low']:+.2f} to {d['high']:+.2f}) | {verdict} |"
    )
    assert row in report.render_spec(report.BM25_ALSO)
    retrieval = report.DETAILS.read_text().split("\n## Retrieval\n", 1)[1].split("\n## ", 1)[0]
    assert "<!-- generated:bm25-also -->" in retrieval and row in retrieval


@pytest.mark.parametrize(
    ("ours", "theirs", "want"),
    [
        ([1000, 1100, 1050], [1000, 1010, 1004], (46, 100, "within spread")),  # the old "-46 MiB" kind of claim
        ([100, 110, 105], [150, 152, 151], (-46, 10, "lower")),
        ([1200, 1201, 1199], [1100, 1110, 1150], (90, 50, "higher")),
        ([1000, 1010], [900, 990], (60, 90, "within spread")),
        ([1000, 1010], [900, 910], (100, 10, "higher")),
        ([1000, 1010], [990, 1000], (10, 10, "within spread")),  # equal to the spread: not beyond it
        ([1000], [900], (100, 0, "spread not measured (1 round)")),
    ],
)
def test_a_difference_counts_only_beyond_the_run_to_run_spread(
    ours: list[float], theirs: list[float], want: tuple[float, float, str]
) -> None:
    d = difference(ours, theirs)
    assert d["difference"] == pytest.approx(want[0]) and d["spread"] == pytest.approx(want[1])
    assert d["verdict"] == want[2]
    assert d["ratio"] == pytest.approx(statistics.median(ours) / statistics.median(theirs))


def rounds(
    per_variant: dict[str, list[dict[str, Any]]], busy: dict[tuple[int, str], float] | None = None
) -> list[dict[str, Any]]:
    """Runs as ``_common.run_rounds`` keeps them: variants alternating, round by round."""
    busy = busy or {}
    n = len(next(iter(per_variant.values())))
    runs = []
    for r in range(n):
        for v, results in per_variant.items():
            share = busy.get((r, v), 0.0)
            runs.append(results[r] | {"variant": v, "round": r, "activity": {"other_cpu_share": share, "busy": share > 0.05}})
    return runs


def keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, args: dict[str, Any], record: dict[str, Any]) -> None:
    """Write ``record`` as the script's kept JSON in a results folder of its own."""
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    full = {"machine": MACHINE, "args": {"threads": 2, "rounds": 3} | args, "command": f"python -m benchmarks.{script}"}
    full["provenance"] = CLEAN
    (tmp_path / f"{script}-avx2.json").write_text(json.dumps(full | record))


def test_memory_table_known_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def points(rss: list[float], sps: list[float]) -> list[dict[str, Any]]:
        return [{"peak_rss_mib": a, "sentences_per_s": b} for a, b in zip(rss, sps, strict=True)]

    runs = rounds(
        {
            "b64": points([1000, 1040, 1020], [50, 52, 51]),
            "b64-gc32": points([980, 1010, 1030], [20, 21, 22]),
            "b256-gc32": points([1100, 1150, 1120], [30, 33, 31]),
        },
        busy={(1, "b64"): 0.08},
    )
    variants = ["b64", "b64-gc32", "b256-gc32"]
    summary = summary_of(runs, variants, ("peak_rss_mib", "sentences_per_s"))
    record = {"runs": runs, "summary": summary, "comparisons": memory.comparisons(runs, variants)}
    keep(tmp_path, monkeypatch, "memory", {"precision": "auto", "max_seq_len": 32}, record)
    assert report.render_spec(report.MEMORY) == "\n".join(
        [
            "Peak RSS of the unsup recipe's training loop (auto, max length 32): `b<batch>` plain, "
            "`b<batch>-gc<chunk>` GradCache; median of the rounds (range). A difference is claimed only where it "
            "exceeds the run-to-run spread (the larger range of the two).",
            "",
            "| CPU class | point | peak RSS MiB | sentences/s | runs busy |",
            "|---|---|---|---|---|",
            "| avx2 | b64 | 1020 (1000–1040) | 51.0 (50.0–52.0) | 1/9 (max 8%) |",
            "| avx2 | b64-gc32 | 1010 (980–1030) | 21.0 (20.0–22.0) | 1/9 (max 8%) |",
            "| avx2 | b256-gc32 | 1120 (1100–1150) | 31.0 (30.0–33.0) | 1/9 (max 8%) |",
            "",
            "| CPU class | difference | peak RSS |",
            "|---|---|---|",
            "| avx2 | b64-gc32 - b64 | -10 MiB (spread 50): within spread |",
            "| avx2 | b256-gc32 - b64-gc32 | +110 MiB (spread 50): higher |",
            "",
            "- avx2, 2026-11-24 07:00 UTC: Test CPU, 2 threads; torch 2.13.0; commit abc1234; `python -m benchmarks.memory`",
        ]
    )


def test_encode_summary_compares_each_precision_with_its_own_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stsb = {"st-fp32": 82.00, "kit-fp32": 82.03, "st-bf16": 82.04, "kit-bf16": 81.99}
    summary = {v: {"stsb_test": {"median": x}} for v, x in stsb.items()}
    ratio = {"kit-fp32/st-fp32": (1.5, 1.4, 1.6), "kit-bf16/st-fp32": (3.0, 2.9, 3.1), "kit-bf16/st-bf16": (1.2, 1.1, 1.3)}
    ratios = {k: dict(zip(("median", "min", "max"), v, strict=True)) for k, v in ratio.items()}
    runs = [{"activity": {"busy": share > 0.05, "other_cpu_share": share}} for share in (0.0, 0.07, 0.01, 0.0)]
    keep(
        tmp_path,
        monkeypatch,
        "encode_throughput",
        {"batch_size": 128, "max_seq_len": 256},
        {"summary": summary, "ratios": ratios, "runs": runs},
    )
    table = report.render_spec(report.ENCODE_SUMMARY).split("\n")[2:5]
    # bf16 against ST's bf16 (1.2x), not against ST's fp32 (3.0x); the STS-B gaps kit - ST per precision.
    assert table == [
        "| CPU class | fp32: kit / ST | bf16: kit / ST | STS-B, kit − ST (fp32 / bf16) | runs busy |",
        "|---|---|---|---|---|",
        "| avx2 | **1.50x** (1.40–1.60) | **1.20x** (1.10–1.30) | +0.03 / -0.05 | 1/4 (max 7%) |",
    ]


def test_a_block_without_kept_results_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.render_spec(report.ENCODE) == (
        "Not measured under the harness yet: no `benchmarks/results/encode_throughput-*.json`. "
        "`python -m benchmarks.encode_throughput` on a quiet machine keeps one; "
        "`python -m benchmarks.report` then fills this block."
    )


def test_memory_points_and_their_names() -> None:
    args = type("Args", (), {"batch_sizes": [64, 256, 1024], "chunk": 128, "max_plain_batch": 256})()
    # No GradCache at 64 (one chunk of 128 rows holds all 2 x 64), no plain run above 256.
    assert memory.points(args) == ["b64", "b256", "b256-gc128", "b1024-gc128"]
    assert memory.parse_variant("b1024-gc128") == (1024, 128) and memory.parse_variant("b64") == (64, 0)


def test_the_guard_cost_script_times_both_builds_and_records_what_it_timed(tmp_path: Path) -> None:
    """contamination_cost.py end to end on 3,000 lines: its no-keys build gives the cache a numbered key per row
    (the build counts repeated texts from the keys; an empty stand-in stopped it with an IndexError), and the
    record's command names --tokens when the token table was timed."""
    from benchmarks.contamination_cost import NumberedKeys

    numbered = NumberedKeys()
    first, second = numbered([["a", "b", "c"]]), numbered([["d", "e"], ["f", "g"]])
    assert first.tolist() == [[0], [1], [2]] and second.tolist() == [[3, 3], [4, 4]]
    out = tmp_path / "cost.json"
    argv = ["--lines", "3000", "--rounds", "1", "--tokens", "--work", str(tmp_path / "work")]
    argv += ["--allow-busy", "--allow-dirty", "--json", str(out)]  # a test runs in a checkout being edited
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.contamination_cost", *argv], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert [len(record["seconds"][v]) for v in ("keys", "no-keys")] == [1, 1] and record["token_table_s"] > 0
    assert record["command"] == "python -m benchmarks.contamination_cost --lines 3000 --rounds 1 --tokens"
    assert record["added_to_text_cache"] == pytest.approx(record["median_keys_s"] / record["median_no_keys_s"] - 1)


@pytest.mark.slow  # three fresh interpreters encoding with the real all-MiniLM-L6-v2 (~15 s CPU)
def test_a_harness_script_keeps_every_round_with_its_machine(tmp_path: Path) -> None:
    """encode_throughput.py end to end on 64 sentences (fresh interpreters, seconds): each round
    kept with its CPU activity, the machine and the command, the summary their median, and the
    summary printed as BENCHMARKS.md's table."""
    out = tmp_path / "encode.json"
    argv = ["--rounds", "2", "--variants", "kit-fp32", "--limit", "64", "--batch-size", "16", "--threads", "1"]
    argv += ["--allow-busy", "--allow-dirty", "--json", str(out)]  # a test runs in a checkout being edited
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.encode_throughput", *argv], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert [(r["round"], r["variant"], r["sentences"]) for r in record["runs"]] == [(0, "kit-fp32", 64), (1, "kit-fp32", 64)]
    assert all({"other_cpu_share", "busy", "load_avg_before", "load_avg_after"} <= set(r["activity"]) for r in record["runs"])
    assert record["command"] == "python -m benchmarks.encode_throughput " + " ".join(argv)
    assert record["machine"]["torch_threads"] == 1 and record["args"]["rounds"] == 2
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record["provenance"]["commit"] == head and record["provenance"]["threads"] == 1
    speeds = [r["sentences_per_s"] for r in record["runs"]]
    assert record["summary"]["kit-fp32"]["sentences_per_s"] == pytest.approx(
        {"median": statistics.median(speeds), "min": min(speeds), "max": max(speeds), "n": 2}
        | {"half_range_pct": 100 * (max(speeds) - min(speeds)) / 2 / statistics.median(speeds)}
    )
    assert "| CPU class | variant | sentences/s |" in done.stdout and "| kit-fp32 |" in done.stdout


def test_lora_tables_known_answer() -> None:
    """The LoRA step table: trained parameters, peak RSS, s/step and the ratio to kit-full paired within each
    round (0.5, 0.25, 1.0: median 0.5); the quality verdict: LoRA against full and against the peer's LoRA."""
    steps = {"m:unsup:kit-full": (2.0, 4.0, 1.0), "m:unsup:kit-lora": (1.0, 1.0, 1.0)}
    runs = [
        {"round": r, "variant": v, "s_per_step": t[r], "peak_rss_mib": 1000.0 + r, "trainable": 10 if "lora" in v else 1000}
        for r in range(3) for v, t in steps.items()
    ]  # fmt: skip
    record = {"runs": runs, "summary": summary_of(runs, list(steps), ("s_per_step", "peak_rss_mib", "trainable"))}
    assert list(report.LORA_STEPS.rows(record)) == [
        ["m", "unsup", "kit-full", "1,000", "1001 (1000–1002)", "2.00 (1.00–4.00)", "**1.00x** (1.00–1.00)"],
        ["m", "unsup", "kit-lora", "10", "1001 (1000–1002)", "1.00 (1.00–1.00)", "**0.50x** (0.25–1.00)"],
    ]
    averages = {"kit-unsup": 80.0, "kit-lora-unsup": 79.5, "st-lora-unsup": 79.0}
    results = {name: {"mean": {"avg": avg}} for name, avg in averages.items()}
    assert report._lora_verdict([{"model": "/models/all-MiniLM-L6-v2", "results": results}]) == [
        f"- all-MiniLM-L6-v2, unsup: `kit-lora-unsup` averages 79.50 (-0.50 against `kit-unsup`, {NO}, +0.50 against "
        f"`st-lora-unsup`, {NO})."
    ]


def test_scored_table_known_answer() -> None:
    """The scored table's rows (rate, seeds, columns, the best steps per seed) and its verdict: the kit
    against the peer with the same loss, and both against the base, on STS-B test; with transfer scores,
    the SentEval transfer gap by Welch's interval over the seeds (hand-computed below)."""
    cols = {"STSBenchmark": 84.0, "SICKRelatedness": 78.0, "avg": 80.0, "best_stsb_dev": 88.0, "best_step": 60.0}
    row = {"mean": cols, "std": dict.fromkeys(cols, 0.5), "per_seed": {"1": cols, "2": cols | {"best_step": 120.0}}}
    results = {
        "base": {"mean": {"STSBenchmark": 82.0, "avg": 78.0}, "std": {}, "per_seed": {"0": {}}, "learning_rate": None},
        "kit-cosent": row | {"learning_rate": 2e-5},
        "st-cosent": row | {"learning_rate": 5e-5, "mean": cols | {"STSBenchmark": 83.5, "avg": 79.0}},
    }
    rows = list(report.SCORED.rows({"results": results}))
    old = "not counted (record predates the guard)"
    assert rows[1] == [
        "kit-cosent",
        "2e-05",
        "2",
        *["84.00 ± 0.50", "78.00 ± 0.50", "80.00 ± 0.50", "–", "88.00 ± 0.50"],
        "90 (60, 120)",
        old,
    ]
    assert rows[0][:3] == ["base", "–", "1"] and rows[2][3] == "83.50 ± 0.50"
    assert report._scored_verdict([{"results": results}]) == [
        "- cosent: STS-B test 84.00 (simcse-kit) against 83.50 (sentence-transformers), +0.50; over the base (82.00) "
        f"+2.00 and +1.50; 7-task average 80.00 against 79.00 ({NO})."
    ]
    results["kit-cosent-fp32"] = row | {"learning_rate": 2e-5, "mean": cols | {"STSBenchmark": 83.25, "avg": 79.5}}
    assert report._scored_verdict([{"results": results}])[1] == (
        f"- cosent, simcse-kit in fp32: STS-B test 83.25 against 83.50, -0.25; 7-task average 79.50 ({NO})."
    )
    # Transfer averages per seed: kit 83.6, 83.8; peer 83.0, 83.2. Difference 0.60; each variance 0.02, so
    # se = sqrt(0.02 / 2 + 0.02 / 2) = 0.1414 on Welch's df = 0.02^2 / (0.01^2 + 0.01^2) = 2; t(0.975, 2) = 4.3027,
    # half-width 0.6085: -0.01 to +1.21, which holds zero.
    for name, seeds in (("kit-cosent", (83.6, 83.8)), ("st-cosent", (83.0, 83.2))):
        r = results[name]
        per_seed = {k: v | {"transfer:avg": t} for (k, v), t in zip(r["per_seed"].items(), seeds, strict=True)}
        mean, std = r["mean"] | {"transfer:avg": sum(seeds) / 2}, r["std"] | {"transfer:avg": 0.1414}
        results[name] = r | {"mean": mean, "std": std, "per_seed": per_seed}
    assert list(report.SCORED.rows({"results": results}))[1][6] == "83.70 ± 0.14"
    assert report._scored_verdict([{"results": results}])[1:3] == [
        "- SentEval transfer avg, `kit-cosent` − `st-cosent`: +0.60 (95% interval -0.01 to +1.21): no difference measured.",
        f"- cosent, simcse-kit in fp32: STS-B test 83.25 against 83.50, -0.25; 7-task average 79.50 ({NO}).",
    ]
    transfer = "- SentEval transfer avg, `kit-cosent` − `st-cosent`: +0.60 (95% interval -0.01 to +1.21): "
    assert report._scored_summary_verdict([{"results": results}]) == [  # the headline: each kit row against the peer
        f"- `kit-cosent` − `st-cosent`: {NO}.",
        transfer + "no difference measured.",
        f"- `kit-cosent-fp32` − `st-cosent`: {NO}.",
    ]
    assert report.SCORED_SUMMARY.intro([{"results": results}]) == "STS-B test (the untouched base: 82.00):"  # type: ignore[operator]
    assert report.SCORED.intro([{"transfer_kfold": 5, "transfer_normalize": True, "command": "x"}]).endswith(  # type: ignore[operator]
        "SentEval transfer: 5-fold."
    )


def test_domain_and_teacher_tables_carry_the_transfer_average_and_its_verdict() -> None:
    """The domain and teacher tables: a SentEval transfer column after the 7-task average ('–' in a record that did not
    score it), and below the dev-chosen kit row's line its transfer gap to the base and to the best peer by Welch's
    interval (hand-computed below), and each trained row's scores under its domain's base; BENCHMARKS.md's headline
    keeps the peer's gaps only."""

    def row(kind: str, target: float, dev: float, transfer: tuple[float, ...]) -> dict[str, Any]:
        per_seed = {str(i): {"transfer:avg": t} for i, t in enumerate(transfer, 1)}
        mean = {"SICKRelatedness": target, "avg": 79.0, "best_stsb_dev": dev}
        if transfer:
            mean["transfer:avg"] = sum(transfer) / len(transfer)
        return {"kind": kind, "domain": "sick", "target": "SICKRelatedness", "learning_rate": None, "mean": mean,
                "std": dict.fromkeys(mean, 0.1), "per_seed": per_seed or {"1": {}}}  # fmt: skip

    results = {
        "sick-base": row("base", 77.0, 80.0, (83.0,)),
        "sick-kit-similarity": row("kit", 78.0, 81.0, (83.5, 83.7, 83.9)),
        "sick-kit-unsup": row("kit", 79.0, 80.5, (84.0, 84.0, 84.0)),  # higher on test, lower on dev: not chosen
        "sick-st-mse": row("st", 77.5, 80.9, (83.2, 83.4, 83.6)),
    }
    rows = list(report.TEACHER.rows({"results": results}))
    assert [r[5] for r in rows] == ["83.00", "83.70 ± 0.10", "84.00 ± 0.10", "83.40 ± 0.10"]
    assert report.TEACHER.head == report.DOMAIN.head and report.TEACHER.script == "teacher"
    record = {"results": results, "transfer_kfold": 5, "transfer_normalize": True, "command": "x --teacher t"}
    assert report.TEACHER.intro([record]) == "SentEval transfer: 5-fold; the teacher not scored (`--transfer-teacher`)."  # type: ignore[operator]
    # Against the one-seed base (no variance): se = sqrt(0.04 / 3) = 0.1155 on 2 df, t 4.3027: 0.70 ± 0.50.
    # Against the peer: two variances 0.04 over 3 seeds, se = 0.1633 on df 4, t 2.7764: 0.30 ± 0.45.
    base = "- SentEval transfer avg, `sick-kit-similarity` − `sick-base`: +0.70 (95% interval +0.20 to +1.20): better."
    peer = (
        "- SentEval transfer avg, `sick-kit-similarity` − `sick-st-mse`: +0.30 (95% interval -0.15 to +0.75): "
        "no difference measured."
    )
    lines = report._domain_verdict([record])
    assert lines[0].startswith("- sick: chosen on dev `sick-kit-similarity`, SICKRelatedness 78.00: +1.00 over the base")
    assert lines[1:] == [base, peer]
    # BENCHMARKS.md: one line per domain, against the best peer only (no per-pair data here: no 7-task interval).
    headline = "- sick: `sick-kit-similarity` (chosen on dev) − the best peer `sick-st-mse`{}: 7-task avg {}; "
    transfer = "SentEval transfer avg {} (95% interval {}): {}."
    assert report._domain_headline([record]) == [
        headline.format("", report.NO_INTERVAL) + transfer.format("+0.30", "-0.15 to +0.75", "no difference measured")
    ]
    kept = {str(i): {"transfer:avg": 83.0, "best_step": 0} for i in (1, 2, 3)}  # a peer that kept the base: said once
    record["results"] = results | {"sick-st-mse": row("st", 77.0, 80.9, (83.0,) * 3) | {"per_seed": kept}}
    lines = report._domain_verdict([record])
    assert "+1.00 over the base and the best peer `sick-st-mse`, which kept it in every seed (" in lines[0]
    assert lines[1:] == [base]
    assert report._domain_headline([record]) == [
        headline.format(" (kept the base)", report.NO_INTERVAL) + transfer.format("+0.70", "+0.20 to +1.20", "better")
    ]
    # A trained row under its domain's base (not the record's "base": there is none) says so, with its seed std.
    record["results"] = results | {"sick-st-ct": row("st", 76.5, 79.0, (82.4, 82.5, 82.6))}
    assert report._domain_verdict([record])[-1] == (
        "- `sick-st-ct` below the untouched base: SICK-R -0.50 (std 0.10), SentEval transfer avg -0.50 (std 0.10)."
    )
    for name in results:  # a record without transfer scores: '–' and no transfer line
        results[name] = row(results[name]["kind"], 77.0, 80.0, ())
    assert [r[5] for r in report.DOMAIN.rows({"results": results})] == ["–"] * 4
    assert len(report._domain_verdict([{"results": results}])) == 1


def test_multi_verdict_known_answer() -> None:
    """Each record's machine, the mixture against a one-dataset row, and each teacher row of 3+ seeds
    against the 80.5 goal and the base's nDCG@10. Without per-pair data no mean is said to reach or miss
    the goal (even 80.50 or 80.49: report.goal_verdict's interval decides, tests/test_stats.py); an equal
    nDCG@10 is at least the base's, 2 seeds say nothing; each seed's average is listed, and a record
    from before the guard says its test pairs were not counted."""
    goal = f"against 80.5: {NO}"
    uncounted = "test pairs trained on: not counted (record predates the guard)"

    def row(avg: float, seeds: int = 3, ndcg: float | None = None) -> dict[str, Any]:
        sound = {"retrieval:stsb-similar": ndcg - 1, "retrieval:sick-related": ndcg + 1} if ndcg is not None else {}
        mean = {"avg": avg, "retrieval:mrpc-paraphrase": 0.0} | sound  # the smoke test is left out of nDCG@10
        return {"mean": mean, "std": {"avg": 0.1}, "per_seed": {str(s): {} for s in range(seeds)}}

    each = {"1": {"avg": 80.6}, "2": {"avg": 80.3}, "3": {"avg": 80.6}}  # a seed below 80.5 is named
    cpu = {"machine": {"device": "cpu"}, "results": {
        "base": row(78.87, 1, 89.77), "kit-unsup": row(80.0, ndcg=89.8), "kit-multi": row(80.1, ndcg=89.4),
        "kit-multi-teacher-t0.1": row(80.5, ndcg=89.5) | {"per_seed": each},
        "kit-multi-teacher": row(80.49, ndcg=89.77),
        "kit-multi-teacher-t0.05": row(81.0, seeds=2),
    }}  # fmt: skip
    gpu = {"machine": {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}, "results": {"kit-multi-teacher": row(80.7)}}
    assert report._multi_verdict([cpu, gpu]) == [
        f"- CPU: `kit-multi` − `kit-unsup`: +0.10 on the 7-task average, -0.40 nDCG@10 (sound tasks); {NO}",
        f"- CPU: `kit-multi-teacher-t0.1` averages 80.50 ± 0.10 over 3 seeds (seeds: 80.60, 80.30, 80.60), {goal}; "
        f"nDCG@10 (sound tasks) 89.50 against the base's 89.77, below it; {uncounted}",
        f"- CPU: `kit-multi-teacher` averages 80.49 ± 0.10 over 3 seeds, {goal}; "
        f"nDCG@10 (sound tasks) 89.77 against the base's 89.77, at least it; {uncounted}",
        f"- H100: `kit-multi-teacher` averages 80.70 ± 0.10 over 3 seeds, {goal}; nDCG@10 not measured; {uncounted}",
    ]
    assert list(report._multi_rows(gpu))[0][:2] == ["H100", "kit-multi-teacher"]


def test_teacher_general_table_known_answer() -> None:
    """The distillation table's rows (rate, seeds, the seven tasks, the sound retrieval tasks, the transfer average,
    the guard's count) and its verdict: the recipe against the base and the peer, and every average it lowers
    below the base named, the transfer average among them."""
    sts = dict.fromkeys(report.STS[:-1], 80.0) | {"avg": 80.0, "best_stsb_dev": 87.0, "best_step": 50.0}
    ndcg = {f"retrieval:{t}": 90.0 for t in report.SOUND_TASKS}
    seeds = {"1": sts | ndcg, "2": sts | ndcg | {"best_step": 100.0}}
    clean = {t: [0, 100] for t in report.STS[:-1]}

    def row(kind: str, lr: float | None, **mean: float) -> dict[str, Any]:
        cols = sts | ndcg | {"transfer:avg": 85.0} | {k.replace("_", ":"): v for k, v in mean.items()}
        per_seed = seeds if lr is not None else {"0": cols}
        if lr is not None:  # the transfer interval is drawn over the seeds: 84.75 and 85.25
            per_seed = {k: v | {"transfer:avg": t} for (k, v), t in zip(seeds.items(), (84.75, 85.25), strict=True)}
        return {"kind": kind, "learning_rate": lr, "n": len(per_seed), "mean": cols, "std": dict.fromkeys(cols, 0.25),
                "per_seed": per_seed} | ({"test_pairs_seen": clean} if lr is not None else {})  # fmt: skip

    results = {
        "base": row("base", None, SICKRelatedness=81.0, transfer_avg=85.5, avg=79.0),
        "kit-similarity": row("kit", 3e-5),
        "st-mse": row("st", 1e-4, avg=79.75),
    }
    rows = list(report.TEACHER_GENERAL.rows({"results": results}))
    assert rows[0][:3] == ["base", "–", "1"] and rows[0][-4:] == ["90.00", "85.50", "50", "–"]
    ms = "80.00 ± 0.25"
    assert rows[1] == ["kit-similarity", "3e-05", "2", *[ms] * 8, "87.00 ± 0.25", "90.00 ± 0.00", "85.00 ± 0.25",
                       "75 (50, 100)", "0"]  # fmt: skip
    assert rows[2][:3] == ["st-mse", "0.0001", "2"] and rows[2][10] == "79.75 ± 0.25"
    assert report._teacher_general_verdict([{"results": results}]) == [
        f"- `kit-similarity` − `base`: +1.00; {NO}.",
        # Two seeds 0.5 apart: standard error 0.25, 1 degree of freedom (t 12.706), against a deterministic base.
        "- SentEval transfer avg, `kit-similarity` − `base`: -0.50 (95% interval -3.68 to +2.68): no difference measured.",
        f"- `kit-similarity` − `st-mse`: +0.25; {NO}.",
        # Two seeds each: standard error sqrt(2 x 0.125 / 2) = 0.354, 2 degrees of freedom (t 4.303).
        "- SentEval transfer avg, `kit-similarity` − `st-mse`: +0.00 (95% interval -1.52 to +1.52): no difference measured.",
        "- `kit-similarity` below the untouched base: SICK-R -1.00 (std 0.25), SentEval transfer avg -0.50 (std 0.25).",
    ]


def _write(folder: Path, stem: str, record: dict[str, Any]) -> None:
    (folder / f"{stem}.json").write_text(json.dumps({"machine": MACHINE, "command": "python -m benchmarks.memory"} | record))


def test_the_check_refuses_a_record_without_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49: only the runner writes a record, stamped; a record without the stamp fails the check unless it is
    one of the LEGACY records (tolerated, and marked in its table), and LEGACY can only shrink."""
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "LEGACY", frozenset({"old-cpu", "gone-cpu"}))
    _write(tmp_path, "old-cpu", {})
    _write(tmp_path, "typed-cpu", {})
    _write(tmp_path, "clean-cpu", {"provenance": CLEAN})
    _write(tmp_path, "dirty-cpu", {"provenance": CLEAN | {"dirty": True}})
    assert report.provenance_problems() == [
        "typed-cpu.json: no provenance (commit, dirty, threads): re-run it; only its runner writes a record",
        "report.LEGACY names 'gone-cpu', which has no record: remove it",
    ]
    _write(tmp_path, "old-cpu", {"provenance": {"commit": "abc"}})  # re-run: it must leave LEGACY
    assert report.provenance_problems()[0] == "old-cpu.json: has provenance now: remove 'old-cpu' from report.LEGACY"
    assert any(p.startswith("typed-cpu.json: no provenance") for p in report.problems({}))  # what --check runs
    # The tables say which records are not evidence.
    line = {stem: report.machine_line(json.loads((tmp_path / f"{stem}.json").read_text()) | {"_file": stem})
            for stem in ("clean-cpu", "dirty-cpu", "typed-cpu")}  # fmt: skip
    assert line["clean-cpu"].endswith("`python -m benchmarks.memory`")
    assert line["dirty-cpu"].endswith("`python -m benchmarks.memory` (written from a dirty tree: not evidence; to be re-run)")
    assert line["typed-cpu"].endswith("`python -m benchmarks.memory` (no provenance: report --check refuses it)")
    legacy = report.machine_line({"machine": MACHINE, "command": "c", "_file": "gone-cpu"})
    assert legacy.endswith("`c` (record predates provenance; to be re-run)")
    # BENCHMARKS.md's lines leave the ISA flags and library versions to the full tables' (the page stays short);
    # a limit on the kernels stays on both.
    assert (
        legacy == "- 2026-11-24 07:00 UTC: Test CPU; torch 2.13.0; commit abc1234; `c` (record predates provenance; to be re-run)"
    )
    flagged = {"machine": MACHINE | {"isa_flags": ["avx2", "avx512f"]}, "command": "c", "_file": "gone-cpu"}
    assert report.machine_line(flagged).startswith("- 2026-11-24 07:00 UTC: Test CPU (avx2, avx512f); torch 2.13.0;")
    assert report.machine_line(flagged, full=False) == legacy.replace("; torch 2.13.0", "")
    limited = flagged | {"machine": flagged["machine"] | {"kernel_limits": {"ATEN_CPU_CAPABILITY": "avx2"}}}
    assert "Test CPU (avx2, avx512f; kernels limited to AVX2); torch" in report.machine_line(limited)
    short = report.machine_line(limited, full=False)
    assert short.startswith("- 2026-11-24 07:00 UTC: Test CPU (kernels limited to AVX2); commit")


def test_a_speed_record_names_the_cpu_generation_a_model_name_hides() -> None:
    """Two "AMD EPYC" machines of one CPU class encoded at 459 and 923 sentences/s with the same ST code: the record
    keeps the x86 family and model of /proc/cpuinfo's first processor, and the machine line prints them."""
    from benchmarks._common import cpu_generation

    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\n"
    assert cpu_generation(cpuinfo + "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\n") == "family 26 model 2"
    assert cpu_generation("processor\t: 0\nmodel name\t: ARM\n") == ""  # no family: nothing is guessed
    named = {"machine": MACHINE | {"cpu_generation": "family 26 model 2"}, "command": "c", "_file": "gone-cpu"}
    assert report.machine_line(named, full=False).startswith("- 2026-11-24 07:00 UTC: Test CPU family 26 model 2; commit")
    # A record written outside the checkout (--json) is shown with the command that remakes it in results/.
    moved = named | {"command": "python -m benchmarks.memory --json /tmp/out/memory.json --rounds 3"}
    assert "; commit abc1234; `python -m benchmarks.memory --rounds 3` (" in report.machine_line(moved)
    # BENCHMARKS.md's line leaves that machine's paths (data, caches, runs) to the full line; other options stay.
    paths = " --output-dir /w/runs --data-root=/w/data --teacher-cache-dir /w/cache --work /tmp/c"
    local = named | {"command": f"python -m benchmarks.quality teacher --teacher /m/mpnet{paths} --seeds 1,2"}
    assert f"`python -m benchmarks.quality teacher --teacher /m/mpnet{paths} --seeds 1,2` (" in report.machine_line(local)
    short = "`python -m benchmarks.quality teacher --teacher /m/mpnet --seeds 1,2` ("
    assert short in report.machine_line(local, full=False)


def test_the_kept_records_without_provenance_are_exactly_the_legacy_list() -> None:
    lacking = {p.stem for p in RESULTS.glob("*.json") if "provenance" not in json.loads(p.read_text())}
    assert lacking == report.LEGACY  # every legacy record still lacks it; no other record does
    assert report.provenance_problems() == []


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def test_save_results_stamps_provenance_and_refuses_a_dirty_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import _common

    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", "--allow-empty")
    _git(repo, "add", "code.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    monkeypatch.setattr(_common, "REPO", repo)
    out = repo / "benchmarks" / "results" / "x-cpu.json"
    _common.save_results(out, {"machine": {"torch_threads": 3}})
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    stamp = json.loads(out.read_text())["provenance"]
    assert stamp == {"commit": head, "dirty": False, "threads": 3, "writer": "benchmarks._common.save_results"}
    # The untracked record just written does not make the tree dirty, nor does a committed record
    # rewritten by the next run; a changed file does, and so does a new one.
    assert not _common.tree_dirty()
    _git(repo, "add", str(out))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "record")
    _common.save_results(out, {"machine": {"torch_threads": 2}})
    assert not _common.tree_dirty()
    (repo / "code.py").write_text("x = 2\n")
    assert _common.tree_dirty()
    with pytest.raises(SystemExit, match="uncommitted changes"):
        _common.save_results(out, {"machine": {"torch_threads": 3}})
    assert json.loads(out.read_text())["provenance"]["dirty"] is False  # refused: the old record stays
    _common.save_results(out, {"machine": {"torch_threads": 3}}, allow_dirty=True)
    assert json.loads(out.read_text())["provenance"]["dirty"] is True
    _git(repo, "checkout", "code.py")
    (repo / "new.py").write_text("")
    assert _common.tree_dirty()


def test_every_runner_writes_its_record_through_save_results() -> None:
    """A record is written by its runner alone, stamped (issue 49): every benchmark script calls save_results,
    itself or through the harness. The modules that write no record are named here, and only they."""
    from benchmarks._common import REPO

    no_record = {"__init__", "_common", "_harness", "report", "stats", "st_peers", "int8_batches"}
    scripts = {p.stem: p.read_text(encoding="utf-8") for p in (REPO / "benchmarks").glob("*.py")}
    unstamped = [n for n, text in scripts.items() if n not in no_record and not re.search(r"save_results\(|_harness", text)]
    assert unstamped == [], f"write their record without provenance: {unstamped}"
    assert "json.dumps" not in scripts["int8_batches"].replace("print(json.dumps", "")  # it prints, keeps nothing


def test_negatives_table_reads_the_sound_retrieval_tasks_and_the_guards_count() -> None:
    """The mined-negatives table's nDCG@10 is the mean over the sound tasks only (mrpc-paraphrase, a smoke test, is
    left out), then the SentEval transfer average (Welch's t over the seeds for k = 3 − k = 1), and its last column
    the guard's count; the k = 3 − k = 1 verdict takes the same nDCG@10. A row below the untouched base says so, but
    not for a gap that rounds to 0.00."""

    def row(kind: str, stsb: float, sick: float, transfer: list[float]) -> dict[str, Any]:
        seed = {
            "avg": 79.0,
            "STSBenchmark": 82.0,
            "best_stsb_dev": 86.0,
            "best_step": 0.0,
            "retrieval:mrpc-paraphrase": 10.0,
            "retrieval:stsb-similar": stsb,
            "retrieval:sick-related": sick,
        }
        n = max(len(transfer), 1)
        per_seed = {str(i): seed | ({"transfer:avg": transfer[i]} if transfer else {}) for i in range(n)}
        mean = seed | {"retrieval:avg": (10.0 + stsb + sick) / 3}
        std = dict.fromkeys(mean, 0.0)
        if transfer:
            mean["transfer:avg"], std["transfer:avg"] = sum(transfer) / n, 0.1  # the std of either row's seeds
        return {"kind": kind, "rows": 5059 if kind != "base" else None, "n": n, "mean": mean,
                "std": std, "per_seed": per_seed,
                **({"test_pairs_seen": {"STS12": [0, 3108]}} if kind != "base" else {})}  # fmt: skip

    results = {"base": row("base", 80.0, 90.0, []), "hardneg-k1": row("kit", 81.0, 89.0, [83.0, 83.2, 83.1]),
               "hardneg-k3": row("kit", 82.0, 89.996, [83.5, 83.6, 83.4])}  # fmt: skip
    rows = list(report.NEGATIVES.rows({"results": results}))
    assert rows[0] == ["base", "–", "1", "79.00", "82.00", "86.00", "0", "85.00", "–", "–"]
    assert rows[1][1:3] == ["5,059", "3"] and rows[1][-3:] == ["85.00 ± 0.00", "83.10 ± 0.10", "0"]
    assert rows[2][-3:] == ["86.00 ± 0.00", "83.50 ± 0.10", "0"]
    # The headline keeps the row's name, seeds, 7-task average, nDCG@10 and transfer average.
    assert report.MINING_SUMMARY.script == "negatives"
    headline_rows = list(report.MINING_SUMMARY.rows({"results": results}))
    assert headline_rows[1] == ["hardneg-k1", "3", "79.00 ± 0.00", "85.00 ± 0.00", "83.10 ± 0.10"]
    line, transfer, below = report._negatives_verdict([{"results": results}])
    assert line.startswith("- k = 3 − k = 1 (the same rows): +0.00 on the 7-task average, +1.00 nDCG@10 (sound tasks); ")
    # Welch's t by hand: differences of means 0.40, each row's seed variance 0.01, 3 seeds: se 0.0816, t(4) 2.776.
    assert transfer == "- SentEval transfer avg, `hardneg-k3` − `hardneg-k1`: +0.40 (95% interval +0.17 to +0.63): better."
    assert below == "- `hardneg-k1` below the untouched base: nDCG@10 sick-related -1.00 (std 0.00)."
    # Where no gap has an interval, the headline keeps one line for them, and the below-base lines.
    headline = report._or_no_interval(lambda kept: [f"- a gap; {report.NO_INTERVAL}", below])([])
    assert headline == ["- No interval on these differences: the record predates per-pair data.", below]


def test_guide_tables_carry_the_transfer_average_and_its_verdict_against_both_rows() -> None:
    """The guide's full table puts each row's SentEval transfer average after nDCG@10 avg, its headline after nDCG@10
    over the sound tasks, and the verdict gives the guided row's transfer gap to the unguided row and to the peer,
    each by Welch's t over the seeds (hand-computed below); the untouched base, one seed, has no interval."""
    keys = ("avg", "STSBenchmark", "best_stsb_dev", "retrieval:avg", *(f"retrieval:{t}" for t in report.GUIDE_TASKS))

    def row(kind: str, transfer: list[float]) -> dict[str, Any]:
        seed = dict.fromkeys(keys, 80.0) | {"best_step": 0.0}
        per_seed = {str(i): seed | {"transfer:avg": t} for i, t in enumerate(transfer)}
        mean = seed | {"transfer:avg": sum(transfer) / len(transfer)}
        std = dict.fromkeys(mean, 0.0) | {"transfer:avg": 0.1 if len(transfer) > 1 else 0.0}
        return {"kind": kind, "n": len(transfer), "mean": mean, "std": std, "per_seed": per_seed}

    results = {"base": row("base", [83.0]), "kit-hardneg": row("kit", [83.0, 83.2, 83.1]),
               "kit-hardneg-guide": row("kit", [83.5, 83.6, 83.4]), "st-gist": row("st", [82.9, 83.0, 83.1])}  # fmt: skip
    head = str(report.GUIDE.head).split("|")
    at = head.index("SentEval transfer avg")
    assert head[at - 1] == "nDCG@10 avg" and head[at + 1] == "entries masked by the guide"
    full = list(report.GUIDE.rows({"results": results}))
    assert [r[at] for r in full] == ["83.00", "83.10 ± 0.10", "83.50 ± 0.10", "83.00 ± 0.10"]
    assert str(report.GUIDE_SUMMARY.head).endswith("|nDCG@10 (sound tasks)|SentEval transfer avg")
    assert [r[-1] for r in report.GUIDE_SUMMARY.rows({"results": results})] == [r[at] for r in full]
    lines = [x for x in report._guide_verdict([{"results": results}]) if x.startswith("- SentEval transfer avg")]
    # Each pair: seed variances 0.01, 3 seeds: se 0.0816, t(4) 2.776, half-width 0.23.
    assert lines == [
        "- SentEval transfer avg, `kit-hardneg-guide` − `kit-hardneg`: +0.40 (95% interval +0.17 to +0.63): better.",
        "- SentEval transfer avg, `kit-hardneg-guide` − `st-gist`: +0.50 (95% interval +0.27 to +0.73): better.",
    ]
    # A row below the base: the full table's verdict names it, the headline only the guided row.
    results["kit-hardneg"]["mean"]["retrieval:sick-related"] = 79.0
    below = "- `kit-hardneg` below the untouched base: nDCG@10 sick-related -1.00 (std 0.00)."
    assert below in report._guide_verdict([{"results": results}])
    assert callable(report.GUIDE_SUMMARY.after) and below not in report.GUIDE_SUMMARY.after([{"results": results}])
    results["kit-hardneg-guide"]["mean"]["retrieval:sick-related"] = 79.0
    assert below.replace("`kit-hardneg`", "`kit-hardneg-guide`") in report.GUIDE_SUMMARY.after([{"results": results}])


def test_quality_and_guide_tables_end_with_the_guards_count_of_test_pairs_trained_on() -> None:
    """The quality and guide tables' last column is the guard's count: ``0`` for a row trained on no test pair,
    the pairs and the worst task's share for one that was, "–" for the untouched base, and "not counted" for a
    row from before the guard."""
    keys = (*report.STS, "best_stsb_dev", "retrieval:avg", *(f"retrieval:{t}" for t in report.GUIDE_TASKS))
    seed = dict.fromkeys(keys, 80.0)

    def row(kind: str, seen: dict[str, list[int]] | None) -> dict[str, Any]:
        out = {"kind": kind, "n": 1, "mean": seed, "std": dict.fromkeys(seed, 0.0), "per_seed": {"1": seed}}
        return out | ({"test_pairs_seen": seen} if seen is not None else {})

    results = {
        "base": row("base", None),
        "clean": row("kit", {"STS12": [0, 3108], "SICKRelatedness": [0, 4927]}),
        "seen": row("st", {"STS12": [14, 3108], "SICKRelatedness": [2533, 4927]}),
        "old": row("kit", None),
    }
    for spec in (report.QUALITY, report.GUIDE):
        assert isinstance(spec.head, str) and spec.head.endswith("|test pairs trained on")
        last = [r[-1] for r in spec.rows({"results": results})]
        assert last == [
            "–", "0", "2,547 in 2 tasks, at most 51.4% (SICK-R); clean-task avg 80.00 (STS12)",
            "not counted (record predates the guard)",
        ]  # fmt: skip
    for spec in (report.DOMAIN, report.TEACHER, report.MULTI, report.SCORED):
        assert isinstance(spec.head, str) and spec.head.endswith("|test pairs trained on")


def test_a_contaminated_row_carries_the_average_over_the_tasks_the_guard_calls_clean() -> None:
    """The guard marks a task at 1% of its pairs trained on (the package's threshold, kept equal here); the cell then
    gives the other tasks' average, its mean and sample std over the seeds, hand-computed."""
    from simcse_kit.evaluation.contamination import CONTAMINATED_SHARE

    assert report.CONTAMINATED_SHARE == CONTAMINATED_SHARE
    tasks = report.STS[:-1]
    seeds = {"1": dict(zip(tasks, (70.0, 80.0, 75.0, 85.0, 79.0, 82.0, 77.0), strict=True)),
             "2": dict(zip(tasks, (72.0, 82.0, 75.0, 85.0, 79.0, 90.0, 99.0), strict=True))}  # fmt: skip
    # STS12 at 32/3108 (1.03%) and STS-B at 14/1379 (1.02%) are contaminated; STS13 at 14/1500 (0.93%) is not.
    seen = dict.fromkeys(tasks, [0, 1000]) | {"STS12": [32, 3108], "STS13": [14, 1500], "STSBenchmark": [14, 1379]}
    row = {"per_seed": seeds, "test_pairs_seen": seen}
    # clean: STS13, STS14, STS15, STS16, SICK-R -> seed 1: 396 / 5 = 79.2, seed 2: 420 / 5 = 84.0; std 4.8 / sqrt 2
    assert report._seen(row) == "60 in 3 tasks, at most 1.0% (STS12); clean-task avg 81.60 ± 3.39 (5 of 7)"
    # STS13 and SICK-R (3/4927) clean -> seed 1: (80 + 77) / 2, seed 2: (82 + 99) / 2; std 12 / sqrt 2
    two = dict.fromkeys(tasks, [500, 1000]) | {"STS13": [0, 1500], "SICKRelatedness": [3, 4927]}
    assert report._seen({"per_seed": seeds, "test_pairs_seen": two}).endswith("clean-task avg 84.50 ± 8.49 (STS13, SICK-R)")
    everywhere = dict.fromkeys(tasks, [500, 1000])
    assert report._seen({"per_seed": seeds, "test_pairs_seen": everywhere}).endswith("; no clean task")


def test_shard_rows_name_the_corpus_length_and_pair_2_processes_with_1_by_round() -> None:
    """A 10M record run on three of the layouts (``--layouts``): each row names the length, the 2-process row's ratio
    is over the 1-process run of its round, and the build is set against ``encode_batch``'s median."""

    def run(variant: str, round_: int, first: float, rate: float) -> dict[str, Any]:
        tables = 20 if variant.startswith("shards") else 2
        activity = {"busy": variant == "file-1p" and round_ == 0, "other_cpu_share": 0.2 if round_ == 0 else 0.01}
        return {"round": round_, "variant": variant, "lines": 10_000_000, "tables": tables, "first_step_s": first,
                "table_rows_per_cpu_s": rate, "activity": activity}  # fmt: skip

    runs = [run("file-1p", r, 100.0 + r, 7000.0) for r in range(3)]
    runs += [run("shards-1p", r, 100.0 * (r + 1), 6000.0) for r in range(3)]
    runs += [run("shards-2p", r, 60.0 * (r + 1), 8000.0) for r in range(3)]
    rows = list(report._shard_rows({"runs": runs, "encode_batch_rows_per_cpu_s": [7000.0, 8000.0, 9000.0]}))
    assert [r[0] for r in rows] == ["10M, file-1p (2)", "10M, shards-1p (20)", "10M, shards-2p (20)"]
    assert rows[0][2] == "–" and rows[2][2] == "**0.60x** (0.60–0.60)"  # 60/100, 120/200, 180/300
    assert rows[1][3] == "6000 (6000–6000): 75% of 8,000"
    assert [r[4] for r in rows] == ["1/3 (max 20%)", "0/3 (max 20%)", "0/3 (max 20%)"]  # a busy round is shown
    # The headline: the layouts side by side, each goal judged (the ratio on every round, the slowest build).
    record = {"runs": runs, "encode_batch_rows_per_cpu_s": [7000.0, 8000.0, 9000.0]}
    (goals,) = report._shard_goal_rows(record)
    assert goals == ["10M", "101 · 200 · 120", "**0.60x** (0.60–0.60): met", "75% (shards-1p): not met", "1/9 (max 20%)"]
    runs[-1]["first_step_s"] = 190.0  # one round above 0.6x
    assert next(iter(report._shard_goal_rows(record)))[2] == "**0.60x** (0.60–0.63): not met"
    assert [report.lines_label(n) for n in (10_000_000, 250_000, 1234)] == ["10M", "250k", "1234"]


def test_transfer_note_names_the_teacher_only_where_the_record_has_one() -> None:
    """A table without a teacher does not say its teacher was not scored; a record made before the probe normalised
    every vector says its gaps between simcse-kit and the other rows are not clean."""
    teacher = "python -m benchmarks.quality multi --teacher /m/mpnet --transfer-kfold 5"
    unit = {"transfer_kfold": 5, "transfer_normalize": True}
    assert report._transfer_note(unit | {"command": teacher}) == "5-fold; the teacher not scored (`--transfer-teacher`)."
    assert report._transfer_note(unit | {"command": teacher, "transfer_teacher": True}) == "5-fold."
    assert report._transfer_note(unit | {"command": "python -m benchmarks.quality negatives"}) == "5-fold."
    before = report._transfer_note({"transfer_kfold": 5, "command": "python -m benchmarks.quality negatives"})
    assert before.startswith("5-fold; simcse-kit rows raw") and "not clean" in before
    assert report._transfer_note({"command": teacher}) == "not scored in this record (`--transfer-kfold`)."


def test_quality_tables_carry_the_transfer_average_its_verdict_and_what_lowers_the_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `sts` table: the full table puts each row's SentEval transfer average after dev selection, the headline
    after the 7-task average; each family's chosen row gets its transfer gap to the peer by Welch's t over the seeds
    (hand-computed below); every trained row's drop below the base is named under the full table, none under the
    headline (its prose); a record without transfer prints "–" and no transfer line."""
    monkeypatch.setattr(report, "RESULTS", tmp_path)  # no per-pair sidecar: the 7-task lines say "no interval"

    def row(kind: str, transfer: list[float], sick: float = 80.0) -> dict[str, Any]:
        seed = dict.fromkeys((*report.STS, "best_stsb_dev"), 80.0) | {"SICKRelatedness": sick}
        per_seed = {str(i): seed | {"transfer:avg": t} for i, t in enumerate(transfer)}
        mean = seed | {"transfer:avg": sum(transfer) / len(transfer)}
        std = dict.fromkeys(mean, 0.0) | {"transfer:avg": 0.1 if len(transfer) > 1 else 0.0}
        return {"kind": kind, "n": len(transfer), "mean": mean, "std": std, "per_seed": per_seed}

    results = {"base": row("base", [83.0]), "kit-unsup": row("kit", [83.5, 83.6, 83.4], sick=79.0),
               "st-unsup": row("st", [83.0, 83.2, 83.1], sick=78.0),
               "kit-hardneg": row("kit", [82.9, 83.0, 83.1]), "st-hardneg": row("st", [83.0, 83.2, 83.1])}  # fmt: skip
    rec = {"_file": "sts-cpu", "results": results, "transfer_kfold": 5, "transfer_normalize": True, "command": "x"}
    head = str(report.QUALITY.head).split("|")
    at = head.index("SentEval transfer avg")
    assert head[at - 1] == "STS-B dev (selection)" and head[at + 1] == "test pairs trained on"
    full = list(report.QUALITY.rows(rec))
    assert [r[at] for r in full] == ["83.00", "83.50 ± 0.10", "83.10 ± 0.10", "83.00 ± 0.10", "83.10 ± 0.10"]
    assert str(report.QUALITY_SUMMARY.head) == "config|seeds|Avg.|SentEval transfer avg|STS-B dev (selection)"
    assert [r[3] for r in report.QUALITY_SUMMARY.rows(rec)] == [r[at] for r in full]
    assert callable(report.QUALITY.intro) and report.QUALITY.intro([rec]).endswith("SentEval transfer: 5-fold.")
    # Each pair: seed variances 0.01, 3 seeds: se 0.0816, t(4) 2.776, half-width 0.23.
    unsup = "- SentEval transfer avg, `kit-unsup` − `st-unsup`: +0.40 (95% interval +0.17 to +0.63): better."
    hardneg = (
        "- SentEval transfer avg, `kit-hardneg` − `st-hardneg`: -0.10 (95% interval -0.33 to +0.13): no difference measured."
    )
    lines = report._quality_verdict([rec])
    assert lines[1] == unsup and lines[3] == hardneg
    kit_below = "- `kit-unsup` below the untouched base: SICK-R -1.00 (std 0.00)."
    st_below = "- `st-unsup` below the untouched base: SICK-R -2.00 (std 0.00)."
    assert lines[4:] == [kit_below, st_below]
    assert callable(report.QUALITY_SUMMARY.after)
    headline = report.QUALITY_SUMMARY.after([rec])
    assert headline == [lines[0], unsup, lines[2], hardneg]
    for r in results.values():  # a record from before transfer was scored
        for table in (r["mean"], r["std"], *r["per_seed"].values()):
            table.pop("transfer:avg")
    assert [r[at] for r in report.QUALITY.rows(rec)] == ["–"] * 5
    assert not [x for x in report._quality_verdict([rec]) if "transfer" in x]


def test_gpu_records_of_two_machines_get_a_line_each_with_their_provenance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU tables' footer: one machine line per GPU and commit (not the first record's for all), each marked as
    :func:`report.provenance_note` says, then that machine's files; a sync-debug record is the syncs table's."""
    monkeypatch.setattr(report, "LEGACY", frozenset({"gpu-old", "gpu-old-2"}))
    args = {"sync_debug": False}

    def rec(stem: str, gpu: str, commit: str, **extra: Any) -> dict[str, Any]:
        machine = MACHINE | {"commit": commit, "gpu_driver": "580"}
        return {"_file": stem, "device": gpu, "machine": machine, "command": f"make {stem}", "args": args} | extra

    kept = [
        rec("gpu-old", "H100", "44ede73"),
        rec("gpu-new", "H200", "313e10b", provenance=CLEAN),
        rec("gpu-old-2", "H100", "44ede73"),
        rec("gpu-syncs", "H200", "313e10b", provenance=CLEAN, args={"sync_debug": True}),
    ]
    lines = report._gpu_machine(kept, full=False)
    assert [line.split(": ")[0] for line in lines] == ["- 2026-11-24 07:00 UTC", "- gpu-old", "- gpu-old-2",
                                                       "- 2026-11-24 07:00 UTC", "- gpu-new"]  # fmt: skip
    assert "H100, driver 580; commit 44ede73 (record predates provenance; to be re-run)" in lines[0]
    assert lines[3].endswith("H200, driver 580; commit 313e10b")
    assert lines[4] == "- gpu-new: 2026-11-24 07:00 UTC; `make gpu-new`"


def test_the_readme_gpu_line_is_every_stamped_run_of_the_default_workers_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's GPU headline: one line per record with provenance holding `kit-pad-w8/st-w8` (a second run of the
    same comparison shows beside the first); a record without provenance, or without that pair, gives none."""
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    pair = {"median": 2.0, "min": 1.5, "max": 2.5, "n": 3}
    jobs = {"minilm-b512-l32": {"summary": {"kit-pad-w8/st-w8": pair, "kit-pad-w8": {}}}}
    _write(tmp_path, "gpu-a", {"device": "H200", "jobs": jobs, "provenance": CLEAN})
    _write(tmp_path, "gpu-b", {"device": "H200", "jobs": jobs, "provenance": CLEAN})
    _write(tmp_path, "gpu-old", {"device": "H100", "jobs": jobs})  # no provenance
    _write(tmp_path, "gpu-w4", {"device": "H200", "jobs": {"j": {"summary": {"kit-pad-w4/st-w4": pair}}}, "provenance": CLEAN})
    lines = report.gpu_headline().splitlines()
    assert lines == [
        f"- H200, minilm-b512-l32: simcse-kit (`kit-pad-w8`) trains at **2.00x** (1.50–2.50) the sentence-transformers "
        f"trainer (`st-w8`, bf16), same DataLoader workers and gradient clipping (median of 3 paired rounds; `{f}`)."
        for f in ("gpu-a", "gpu-b")
    ]


def test_the_compact_line_names_what_the_other_seeds_ran_beyond_the_first() -> None:
    """The compact block shows the first seed's command and says the others ran the same one only where they did:
    a seed that also scored a model names it, and a seed run with another argument or on another CPU sends the
    reader to the details rather than being called the same."""
    machine = {"cpu": "CPU A", "cpu_class": "amx"}
    args = {"seed": 1, "models": [], "train": "runs/compact", "threads": 1}
    first = {"args": args, "machine": machine}
    base = {"args": args | {"seed": 42, "models": ["base=all-MiniLM-L6-v2"]}, "machine": machine}
    said = report._compact_seeds([first, {"args": args | {"seed": 2}, "machine": machine}, base])
    assert said == " Seeds 2, 42 (+ `--models base=all-MiniLM-L6-v2`): same command and machine (details)."
    for other in (
        {"args": args | {"seed": 2, "threads": 2}, "machine": machine},
        {"args": args | {"seed": 2}, "machine": machine | {"cpu": "CPU B"}},
    ):
        assert report._compact_seeds([first, other, base]) == " Other seeds: their commands and machines in the details."
    assert report._compact_seeds([first]) == ""


def test_a_goal_missed_by_less_than_a_hundredth_shows_by_how_much() -> None:
    assert report._missed(0.0042) == "missed by 0.004"  # two decimals would say "missed by 0.00"
    assert report._missed(0.05) == "missed by 0.05" and report._missed(0.0) == "missed by 0.00"


def test_the_compact_block_with_only_the_search_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Search timing kept before any quality record: the block shows the timing and its command, no seed line."""
    import shutil

    shutil.copy(report.RESULTS / "compact-amx-search.json", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    block = report.compact_block()
    assert "--search-only --models base=all-MiniLM-L6-v2 --search-corpus 100000" in block
    assert "Seeds" not in block and "| 384 |" not in block
