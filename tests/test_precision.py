"""``auto`` precision: the choice per hardware, with the probe injected, and the real probe."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from simcse_kit.model import precision
from simcse_kit.model.precision import MatmulSpeeds, PrecisionChoice, resolve_eval_precision, resolve_precision

REPO = Path(__file__).resolve().parents[1]


def probe_of(fp32: float, low: float) -> precision.Probe:
    """A probe answering ``fp32`` GFLOP/s for fp32 and ``low`` for bf16 or fp16."""
    return lambda dtype: MatmulSpeeds(fp32, low)


EMULATED = probe_of(60.0, 2.0)  # bf16 30x slower than fp32 (AVX2: ~1.9 vs ~55 measured)
NATIVE = probe_of(100.0, 240.0)  # bf16 2.4x faster (avx512_bf16 / AMX)


def no_probe(dtype: torch.dtype) -> float:
    raise AssertionError(f"the probe must not run here (asked for {dtype})")


def cuda(monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    """A GPU with native bf16 (an A100, compute capability 8.0) or without (a T4, 7.5)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0) if bf16 else (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # torch counts emulation


def test_auto_on_emulated_bf16_cpu_trains_in_fp32() -> None:
    choice = resolve_precision("auto", "cpu", probe=EMULATED)
    assert choice == PrecisionChoice(
        mixed_precision="no",
        bf16_weights=False,
        fast_dropout=False,
        reason="cpu: bf16 matmul 0.033x fp32 (emulated bf16) -> fp32 (auto)",
        probe={"fp32_gflops": 60.0, "bf16_gflops": 2.0, "bf16_speedup": 0.033},
    )


def test_auto_on_native_bf16_cpu_uses_the_fast_recipe() -> None:
    choice = resolve_precision("auto", torch.device("cpu"), probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", True, True)
    assert choice.reason == "cpu: bf16 matmul 2.4x fp32 (native bf16) -> bf16, bf16 weights, fast dropout (auto)"
    assert choice.probe == {"fp32_gflops": 100.0, "bf16_gflops": 240.0, "bf16_speedup": 2.4}


@pytest.mark.parametrize(("bf16_gflops", "expected"), [(119.0, "no"), (120.0, "bf16"), (100.0, "no")])
def test_auto_needs_bf16_measurably_faster(bf16_gflops: float, expected: str) -> None:
    # 1.19x and a tie stay fp32; 1.2x (BF16_SPEEDUP_THRESHOLD) is enough.
    assert precision.BF16_SPEEDUP_THRESHOLD == 1.2
    assert resolve_precision("auto", "cpu", probe=probe_of(100.0, bf16_gflops)).mixed_precision == expected


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16"), (False, "fp16")])
def test_auto_on_cuda_follows_bf16_support(monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: str) -> None:
    cuda(monkeypatch, bf16)
    choice = resolve_precision("auto", "cuda:0", probe=no_probe)
    # On a GPU the model keeps SDPA/flash attention and PyTorch's dropout, and fp32 weights.
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == (expected, False, False)
    support = "compute capability 8.0 (native bf16)" if bf16 else "compute capability 7.5 (no native bf16)"
    assert choice.reason == f"cuda: {support} -> {expected} (auto)"
    assert choice.probe == {}


def test_explicit_bf16_on_emulated_cpu_is_honoured_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("bf16", "cpu", probe=EMULATED)
    assert choice.mixed_precision == "bf16"
    assert (choice.bf16_weights, choice.fast_dropout) == (False, False)  # auto: not native
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "bf16 matmul 0.033x fp32" in record.getMessage() and "slower than fp32" in record.getMessage()


def test_explicit_bf16_on_native_cpu_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("bf16", "cpu", probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", True, True)
    assert choice.reason.endswith("(requested bf16)")
    assert caplog.records == []


def test_explicit_flags_are_honoured() -> None:
    choice = resolve_precision("bf16", "cpu", bf16_weights=True, fast_dropout=True, probe=EMULATED)
    assert (choice.bf16_weights, choice.fast_dropout) == (True, True)
    choice = resolve_precision("auto", "cpu", bf16_weights=False, fast_dropout=False, probe=NATIVE)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("bf16", False, False)


def test_explicit_no_times_nothing_and_keeps_the_model_fp32() -> None:
    # bf16 weights need bf16 precision (the recipes' `--mixed-precision no` trains in fp32);
    # fast dropout does not depend on the precision.
    choice = resolve_precision("no", "cpu", bf16_weights=True, fast_dropout=True, probe=no_probe)
    assert choice == PrecisionChoice("no", False, True, "cpu -> fp32, fast dropout (requested no)", {})


def test_explicit_precision_on_cuda_is_honoured(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cuda(monkeypatch, bf16=False)
    assert resolve_precision("no", "cuda", probe=no_probe).mixed_precision == "no"
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        assert resolve_precision("bf16", "cuda", probe=no_probe).mixed_precision == "bf16"
    assert "without native bf16" in caplog.text


@pytest.mark.parametrize(("fp16_gflops", "warns"), [(2.0, True), (240.0, False)])
def test_fp16_on_cpu_is_measured(caplog: pytest.LogCaptureFixture, fp16_gflops: float, warns: bool) -> None:
    asked: list[torch.dtype] = []

    def probe(dtype: torch.dtype) -> MatmulSpeeds:
        asked.append(dtype)
        return MatmulSpeeds(60.0, fp16_gflops)

    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        choice = resolve_precision("fp16", "cpu", probe=probe)
    assert asked == [torch.float16]
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("fp16", False, False)
    assert set(choice.probe) == {"fp32_gflops", "fp16_gflops", "fp16_speedup"}
    assert ("fp16 is not native on this CPU" in caplog.text) is warns


def test_cpu_without_onednn_is_fp32_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    choice = resolve_precision("auto", "cpu", probe=no_probe)
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == ("no", False, False)
    assert "without oneDNN" in choice.reason


def test_other_devices_keep_fp32() -> None:
    assert resolve_precision("auto", "mps", probe=no_probe).mixed_precision == "no"


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", "cpu", probe=NATIVE)
    with pytest.raises(ValueError, match="bf16_weights must be 'auto', true or false"):
        resolve_precision("auto", "cpu", bf16_weights="yes", probe=NATIVE)
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_eval_precision("half", "cpu", probe=NATIVE)


def test_eval_auto_is_bf16_only_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    native = resolve_eval_precision("auto", "cpu", probe=NATIVE)
    assert (native.mixed_precision, native.bf16_weights, native.fast_dropout) == ("bf16", False, False)
    assert native.reason == "cpu: bf16 matmul 2.4x fp32 (native bf16) -> bf16 (auto)"
    assert resolve_eval_precision("auto", "cpu", probe=EMULATED).mixed_precision == "no"
    assert resolve_eval_precision("no", "cpu", probe=no_probe).mixed_precision == "no"
    assert resolve_eval_precision("fp16", "cpu", probe=EMULATED).mixed_precision == "fp16"
    cuda(monkeypatch, bf16=True)
    assert resolve_eval_precision("auto", "cuda", probe=no_probe).mixed_precision == "bf16"
    cuda(monkeypatch, bf16=False)  # fp16 has no loss scaler at inference: fp32
    assert resolve_eval_precision("auto", "cuda", probe=no_probe).mixed_precision == "no"


def test_probe_is_cached_alternates_and_restores_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (8, 16, 24)  # tiny: this test is about the bookkeeping, not the speed
    calls: list[tuple[int, torch.dtype, int]] = []
    real_mm = torch.mm

    def counting_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append((a.shape[0], a.dtype, torch.get_num_threads()))
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", counting_mm)
    precision.clear_probe_cache()
    threads = torch.get_num_threads()
    speeds = precision.cpu_matmul_speeds(torch.bfloat16, shape)
    assert speeds.fp32 > 0 and speeds.low > 0
    assert torch.get_num_threads() == threads
    f32, bf16 = torch.float32, torch.bfloat16
    # Warm-up of each dtype on 4 rows then the full shape, then timed rounds alternating
    # fp32 and bf16 (1 to 10 of them): all on one thread.
    assert calls[:4] == [(4, f32, 1), (8, f32, 1), (4, bf16, 1), (8, bf16, 1)]
    rounds = calls[4:]
    assert 2 <= len(rounds) <= 20 and rounds == [(8, f32, 1), (8, bf16, 1)] * (len(rounds) // 2)
    calls.clear()
    assert precision.cpu_matmul_speeds(torch.bfloat16, shape) == speeds
    assert calls == []
    precision.clear_probe_cache()


PROBE_SCRIPT = """
import json, time
from simcse_kit.model.precision import resolve_precision
start = time.perf_counter()
choice = resolve_precision("auto", "cpu")
print(json.dumps({"mode": choice.mixed_precision, "seconds": time.perf_counter() - start,
                  "reason": choice.reason, "weights": choice.bf16_weights, "dropout": choice.fast_dropout}))
"""


def run_probe(max_isa: str | None) -> dict:
    """The real probe in a fresh process: oneDNN reads ``ONEDNN_MAX_CPU_ISA`` once."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    if max_isa:
        env["ONEDNN_MAX_CPU_ISA"] = max_isa
    proc = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_real_probe_sees_emulated_bf16_under_avx2() -> None:
    # With oneDNN capped at AVX2, bf16 matmul is emulated (~2.5 vs ~80 GFLOP/s here).
    result = run_probe("AVX2")
    assert (result["mode"], result["weights"], result["dropout"]) == ("no", False, False), result
    assert "emulated bf16" in result["reason"]
    assert result["seconds"] < 0.5, result  # ~25 ms alone; generous for a busy machine


@pytest.mark.skipif(not {"avx512_bf16", "amx_bf16"} & cpu_flags(), reason="this CPU has no native bf16")
def test_real_probe_sees_native_bf16() -> None:
    result = run_probe(None)
    assert (result["mode"], result["weights"], result["dropout"]) == ("bf16", True, True), result
    assert "native bf16" in result["reason"]
    assert result["seconds"] < 0.5, result  # ~15 ms alone
