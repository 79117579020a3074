"""Multi-seed runs (mean ± std over seeds) and sweeps, with stand-in and real tiny runs;
false-negative masking and the momentum queue through a real training run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import TinyRun

from simcse_kit.cli import main
from simcse_kit.config.run import RunConfig, load_config
from simcse_kit.errors import ConfigError
from simcse_kit.training.wiring.experiments import (
    aggregate,
    format_seed_table,
    format_seeds,
    format_sweep,
    parse_seeds,
    parse_values,
    plot_sweep,
    run_seeds,
    run_sweep,
)
from simcse_kit.training.wiring.run import train

TINY = {"save_steps": 0, "num_epochs": 1, "eval_steps": 4}  # 8 steps, dev every 4


SICK = {"dev_metric": "sick_dev", "dev_label": "SICK trial Spearman x 100"}


def fake_train(log: list[RunConfig], legacy: bool = False) -> Any:
    """A stand-in for train(): the STS table is a known function of seed and settings, the
    best dev score SICK trial's; ``legacy``: metrics.json as written before the dev metric
    was named (``best_stsb_dev``, whatever the dev data)."""

    def run(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
        log.append(cfg)
        base = 70.0 + 2.0 * cfg.train.seed + 10 * cfg.loss.temperature + (cfg.model.dropout or 0.0)
        sts = {
            k: base + i for i, k in enumerate(["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"])
        }
        sts["avg"] = float(np.mean(list(sts.values())))
        out = Path(cfg.train.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        metrics = {"best_stsb_dev": base - 1.0, "sts": sts} if legacy else {**SICK, "best_dev_score": base - 1.0, "sts": sts}
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
        return metrics

    return run


def test_parse_seeds_and_values() -> None:
    assert parse_seeds("1,2, 3") == [1, 2, 3]
    assert parse_values("temperature", "0.01,0.05") == [0.01, 0.05]
    for bad in ("1,1", "a,b", ""):
        with pytest.raises(ConfigError):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match="--hard-negative-weight"):
        parse_values("hard_negative_weight", "x")


def test_aggregate_by_hand() -> None:
    mean, std = aggregate([{"avg": 70.0, "STS12": 1.0}, {"avg": 72.0}, {"avg": 74.0, "STS12": 3.0}])
    assert mean == {"avg": 72.0} and std == {"avg": 2.0}  # sample std of 70, 72, 74; STS12 not in all three
    assert aggregate([{"avg": 70.0}]) == ({"avg": 70.0}, {"avg": 0.0})


def test_run_seeds_with_stand_in(tmp_path: Path) -> None:
    log: list[RunConfig] = []
    cfg = load_config(None, {"output_dir": str(tmp_path / "multi"), "temperature": 0.05})
    summary = run_seeds(cfg, [1, 2, 3], train_fn=fake_train(log))
    assert [c.train.seed for c in log] == [1, 2, 3]
    assert [c.train.output_dir for c in log] == [str(tmp_path / "multi" / f"seed-{s}") for s in (1, 2, 3)]
    # avg = 70 + 2 * seed + 0.5 + 3 -> 75.5, 77.5, 79.5: mean 77.5, sample std 2
    assert summary["mean"]["avg"] == pytest.approx(77.5) and summary["std"]["avg"] == pytest.approx(2.0)
    assert summary["per_seed"]["2"]["best_dev_score"] == pytest.approx(74.5 - 1.0)
    assert (summary["dev_metric"], summary["dev_label"]) == ("sick_dev", "SICK trial Spearman x 100")
    assert json.loads((tmp_path / "multi" / "seeds.json").read_text()) == json.loads(json.dumps(summary))
    table = format_seed_table({int(k): v for k, v in summary["per_seed"].items()}, summary["mean"], summary["std"])
    assert table.splitlines()[-1].endswith("| 77.50 ± 2.00 |")
    assert len(table.splitlines()) == 2 + 3 + 1
    # What the CLI prints: the STS columns and the dev score, headed by what it measured.
    printed = format_seeds(summary).splitlines()
    assert printed[0].endswith("| Avg. | best SICK trial Spearman x 100 |") and "STS-B dev" not in "\n".join(printed)
    assert printed[-1].endswith("| 77.50 ± 2.00 | 73.50 ± 2.00 |")

    # Same command again: every seed is finished with the same config, nothing retrains.
    run_seeds(cfg, [1, 2, 3], train_fn=fake_train(log))
    assert len(log) == 3
    # A finished seed with a different config is refused, not silently reused.
    changed = load_config(None, {"output_dir": str(tmp_path / "multi"), "temperature": 0.1})
    with pytest.raises(ConfigError, match="loss.temperature"):
        run_seeds(changed, [1], train_fn=fake_train(log))


def test_sweep_with_stand_in(tmp_path: Path) -> None:
    log: list[RunConfig] = []
    cfg = load_config(None, {"output_dir": str(tmp_path / "sweep"), "temperature": 0.05, "seed": 0})
    results = run_sweep(cfg, {"temperature": [0.01, 0.1], "dropout": [0.2]}, train_fn=fake_train(log))
    # One axis at a time: the other setting stays at the recipe's value.
    assert [(c.loss.temperature, c.model.dropout) for c in log] == [(0.01, None), (0.1, None), (0.05, 0.2)]
    assert [p["value"] for p in results["temperature"]] == [0.01, 0.1]
    assert results["temperature"][1]["dev_score"] == pytest.approx(70.0 + 1.0 - 1.0)
    assert all(p["dev_metric"] == "sick_dev" and p["dev_label"] == SICK["dev_label"] for p in results["temperature"])
    assert format_sweep(results).splitlines()[0] == (
        "temperature: 0.01 -> SICK trial Spearman x 100 69.10 (STS avg 73.10), "
        "0.1 -> SICK trial Spearman x 100 70.00 (STS avg 74.00)"
    )
    assert results["dropout"][0]["run_dir"] == str(tmp_path / "sweep" / "dropout-0.2")
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 0
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["dropout"][0]["value"] == 0.2

    seeded = run_sweep(cfg, {"temperature": [0.1]}, seeds=[1, 2], train_fn=fake_train(log))
    assert seeded["temperature"][0]["dev_score_std"] == pytest.approx(np.std([72.0, 74.0], ddof=1))
    assert seeded["temperature"][0]["dev_label"] == SICK["dev_label"]
    with pytest.raises(ConfigError, match="hardneg"):
        run_sweep(cfg, {"hard_negative_weight": [1.0, 2.0]}, train_fn=fake_train(log))
    with pytest.raises(ConfigError, match="choose from"):
        run_sweep(cfg, {"learning_rate": [1e-5]}, train_fn=fake_train(log))


def test_folders_written_before_the_dev_metric_was_named_still_read(tmp_path: Path) -> None:
    """Runs whose metrics.json says ``best_stsb_dev`` (and sweep.json points ``stsb_dev``):
    reused by seeds and sweeps, read as STS-B dev."""
    log: list[RunConfig] = []
    cfg = load_config(None, {"output_dir": str(tmp_path / "old"), "temperature": 0.05})
    run_seeds(cfg, [1, 2], train_fn=fake_train(log, legacy=True))
    summary = run_seeds(cfg, [1, 2], train_fn=fake_train(log))  # reused: the new stand-in is not called
    assert len(log) == 2
    assert (summary["dev_metric"], summary["dev_label"]) == ("stsb_dev", "STS-B dev Spearman x 100")
    assert [summary["per_seed"][s]["best_dev_score"] for s in ("1", "2")] == pytest.approx([71.5, 73.5])
    assert "| best STS-B dev Spearman x 100 |" in format_seeds(summary)
    # A seeds.json written before: per-seed "best_stsb_dev", no dev_label.
    old_summary = {"per_seed": {"1": {"avg": 70.0, "best_stsb_dev": 80.0}}, "mean": {"avg": 70.0, "best_stsb_dev": 80.0}}
    old_summary["std"] = {"avg": 0.0, "best_stsb_dev": 0.0}
    assert format_seeds(old_summary).splitlines()[-1].endswith("| 70.00 ± 0.00 | 80.00 ± 0.00 |")
    old_points = {"dropout": [{"value": 0.1, "stsb_dev": 80.0, "stsb_dev_std": 0.5, "sts_avg": 75.0}]}
    assert format_sweep(old_points) == "dropout: 0.1 -> STS-B dev Spearman x 100 80.00 (STS avg 75.00)"
    plot_sweep(old_points, tmp_path / "old.png")
    assert (tmp_path / "old.png").stat().st_size > 0


# --------------------------------------------------------------------------- real tiny runs


def test_cli_seeds_real_runs_equal_single_runs(tmp_path: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tiny_run.recipe("multi", **TINY)
    assert main(["train", str(recipe), "--seeds", "1,2"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "multi" / "seeds.json").read_text())
    tables = [json.loads((tmp_path / "multi" / f"seed-{s}" / "metrics.json").read_text())["sts"] for s in (1, 2)]
    assert summary["mean"]["avg"] == pytest.approx((tables[0]["avg"] + tables[1]["avg"]) / 2)
    assert summary["std"]["avg"] == pytest.approx(abs(tables[0]["avg"] - tables[1]["avg"]) / np.sqrt(2))
    assert tables[0]["avg"] != tables[1]["avg"]  # the seeds really differ
    assert f"{summary['mean']['avg']:.2f} ± {summary['std']['avg']:.2f}" in printed
    assert "| best STS-B dev Spearman x 100 |" in printed  # the recipe selects on STS-B dev
    # The same command again reuses both finished seeds: the recipe's "auto" switches match
    # the decided values config.yaml recorded (it used to refuse them as another config).
    stamp = (tmp_path / "multi" / "seed-1" / "metrics.json").stat().st_mtime_ns
    assert main(["train", str(recipe), "--seeds", "1,2"]) == 0
    assert (tmp_path / "multi" / "seed-1" / "metrics.json").stat().st_mtime_ns == stamp
    # Seed 1 of the multi-seed run is exactly the single run with --seed 1.
    single = tmp_path / "single"
    assert main(["train", str(recipe), "--seed", "1", "--output-dir", str(single)]) == 0
    assert json.loads((single / "metrics.json").read_text())["sts"] == tables[0]
    assert load_config(single / "config.yaml").train.seed == 1


def test_a_seed_stopped_before_its_final_table_gets_it_when_the_command_runs_again(
    tmp_path: Path, tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run writes metrics.json before its final STS table, so a stop there keeps the training and no table.
    Reused as it stood, that seed had no STS columns and seeds.json lost them for every seed. The same command
    now scores the table from the seed's best model (the run's own table, to float noise) into its metrics.json,
    and trains nothing again."""
    recipe = tiny_run.recipe("multi", **TINY)
    assert main(["train", str(recipe), "--seeds", "1,2"]) == 0
    seed1, seed2 = (tmp_path / "multi" / f"seed-{s}" for s in (1, 2))
    metrics = json.loads((seed2 / "metrics.json").read_text())
    want = metrics.pop("sts")
    (seed2 / "metrics.json").write_text(json.dumps(metrics))  # as the stop left it
    weights = {f.name: f.stat().st_mtime_ns for f in (seed2 / "best_model").iterdir()}
    assert main(["train", str(recipe), "--seeds", "1,2"]) == 0
    got = json.loads((seed2 / "metrics.json").read_text())["sts"]
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=1e-4) for k in want)
    assert {f.name: f.stat().st_mtime_ns for f in (seed2 / "best_model").iterdir()} == weights  # not retrained
    summary = json.loads((tmp_path / "multi" / "seeds.json").read_text())
    first = json.loads((seed1 / "metrics.json").read_text())["sts"]
    assert summary["mean"]["STS12"] == pytest.approx((first["STS12"] + got["STS12"]) / 2)
    assert summary["mean"]["avg"] == pytest.approx((first["avg"] + got["avg"]) / 2)

    # A recipe without a final table (train.final_eval: false) is read as it stands: nothing is scored.
    def scored(*_: object) -> dict[str, float]:
        raise AssertionError("scored a run whose recipe has no final table")

    monkeypatch.setattr("simcse_kit.training.wiring.run.owed_table", scored)
    (seed2 / "metrics.json").write_text(json.dumps(metrics))
    saved = yaml.safe_load((seed2 / "config.yaml").read_text())
    saved["train"]["final_eval"] = False  # as such a recipe's run saves it
    (seed2 / "config.yaml").write_text(yaml.safe_dump(saved))
    quiet = load_config(recipe, {"final_eval": "false", "output_dir": str(tmp_path / "multi")})
    assert "STS12" not in run_seeds(quiet, [2])["per_seed"]["2"]


def test_masking_and_queue_through_a_real_run(tmp_path: Path, tiny_run: TinyRun) -> None:
    recipe = tiny_run.recipe("fn", **TINY)
    # Every sentence four times: with batch 8, duplicates share batches.
    data = tmp_path / "dups.txt"
    data.write_text("\n".join((tmp_path / "train.txt").read_text().split("\n")[:16] * 4) + "\n", encoding="utf-8")
    cfg = load_config(recipe, {"train_file": str(data), "mask_false_negatives": "true", "queue_size": 16, "momentum": 0.9})
    metrics = train(cfg)
    assert metrics["masked_negatives"] > 0
    assert metrics["steps"] == 8 and np.isfinite(metrics["sts"]["avg"])
    plain = train(load_config(recipe, {"output_dir": str(tmp_path / "plain")}))
    assert plain["masked_negatives"] == 0
    # queue_size does not combine with GradCache
    with pytest.raises(ConfigError, match="grad_cache_chunk"):
        train(load_config(recipe, {"output_dir": str(tmp_path / "gc"), "queue_size": 8, "grad_cache_chunk": 4}))


def test_cli_sweep_real_runs(tmp_path: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tiny_run.recipe("sw", **TINY)
    assert main(["sweep", str(recipe), "--dropout", "0.0,0.2"]) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    for point in results["dropout"]:
        run = Path(point["run_dir"])
        assert load_config(run / "config.yaml").model.dropout == point["value"]
        assert point["dev_score"] == json.loads((run / "metrics.json").read_text())["best_dev_score"]
        assert f"{point['value']:g} -> STS-B dev Spearman x 100 {point['dev_score']:.2f}" in printed
    assert (tmp_path / "sw" / "sweep.png").is_file()
    assert main(["sweep", str(recipe)]) == 2  # nothing to sweep
