"""Choosing the training and inference precision from what the hardware actually does.

bf16 is only a speed-up where the matmul kernels are native. On a CPU with
avx512_bf16 or AMX, oneDNN's bf16 matmul is several times faster than fp32 and the recipes'
setting (bf16 weights with fp32 masters, fast dropout) is the fastest way to train. On a
CPU without them (most AVX2 machines; simulate with ``ONEDNN_MAX_CPU_ISA=AVX2``) bf16 is
emulated and far slower than fp32. CPU
flags do not settle it (oneDNN may be capped below what the CPU has, or built without a
kernel), so on CPU ``auto`` *measures*: one few-millisecond bf16 and fp32
matmul of a model-like shape, cached per process.

On CUDA nothing is timed: bf16 is native from compute capability 8.0 (Ampere: A100,
RTX 30xx, and later), so ``auto`` is bf16 there and fp16 with loss scaling before it
(T4, V100, P100). Not ``torch.cuda.is_bf16_supported()``: it counts bf16 that those
older cards only emulate, several times slower than their fp16. The CPU-only tricks
stay off on CUDA: the model keeps SDPA/flash attention and PyTorch's dropout. On MPS
(and other devices) ``auto`` keeps fp32: there is no cheap reliable check of what is
native. The table per device is in docs/distributed.md.

The measuring function is :func:`cpu_matmul_speeds`; :func:`resolve_precision` and
:func:`resolve_eval_precision` take any callable of the same signature as ``probe=``
(tests inject a "bf16 is 30x slower" machine that way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from simcse_kit.config.run import PRECISIONS

__all__ = [
    "BF16_SPEEDUP_THRESHOLD",
    "NATIVE_BF16_CAPABILITY",
    "PRECISIONS",
    "PROBE_SHAPE",
    "PrecisionChoice",
    "Probe",
    "MatmulSpeeds",
    "check_cuda_flags",
    "clear_probe_cache",
    "cpu_matmul_speeds",
    "cuda_capability",
    "resolve_eval_precision",
    "resolve_precision",
    "set_tf32",
    "tf32_wanted",
]

logger = logging.getLogger(__name__)

# A low-precision matmul must beat fp32 by this factor to count as native: the ratio is
# several-fold where bf16 is native and far below 1 where it is emulated, so 1.2 sits far
# from both and keeps a machine where bf16 merely ties fp32 (AVX-512 without bf16) on fp32.
BF16_SPEEDUP_THRESHOLD = 1.2
# [tokens, hidden] @ [hidden, 4 x hidden] of all-MiniLM-L6-v2's feed-forward with 32
# tokens: a millisecond or less on one core, more where bf16 is emulated.
PROBE_SHAPE = (32, 384, 1536)
_ROUNDS = 10
# Timed rounds stop once they have used this much time (at least one always runs),
# which bounds the probe to a few tens of milliseconds even where bf16 is emulated.
_BUDGET_S = 0.008


class MatmulSpeeds(NamedTuple):
    """GFLOP/s of the same CPU matmul in fp32 and in a low-precision dtype."""

    fp32: float
    low: float


Probe = Callable[[torch.dtype], MatmulSpeeds]
"""``probe(dtype) -> MatmulSpeeds`` for ``dtype`` bf16 or fp16, measured together with fp32."""

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# bf16 tensor cores arrived with Ampere (sm_80); earlier cards emulate bf16.
NATIVE_BF16_CAPABILITY = (8, 0)


def cuda_capability(device: torch.device | str = "cuda") -> tuple[int, int] | None:
    """The compute capability ``(major, minor)`` of CUDA ``device``; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return int(major), int(minor)


_cache: dict[tuple[torch.dtype, tuple[int, int, int]], MatmulSpeeds] = {}


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses and why.

    Attributes:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` (Accelerate's values).
        bf16_weights: run the model in bf16 with fp32 master weights; only ever true
            together with ``mixed_precision == "bf16"``.
        fast_dropout: swap in :mod:`simcse_kit.model.fastpath`'s dropout.
        reason: one line for the log, e.g. ``"cpu: bf16 matmul 4.2x fp32 (native bf16)
            -> bf16, bf16 weights, fast dropout"``.
        probe: what was measured, for metrics.json: ``fp32_gflops``, ``bf16_gflops``
            (or ``fp16_gflops``) and their ratio; empty when nothing was timed.
    """

    mixed_precision: str
    bf16_weights: bool
    fast_dropout: bool
    reason: str
    probe: dict[str, float] = field(default_factory=dict)


def clear_probe_cache() -> None:
    """Forget the measured matmul speeds (benchmarks re-time; tests isolate)."""
    _cache.clear()


def _warm_up(a: torch.Tensor, b: torch.Tensor) -> None:
    """First calls of ``a @ b``: pay oneDNN's one-time start-up for the dtype on 4 rows,
    then build the full shape's kernel only where a full call is cheap (an emulated bf16
    call, ~15 ms, is made once, timed, and not again)."""
    rows = 4
    start = time.perf_counter()
    torch.mm(a[:rows], b)
    if (time.perf_counter() - start) * a.shape[0] / rows < _BUDGET_S:
        torch.mm(a, b)


def _best_seconds(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """Best wall time of each ``a @ b`` in ``pairs``, timed in alternation.

    Alternating puts a hiccup of the machine (another process taking the core for a few
    milliseconds) on both dtypes alike instead of on all the calls of one of them.
    """
    for a, b in pairs:
        _warm_up(a, b)
    best = [float("inf")] * len(pairs)
    spent = 0.0
    for _ in range(_ROUNDS):
        for i, (a, b) in enumerate(pairs):
            start = time.perf_counter()
            torch.mm(a, b)
            took = time.perf_counter() - start
            best[i] = min(best[i], took)
            spent += took
        if spent > _BUDGET_S:
            break
    return best


def cpu_matmul_speeds(dtype: torch.dtype, shape: tuple[int, int, int] = PROBE_SHAPE) -> MatmulSpeeds:
    """Measured GFLOP/s of a ``[m, k] @ [k, n]`` CPU matmul in fp32 and in ``dtype``, on one
    thread (the default probe).

    It times whatever kernel actually runs (oneDNN's native or emulated bf16, or ATen's
    fallback) and is cached per process, dtype and shape: oneDNN reads
    ``ONEDNN_MAX_CPU_ISA`` once per process, so the answer cannot change within one.

    One thread, because only the ratio between dtypes matters and a multi-threaded
    matmul on a busy machine is not a measurement: with one core taken by another
    process, oneDNN's threads wait on each other at every barrier and a 2-thread fp32
    call ran 50x slower than alone. Emulated bf16 is single-threaded anyway, so the
    ratio with more threads is only further from the threshold.

    Args:
        dtype: ``torch.bfloat16`` or ``torch.float16``.
        shape: ``(m, k, n)``.

    Returns:
        ``2 m k n / best seconds / 1e9`` for fp32 and for ``dtype``.
    """
    key = (dtype, shape)
    if key not in _cache:
        m, k, n = shape
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            # No autograd graph and no outer autocast: the dtype asked for is the one timed.
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                seconds = _best_seconds([(a, b), (a.to(dtype), b.to(dtype))])
        finally:
            torch.set_num_threads(threads)
        _cache[key] = MatmulSpeeds(*(2 * m * k * n / s / 1e9 for s in seconds))
    return _cache[key]


def _check_flag(name: str, value: bool | str) -> None:
    if value != "auto" and not isinstance(value, bool):
        raise ValueError(f"{name} must be 'auto', true or false, not {value!r}")


def _check_precision(requested: str) -> None:
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {requested!r}")


def _cpu_speed(name: str, probe: Probe) -> tuple[float, dict[str, float], str]:
    """How much faster a ``name`` ("bf16"/"fp16") matmul is than fp32 on this CPU.

    Returns:
        ``(ratio, probe numbers, description)``; ``ratio`` is 0 where oneDNN is absent
        or disabled (ATen's fallback kernel is not worth timing).
    """
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return 0.0, {}, f"{name} matmul without oneDNN (not native)"
    fp32, low = probe(_DTYPES[name])
    ratio = low / fp32
    native = ratio >= BF16_SPEEDUP_THRESHOLD
    numbers = {"fp32_gflops": round(fp32, 2), f"{name}_gflops": round(low, 2), f"{name}_speedup": round(ratio, 3)}
    return ratio, numbers, f"{name} matmul {ratio:.2g}x fp32 ({'native' if native else 'emulated'} {name})"


def _flag(value: bool | str, auto: bool, allowed: bool = True) -> bool:
    return allowed and (auto if value == "auto" else bool(value))


def _summary(choice: str, bf16_weights: bool, fast_dropout: bool) -> str:
    parts = [{"no": "fp32", "fp16": "fp16", "bf16": "bf16"}[choice]]
    parts += ["bf16 weights"] if bf16_weights else []
    parts += ["fast dropout"] if fast_dropout else []
    return ", ".join(parts)


@dataclass(frozen=True)
class _Hardware:
    """What :func:`_resolve_mode` found: the precision, whether bf16 is native, why."""

    mode: str
    cpu_native_bf16: bool
    facts: str
    numbers: dict[str, float]


def _resolve_mode(requested: str, device: torch.device | str, probe: Probe, *, auto_fp16: bool) -> _Hardware:
    """The precision for ``requested`` on ``device`` and the facts behind it (warns)."""
    _check_precision(requested)
    kind = torch.device(device).type
    if kind == "cuda":
        capability = cuda_capability(device)
        has_bf16 = capability is not None and capability >= NATIVE_BF16_CAPABILITY
        if requested == "bf16" and not has_bf16:
            logger.warning("precision bf16 requested on a GPU without native bf16 (before Ampere): expect slow emulation")
        fallback = "fp16" if auto_fp16 else "no"
        mode = ("bf16" if has_bf16 else fallback) if requested == "auto" else requested
        cc = "?" if capability is None else f"{capability[0]}.{capability[1]}"
        return _Hardware(mode, False, f"cuda: compute capability {cc} ({'native' if has_bf16 else 'no native'} bf16)", {})
    if kind != "cpu":  # mps, xpu, ...: no reliable check here, so auto keeps fp32
        return _Hardware("no" if requested == "auto" else requested, False, f"{kind}: not probed", {})
    if requested == "no":  # nothing depends on the hardware: time nothing
        return _Hardware("no", False, "cpu", {})
    name = "fp16" if requested == "fp16" else "bf16"
    ratio, numbers, facts = _cpu_speed(name, probe)
    native = ratio >= BF16_SPEEDUP_THRESHOLD
    if requested != "auto" and not native:
        logger.warning(
            "precision %s requested but %s is not native on this CPU (%s): it will run slower than fp32; "
            "use precision auto or no",
            name,
            name,
            facts,
        )
    mode = ("bf16" if native else "no") if requested == "auto" else requested
    return _Hardware(mode, native and name == "bf16", f"cpu: {facts}", numbers)


def _choice(requested: str, hw: _Hardware, bf16_weights: bool | str, fast_dropout: bool | str) -> PrecisionChoice:
    # The CPU speed tricks pay off only where the model really runs in native bf16.
    cpu_fast = hw.cpu_native_bf16 and hw.mode == "bf16"
    weights = _flag(bf16_weights, cpu_fast, allowed=hw.mode == "bf16")
    dropout = _flag(fast_dropout, cpu_fast)
    how = "auto" if requested == "auto" else f"requested {requested}"
    reason = f"{hw.facts} -> {_summary(hw.mode, weights, dropout)} ({how})"
    logger.info("precision: %s", reason)
    return PrecisionChoice(hw.mode, weights, dropout, reason, hw.numbers)


def resolve_precision(
    requested: str,
    device: torch.device | str,
    *,
    bf16_weights: bool | str = "auto",
    fast_dropout: bool | str = "auto",
    probe: Probe | None = None,
) -> PrecisionChoice:
    """The training precision for ``device``.

    ``auto`` is bf16 on a GPU with native bf16 (compute capability 8.0+), fp16 with loss
    scaling on one before it, fp32 on MPS, and on CPU bf16
    only where a measured bf16 matmul beats fp32 by ``BF16_SPEEDUP_THRESHOLD`` (else fp32).
    ``no``/``fp16``/``bf16`` are honoured as given; bf16 or fp16 on a CPU where they are
    not native, or bf16 on a GPU without it, logs a WARNING with the measured ratio.

    ``bf16_weights`` and ``fast_dropout`` given as ``"auto"`` are on only on a CPU with
    native bf16 at bf16 precision. Given explicitly they are honoured, except that bf16
    weights need bf16 precision (at any other precision the model stays fp32, as before).

    Args:
        requested: one of ``PRECISIONS``.
        device: where the model trains (``"cpu"``, ``"cuda:0"``, a ``torch.device``).
        bf16_weights: ``"auto"``, True or False.
        fast_dropout: ``"auto"``, True or False.
        probe: ``probe(dtype) -> MatmulSpeeds``; :func:`cpu_matmul_speeds` by default.
            Called only on CPU and only for ``auto``, ``bf16`` and ``fp16``.

    Returns:
        The choice, with a one-line reason (also logged at INFO).
    """
    _check_flag("bf16_weights", bf16_weights)
    _check_flag("fast_dropout", fast_dropout)
    hw = _resolve_mode(requested, device, probe or cpu_matmul_speeds, auto_fp16=True)
    return _choice(requested, hw, bf16_weights, fast_dropout)


def resolve_eval_precision(requested: str, device: torch.device | str, *, probe: Probe | None = None) -> PrecisionChoice:
    """The inference (encoding) precision for ``device``.

    ``auto`` is bf16 where bf16 is native (a GPU from Ampere on, a CPU whose measured
    bf16 matmul beats fp32) and fp32 everywhere else: inference has no loss scaler, so
    ``auto`` never picks fp16 for it. Explicit values are returned as given, with the
    same warnings as :func:`resolve_precision`. ``bf16_weights`` and ``fast_dropout``
    are always off (they are training settings).
    """
    hw = _resolve_mode(requested, device, probe or cpu_matmul_speeds, auto_fp16=False)
    return _choice(requested, hw, False, False)


def tf32_wanted(device: torch.device | str, capability: tuple[int, int] | None = None) -> bool:
    """Whether fp32 matmuls on ``device`` should run on TF32 tensor cores.

    On CUDA from compute capability 8.0 (Ampere) TF32 runs fp32 matmuls several times
    faster with a 10-bit mantissa on the inputs, which contrastive fine-tuning does not
    notice (PyTorch leaves it off by default for matmuls). Elsewhere there is no TF32.

    Args:
        device: the training device.
        capability: the device's compute capability (default: read from the device).
    """
    if torch.device(device).type != "cuda":
        return False
    capability = capability if capability is not None else cuda_capability(device)
    return capability is not None and capability >= NATIVE_BF16_CAPABILITY


def set_tf32(device: torch.device | str, capability: tuple[int, int] | None = None) -> bool:
    """Turn TF32 on for fp32 matmuls and convolutions where :func:`tf32_wanted` says so
    (process-wide PyTorch flags; nothing is changed elsewhere); logs and returns the decision."""
    on = tf32_wanted(device, capability)
    if on:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    logger.info("tf32 for fp32 matmuls: %s", "on (CUDA, compute capability >= 8.0)" if on else "off (not Ampere+ CUDA)")
    return on


def check_cuda_flags(
    device: torch.device | str, *, fast_dropout: bool, bf16_weights: bool, adapter: bool = False
) -> list[str]:
    """Warn about the CPU speed tricks set on for a CUDA device, where they do not pay.

    ``fast_dropout`` replaces SDPA's fused attention with an explicit softmax attention
    (:mod:`simcse_kit.model.fastpath.dropout`): on a GPU that is slower, not faster.
    ``bf16_weights`` stands in for autocast on CPUs (:mod:`simcse_kit.model.fastpath.bf16`);
    CUDA's autocast is fast already. Both still run as asked (a recipe shared between a
    CPU and a GPU machine keeps working); ``auto`` never turns them on for CUDA.
    With an ``adapter`` (LoRA) ``bf16_weights`` is no speed trick but the memory option
    (the frozen base stored in bf16, the adapter trained through fp32 masters): not warned
    about, only logged as not verified on CUDA by the test suite.

    Returns:
        The warnings logged (empty off CUDA or with both off).
    """
    if torch.device(device).type != "cuda":
        return []
    warnings = []
    if fast_dropout:
        warnings.append(
            "train.fast_dropout is on for a CUDA device: it replaces SDPA's fused attention with an explicit "
            "softmax attention, which is slower there; set it to auto or false"
        )
    if bf16_weights and adapter:
        logger.info(
            "train.bf16_weights with a LoRA adapter on CUDA: the frozen base in bf16, the adapter through fp32 "
            "masters (verified on CPU; not on CUDA by the test suite)"
        )
    elif bf16_weights:
        warnings.append(
            "train.bf16_weights is on for a CUDA device: it is a CPU speed trick (CUDA's bf16 autocast is fast); "
            "set it to auto or false"
        )
    for text in warnings:
        logger.warning(text)
    return warnings
