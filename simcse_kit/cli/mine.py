"""``simcse-kit mine``: hard negatives (``hard_neg``, or ``hard_neg_1 .. hard_neg_k`` with
``--num-negatives k``) for sent0,sent1 pairs, mined with a model
(:func:`simcse_kit.tools.mining.mine_file`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import POOLER_HELP, add_batch_size, add_device, add_trust
from simcse_kit.config.run import GUIDE_MARGIN_STRATEGIES
from simcse_kit.config.sections import VECTOR_PRECISIONS


def cmd_mine(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.tools.mining import mine_file

    mine_file(
        args.pairs,
        args.out,
        model=args.model,
        pooler=args.pooler,
        top_k=args.range_max,
        margin=args.margin,
        sampling_strategy=args.sampling_strategy,
        seed=args.seed,
        batch_size=args.batch_size,
        device=args.device,
        num_negatives=args.num_negatives,
        range_min=args.range_min,
        relative_margin=args.relative_margin,
        index=args.index,
        guide=args.guide,
        guide_margin=args.guide_margin,
        guide_margin_strategy=args.guide_margin_strategy,
        precision=args.embedding_precision,
        trust_remote_code=args.trust_remote_code,
    )
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("mine", help="add hard negatives to sent0,sent1 pairs, mined with a model over the file's sentences")
    p.add_argument("pairs", type=Path, help="CSV or JSONL with sent0, sent1")
    p.add_argument(
        "out",
        type=Path,
        help="written with sent0, sent1 and hard_neg (hard_neg_1 .. hard_neg_k with --num-negatives k); "
        "JSONL for a .jsonl name (hard_neg a list of k texts), else CSV",
    )
    p.add_argument("--model", default=None, help="anything 'simcse-kit evaluate' accepts (default: the default model)")
    p.add_argument("--pooler", default=None, help=POOLER_HELP)
    p.add_argument("--num-negatives", type=int, default=1, help="hard negatives per row (k); rows with fewer are left out")
    p.add_argument(
        "--range-max",
        "--top-k",
        dest="range_max",
        type=int,
        default=None,
        help="candidates considered per anchor, best first (default: range-min + 10 x num-negatives)",
    )
    p.add_argument("--range-min", type=int, default=0, help="skip this many best candidates left after the margins")
    p.add_argument(
        "--margin",
        "--absolute-margin",
        dest="margin",
        type=float,
        default=0.0,
        help="skip candidates with cos(a, c) > cos(a, pos) - margin",
    )
    p.add_argument(
        "--relative-margin",
        type=float,
        default=None,
        help="also skip candidates with cos(a, c) > cos(a, pos) - |cos(a, pos)| x margin (0.05: 5%% below the positive)",
    )
    p.add_argument(
        "--sampling-strategy",
        choices=("top", "random"),
        default="top",
        help="the best candidates left, or a seeded sample of them",
    )
    p.add_argument(
        "--guide",
        default=None,
        help="a second model (anything --model accepts, recording its pooler) that vets the candidates: one it rates above "
        "the positive (less --guide-margin) is not taken, as loss.guide does in training",
    )
    p.add_argument("--guide-margin", type=float, default=0.0, help="with --guide: see --guide-margin-strategy")
    p.add_argument(
        "--guide-margin-strategy",
        choices=GUIDE_MARGIN_STRATEGIES,
        default="absolute",
        help="absolute: skip guide(a, c) > guide(a, pos) - margin; relative: > guide(a, pos) x (1 - margin) for a positive score",
    )
    p.add_argument("--seed", type=int, default=0, help="for --sampling-strategy random")
    p.add_argument(
        "--index",
        choices=("exact", "faiss"),
        default="exact",
        help="exact: chunked exact search (no all-pairs matrix); faiss: a faiss IndexFlatIP (pip install simcse-kit[faiss])",
    )
    p.add_argument(
        "--embedding-precision",
        choices=VECTOR_PRECISIONS,
        default="float32",
        help="mine with quantized vectors: scores are cosines of the codes (binary: 1 - 2 x Hamming / D); int8 ranges "
        "from the file's own sentences",
    )
    add_batch_size(p)
    add_device(p)
    add_trust(p)
    p.set_defaults(func=cmd_mine, extra_ok=False)
