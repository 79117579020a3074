"""Peak memory (RSS) of simcse-kit training per batch size, plain vs GradCache.

Each point is a fresh interpreter running the real loop (``train_throughput.py``'s
simcse-kit worker: default model, unsup, max length 32) for a few steps; its
``ru_maxrss`` is the peak resident set size, start-up (Python, torch, the model,
AdamW state) included.

Plain full-batch training keeps every layer's activations for all 2 x batch rows,
so its peak grows with the batch; with GradCache only one chunk's activations live
at a time. Plain runs above ``--max-plain-batch`` are skipped by default so a
shared machine is not pushed into swap or the OOM killer.

Usage::

    .venv/bin/python -m benchmarks.memory                       # ~8 min on 2 cores
    .venv/bin/python -m benchmarks.memory --batch-sizes 64 128 --precision fp32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import machine, run_worker

TRAIN = Path(__file__).resolve().parent / "train_throughput.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--chunk", type=int, default=128, help="GradCache chunk rows")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fast"), default="fast", help="fast: the recipes' setting")
    parser.add_argument("--max-plain-batch", type=int, default=256, help="largest batch run without GradCache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    rows = []
    for batch in args.batch_sizes:
        for chunk in (0, args.chunk):
            if chunk == 0 and batch > args.max_plain_batch:
                continue
            if chunk >= 2 * batch:  # one chunk would hold the whole batch: same as plain
                continue
            res = run_worker(
                TRAIN,
                [
                    f"--worker=kit-{args.precision}",
                    f"--batch-size={batch}",
                    f"--grad-cache-chunk={chunk}",
                    "--warmup=1",
                    "--steps=1",
                    f"--threads={args.threads}",
                ],
                args.threads,
            )
            row = {
                "batch": batch,
                "grad_cache_chunk": chunk,
                "peak_rss_mib": res["peak_rss_mib"],
                "sentences_per_s": res["sentences_per_s"],
            }
            rows.append(row)
            mode = f"GradCache chunk {chunk}" if chunk else "plain"
            print(
                f"batch {batch:5d} {mode:20s} peak RSS {row['peak_rss_mib']:8.0f} MiB  {row['sentences_per_s']:7.1f} sent/s",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "args": vars(args), "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
