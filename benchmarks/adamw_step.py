"""Time of one AdamW step on the default model's parameters: per-parameter loop, foreach, fused.

The parameters are those the unsup recipe trains (all-MiniLM-L6-v2 as
``simcse_kit.training.build_model`` builds it: 101 tensors, 22.6M values; the
transformer's own pooler is frozen), in the optimiser groups of
``simcse_kit.trainer.param_groups``, lr 3e-5, with random gradients set once (a step
never clears them). Variants:

* ``loop``: ``torch.optim.AdamW(foreach=False)``, one parameter at a time (what AdamW
  does on CPU when neither flag is given: torch defaults to foreach only on GPUs);
* ``foreach``: ``foreach=True``, the multi-tensor kernels;
* ``fused``: ``fused=True``, one fused kernel (simcse-kit's fp32 path: ``make_optimizer``
  builds exactly this when the model is not in bf16);
* ``kit``: the optimiser simcse-kit builds in the recipes' setting on a native-bf16 CPU
  (``simcse_kit.trainer.make_optimizer`` with bf16 weights: the model cast to bf16,
  embedding tables kept fp32, ``MasterWeightAdamW`` fused over fp32 masters), with bf16
  gradients; its step is the whole optimiser step of a training step: gradients
  widened to fp32, the fused update, the bf16 weights re-rounded from the masters;
* ``kit-loop``: the same master-weight path built with ``fused=False``
  (``simcse_kit.fastpath.bf16.bf16_training``), i.e. without the fused kernel.

Each variant gets a fresh copy of the model and optimiser; ``--warmup`` steps, then
the median (and minimum) of ``--steps`` timed ``optimizer.step()`` calls. Variants
alternate over ``--rounds`` so a change of load on the machine hits all of them; the
median is over all rounds' steps. ``zero_grad`` is not timed (it only drops references).

Usage::

    .venv/bin/python benchmarks/adamw_step.py                  # ~30 s on 2 cores
    .venv/bin/python benchmarks/adamw_step.py --rounds 1 --steps 5 --variants loop,fused
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, setup_threads  # noqa: E402

RECIPE = REPO / "train" / "unsup.yaml"
VARIANTS = ("loop", "foreach", "fused", "kit", "kit-loop")
LR = 3e-5


def set_random_grads(model: nn.Module, seed: int) -> None:
    """A gradient of each trainable parameter's shape and dtype (bf16 where the model is)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(p.dtype)


def build_optimizer(variant: str, model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """``variant``'s optimiser over ``model`` (which the kit variants cast to bf16)."""
    from simcse_kit.fastpath.bf16 import bf16_training
    from simcse_kit.trainer import make_optimizer, param_groups

    groups = param_groups(model, cfg.weight_decay)
    if variant == "loop":
        return torch.optim.AdamW(groups, lr=LR, foreach=False)
    if variant == "foreach":
        return torch.optim.AdamW(groups, lr=LR, foreach=True)
    if variant == "fused":
        return torch.optim.AdamW(groups, lr=LR, fused=True)
    if variant == "kit":
        return make_optimizer(model, cfg)
    if variant == "kit-loop":
        return bf16_training(model, groups, lr=LR, fused=False)
    raise ValueError(f"unknown variant {variant!r}")


def time_steps(optimizer: torch.optim.Optimizer, warmup: int, steps: int) -> list[float]:
    """Wall-clock ms of ``steps`` optimiser steps after ``warmup`` untimed ones."""
    for _ in range(warmup):
        optimizer.step()
    out = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the variants")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--json", type=Path, default=None, help="write all timings here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    setup_threads(args.threads)

    from simcse_kit.config import load_config
    from simcse_kit.training import build_model

    # The recipe's model with bf16 weights forced on, so "kit" is the native-bf16 CPU path
    # whatever this machine's probe would decide; fast dropout does not touch the optimiser.
    overrides = {"mixed_precision": "bf16", "bf16_weights": "true", "fast_dropout": "false", "report_to": "none"}
    cfg = load_config(RECIPE, overrides)
    base = build_model(cfg)  # fp32; each variant works on its own copy
    n_tensors = sum(1 for p in base.parameters() if p.requires_grad)
    n_values = sum(p.numel() for p in base.parameters() if p.requires_grad)
    print(f"{n_tensors} trainable tensors, {n_values / 1e6:.2f}M values; {args.threads} threads", flush=True)

    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            model = copy.deepcopy(base)
            optimizer = build_optimizer(v, model, cfg.train)  # before the grads: the kit ones cast the model
            set_random_grads(model, seed=r)
            ms = time_steps(optimizer, args.warmup, args.steps)
            times[v].extend(ms)
            print(f"round {r} {v:9s} median {statistics.median(ms):7.1f} ms", flush=True)
            del model, optimizer

    loop = statistics.median(times["loop"]) if "loop" in times else None
    print(f"\nAdamW step, {n_values / 1e6:.1f}M parameters, {args.rounds} x {args.steps} timed steps\n")
    print("| variant | median ms | min ms | vs loop |")
    print("|---|---:|---:|---:|")
    summary = {}
    for v, ms in times.items():
        med = statistics.median(ms)
        summary[v] = {"median_ms": med, "min_ms": min(ms)}
        ratio = f"{loop / med:.1f}x" if loop else "-"
        print(f"| {v} | {med:.1f} | {min(ms):.1f} | {ratio} |")
    if args.json:
        result = {"machine": machine(), "args": vars(args), "parameters": n_values, "times_ms": times, "summary": summary}
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
