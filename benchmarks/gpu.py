"""simcse-kit against the sentence-transformers trainer on one device, same job: ``kit-pack-wN`` / ``kit-pad-wN`` /
``kit-padc-wN`` (packing on/off, ``train.compile``) and ``st-wN`` (MNRL on ``(s, s)``, bf16), N DataLoader workers,
alternated over rounds; ``--cpu-smoke`` runs a tiny encoder in seconds. Results: BENCHMARKS.md, "GPU".
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from benchmarks._common import (
    WIKI,
    CpuActivity,
    add_allow_dirty,
    emit,
    machine,
    paired_ratios,
    peak_rss_mib,
    run_rounds,
    save_results,
    setup_threads,
    spread,
    st_pair_trainer,
)

SCRIPT = Path(__file__).resolve()

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' data sheets; the first name found in the
# device's name wins (a bare "H100" is the SXM part).
BF16_PEAK = {"H200": 989.4e12, "H100 SXM": 989.4e12, "H100 80GB HBM3": 989.4e12, "H100 PCIe": 756.5e12}
BF16_PEAK |= {"H100 NVL": 835.5e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362.05e12, "L4": 121e12, "A10G": 70e12}
BF16_PEAK |= {"A10": 125e12, "RTX 4090": 165.2e12}


@dataclass(frozen=True)
class Job:
    """One training shape: the encoder, the batch (examples) and the max length."""

    model: str  # "minilm" (the bundled default), "bertbase" or "tiny" (random-init configs)
    batch_size: int
    max_seq_len: int

    @property
    def name(self) -> str:
        return f"{self.model}-b{self.batch_size}-l{self.max_seq_len}"


GPU_JOBS = [Job("minilm", 64, 32), Job("minilm", 512, 32), Job("bertbase", 64, 32), Job("bertbase", 64, 128)]
SMOKE_JOBS = [Job("tiny", 8, 16)]


def parse_job(name: str) -> Job:
    model, b, length = name.split("-")
    return Job(model, int(b[1:]), int(length[1:]))


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sentences(n: int, seed: int) -> list[str]:
    """``n`` training sentences: Wikipedia's head where the shared data is, else made up."""
    rng = random.Random(seed)
    if WIKI.is_file():
        with WIKI.open(encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        # The head has ~12k lines and batch 512 x 42 steps needs more: shuffled passes, as epochs would.
        out: list[str] = []
        while len(out) < n:
            out += rng.sample(lines, len(lines))
        return out[:n]
    words = "the a man woman dog plays runs reads guitar park city river old new red small music".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def model_folder(job: Job) -> str:
    """The encoder's folder: the bundled default, or a random-init config saved with its tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from simcse_kit.model.modeling import resolve_model_path

    default = resolve_model_path("all-MiniLM-L6-v2")
    if job.model == "minilm":
        return default
    sizes: dict[str, Any] = {
        "bertbase": {},  # BertConfig's defaults are BERT-base: 12 x 768, 12 heads, FFN 3072
        "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    }[job.model]
    import torch

    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix=f"gpu-bench-{job.model}-"))
    BertModel(BertConfig(vocab_size=30522, **sizes), add_pooling_layer=False).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default).save_pretrained(folder)
    return str(folder)


def step_flops(config: Any, lengths: list[int]) -> float:
    """Training FLOPs (3 x forward) of one batch's real tokens: matmuls only, as MFU counts."""
    d, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    linear = layers * (4 * d * d + 2 * d * ffn) + d * d  # + SimCSE's MLP head
    forward = sum(2 * linear * n + 4 * layers * d * n * n for n in lengths)
    return 3.0 * forward


def real_lengths(tokenizer: Any, sents: list[str], job: Job, args: argparse.Namespace) -> list[int]:
    """Real token counts of the timed steps' rows, estimated off the clock from the first
    ``batch x steps`` sentences (both frameworks draw random batches of the same corpus),
    each sentence twice (two views, or anchor and positive)."""
    n = job.batch_size * args.steps
    ids = tokenizer(sents[:n], truncation=True, max_length=job.max_seq_len)["input_ids"]
    return [len(x) for x in ids] * 2


def device_peak() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
    return name, peak


class StepClock:
    """Stamps (after synchronising the device) at two step numbers, and counts real tokens."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.stamps: dict[int, float] = {}

    def at(self, step: int) -> None:
        if step in (self.first, self.last):
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.stamps[step] = time.perf_counter()

    def seconds(self) -> float:
        return self.stamps[self.last] - self.stamps[self.first]


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> tuple[float, str]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20, "cuda_max_memory_allocated"
    return peak_rss_mib(), "process_peak_rss"


def run_kit(
    job: Job, folder: str, sents: list[str], packing: bool, workers: int, args: argparse.Namespace, compile_: bool = False
) -> dict[str, Any]:
    """simcse-kit's unsup recipe built as a text run is (``build_run``) and trained by its
    own loop (``fit``), timed between two steps."""
    import datasets

    from simcse_kit.config.recipes import find_recipe
    from simcse_kit.config.run import load_config
    from simcse_kit.training.engine.loop import fit
    from simcse_kit.training.wiring.run import build_run

    total = args.warmup + args.steps + 1
    overrides = {
        "model.name_or_path": folder,
        "model.packing": str(packing).lower(),
        "train.compile": str(compile_).lower(),
        "model.max_seq_len": job.max_seq_len,
        "data.num_workers": workers,
        "train.batch_size": job.batch_size,
        "train.max_steps": total,
        "train.eval_steps": 0,
        "train.eval_at_start": "false",
        "train.log_steps": 10**9,
        "train.progress_bar": "false",
        "train.report_to": "none",
        "train.final_eval": "false",
        "train.output_dir": tempfile.mkdtemp(),
        "train.mixed_precision": "auto" if cuda() else "no",
        "train.max_grad_norm": 1.0,  # what the peer's trainer does by default: like for like
    }
    cfg = load_config(find_recipe("unsup"), {k: str(v) for k, v in overrides.items()})
    run = build_run(cfg, dataset=datasets.Dataset.from_dict({"sent0": sents}), evaluate=False)
    clock = StepClock(args.warmup, args.warmup + args.steps)
    syncs = SyncCounter() if getattr(args, "sync_debug", False) and cuda() else None
    calls = [0]

    def step(model: Any, batch: Any, backward: Any) -> Any:
        if syncs is not None and calls[0] == args.warmup + args.steps:
            syncs.stop()
        clock.at(calls[0])  # reads nothing from the batch: the step keeps its own synchronisation
        if syncs is not None and calls[0] == args.warmup:
            syncs.start()  # after the clock's own synchronize: counts the steps' syncs alone
        calls[0] += 1
        return run.step(model, batch, backward)

    reset_peak()
    fit(run, step, run.cfg.train)
    model = run.accelerator.unwrap_model(run.model)
    return {
        "seconds": clock.seconds(),
        "sentences": (2 * job.batch_size * args.steps),
        "flops": step_flops(model.encoder.config, real_lengths(run.tokenizer, sents, job, args)),
        "precision": run.cfg.train.mixed_precision,
        "packing_active": bool(model.packing),
        "syncs": (None if syncs is None else syncs.where),
    }


def run_st(job: Job, folder: str, sents: list[str], workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """The sentence-transformers trainer with MultipleNegativesRankingLoss on (s, s)."""
    from sentence_transformers import SentenceTransformer
    from transformers import TrainerCallback

    try:  # sentence-transformers 6's home of the losses; older releases have only the other
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss  # type: ignore[import-not-found,no-redef]

    on_gpu = cuda()
    model = SentenceTransformer(folder, device="cuda" if on_gpu else "cpu")
    model.max_seq_length = job.max_seq_len
    total = args.warmup + args.steps + 1
    clock = StepClock(args.warmup, args.warmup + args.steps)

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.at(state.global_step)  # the start of the step after global_step finished ones

    trainer = st_pair_trainer(
        model,
        sents,
        job.batch_size,
        total,
        MultipleNegativesRankingLoss(model),
        bf16=on_gpu,
        cpu=not on_gpu,
        workers=workers,
        callbacks=[Clock()],
    )
    reset_peak()
    trainer.train()
    return {
        "seconds": clock.seconds(),
        "sentences": (2 * job.batch_size * args.steps),
        "flops": step_flops(cast(Any, model[0]).auto_model.config, real_lengths(model.tokenizer, sents, job, args)),
        "precision": ("bf16" if on_gpu else "no"),
        "packing_active": False,
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One variant of one job: ``kit-pack-w0``, ``kit-pad-w4``, ``st-w0``, ..."""
    from simcse_kit.model.fastpath.internals import reset_accelerate_state

    job = parse_job(args.job)
    kind, _, rest = args.worker.partition("-")
    workers = int(args.worker.rsplit("-w", 1)[1])
    sents = sentences(job.batch_size * (args.warmup + args.steps + 2), seed=args.offset)
    folder = args.model_folder or model_folder(job)
    reset_accelerate_state()  # in-process runs: each variant starts from a clean Accelerate state
    if kind == "kit":
        mode = rest.split("-w")[0]  # pack, pad, packc, padc
        packing, compile_ = mode.startswith("pack"), mode.endswith("c")
        res = run_kit(job, folder, sents, packing=packing, workers=workers, args=args, compile_=compile_)
    else:
        res = run_st(job, folder, sents, workers=workers, args=args)
    reset_accelerate_state()
    peak_mib, kind_of_memory = peak_memory()
    device, peak = device_peak()
    flops_per_s = res["flops"] / res["seconds"]
    return {
        "variant": args.worker,
        "job": job.name,
        "device": device,
        "workers": workers,
        "packing": res["packing_active"],
        "precision": res["precision"],
        "steps": args.steps,
        "seconds": res["seconds"],
        "sentences_per_s": (res["sentences"] / res["seconds"]),
        "peak_memory_mib": peak_mib,
        "memory_kind": kind_of_memory,
        "model_tflops_per_s": (flops_per_s / 1e12),
        "mfu": (None if peak is None else flops_per_s / peak),
        "syncs": res.get("syncs"),
    }


def rounds_in_process(variants: list[str], args: argparse.Namespace, job: Job, folder: str) -> list[dict[str, Any]]:
    """:func:`_common.run_rounds` without fresh interpreters (the CPU smoke: seconds, not minutes)."""
    runs = []
    for r in range(args.rounds):
        for v in variants:
            sub = argparse.Namespace(**(vars(args) | {"worker": v, "offset": r, "job": job.name, "model_folder": folder}))
            with CpuActivity() as activity:
                res = worker(sub)
            runs.append(res | {"round": r, "activity": activity.record})
            print(f"round {r} {job.name} {v:12s} {res['sentences_per_s']:10.1f} sentences/s", flush=True)
    return runs


def summarise(runs: list[dict[str, Any]], variants: list[str], workers: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for v in variants:
        mine = [x for x in runs if x["variant"] == v]
        summary[v] = {
            "sentences_per_s": spread([x["sentences_per_s"] for x in mine]),
            "peak_memory_mib": max(x["peak_memory_mib"] for x in mine),
            "mfu": spread([x["mfu"] for x in mine]) if all(x["mfu"] is not None for x in mine) else None,
        }
    for v in variants:  # each kit variant against the peer with the same workers, and packing against padding
        kind, _, w = v.rpartition("-w")
        if kind.startswith("kit") and f"st-w{w}" in variants:
            summary[f"{v}/st-w{w}"] = paired_ratios(runs, v, f"st-w{w}")
        pad = v.replace("-pack", "-pad")
        if "-pack" in v and pad in variants:
            summary[f"{v}/{pad}"] = paired_ratios(runs, v, pad)
    return summary


class SyncCounter:
    """Counts device-to-host synchronisations (``torch.cuda.set_sync_debug_mode("warn")``)
    between :meth:`start` and :meth:`stop`, with the first library frame of each."""

    def __init__(self) -> None:
        self.where: dict[str, int] = {}
        self._previous: Any = None

    def start(self) -> None:
        import warnings

        import torch

        self._previous = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        import warnings

        import torch

        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._previous

    def _record(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        import traceback

        if "synchronizing" not in str(message):
            return self._previous(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename and "warnings" not in f.filename]
        top = frames[-1] if frames else None
        key = f"{Path(top.filename).name}:{top.lineno} {top.line}" if top else "?"
        self.where[key] = self.where.get(key, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes, 1 round, in-process (default without CUDA)")
    parser.add_argument("--jobs", nargs="*", default=None, help=f"default: {[j.name for j in GPU_JOBS]}")
    parser.add_argument("--workers", nargs="*", type=int, default=None, help="DataLoader workers to compare (GPU: 0 4)")
    parser.add_argument("--variants", nargs="*", default=None, help="explicit variants, e.g. kit-padc-w4 st-w4")
    parser.add_argument("--sync-debug", action="store_true", help="count device-to-host syncs in the timed kit steps")
    add_allow_dirty(parser)
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (GPU: 3)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--in-process", action="store_true", help="no fresh interpreter per variant")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (smoke: 1, else all cores)")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmarks/gpu.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--model-folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    smoke = args.cpu_smoke or not cuda()
    defaults = (
        {"rounds": 1, "warmup": 1, "steps": 2, "workers": [0], "threads": 1}
        if smoke
        else {"rounds": 3, "warmup": 10, "steps": 30, "workers": [0, 4], "threads": os.cpu_count() or 1}
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    setup_threads(args.threads)  # smoke: 1 (two threads on a loaded 2-core CI box stall the HF trainer's steps)
    if args.worker:  # a fresh interpreter's one measurement (benchmarks/_common.run_rounds)
        emit(worker(args))
        return
    jobs = [parse_job(j) for j in args.jobs] if args.jobs else SMOKE_JOBS if smoke else GPU_JOBS
    variants = args.variants or [f"{kind}-w{w}" for w in args.workers for kind in ("kit-pack", "kit-pad", "st")]
    record: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.gpu", *sys.argv[1:]]),
        "machine": machine(),
        "device": device_peak()[0],
        "smoke": smoke,
        "args": (vars(args) | {"out": str(args.out)}),
        "jobs": {},
    }
    for job in jobs:
        folder = model_folder(job)
        common = [f"--job={job.name}", f"--model-folder={folder}", f"--warmup={args.warmup}", f"--steps={args.steps}"]
        if smoke or args.in_process:
            runs = rounds_in_process(variants, args, job, folder)
        else:
            runs = run_rounds(SCRIPT, variants, common, args.rounds, args.threads)
        record["jobs"][job.name] = {"runs": runs, "summary": summarise(runs, variants, args.workers)}
        # After every job: a run stopped at a time limit keeps what it finished.
        save_results(args.out, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
