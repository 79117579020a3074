"""Helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
WIKI = DATA / "train" / "wiki1m_head.txt"


def setup_threads(threads: int) -> None:
    """Pin torch's intra-op threads (both frameworks get the same count)."""
    import torch

    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def setup_run(threads: int) -> None:
    """A long multi-run script's set-up: INFO logs with time stamps, the libraries'
    chatter at WARNING, and :func:`setup_threads`."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    setup_threads(threads)


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cpu = platform.processor() or "?"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "amx": any(f.startswith("amx") for f in flags),
        "avx512_bf16": "avx512_bf16" in flags,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_avg_1min": round(load, 2),
    }


class TimedCollator:
    """Wraps a collate function and stamps the time of each call.

    The training loops prefetch at a fixed phase, so the gap between collate call
    ``i`` and ``i + n`` is ``n`` steps in steady state whatever the loop does around
    them: the same clock for both frameworks. Unknown attributes pass through (the
    sentence-transformers trainer reads some off its collator).
    """

    def __init__(
        self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]], count: Callable[[dict[str, Any]], tuple[int, int]]
    ) -> None:
        self.collate = collate
        self.count = count
        self.stamps: list[float] = []
        self.sentences: list[int] = []
        self.tokens: list[int] = []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        self.stamps.append(time.perf_counter())
        batch = self.collate(features)
        sentences, tokens = self.count(batch)
        self.sentences.append(sentences)
        self.tokens.append(tokens)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collate, name)

    def rate(self, warmup: int, steps: int) -> dict[str, float]:
        """Sentences and padded tokens per second over ``steps`` steps after ``warmup``."""
        if len(self.stamps) <= warmup + steps:
            raise RuntimeError(f"only {len(self.stamps)} batches collated; need {warmup + steps + 1}")
        seconds = self.stamps[warmup + steps] - self.stamps[warmup]
        sentences = sum(self.sentences[warmup : warmup + steps])
        tokens = sum(self.tokens[warmup : warmup + steps])
        return {
            "seconds": seconds,
            "sentences": sentences,
            "sentences_per_s": sentences / seconds,
            "padded_tokens_per_s": tokens / seconds,
        }


def run_worker(script: Path, args: list[str], threads: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (clean RSS, clean Accelerate state);
    ``env``: extra environment variables (read at the process's start)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | (env or {})
    proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"worker {args} failed with status {proc.returncode}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(last[len("RESULT ") :])


def run_rounds(script: Path, variants: list[str], common: list[str], rounds: int, threads: int) -> list[dict[str, Any]]:
    """Each variant in a fresh interpreter (:func:`run_worker` with ``--worker=VARIANT``),
    alternating over ``rounds`` so a load change on the machine hits all of them; each
    result gets its ``round``, and a progress line is printed."""
    runs = []
    for r in range(rounds):
        for v in variants:
            res = run_worker(script, [*common, f"--worker={v}", f"--offset={r}"], threads)
            runs.append(res | {"round": r})
            print(f"round {r} {v:18s} {res['sentences_per_s']:8.1f} sent/s  peak RSS {res['peak_rss_mib']:.0f} MiB", flush=True)
    return runs


@dataclass
class KitRun:
    """One simcse-kit text run, built as ``simcse_kit.training.train`` builds it (without
    the run folder); ``fit(run.model, run.step, run.loader, run.cfg.train,
    accelerator=run.accelerator)`` trains it."""

    cfg: Any
    precision: Any  # PrecisionChoice, or None where the config decided
    heap: Any  # HeapChoice
    accelerator: Any
    model: Any
    loader: Any
    step: Any


def kit_recipe_run(recipe: str, overrides: dict[str, Any], sentences: list[str]) -> KitRun:
    """A run of the repo's recipe ``recipe`` (``unsup``, ...) on ``sentences`` with
    ``overrides`` (``train.`` / ``model.`` keys by their short names, as on the command
    line), on the CPU: "auto" precision decided and ``mmap_threshold_mib`` applied as a run does."""
    import datasets

    from simcse_kit.config import load_config
    from simcse_kit.heap import apply_mmap_threshold
    from simcse_kit.objectives import SimCSEObjective
    from simcse_kit.recipes import find_recipe
    from simcse_kit.trainer import make_accelerator, with_concrete_precision
    from simcse_kit.training import build_model, load_checked_tokenizer, make_loader, make_step

    opts = {"eval_steps": 0, "eval_at_start": False, "log_steps": 10**9, "progress_bar": False, "report_to": "none"}
    opts |= {"output_dir": tempfile.mkdtemp()} | overrides
    cfg = load_config(find_recipe(recipe), {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in opts.items()})
    train_cfg, precision = with_concrete_precision(cfg.train, cpu=True)
    cfg = replace(cfg, train=train_cfg)
    heap = apply_mmap_threshold(cfg.train.mmap_threshold_mib)
    tokenizer = load_checked_tokenizer(cfg)
    accelerator = make_accelerator(cfg.train, cpu=True)
    model = build_model(cfg)
    loader = make_loader(cfg, datasets.Dataset.from_dict({"sent0": sentences}), tokenizer, accelerator.num_processes)
    step = make_step(cfg, model, SimCSEObjective(cfg.data.mode, cfg.loss), accelerator)
    return KitRun(cfg, precision, heap, accelerator, model, loader, step)


def emit(result: dict[str, Any]) -> None:
    """A worker's one machine-readable output line."""
    print("RESULT " + json.dumps(result), flush=True)


def st_pair_throughput(args: Any, sents: list[str], make_loss: Callable[[Any], Any]) -> dict[str, float]:
    """Train sentence-transformers on ``(s, s)`` pairs with ``make_loss(model)`` and time it.

    ``args`` needs ``batch_size``, ``max_seq_len``, ``precision`` (``bf16`` or ``fp32``),
    ``warmup`` and ``steps``; its own defaults otherwise (fused AdamW, clipping at 1.0).
    Returns :meth:`TimedCollator.rate` over ``steps`` steps after ``warmup``.
    """
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from simcse_kit.modeling import resolve_model_path

    model = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    model.max_seq_length = args.max_seq_len
    train_args = SentenceTransformerTrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.batch_size,
        max_steps=args.warmup + args.steps + 2,
        learning_rate=3e-5,
        bf16=args.precision == "bf16",
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        logging_steps=10**9,
        disable_tqdm=True,
        dataloader_drop_last=True,
        seed=42,
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=train_args,
        train_dataset=datasets.Dataset.from_dict({"anchor": sents, "positive": sents}),
        loss=make_loss(model),
    )
    collator = TimedCollator(
        trainer.data_collator,
        lambda b: (
            b["anchor_input_ids"].shape[0] + b["positive_input_ids"].shape[0],
            b["anchor_input_ids"].numel() + b["positive_input_ids"].numel(),
        ),
    )
    trainer.data_collator = collator
    trainer.train()
    return collator.rate(args.warmup, args.steps)
