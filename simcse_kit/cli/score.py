"""``simcse-kit score``: a teacher's scores of each row's positive and hard negatives, added
to a ``hardneg`` file for ``loss.distill`` (:func:`simcse_kit.tools.scoring.score_file`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import POOLER_HELP, add_batch_size, add_device, add_trust


def cmd_score(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.tools.scoring import score_file

    score_file(
        args.pairs,
        args.out,
        model=args.model,
        pooler=args.pooler,
        cross_encoder=args.cross_encoder,
        batch_size=args.batch_size,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
    )
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("score", help="add a teacher's scores of each row's positive and hard negatives (for loss.distill)")
    p.add_argument("pairs", type=Path, help="CSV or JSONL with sent0, sent1 and hard_neg (or hard_neg_1 .. hard_neg_k)")
    p.add_argument(
        "out",
        type=Path,
        help='written with the same rows and their scores: JSONL for a .jsonl name ("scores": [s_pos, s_neg_1, ..]), '
        "else CSV (score_pos, score_neg or score_neg_1 .. score_neg_k)",
    )
    teacher = p.add_mutually_exclusive_group()
    teacher.add_argument(
        "--model", default=None, help="a bi-encoder, anything 'simcse-kit evaluate' accepts: cosines (default: the default model)"
    )
    teacher.add_argument(
        "--cross-encoder", default=None, help="a sentence-transformers CrossEncoder folder or hub id: its predict() scores"
    )
    p.add_argument("--pooler", default=None, help=POOLER_HELP)
    add_batch_size(p)
    add_device(p)
    add_trust(p)
    p.set_defaults(func=cmd_score, extra_ok=False)
