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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SIMCSE_KIT_DATA") or REPO.parent / "shared" / "data")  # the kit's own data-root variable
WIKI = DATA / "train" / "wiki1m_head.txt"
SOUND_TASKS = ("stsb-similar", "sick-related")  # the retrieval tasks BM25 is clearly below the base on (docs/retrieval.md)


def lines_label(lines: int) -> str:
    """``10M`` for 10,000,000 lines, ``250k`` for 250,000, the count itself otherwise."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if lines % size == 0:
            return f"{lines // size}{unit}"
    return str(lines)


def setup_threads(threads: int) -> None:
    """Pin torch's intra-op threads (both frameworks get the same count)."""
    import torch

    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def setup_run(threads: int) -> None:
    """A long multi-run script's set-up."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    setup_threads(threads)


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


ISA_LIMITS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
"""Kernel limits that make a newer CPU run the kernels an AVX2-only CPU would (``--isa avx2``)."""


def cpu_flags() -> tuple[str, set[str]]:
    """The CPU's model name and ISA flags (``/proc/cpuinfo``; empty where unreadable)."""
    cpu, flags = platform.processor() or "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return cpu, flags


def cpu_generation(cpuinfo: str | None = None) -> str:
    """``"family 26 model 2"`` of an x86 CPU (``/proc/cpuinfo``, or ``cpuinfo`` given; empty where unknown). One model
    name covers machines whose speeds differ by 2x (ST's own bf16 encoding: 459 and 923 sentences/s on two
    "AMD EPYC" machines of the same CPU class), so a speed record names the family and model as well."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not key.strip() and fields:  # the first processor's block ends
            break
        fields.setdefault(key.strip(), value.strip())
    family, model = fields.get("cpu family"), fields.get("model")
    return f"family {family} model {model}" if family and model else ""


def cpu_class(flags: set[str]) -> str:
    """The CPU classes the speed tables are kept per."""
    if all(os.environ.get(k) == v for k, v in ISA_LIMITS.items()):
        return "avx2-limited"
    if any(f.startswith("amx") for f in flags):
        return "amx"
    return "avx512_bf16" if "avx512_bf16" in flags else "avx2"


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cpu, flags = cpu_flags()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "cpu": cpu,
        "cpu_generation": cpu_generation(),
        "cpu_class": cpu_class(flags),
        "cores": os.cpu_count(),
        "isa_flags": sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"} or f.startswith("amx")),
        "amx": any(f.startswith("amx") for f in flags),
        "avx512_bf16": "avx512_bf16" in flags,
        "kernel_limits": {k: os.environ[k] for k in ISA_LIMITS if k in os.environ},
        "torch_threads": torch.get_num_threads(),
        "versions": {n: _version(n) for n in ("torch", "transformers", "sentence-transformers", "accelerate", "simcse-kit")},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_avg_1min": (round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None),
    } | gpu_record()


def gpu_record() -> dict[str, Any]:
    """The CUDA device, its CUDA version and driver (``nvidia-smi``), or ``{"device": "cpu"}``."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        driver = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "?"
    return {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "torch_cuda": torch.version.cuda, "gpu_driver": driver}


def _busy_jiffies() -> tuple[int, int]:
    """(busy, steal) clock ticks of the whole machine so far (``/proc/stat``'s cpu line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuActivity:
    """How much CPU *other* processes used while a measurement ran."""

    # Another process using more than this share of the machine makes a round "busy".
    BUSY_SHARE = 0.05

    def __enter__(self) -> CpuActivity:
        self.load_before = os.getloadavg()[0]
        self.wall = time.perf_counter()
        self.busy, self.steal = _busy_jiffies()
        self.own = _own_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        busy, steal = _busy_jiffies()
        wall = time.perf_counter() - self.wall
        others = (busy - self.busy) / tick - (_own_cpu_seconds() - self.own)
        cores = os.cpu_count() or 1
        self.record = {
            "load_avg_before": round(self.load_before, 2),
            "load_avg_after": round(os.getloadavg()[0], 2),
            "wall_s": round(wall, 2),
            "other_cpu_share": round(max(0.0, others) / (wall * cores), 4),
            "steal_share": round((steal - self.steal) / tick / (wall * cores), 4),
        }
        self.record["busy"] = self.record["other_cpu_share"] > self.BUSY_SHARE


def check_quiet(allow_busy: bool, threshold: float = 0.10, seconds: float = 3.0) -> None:
    """Refuse to start while other processes keep the CPU busy."""
    with CpuActivity() as activity:
        time.sleep(seconds)
    share = activity.record["other_cpu_share"]
    if share > threshold and not allow_busy:
        raise SystemExit(
            f"the machine is busy (other processes used {100 * share:.0f}% of the CPU over {seconds:.0f} s): speed "
            "numbers would be wrong. Stop the other jobs, or pass --allow-busy to record the rounds flagged as busy."
        )


class TimedCollator:
    """Wraps a collate function and stamps the time of each call."""

    def __init__(
        self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]] | None, count: Callable[[dict[str, Any]], tuple[int, int]]
    ) -> None:
        self.collate = collate  # None: set by around()
        self.count = count
        self.stamps: list[float] = []
        self.sentences: list[int] = []
        self.tokens: list[int] = []

    def around(self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> TimedCollator:
        """This, timing ``collate`` (``build_run``'s ``wrap_collate``)."""
        self.collate = collate
        return self

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if self.collate is None:
            raise RuntimeError("TimedCollator: no collate function to time (pass one, or use around())")
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
            "sentences_per_s": (sentences / seconds),
            "padded_tokens_per_s": (tokens / seconds),
        }


def module_command(script: str | Path) -> list[str]:
    """``python -m benchmarks.NAME`` for benchmark ``script`` (a path); run it with ``cwd=REPO``."""
    return [sys.executable, "-m", f"benchmarks.{Path(script).stem}"]


def run_worker(script: Path, args: list[str], threads: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter of ``script`` (clean RSS, clean Accelerate state)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | (env or {})
    proc = subprocess.run([*module_command(script), *args], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"worker {args} failed with status {proc.returncode}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(last[len("RESULT ") :])


def run_rounds(
    script: Path,
    variants: list[str],
    common: list[str],
    rounds: int,
    threads: int,
    env: dict[str, str] | None = None,
    metric: str = "sentences_per_s",
) -> list[dict[str, Any]]:
    """Each variant in a fresh interpreter (:func:`run_worker` with ``--worker=VARIANT``),
    alternating over ``rounds`` so a load change on the machine hits all of them; each
    result gets its ``round`` and the :class:`CpuActivity` around it, and a progress
    line is printed."""
    runs = []
    for r in range(rounds):
        for v in variants:
            with CpuActivity() as activity:
                res = run_worker(script, [*common, f"--worker={v}", f"--offset={r}"], threads, env)
            runs.append(res | {"round": r, "activity": activity.record})
            flag = "  BUSY: other processes used the CPU" if activity.record["busy"] else ""
            rss = f"  peak RSS {res['peak_rss_mib']:.0f} MiB" if "peak_rss_mib" in res else ""
            print(f"round {r} {v:18s} {res[metric]:10.2f} {metric}{rss}{flag}", flush=True)
    return runs


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and the relative half-range ((max - min) / 2 / median)."""
    import statistics

    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "half_range_pct": (100 * (max(values) - min(values)) / 2 / med if med else float("nan")),
        "n": len(values),
    }


def paired_ratios(runs: list[dict[str, Any]], ours: str, theirs: str, metric: str = "sentences_per_s") -> dict[str, float] | None:
    """``ours / theirs`` within each round (the two ran minutes apart), summarised by :func:`spread`."""
    by_round: dict[int, dict[str, float]] = {}
    for x in runs:
        by_round.setdefault(x["round"], {})[x["variant"]] = x[metric]
    ratios = [r[ours] / r[theirs] for r in by_round.values() if ours in r and theirs in r]
    return spread(ratios) if ratios else None


RESULTS_DIR = "benchmarks/results/"


def tree_dirty() -> bool:
    """Whether the checkout differs from its commit (``git status --porcelain`` says anything), leaving
    out the records under ``benchmarks/results/``, new or rewritten: they are what the runs write, not
    the code they ran (one script's record must not stop the next script of the same sweep)."""
    # Every untracked file by name: a new results/ folder would otherwise show as one "?? benchmarks/" line.
    command = ["git", "status", "--porcelain", "--untracked-files=all"]
    status = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return any(not path.startswith(RESULTS_DIR) for path in changed)


def provenance(threads: int | None) -> dict[str, Any]:
    """What :func:`save_results` stamps on every record: the full commit, whether the tree was dirty,
    and the thread count the runs used (``report --check`` refuses a record without it)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    return {"commit": commit, "dirty": tree_dirty(), "threads": threads, "writer": "benchmarks._common.save_results"}


def add_allow_dirty(parser: Any) -> None:
    """``--allow-dirty``: write a record from a checkout with changes (marked dirty in the tables)."""
    parser.add_argument(
        "--allow-dirty", action="store_true", help="keep the record even though the checkout has changes; the tables mark it"
    )


def refuse_dirty(allow_dirty: bool) -> None:
    """Stop before the runs, not after them, where :func:`save_results` would refuse the record."""
    if tree_dirty() and not allow_dirty:
        raise SystemExit(
            "the checkout has uncommitted changes (git status --porcelain): a record must name the code it ran. "
            "Commit first, or pass --allow-dirty to keep a record marked dirty."
        )


def save_results(path: Path, record: dict[str, Any], allow_dirty: bool = False) -> None:
    """Write a benchmark's record (machine, arguments, every round, summary) as JSON, stamped with
    :func:`provenance` (the threads: the record's ``machine.torch_threads``).

    Raises:
        SystemExit: The checkout has changes and ``allow_dirty`` is not set.
    """
    refuse_dirty(allow_dirty)
    record["provenance"] = provenance((record.get("machine") or {}).get("torch_threads"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def kit_recipe_run(
    recipe: str, overrides: dict[str, Any], sentences: list[str] | dict[str, list[str]], timer: TimedCollator | None = None
) -> Any:
    """A run of the repo's recipe ``recipe`` (``unsup``, ...) on ``sentences`` (or the columns
    its mode reads: ``sent0``, ``sent1``, ``hard_neg``) with
    ``overrides`` (``train.`` / ``model.`` keys by their short names, as on the command
    line), on the CPU, built as a text run is (``simcse_kit.training.wiring.run.build_run``: "auto"
    precision decided, ``mmap_threshold_mib`` applied) without dev selection or run folder;
    ``fit(run, run.step, run.cfg.train)`` trains it; ``timer`` stamps every batch it collates."""
    import datasets

    from simcse_kit.config.recipes import find_recipe
    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.run import build_run

    opts = {"eval_steps": 0, "eval_at_start": False, "log_steps": 10**9, "progress_bar": False, "report_to": "none"}
    opts |= {"output_dir": tempfile.mkdtemp()} | overrides
    cfg = load_config(find_recipe(recipe), {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in opts.items()})
    dataset = datasets.Dataset.from_dict(sentences if isinstance(sentences, dict) else {"sent0": sentences})
    return build_run(cfg, dataset=dataset, evaluate=False, cpu=True, wrap_collate=timer.around if timer else None)


def emit(result: dict[str, Any]) -> None:
    """A worker's one machine-readable output line."""
    print("RESULT " + json.dumps(result), flush=True)


def st_pair_trainer(
    model: Any,
    sents: list[str] | Any,
    batch_size: int,
    max_steps: int,
    loss: Any,
    *,
    bf16: bool,
    cpu: bool,
    workers: int = 0,
    callbacks: Sequence[Any] = (),
) -> Any:
    """sentence-transformers' trainer on ``(s, s)`` pairs (its documented unsupervised SimCSE), or on
    ``sents`` as given where a ``datasets.Dataset``, with its own defaults otherwise (fused AdamW, clipping
    at 1.0); nothing saved or logged."""
    import datasets
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    train_args = SentenceTransformerTrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=batch_size,
        max_steps=max_steps,
        learning_rate=3e-5,
        bf16=bf16,
        use_cpu=cpu,
        dataloader_num_workers=workers,
        save_strategy="no",
        report_to="none",
        logging_steps=10**9,
        disable_tqdm=True,
        dataloader_drop_last=True,
        seed=42,
    )
    pairs = sents if isinstance(sents, datasets.Dataset) else datasets.Dataset.from_dict({"anchor": sents, "positive": sents})
    return SentenceTransformerTrainer(model=model, args=train_args, train_dataset=pairs, loss=loss, callbacks=list(callbacks))


def st_pair_throughput(
    args: Any,
    sents: list[str] | Any,
    make_loss: Callable[[Any], Any],
    path: str = "all-MiniLM-L6-v2",
    adapt: Callable[[Any], None] | None = None,
) -> dict[str, float]:
    """Train sentence-transformers' ``path`` (``adapt(model)`` first: an adapter) on ``(s, s)`` pairs, or
    on a ``datasets.Dataset``'s columns, with ``make_loss(model)`` and time it; ``trainable``: its trained weights."""
    from sentence_transformers import SentenceTransformer

    from simcse_kit.model.modeling import resolve_model_path

    model = SentenceTransformer(resolve_model_path(path), device="cpu")
    model.max_seq_length = args.max_seq_len
    if adapt is not None:
        adapt(model)
    max_steps = args.warmup + args.steps + 2
    trainer = st_pair_trainer(model, sents, args.batch_size, max_steps, make_loss(model), bf16=args.precision == "bf16", cpu=True)
    collator = TimedCollator(
        trainer.data_collator,
        lambda b: (  # every column's rows: anchor, positive (and negative)
            sum(v.shape[0] for k, v in b.items() if k.endswith("_input_ids")),
            sum(v.numel() for k, v in b.items() if k.endswith("_input_ids")),
        ),
    )
    trainer.data_collator = collator
    trainer.train()
    return collator.rate(args.warmup, args.steps) | {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
