"""What a run decides for a CUDA device, checked on the CPU with a faked device:
TF32, warnings about CPU speed tricks, torch.compile's refusal and recording."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import TinyRun

from simcse_kit.errors import ConfigError
from simcse_kit.model.precision import check_cuda_flags, set_tf32, tf32_wanted
from simcse_kit.training.objective.momentum_queue import MomentumQueue
from simcse_kit.training.wiring.run import build_model


@pytest.mark.parametrize(
    ("device", "capability", "want"),
    [("cuda:0", (8, 0), True), ("cuda", (9, 0), True), ("cuda", (7, 5), False), ("cuda", None, False), ("cpu", (9, 0), False)],
)
def test_tf32_only_on_ampere_cuda(device: str, capability: tuple[int, int] | None, want: bool) -> None:
    if device == "cuda" and capability is None and torch.cuda.is_available():
        pytest.skip("a real GPU answers for itself")
    assert tf32_wanted(device, capability) is want


def test_set_tf32_sets_the_flags_and_leaves_them_off_the_cpu() -> None:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:  # (monkeypatch cannot restore torch's cuBLAS flag object)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert not set_tf32("cpu") and not torch.backends.cuda.matmul.allow_tf32
        assert not set_tf32("cuda", (7, 0)) and not torch.backends.cuda.matmul.allow_tf32
        assert set_tf32("cuda", (8, 6))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_cpu_tricks_warned_about_on_cuda_only(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="simcse_kit.model.precision"):
        assert check_cuda_flags("cpu", fast_dropout=True, bf16_weights=True) == []
        assert check_cuda_flags("cuda", fast_dropout=False, bf16_weights=False) == []
        warned = check_cuda_flags("cuda:0", fast_dropout=True, bf16_weights=True)
    assert len(warned) == 2 and "SDPA" in warned[0] and "bf16_weights" in warned[1]
    assert [r.getMessage() for r in caplog.records] == warned
    # With a LoRA adapter bf16 weights are the memory option (a frozen bf16 base): no warning.
    assert check_cuda_flags("cuda", fast_dropout=False, bf16_weights=True, adapter=True) == []


def test_compile_is_in_place_dynamic_and_refused_with_fast_dropout(tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: calls.append(kw))
    model = build_model(tiny_run.config("c", **{"train.compile": "true", "train.fast_dropout": "false"}))
    assert calls == [{"dynamic": True}]
    assert all(not k.startswith("_orig_mod") for k in model.state_dict())  # saved keys unchanged
    with pytest.raises(ConfigError, match="train.compile with train.fast_dropout"):
        build_model(tiny_run.config("d", **{"train.compile": "true", "train.fast_dropout": "true"}))


def test_queue_fill_is_mirrored_on_the_host_and_restored() -> None:
    queue = MomentumQueue(torch.nn.Linear(3, 3), size=4, momentum=0.9, dim=3)
    queue.enqueue(torch.ones(3, 3), torch.arange(3))
    assert queue.negatives()[0].shape[0] == 3
    queue.enqueue(torch.ones(3, 3), torch.arange(3))
    assert queue.negatives()[0].shape[0] == 4 == int(queue.filled)
    fresh = MomentumQueue(torch.nn.Linear(3, 3), size=4, momentum=0.9, dim=3)
    assert fresh.negatives()[0].shape[0] == 0
    fresh.load_state_dict(queue.state_dict())  # a resume: the host mirror follows the buffer
    assert fresh.negatives()[0].shape[0] == 4


class _CudaAccelerator:
    """What StepGuard reads of an Accelerator, claiming one CUDA device (tensors stay on the CPU)."""

    device = torch.device("cuda:0")
    num_processes = 1


def test_step_guard_on_cuda_reads_the_device_only_on_due_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """One CUDA device: no read-back on ordinary steps (patched .item/.tolist/bool/int
    raise), the first non-finite step named at the next due step, before its update."""
    from simcse_kit.training.engine.guards import Diverged, StepGuard, StopSignals

    guard = StepGuard(_CudaAccelerator(), StopSignals(), due=lambda step: step % 5 == 0)
    assert guard.deferred
    losses = [1.0, 2.0, float("nan"), 1.0, 1.0]
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
            m.setattr(torch.Tensor, name, lambda *a, _n=name: pytest.fail(f"host read-back via {_n}"))
        for step, value in enumerate(losses[:4], start=1):
            assert guard(step, torch.tensor(value), torch.tensor(1.0)) is False
    with pytest.raises(Diverged, match=r"step 3 \(found at step 5"):
        guard(5, torch.tensor(losses[4]), torch.tensor(1.0))
    # A non-finite gradient norm counts too, and a due step that is itself bad is named alone.
    fresh = StepGuard(_CudaAccelerator(), StopSignals(), due=lambda step: True)
    with pytest.raises(Diverged, match=r"diverged at step 1: "):
        fresh(1, torch.tensor(0.5), torch.tensor(float("inf")))
    # Without a due predicate (or on the CPU) every step is checked before its update, as before.
    assert not StepGuard(_CudaAccelerator(), StopSignals()).deferred


def test_due_steps_are_the_loops_log_eval_save_and_last_steps() -> None:
    from simcse_kit.config.run import LoopConfig
    from simcse_kit.training.engine.loop import due_step

    cfg = LoopConfig(log_steps=10, eval_steps=25, save_steps=0)
    due = [s for s in range(1, 61) if due_step(cfg, s, n_steps=57)]
    assert due == [1, 10, 20, 25, 30, 40, 50, 57, 58, 59, 60]
