"""Corpora of any size: start-up time and memory against the corpus's length, on a deterministic
synthetic corpus (``wiki1m_head.txt``'s lines re-combined in pairs and numbered), each variant in a
fresh interpreter, cold (empty cache) and warm: ``kit`` (the unsup recipe, 2 steps: seconds to the end
of the first step, peak RSS, cache build rate), ``kit-load`` (the reader alone), ``st``
(``datasets.load_dataset("text")``, sentence-transformers' path) and ``lists`` (the old whole-file lists).

    python -m benchmarks.corpus_scale --lines 100000 [--lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import WIKI, emit, peak_rss_mib, run_worker, setup_threads
from benchmarks._harness import add_options, keep, start

VARIANTS = ("kit", "kit-load", "st", "lists")


def write_corpus(lines: int, folder: Path) -> Path:
    """``lines`` numbered lines, each two Wikipedia lines joined (a fixed pairing)."""
    wiki = [s.strip() for s in WIKI.read_text(encoding="utf-8").split("\n") if s.strip()]
    path = folder / f"corpus-{lines}.txt"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(lines):
            fh.write(f"{i}. {wiki[i % len(wiki)]} {wiki[(i * 7919 + 1) % len(wiki)]}\n")
    return path


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    if args.worker == "kit":
        from simcse_kit.config.recipes import find_recipe
        from simcse_kit.config.run import load_config
        from simcse_kit.data.corpus import Report
        from simcse_kit.training.loop import fit
        from simcse_kit.training.run import build_run, load_training_data

        opts = {"train_file": args.file, "cache_dir": args.cache_dir, "max_steps": 2, "eval_steps": 0, "eval_at_start": "false"}
        opts |= {"log_steps": 10**9, "progress_bar": "false", "report_to": "none", "output_dir": tempfile.mkdtemp()}
        cfg = load_config(find_recipe("unsup"), {k: str(v) for k, v in opts.items()})
        t = time.perf_counter()
        dataset = load_training_data(cfg)
        load_s, load_rss = time.perf_counter() - t, peak_rss_mib()
        stamps: list[float] = []

        def stamped(collate: Any) -> Any:
            return lambda batch: (stamps.append(time.time()), collate(batch))[1]

        run = build_run(cfg, dataset=dataset, evaluate=False, cpu=True, wrap_collate=stamped)
        fit(run, run.step, run.cfg.train)
        sidecar = Path(dataset.cache_files[0]["filename"]).with_suffix(".json")
        report = Report(**json.loads(sidecar.read_text(encoding="utf-8")))
        # Batch 2 is collated when step 1 is done: its stamp (absolute) ends the first step.
        result = {"first_step_at": stamps[1], "load_s": load_s, "rss_after_load_mib": load_rss}
        result |= {"rows": len(dataset), "cache_build_rows_per_s": report.rows / report.seconds}
    else:
        import datasets

        from simcse_kit.data.readers import load_train_dataset  # imported by all three: the same baseline

        t = time.perf_counter()
        if args.worker == "kit-load":
            dataset = load_train_dataset(args.file, "unsup", cache_dir=args.cache_dir)
        elif args.worker == "st":
            dataset = datasets.load_dataset("text", data_files=args.file, cache_dir=args.cache_dir, split="train")
        else:
            text = Path(args.file).read_text(encoding="utf-8")
            dataset = datasets.Dataset.from_dict({"sent0": [s.strip() for s in text.split("\n") if s.strip()]})
        result = {"load_s": time.perf_counter() - t, "rows": len(dataset)}
    emit(result | {"peak_rss_mib": peak_rss_mib(), "memory_mapped": bool(dataset.cache_files)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, action="append", help="corpus length(s) (default 100000)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    add_options(parser, "corpus_scale", rounds=1)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    env = start(args)
    runs = []
    with tempfile.TemporaryDirectory(prefix="simcse-kit-corpus-") as tmp:
        for lines in args.lines or [100_000]:
            path = write_corpus(lines, Path(tmp))
            for variant in args.variants.split(","):
                cache = Path(tmp) / f"cache-{variant}-{lines}"
                for cache_state in ("cold", "warm"):
                    if variant == "lists" and cache_state == "warm":
                        continue  # no cache to be warm
                    common = [f"--file={path}", f"--cache-dir={cache}", f"--threads={args.threads}"]
                    spawn = time.time()
                    result = run_worker(Path(__file__), [f"--worker={variant}", *common], args.threads, env)
                    if "first_step_at" in result:  # from the interpreter's spawn: imports and model load included
                        result["first_step_s"] = result.pop("first_step_at") - spawn
                    runs.append({"lines": lines, "variant": variant, "cache": cache_state} | result)
                    print(json.dumps(runs[-1]))
    keep("corpus_scale", args, {"runs": runs})


if __name__ == "__main__":
    main()
