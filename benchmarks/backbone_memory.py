"""Full fine-tuning against LoRA, gradient checkpointing off and on: trainable parameters, peak
memory and step time of one unsup step on a BERT-base-sized encoder (random weights; MPNet has no
gradient checkpointing in transformers 5), variants alternated in rounds in one process.

    python -m benchmarks.backbone_memory [--batch-size 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import REPO, machine, peak_rss_mib, save_results, spread

VARIANTS = {"full": (0, False), "full-gc": (0, True), "lora8": (8, False), "lora8-gc": (8, True)}  # (LoRA rank, checkpointing)
BASE: dict[str, Any] = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}


def one_variant(path: Path, lora: int, checkpointing: bool, batch: torch.Tensor, steps: int, device: str) -> dict[str, Any]:
    from simcse_kit.config.run import LossConfig, ModelConfig
    from simcse_kit.model.modeling import SimCSEModel, base_encoder
    from simcse_kit.training.objectives import SimCSEObjective

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(path), pooler="avg", lora_r=lora, packing=False))
    if checkpointing:
        base_encoder(model.encoder).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.to(device).train().parameters() if p.requires_grad]
    optimizer, objective = torch.optim.AdamW(params, lr=1e-5), SimCSEObjective("unsup", LossConfig(temperature=0.05))
    inputs = {"input_ids": batch.to(device), "attention_mask": torch.ones_like(batch).to(device)}
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(steps + 2):  # two warm-up steps
        torch.cuda.synchronize() if cuda else None
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            objective.step(model, inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize() if cuda else None
        times += [time.perf_counter() - start] if step >= 2 else []
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib()
    out = {"trainable": sum(p.numel() for p in params), "peak_mib": peak}
    del model, optimizer
    gc.collect()
    return out | {"s_per_step": sorted(times)[len(times) // 2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per step (twice as many rows: unsup)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoModel, BertConfig

    device, kind, args.max_seq_len = ("cuda" if torch.cuda.is_available() else "cpu"), "bert-base", 32
    ids = torch.randint(5, 30000, (args.batch_size, args.max_seq_len), generator=torch.Generator().manual_seed(0))
    batch = ids.repeat_interleave(2, dim=0)  # [a, a, b, b, ...], as the unsup collator lays it out
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModel.from_config(BertConfig(vocab_size=30522, **BASE)).save_pretrained(tmp)
        for round_ in range(args.rounds):
            for name, (lora, checkpointing) in VARIANTS.items():
                measured = one_variant(Path(tmp), lora, checkpointing, batch, args.steps, device)
                runs.append({"round": round_, "variant": name} | measured)
    summary = {
        v: {k: spread([r[k] for r in runs if r["variant"] == v]) for k in ("peak_mib", "s_per_step")}
        | {"trainable": next(r["trainable"] for r in runs if r["variant"] == v)}
        for v in VARIANTS
    }
    out = args.out or REPO / "benchmarks" / "results" / f"backbone_memory-{device}-{kind}.json"
    where = machine()
    save_results(out, {
        "machine": where, "args": vars(args) | {"out": str(out)}, "device": where.get("gpu", device), "model": kind,
        "runs": runs, "summary": summary, "command": f"python -m benchmarks.backbone_memory --batch-size {args.batch_size}",
    })  # fmt: skip


if __name__ == "__main__":
    main()
