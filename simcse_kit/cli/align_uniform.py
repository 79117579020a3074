"""``simcse-kit align-uniform``: alignment and uniformity (Wang & Isola 2020) of a model
on one STS-B split, with its Spearman."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from simcse_kit.cli.options import add_batch_size, add_data_options, add_device, add_json, add_model, add_trust, check_output
from simcse_kit.config.recipes import senteval_dir
from simcse_kit.files import write_json_atomic


def cmd_align_uniform(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation import align_uniform_model, read_stsb, stsb_split_path

    pairs = read_stsb(stsb_split_path(senteval_dir(args.data_dir, args.data_root), args.split))
    check_output(args.json)
    options = {"pooler": args.pooler, "threshold": args.threshold, "batch_size": args.batch_size, "device": args.device}
    result = align_uniform_model(args.model, pairs, trust_remote_code=args.trust_remote_code, **options)
    print(f"STS-B {args.split}: {len(pairs)} pairs, {int(result['positive_pairs'])} with gold >= {args.threshold:g}")
    print(f"alignment  {result['alignment']:.4f}   (lower is better)")
    print(f"uniformity {result['uniformity']:.4f}   (lower is better)")
    print(f"spearman   {result['spearman']:.2f}")
    if args.json is not None:
        write_json_atomic(args.json, result)
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("align-uniform", help="alignment (gold >= 4 pairs) and uniformity on STS-B (Wang & Isola 2020)")
    add_model(p)
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument("--split", choices=("dev", "test", "train"), default="dev", help="STS-B split")
    p.add_argument("--threshold", type=float, default=4.0, help="minimum gold score of a positive pair")
    add_json(p)
    add_batch_size(p)
    add_device(p)
    add_trust(p)
    p.set_defaults(func=cmd_align_uniform, extra_ok=False)
