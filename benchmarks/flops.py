"""How close a training step comes to the machine's bf16 matmul peak.

1. Peak: the best of several large square ``bf16`` matmuls (and ``fp32`` for
   reference) at the given thread count, in GFLOP/s (2 n^3 per product).
2. Step FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one forward +
   backward of the default model on a real unsup batch (batch 64 = 128 rows, max
   length 32). It counts matmul-like ops (linear, bmm, attention); elementwise
   work (GELU, LayerNorm, dropout, AdamW) is not counted, as is usual for MFU.
3. Step rate: ``train_throughput.py``'s simcse-kit workers (the real loop): ``fast``
   (the recipes' setting: bf16 weights, fast dropout) and ``fp32``, in padded tokens
   per second of the collated batches.

The model runs on packed rows (``simcse_kit.packing``), so the counted FLOPs are the
ones executed on the batch's real tokens, spread over its padded tokens. Achieved
FLOP/s = counted FLOPs per padded token x padded tokens per second; the fraction of
the bf16 peak is the model FLOP utilisation (MFU).

Usage::

    .venv/bin/python -m benchmarks.flops          # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks._common import WIKI, machine, run_worker, setup_threads

TRAIN = Path(__file__).resolve().parent / "train_throughput.py"


def matmul_gflops(n: int, dtype: object, repeats: int = 5) -> float:
    """Best-of-``repeats`` GFLOP/s of an ``n x n`` by ``n x n`` product."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    a @ b  # warm-up: oneDNN picks and caches its kernel
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def step_flops(batch_size: int, max_seq_len: int, batches: int = 8) -> tuple[float, int]:
    """Matmul FLOPs of ``batches`` forward+backward passes on real batches (packing
    varies from batch to batch), and their padded tokens."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoTokenizer

    from simcse_kit.config import LossConfig, ModelConfig
    from simcse_kit.data import ContrastiveCollator, read_sentences
    from simcse_kit.modeling import SimCSEModel, resolve_model_path
    from simcse_kit.objectives import SimCSEObjective

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    model = SimCSEModel.from_config(ModelConfig(max_seq_len=max_seq_len)).train()
    objective = SimCSEObjective("unsup", LossConfig())
    sents = read_sentences(WIKI)
    collate = ContrastiveCollator(tokenizer, "unsup", max_seq_len)
    counter = FlopCounterMode(display=False)
    tokens = 0
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(batches):
            batch = collate([{"sent0": s} for s in sents[i * batch_size : (i + 1) * batch_size]])
            objective.step(model, batch)  # backward=None: loss.backward()
            tokens += int(batch["input_ids"].numel())
    return float(counter.get_total_flops()), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=2048, help="matmul size for the peak")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    setup_threads(args.threads)
    import torch

    peak_bf16 = matmul_gflops(args.n, torch.bfloat16)
    peak_fp32 = matmul_gflops(args.n, torch.float32)
    print(
        f"matmul {args.n}^3, {args.threads} threads: bf16 {peak_bf16:.0f} GFLOP/s, "
        f"fp32 {peak_fp32:.0f} GFLOP/s ({peak_bf16 / peak_fp32:.1f}x)"
    )

    flops, tokens = step_flops(64, 32)
    per_step = flops / 8
    print(
        f"one step (batch 64 = 128 rows, len 32, packed; mean of 8 batches): {per_step / 1e9:.1f} GFLOP counted, "
        f"{flops / tokens / 1e6:.2f} MFLOP per padded token"
    )

    result: dict[str, object] = {
        "machine": machine(),
        "peak_bf16_gflops": peak_bf16,
        "peak_fp32_gflops": peak_fp32,
        "step_gflop": per_step / 1e9,
    }
    for precision in ("fast", "fp32"):
        res = run_worker(
            TRAIN, [f"--worker=kit-{precision}", f"--steps={args.steps}", "--warmup=2", f"--threads={args.threads}"], args.threads
        )
        achieved = flops / tokens * res["padded_tokens_per_s"] / 1e9
        print(
            f"kit-{precision} training: {res['padded_tokens_per_s']:.0f} padded tok/s -> {achieved:.0f} GFLOP/s "
            f"= {100 * achieved / peak_bf16:.1f}% of the bf16 matmul peak ({100 * achieved / peak_fp32:.1f}% of fp32's)"
        )
        result[f"kit_{precision}"] = res | {"achieved_gflops": achieved, "fraction_of_bf16_peak": achieved / peak_bf16}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
