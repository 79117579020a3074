"""The speed tables in BENCHMARKS.md and README.md are generated from the kept JSON
(benchmarks/results/), so a number and its data cannot drift apart (issue 22)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def test_generated_blocks_match_the_kept_json() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--check"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr


def test_every_block_is_present_and_every_result_has_three_rounds() -> None:
    for name, path in (("train-throughput", "BENCHMARKS.md"), ("speed-headline", "README.md")):
        text = (REPO / path).read_text()
        start, end = f"<!-- generated:{name} -->\n", f"<!-- /generated:{name} -->"
        assert start in text and end in text, (name, path)
        block = text.split(start, 1)[1].split(end, 1)[0]
        assert "**" in block and len(block.strip().splitlines()) >= 2, f"{path}: the {name} block is empty"
    kept = sorted(RESULTS.glob("train_throughput-*.json"))
    assert kept, "no kept training-throughput results"
    for path in kept:
        record = json.loads(path.read_text())
        rounds = {run["round"] for run in record["runs"]}
        assert len(rounds) >= 3, f"{path.name}: {len(rounds)} rounds"
        # Each round is kept whole: every variant measured in every round, with its CPU activity.
        variants = {run["variant"] for run in record["runs"]}
        assert len(record["runs"]) == len(rounds) * len(variants), path.name
        assert all("other_cpu_share" in run["activity"] for run in record["runs"]), path.name
        for key in ("cpu", "cpu_class", "isa_flags", "torch_threads", "versions", "load_avg_1min"):
            assert key in record["machine"], (path.name, key)
