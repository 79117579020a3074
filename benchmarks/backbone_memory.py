"""Full fine-tuning against LoRA, gradient checkpointing off and on: trainable parameters, peak
memory and step time of one unsup step on a base-sized encoder (random weights, BERT-base or
MPNet-base; MPNet has no checkpointing of its own in transformers 5, the kit checkpoints its
blocks). On CUDA the variants alternate in rounds in one process (peak: CUDA's peak allocation,
reset per variant); on a CPU each variant runs in a fresh process (peak: its peak RSS).

    python -m benchmarks.backbone_memory [--family mpnet] [--batch-size 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import REPO, add_allow_dirty, emit, machine, peak_rss_mib, run_rounds, save_results, spread

VARIANTS = {"full": (0, False), "full-gc": (0, True), "lora8": (8, False), "lora8-gc": (8, True)}  # (LoRA rank, checkpointing)
BASE: dict[str, Any] = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
FAMILIES = ("bert", "mpnet")


def build_encoder(family: str, folder: Path) -> None:
    """A base-sized ``family`` encoder with random weights (seeded) saved into ``folder``."""
    from transformers import AutoModel, BertConfig, MPNetConfig

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, **BASE) if family == "bert" else MPNetConfig(vocab_size=30527, **BASE)
    AutoModel.from_config(config).save_pretrained(folder)


def one_variant(
    path: Path, lora: int, checkpointing: bool, batch: torch.Tensor, steps: int, device: str, warmup: int = 2
) -> dict[str, Any]:
    from simcse_kit.config.run import LossConfig, ModelConfig
    from simcse_kit.model.checkpointing import enable_gradient_checkpointing
    from simcse_kit.model.modeling import SimCSEModel, base_encoder
    from simcse_kit.training.objective.objectives import SimCSEObjective

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(path), pooler="avg", lora_r=lora, packing=False))
    how = enable_gradient_checkpointing(base_encoder(model.encoder)) if checkpointing else "off"
    params = [p for p in model.to(device).train().parameters() if p.requires_grad]
    optimizer, objective = torch.optim.AdamW(params, lr=1e-5), SimCSEObjective("unsup", LossConfig(temperature=0.05))
    inputs = {"input_ids": batch.to(device), "attention_mask": torch.ones_like(batch).to(device)}
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):  # the optimizer's state exists from the second step on
        torch.cuda.synchronize() if cuda else None
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            objective.step(model, inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize() if cuda else None
        times += [time.perf_counter() - start] if step >= warmup else []
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib()
    out = {"trainable": sum(p.numel() for p in params), "peak_mib": peak, "checkpointing": how}
    del model, optimizer
    gc.collect()
    return out | {"s_per_step": sorted(times)[len(times) // 2]}


def unsup_batch(batch_size: int, max_seq_len: int) -> torch.Tensor:
    ids = torch.randint(5, 30000, (batch_size, max_seq_len), generator=torch.Generator().manual_seed(0))
    return ids.repeat_interleave(2, dim=0)  # [a, a, b, b, ...], as the unsup collator lays it out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="bert", help="the encoder's architecture, base-sized")
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per step (twice as many rows: unsup)")
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    add_allow_dirty(parser)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1: the peak includes AdamW's state)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of a CPU worker")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    device, kind = ("cuda" if torch.cuda.is_available() else "cpu"), f"{args.family}-base"
    batch = unsup_batch(args.batch_size, args.max_seq_len)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.worker is not None:  # one variant in this fresh process: its peak RSS is its own
            build_encoder(args.family, Path(tmp))
            measured = one_variant(Path(tmp), *VARIANTS[args.worker], batch, args.steps, device, args.warmup)
            emit(measured | {"variant": args.worker})
            return
        if device == "cpu":
            common = [f"--family={args.family}", f"--batch-size={args.batch_size}", f"--max-seq-len={args.max_seq_len}"]
            common += [f"--steps={args.steps}", f"--warmup={args.warmup}"]
            runs = run_rounds(Path(__file__), args.variants, common, args.rounds, args.threads, metric="peak_mib")
        else:
            build_encoder(args.family, Path(tmp))
            for round_ in range(args.rounds):
                for name in args.variants:
                    measured = one_variant(Path(tmp), *VARIANTS[name], batch, args.steps, device, args.warmup)
                    runs.append({"round": round_, "variant": name} | measured)
    summary = {
        v: {k: spread([r[k] for r in runs if r["variant"] == v]) for k in ("peak_mib", "s_per_step")}
        | {"trainable": next(r["trainable"] for r in runs if r["variant"] == v)}
        for v in args.variants
    }
    out = args.out or REPO / "benchmarks" / "results" / f"backbone_memory-{device}-{kind}.json"
    where = machine()
    command = f"python -m benchmarks.backbone_memory --family {args.family} --batch-size {args.batch_size}"
    save_results(out, allow_dirty=args.allow_dirty, record={
        "machine": where, "args": vars(args) | {"out": str(out)}, "device": where.get("gpu", device), "model": kind,
        "runs": runs, "summary": summary, "command": command,
    })  # fmt: skip


if __name__ == "__main__":
    main()
