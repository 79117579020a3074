"""How much an int8 export's vectors depend on their batch: input-order batches (as fastembed
and Transformers.js form them) against ``OnnxEncoder``'s length-sorted ones, and each against
the fp32 graph.

Dynamic int8 quantises activations with one scale per tensor per call, so the same text gets
a slightly different vector beside other texts and other padding. Texts: STS-B dev in file
order, every 8th replaced by a long one (past 128 tokens), so batches mix lengths.

    python -m benchmarks.int8_batches exports/x        # an export made with --quantize int8

Results: docs/export.md, "What the clients do differently".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks._common import DATA, machine

FP32, INT8 = "onnx/model.onnx", "onnx/model_quantized.onnx"


def mixed_texts(data_dir: Path, n: int) -> list[str]:
    """``n`` STS-B dev texts in file order, every 8th a long one (200 + 37 i characters)."""
    from simcse_kit.evaluation import read_stsb, stsb_split_path

    pairs = read_stsb(stsb_split_path(data_dir, "dev"))
    texts = [s for pair in zip(pairs.sentences1, pairs.sentences2, strict=True) for s in pair]
    long = " ".join(texts[:60])
    return [t if i % 8 else long[: 200 + 37 * i] for i, t in enumerate(texts[:n])]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="an export folder with onnx/model.onnx and onnx/model_quantized.onnx")
    parser.add_argument("--data-dir", type=Path, default=DATA / "senteval", help="SentEval-layout folder (STS-B dev)")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="batch size of both sides (fastembed and Transformers.js: 32)")
    args = parser.parse_args()

    from simcse_kit.export.onnx_encoder import OnnxEncoder

    texts = mixed_texts(args.data_dir, args.texts)
    int8 = OnnxEncoder(args.export, INT8)
    in_order = np.concatenate([int8.encode(texts[i : i + args.batch], args.batch) for i in range(0, len(texts), args.batch)])
    length_sorted = int8.encode(texts, args.batch)  # OnnxEncoder sorts by length before batching
    fp32 = OnnxEncoder(args.export, FP32).encode(texts, args.batch)
    result = {}
    for name, (a, b) in {
        "int8 input-order vs int8 length-sorted": (in_order, length_sorted),
        "int8 length-sorted vs fp32": (length_sorted, fp32),
        "int8 input-order vs fp32": (in_order, fp32),
    }.items():
        cos = cosines(a, b)
        result[name] = {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    print(json.dumps({"texts": len(texts), "batch": args.batch, "cosines": result, "machine": machine()}, indent=2))


if __name__ == "__main__":
    main()
