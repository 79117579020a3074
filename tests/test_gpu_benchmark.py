"""benchmarks/gpu.py keeps working on the CPU: its smoke size runs in seconds and writes
the fields the GPU table is built from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu


def test_gpu_benchmark_smoke_writes_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "gpu.json"
    # A smoke record, not evidence: written from any tree.
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--cpu-smoke", "--allow-dirty", "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        gpu.main()
    finally:
        torch.set_num_threads(threads)  # the smoke pins one thread: give the other tests theirs back
    record = json.loads(out.read_text())
    assert record["smoke"] is True and record["device"] == "cpu" and "machine" in record
    job = record["jobs"]["tiny-b8-l16"]
    variants = {"kit-pack-w0", "kit-pad-w0", "st-w0"}
    assert {r["variant"] for r in job["runs"]} == variants
    for run in job["runs"]:
        assert run["sentences_per_s"] > 0 and run["peak_memory_mib"] > 0 and run["model_tflops_per_s"] > 0
        assert run["memory_kind"] == "process_peak_rss" and run["mfu"] is None  # no bf16 peak for a CPU
        assert run["sentences_per_s"] == pytest.approx(2 * 8 * run["steps"] / run["seconds"])
    packs = {r["variant"]: r["packing"] for r in job["runs"]}
    assert packs == {"kit-pack-w0": True, "kit-pad-w0": False, "st-w0": False}
    summary = job["summary"]
    assert variants <= set(summary) and summary["kit-pack-w0/st-w0"]["n"] == 1


def test_flops_known_answer() -> None:
    """3 x (2 x linear params + 4 x layers x hidden x length) per token, summed over sentences."""
    from transformers import BertConfig

    config = BertConfig(hidden_size=4, num_hidden_layers=2, intermediate_size=8)
    linear = 2 * (4 * 16 + 2 * 4 * 8) + 16  # 272
    want = 3 * ((2 * linear * 3 + 4 * 2 * 4 * 9) + (2 * linear * 1 + 4 * 2 * 4 * 1))
    assert gpu.step_flops(config, [3, 1]) == want
    assert gpu.parse_job("bertbase-b64-l128") == gpu.Job("bertbase", 64, 128)
