"""``simcse-kit mine``: a hard_neg column for sent0,sent1 pairs, mined with a model
(:func:`simcse_kit.training.mining.mine_file`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import POOLER_HELP, add_batch_size, add_device


def cmd_mine(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.training.mining import mine_file

    mine_file(
        args.pairs,
        args.out,
        model=args.model,
        pooler=args.pooler,
        top_k=args.top_k,
        margin=args.margin,
        sampling_strategy=args.sampling_strategy,
        seed=args.seed,
        batch_size=args.batch_size,
        device=args.device,
    )
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("mine", help="add a hard_neg column to sent0,sent1 pairs, mined with a model over the file's sentences")
    p.add_argument("pairs", type=Path, help="CSV or JSONL with sent0, sent1")
    p.add_argument("out", type=Path, help="CSV written with sent0, sent1, hard_neg")
    p.add_argument("--model", default=None, help="anything 'simcse-kit evaluate' accepts (default: the default model)")
    p.add_argument("--pooler", default=None, help=POOLER_HELP)
    p.add_argument("--top-k", type=int, default=10, help="candidates considered per anchor")
    p.add_argument("--margin", type=float, default=0.0, help="skip candidates with cos(a, c) > cos(a, pos) - margin")
    p.add_argument("--sampling-strategy", choices=("top", "random"), default="top", help="best candidate, or one of the top-k")
    p.add_argument("--seed", type=int, default=0, help="for --sampling-strategy random")
    add_batch_size(p)
    add_device(p)
    p.set_defaults(func=cmd_mine, extra_ok=False)
