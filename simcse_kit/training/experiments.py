"""Experiments over training runs: several seeds (mean ± std), and one-axis sweeps.

SimCSE's STS average moves by about two points between seeds, so a single run says
little about a recipe. :func:`run_seeds` trains one config per seed into
``OUTPUT_DIR/seed-N`` and writes the 7-task table of each seed plus mean ± sample
std (``ddof=1``) to ``OUTPUT_DIR/seeds.json``. :func:`run_sweep` varies temperature,
dropout (the augmentation of unsupervised SimCSE) and hard-negative weight one at a
time around the recipe, every other setting fixed, into
``OUTPUT_DIR/<param>-<value>``, and plots the STS-B dev score against each.

A finished run is reused when its saved config equals the one requested, so an
interrupted multi-seed run or sweep is continued by running the same command again.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simcse_kit.config.run import RunConfig, load_config
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.tables import STS_COLUMNS, format_seed_table
from simcse_kit.files import save_figure, write_json_atomic

__all__ = [
    "SWEEP_KEYS",
    "aggregate",
    "format_seed_table",
    "parse_seeds",
    "parse_values",
    "plot_sweep",
    "run_seeds",
    "run_sweep",
]

logger = logging.getLogger(__name__)

TrainFn = Callable[..., dict[str, Any]]

# Sweepable settings: CLI name -> dotted config key.
SWEEP_KEYS = {
    "temperature": "loss.temperature",
    "dropout": "model.dropout",
    "hard_negative_weight": "loss.hard_negative_weight",
    "word_repetition": "data.word_repetition",
}
# The STS table's result keys and headers (one home: simcse_kit.evaluation.tables).
TABLE_KEYS = tuple(STS_COLUMNS)
TABLE_HEADERS = tuple(STS_COLUMNS.values())


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; duplicates and non-integers are a ConfigError."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: expected distinct comma-separated integers, e.g. 1,2,3")
    return seeds


def parse_values(name: str, text: str) -> list[float]:
    """``"0.01,0.05"`` -> ``[0.01, 0.05]`` for sweep option ``--name``."""
    try:
        values = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--{name.replace('_', '-')} {text!r}: expected comma-separated numbers") from None
    if not values:
        raise ConfigError(f"--{name.replace('_', '-')}: no values")
    return values


def _set(cfg: RunConfig, dotted: str, value: Any) -> None:
    section, key = dotted.split(".")
    setattr(getattr(cfg, section), key, value)


def _finished(cfg: RunConfig) -> dict[str, Any] | None:
    """The metrics of a finished run in ``cfg.train.output_dir`` with the same config,
    else None. A finished run with a *different* config is an error, never reused."""
    from simcse_kit.training.folder import config_differences

    out = Path(cfg.train.output_dir)
    if not (out / "metrics.json").is_file():
        return None
    diffs = config_differences(load_config(out / "config.yaml"), cfg)
    if diffs:
        raise ConfigError(
            f"{out} holds a finished run with another config ({'; '.join(diffs)}); pass --overwrite or use another --output-dir"
        )
    logger.info("reusing the finished run in %s", out)
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def _train(cfg: RunConfig, overwrite: bool, train_fn: TrainFn | None) -> dict[str, Any]:
    if not overwrite:
        done = _finished(cfg)
        if done is not None:
            return done
    if train_fn is None:
        from simcse_kit.training.run import train

        train_fn = train
    return train_fn(cfg.validate(), overwrite=overwrite)


def aggregate(tables: Sequence[Mapping[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and sample standard deviation (``ddof=1``; 0 for one table) of every key
    present in all ``tables``."""
    if not tables:
        raise ValueError("no tables to aggregate")
    keys = [k for k in tables[0] if all(k in t for t in tables)]
    mean, std = {}, {}
    for key in keys:
        values = np.array([float(t[key]) for t in tables])
        mean[key] = float(values.mean())
        std[key] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return mean, std


def run_seeds(
    cfg: RunConfig,
    seeds: Sequence[int],
    overwrite: bool = False,
    train_fn: TrainFn | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train ``cfg`` once per seed into ``OUTPUT_DIR/seed-N``; write ``seeds.json``.

    Args:
        cfg: the recipe; ``train.output_dir`` becomes the parent of the seed folders
            and ``train.seed`` is replaced by each seed.
        seeds: distinct seeds.
        overwrite: retrain seeds whose folder already holds a finished run.
        train_fn: ``train(cfg, overwrite=...) -> metrics`` (default
            :func:`simcse_kit.training.run.train`); tests pass a stand-in.
        quiet: do not print the table.

    Returns:
        ``{"seeds", "per_seed": {seed: STS table + best_stsb_dev}, "mean", "std", "n"}``,
        also written to ``OUTPUT_DIR/seeds.json``.
    """
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ConfigError(f"seeds must be distinct and non-empty, got {list(seeds)}")
    out = Path(cfg.train.output_dir)
    per_seed: dict[int, dict[str, float]] = {}
    for seed in seeds:
        run = copy.deepcopy(cfg)
        run.train.seed = seed
        run.train.output_dir = str(out / f"seed-{seed}")
        logger.info("seed %d -> %s", seed, run.train.output_dir)
        metrics = _train(run, overwrite, train_fn)
        per_seed[seed] = {**metrics.get("sts", {}), "best_stsb_dev": float(metrics["best_stsb_dev"])}
    mean, std = aggregate(list(per_seed.values()))
    summary = {
        "seeds": list(seeds),
        "n": len(seeds),
        "mean": mean,
        "std": std,
        "per_seed": {str(s): t for s, t in per_seed.items()},
    }
    write_json_atomic(out / "seeds.json", summary)
    if not quiet:
        print(format_seed_table(per_seed, mean, std))
    return summary


def run_sweep(
    cfg: RunConfig,
    grid: Mapping[str, Sequence[float]],
    seeds: Sequence[int] | None = None,
    overwrite: bool = False,
    train_fn: TrainFn | None = None,
) -> dict[str, Any]:
    """One-axis sweeps: each ``grid[name]`` value with every other setting as in ``cfg``.

    Args:
        cfg: the base recipe; runs go to ``OUTPUT_DIR/<name>-<value>`` (with
            ``seeds``: ``.../seed-N`` below it).
        grid: ``{"temperature": [...], "dropout": [...], "hard_negative_weight": [...]}``
            (any subset of :data:`SWEEP_KEYS`).
        seeds: optional seeds per point (mean ± std); default the recipe's seed.
        overwrite: retrain points already finished.
        train_fn: as in :func:`run_seeds`.

    Returns:
        ``{name: [{"value", "stsb_dev", "stsb_dev_std", "sts_avg", "sts_avg_std", "run_dir"}]}``,
        written to ``OUTPUT_DIR/sweep.json``; the plot goes to ``OUTPUT_DIR/sweep.png``.
    """
    unknown = [k for k in grid if k not in SWEEP_KEYS]
    if unknown or not grid:
        raise ConfigError(f"sweep over {unknown or 'nothing'}: choose from {sorted(SWEEP_KEYS)}")
    if "hard_negative_weight" in grid and cfg.data.mode != "hardneg":
        raise ConfigError(f"sweeping hard_negative_weight needs data.mode 'hardneg', the recipe has {cfg.data.mode!r}")
    out = Path(cfg.train.output_dir)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, values in grid.items():
        results[name] = []
        for value in values:
            point = copy.deepcopy(cfg)
            _set(point, SWEEP_KEYS[name], float(value))
            run_dir = out / f"{name}-{value:g}"
            point.train.output_dir = str(run_dir)
            point.validate()
            logger.info("sweep %s = %g -> %s", name, value, run_dir)
            if seeds:
                summary = run_seeds(point, seeds, overwrite, train_fn, quiet=True)
                mean, std = summary["mean"], summary["std"]
            else:
                metrics = _train(point, overwrite, train_fn)
                mean = {**metrics.get("sts", {}), "best_stsb_dev": float(metrics["best_stsb_dev"])}
                std = dict.fromkeys(mean, 0.0)
            results[name].append(
                {
                    "value": float(value),
                    "stsb_dev": mean["best_stsb_dev"],
                    "stsb_dev_std": std["best_stsb_dev"],
                    "sts_avg": mean.get("avg", math.nan),
                    "sts_avg_std": std.get("avg", math.nan),
                    "run_dir": str(run_dir),
                }
            )
    write_json_atomic(out / "sweep.json", results)
    plot_sweep(results, out / "sweep.png")
    for name, points in results.items():
        print(f"{name}: " + ", ".join(f"{p['value']:g} -> dev {p['stsb_dev']:.2f} (STS avg {p['sts_avg']:.2f})" for p in points))
    return results


def plot_sweep(results: Mapping[str, Sequence[Mapping[str, float]]], path: Path) -> None:
    """One panel per swept setting: best STS-B dev (± std over seeds) against its value.

    Temperature spans orders of magnitude (0.001 .. 1 in the SimCSE paper's Table D.1),
    so its axis is logarithmic.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], results.items(), strict=True):
        x = [p["value"] for p in points]
        y = [p["stsb_dev"] for p in points]
        err = [p.get("stsb_dev_std", 0.0) for p in points]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3)
        if name == "temperature" and min(x) > 0:
            ax.set_xscale("log")
        ax.set_xlabel(name.replace("_", " "))
        ax.set_ylabel("STS-B dev (Spearman x 100)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
