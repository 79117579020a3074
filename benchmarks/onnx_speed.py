"""torch fp32 vs ONNX fp32 vs ONNX int8 for an export made by the kit: throughput, latency, STS, cold start.

Results: BENCHMARKS.md, "Export: ONNX".
"""

from __future__ import annotations

import time

START = time.perf_counter()  # cold-start workers measure from here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks._common import (  # noqa: E402
    DATA,
    ISA_LIMITS,
    REPO,
    add_allow_dirty,
    cpu_class,
    cpu_flags,
    emit,
    machine,
    module_command,
    refuse_dirty,
    save_results,
)

RESULTS = Path(__file__).resolve().parent / "results"


def speed_sentences(data_dir: Path) -> list[str]:
    """Distinct STS-B dev + test sentences, in first-seen order."""
    from simcse_kit.evaluation import read_stsb, stsb_split_path

    seen: dict[str, None] = {}
    for split in ("dev", "test"):
        pairs = read_stsb(stsb_split_path(data_dir, split))
        for s in (*pairs.sentences1, *pairs.sentences2):
            seen.setdefault(s, None)
    return list(seen)


def measure(encode: Any, sentences: list[str], latency_n: int, batch: int) -> dict[str, float]:
    """One round: throughput at ``batch`` over all ``sentences``, then batch-1 latency."""
    encode(sentences[:batch], batch)  # warm-up
    t0 = time.perf_counter()
    encode(sentences, batch)
    throughput = len(sentences) / (time.perf_counter() - t0)
    times = []
    for s in sentences[:latency_n]:
        t0 = time.perf_counter()
        encode([s], 1)
        times.append((time.perf_counter() - t0) * 1000)
    p90 = sorted(times)[int(0.9 * len(times))]
    return {"sentences_per_s": throughput, "latency_ms_median": statistics.median(times), "latency_ms_p90": p90}


def peak_rss_since_exec_mib() -> float:
    """VmHWM: this process's peak RSS since its exec (``ru_maxrss`` survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    names = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "onnxscript", "tokenizers", "numpy")
    return {n: md.version(n) for n in names}


# ---- workers (fresh interpreters) --------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """``cold-onnx`` / ``cold-torch``: import, load, first vector, then 1,024 sentences; ``torch-avx2``: a round."""
    sentences = json.loads(Path(args.sentences_file).read_text())
    if args.worker == "cold-onnx":
        from simcse_kit.export.onnx_encoder import OnnxEncoder

        encoder: Any = OnnxEncoder(args.export, threads=args.threads)
    else:
        import torch

        from simcse_kit.model.inference import load_encoder

        torch.set_num_threads(args.threads)
        encoder = load_encoder(args.source)
    if args.worker == "torch-avx2":
        emit(measure(lambda s, b: encoder.encode(s, b), sentences, args.latency_sentences, args.batch_size))
        return
    encoder.encode(sentences[:1])
    first = time.perf_counter() - START
    encoder.encode(sentences[:1024], 128)
    rss, loaded = peak_rss_since_exec_mib(), "torch" in sys.modules
    emit({"cold_start_s": first, "peak_rss_mib": rss, "torch_loaded": loaded, "total_s": time.perf_counter() - START})


def run_worker(args: argparse.Namespace, name: str, sentences_file: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [*module_command(__file__), f"--worker={name}", f"--threads={args.threads}", f"--sentences-file={sentences_file}"]
    cmd += [f"--export={args.work_dir / 'export'}", f"--source={args.work_dir / 'minilm-as-simcse'}"]
    cmd += [f"--latency-sentences={args.latency_sentences}", f"--batch-size={args.batch_size}"]
    full_env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=full_env | (env or {}), capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise RuntimeError(f"worker {name} failed ({proc.returncode})")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    if "total_s" in result:  # interpreter start-up: what the script's own clock cannot see
        result["cold_start_with_interpreter_s"] = result["cold_start_s"] + wall - result["total_s"]
    return result


# ---- the driver -------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "onnx_speed")
    parser.add_argument("--data-dir", type=Path, default=DATA / "senteval")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--latency-sentences", type=int, default=128)
    parser.add_argument("--avx2-torch", action="store_true", help="also torch fp32 held to AVX2 kernels")
    parser.add_argument(
        "--reuse-export", action="store_true", help="keep WORK_DIR/export if there (its gate STS from simcse_export.json)"
    )
    parser.add_argument("--json", type=Path, default=None, help="default: results/onnx_speed-<CPU class>.json")
    add_allow_dirty(parser)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sentences-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    refuse_dirty(args.allow_dirty)  # before the runs: save_results would refuse their record

    import logging

    import torch
    from transformers import AutoTokenizer

    from simcse_kit.config.run import ModelConfig
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.export import EXPORT_INFO, export_model
    from simcse_kit.export.onnx_encoder import FP32_FILE, INT8_FILE, OnnxEncoder
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.model.modeling import SimCSEModel, resolve_model_path

    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    source = args.work_dir / "minilm-as-simcse"
    evaluator = STSEvaluator(args.data_dir, batch_size=args.batch_size)
    out = args.work_dir / "export"
    if args.reuse_export and (out / EXPORT_INFO).is_file():
        info = json.loads((out / EXPORT_INFO).read_text())
        export_s, gate_sts = None, info["sts"]  # measured by the run that exported
        onnx_info = info["onnx"]
        print(f"reusing {out}; gate STS {gate_sts}")
    else:
        model = SimCSEModel.from_config(ModelConfig())
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
        model.save(source, tokenizer, {"base_model": "all-MiniLM-L6-v2"})
        t0 = time.perf_counter()
        result = export_model(source, out, overwrite=True, quantize="int8", sts_evaluator=evaluator)
        export_s, gate_sts = time.perf_counter() - t0, result.sts
        assert result.onnx is not None
        onnx_info = {"exporter": result.onnx.exporter, "opset": result.onnx.opset}
        print(f"exported in {export_s:.0f}s ({onnx_info['exporter']} exporter, opset {onnx_info['opset']}); gate STS {gate_sts}")

    sentences = speed_sentences(args.data_dir)
    sentences_file = args.work_dir / "sentences.json"
    sentences_file.write_text(json.dumps(sentences))
    kit = load_encoder(source)
    onnx32 = OnnxEncoder(out, FP32_FILE, threads=args.threads)
    onnx8 = OnnxEncoder(out, INT8_FILE, threads=args.threads)
    backends: dict[str, Any] = {
        "torch fp32": (lambda s, b: kit.encode(s, b)),
        "onnx fp32": (lambda s, b: onnx32.encode(s, b)),
        "onnx int8": (lambda s, b: onnx8.encode(s, b)),
    }
    sts = {
        "torch fp32": gate_sts["simcse-kit fp32"],
        "onnx fp32": evaluator(lambda s: torch.from_numpy(onnx32.encode(s, args.batch_size)))["avg"],
        "onnx int8": gate_sts["onnx-int8"],
    }
    names = [*backends, *(["torch fp32 (AVX2 kernels)"] if args.avx2_torch else [])]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in backends:
                res = measure(backends[name], sentences, args.latency_sentences, args.batch_size)
            else:
                res = run_worker(args, "torch-avx2", sentences_file, ISA_LIMITS)
            runs[name].append(res)
            print(f"round {r} {name:26s} {res['sentences_per_s']:7.1f} sent/s  batch-1 {res['latency_ms_median']:.2f} ms")
    cold: dict[str, list[dict[str, Any]]] = {"onnx_encoder": [], "torch (simcse-kit Encoder)": []}
    for _ in range(args.rounds):
        cold["onnx_encoder"].append(run_worker(args, "cold-onnx", sentences_file))
        cold["torch (simcse-kit Encoder)"].append(run_worker(args, "cold-torch", sentences_file))

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    table = {
        n: {
            "sentences_per_s_b128": med(rs, "sentences_per_s"),
            "latency_ms_b1": med(rs, "latency_ms_median"),
            "sts_avg": sts.get(n, sts["torch fp32"]),  # AVX2 kernels: same fp32 model
        }
        for n, rs in runs.items()
    }
    cold_keys = ("cold_start_s", "cold_start_with_interpreter_s", "peak_rss_mib")
    cold_table = {n: {k: med(rs, k) for k in cold_keys} for n, rs in cold.items()}
    payload = {
        "command": " ".join(["python -m benchmarks.onnx_speed", *sys.argv[1:]]),
        "machine": (machine() | {"versions": versions(), "threads": args.threads, "load_avg_before": load_before}),
        "export": {"seconds": export_s, "exporter": onnx_info["exporter"], "opset": onnx_info["opset"], "gate_sts": gate_sts},
        "n_sentences": len(sentences),
        "latency_sentences": args.latency_sentences,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "table_median": table,
        "cold_start_median": cold_table,
        "runs": runs,
        "cold_runs": cold,
    }
    payload["machine"]["load_avg_after"] = os.getloadavg()
    record = args.json or RESULTS / f"onnx_speed-{cpu_class(cpu_flags()[1])}.json"
    save_results(record, payload, allow_dirty=args.allow_dirty)  # stamps the commit, the dirty flag, the threads

    from benchmarks import report

    print("\n".join(report.md_table(report.ONNX.head, report.ONNX.rows(payload))))
    print(f"load average before {load_before}, after {payload['machine']['load_avg_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
