"""benchmarks/stats.py: the paired bootstraps behind every verdict, against naive loops and known cases."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scipy.stats import spearmanr

from benchmarks.stats import (
    Interval,
    load_rows,
    mean_difference,
    save_rows,
    seed_difference,
    spearman_average,
    spearman_difference,
    spearman_level,
    verdict,
)


def _rows(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Two tasks of 40 and 25 pairs; row a with 3 seeds, row b with 2, both gold plus noise (b noisier)."""
    rng = np.random.default_rng(seed)
    gold = {"T1": rng.uniform(0, 5, 40).round(1), "T2": rng.uniform(1, 5, 25).round(1)}
    a = {t: g + rng.normal(0, 1.0, (3, len(g))) for t, g in gold.items()}
    b = {t: g + rng.normal(0, 2.0, (2, len(g))) for t, g in gold.items()}
    return a, b, gold


def _naive(a: dict[str, np.ndarray], b: dict[str, np.ndarray], gold: dict[str, np.ndarray], replicates: int) -> np.ndarray:
    """The documented draw order, one scipy Spearman at a time."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(replicates):
        sa = rng.integers(0, len(a["T1"]), len(a["T1"]))
        sb = sa if len(a["T1"]) == len(b["T1"]) else rng.integers(0, len(b["T1"]), len(b["T1"]))
        per_task = []
        for t, g in gold.items():
            idx = rng.integers(0, len(g), len(g))
            rho_a = np.mean([spearmanr(a[t][s][idx], g[idx]).statistic for s in sa])
            rho_b = np.mean([spearmanr(b[t][s][idx], g[idx]).statistic for s in sb])
            per_task.append(100 * (rho_a - rho_b))
        out.append(np.mean(per_task))
    return np.array(out)


@pytest.mark.parametrize("seeds_b", [2, 3])  # a draw of its own; paired with row a's seeds
def test_spearman_difference_matches_a_naive_loop(seeds_b: int) -> None:
    a, b, gold = _rows()
    b = {t: np.vstack([p, p[:1] + 0.5])[:seeds_b] for t, p in b.items()}
    got = spearman_difference(a, b, gold, replicates=60)
    values = _naive(a, b, gold, 60)
    low, high = np.percentile(values, [2.5, 97.5])
    assert (got.low, got.high) == pytest.approx((low, high), abs=1e-9)
    observed = np.mean([100 * (np.mean([spearmanr(p, gold[t]).statistic for p in a[t]])
                               - np.mean([spearmanr(p, gold[t]).statistic for p in b[t]])) for t in gold])  # fmt: skip
    assert got.difference == pytest.approx(observed, abs=1e-9)
    assert spearman_average(a, gold) - spearman_average(b, gold) == pytest.approx(observed, abs=1e-9)


def test_spearman_level_matches_a_naive_loop() -> None:
    """One row's average and its interval: the seeds drawn, then each task's pairs, as for a difference."""
    a, _, gold = _rows()
    got = spearman_level(a, gold, replicates=60)
    rng = np.random.default_rng(0)
    values = []
    for _ in range(60):
        picks = rng.integers(0, 3, 3)
        per_task = []
        for t, g in gold.items():
            idx = rng.integers(0, len(g), len(g))
            per_task.append(100 * np.mean([spearmanr(a[t][s][idx], g[idx]).statistic for s in picks]))
        values.append(np.mean(per_task))
    low, high = np.percentile(values, [2.5, 97.5])
    assert (got.low, got.high) == pytest.approx((low, high), abs=1e-9)
    assert got.difference == pytest.approx(spearman_average(a, gold), abs=1e-9)
    assert got.low < got.difference < got.high


def test_identical_rows_measure_no_difference() -> None:
    a, _, gold = _rows()
    got = spearman_difference(a, a, gold, replicates=200)
    # Paired by pair and by seed: every replicate compares a row with itself.
    assert (got.low, got.high, got.difference) == (0.0, 0.0, 0.0)
    assert got.verdict == "no difference measured"
    # Two seeds against the same two swapped: still no difference, but now an interval from the seed draw.
    swapped = {t: p[[1, 0, 2]] for t, p in a.items()}
    loose = spearman_difference(a, swapped, gold, replicates=200)
    assert loose.low < 0 < loose.high and loose.verdict == "no difference measured"


def test_gold_against_noise_is_better_and_the_reverse_worse() -> None:
    _, b, gold = _rows()
    perfect = {t: g[None, :] for t, g in gold.items()}
    assert verdict(perfect, b, gold, replicates=300) == "better"
    assert verdict(b, perfect, gold, replicates=300) == "worse"


def test_two_rows_of_the_same_noise_on_few_pairs_measure_no_difference() -> None:
    rng = np.random.default_rng(3)
    gold = {"T": rng.uniform(0, 5, 30)}
    a = {"T": gold["T"] + rng.normal(0, 1.5, (3, 30))}
    b = {"T": gold["T"] + rng.normal(0, 1.5, (3, 30))}
    got = spearman_difference(a, b, gold, replicates=300)
    assert got.verdict == "no difference measured" and got.low < 0 < got.high


def test_mean_difference_matches_a_naive_loop() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 50), rng.uniform(0, 1, 50)
    got = mean_difference(a, b, replicates=100, seed=7)
    draw = np.random.default_rng(7)
    values = []
    for _ in range(100):
        idx = draw.integers(0, 50, 50)
        values.append(sum(a[i] - b[i] for i in idx) / 50)
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])), abs=1e-12)
    assert got.difference == pytest.approx(a.mean() - b.mean())
    assert mean_difference(a + 1, a, replicates=50).verdict == "better"


def test_interval_verdicts_and_bad_input() -> None:
    assert [Interval(0.5, lo, hi, 10).verdict for lo, hi in ((0.1, 1), (-1, -0.1), (-0.1, 1))] == [
        "better", "worse", "no difference measured"]  # fmt: skip
    a, b, gold = _rows()
    with pytest.raises(ValueError, match="task 'T2'"):
        spearman_difference(a, {"T1": b["T1"]}, gold)
    with pytest.raises(ValueError, match="predictions for 40 gold scores"):
        spearman_difference({**a, "T1": a["T1"][:, :39]}, b, gold)


def _fake_evaluator(cosines: dict[str, np.ndarray], gold: dict[str, np.ndarray]) -> SimpleNamespace:
    """What save_sts_pairs reads of an STSEvaluator after a call: its specs and per-split (cosines, gold)."""
    specs = {t: SimpleNamespace(format="sick", subsets=()) for t in gold}
    return SimpleNamespace(specs=specs, scored={t: {"test": (cosines[t], gold[t])} for t in gold})


def test_the_runs_pairs_reach_the_records_sidecar(tmp_path: Path) -> None:
    """A run's predictions.npz (st_peers.save_sts_pairs) -> quality.sidecar -> stats.save_rows / load_rows:
    the cosines come back as float16, per row, seeds in order, with the gold."""
    from benchmarks.quality import sidecar
    from benchmarks.st_peers import PREDICTIONS, save_sts_pairs

    a, b, gold = _rows()
    folders: dict[str, dict[int, Path]] = {"kit": {}, "st": {}, "lost": {1: tmp_path / "lost"}}
    for name, row in (("kit", a), ("st", b)):
        for seed in range(len(row["T1"])):
            folder = tmp_path / name / f"seed-{seed + 1}"
            save_sts_pairs(folder / PREDICTIONS, _fake_evaluator({t: p[seed] for t, p in row.items()}, gold))
            folders[name][seed + 1] = folder
    rows, kept_gold = sidecar(folders)
    assert set(rows) == {"kit", "st"}  # a row with a seed without predictions has no interval, not a partial one
    save_rows(tmp_path / "table.npz", rows, kept_gold)
    loaded, loaded_gold = load_rows(tmp_path / "table.npz")
    for name, row in (("kit", a), ("st", b)):
        for t in gold:
            assert loaded[name][t].dtype == np.float16
            np.testing.assert_array_equal(loaded[name][t], row[t].astype(np.float16))
    assert {t: g.tolist() for t, g in loaded_gold.items()} == {t: g.astype(np.float32).tolist() for t, g in gold.items()}


def test_a_seed_that_kept_the_untouched_model_takes_the_base_runs_cosines(tmp_path: Path) -> None:
    """A peer run whose selection kept step 0 scores the base model and writes no predictions.npz: the sidecar
    gives that seed the base run's cosines (the same weights), so the row keeps its interval; a seed without
    predictions that did train (best step 25) still leaves its row out, as does a kept-base seed with no base run."""
    from benchmarks.quality import sidecar
    from benchmarks.st_peers import PREDICTIONS, save_sts_pairs

    a, b, gold = _rows()
    base = tmp_path / "base"
    save_sts_pairs(base / PREDICTIONS, _fake_evaluator({t: p[0] for t, p in b.items()}, gold))
    folders: dict[str, dict[int, Path]] = {}
    for name, best_steps in (("kept", (25, 0, 50)), ("trained", (25, 25, 50)), ("no-base", (25, 0, 50))):
        for seed, step in enumerate(best_steps, 1):
            folder = tmp_path / name / f"seed-{seed}"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"best_step": step}))
            if seed != 2:
                save_sts_pairs(folder / PREDICTIONS, _fake_evaluator({t: p[seed - 1] for t, p in a.items()}, gold))
            folders.setdefault(name, {})[seed] = folder
    rows, _ = sidecar(folders, {"kept": base, "trained": base})
    assert set(rows) == {"kept"}
    for t in gold:
        np.testing.assert_array_equal(rows["kept"][2][t], b[t][0].astype(np.float16))  # the base run's
        np.testing.assert_array_equal(rows["kept"][3][t], a[t][2].astype(np.float16))  # its own


def test_report_verdicts_use_the_interval_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import report

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    a, b, gold = _rows()
    perfect = {t: np.stack([g, g, g]) for t, g in gold.items()}
    mean = {"avg": 80.0, "best_stsb_dev": 85.0}
    results = {n: {"mean": mean} for n in ("kit-unsup", "st-unsup", "kit-hardneg", "st-hardneg")}
    rec = {"_file": "sts-cpu", "results": results}
    assert report.interval_verdict(rec, "kit-unsup", "st-unsup") == report.NO_INTERVAL  # no sidecar: never "better"
    save_rows(tmp_path / "sts-cpu.npz", {"kit-unsup": _by_seed(perfect), "st-unsup": _by_seed(b),
                                         "kit-hardneg": _by_seed(a), "st-hardneg": _by_seed(a)}, gold)  # fmt: skip
    lines = report._quality_verdict([rec])
    assert lines[0].endswith(": better.") and "interval rule, 7-task average: +" in lines[0]
    assert lines[1].endswith("+0.00 (95% interval +0.00 to +0.00): no difference measured.")
    assert report.interval_verdict(rec, "kit-unsup", "nope") == "no interval (no per-pair data for `nope`)"


def test_a_goal_is_judged_by_the_rows_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """report.goal_verdict: "reaches" only where the whole 95% interval of the row's average is at or above the
    goal, "misses" where it is below, else neither; the clean table's lines name the goal, each peer (interval
    rule and seed spread), what the guard counted and every average below the base."""
    from benchmarks import report

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    a, b, gold = _rows()
    ours = report.CLEAN_RECIPE
    save_rows(tmp_path / "multi-clean-cpu.npz", {ours: _by_seed(a), "st-mnrl": _by_seed(b)}, gold)
    rec = {"_file": "multi-clean-cpu"}
    level = spearman_level(a, gold)
    assert report.goal_verdict(rec, ours, level.low - 0.01).endswith(f"reaches {level.low - 0.01}")
    assert report.goal_verdict(rec, ours, level.high + 0.01).endswith(f"misses {level.high + 0.01}")
    inside = report.goal_verdict(rec, ours, round(level.difference, 2))
    assert inside.endswith("lies inside the interval: not shown reached")
    assert report.goal_verdict({"_file": "nope"}, ours, 80.5) == f"against 80.5: {report.NO_INTERVAL}"

    def row(kind: str, avg: float, std: float, seen: dict[str, list[int]] | None) -> dict[str, object]:
        seeds = {"1": {"avg": avg}, "2": {"avg": avg}, "3": {"avg": avg}}
        mean = {"avg": avg, "SICKRelatedness": avg - 2, "STS12": avg}
        return {"kind": kind, "mean": mean, "std": {"avg": std}, "per_seed": seeds, "n": 3} | (
            {"test_pairs_seen": seen} if seen is not None else {}
        )

    rec["results"] = {
        "base": row("base", 79.0, 0.0, None) | {"mean": {"avg": 79.0, "SICKRelatedness": 78.5, "STS12": 70.0}},
        ours: row("kit", 80.0, 0.2, {"STS12": [0, 3108], "SICKRelatedness": [0, 4927]}),
        "st-mnrl": row("st", 79.5, 0.3, {"STS12": [311, 3108]}),
        "st-mse": row("st", 79.9, 0.3, {"STS12": [0, 3108]}),
    }
    # Per seed: the interval is Welch's t over them (st-mse: not scored).
    transfer = {"base": [83.0], ours: [83.3, 83.4, 83.5], "st-mnrl": [83.1, 83.3, 83.5]}
    for name, values in transfer.items():
        r = rec["results"][name]
        r["mean"]["transfer:avg"], r["std"]["transfer:avg"] = (
            float(np.mean(values)),
            float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        )
        r["per_seed"] = {str(i): {"avg": r["per_seed"]["1"]["avg"], "transfer:avg": v} for i, v in enumerate(values, 1)}
    lines = report._clean_verdict([rec])
    assert lines[0].startswith(f"- `{ours}` averages 80.00 ± 0.20 (seeds: 80.00, 80.00, 80.00), 95% interval")
    assert lines[1].startswith(f"- `{ours}` − `st-mnrl`: +0.50, beyond the seed spread (0.30, the larger std)")
    assert "interval rule, 7-task average: " in lines[1]
    gap = seed_difference(transfer[ours], transfer["st-mnrl"])
    assert lines[2] == (f"- SentEval transfer avg, `{ours}` − `st-mnrl`: +0.10 (95% interval {gap.low:+.2f} to "
                        f"{gap.high:+.2f}): no difference measured.")  # fmt: skip
    assert lines[3].startswith(f"- `{ours}` − `st-mse`: +0.10, within the seed spread (0.30")
    # No transfer line without st-mse's score.
    assert lines[4:] == [f"- `{ours}` below the untouched base: SICK-R -0.50 (std 0.00)."]
    rows = {r[0]: r for r in report._clean_rows(rec)}
    assert {n: r[-1] for n, r in rows.items()} == {"base": "–", ours: "0", "st-mse": "0",
                                                   "st-mnrl": "311 in 1 task, at most 10.0% (STS12); no clean task"}  # fmt: skip
    assert [rows[n][5] for n in rows] == ["83.00 ± 0.00", "83.40 ± 0.10", "83.30 ± 0.20", "–"]


def _by_seed(row: dict[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    return {seed: {t: p[seed] for t, p in row.items()} for seed in range(len(next(iter(row.values()))))}


def test_build_collects_each_rows_chosen_runs_into_the_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quality.build finds the runs of each row's chosen rate and every seed, and the base's, where run_job left
    their predictions.npz; the record's sidecar then holds exactly those rows."""
    import argparse

    from benchmarks import quality
    from benchmarks.st_peers import PREDICTIONS, save_sts_pairs

    a, b, gold = _rows()
    out = tmp_path / "out"
    args = argparse.Namespace(
        rows=["kit-unsup", "st-unsup"], learning_rates="3e-5", output_dir=out, eval_data_dir=tmp_path, data_root=tmp_path,
        model=None, tasks=[], task_names=[], seeds=[1, 2], steps=2, threads=1, st_precision="fp32", teacher=None,
        guide=None, teacher_cache_dir=None, eval_steps=25, transfer_kfold=0, transfer_teacher=False,
    )  # fmt: skip
    runs = {"kit-unsup": out / "kit-unsup" / "lr3e-05", "st-unsup": out / "st-unsup" / "lr3e-05"}
    for folder, row in zip(runs.values(), (a, b), strict=True):
        for seed in (1, 2):
            pairs = _fake_evaluator({t: p[seed - 1] for t, p in row.items()}, gold)
            save_sts_pairs(folder / f"seed-{seed}" / PREDICTIONS, pairs)
    save_sts_pairs(out / "base" / PREDICTIONS, _fake_evaluator({t: g for t, g in gold.items()}, gold))
    # The kit row's runs were made at this commit and at another; the peer's before runs were stamped.
    # Seed 2 was also made on another CPU (a table resumed on another machine).
    for seed, commit, cpu in ((1, "c" * 40, "CPU A"), (2, "d" * 40, "CPU B")):
        stamp = {"commit": commit, "dirty": seed == 2, "cpu": cpu}
        (runs["kit-unsup"] / f"seed-{seed}" / "made_at.json").write_text(json.dumps(stamp))
    (out / "base" / "made_at.json").write_text(json.dumps({"commit": "c" * 40, "dirty": False}))
    per_seed = {1: {"avg": 80.0}, 2: {"avg": 81.0}}
    made = quality.TableResults(sweep={}, chosen=dict.fromkeys(runs, 3e-5), rows=dict.fromkeys(runs, per_seed),
                                extra={"base": {"avg": 78.0}}, lost=[])  # fmt: skip
    monkeypatch.setattr(quality, "sweep_and_run", lambda *_, **__: made)
    monkeypatch.setattr(quality, "seen_test_pairs", lambda job: {"STS12": [len(job.name), 3108]})
    record = quality.build("sts", args)
    assert set(record["results"]) == {"base", "kit-unsup", "st-unsup"}
    # Each trained row carries the guard's counts of its chosen run (seed 1's job: "<row>/lr3e-05/seed-1").
    assert record["results"]["kit-unsup"]["test_pairs_seen"] == {"STS12": [len("kit-unsup/lr3e-05/seed-1"), 3108]}
    assert "test_pairs_seen" not in record["results"]["base"]
    rows, kept_gold = args.sidecar
    assert set(rows) == {"base", "kit-unsup", "st-unsup"} and set(rows["kit-unsup"]) == {1, 2}
    np.testing.assert_array_equal(rows["st-unsup"][2]["T1"], b["T1"][1].astype(np.float16))
    assert set(kept_gold) == set(gold)
    assert record["runs_made_at"] == {"base": ["c" * 40], "kit-unsup": ["c" * 40, "d" * 40 + "+dirty"], "st-unsup": ["unknown"]}
    from benchmarks import report

    assert record["runs_made_on"] == {"base": ["unknown"], "kit-unsup": ["CPU A", "CPU B"], "st-unsup": ["unknown"]}
    written = record | {"provenance": {"commit": "c" * 40, "dirty": False, "threads": 1}}
    note = report.provenance_note(written | {"machine": {"cpu": "CPU A"}})
    assert note == f" (reuses runs made at another commit: {'d' * 12}, unknown) (some runs made on another CPU: CPU B)"
    written["runs_made_at"] = {row: ["c" * 40] for row in written["runs_made_at"]}
    assert report.provenance_note(written | {"machine": {"cpu": "CPU B"}}) == " (some runs made on another CPU: CPU A)"
    assert report.provenance_note({"provenance": {"commit": "c" * 40, "dirty": False}, "runs_made_at": {"x": ["c" * 40]}}) == ""


def test_a_run_is_stamped_with_the_commit_and_cpu_it_was_made_at(tmp_path: Path) -> None:
    import subprocess

    from benchmarks._common import REPO, tree_dirty
    from benchmarks.st_peers import MADE_AT, settle_stamp, stamp_start

    folder = tmp_path / "seed-1"
    stamp_start(folder)
    folder.mkdir()
    settle_stamp(folder)  # no metrics.json yet: the run is not made
    assert not (folder / MADE_AT).exists()
    (folder / "metrics.json").write_text("{}")
    settle_stamp(folder)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    cpu = next(
        line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
    )
    assert json.loads((folder / MADE_AT).read_text()) == {"commit": head, "dirty": tree_dirty(), "cpu": cpu}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed-1"]  # the pending stamp was moved, not copied


def test_make_once_trains_a_run_once_and_trains_an_unfinished_one_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """st_peers.make_once, shared by quality.run_job and compact.train_models: a new run is trained and stamped with
    the commit it started at; a finished one is vetted by ``check`` and reused with its own stamp, never trained
    again (a failed check stops there); a folder without metrics.json (stopped part-way) is removed and made again."""
    from benchmarks import _common, st_peers

    head = {"commit": "a" * 40}
    monkeypatch.setattr(_common, "provenance", lambda _: {"commit": head["commit"], "dirty": False, "threads": None})
    folder, calls = tmp_path / "run", []

    def train() -> None:
        assert not folder.exists()  # the kit refuses to train into a folder that exists
        calls.append("train")
        folder.mkdir()
        (folder / "metrics.json").write_text("{}")
        head["commit"] = "b" * 40  # the code moves on while the run is out

    def made_at() -> str:
        return json.loads((folder / st_peers.MADE_AT).read_text())["commit"]

    def refuse() -> None:
        raise ValueError("another run's settings")

    st_peers.make_once(folder, train, check=lambda: calls.append("check"))
    assert calls == ["train"] and made_at() == "a" * 40
    st_peers.make_once(folder, train, check=lambda: calls.append("check"))
    assert calls == ["train", "check"] and made_at() == "a" * 40
    with pytest.raises(ValueError, match="another run"):
        st_peers.make_once(folder, train, check=refuse)
    assert calls == ["train", "check"]
    (folder / "metrics.json").unlink()
    (folder / "checkpoint").mkdir()  # what a stopped run leaves
    st_peers.make_once(folder, train)
    assert calls == ["train", "check", "train"] and made_at() == "b" * 40
    assert sorted(p.name for p in folder.iterdir()) == [st_peers.MADE_AT, "metrics.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the pending stamp was moved


def test_a_run_killed_before_its_final_table_keeps_the_commit_it_was_trained_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit writes metrics.json before the final STS table: a worker killed there left a trained run, which the
    resumed table scores and reuses. It is stamped with the commit its training started at, not with none (the run
    stamp used to be written after the table, so the record said "unknown") and never with the resuming commit; a
    run trained again from scratch takes the new commit. A peer run is stamped the same way."""
    import dataclasses

    from benchmarks import _common, quality, st_peers
    from simcse_kit.config.run import save_config
    from simcse_kit.training.wiring import experiments

    head = {"commit": "a" * 40}
    monkeypatch.setattr(_common, "provenance", lambda _: {"commit": head["commit"], "dirty": False, "threads": None})
    recipe = str(quality.REPO / "train" / "domain" / "sick.yaml")
    job = quality.Job(name="x", kind="kit", recipe=recipe, seed=1, out=str(tmp_path))
    folder = tmp_path / "seed-1"
    metrics = {"best_step": 2, "train_seconds": 1.0, "best_stsb_dev": 70.0, "evals": [{"step": 2, "stsb_dev": 70.0}]}

    def trained(cfg: Any, seeds: list[int], killed: bool = False) -> None:  # run_seeds: writes metrics.json, then the table
        folder.mkdir()
        save_config(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seeds[0])), folder / "config.yaml")
        (folder / "metrics.json").write_text(json.dumps(metrics))
        head["commit"] = "b" * 40  # the code moves on while the run is out
        if killed:
            raise KeyboardInterrupt

    def retrained(*_: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(experiments, "run_seeds", lambda cfg, seeds: trained(cfg, seeds, killed=True))
    with pytest.raises(KeyboardInterrupt):
        quality.run_job(job)
    monkeypatch.setattr(experiments, "run_seeds", retrained)
    monkeypatch.setattr(quality, "table_owed", lambda f, cfg: metrics | {"sts": {"avg": 80.0}})
    monkeypatch.setattr(quality, "kit_sts_pairs", lambda f, cfg: {})
    assert quality.run_job(job)["avg"] == 80.0  # resumed at "b": scored, not retrained
    assert quality.runs_stamps({"x": {1: folder}})[0] == {"x": ["a" * 40]}
    assert quality.run_job(job)["avg"] == 80.0 and quality.runs_stamps({"x": {1: folder}})[0] == {"x": ["a" * 40]}

    (folder / "metrics.json").unlink()  # stopped before training ended: removed and made again, at "c"
    head["commit"] = "c" * 40
    monkeypatch.setattr(experiments, "run_seeds", trained)
    quality.run_job(job)
    assert quality.runs_stamps({"x": {1: folder}})[0] == {"x": ["c" * 40]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed-1"]
    # A pending stamp newer than the run's metrics.json is another attempt's (killed in training): never this run's.
    done, stamp = folder / "metrics.json", folder / st_peers.MADE_AT
    stamp.unlink()
    os.utime(done, ns=(done.stat().st_atime_ns, done.stat().st_mtime_ns - 10**9))
    st_peers.stamp_start(folder)
    st_peers.settle_stamp(folder)
    assert not stamp.exists()

    def peer_trained(*_: object) -> dict[str, Any]:
        head["commit"] = "e" * 40
        return {"best_step": 2, "best_stsb_dev": 70.0, "evals": [(2, 70.0)], "train_seconds": 1.0, "sts": {"avg": 50.0}}

    monkeypatch.setattr(st_peers, "st_train", peer_trained)
    head["commit"] = "d" * 40
    peer = tmp_path / "peer"
    cfg = quality.job_config(job)
    for settings, made_at in (({"lr": 1}, "d"), ({"lr": 2}, "e")):  # the second: another setting, trained again
        assert st_peers.run_st(cfg, [1], "mnrl", "fp32", peer, settings=settings)[1]["avg"] == 50.0
        assert json.loads((peer / "seed-1" / st_peers.MADE_AT).read_text())["commit"] == made_at * 40


def test_a_rows_seen_test_pairs_are_the_runs_guard_counts(tmp_path: Path, data_dir: Path) -> None:
    """quality.seen_test_pairs: per test task, the pairs whose two sentences a row trains on (case and
    punctuation folded, as the run's guard folds them), against a naive count over STS-B test."""
    import csv

    from benchmarks import quality
    from simcse_kit.data.overlap import normalize

    with (data_dir / "senteval/STS/STSBenchmark/sts-test.csv").open(encoding="utf-8") as fh:
        pairs = [(r[5], r[6]) for r in csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    planted = [pairs[0][0].upper(), pairs[0][1] + " !", pairs[5][0], pairs[5][1], pairs[9][0]]  # 2 pairs whole, 1 half
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["a sentence of no test set", *planted]) + "\n", encoding="utf-8")
    job = quality.Job(name="x", kind="kit", recipe=str(quality.REPO / "train/unsup.yaml"), overrides={"train_file": str(corpus)})
    seen = quality.seen_test_pairs(job)
    keys = {normalize(t) for t in planted}
    want = sum(normalize(a) in keys and normalize(b) in keys for a, b in pairs)
    assert want >= 2 and seen["STSBenchmark"] == [want, len(pairs)]
    assert set(seen) >= {"STS12", "STS16", "SICKRelatedness"}  # every test task of the suite, counted


def test_seed_difference_is_welchs_t_interval_over_the_seeds() -> None:
    """Known answer: [1, 2, 3] against [4, 5, 6]: difference -3, each variance 1, so the standard error is
    sqrt(2/3) and Welch's degrees of freedom 4, whose 97.5% t quantile is 2.7764 (a t table): -3 ± 2.2670, worse.
    A one-seed row adds no variance; rows that do not vary give the difference itself."""
    gap = seed_difference([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert gap.difference == pytest.approx(-3.0)
    assert (gap.low, gap.high) == pytest.approx((-3 - 2.77645 * (2 / 3) ** 0.5, -3 + 2.77645 * (2 / 3) ** 0.5), abs=1e-4)
    assert gap.verdict == "worse" and gap.replicates == 6
    # One seed against three: only the three vary (variance 1 / 3, 2 degrees of freedom, t 4.3027).
    one = seed_difference([5.0], [1.0, 2.0, 3.0])
    assert (one.low, one.high) == pytest.approx((3 - 4.30265 / 3**0.5, 3 + 4.30265 / 3**0.5), abs=1e-4)
    assert one.verdict == "better"
    flat = seed_difference([83.04] * 3, [83.04])
    assert (flat.difference, flat.low, flat.high, flat.verdict) == (0.0, 0.0, 0.0, "no difference measured")


def test_compact_trains_its_models_stamped_and_reuses_a_finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks.compact --train`` makes the main job and its QAT twin itself, each stamped with the commit it
    started at, so the record names where its models were made (a model named by hand with ``--models`` and no
    stamp reads "unknown", which the report marks); a finished run is reused with its own stamp, an unfinished one
    trained again from scratch."""
    import subprocess

    from benchmarks import _common, compact, quality, report

    head = {"commit": "a" * 40}
    monkeypatch.setattr(_common, "provenance", lambda _: {"commit": head["commit"], "dirty": False, "threads": None})
    commands: list[list[str]] = []

    def train(command: list[str], **kwargs: Any) -> None:  # simcse-kit train: the folder and its metrics.json
        assert kwargs["env"]["OMP_NUM_THREADS"] == "1" and kwargs["check"]
        commands.append(command)
        folder = Path(command[command.index("--output-dir") + 1])
        folder.mkdir()
        (folder / "metrics.json").write_text("{}")

    monkeypatch.setattr(subprocess, "run", train)
    specs = compact.train_models(tmp_path, 7, threads=1)
    assert specs == [("main", str(tmp_path / "main-7")), ("qat", str(tmp_path / "qat-7"))]
    recipe = ["-m", "simcse_kit.cli", "train", str(compact.RECIPE), "--seed", "7", "--output-dir"]
    assert [c[1:8] for c in commands] == [recipe, recipe]
    assert commands[0][8:] == [str(tmp_path / "main-7")]
    assert commands[1][8:] == [str(tmp_path / "qat-7"), "--loss.quantization", "binary"]
    folders = {name: {7: Path(path)} for name, path in specs}
    assert quality.runs_stamps(folders)[0] == {"main": ["a" * 40], "qat": ["a" * 40]}

    head["commit"] = "b" * 40  # the code moves on: the finished main run is reused, the unfinished qat run made again
    (tmp_path / "qat-7" / "metrics.json").unlink()
    commands.clear()
    compact.train_models(tmp_path, 7, threads=1)
    assert [c[c.index("--output-dir") + 1] for c in commands] == [str(tmp_path / "qat-7")]
    made_at = quality.runs_stamps(folders | {"hand": {7: tmp_path}})[0]
    assert made_at == {"main": ["a" * 40], "qat": ["b" * 40], "hand": ["unknown"]}
    record = {"provenance": {"commit": "b" * 40, "dirty": False}, "runs_made_at": made_at}
    assert report.provenance_note(record) == f" (reuses runs made at another commit: {'a' * 12}, unknown)"
    command = {"seed": 7, "models": [], "train": str(tmp_path), "search_corpus": 0}
    said = f"python -m benchmarks.compact --seed 7 --train {tmp_path} --search-corpus 0"
    assert report._compact_command({"args": command}) == said
