"""Padding share of training and encoding batches: what packing and sorting by tokens save.

Pure counting with the default model's tokenizer (all-MiniLM-L6-v2); no model forward.

(a) Training. The unsup recipe's own loader (``simcse_kit.training.run.build_run``'s, as prepared:
``wiki1m_head.txt``, shuffled with ``--seed``, batches of ``--batch-size`` examples,
collated by ``ContrastiveCollator`` into ``[a, a, b, b, ...]`` rows, each batch padded
to its longest row, at most ``--max-seq-len`` tokens). For every batch of one epoch
(or ``--batches``): the share of the batch's positions that are padding, as padded;
and the share of the positions that remain padding after ``simcse_kit.model.packing.pack``,
the function the model calls on the collated batch (a batch where packing saves less
than ``packing.MIN_SAVING`` is run padded by the model and counted padded here too).

(b) Encoding. Every distinct sentence of STS Benchmark dev + test (SentEval layout, read
by ``simcse_kit.evaluation.read_stsb``), batches of ``--encode-batch-size``, truncated at
``--encode-max-seq-len``, each batch padded to its longest sentence, in three orders:
as given; sorted by characters (the usual shortcut); sorted by token count, which is
what ``simcse_kit.model.inference.Encoder`` does (measured by running ``Encoder.encode`` with
a model that only records the batches it is given).

Share = padded positions / all positions, summed over the batches.

Usage::

    .venv/bin/python -m benchmarks.padding                 # ~15 s on 2 cores
    .venv/bin/python -m benchmarks.padding --batches 20 --json padding.json
"""

from __future__ import annotations

import argparse
import json
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks._common import DATA, REPO, machine, setup_threads

RECIPE = REPO / "train" / "unsup.yaml"
STSB = DATA / "senteval" / "STS" / "STSBenchmark"


def share(padded: int, positions: int) -> float:
    return padded / positions if positions else 0.0


def training_padding(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """Positions of the recipe's training batches, padded and as the model packs them."""
    from simcse_kit.config.run import load_config
    from simcse_kit.model.packing import pack
    from simcse_kit.training.run import build_run

    overrides = {"batch_size": str(args.batch_size), "max_seq_len": str(args.max_seq_len), "seed": str(args.seed)}
    cfg = load_config(RECIPE, overrides | {"report_to": "none"})
    loader = build_run(cfg, evaluate=False, cpu=True).loader  # the run's own loader, as its loop iterates it
    pad_id = tokenizer.pad_token_id or 0
    batches = tokens = padded_positions = packed_positions = run_padded = 0
    for batch in islice(loader, args.batches):
        mask = batch["attention_mask"]
        batches += 1
        tokens += int(mask.sum())
        padded_positions += mask.numel()
        packed = pack(batch["input_ids"], mask, batch.get("token_type_ids"), pad_id)
        if packed is None:  # the model runs this batch padded
            run_padded += 1
            packed_positions += mask.numel()
        else:
            packed_positions += packed.input_ids.numel()
    return {
        "batches": batches,
        "rows_per_batch": 2 * args.batch_size,  # unsup: each sentence twice
        "tokens": tokens,
        "padded_positions": padded_positions,
        "packed_positions": packed_positions,
        "batches_run_padded": run_padded,
        "pad_share_padded": share(padded_positions - tokens, padded_positions),
        "pad_share_packed": share(packed_positions - tokens, packed_positions),
    }


def stsb_sentences() -> list[str]:
    """Distinct STS-B dev + test sentences, first occurrence first."""
    from simcse_kit.evaluation import read_stsb

    dev, test = read_stsb(STSB / "sts-dev.csv"), read_stsb(STSB / "sts-test.csv")
    return list(dict.fromkeys(dev.sentences1 + dev.sentences2 + test.sentences1 + test.sentences2))


def batched_positions(lengths: list[int], batch_size: int) -> int:
    """Positions of consecutive batches of ``lengths``, each padded to its longest."""
    return sum(len(chunk) * max(chunk) for chunk in (lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)))


class RecordingModel(nn.Module):
    """Stands in for the encoder: records each batch's mask, returns zero vectors."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[torch.Tensor] = []

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.masks.append(attention_mask)
        return torch.zeros(input_ids.shape[0], 1)


def encoding_padding(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """Positions of the STS-B encoding batches in input order, by characters, by tokens."""
    from simcse_kit.model.inference import Encoder

    sentences = stsb_sentences()
    n = args.encode_batch_size
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=args.encode_max_seq_len)["input_ids"]]
    tokens = sum(lengths)
    by_chars = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    recorder = RecordingModel()
    Encoder(recorder, tokenizer, args.encode_max_seq_len, "cpu").encode(sentences, batch_size=n)  # no parameters to infer it from
    if sum(int(m.sum()) for m in recorder.masks) != tokens:
        raise RuntimeError("Encoder's batches hold other tokens than counted here")
    positions = {
        "input order": batched_positions(lengths, n),
        "sorted by characters": batched_positions([lengths[i] for i in by_chars], n),
        "sorted by tokens (Encoder)": sum(m.numel() for m in recorder.masks),
    }
    return {
        "sentences": len(sentences),
        "tokens": tokens,
        "positions": positions,
        "pad_share": {order: share(p - tokens, p) for order, p in positions.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="training examples per batch")
    parser.add_argument("--max-seq-len", type=int, default=32, help="training truncation")
    parser.add_argument("--seed", type=int, default=42, help="training shuffle")
    parser.add_argument("--batches", type=int, default=None, help="training batches counted (default: one epoch)")
    parser.add_argument("--encode-batch-size", type=int, default=128)
    parser.add_argument("--encode-max-seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write all counts here")
    args = parser.parse_args()
    setup_threads(args.threads)

    from transformers import AutoTokenizer

    from simcse_kit.model.modeling import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    train = training_padding(args, tokenizer)
    encode = encoding_padding(args, tokenizer)

    print(
        f"\n(a) training: {train['batches']} shuffled batches of {args.batch_size} wiki1m_head sentences "
        f"({train['rows_per_batch']} rows), max length {args.max_seq_len}, seed {args.seed}\n"
    )
    print("| batches as | positions | padding |")
    print("|---|---:|---:|")
    print(f"| padded to the batch's longest row | {train['padded_positions']} | {100 * train['pad_share_padded']:.1f}% |")
    print(f"| packed (`simcse_kit.model.packing.pack`) | {train['packed_positions']} | {100 * train['pad_share_packed']:.1f}% |")
    print(f"\n{train['tokens']} tokens; {train['batches_run_padded']} batch(es) saved too little and run padded")
    print(
        f"\n(b) encoding: {encode['sentences']} distinct STS-B dev+test sentences, batch {args.encode_batch_size}, "
        f"max length {args.encode_max_seq_len}\n"
    )
    print("| batch order | positions | padding |")
    print("|---|---:|---:|")
    for order, positions in encode["positions"].items():
        print(f"| {order} | {positions} | {100 * encode['pad_share'][order]:.1f}% |")
    print(f"\n{encode['tokens']} tokens")
    if args.json:
        result = {"machine": machine(), "args": vars(args), "training": train, "encoding": encode}
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
