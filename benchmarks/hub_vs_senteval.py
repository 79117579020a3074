"""STS scores on the hub's (untokenised) text vs SentEval's (tokenised, lowercased) text.

Variants ``senteval``, ``hub-same`` (hub-schema copies of the SentEval pairs), ``hub-raw`` (of
the original text) and ``sick-all`` (every pair of ``SICK.txt``, as MTEB scores SICK-R).
Results: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks._common import DATA, machine, setup_threads

VARIANTS = ("senteval", "hub-same", "hub-raw", "sick-all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None, help="write every score and the machine here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    setup_threads(args.threads)

    from simcse_kit.evaluation import MAIN_TASKS, STSEvaluator
    from simcse_kit.evaluation.hub import HubSTSEvaluator, read_original_release, senteval_test_pairs, write_hub_copy
    from simcse_kit.evaluation.sts_readers import read_sick
    from simcse_kit.inference import load_encoder

    senteval = DATA / "senteval"
    encoder = load_encoder(args.model)
    scores: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        copies = {
            "hub-same": lambda: senteval_test_pairs(senteval),
            "hub-raw": lambda: read_original_release(DATA),
            # MTEB's SICK-R test split is all of SICK (9927 pairs), not SemEval's 4927.
            "sick-all": lambda: {"SICKRelatedness": read_sick(DATA / "sick" / "SICK.txt")},
        }
        for name in variants:
            if name == "senteval":
                evaluator = STSEvaluator(senteval, batch_size=args.batch_size)
            else:
                written = write_hub_copy(Path(tmp) / name, copies[name]())
                evaluator = HubSTSEvaluator(list(written), batch_size=args.batch_size, hub_root=Path(tmp) / name)
            scores[name] = evaluator(encoder.encode)
            # Test pairs only: STS-B's dev split is read too but is not in the main figure.
            counts[name] = {t: sum(len(p) for s, p in evaluator.data[t].items() if s != "dev") for t in evaluator.specs}
    seconds = time.perf_counter() - start

    print(f"{args.model}: Spearman x 100 (cosine), pairs in brackets; {seconds:.0f}s")
    print(f"{'task':<16}" + "".join(f"{v:>18}" for v in variants))
    for task in (*MAIN_TASKS, "avg"):
        cells = [
            f"{scores[v][task]:.2f}" + (f" ({counts[v][task]})" if task in counts[v] else "") if task in scores[v] else ""
            for v in variants
        ]
        print(f"{task:<16}" + "".join(f"{c:>18}" for c in cells))
    if args.json is not None:
        record = {"model": args.model, "scores": scores, "pairs": counts, "seconds": seconds, "machine": machine()}
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
