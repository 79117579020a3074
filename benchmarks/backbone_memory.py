"""Full fine-tuning against LoRA, gradient checkpointing off and on: trainable parameters, peak
memory and step time of one unsup training step on a BERT-base-sized encoder (110M, random
weights: memory and time do not depend on them; MPNet has no gradient checkpointing in
transformers 5), the variants alternated in rounds in one process.

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

# (name, LoRA rank, gradient checkpointing)
VARIANTS = (("full", 0, False), ("full-gc", 0, True), ("lora8", 8, False), ("lora8-gc", 8, True))
BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}


def build(folder: Path, size: dict[str, int]) -> Path:
    from transformers import AutoModel, BertConfig

    torch.manual_seed(0)
    AutoModel.from_config(BertConfig(vocab_size=30522, max_position_embeddings=512, **size)).save_pretrained(folder)
    return folder


def one_variant(path: Path, lora: int, checkpointing: bool, batch: torch.Tensor, steps: int, device: str) -> dict[str, Any]:
    from simcse_kit.config.run import LossConfig, ModelConfig
    from simcse_kit.model.modeling import SimCSEModel, base_encoder
    from simcse_kit.training.objectives import SimCSEObjective

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(path), pooler="avg", lora_r=lora, packing=False))
    if checkpointing:
        base_encoder(model.encoder).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    inputs = {"input_ids": batch.to(device), "attention_mask": torch.ones_like(batch).to(device)}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(steps + 2):  # two warm-up steps
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            objective.step(model, inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else peak_rss_mib()
    out = {"trainable": sum(p.numel() for p in params), "total": sum(p.numel() for p in model.parameters())}
    del model, optimizer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out | {"peak_mib": peak, "s_per_step": sorted(times)[len(times) // 2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per step (twice as many rows: unsup)")
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model (a quick check of the script)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128} if args.tiny else BASE
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 30000, (args.batch_size, args.max_seq_len), generator=generator)
    batch = ids.repeat_interleave(2, dim=0)  # [a, a, b, b, ...]: each sentence twice, as the unsup collator lays it out
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = build(Path(tmp) / "bert", size)
        for round_ in range(args.rounds):
            for name, lora, checkpointing in VARIANTS:
                runs.append(
                    {"round": round_, "variant": name} | one_variant(path, lora, checkpointing, batch, args.steps, device)
                )
                print(runs[-1], flush=True)
    summary = {
        name: {k: spread([r[k] for r in runs if r["variant"] == name]) for k in ("peak_mib", "s_per_step")}
        | {"trainable": next(r["trainable"] for r in runs if r["variant"] == name)}
        for name, _, _ in VARIANTS
    }
    kind = "tiny" if args.tiny else "bert-base"
    out = args.out or REPO / "benchmarks" / "results" / f"backbone_memory-{device}-{kind}.json"
    where = machine()
    record = {
        "machine": where,
        "args": vars(args) | {"out": str(out)},
        "device": where.get("gpu", device),
        "model": kind,
        "runs": runs,
    }
    record |= {"summary": summary, "command": f"python -m benchmarks.backbone_memory --batch-size {args.batch_size}"}
    save_results(out, record)


if __name__ == "__main__":
    main()
