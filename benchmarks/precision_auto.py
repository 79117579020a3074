"""What `mixed_precision: auto` buys where bf16 is emulated: the main job's training speed
under ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN then has no bf16 instructions, as on most AVX2
laptops and many cloud VMs) with the recipe as shipped (``auto``), against the same recipe
forced to fp32 (``--mixed-precision no``) and forced to bf16 (what the recipes hard-wired
before). On this machine's native ISA, the same three for comparison.

Each run is ``simcse-kit train train/unsup.yaml`` in its own process (oneDNN reads the
variable once) for ``--steps`` optimiser steps; the speed is metrics.json's
``sentences_per_second`` (training time only: evaluations are excluded).

    python -m benchmarks.precision_auto [--steps 30] [--skip-forced-bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(isa: str | None, precision: str, steps: int, out: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    cmd = [
        sys.executable, "-m", "simcse_kit.cli", "train", "train/unsup.yaml",
        "--output-dir", str(out), "--max-steps", str(steps), "--eval-steps", "0",
        "--eval-at-start", "false", "--progress-bar", "false", "--mixed-precision", precision,
    ]  # fmt: skip
    if precision != "auto":  # forced: the switches follow the precision, as in the old recipes
        flag = "true" if precision == "bf16" else "false"
        cmd += ["--bf16-weights", flag, "--fast-dropout", flag]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip-forced-bf16", action="store_true", help="skip the (very slow) forced bf16 run under AVX2")
    args = parser.parse_args()
    print(f"main job (train/unsup.yaml), {args.steps} steps of batch 64 (128 sentences), training time only")
    print("(forced bf16 under AVX2: a sixth of the steps)")
    print(f"{'ISA':<10} {'precision':<10} {'chosen':<34} {'sent/s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for isa in ("AVX2", None):
            speeds = {}
            for precision in ("auto", "no", "bf16"):
                if precision == "bf16" and isa == "AVX2" and args.skip_forced_bf16:
                    continue
                # Forced bf16 under AVX2 runs ~20x slower: a few steps measure it well enough.
                steps = max(3, args.steps // 6) if (isa, precision) == ("AVX2", "bf16") else args.steps
                m = run(isa, precision, steps, Path(tmp) / f"{isa}-{precision}")
                chosen = m.get("precision", {}).get("reason", precision).split("-> ")[-1]
                speeds[precision] = m["sentences_per_second"]
                print(f"{isa or 'native':<10} {precision:<10} {chosen[:34]:<34} {speeds[precision]:>8.1f}")
            print(f"{'':<10} auto / fp32 = {speeds['auto'] / speeds['no']:.2f}x")


if __name__ == "__main__":
    main()
