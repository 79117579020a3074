"""Time of one AdamW step on the default model's parameters: per-parameter loop, foreach, fused.

The parameters are those the unsup recipe trains (all-MiniLM-L6-v2 as a text run builds
it, ``simcse_kit.training.run.build_run``: 101 tensors, 22.6M values; the transformer's own
pooler is frozen), in the optimiser groups of
``simcse_kit.training.loop.param_groups``, lr 3e-5, with random gradients set once (a step
never clears them). Variants:

* ``loop``: ``torch.optim.AdamW(foreach=False)``, one parameter at a time (what AdamW
  does on CPU when neither flag is given: torch defaults to foreach only on GPUs);
* ``foreach``: ``foreach=True``, the multi-tensor kernels;
* ``fused``: ``fused=True``, one fused kernel (simcse-kit's fp32 path: ``make_optimizer``
  builds exactly this when the model is not in bf16);
* ``kit``: the optimiser a text run builds in the recipes' setting on a native-bf16 CPU
  (``build_run``'s, i.e. ``simcse_kit.training.loop.make_optimizer`` with bf16 weights, prepared: the model cast to bf16,
  embedding tables kept fp32, ``MasterWeightAdamW`` fused over fp32 masters), with bf16
  gradients; its step is the whole optimiser step of a training step: gradients
  widened to fp32, the fused update, the bf16 weights re-rounded from the masters;
* ``kit-loop``: the same master-weight path built with ``fused=False``
  (``simcse_kit.model.fastpath.bf16.bf16_training``), i.e. without the fused kernel.

Each variant gets a fresh run (its model seeded: the same every time) and optimiser;
``--warmup`` steps, then the median (and minimum) of ``--steps`` timed
``optimizer.step()`` calls. Variants alternate over ``--rounds`` so a change of load on the machine hits all of them; the
median is over all rounds' steps. ``zero_grad`` is not timed (it only drops references).

Usage::

    .venv/bin/python -m benchmarks.adamw_step                  # ~30 s on 2 cores
    .venv/bin/python -m benchmarks.adamw_step --rounds 1 --steps 5 --variants loop,fused
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks._common import REPO, machine, setup_threads

RECIPE = REPO / "train" / "unsup.yaml"
VARIANTS = ("loop", "foreach", "fused", "kit", "kit-loop")
LR = 3e-5
# The recipe with bf16 weights forced on, so "kit" is the native-bf16 CPU path whatever this
# machine's probe would decide (fast dropout does not touch the optimiser); the other
# variants start from the fp32 model.
KIT = {"mixed_precision": "bf16", "bf16_weights": "true", "fast_dropout": "false", "report_to": "none"}
FP32 = KIT | {"mixed_precision": "no", "bf16_weights": "false"}


def set_random_grads(model: nn.Module, seed: int) -> None:
    """A gradient of each trainable parameter's shape and dtype (bf16 where the model is)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(p.dtype)


def build_optimizer(variant: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh run's model (``build_run``, on one example: only its parameters matter) and
    ``variant``'s optimiser over it (the kit variants cast the model to bf16)."""
    import datasets

    from simcse_kit.config.run import load_config
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.loop import param_groups
    from simcse_kit.training.run import build_run

    cfg = load_config(RECIPE, KIT if variant == "kit" else FP32)
    run = build_run(cfg, dataset=datasets.Dataset.from_dict({"sent0": ["a man plays a guitar"]}), evaluate=False, cpu=True)
    model = run.accelerator.unwrap_model(run.model)
    if variant == "kit":
        return model, run.optimizer  # the optimiser the run's loop steps
    groups = param_groups(model, cfg.train.weight_decay)
    if variant == "loop":
        return model, torch.optim.AdamW(groups, lr=LR, foreach=False)
    if variant == "foreach":
        return model, torch.optim.AdamW(groups, lr=LR, foreach=True)
    if variant == "fused":
        return model, torch.optim.AdamW(groups, lr=LR, fused=True)
    if variant == "kit-loop":
        return model, bf16_training(model, groups, lr=LR, fused=False)
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

    base, _ = build_optimizer("fused")
    n_tensors = sum(1 for p in base.parameters() if p.requires_grad)
    n_values = sum(p.numel() for p in base.parameters() if p.requires_grad)
    print(f"{n_tensors} trainable tensors, {n_values / 1e6:.2f}M values; {args.threads} threads", flush=True)
    del base

    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            model, optimizer = build_optimizer(v)  # before the grads: the kit ones cast the model
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
