"""Encoding throughput: simcse-kit ``Encoder.encode`` vs ``SentenceTransformer.encode``.

Same model (the default all-MiniLM-L6-v2, mean pooling), same sentences (every
sentence of STS Benchmark dev + test, SentEval layout), same batch size and max
length, same thread count, in one process. Variants alternate round by round:

* ``st-fp32``: ``SentenceTransformer.encode`` as shipped;
* ``st-bf16``: the same under ``torch.autocast("cpu", bfloat16)``;
* ``kit-fp32``: ``simcse_kit.inference.Encoder`` (precision ``"no"``, the default);
* ``kit-bf16``: ``Encoder(..., precision="bf16")``.

It also checks the embeddings agree (cosine of each kit vector with ST's) and, with
``--sts``, scores STS-B test with each variant so a faster precision is seen not to
cost accuracy.

Usage::

    .venv/bin/python -m benchmarks.encode_throughput            # ~2 min on 2 cores
    .venv/bin/python -m benchmarks.encode_throughput --rounds 1 --limit 500
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._common import DATA, machine, setup_threads

VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-bf16")


def sts_sentences() -> tuple[list[str], list[tuple[int, int, float]]]:
    """Unique STS-B dev+test sentences, and the test pairs as indices into them."""
    from simcse_kit.evaluation import read_stsb

    folder = DATA / "senteval" / "STS" / "STSBenchmark"
    dev, test = read_stsb(folder / "sts-dev.csv"), read_stsb(folder / "sts-test.csv")
    index: dict[str, int] = {}
    for s in dev.sentences1 + dev.sentences2 + test.sentences1 + test.sentences2:
        index.setdefault(s, len(index))
    pairs = [(index[a], index[b], float(g)) for a, b, g in zip(test.sentences1, test.sentences2, test.scores, strict=True)]
    return list(index), pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="encode only the first N sentences")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    setup_threads(args.threads)

    import torch
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    from simcse_kit.inference import Encoder
    from simcse_kit.modeling import SimCSEModel, resolve_model_path

    path = resolve_model_path("all-MiniLM-L6-v2")
    sentences, pairs = sts_sentences()
    if args.limit:
        sentences = sentences[: args.limit]
        pairs = [p for p in pairs if p[0] < args.limit and p[1] < args.limit]
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = args.max_seq_len
    kit_model = SimCSEModel(AutoModel.from_pretrained(path, attn_implementation="sdpa"), "avg", "none", args.max_seq_len)
    tokenizer = AutoTokenizer.from_pretrained(path)
    kit = {p: Encoder(kit_model, tokenizer, args.max_seq_len, "cpu", p) for p in ("no", "bf16")}

    def st_encode(bf16: bool) -> Callable[[list[str]], torch.Tensor]:
        def run(s: list[str]) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = st.encode(s, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False)
            return out.float()

        return run

    encoders: dict[str, Callable[[list[str]], torch.Tensor]] = {
        "st-fp32": st_encode(False),
        "st-bf16": st_encode(True),
        "kit-fp32": lambda s: kit["no"].encode(s, batch_size=args.batch_size),
        "kit-bf16": lambda s: kit["bf16"].encode(s, batch_size=args.batch_size),
    }
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:  # warm-up: first-call allocations, oneDNN kernel selection
        encoders[v](sentences[: 2 * args.batch_size])

    seconds = {v: 0.0 for v in variants}
    embeddings: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for v in variants:
            start = time.perf_counter()
            embeddings[v] = encoders[v](sentences)
            took = time.perf_counter() - start
            seconds[v] += took
            print(f"round {r} {v:9s} {len(sentences) / took:8.1f} sent/s", flush=True)

    def sts_b(emb: torch.Tensor) -> float:
        e = torch.nn.functional.normalize(emb, dim=-1)
        a = torch.tensor([p[0] for p in pairs])
        b = torch.tensor([p[1] for p in pairs])
        cos = (e[a] * e[b]).sum(-1).numpy()
        return float(spearmanr(cos, np.array([p[2] for p in pairs])).statistic * 100)

    ref = embeddings.get("st-fp32")
    summary = {}
    print(
        f"\n{len(sentences)} sentences, batch {args.batch_size}, max len {args.max_seq_len}, "
        f"{args.threads} threads, {args.rounds} rounds"
    )
    print(f"{'variant':10s} {'sent/s':>9s} {'STS-B test':>10s} {'min cos vs st-fp32':>19s}")
    for v in variants:
        rate = args.rounds * len(sentences) / seconds[v]
        agree = float(torch.nn.functional.cosine_similarity(embeddings[v], ref).min()) if ref is not None else float("nan")
        summary[v] = {"sentences_per_s": rate, "stsb_test": sts_b(embeddings[v]), "min_cos_vs_st_fp32": agree}
        print(f"{v:10s} {rate:9.1f} {summary[v]['stsb_test']:10.2f} {agree:19.5f}")
    ratios = {}
    for ours, theirs in (("kit-fp32", "st-fp32"), ("kit-bf16", "st-fp32"), ("kit-bf16", "st-bf16")):
        if ours in summary and theirs in summary:
            ratios[f"{ours}/{theirs}"] = summary[ours]["sentences_per_s"] / summary[theirs]["sentences_per_s"]
            print(f"{ours} / {theirs} = {ratios[f'{ours}/{theirs}']:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine(), "args": vars(args), "summary": summary, "ratios": ratios}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
