"""Encoding throughput: simcse-kit ``Encoder.encode`` vs ``SentenceTransformer.encode``.

Variants ``st-fp32``, ``st-bf16``, ``kit-fp32``, ``kit-bf16`` on the STS-B dev + test sentences (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import DATA, emit, paired_ratios, peak_rss_mib, run_rounds, setup_threads
from benchmarks._harness import add_options, chosen, forwarded, keep, start, summary_of

VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-bf16")
PAIRS = (("kit-fp32", "st-fp32"), ("kit-bf16", "st-fp32"), ("kit-bf16", "st-bf16"))


def sts_sentences(limit: int | None = None) -> tuple[list[str], list[tuple[int, int, float]]]:
    """Unique STS-B dev+test sentences (the first ``limit``), and the test pairs among them as indices into them."""
    from simcse_kit.evaluation import read_stsb

    folder = DATA / "senteval" / "STS" / "STSBenchmark"
    dev, test = read_stsb(folder / "sts-dev.csv"), read_stsb(folder / "sts-test.csv")
    index: dict[str, int] = {}
    for s in dev.sentences1 + dev.sentences2 + test.sentences1 + test.sentences2:
        index.setdefault(s, len(index))
    pairs = [(index[a], index[b], float(g)) for a, b, g in zip(test.sentences1, test.sentences2, test.scores, strict=True)]
    if limit:
        return list(index)[:limit], [p for p in pairs if p[0] < limit and p[1] < limit]
    return list(index), pairs


def encoder(args: argparse.Namespace) -> Any:
    """The variant's ``encode(sentences) -> (n, 384) fp32 tensor``."""
    import torch

    from simcse_kit.model.modeling import resolve_model_path

    framework, precision = args.worker.split("-")
    path = resolve_model_path("all-MiniLM-L6-v2")
    if framework == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(path, device="cpu")
        st.max_seq_length = args.max_seq_len

        def run(s: list[str]) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                out = st.encode(s, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False)
            return out.float()

        return run
    from transformers import AutoModel, AutoTokenizer

    from simcse_kit.model.inference import Encoder
    from simcse_kit.model.modeling import SimCSEModel

    model = SimCSEModel(AutoModel.from_pretrained(path, attn_implementation="sdpa"), "avg", "none", args.max_seq_len)
    kit = Encoder(model, AutoTokenizer.from_pretrained(path), args.max_seq_len, "cpu", "no" if precision == "fp32" else "bf16")
    return lambda s: kit.encode(s, batch_size=args.batch_size)


def sts_b(emb: np.ndarray, pairs: list[tuple[int, int, float]]) -> float:
    """STS-B test Spearman x 100 of cosine similarities."""
    from scipy.stats import spearmanr

    e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    cos = (e[a] * e[b]).sum(-1)
    return float(spearmanr(cos, np.array([p[2] for p in pairs])).statistic * 100)


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    sentences, pairs = sts_sentences(args.limit)
    encode = encoder(args)
    encode(sentences[: 2 * args.batch_size])  # warm-up: first-call allocations, oneDNN kernel selection
    start = time.perf_counter()
    emb = encode(sentences).numpy()
    seconds = time.perf_counter() - start
    np.save(Path(args.emb_dir) / f"{args.worker}-{args.offset}.npy", emb)
    emit(
        {
            "variant": args.worker,
            "sentences": len(sentences),
            "seconds": seconds,
            "sentences_per_s": (len(sentences) / seconds),
            "stsb_test": sts_b(emb, pairs),
            "peak_rss_mib": peak_rss_mib(),
        }
    )


def agreement(runs: list[dict[str, Any]], emb_dir: Path) -> None:
    """Add each run's smallest cosine with ``st-fp32``'s vectors of the same round."""
    for x in runs:
        ref = emb_dir / f"st-fp32-{x['round']}.npy"
        if not ref.exists():
            continue
        a, b = np.load(emb_dir / f"{x['variant']}-{x['round']}.npy"), np.load(ref)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        x["min_cos_vs_st_fp32"] = float(cos.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="encode only the first N sentences")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--emb-dir", default=None, help=argparse.SUPPRESS)
    add_options(parser, "encode_throughput")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    variants = chosen(parser, args.variants, VARIANTS)
    env = start(args)
    with tempfile.TemporaryDirectory(prefix="encode_throughput-") as emb_dir:
        common = forwarded(args, "batch-size", "max-seq-len", "threads")
        common += [f"--emb-dir={emb_dir}"] + ([f"--limit={args.limit}"] if args.limit else [])
        runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env)
        agreement(runs, Path(emb_dir))
    keys = ("sentences_per_s", "stsb_test") + (("min_cos_vs_st_fp32",) if "st-fp32" in variants else ())
    summary = summary_of(runs, variants, keys)
    ratios = {f"{a}/{b}": paired_ratios(runs, a, b) for a, b in PAIRS if a in variants and b in variants}
    keep("encode_throughput", args, {"runs": runs, "summary": summary, "ratios": ratios})


if __name__ == "__main__":
    main()
