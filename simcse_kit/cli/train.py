"""``simcse-kit train`` (a run from a recipe) and ``simcse-kit sweep`` (one-axis sweeps)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from simcse_kit.cli.options import parse_overrides
from simcse_kit.config.recipes import find_recipe
from simcse_kit.errors import ConfigError


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config.run import load_config
    from simcse_kit.evaluation.contamination import format_marked_table
    from simcse_kit.training.wiring.run import train

    cfg = load_config(find_recipe(args.config), parse_overrides(extra)).check_data()
    if args.seeds is not None:  # one run per seed in OUTPUT_DIR/seed-N, then mean ± std
        from simcse_kit.training.wiring.experiments import format_seeds, parse_seeds, run_seeds

        if args.resume:
            raise ConfigError("--seeds runs reuse finished seeds on their own; run the same command again instead of --resume")
        print(format_seeds(run_seeds(cfg, parse_seeds(args.seeds), overwrite=args.overwrite)))
        return 0
    metrics = train(cfg, overwrite=args.overwrite, resume=args.resume)
    if "sts" in metrics:  # the best model's STS table (on the main process)
        print(format_marked_table(metrics["sts"], metrics.get("contamination")))
    return 0


def cmd_sweep(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.experiments import SWEEP_KEYS, format_sweep, parse_seeds, parse_values, run_sweep

    grid = {name: parse_values(name, getattr(args, name)) for name in SWEEP_KEYS if getattr(args, name) is not None}
    if not grid:
        raise ConfigError(
            "nothing to sweep: give --temperature, --dropout, --hard-negative-weight and/or --word-repetition (comma-separated)"
        )
    cfg = load_config(find_recipe(args.config), parse_overrides(extra)).check_data()
    print(format_sweep(run_sweep(cfg, grid, parse_seeds(args.seeds) if args.seeds else None, overwrite=args.overwrite)))
    return 0


def config_keys_help() -> str:
    """Every config key a recipe may set and ``--key value`` may override, with its type,
    default and meaning (the field's ``help`` in simcse_kit/config/run.py)."""
    from simcse_kit.config.run import key_help

    lines = ["config keys (override as --KEY VALUE or --SECTION.KEY VALUE; dashes or underscores):"]
    for dotted, kind, default, meaning in key_help():
        flag = dotted.split(".")[1].replace("_", "-")
        first_sentence = meaning.split(". ")[0].rstrip(".")
        lines.append(f"  --{flag:<22} {kind:<14} default {default!r:<12} {first_sentence}")
    return "\n".join(lines)


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    # allow_abbrev=False: an override such as --seed 3 must never be read as --seeds.
    p = add_parser(
        "train",
        help="train from a YAML recipe; any config key can be overridden as --key value",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=config_keys_help(),
    )
    p.add_argument("config", help="recipe YAML file, or a built-in recipe's name (simcse-kit recipes)")
    p.add_argument(
        "--overwrite", action="store_true", help="start over in --output-dir (a run folder, with config.yaml, or an empty one)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its newest checkpoint")
    p.add_argument("--seeds", default=None, help="e.g. 1,2,3: a run per seed in OUTPUT_DIR/seed-N; mean ± std in seeds.json")
    p.set_defaults(func=cmd_train, extra_ok=True)

    p = add_parser(
        "sweep",
        help="one-axis sweeps of temperature / dropout / hard-negative weight; plot of STS-B dev against each",
        allow_abbrev=False,
    )
    p.add_argument("config", help="base recipe (file or built-in name); other keys may be overridden as --key value")
    p.add_argument("--temperature", default=None, help="comma-separated values, e.g. 0.01,0.05,0.1")
    p.add_argument("--dropout", default=None, help="comma-separated values, e.g. 0.05,0.1,0.2")
    p.add_argument("--hard-negative-weight", dest="hard_negative_weight", default=None, help="comma-separated (hardneg mode)")
    p.add_argument("--word-repetition", dest="word_repetition", default=None, help="comma-separated ESimCSE dup rates (unsup)")
    p.add_argument("--seeds", default=None, help="seeds per point (mean ± std error bars)")
    p.add_argument("--overwrite", action="store_true", help="retrain points already finished")
    p.set_defaults(func=cmd_sweep, extra_ok=True)
