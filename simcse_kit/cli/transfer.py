"""``simcse-kit transfer``: the SentEval transfer tasks with a logistic-regression probe
(:class:`simcse_kit.evaluation.TransferEvaluator`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from simcse_kit.cli.options import (
    add_batch_size,
    add_data_options,
    add_device,
    add_json,
    add_model,
    add_trust,
    check_output,
    show,
)
from simcse_kit.config.recipes import senteval_dir


def cmd_transfer(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation import TRANSFER_COLUMNS, TransferEvaluator, format_table, run_evaluator

    data_dir = senteval_dir(args.data_dir, args.data_root)
    # Read the data first: a bad data folder fails before the model loads.
    evaluator = TransferEvaluator(
        data_dir,
        args.tasks,
        args.kfold,
        args.batch_size,
        args.max_train_samples,
        args.mrpc_features,
        normalize=args.normalize,
    )
    check_output(args.json)
    results = run_evaluator(
        evaluator, args.model, pooler=args.pooler, device=args.device, trust_remote_code=args.trust_remote_code
    )
    show(format_table(results, TRANSFER_COLUMNS), results, args.json)
    return 0


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("transfer", help="SentEval transfer tasks (MR CR SUBJ MPQA SST2 TREC MRPC), logistic-regression probe")
    add_model(p)
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of tasks (default: all 7)")
    p.add_argument("--kfold", type=int, default=10, help="folds for CV (SentEval: 10; 5 for a quick look)")
    p.add_argument("--max-train-samples", type=int, default=None, help="subsample each task's training data (quick runs)")
    p.add_argument("--mrpc-features", choices=("senteval", "full"), default="senteval", help="[|u-v|, u*v] or [u, v, |u-v|, u*v]")
    p.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="probe the vectors as encoded (SentEval's setting) instead of unit vectors, which score a model "
                   "alike with or without a final Normalize")  # fmt: skip
    add_json(p)
    add_batch_size(p)
    add_device(p)
    add_trust(p)
    p.set_defaults(func=cmd_transfer, extra_ok=False)
