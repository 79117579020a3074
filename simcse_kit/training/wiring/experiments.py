"""Experiments over training runs: several seeds (mean ± std), and one-axis sweeps.

SimCSE's STS average moves by about two points between seeds, so a single run says
little about a recipe. :func:`run_seeds` trains one config per seed into
``OUTPUT_DIR/seed-N`` and writes the 7-task table of each seed plus mean ± sample
std (``ddof=1``) to ``OUTPUT_DIR/seeds.json``. :func:`run_sweep` varies temperature,
dropout (the augmentation of unsupervised SimCSE) and hard-negative weight one at a
time around the recipe, every other setting fixed, into
``OUTPUT_DIR/<param>-<value>``, and plots the dev score that selected each run's best
model (STS-B dev Spearman unless the recipe names another dev split; the runs'
``metrics.json`` say which) against each. Both return their results; :func:`format_seeds`
and :func:`format_sweep` make the text the CLI prints.

A finished run is reused when its saved config equals the one requested, so an
interrupted multi-seed run or sweep is continued by running the same command again (a
run stopped during its final STS table gets the table then, without training again).
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
from simcse_kit.training.engine.selection import LEGACY_DEV_LABEL, dev_selection

__all__ = [
    "SWEEP_KEYS",
    "aggregate",
    "format_seed_table",
    "format_seeds",
    "format_sweep",
    "parse_seeds",
    "parse_values",
    "plot_sweep",
    "run_seeds",
    "run_sweep",
]

logger = logging.getLogger(__name__)

TrainFn = Callable[..., dict[str, Any]]

#: Sweepable settings: CLI name -> dotted config key.
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
    else None. A finished run with a *different* config is an error, never reused; one
    that a stop cut off before its final STS table gets the table now, from its best model."""
    from simcse_kit.training.wiring.folder import config_differences, lacks_final_table

    out = Path(cfg.train.output_dir)
    if not (out / "metrics.json").is_file():
        return None
    diffs = config_differences(load_config(out / "config.yaml"), cfg)
    if diffs:
        raise ConfigError(
            f"{out} holds a finished run with another config ({'; '.join(diffs)}); pass --overwrite or use another --output-dir"
        )
    logger.info("reusing the finished run in %s", out)
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    # The run writes metrics.json before its final table, so a stop there keeps the training. Reused as it
    # stands, the seed would have no STS columns and seeds.json would lose them for every seed (aggregate
    # keeps the keys all seeds share). The table is owed, not the training.
    if cfg.train.final_eval and lacks_final_table(out, metrics):
        from simcse_kit.training.wiring.run import owed_table  # only here: a reused run builds no model

        logger.info("%s: training finished without its final STS table; scoring its best model", out)
        metrics["sts"] = owed_table(cfg, out)
        write_json_atomic(out / "metrics.json", metrics)
    return metrics


def _train(cfg: RunConfig, overwrite: bool, train_fn: TrainFn | None) -> dict[str, Any]:
    if not overwrite:
        done = _finished(cfg)
        if done is not None:
            return done
    if train_fn is None:
        from simcse_kit.training.wiring.run import train

        train_fn = train
    return train_fn(cfg.validate(), overwrite=overwrite)


def dev_row(metrics: Mapping[str, Any], cfg: RunConfig) -> tuple[dict[str, float], str, str]:
    """A finished run's STS table plus its best dev score (``best_dev_score``; NaN when no
    evaluation was usable), with the dev metric's key and label; folders written before
    the metric was named read through :func:`~simcse_kit.training.engine.selection.dev_selection` (``cfg``,
    the run's config, says what their dev data was)."""
    dev = dev_selection(metrics, data={"dev_format": cfg.data.dev_format, "dev_file": cfg.data.dev_file})
    best = math.nan if dev.best is None else dev.best
    return {**metrics.get("sts", {}), "best_dev_score": best}, dev.metric, dev.label


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
) -> dict[str, Any]:
    """Train ``cfg`` once per seed into ``OUTPUT_DIR/seed-N``; write ``seeds.json``.

    Args:
        cfg: the recipe; ``train.output_dir`` becomes the parent of the seed folders
            and ``train.seed`` is replaced by each seed.
        seeds: distinct seeds.
        overwrite: retrain seeds whose folder already holds a finished run.
        train_fn: ``train(cfg, overwrite=...) -> metrics`` (default
            :func:`simcse_kit.training.wiring.run.train`); tests pass a stand-in.

    Returns:
        ``{"seeds", "dev_metric", "dev_label", "per_seed": {seed: STS table +
        best_dev_score}, "mean", "std", "n"}``, also written to ``OUTPUT_DIR/seeds.json``
        (:func:`format_seeds` makes it a table).
    """
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ConfigError(f"seeds must be distinct and non-empty, got {list(seeds)}")
    out = Path(cfg.train.output_dir)
    per_seed: dict[int, dict[str, float]] = {}
    names: list[tuple[str, str]] = []
    for seed in seeds:
        run = copy.deepcopy(cfg)
        run.train.seed = seed
        run.train.output_dir = str(out / f"seed-{seed}")
        logger.info("seed %d -> %s", seed, run.train.output_dir)
        per_seed[seed], metric, label = dev_row(_train(run, overwrite, train_fn), run)
        names.append((metric, label))
    if len(set(names)) > 1:  # one config, one dev split; a reused folder of an older kit may name it otherwise
        logger.warning("the seeds' runs name their dev metric differently (%s); the first seed's is reported", names)
    metric, label = names[0]
    mean, std = aggregate(list(per_seed.values()))
    summary = {
        "seeds": list(seeds),
        "n": len(seeds),
        "dev_metric": metric,
        "dev_label": label,
        "mean": mean,
        "std": std,
        "per_seed": {str(s): t for s, t in per_seed.items()},
    }
    write_json_atomic(out / "seeds.json", summary)
    logger.info("%d seeds written to %s", len(seeds), out / "seeds.json")
    return summary


def format_seeds(summary: Mapping[str, Any]) -> str:
    """:func:`run_seeds`' summary as a markdown table: the STS columns and the best dev
    score, headed by what it measured (a summary without ``dev_label`` reads as STS-B dev)."""
    per_seed = {int(s): t for s, t in summary["per_seed"].items()}
    dev_key = "best_dev_score" if "dev_label" in summary else "best_stsb_dev"
    label = summary.get("dev_label", LEGACY_DEV_LABEL)
    return format_seed_table(per_seed, summary["mean"], summary["std"], {**STS_COLUMNS, dev_key: f"best {label}"})


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
        ``{name: [{"value", "dev_score", "dev_score_std", "dev_metric", "dev_label", "sts_avg",
        "sts_avg_std", "run_dir"}]}`` (``dev_score``: the best dev score, named by
        ``dev_metric`` and ``dev_label``), written to ``OUTPUT_DIR/sweep.json``; the plot goes
        to ``OUTPUT_DIR/sweep.png``; :func:`format_sweep` makes it text.
    """
    unknown = [k for k in grid if k not in SWEEP_KEYS]
    if unknown or not grid:
        raise ConfigError(f"sweep over {unknown or 'nothing'}: choose from {sorted(SWEEP_KEYS)}")
    trained = [spec.mode for spec in cfg.data.training_sets()]
    if "hard_negative_weight" in grid and "hardneg" not in trained:
        raise ConfigError(f"sweeping hard_negative_weight needs data.mode 'hardneg', the recipe trains {trained}")
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
                summary = run_seeds(point, seeds, overwrite, train_fn)
                mean, std, metric, label = summary["mean"], summary["std"], summary["dev_metric"], summary["dev_label"]
            else:
                mean, metric, label = dev_row(_train(point, overwrite, train_fn), point)
                std = dict.fromkeys(mean, 0.0)
            results[name].append(
                {
                    "value": float(value),
                    "dev_score": mean["best_dev_score"],
                    "dev_score_std": std["best_dev_score"],
                    "dev_metric": metric,
                    "dev_label": label,
                    "sts_avg": mean.get("avg", math.nan),
                    "sts_avg_std": std.get("avg", math.nan),
                    "run_dir": str(run_dir),
                }
            )
    write_json_atomic(out / "sweep.json", results)
    plot_sweep(results, out / "sweep.png")
    logger.info("sweep written to %s and %s", out / "sweep.json", out / "sweep.png")
    return results


def sweep_point(point: Mapping[str, Any]) -> tuple[float, float, str]:
    """A sweep point's best dev score, its std over seeds and what it measured; points of a
    ``sweep.json`` written before the metric was named (``stsb_dev``) read as STS-B dev."""
    if "dev_score" in point:
        return float(point["dev_score"]), float(point.get("dev_score_std", 0.0)), str(point.get("dev_label", "dev score"))
    return float(point["stsb_dev"]), float(point.get("stsb_dev_std", 0.0)), LEGACY_DEV_LABEL


def format_sweep(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """:func:`run_sweep`'s results as one line per swept setting: each value's best dev
    score, named, and the STS average."""
    lines = []
    for name, points in results.items():
        cells = []
        for p in points:
            score, _, label = sweep_point(p)
            cells.append(f"{p['value']:g} -> {label} {score:.2f} (STS avg {p.get('sts_avg', math.nan):.2f})")
        lines.append(f"{name}: " + ", ".join(cells))
    return "\n".join(lines)


def plot_sweep(results: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    """One panel per swept setting: the best dev score (± std over seeds; labelled with
    what it measured) against its value.

    Temperature spans orders of magnitude (0.001 .. 1 in the SimCSE paper's Table D.1),
    so its axis is logarithmic.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], results.items(), strict=True):
        x = [p["value"] for p in points]
        y, err, labels = zip(*(sweep_point(p) for p in points), strict=True)
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3)
        if name == "temperature" and min(x) > 0:
            ax.set_xscale("log")
        ax.set_xlabel(name.replace("_", " "))
        ax.set_ylabel(f"best {labels[0]}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
