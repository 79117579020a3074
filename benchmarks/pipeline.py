"""The input pipeline alone (read -> tokenise -> collate -> packing plan), in examples per CPU-second,
per mode, this checkout against a baseline commit run from a temporary ``git worktree`` of it.

Each worker is a fresh interpreter with one thread that loads a recipe's training file and tokenizer
(``unsup``: ``wiki1m_head.txt``; ``sup`` and ``hardneg``: ``snli_triplets.csv``; all-MiniLM-L6-v2, max
length 32, batch 64, the packing plan on) and draws whole epochs from the run's own loader
(``make_loader``, no worker processes) until ``--seconds`` of CPU time are spent: examples per
CPU-second of the batches, with the tokenizer called per batch (the baseline) or the ids read from
the token table (this checkout). The table is built once per file: round 0 starts from empty caches,
and the build's rows/s is reported beside (``tokenise``, a one-time cost per file version). Old and
new alternate over ``--rounds``.

    python -m benchmarks.pipeline [--baseline 44fd089] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

# Only the standard library up here: a worker imports simcse_kit from the checkout it measures
# (PYTHONPATH, with PYTHONSAFEPATH keeping this file's own checkout off the path).

MODES = ("unsup", "sup", "hardneg")
VARIANTS = ("old", "new")


def worker(args: argparse.Namespace) -> None:
    import importlib.util
    import inspect

    import torch

    import simcse_kit
    from simcse_kit.config.recipes import find_recipe
    from simcse_kit.config.run import load_config

    # Where each checkout keeps them: training/wiring/ since the one-run relayout, training/ before it
    # (the default baseline's layout).
    wiring = importlib.util.find_spec("simcse_kit.training.wiring") is not None
    inputs = importlib.import_module(f"simcse_kit.training.{'wiring.inputs' if wiring else 'inputs'}")
    loaders = importlib.import_module(f"simcse_kit.training.{'wiring.loaders' if wiring else 'run'}")
    load_training_data, make_loader = inputs.load_training_data, loaders.make_loader

    torch.set_num_threads(1)
    overrides = {"cache_dir": args.cache_dir, "output_dir": tempfile.mkdtemp(), "report_to": "none"}
    cfg = load_config(find_recipe(args.mode), overrides)
    cpu = time.process_time()
    tokenizer = inputs.load_checked_tokenizer(cfg)
    # The baseline reads texts only; this checkout's reader also maps (or builds) the token table.
    with_table = "tokenizer" in inspect.signature(load_training_data).parameters
    dataset = load_training_data(cfg, tokenizer) if with_table else load_training_data(cfg)
    load_cpu_s = time.process_time() - cpu
    # This checkout's loader takes the run's datasets by name; a baseline's, the one dataset.
    by_name = "sets" in inspect.signature(make_loader).parameters
    loader = make_loader(cfg, {cfg.data.training_sets()[0].name: dataset} if by_name else dataset, tokenizer, num_processes=1)
    next(iter(loader))  # warm-up: first-call costs
    examples, cpu = 0, time.process_time()
    while time.process_time() - cpu < args.seconds:
        for _ in loader:
            examples += cast(int, getattr(loader.batch_sampler, "batch_size"))  # noqa: B009  # drop_last: every batch is whole
            if time.process_time() - cpu >= args.seconds:
                break
    seconds = time.process_time() - cpu
    tables = [Path(f["filename"]).parent / "table.json" for f in dataset.cache_files]
    built = [json.loads(t.read_text()) for t in dict.fromkeys(tables) if t.is_file()]
    print("RESULT " + json.dumps({
        "code": str(Path(simcse_kit.__file__).parent.parent), "examples": examples, "cpu_s": seconds,
        "examples_per_cpu_s": examples / seconds, "load_cpu_s": load_cpu_s, "rows": len(dataset), "table": built,
    }), flush=True)  # fmt: skip


def run_checkout(code: Path, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One worker in a fresh interpreter that imports simcse_kit from ``code``."""
    env = os.environ | env | {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, cwd=code)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"worker {args} failed with status {proc.returncode}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT ") :])


def main() -> None:
    from benchmarks._common import DATA, REPO, CpuActivity, paired_ratios, spread
    from benchmarks._harness import add_options, keep, start

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="44fd089", help="the commit to compare against")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds of batches per worker")
    parser.add_argument("--threads", type=int, default=1)
    add_options(parser, "pipeline")
    args = parser.parse_args()
    env = start(args) | {"SIMCSE_KIT_DATA": str(DATA)}  # the same files for both (the worktree has no ../shared)
    modes = [m for m in args.modes.split(",") if m]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="simcse-kit-pipeline-") as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.baseline], cwd=REPO, check=True)
        code = {"old": old, "new": REPO}
        try:
            for r in range(args.rounds):
                for mode in modes:
                    for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                        common = [f"--mode={mode}", f"--cache-dir={Path(tmp) / variant}", f"--seconds={args.seconds}"]
                        with CpuActivity() as activity:
                            res = run_checkout(code[variant], [*common, "--worker=x"], env)
                        assert res.pop("code") == str(code[variant]), "the worker ran other code than asked"
                        runs.append(res | {"round": r, "mode": mode, "variant": variant, "activity": activity.record})
                        print(f"round {r} {mode:8s} {variant}: {res['examples_per_cpu_s']:9.0f} examples/CPU-s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False)
    summary: dict[str, Any] = {}
    for mode in modes:
        of = [x for x in runs if x["mode"] == mode]
        rates = {v: spread([x["examples_per_cpu_s"] for x in of if x["variant"] == v]) for v in VARIANTS}
        cold = next(x for x in of if x["variant"] == "new" and x["round"] == 0)["table"]
        summary[mode] = rates | {"ratio": paired_ratios(of, "new", "old", "examples_per_cpu_s"), "table": cold}
    keep("pipeline", args, {"baseline": args.baseline, "runs": runs, "summary": summary})


if __name__ == "__main__":
    if "--worker=x" in sys.argv:  # run by run_checkout, with the measured checkout's simcse_kit
        cli = argparse.ArgumentParser()
        for name in ("--mode", "--cache-dir", "--worker"):
            cli.add_argument(name)
        cli.add_argument("--seconds", type=float)
        worker(cli.parse_args())
    else:
        main()
