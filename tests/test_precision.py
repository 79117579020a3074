"""``auto`` precision: the choice per hardware, with the hardware check and the probe
injected, and the real check (with the kernels limited to AVX2, and under load)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TinyRun

from simcse_kit.model import precision
from simcse_kit.model.precision import CpuSupport, MatmulSpeeds, PrecisionChoice, resolve_eval_precision, resolve_precision

REPO = Path(__file__).resolve().parents[1]


def probe_of(fp32: float, low: float) -> precision.Probe:
    """A probe answering ``fp32`` GFLOP/s for fp32 and ``low`` for bf16 or fp16."""
    return lambda dtype: MatmulSpeeds(fp32, low)


EMULATED = probe_of(60.0, 2.0)  # bf16 30x slower than fp32 (AVX2: ~1.9 vs ~55 measured; or a busy core)
NATIVE = probe_of(100.0, 240.0)  # bf16 2.4x faster (avx512_bf16 / AMX)
BF16_CPU = CpuSupport(
    True, "avx512_bf16; oneDNN bf16 kernels (ISA cap ALL); ATen AVX512: native bf16", {"cpu_flags": "avx512_bf16"}
)
AVX2_CPU = CpuSupport(False, "oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA): no native bf16", {"cpu_flags": ""})


def check_of(support: CpuSupport) -> precision.CpuCheck:
    return lambda: support


def no_probe(dtype: torch.dtype) -> MatmulSpeeds:
    raise AssertionError(f"the probe must not run here (asked for {dtype})")


def no_check() -> CpuSupport:
    raise AssertionError("the hardware check must not run here")


def cuda(monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    """A GPU with native bf16 (an A100, compute capability 8.0) or without (a T4, 7.5)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0) if bf16 else (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # torch counts emulation


def test_auto_on_a_cpu_without_native_bf16_trains_in_fp32_without_timing() -> None:
    choice = resolve_precision("auto", "cpu", cpu_check=check_of(AVX2_CPU), probe=no_probe)
    facts = "cpu: oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA): no native bf16"
    assert choice == PrecisionChoice(
        mixed_precision="no",
        bf16_weights=False,
        fast_dropout=False,
        reason=f"{facts} -> fp32 (auto)",
        probe={},
        decided_by=facts,
        hardware={"cpu_flags": ""},
    )


def test_auto_on_native_bf16_cpu_uses_the_fast_recipe() -> None:
    choice = resolve_precision("auto", torch.device("cpu"), cpu_check=check_of(BF16_CPU), probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", True, True)
    facts = "cpu: avx512_bf16; oneDNN bf16 kernels (ISA cap ALL); ATen AVX512: native bf16"
    assert choice.reason == f"{facts} -> bf16, bf16 weights, fast dropout (auto)"
    assert choice.decided_by == facts and choice.hardware == {"cpu_flags": "avx512_bf16"}
    assert choice.probe == {"fp32_gflops": 100.0, "bf16_gflops": 240.0, "bf16_speedup": 2.4}


@pytest.mark.parametrize("bf16_gflops", [1.2, 2.0, 59.0, 119.0, 240.0])
def test_auto_on_a_bf16_cpu_is_bf16_whatever_the_probe_measures(caplog: pytest.LogCaptureFixture, bf16_gflops: float) -> None:
    """Issue 48: on a busy machine the timed matmul said 0.02-0.07x fp32 now and then and
    ``auto`` trained that run in fp32. The probe may only warn now (below 1x, twice)."""
    calls: list[torch.dtype] = []

    def busy(dtype: torch.dtype) -> MatmulSpeeds:
        calls.append(dtype)
        return MatmulSpeeds(60.0, bf16_gflops)

    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("auto", "cpu", cpu_check=check_of(BF16_CPU), probe=busy)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", True, True)
    slower = bf16_gflops < 60.0
    assert calls == [torch.bfloat16] * (2 if slower else 1)  # timed again before warning
    assert ("bf16 matmul measured" in caplog.text and "the precision stays as decided" in caplog.text) is slower
    assert choice.probe["bf16_speedup"] == round(bf16_gflops / 60.0, 3)


def test_the_probe_warns_only_when_slower_twice(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([MatmulSpeeds(60.0, 1.5), MatmulSpeeds(60.0, 150.0)])  # a hiccup, then the real speed
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("auto", "cpu", cpu_check=check_of(BF16_CPU), probe=lambda dtype: next(answers))
    assert choice.mixed_precision == "bf16" and caplog.records == []
    assert choice.probe == {"fp32_gflops": 60.0, "bf16_gflops": 150.0, "bf16_speedup": 2.5}


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16"), (False, "fp16")])
def test_auto_on_cuda_follows_bf16_support(monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: str) -> None:
    cuda(monkeypatch, bf16)
    choice = resolve_precision("auto", "cuda:0", cpu_check=no_check, probe=no_probe)
    # On a GPU the model keeps SDPA/flash attention and PyTorch's dropout, and fp32 weights.
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == (expected, False, False)
    support = "compute capability 8.0 (native bf16)" if bf16 else "compute capability 7.5 (no native bf16)"
    assert choice.reason == f"cuda: {support} -> {expected} (auto)"
    assert choice.decided_by == f"cuda: {support}"
    assert choice.probe == {} and choice.hardware == {}


def test_explicit_bf16_on_a_cpu_without_it_is_honoured_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("bf16", "cpu", cpu_check=check_of(AVX2_CPU), probe=no_probe)
    assert choice.mixed_precision == "bf16"
    assert (choice.bf16_weights, choice.fast_dropout) == (False, False)  # auto: not native
    assert choice.decided_by == "requested bf16; cpu: oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA): no native bf16"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "oneDNN capped at AVX2" in record.getMessage() and "slower than fp32" in record.getMessage()


def test_explicit_bf16_on_native_cpu_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("bf16", "cpu", cpu_check=check_of(BF16_CPU), probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", True, True)
    assert choice.reason.endswith("(requested bf16)")
    assert caplog.records == []


def test_explicit_flags_are_honoured() -> None:
    choice = resolve_precision("bf16", "cpu", bf16_weights=True, fast_dropout=True, cpu_check=check_of(AVX2_CPU))
    assert (choice.bf16_weights, choice.fast_dropout) == (True, True)
    choice = resolve_precision("auto", "cpu", bf16_weights=False, fast_dropout=False, cpu_check=check_of(BF16_CPU), probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", False, False)


def test_explicit_no_checks_nothing_and_keeps_the_model_fp32() -> None:
    # bf16 weights need bf16 precision (the recipes' `--mixed-precision no` trains in fp32);
    # fast dropout does not depend on the precision.
    choice = resolve_precision("no", "cpu", bf16_weights=True, fast_dropout=True, cpu_check=no_check, probe=no_probe)
    assert choice == PrecisionChoice("no", False, True, "cpu -> fp32, fast dropout (requested no)", {}, "requested no", {})


def test_explicit_precision_on_cuda_is_honoured(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cuda(monkeypatch, bf16=False)
    assert resolve_precision("no", "cuda", cpu_check=no_check, probe=no_probe).mixed_precision == "no"
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        assert resolve_precision("bf16", "cuda", cpu_check=no_check, probe=no_probe).mixed_precision == "bf16"
    assert "without native bf16" in caplog.text


@pytest.mark.parametrize(("flags", "warns"), [((), True), (("avx512_fp16",), False), (("amx_fp16",), False)])
def test_fp16_on_cpu_follows_the_fp16_flags(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, flags: tuple[str, ...], warns: bool
) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "x86_64", **dict.fromkeys(flags, True)})
    asked: list[torch.dtype] = []

    def probe(dtype: torch.dtype) -> MatmulSpeeds:
        asked.append(dtype)
        return MatmulSpeeds(60.0, 240.0)

    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("fp16", "cpu", cpu_check=no_check, probe=probe)
    assert asked == ([] if warns else [torch.float16])  # timed only where declared native
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("fp16", False, False)
    assert ("fp16 is not native on this CPU" in caplog.text) is warns


# flags the CPU declares, oneDNN's bf16 check, ONEDNN_MAX_CPU_ISA, ATen's capability -> native?
CHECK_TABLE = [
    (("avx512_bf16",), True, None, "AVX512", True),
    (("amx_bf16", "avx512_bf16"), True, "avx512_core_amx", "AVX512", True),
    (("avx512_bf16",), True, "AVX512_CORE_BF16", "AVX512", True),
    ((), True, None, "AVX512", False),  # AVX-512 without bf16 (Skylake-X, Ice Lake)
    (("avx512_bf16",), False, "AVX2", "AVX512", False),  # oneDNN capped: bf16 emulated
    (("avx512_bf16",), True, "AVX512_CORE", "AVX512", False),  # oneDNN says bf16, but by conversion
    (("avx512_bf16",), True, None, "AVX2", False),  # ATEN_CPU_CAPABILITY=avx2: an AVX2 machine
    (("avx512_bf16",), False, "AVX2", "AVX2", False),  # the project's AVX2 environment
]


@pytest.mark.parametrize(("flags", "kernels", "cap", "aten", "native"), CHECK_TABLE)
def test_the_hardware_check_reads_flags_onednn_and_aten(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], kernels: bool, cap: str | None, aten: str, native: bool
) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "x86_64", **dict.fromkeys(flags, True)})
    monkeypatch.setattr(precision, "onednn_bf16_kernels", lambda: kernels)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: aten)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    support = precision.cpu_bf16_support()
    assert support.native is native, support.facts
    assert support.flags == {
        "cpu_flags": " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags),
        "onednn_bf16_kernels": kernels,
        "onednn_isa_cap": (cap or "ALL").upper(),
        "aten_capability": aten,
    }
    assert support.facts.endswith(": native bf16" if native else ": no native bf16")
    if not flags:
        assert "no avx512_bf16/amx_bf16 in the CPU flags" in support.facts
    if aten == "AVX2":
        assert "ATen kernels at AVX2 (ATEN_CPU_CAPABILITY)" in support.facts


def test_cpu_without_onednn_is_fp32_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    choice = resolve_precision("auto", "cpu", probe=no_probe)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("no", False, False)
    assert "oneDNN unavailable or disabled" in choice.reason


def test_other_devices_keep_fp32() -> None:
    assert resolve_precision("auto", "mps", cpu_check=no_check, probe=no_probe).mixed_precision == "no"


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", "cpu", probe=NATIVE)
    with pytest.raises(ValueError, match="bf16_weights must be 'auto', true or false"):
        resolve_precision("auto", "cpu", bf16_weights="yes", probe=NATIVE)
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_eval_precision("half", "cpu", probe=NATIVE)


def test_eval_auto_is_bf16_only_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    native = resolve_eval_precision("auto", "cpu", cpu_check=check_of(BF16_CPU), probe=EMULATED)
    assert (native.mixed_precision, native.bf16_weights, native.fast_dropout) == ("bf16", False, False)
    assert native.reason == "cpu: avx512_bf16; oneDNN bf16 kernels (ISA cap ALL); ATen AVX512: native bf16 -> bf16 (auto)"
    assert resolve_eval_precision("auto", "cpu", cpu_check=check_of(AVX2_CPU), probe=no_probe).mixed_precision == "no"
    assert resolve_eval_precision("no", "cpu", cpu_check=no_check, probe=no_probe).mixed_precision == "no"
    assert resolve_eval_precision("fp16", "cpu", probe=EMULATED).mixed_precision == "fp16"
    cuda(monkeypatch, bf16=True)
    assert resolve_eval_precision("auto", "cuda", cpu_check=no_check, probe=no_probe).mixed_precision == "bf16"
    cuda(monkeypatch, bf16=False)  # fp16 has no loss scaler at inference: fp32
    assert resolve_eval_precision("auto", "cuda", cpu_check=no_check, probe=no_probe).mixed_precision == "no"


def ticking_clock(monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """The probe's clock advances ``step`` seconds a reading: its budget decisions known, not timed
    (on a busy machine a 4-row call preempted for a few ms skipped the full-shape warm-up)."""
    now = iter(range(1_000_000))
    monkeypatch.setattr(precision, "time", SimpleNamespace(perf_counter=lambda: step * next(now)))


def test_probe_is_cached_alternates_and_restores_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (8, 16, 24)  # tiny: this test is about the bookkeeping, not the speed
    calls: list[tuple[int, torch.dtype, int]] = []
    real_mm = torch.mm

    def counting_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append((a.shape[0], a.dtype, torch.get_num_threads()))
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", counting_mm)
    ticking_clock(monkeypatch, 1e-6)  # every call cheap: full warm-up, every round
    precision.clear_probe_cache()
    threads = torch.get_num_threads()
    speeds = precision.cpu_matmul_speeds(torch.bfloat16, shape)
    assert speeds.fp32 > 0 and speeds.low > 0
    assert torch.get_num_threads() == threads
    f32, bf16 = torch.float32, torch.bfloat16
    # Warm-up of each dtype on 4 rows then the full shape, then timed rounds alternating
    # fp32 and bf16 (1 to 10 of them): all on one thread.
    assert calls[:4] == [(4, f32, 1), (8, f32, 1), (4, bf16, 1), (8, bf16, 1)]
    assert calls[4:] == [(8, f32, 1), (8, bf16, 1)] * precision._ROUNDS
    calls.clear()
    assert precision.cpu_matmul_speeds(torch.bfloat16, shape) == speeds
    assert calls == []
    precision.clear_probe_cache()


def test_probe_skips_a_dear_warm_up_and_stops_at_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-row call that would make the full shape cost over the budget is not followed by a
    full-shape warm-up, and the timed rounds stop once their time passes the budget."""
    calls: list[int] = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(a.shape[0]) or real_mm(a, b))
    ticking_clock(monkeypatch, precision._BUDGET_S)  # each reading a budget later: every call "takes" it
    precision.clear_probe_cache()
    precision.cpu_matmul_speeds(torch.bfloat16, (8, 16, 24))
    assert calls == [4, 4, 8, 8]  # two warm-ups of 4 rows, then one round (fp32, bf16): over budget
    precision.clear_probe_cache()


DECIDE_SCRIPT = """
import json, sys, time
from simcse_kit.model.precision import clear_probe_cache, resolve_precision
out = []
for _ in range(int(sys.argv[1])):
    clear_probe_cache()  # each decision as in a fresh process, the timing probe included
    start = time.perf_counter()
    choice = resolve_precision("auto", "cpu")
    out.append({"mode": choice.mixed_precision, "seconds": time.perf_counter() - start, "reason": choice.reason,
                "weights": choice.bf16_weights, "dropout": choice.fast_dropout, "hardware": choice.hardware})
print(json.dumps(out))
"""
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
BUSY = "while True: pass"


def decide(avx2: bool, times: int = 1) -> list[dict]:
    """``auto`` decided ``times`` times in a fresh process, the real checks, with the
    kernels limited to AVX2 (the project's AVX2 environment) or not limited at all (this
    test file also runs under the AVX2 environment in CI: it is removed for the latter)."""
    env = {k: v for k, v in os.environ.items() if k not in (*AVX2_ENV, "DNNL_MAX_CPU_ISA")}
    env |= AVX2_ENV if avx2 else {}
    cmd = [sys.executable, "-c", DECIDE_SCRIPT, str(times)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def loaded_machine(per_core: int = 2) -> Iterator[None]:
    """``per_core`` busy Python loops per core (issue 48's load), ended on exit."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        time.sleep(0.5)  # every loop spinning before the decisions start
        yield
    finally:
        for p in busy:
            p.kill()
            p.wait()


def declares_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & {k for k, v in torch.cpu.get_capabilities().items() if v is True})


def test_real_check_decides_fp32_under_avx2() -> None:
    [result] = decide(avx2=True)
    assert (result["mode"], result["weights"], result["dropout"]) == ("no", False, False), result
    assert "no native bf16" in result["reason"] and "ATen kernels at AVX2" in result["reason"], result
    assert result["hardware"]["aten_capability"] == "AVX2" and result["hardware"]["onednn_isa_cap"] == "AVX2"
    assert result["seconds"] < 0.5, result  # nothing is timed: well under a millisecond alone


@pytest.mark.skipif(not declares_bf16(), reason="this CPU has no native bf16")
def test_real_check_decides_bf16_on_a_bf16_cpu() -> None:
    [result] = decide(avx2=False)
    assert (result["mode"], result["weights"], result["dropout"]) == ("bf16", True, True), result
    assert result["reason"].startswith("cpu: avx512_bf16") or result["reason"].startswith("cpu: amx_bf16"), result
    assert result["seconds"] < 0.5, result  # the warning-only probe: ~15 ms alone


@pytest.mark.slow
@pytest.mark.parametrize("avx2", [True, False], ids=["avx2", "bf16-cpu"])
def test_the_decision_does_not_depend_on_the_load(avx2: bool) -> None:
    """Issue 48: 20 decisions (each with the timing probe) under two busy loops per core
    all agree: fp32 under AVX2, bf16 with bf16 weights on a bf16 CPU. Before, a timed matmul
    decided, and under this load some of them said fp32 on the bf16 CPU."""
    if not avx2 and not declares_bf16():
        pytest.skip("this CPU has no native bf16")
    with loaded_machine():
        results = decide(avx2, times=20)
    modes = [(r["mode"], r["weights"], r["dropout"]) for r in results]
    assert modes == [("no", False, False) if avx2 else ("bf16", True, True)] * 20, modes


def test_a_run_records_what_decided_auto(monkeypatch: pytest.MonkeyPatch, tiny_run: TinyRun) -> None:
    """metrics.json's ``precision`` says what ``auto`` decided and from what: the facts and
    the flags of the hardware check (forced here to a CPU without native bf16), and
    config.yaml records the decision, not ``auto``."""
    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.run import train

    monkeypatch.setattr(precision, "cpu_bf16_support", check_of(AVX2_CPU))
    cfg = tiny_run.config(
        "auto", mixed_precision="auto", save_steps=0, num_epochs=1, max_steps=1, eval_at_start="false", final_eval="false"
    )
    assert (cfg.train.mixed_precision, cfg.train.bf16_weights, cfg.train.fast_dropout) == ("auto", "auto", "auto")
    metrics = train(cfg)
    facts = "cpu: oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA): no native bf16"
    assert metrics["precision"] == {
        "mixed_precision": "no",
        "bf16_weights": False,
        "fast_dropout": False,
        "reason": f"{facts} -> fp32 (auto)",
        "probe": {},
        "decided_by": facts,
        "hardware": {"cpu_flags": ""},
    }
    saved = load_config(tiny_run.folder / "auto" / "config.yaml").train
    assert (saved.mixed_precision, saved.bf16_weights, saved.fast_dropout) == ("no", False, False)
