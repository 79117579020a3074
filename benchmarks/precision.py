"""fp32 vs bf16 matmul speed on this CPU, and what ``precision: auto`` picks (issue 12).

For each oneDNN setting (as is, and capped with ``ONEDNN_MAX_CPU_ISA=AVX2``, which
makes bf16 emulated the way it is on most AVX2 machines), a fresh process measures:

1. fp32 and bf16 matmul GFLOP/s at the default model's shapes with ``T`` tokens
   (all-MiniLM-L6-v2: hidden 384, feed-forward 1536), at ``--threads`` threads;
2. ``simcse_kit.model.precision``'s probe: its wall time (cold, per process) and the
   training and evaluation precisions it resolves ``auto`` to.

Each setting runs in its own interpreter because oneDNN reads the variable once.

Usage::

    .venv/bin/python -m benchmarks.precision        # ~20 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import REPO, emit, machine, matmul_gflops, module_command, setup_threads

# (name, m, k, n) with m = tokens: the attention projections and the feed-forward pair.
SHAPES = (("qkv/out proj", 384, 384), ("ffn up", 384, 1536), ("ffn down", 1536, 384))
ISA_SETTINGS = (None, "AVX2")


def worker(tokens: int, repeats: int, threads: int) -> None:
    """One process: matmul table, then the probe timed cold."""
    setup_threads(threads)
    import torch

    from simcse_kit.model import precision

    rows = []
    for name, k, n in SHAPES:
        fp32 = matmul_gflops(tokens, k, n, torch.float32, repeats)
        bf16 = matmul_gflops(tokens, k, n, torch.bfloat16, repeats)
        rows.append({"shape": f"{name} [{tokens}x{k}]@[{k}x{n}]", "fp32": fp32, "bf16": bf16})
    m, k, n = precision.PROBE_SHAPE
    # The probe runs before anything else of its dtype in a training run; time it cold
    # in a way that matters: its own cache cleared (oneDNN is warm from the table).
    precision.clear_probe_cache()
    start = time.perf_counter()
    train = precision.resolve_precision("auto", "cpu")
    probe_s = time.perf_counter() - start
    evaluate = precision.resolve_eval_precision("auto", "cpu")
    emit(
        {
            "rows": rows,
            "probe_shape": f"[{m}x{k}]@[{k}x{n}], 1 thread",
            "probe_ms": probe_s * 1e3,
            "probe": train.probe,
            "train": train.reason,
            "eval": evaluate.reason,
            "threads": torch.get_num_threads(),
        }
    )


def run_setting(isa: str | None, args: argparse.Namespace) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    env |= {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"} | ({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})
    cmd = [*module_command(__file__), "--worker", f"--tokens={args.tokens}", f"--repeats={args.repeats}"]
    proc = subprocess.run([*cmd, f"--threads={args.threads}"], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"worker with ONEDNN_MAX_CPU_ISA={isa} failed with status {proc.returncode}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(last[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048, help="rows of each matmul (tokens of a batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.tokens, args.repeats, args.threads)
        return
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores, avx512_bf16={info['avx512_bf16']}, amx={info['amx']}, torch {info['torch']}")
    results: dict[str, object] = {"machine": info}
    for isa in ISA_SETTINGS:
        res = run_setting(isa, args)
        results[isa or "default"] = res
        print(f"\nONEDNN_MAX_CPU_ISA={isa or '(unset)'}, {res['threads']} threads:")
        print(f"  {'matmul':34s} {'fp32 GFLOP/s':>13s} {'bf16 GFLOP/s':>13s} {'bf16/fp32':>10s}")
        for row in res["rows"]:
            print(f"  {row['shape']:34s} {row['fp32']:13.1f} {row['bf16']:13.1f} {row['bf16'] / row['fp32']:9.3g}x")
        print(f"  probe {res['probe_shape']}: {res['probe_ms']:.1f} ms, {res['probe']}")
        print(f"  auto, training:   {res['train']}")
        print(f"  auto, evaluation: {res['eval']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
