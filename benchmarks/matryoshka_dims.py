"""STS-B test and retrieval at truncated dimensions: what a Matryoshka run keeps.

Each text is encoded once per model; every dimension scores the prefixes as ``simcse-kit
evaluate MODEL --truncate-dim N`` does. Results: BENCHMARKS.md, "Retrieval".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks._common import DATA, machine, setup_run


def memo(encode):  # noqa: ANN001, ANN201 - an Encode in, an Encode out
    """``encode`` that computes each distinct text once, then answers from a table."""
    table: dict[str, torch.Tensor] = {}

    def cached(texts: Sequence[str]) -> torch.Tensor:
        new = [t for t in dict.fromkeys(texts) if t not in table]
        if new:
            table.update(zip(new, encode(new), strict=True))
        return torch.stack([table[t] for t in texts])

    return cached


def main() -> None:
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.evaluation.encoding import prompted, truncated
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator
    from simcse_kit.evaluation.tables import format_rows
    from simcse_kit.inference import load_encoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--retrieval", nargs="*", type=Path, default=[])
    parser.add_argument("--dims", nargs="+", type=int, default=[384, 256, 128, 64])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    setup_run(args.threads)

    sts = STSEvaluator(DATA / "senteval", tasks=["STSBenchmark"])
    retrieval = RetrievalEvaluator(args.retrieval) if args.retrieval else None
    rows: list[dict[str, object]] = []
    for model in args.models:
        encoder = load_encoder(model)
        encode = memo(encoder.encode)
        if retrieval is not None:
            retrieval.prompts = encoder.prompts
        for dim in args.dims:
            row: dict[str, object] = {"model": Path(model).name, "dim": str(dim)}
            row["STS-B test"] = sts(truncated(prompted(encode, encoder.prompts.get("query", "")), dim))["STSBenchmark"]
            if retrieval is not None:
                row |= {f"{task} nDCG@10": v for task, v in retrieval(truncated(encode, dim)).items() if "/" not in task}
            rows.append(row)
            print(row, flush=True)
    columns = {key: key for key in rows[0]}
    print(format_rows(rows, columns, markdown=True, label="model"))
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
