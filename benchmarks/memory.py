"""Peak memory (RSS) of simcse-kit training per batch size, plain vs GradCache.

Points ``b<batch>`` (plain) and ``b<batch>-gc<chunk>`` (GradCache), each in a fresh interpreter (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks._common import emit, peak_rss_mib, run_rounds, setup_threads
from benchmarks._harness import add_options, difference, forwarded, keep, start, summary_of, values


def variant_name(batch: int, chunk: int) -> str:
    return f"b{batch}-gc{chunk}" if chunk else f"b{batch}"


def parse_variant(name: str) -> tuple[int, int]:
    """``b1024-gc128`` -> (1024, 128); ``b64`` -> (64, 0)."""
    batch, _, chunk = name.partition("-gc")
    return int(batch.removeprefix("b")), int(chunk or 0)


def points(args: argparse.Namespace) -> list[str]:
    """The measured points."""
    out = []
    for batch in args.batch_sizes:
        for chunk in (0, args.chunk):
            if chunk == 0 and batch > args.max_plain_batch:
                continue
            if chunk >= 2 * batch:  # one chunk would hold the whole batch: same as plain
                continue
            out.append(variant_name(batch, chunk))
    return out


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    from benchmarks.train_throughput import sentences_for, worker_kit

    transformers.logging.set_verbosity_error()
    args.batch_size, args.grad_cache_chunk = parse_variant(args.worker)
    res = worker_kit(args, sentences_for(args), args.precision)
    emit(
        res
        | {"variant": args.worker, "batch": args.batch_size, "grad_cache_chunk": args.grad_cache_chunk}
        | {"peak_rss_mib": peak_rss_mib()}
    )


def comparisons(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, dict[str, Any]]:
    """Peak RSS differences, each against the run-to-run spread."""
    rss = {v: values(runs, v, "peak_rss_mib") for v in variants}
    out = {}
    for v in variants:
        batch, chunk = parse_variant(v)
        plain = variant_name(batch, 0)
        if chunk and plain in rss:
            out[f"{v} - {plain}"] = difference(rss[v], rss[plain])
    for gc in (False, True):
        mode = sorted((v for v in variants if bool(parse_variant(v)[1]) == gc), key=lambda v: parse_variant(v)[0])
        for v in mode[1:]:
            out[f"{v} - {mode[0]}"] = difference(rss[v], rss[mode[0]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--chunk", type=int, default=128, help="GradCache chunk rows")
    parser.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="auto", help="auto: the recipe's setting")
    parser.add_argument("--max-plain-batch", type=int, default=256, help="largest batch run without GradCache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1, help="measured steps per point")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-seq-len", type=int, default=32)
    add_options(parser, "memory")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    variants = points(args)
    env = start(args)
    common = forwarded(args, "precision", "threads", "steps", "warmup", "max-seq-len")
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env, metric="peak_rss_mib")
    summary = summary_of(runs, variants, ("peak_rss_mib", "sentences_per_s"))
    diffs = comparisons(runs, variants)
    keep("memory", args, {"runs": runs, "summary": summary, "comparisons": diffs})


if __name__ == "__main__":
    main()
