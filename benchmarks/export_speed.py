"""Export backends compared: encode speed and 7-task STS of torch fp32, ONNX fp32, ONNX int8.

One exported model (a trained run with ``--run``; by default the bundled all-MiniLM-L6-v2
wrapped as a simcse-kit model, mean pooling, max length 256), exported by
``simcse_kit.export.export_model(..., quantize="int8")`` (which itself checks ONNX parity
and the int8 STS cost), then for each backend, loaded with ``SentenceTransformer`` as a user
would:

* encode speed: sentences/s, one timed run (after a 64-sentence warm-up) over the same
  sentences for every backend: the distinct sentences of STS-B dev + test, batch 64;
* the 7-task STS (SimCSE protocol, Spearman x 100) via ``simcse_kit.evaluation.STSEvaluator``.

sentence-transformers' ONNX exporters need optimum-onnx, whose latest release supports
transformers < 4.58 only; so where they cannot import (the main environment, on
transformers 5), the script re-runs itself in the environment ``.ci/compat_env.sh`` builds
(sentence-transformers 5.1.2 + transformers 4.57 + optimum-onnx, torch from the main venv).

Usage::

    .venv/bin/python benchmarks/export_speed.py                 # ~10 min on 2 cores
    .venv/bin/python benchmarks/export_speed.py --run runs/unsup --json export_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, machine, setup_threads  # noqa: E402


def onnx_available() -> bool:
    from simcse_kit.export import ExportError, require_onnx

    try:
        require_onnx()
    except ExportError:
        return False
    return True


def rerun_in_compat_env(env_dir: Path) -> int:
    """Run this script again on the compat environment's layers (``python -S``)."""
    if not (env_dir / "COMPLETE").is_file():
        subprocess.run(
            ["bash", str(REPO / ".ci" / "compat_env.sh"), str(env_dir)], env={**os.environ, "PYTHON": sys.executable}, check=True
        )
    layers = [str(REPO)] + [str(env_dir / x) for x in ("st5", "onnx", "common", "base")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(layers), "SIMCSE_EXPORT_SPEED_CHILD": "1"}
    print(f"optimum-onnx cannot run here; re-running on {env_dir} (sentence-transformers 5.x)", flush=True)
    return subprocess.run([sys.executable, "-S", *sys.argv], env=env).returncode


def speed_sentences(data_dir: Path) -> list[str]:
    """Distinct STS-B dev + test sentences, in first-seen order."""
    from simcse_kit.evaluation import read_stsb, stsb_split_path

    seen: dict[str, None] = {}
    for split in ("dev", "test"):
        pairs = read_stsb(stsb_split_path(data_dir, split))
        for s in (*pairs.sentences1, *pairs.sentences2):
            seen.setdefault(s, None)
    return list(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=None, help="a trained run or model (default: wrapped all-MiniLM-L6-v2)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "export_speed")
    parser.add_argument("--data-dir", type=Path, default=DATA / "senteval")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    default_env = os.environ.get("SIMCSE_COMPAT_ENV", str(Path.home() / ".cache" / "simcse-kit" / "compat-env"))
    parser.add_argument("--compat-env", type=Path, default=Path(default_env))
    args = parser.parse_args()

    if not onnx_available():
        if os.environ.get("SIMCSE_EXPORT_SPEED_CHILD"):
            raise SystemExit("optimum-onnx does not import even in the compat environment")
        return rerun_in_compat_env(args.compat_env.expanduser())

    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from simcse_kit.config import ModelConfig
    from simcse_kit.evaluation import STSEvaluator, format_table
    from simcse_kit.export import export_model, st_encode
    from simcse_kit.modeling import SimCSEModel, resolve_model_path

    setup_threads(args.threads)
    source = args.run
    if source is None:
        source = args.work_dir / "minilm-as-simcse"
        model = SimCSEModel.from_config(ModelConfig())
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
        model.save(source, tokenizer, {"base_model": "all-MiniLM-L6-v2", "mode": "unsup"})
    evaluator = STSEvaluator(args.data_dir, batch_size=args.batch_size)
    out = args.work_dir / "export"
    start = time.perf_counter()
    result = export_model(source, out, overwrite=True, quantize="int8", sts_evaluator=evaluator)
    export_s = time.perf_counter() - start
    print(f"exported {source} -> {out} in {export_s:.0f}s: {result.modules}; normalize: {result.normalize_reason}")

    sentences = speed_sentences(args.data_dir)
    files = {"torch fp32": None, "onnx fp32": result.onnx_files["onnx"], "onnx int8": result.onnx_files["onnx-int8"]}
    rows: dict[str, dict[str, float]] = {}
    tables: dict[str, dict[str, float]] = {}
    for name, file_name in files.items():
        if file_name is None:
            st = SentenceTransformer(str(out), device="cpu")
        else:
            st = SentenceTransformer(str(out), device="cpu", backend="onnx", model_kwargs={"file_name": file_name})
        st.encode(sentences[:64], batch_size=args.batch_size)
        t0 = time.perf_counter()
        st.encode(sentences, batch_size=args.batch_size)
        speed = len(sentences) / (time.perf_counter() - t0)
        tables[name] = evaluator(st_encode(st))
        rows[name] = {"sentences_per_s": speed, "sts_avg": tables[name]["avg"]}
        print(f"{name:>10}: {speed:7.1f} sentences/s, STS avg {tables[name]['avg']:.2f}", flush=True)

    print(f"\n{len(sentences)} sentences (STS-B dev+test, distinct), batch {args.batch_size}, {args.threads} threads")
    print(f"{'backend':>10} | sentences/s | speed-up | STS avg | vs torch fp32")
    base = rows["torch fp32"]
    for name, row in rows.items():
        print(
            f"{name:>10} | {row['sentences_per_s']:11.1f} | {row['sentences_per_s'] / base['sentences_per_s']:7.2f}x "
            f"| {row['sts_avg']:7.2f} | {row['sts_avg'] - base['sts_avg']:+.2f}"
        )
    for name, table in tables.items():
        print(f"\n{name}:\n{format_table(table)}")
    print(f"\nexport gate: int8 STS {result.sts['onnx-int8']:.2f} vs simcse-kit fp32 {result.sts['simcse-kit fp32']:.2f}")
    if args.json:
        payload = {
            "rows": rows,
            "sts": tables,
            "export_gate": result.sts,
            "n_sentences": len(sentences),
            "versions": {"sentence_transformers": sentence_transformers.__version__, "transformers": transformers.__version__},
            "machine": machine(),
            "torch_threads": torch.get_num_threads(),
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
