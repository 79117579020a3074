"""Run the image demo (and the 2-D toy) and print the tables for BENCHMARKS.md.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.demos --output-dir runs/demos/bench

Wall-clock times include everything a user of ``simcse-kit demo`` waits for.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from simcse_kit.demos import digits, toy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("runs/demos/bench"))
    parser.add_argument("--epochs", type=int, default=digits.DigitsConfig.epochs)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-toy", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")

    start = time.perf_counter()
    digits.run(digits.DigitsConfig(epochs=args.epochs, seed=args.seed), args.output_dir / "digits")
    print(f"digits demo wall time (training, probes, t-SNE): {time.perf_counter() - start:.1f} s\n")

    if not args.skip_toy:
        start = time.perf_counter()
        toy.run(seed=args.seed, output_dir=args.output_dir / "toy")
        print(f"toy demo wall time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
