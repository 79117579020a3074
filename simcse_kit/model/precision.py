"""Choosing the training and inference precision from what the hardware declares.

bf16 is only a speed-up where the matmul kernels are native. On a CPU with
avx512_bf16 or AMX, oneDNN's bf16 matmul is several times faster than fp32 and the recipes'
setting (bf16 weights with fp32 masters, fast dropout) is the fastest way to train. On a
CPU without them (most AVX2 machines; simulate with ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``) bf16 is emulated and far slower
than fp32.

On CPU ``auto`` decides from what the CPU and torch's back-ends declare
(:func:`cpu_bf16_support`), never from a timing: a timed matmul on a loaded machine
chose fp32 now and then (issue 48: 4 of 10 one-step runs with two busy processes per
core), so the same command trained in bf16 or fp32 by chance. Native bf16 needs all of:
the CPU's flags (``avx512_bf16`` or ``amx_bf16``, torch's cpuinfo:
``torch.cpu.get_capabilities()``); oneDNN allowed to use them (its effective ISA, which
honours ``ONEDNN_MAX_CPU_ISA``, at AVX512_CORE_BF16 or above); and ATen's kernels not
capped below AVX-512 (``ATEN_CPU_CAPABILITY``: a process told to run as an AVX2 machine
is one). A timing probe (:func:`cpu_matmul_speeds`) still runs where bf16 is chosen on a
CPU, and only warns when bf16 measures slower than fp32: the choice stands.

On CUDA nothing is timed: bf16 is native from compute capability 8.0 (Ampere: A100,
RTX 30xx, and later), so ``auto`` is bf16 there and fp16 with loss scaling before it
(T4, V100, P100). Not ``torch.cuda.is_bf16_supported()``: it counts bf16 that those
older cards only emulate, several times slower than their fp16. The CPU-only tricks
stay off on CUDA: the model keeps SDPA/flash attention and PyTorch's dropout. On MPS
(and other devices) ``auto`` keeps fp32: there is no cheap reliable check of what is
native. The table per device is in docs/distributed.md.

:func:`resolve_precision` and :func:`resolve_eval_precision` take the hardware check as
``cpu_check=`` and the probe as ``probe=`` (tests inject an AVX2 machine, or a probe that
says bf16 is 30x slower, that way). Several processes agree on rank 0's choice:
:func:`simcse_kit.training.wiring.folder.with_concrete_precision`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from simcse_kit.config.run import PRECISIONS
from simcse_kit.model.fastpath.internals import onednn_bf16_kernels

__all__ = [
    "NATIVE_BF16_CAPABILITY",
    "PRECISIONS",
    "PROBE_SHAPE",
    "PROBE_WARN_BELOW",
    "CpuSupport",
    "CpuCheck",
    "MatmulSpeeds",
    "PrecisionChoice",
    "Probe",
    "check_cuda_flags",
    "clear_probe_cache",
    "cpu_bf16_support",
    "cpu_matmul_speeds",
    "cuda_capability",
    "onednn_isa_cap",
    "resolve_eval_precision",
    "resolve_precision",
    "set_tf32",
    "tf32_wanted",
]

logger = logging.getLogger(__name__)

#: The probe warns when the low-precision matmul measures below this many times fp32: where
#: the flags say native it is several-fold faster, so "slower than fp32" twice in a row
#: means a kernel missing from this build (or a machine far too busy to train fast anyway).
PROBE_WARN_BELOW = 1.0
# [tokens, hidden] @ [hidden, 4 x hidden] of all-MiniLM-L6-v2's feed-forward with 32
# tokens: a millisecond or less on one core, more where bf16 is emulated.
PROBE_SHAPE = (32, 384, 1536)
_ROUNDS = 10
# Timed rounds stop once they have used this much time (at least one always runs),
# which bounds the probe to a few tens of milliseconds even where bf16 is emulated.
_BUDGET_S = 0.008

# The CPU flags (torch.cpu.get_capabilities' names) of native bf16 dot products: x86's
# AVX-512 BF16 and AMX, Arm's BF16 and SVE BF16; and of native fp16 (x86 only here).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA, or its old name DNNL_MAX_CPU_ISA) that still let
# it use bf16 instructions; ALL (the default) is the CPU's best. Below, from AVX512_CORE
# down, bf16 is converted and computed in fp32 (AVX512_CORE) or emulated outright.
_ONEDNN_BF16_CAPS = frozenset({
    "ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2",
})  # fmt: skip


class MatmulSpeeds(NamedTuple):
    """GFLOP/s of the same CPU matmul in fp32 and in a low-precision dtype."""

    fp32: float
    low: float


Probe = Callable[[torch.dtype], MatmulSpeeds]
"""``probe(dtype) -> MatmulSpeeds`` for ``dtype`` bf16 or fp16, measured together with fp32."""


@dataclass(frozen=True)
class CpuSupport:
    """Whether this process's CPU kernels run a half precision natively, and from what.

    Attributes:
        native: the half precision's matmuls run on native instructions here.
        facts: one line for the log, e.g. ``"avx512_bf16; oneDNN bf16 kernels (ISA cap
            ALL); ATen AVX512: native bf16"``.
        flags: what was read, for metrics.json: ``cpu_flags`` (the native ones the CPU
            declares), ``onednn_bf16_kernels``, ``onednn_isa_cap``, ``aten_capability``.
    """

    native: bool
    facts: str
    flags: dict[str, str | bool] = field(default_factory=dict)


CpuCheck = Callable[[], CpuSupport]
"""``cpu_check() -> CpuSupport``: the hardware check of bf16 (:func:`cpu_bf16_support`)."""

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# bf16 tensor cores arrived with Ampere (sm_80); earlier cards emulate bf16.
NATIVE_BF16_CAPABILITY = (8, 0)


def cuda_capability(device: torch.device | str = "cuda") -> tuple[int, int] | None:
    """The compute capability ``(major, minor)`` of CUDA ``device``; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return int(major), int(minor)


def onednn_isa_cap() -> str:
    """oneDNN's ISA cap for this process, upper-case: ``ONEDNN_MAX_CPU_ISA`` (or the older
    ``DNNL_MAX_CPU_ISA``), ``"ALL"`` where neither is set (oneDNN reads the same variables)."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip()
        if value:
            return value.upper()
    return "ALL"


def _declared(names: tuple[str, ...]) -> list[str]:
    caps = torch.cpu.get_capabilities()
    return [n for n in names if caps.get(n) is True]


def cpu_bf16_support() -> CpuSupport:
    """Whether bf16 matmuls are native in this process, from what the CPU declares.

    Native needs the CPU's flags (``avx512_bf16``/``amx_bf16``; on Arm ``bf16``), oneDNN
    on and allowed to use them (its bf16 kernels, :func:`~simcse_kit.model.fastpath.internals.onednn_bf16_kernels`,
    and an ISA cap at or above AVX512_CORE_BF16) and, on x86, ATen's kernels at AVX-512
    (``torch.backends.cpu.get_cpu_capability()``, which honours ``ATEN_CPU_CAPABILITY``).
    Nothing is timed: the answer is the same on a busy and an idle machine.
    """
    flags = _declared(BF16_FLAGS)
    cap = onednn_isa_cap()
    aten = torch.backends.cpu.get_cpu_capability()
    onednn = torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)
    kernels = onednn and onednn_bf16_kernels()
    x86 = torch.cpu.get_capabilities().get("architecture") in ("x86_64", "x86")
    found: dict[str, str | bool] = {
        "cpu_flags": " ".join(flags), "onednn_bf16_kernels": kernels, "onednn_isa_cap": cap, "aten_capability": aten,
    }  # fmt: skip
    missing = []
    if not flags:
        missing.append(f"no {'/'.join(BF16_FLAGS[:2] if x86 else BF16_FLAGS[2:])} in the CPU flags")
    if not onednn:
        missing.append("oneDNN unavailable or disabled")
    elif not kernels or cap not in _ONEDNN_BF16_CAPS:
        missing.append(f"oneDNN capped at {cap} (ONEDNN_MAX_CPU_ISA)" if cap != "ALL" else "no oneDNN bf16 kernels")
    if x86 and aten != "AVX512":
        missing.append(f"ATen kernels at {aten} (ATEN_CPU_CAPABILITY)")
    if missing:
        return CpuSupport(False, f"{'; '.join(missing)}: no native bf16", found)
    return CpuSupport(True, f"{' '.join(flags)}; oneDNN bf16 kernels (ISA cap {cap}); ATen {aten}: native bf16", found)


def _cpu_fp16_support() -> CpuSupport:
    """Whether fp16 matmuls are native on this CPU (``avx512_fp16``/``amx_fp16``): only
    asked for an explicit ``fp16``, which ``auto`` never picks on a CPU."""
    flags = _declared(FP16_FLAGS)
    if flags:
        return CpuSupport(True, f"{' '.join(flags)}: native fp16", {"cpu_flags": " ".join(flags)})
    return CpuSupport(False, f"no {'/'.join(FP16_FLAGS)} in the CPU flags: fp16 emulated", {"cpu_flags": ""})


_cache: dict[tuple[torch.dtype, tuple[int, int, int]], MatmulSpeeds] = {}


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses and why.

    Attributes:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` (Accelerate's values).
        bf16_weights: run the model in bf16 with fp32 master weights; only ever true
            together with ``mixed_precision == "bf16"``.
        fast_dropout: swap in :mod:`simcse_kit.model.fastpath`'s dropout.
        reason: one line for the log, e.g. ``"cpu: avx512_bf16; oneDNN bf16 kernels (ISA
            cap ALL); ATen AVX512: native bf16 -> bf16, bf16 weights, fast dropout (auto)"``.
        probe: what the warning-only timing measured, for metrics.json: ``fp32_gflops``,
            ``bf16_gflops`` (or ``fp16_gflops``) and their ratio; empty when nothing was timed.
        decided_by: what decided, for metrics.json: the hardware facts (``"cpu: ..."``,
            ``"cuda: compute capability 8.0 ..."``) or ``"requested bf16"`` (with the CPU's
            facts where they were read for ``bf16_weights``/``fast_dropout``); with several
            processes, ``"rank 0 of N: ..."`` (every process follows rank 0).
        hardware: the flags read (:attr:`CpuSupport.flags`); empty off the CPU.
    """

    mixed_precision: str
    bf16_weights: bool
    fast_dropout: bool
    reason: str
    probe: dict[str, float] = field(default_factory=dict)
    decided_by: str = ""
    hardware: dict[str, str | bool] = field(default_factory=dict)


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
    thread (the default probe; it only ever warns, see :data:`PROBE_WARN_BELOW`).

    It times whatever kernel actually runs (oneDNN's native or emulated bf16, or ATen's
    fallback) and is cached per process, dtype and shape.

    One thread, because only the ratio between dtypes matters and a multi-threaded
    matmul on a busy machine is not a measurement: with one core taken by another
    process, oneDNN's threads wait on each other at every barrier and a 2-thread fp32
    call ran 50x slower than alone.

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


def _timed(name: str, probe: Probe) -> dict[str, float]:
    """Time a ``name`` ("bf16"/"fp16") matmul against fp32 where the flags say it is native;
    warn (never decide) when it measures slower than fp32 twice in a row.

    Returns:
        The numbers for metrics.json: ``fp32_gflops``, ``{name}_gflops``, ``{name}_speedup``.
    """
    speeds = probe(_DTYPES[name])
    if speeds.low < PROBE_WARN_BELOW * speeds.fp32:
        clear_probe_cache()  # one hiccup of a busy machine is not worth a warning: time again
        speeds = max(speeds, probe(_DTYPES[name]), key=lambda s: s.low / s.fp32)
    ratio = speeds.low / speeds.fp32
    if ratio < PROBE_WARN_BELOW:
        logger.warning(
            "%s matmul measured %.2gx fp32 on this CPU, whose flags say %s is native: the precision stays as "
            "decided (the machine may be busy); if runs are slow, set train.mixed_precision no",
            name,
            ratio,
            name,
        )
    return {"fp32_gflops": round(speeds.fp32, 2), f"{name}_gflops": round(speeds.low, 2), f"{name}_speedup": round(ratio, 3)}


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
    numbers: dict[str, float] = field(default_factory=dict)
    flags: dict[str, str | bool] = field(default_factory=dict)


def _resolve_mode(requested: str, device: torch.device | str, cpu_check: CpuCheck, probe: Probe, *, auto_fp16: bool) -> _Hardware:
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
        return _Hardware(mode, False, f"cuda: compute capability {cc} ({'native' if has_bf16 else 'no native'} bf16)")
    if kind != "cpu":  # mps, xpu, ...: no reliable check here, so auto keeps fp32
        return _Hardware("no" if requested == "auto" else requested, False, f"{kind}: not checked")
    if requested == "no":  # nothing depends on the hardware: check nothing
        return _Hardware("no", False, "cpu")
    name = "fp16" if requested == "fp16" else "bf16"
    support = _cpu_fp16_support() if name == "fp16" else cpu_check()
    if requested != "auto" and not support.native:
        logger.warning(
            "precision %s requested but %s is not native on this CPU (%s): it will run slower than fp32; "
            "use precision auto or no",
            name,
            name,
            support.facts,
        )
    mode = ("bf16" if support.native else "no") if requested == "auto" else requested
    numbers = _timed(name, probe) if support.native and mode == name else {}
    return _Hardware(mode, support.native and name == "bf16", f"cpu: {support.facts}", numbers, support.flags)


def _choice(requested: str, hw: _Hardware, bf16_weights: bool | str, fast_dropout: bool | str) -> PrecisionChoice:
    # The CPU speed tricks pay off only where the model really runs in native bf16.
    cpu_fast = hw.cpu_native_bf16 and hw.mode == "bf16"
    weights = _flag(bf16_weights, cpu_fast, allowed=hw.mode == "bf16")
    dropout = _flag(fast_dropout, cpu_fast)
    how = "auto" if requested == "auto" else f"requested {requested}"
    reason = f"{hw.facts} -> {_summary(hw.mode, weights, dropout)} ({how})"
    logger.info("precision: %s", reason)
    # An explicit precision decides itself; the hardware facts still decided its "auto" flags.
    decided_by = hw.facts if requested == "auto" else f"requested {requested}" + (f"; {hw.facts}" if hw.flags else "")
    return PrecisionChoice(hw.mode, weights, dropout, reason, hw.numbers, decided_by, hw.flags)


def resolve_precision(
    requested: str,
    device: torch.device | str,
    *,
    bf16_weights: bool | str = "auto",
    fast_dropout: bool | str = "auto",
    cpu_check: CpuCheck | None = None,
    probe: Probe | None = None,
) -> PrecisionChoice:
    """The training precision for ``device``, decided by this process alone.

    ``auto`` is bf16 on a GPU with native bf16 (compute capability 8.0+), fp16 with loss
    scaling on one before it, fp32 on MPS, and on CPU bf16 only where the CPU and torch's
    back-ends declare native bf16 (:func:`cpu_bf16_support`), else fp32: the same answer
    however busy the machine. ``no``/``fp16``/``bf16`` are honoured as given; bf16 or
    fp16 on a CPU where they are not native, or bf16 on a GPU without it, logs a WARNING.
    Where bf16 (fp16) runs on a CPU that declares it native, a timing probe may warn that
    it measured slower than fp32; it never changes the choice.

    ``bf16_weights`` and ``fast_dropout`` given as ``"auto"`` are on only on a CPU with
    native bf16 at bf16 precision. Given explicitly they are honoured, except that bf16
    weights need bf16 precision (at any other precision the model stays fp32, as before).

    Args:
        requested: one of ``PRECISIONS``.
        device: where the model trains (``"cpu"``, ``"cuda:0"``, a ``torch.device``).
        bf16_weights: ``"auto"``, True or False.
        fast_dropout: ``"auto"``, True or False.
        cpu_check: ``cpu_check() -> CpuSupport``; :func:`cpu_bf16_support` by default.
            Called only on CPU and only for ``auto`` and ``bf16``.
        probe: ``probe(dtype) -> MatmulSpeeds``; :func:`cpu_matmul_speeds` by default.
            Called only on CPU where the chosen bf16 or fp16 is declared native.

    Returns:
        The choice, with a one-line reason (also logged at INFO).
    """
    _check_flag("bf16_weights", bf16_weights)
    _check_flag("fast_dropout", fast_dropout)
    hw = _resolve_mode(requested, device, cpu_check or cpu_bf16_support, probe or cpu_matmul_speeds, auto_fp16=True)
    return _choice(requested, hw, bf16_weights, fast_dropout)


def resolve_eval_precision(
    requested: str, device: torch.device | str, *, cpu_check: CpuCheck | None = None, probe: Probe | None = None
) -> PrecisionChoice:
    """The inference (encoding) precision for ``device``.

    ``auto`` is bf16 where bf16 is native (a GPU from Ampere on, a CPU that declares it:
    :func:`cpu_bf16_support`) and fp32 everywhere else: inference has no loss scaler, so
    ``auto`` never picks fp16 for it. Explicit values are returned as given, with the
    same warnings as :func:`resolve_precision`. ``bf16_weights`` and ``fast_dropout``
    are always off (they are training settings).
    """
    hw = _resolve_mode(requested, device, cpu_check or cpu_bf16_support, probe or cpu_matmul_speeds, auto_fp16=False)
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


def check_cuda_flags(device: torch.device | str, *, fast_dropout: bool, bf16_weights: bool, adapter: bool = False) -> list[str]:
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
