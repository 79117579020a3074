"""The ``simcse-kit`` console script: one entry point, one subcommand per job.

Errors the user can fix (bad data, bad config, missing model) print one line and
exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from simcse_kit.errors import ConfigError, DataError

logger = logging.getLogger("simcse_kit")


def parse_overrides(tokens: Sequence[str]) -> dict[str, str]:
    """``['--seed', '3', '--model.pooler=cls']`` -> ``{'seed': '3', 'model.pooler': 'cls'}``."""
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}; options are --key value")
        key = tok[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            i += 1
            value = tokens[i]
        else:
            raise ConfigError(f"option --{key} needs a value")
        out[key] = value
        i += 1
    return out


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config import load_config
    from simcse_kit.training import train

    cfg = load_config(args.config, parse_overrides(extra))
    train(cfg, overwrite=args.overwrite)
    return 0


def cmd_evaluate(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        raise ConfigError(f"unexpected arguments {extra}")
    from simcse_kit.evaluation import evaluate_model

    evaluate_model(
        args.model,
        pooler=args.pooler,
        data_dir=args.data_dir,
        tasks=args.tasks,
        json_out=args.json,
        batch_size=args.batch_size,
        precision=args.precision,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simcse-kit", description="SimCSE sentence-embedding training and evaluation")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train from a YAML recipe; any config key can be overridden as --key value")
    p.add_argument("config", type=Path, help="recipe YAML (see train/)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run in --output-dir")
    p.set_defaults(func=cmd_train, extra_ok=True)

    p = sub.add_parser("evaluate", help="STS12-16, STS-B, SICK-R Spearman x 100 (SimCSE protocol)")
    p.add_argument("model", help="a simcse-kit run or model folder, a sentence-transformers folder, an HF folder, or 'all-MiniLM-L6-v2'")
    p.add_argument("--pooler", default=None, help="pooler for a plain HF model (simcse-kit and ST folders record theirs)")
    p.add_argument("--data-dir", default="../shared/data/senteval", help="SentEval-layout data folder")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of tasks (default: all 7)")
    p.add_argument("--json", type=Path, default=None, help="write results here")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--precision", choices=("no", "bf16", "fp16"), default="no", help="inference autocast")
    p.set_defaults(func=cmd_evaluate, extra_ok=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not args.extra_ok:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers.modeling_utils"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return args.func(args, extra)
    except (ConfigError, DataError) as exc:
        print(f"simcse-kit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
