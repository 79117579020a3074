"""Where one training step's time goes, by operator class (``torch.profiler``), and how far it is from the matmul bound.

Settings: ``recipe`` (bf16 weights + fast dropout, as ``auto`` picks on a native-bf16 CPU),
``autocast`` (bf16 autocast), ``fp32``; a steady state on repeated batches (``flops.py`` has a
real run's share of the peak). Results: BENCHMARKS.md, "Training speed per CPU class".
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks._common import WIKI, emit, peak_rss_mib, run_rounds, setup_threads, spread, step_flops
from benchmarks._harness import add_options, chosen, forwarded, keep, print_spread, start
from benchmarks.flops import peak_result

if TYPE_CHECKING:
    from torch import nn
    from torch.autograd.profiler_util import FunctionEvent

    from simcse_kit.config import RunConfig
    from simcse_kit.objectives import SimCSEObjective
    from simcse_kit.run import Run

# Config overrides per setting ("recipe": what the recipes' "auto" resolves to on a native-bf16 CPU).
RECIPE = {"mixed_precision": "bf16", "bf16_weights": "true", "fast_dropout": "true"}
SETTINGS: dict[str, dict[str, str]] = {
    "recipe": RECIPE,
    "autocast": {"mixed_precision": "bf16", "bf16_weights": "false", "fast_dropout": "false"},
    "fp32": {"mixed_precision": "no", "bf16_weights": "false", "fast_dropout": "false"},
    # An ablation, not in the default run: the recipe with a fresh dense embedding gradient
    # every backward (train.sparse_embedding_grad false).
    "recipe-densegrad": RECIPE | {"sparse_embedding_grad": "false"},
}
DEFAULT_SETTINGS = "recipe,autocast,fp32"

MATMUL = "matmul/linear"
PRODUCTS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"})
# A product's wrappers: their reshapes, transposes, autocast casts and bias adds are the layer's cost.
MATMUL_OPS = PRODUCTS | {"aten::linear", "aten::matmul"}
RANGE = "profile_step::"  # the ranges this script adds
# (class, substrings of a lower-cased op or range name); the first class found anywhere
# among an op and its enclosing ops wins: dropout inside the attention range is dropout,
# LayerNorm inside the embedding range is LayerNorm.
CLASSES = (
    ("optimizer", ("optimizer.",)),
    ("dropout", ("dropout", "bernoulli")),
    ("LayerNorm", ("layer_norm", "layernorm")),
    ("GELU", ("gelu",)),
    ("loss", (RANGE + "loss",)),
    ("embedding", ("embedding",)),
    ("attention", ("scaled_dot_product", RANGE + "attention")),
)
ORDER = [MATMUL] + [name for name, _ in CLASSES] + ["other"]
BACKWARD = "autograd::engine::evaluate_function:"  # one autograd node's backward
TARGET = 1.3  # the wanted speed-up
PEAK = "peak-bf16"


def steady_state(batches: int) -> str:
    """What this script's shares of the peak are (said in its output and JSON)."""
    return (
        f"steady state: {batches} fixed batches repeated (oneDNN has kernels for every shape); "
        "a real run's share of the peak, on fresh batches, is flops.py's"
    )


# --------------------------------------------------------------------------- classes


def lineage(ev: FunctionEvent) -> list[FunctionEvent]:
    """``ev`` and the ops enclosing it, innermost first."""
    out = []
    node: FunctionEvent | None = ev
    while node is not None:
        out.append(node)
        node = node.cpu_parent
    return out


def named_class(names: list[str]) -> str:
    """The class of a forward op from its own and its enclosing ops' names."""
    if any(name in MATMUL_OPS for name in names):
        return MATMUL
    lowered = [name.lower() for name in names]
    for cls, needles in CLASSES:
        if any(needle in name for name in lowered for needle in needles):
            return cls
    return "other"


def charge(events: list[FunctionEvent]) -> tuple[dict[str, float], dict[str, float]]:
    """Self CPU ms per class summed over the profiled steps, plus ``kernels`` (ms inside
    the product ops), ``untraced`` (ms in no op) and ``steps`` (profiled steps); and the
    ms of each op in "other" (a backward op named after its node: ``MulBackward0 > aten::mul``)."""
    totals = dict.fromkeys(ORDER, 0.0) | {"kernels": 0.0, "untraced": 0.0, "steps": 0.0}
    other: dict[str, float] = {}
    made_by: dict[int, str] = {}  # autograd sequence number -> class of the forward op that made the node
    # Start order: a forward op comes before its backward, and of the forward ops that
    # share a sequence number (those before the node's maker read the same one) the maker is last.
    for ev in sorted(events, key=lambda e: e.time_range.start):
        chain = lineage(ev)
        if not chain[-1].name.startswith("ProfilerStep"):
            continue  # outside the profiled steps
        ms = ev.self_cpu_time_total / 1e3
        names = [e.name for e in chain]
        if len(chain) == 1:
            totals["untraced"] += ms
            totals["steps"] += 1
        if any(name in PRODUCTS for name in names):
            totals["kernels"] += ms
        node = next((e for e in chain if e.name.startswith(BACKWARD)), None)
        if node is None:
            cls = named_class(names)
            if ev.sequence_nr >= 0:
                made_by[ev.sequence_nr] = cls
        elif any(name in MATMUL_OPS for name in names):
            cls = MATMUL
        else:
            cls = made_by.get(node.sequence_nr, "other")
        totals[cls] += ms
        if cls == "other" and len(chain) > 1:
            key = ev.name.removeprefix(BACKWARD).strip()
            key = key if node is None or node is ev else f"{node.name.removeprefix(BACKWARD).strip()} > {key}"
            other[key] = other.get(key, 0.0) + ms
    return totals, other


# --------------------------------------------------------------------------- instrumentation


def ranged(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` running inside a profiler range ``name``."""
    from torch.profiler import record_function

    @wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return inner


def range_module(module: nn.Module, name: str) -> list[Any]:
    """Open a profiler range ``name`` around every forward of ``module``; the hooks' handles."""
    from torch.profiler import record_function

    opened: list[Any] = []

    def enter(_module: nn.Module, _inputs: Any) -> None:
        opened.append(record_function(name).__enter__())

    def leave(_module: nn.Module, _inputs: Any, _output: Any) -> None:
        opened.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


@contextmanager
def class_ranges(model: nn.Module, objective: SimCSEObjective) -> Iterator[None]:
    """The ranges that name classes the op names alone cannot (see the module docstring)."""
    from simcse_kit.fastpath import dropout

    handles = []
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("SelfAttention"):
            handles += range_module(module, RANGE + "attention")
        elif kind.endswith("Embeddings"):
            handles += range_module(module, RANGE + "embedding")
    original = dropout.fast_dropout
    dropout.fast_dropout = ranged(original, RANGE + "dropout")  # FastDropout and the attention look it up here
    objective.loss = ranged(objective.loss, RANGE + "loss")  # the objective's step calls self.loss
    try:
        yield
    finally:
        dropout.fast_dropout = original
        del objective.loss
        for handle in handles:
            handle.remove()


class ProfiledStep:
    """The loop's step, wrapped: stamps each call, moves the profiler's schedule along and
    keeps the profiled steps' batches.

    A call starts step ``i`` and ends the previous one, so the profiler's window 0 is
    ``fit``'s set-up and window ``i + 1`` is step ``i`` (optimizer and next batch included).
    """

    def __init__(self, step: Callable[..., Any], warmup: int, timed: int, profiled: int) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.step = step
        self.stamps: list[float] = []
        self.batches: list[dict[str, Any]] = []
        first = warmup + timed  # the profiler's own warm-up step (recorded, then dropped)
        self.active = range(first + 1, first + 1 + profiled)
        self.profiler = profile(
            activities=[ProfilerActivity.CPU], schedule=schedule(wait=first + 1, warmup=1, active=profiled, repeat=1)
        )

    def __call__(self, model: nn.Module, batch: dict[str, Any], backward: Callable[..., None]) -> Any:
        if len(self.stamps) in self.active:
            self.batches.append(batch)
        self.stamps.append(time.perf_counter())
        self.profiler.step()
        return self.step(model, batch, backward)


# --------------------------------------------------------------------------- one setting (worker)


def run_config(args: argparse.Namespace, steps: int) -> RunConfig:
    """The recipe with this setting's precision, ``steps`` long, without evaluations, logging or trackers."""
    from simcse_kit.config import load_config
    from simcse_kit.recipes import find_recipe

    overrides = {
        "output_dir": tempfile.mkdtemp(prefix="profile_step-"),
        "batch_size": str(args.batch_size),
        "max_seq_len": str(args.max_seq_len),
        "max_steps": str(steps),
        "eval_steps": "0",
        "log_steps": str(10**9),
        "progress_bar": "false",
        "report_to": "none",
    }
    if args.no_packing:
        overrides["packing"] = "false"
    return load_config(find_recipe(args.recipe), overrides | SETTINGS[args.worker])


def fixed_order_run(cfg: RunConfig, distinct: int, steps: int) -> Run:
    """The text run ``simcse-kit train`` would build from ``cfg`` (:func:`simcse_kit.run.build_run`:
    precision, heap, accelerator, model, objective, step, AdamW, schedule), on ``distinct``
    batches of wiki sentences repeated in order instead of shuffled, collated by the run's
    own collator: ``steps`` batches."""
    import datasets
    from torch.utils.data import DataLoader

    from simcse_kit.data import read_sentences
    from simcse_kit.run import build_run

    n = cfg.train.batch_size
    sentences = read_sentences(WIKI)[: distinct * n] * -(-steps // distinct)
    run = build_run(cfg, dataset=datasets.Dataset.from_dict({"sent0": sentences}), evaluate=False, cpu=True)
    fixed = DataLoader(
        [{"sent0": s} for s in sentences], batch_size=n, shuffle=False, drop_last=True, collate_fn=run.loader.collate_fn
    )
    run.loader = run.accelerator.prepare(fixed)  # only the data order differs from the run
    return run


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    if args.worker == PEAK:
        emit(peak_result(PEAK, args.n))
        return
    import transformers

    from simcse_kit.loop import fit

    transformers.logging.set_verbosity_error()
    steps = args.warmup + args.timed + args.batches + 2  # + the profiler's warm-up step and the one that ends the last window
    cfg = run_config(args, steps)  # every precision key explicit: nothing for "auto" to decide
    run = fixed_order_run(cfg, args.batches, steps)
    model, objective = run.model, run.objective
    probe = ProfiledStep(run.step, args.warmup, args.timed, args.batches)
    with class_ranges(model, objective), probe.profiler:
        fit(run, probe, run.cfg.train)
    events = list(probe.profiler.events())
    if cfg.train.fast_dropout and not any(ev.name == RANGE + "dropout" for ev in events):
        raise RuntimeError("fast dropout ran outside its profiler range: the dropout class would be empty")
    totals, other = charge(events)
    profiled = int(totals.pop("steps"))
    biggest = sorted(other.items(), key=lambda kv: -kv[1])[:5]
    stamps = probe.stamps[args.warmup : args.warmup + args.timed + 1]
    walls = [(b - a) * 1e3 for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    flops = step_flops(model, objective, probe.batches)
    emit(
        {
            "variant": args.worker,
            "setting": args.worker,
            "figure": steady_state(args.batches),
            "gflops": flops / statistics.median(walls) / 1e6,  # the whole step's, in the steady state
            "precision": {
                k: getattr(cfg.train, k) for k in ("mixed_precision", "bf16_weights", "fast_dropout", "sparse_embedding_grad")
            },
            "packing": cfg.model.packing,
            "wall_ms": walls,
            "profiled_steps": profiled,
            "profiled_ms": {k: v / profiled for k, v in totals.items()},
            "other_ops_ms": {k: v / profiled for k, v in biggest},
            "flops_per_step": flops,
            "rows": statistics.mean(int(b["input_ids"].shape[0]) for b in probe.batches),
            "padded_tokens": statistics.mean(int(b["input_ids"].numel()) for b in probe.batches),
            "peak_rss_mib": peak_rss_mib(),
        }
    )


# --------------------------------------------------------------------------- report


def derive(res: dict[str, Any], peak: float) -> dict[str, float]:
    """One setting's derived numbers in one round, against that round's bf16 ``peak``
    (GFLOP/s): shares of the peak (steady state), class shares and the bounds."""
    ms = res["profiled_ms"]
    profiled = sum(ms[c] for c in ORDER)
    wall = statistics.median(res["wall_ms"])
    flops = res["flops_per_step"]
    kernel_gflops = flops / ms["kernels"] / 1e6
    step_gflops = flops / wall / 1e6
    return {
        "median_ms": wall,
        "profiled_total_ms": profiled,
        "matmul_gflops": kernel_gflops,
        "step_gflops": step_gflops,
        "peak_bf16_gflops": peak,
        "matmul_fraction_of_peak": kernel_gflops / peak,
        "step_fraction_of_peak": step_gflops / peak,
        "bound_only_matmul_ms": wall * ms[MATMUL] / profiled,
        "bound_matmul_at_peak_ms": wall - wall * ms["kernels"] / profiled + flops / peak / 1e6,
    } | {f"share_{cls}": ms[cls] / profiled for cls in ORDER}


def report(res: dict[str, Any], peak: float) -> None:
    """Print one setting's table and bounds (one round; :func:`derive`'s numbers)."""
    d = derive(res, peak)
    ms, wall, flops = res["profiled_ms"], d["median_ms"], res["flops_per_step"]
    p = res["precision"]
    what = "fp32" if p["mixed_precision"] == "no" else "bf16" + (" weights" if p["bf16_weights"] else " autocast")
    what += ", fast dropout" if p["fast_dropout"] else ""
    what += ", dense embedding gradient" if p.get("sparse_embedding_grad") is False else ""
    print(
        f"\n{res['setting']} ({what}): median {wall:.0f} ms a step ({len(res['wall_ms'])} steps), "
        f"{d['profiled_total_ms']:.0f} ms profiled (mean of {res['profiled_steps']})"
    )
    print(f"  {'class':14s} {'ms':>8s} {'%':>6s}")
    for cls in ORDER:
        print(f"  {cls:14s} {ms[cls]:8.1f} {100 * d[f'share_{cls}']:5.1f}%")
    ops = ", ".join(f"{name} {t:.1f}" for name, t in list(res["other_ops_ms"].items())[:3])
    print(f"  other: {ms['untraced']:.1f} ms outside any op (Python, tokenising the next batch); biggest ops: {ops}")
    print(
        f"  matmuls: {flops / 1e9:.1f} GFLOP a step in {ms['kernels']:.0f} ms of product kernels = "
        f"{d['matmul_gflops']:.0f} GFLOP/s = {100 * d['matmul_fraction_of_peak']:.0f}% of the bf16 peak; "
        f"whole step {d['step_gflops']:.0f} GFLOP/s = {100 * d['step_fraction_of_peak']:.0f}% (steady state)"
    )
    only_matmul, at_peak = d["bound_only_matmul_ms"], d["bound_matmul_at_peak_ms"]
    print(
        f"  upper bound: every class but {MATMUL} free -> {only_matmul:.0f} ms = {wall / only_matmul:.2f}x; "
        f"product kernels at the bf16 peak -> {at_peak:.0f} ms = {wall / at_peak:.2f}x "
        f"({TARGET}x would be {wall / TARGET:.0f} ms)"
    )


SUMMARY_KEYS = (
    "median_ms",
    "step_fraction_of_peak",
    "matmul_fraction_of_peak",
    "bound_only_matmul_ms",
    "bound_matmul_at_peak_ms",
    "peak_bf16_gflops",
    *(f"share_{cls}" for cls in ORDER),
)


def add_derived(runs: list[dict[str, Any]]) -> dict[int, float]:
    """Give each setting's run its :func:`derive` numbers against its round's bf16 peak;
    the peaks by round."""
    peaks = {x["round"]: x["gflops"] for x in runs if x["variant"] == PEAK}
    for x in runs:
        if x["variant"] != PEAK:
            x["derived"] = derive(x, peaks[x["round"]])
    return peaks


def summarise(runs: list[dict[str, Any]], settings: list[str]) -> dict[str, Any]:
    """Per setting, median and range over the rounds of each derived number; the speed-ups
    the two bounds allow (median step / median bound)."""
    summary: dict[str, Any] = {}
    for setting in settings:
        derived = [x["derived"] for x in runs if x["variant"] == setting]
        summary[setting] = {k: spread([d[k] for d in derived]) for k in SUMMARY_KEYS}
        summary[setting]["precision"] = next(x["precision"] for x in runs if x["variant"] == setting)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help=f"comma-separated subset of {tuple(SETTINGS)}")
    parser.add_argument("--recipe", default="unsup", help="built-in recipe name or file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, repeated; each is profiled once")
    parser.add_argument("--warmup", type=int, default=4, help="steps first (at least --batches: oneDNN builds kernels per shape)")
    parser.add_argument("--timed", type=int, default=12, help="unprofiled steps for the median")
    parser.add_argument("--n", type=int, default=2048, help="matmul size for the bf16 peak")
    parser.add_argument("--no-packing", action="store_true")
    add_options(parser, "profile_step")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    settings = chosen(parser, args.settings, list(SETTINGS))
    if min(args.batches, args.timed) < 1 or args.warmup < args.batches:
        parser.error("--batches and --timed must be at least 1, --warmup at least --batches (every shape seen before timing)")

    env = start(args)
    setup_threads(args.threads)
    from simcse_kit.precision import resolve_precision

    auto = resolve_precision("auto", "cpu").reason
    figure = steady_state(args.batches)
    print(f"auto here: {auto}")
    print(
        f"step: recipe {args.recipe}, batch {args.batch_size}, max len {args.max_seq_len}, {args.batches} distinct batches, "
        f"{args.warmup} warm-up + {args.timed} timed + {args.batches} profiled steps; {figure}"
    )
    common = forwarded(args, "recipe", "threads", "batch-size", "max-seq-len", "batches", "warmup", "timed", "n")
    common += ["--no-packing"] if args.no_packing else []
    runs = run_rounds(Path(__file__), [PEAK, *settings], common, args.rounds, args.threads, env=env, metric="gflops")
    peaks = add_derived(runs)
    last = args.rounds - 1
    print(f"\nthe last round's profile (bf16 matmul peak {peaks[last]:.0f} GFLOP/s, {args.n}^3, {args.threads} threads):")
    for x in runs:
        if x["variant"] != PEAK and x["round"] == last:
            report(x, peaks[last])
    summary = summarise(runs, settings)
    print(f"\nover {args.rounds} rounds ({figure}):")
    for setting, s in summary.items():
        print_spread(f"{setting} step ms", s["median_ms"], "ms")
        print_spread("  step share of bf16 peak", s["step_fraction_of_peak"], "", digits=3)
    record = {"figure": figure, "auto": auto, "runs": runs, "summary": summary}
    keep("profile_step", args, record)


if __name__ == "__main__":
    main()
