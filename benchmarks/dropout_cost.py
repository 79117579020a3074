"""What one dropout call costs, forward and backward, by implementation (issue 12).

At the unsup recipe's shapes in bf16 (a hidden state of ~3200 packed tokens x 384, about
what batch 64 at length 32 gives; 19 such calls a forward on the default model):

* ``torch``: ``torch.nn.functional.dropout`` (one Bernoulli draw per element);
* ``where``: ``simcse_kit.model.fastpath.fast_dropout(..., integer_mask=False)``: 16-bit uniforms
  from 64-bit draws, a bool mask applied with ``torch.where``;
* ``integer``: ``fast_dropout``'s default for 16-bit floats: the same uniforms, the mask
  built in the integers as 1.0's bit pattern and multiplied in (equal results);
* ``draw only``: the 64-bit draws alone, the floor of both fast forms.

Median milliseconds over ``--reps`` calls after one warm-up, alternating implementations.

Usage::

    .venv/bin/python -m benchmarks.dropout_cost          # ~10 s
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import machine, setup_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=3200)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    setup_threads(args.threads)
    import torch
    import torch.nn.functional as F

    from simcse_kit.model.fastpath import fast_dropout

    x = torch.randn(args.tokens, args.hidden, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    n = x.numel()

    def forward_backward(drop: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def call() -> None:
            x.grad = None
            drop(x).backward(grad)

        return call

    calls = {
        "torch": forward_backward(lambda t: F.dropout(t, args.p, training=True)),
        "where": forward_backward(lambda t: fast_dropout(t, args.p, integer_mask=False)),
        "integer": forward_backward(lambda t: fast_dropout(t, args.p)),
        "draw only": lambda: torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    for _ in range(args.reps):
        for name, call in calls.items():
            tick = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - tick) * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"bf16 [{args.tokens} x {args.hidden}], p = {args.p}, {args.threads} threads, median of {args.reps}\n")
    print("| implementation | forward + backward, ms |")
    print("|---|---:|")
    for name, ms in medians.items():
        print(f"| {name} | {ms:.3f} |")
    print(
        f"\ninteger / where: {medians['where'] / medians['integer']:.2f}x faster; torch / integer: "
        f"{medians['torch'] / medians['integer']:.2f}x"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine(), "args": vars(args), "median_ms": medians}, indent=2, default=str))


if __name__ == "__main__":
    main()
