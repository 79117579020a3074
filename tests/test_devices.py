"""Any device gives the right result: the GPU-side decisions, checked on the CPU.

* base weights load as fp32 masters whatever dtype the checkpoint was stored in, and
  the best model is saved in fp32 (a tiny BERT saved in fp16 and in bf16);
* ``auto`` precision on CUDA: bf16 only from compute capability 8.0 (Ampere), else fp16
  with loss scaling (a faked device capability);
* bf16 weights: the fp32 masters are built where the model trains;
* flash attention: a model recorded with it reloads with SDPA for fp32 inference;
* ``--device``: every encoding command takes one, and ``auto`` finds the GPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import TinyRun
from safetensors.torch import load_file
from transformers import BertModel

from simcse_kit.config.run import ModelConfig
from simcse_kit.model.modeling import SimCSEModel

# --------------------------------------------------------------------------- fp32 masters


def stored_in(dtype: torch.dtype, model_dir: Path, folder: Path) -> Path:
    """A copy of the tiny BERT folder with its weights stored in ``dtype``."""
    shutil.copytree(model_dir, folder)
    BertModel.from_pretrained(str(model_dir)).to(dtype).save_pretrained(folder)
    assert {t.dtype for t in load_file(str(folder / "model.safetensors")).values()} == {dtype}
    return folder


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints_train_fp32_masters(tmp_path: Path, tiny_model_dir: Path, dtype: torch.dtype) -> None:
    base = stored_in(dtype, tiny_model_dir, tmp_path / "base")
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler="cls", mlp="train"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # fp16 and bf16 values are exactly representable in fp32: the masters start from them.
    stored = load_file(str(base / "model.safetensors"))
    loaded = model.encoder.state_dict()
    assert all(torch.equal(loaded[k], v.float()) for k, v in stored.items() if k in loaded)

    run = TinyRun(tmp_path, base)
    run.train("run", max_steps=3, eval_steps=0, eval_at_start=False, save_steps=0, final_eval=False, learning_rate=3e-5)
    saved = load_file(str(tmp_path / "run" / "best_model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    # An lr 3e-5 AdamW step moves most weights by ~3e-5, below half of fp16's / bf16's
    # spacing near 1: in 16 bits nearly all of them would round back to where they were.
    trained = [k for k in stored if stored[k].ndim == 2 and not k.startswith("pooler")]  # BERT's pooler is frozen
    moved = [not torch.equal(saved[k], stored[k].float()) for k in trained]
    assert sum(moved) == len(moved)
    assert {p.dtype for p in SimCSEModel.load(tmp_path / "run" / "best_model").parameters()} == {torch.float32}


# --------------------------------------------------------------------------- auto precision on CUDA


def fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    """A CUDA machine whose card has ``capability``; ``is_bf16_supported`` says True, as
    torch does on a T4 or V100, where bf16 is only emulated."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)


@pytest.mark.parametrize(
    ("card", "capability", "train", "inference"),
    [
        ("P100", (6, 0), "fp16", "no"),
        ("V100", (7, 0), "fp16", "no"),
        ("T4", (7, 5), "fp16", "no"),
        ("A100", (8, 0), "bf16", "bf16"),
        ("RTX 4090", (8, 9), "bf16", "bf16"),
        ("H100", (9, 0), "bf16", "bf16"),
    ],
)
def test_auto_precision_on_cuda_follows_the_compute_capability(
    monkeypatch: pytest.MonkeyPatch, card: str, capability: tuple[int, int], train: str, inference: str
) -> None:
    from simcse_kit.config.run import TrainConfig
    from simcse_kit.model.precision import resolve_eval_precision, resolve_precision
    from simcse_kit.training.wiring.folder import with_concrete_precision

    fake_gpu(monkeypatch, capability)
    choice = resolve_precision("auto", "cuda")
    assert (choice.mixed_precision, choice.bf16_weights, choice.fast_dropout) == (train, False, False), card
    assert f"compute capability {capability[0]}.{capability[1]}" in choice.reason
    assert resolve_eval_precision("auto", "cuda:0").mixed_precision == inference
    # The run's config: what Accelerate is given (fp16 there means its GradScaler).
    cfg, _ = with_concrete_precision(TrainConfig(), cpu=False)
    assert (cfg.mixed_precision, cfg.bf16_weights, cfg.fast_dropout) == (train, False, False)


def test_auto_precision_on_mps_is_fp32() -> None:
    from simcse_kit.model.precision import resolve_eval_precision, resolve_precision

    assert resolve_precision("auto", "mps").mixed_precision == "no"
    assert resolve_eval_precision("auto", "mps").mixed_precision == "no"


# --------------------------------------------------------------------------- bf16 weights


def test_bf16_masters_are_built_where_the_model_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, masters built before the model moves stay on the CPU and the first
    optimiser step fails. On the CPU nothing moves, so the test records the order: the
    model goes to the accelerator's device, then the masters are built from it."""
    from test_loop import Toy, mse_step, toy_loader

    from simcse_kit.config.run import LoopConfig
    from simcse_kit.model.fastpath.bf16 import MasterWeightAdamW
    from simcse_kit.training.engine import loop

    events: list[str] = []
    model = Toy(dropout=0.0)
    real_to, real_bf16 = model.to, loop.bf16_training

    def to(*args: object, **kwargs: object) -> torch.nn.Module:
        events.append(f"to {args[0] if args else kwargs}")
        return real_to(*args, **kwargs)

    def bf16_training(m: torch.nn.Module, *args: object, **kwargs: object) -> MasterWeightAdamW:
        events.append("masters")
        return real_bf16(m, *args, **kwargs)

    monkeypatch.setattr(model, "to", to)
    monkeypatch.setattr(loop, "bf16_training", bf16_training)
    cfg = LoopConfig(mixed_precision="bf16", bf16_weights=True, max_steps=2, eval_steps=0, progress_bar=False)
    accelerator = loop.make_accelerator(cfg)
    loop.fit(loop.prepare(model, toy_loader(), cfg, accelerator), mse_step, cfg)
    assert "masters" in events
    assert events.index(f"to {accelerator.device}") < events.index("masters"), events


# --------------------------------------------------------------------------- flash attention


def saved_simcse_model(model_dir: Path, folder: Path, attn: str | None = None) -> Path:
    """A saved simcse-kit model of the tiny BERT, recording ``attn`` as its attention."""
    import json

    from transformers import AutoTokenizer

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(model_dir), pooler="cls", mlp="none", eval_max_seq_len=32))
    model.save(folder, AutoTokenizer.from_pretrained(str(model_dir)))
    if attn is not None:
        meta = json.loads((folder / "simcse_config.json").read_text())
        (folder / "simcse_config.json").write_text(json.dumps(meta | {"attn_implementation": attn}))
    return folder


def test_a_flash_attention_model_reloads_with_sdpa_for_fp32(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flash attention runs only in fp16/bf16: the final STS of a run, ``evaluate``,
    ``export`` and ``mine`` reload the model in fp32 and must not ask for it then."""
    from simcse_kit.model import families
    from simcse_kit.model.inference import load_encoder

    folder = saved_simcse_model(tiny_model_dir, tmp_path / "flash", "flash_attention_2")
    asked: list[str | None] = []
    real = families.load_pretrained_encoder

    def spy(path: object, attn_implementation: str = "auto", prefer: str | None = None, **kwargs: object) -> object:
        asked.append(prefer)
        return real(path, attn_implementation, prefer=None, **kwargs)  # no flash-attn on a CPU machine

    monkeypatch.setattr(families, "load_pretrained_encoder", spy)
    SimCSEModel.load(folder)  # fp32, as the run's final STS and export load it
    load_encoder(folder, device="cpu")  # evaluate's default precision: fp32
    SimCSEModel.load(folder, precision="bf16")
    load_encoder(folder, device="cpu", precision="fp16")
    assert asked == [None, None, "flash_attention_2", "flash_attention_2"]


# --------------------------------------------------------------------------- --device


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from simcse_kit.errors import ConfigError
    from simcse_kit.model.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    for bad in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ConfigError, match="not one of"):
            resolve_device(bad)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="MPS is not available"):
        resolve_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")  # a Mac: its GPU
    fake_gpu(monkeypatch, (8, 0))
    assert resolve_device("auto") == torch.device("cuda")  # CUDA before MPS
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="1 CUDA device"):
        resolve_device("cuda:1")


class RecordingEncoder:
    """Stands in for :class:`simcse_kit.model.inference.Encoder`: records where it would run."""

    devices: list[torch.device] = []

    def __init__(self, model: object, tokenizer: object, max_seq_len: int, device: object = None, *rest: object) -> None:
        RecordingEncoder.devices.append(torch.device(device))


def test_auto_device_finds_the_gpu(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing falls back to the CPU on a GPU machine: load_encoder's default is ``auto``."""
    from simcse_kit.model import inference

    folder = saved_simcse_model(tiny_model_dir, tmp_path / "model")
    fake_gpu(monkeypatch, (7, 5))
    monkeypatch.setattr(inference, "Encoder", RecordingEncoder)
    RecordingEncoder.devices = []
    inference.load_encoder(folder)
    inference.load_encoder(folder, device="cpu")
    assert RecordingEncoder.devices == [torch.device("cuda"), torch.device("cpu")]


class Stop(Exception):
    """Raised by the spies once the command has handed over its device."""


@pytest.mark.parametrize("command", ["evaluate", "transfer", "align-uniform", "mine"])
@pytest.mark.parametrize("device", [None, "cpu", "cuda:0"])
def test_every_encoding_command_takes_a_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, device: str | None
) -> None:
    from conftest import write_tiny_senteval
    from test_evaluation_transfer import write_tiny_senteval as write_tiny_transfer

    from simcse_kit.cli import main
    from simcse_kit.evaluation import api
    from simcse_kit.tools import mining

    seen: list[object] = []

    def spy(model: object, *args: object, device: object = "missing", **kwargs: object) -> object:
        seen.append(device)
        raise Stop

    monkeypatch.setattr(api, "load_encoder", spy)
    monkeypatch.setattr(mining, "load_encoder", spy)
    data = write_tiny_senteval(tmp_path / "senteval")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\na man plays,a man plays guitar\na dog runs,a dog runs outside\n", encoding="utf-8")
    argv = {
        "evaluate": ["evaluate", "model", "--data-dir", str(data)],
        "transfer": ["transfer", "model", "--data-dir", str(write_tiny_transfer(tmp_path / "transfer")), "--tasks", "MR"],
        "align-uniform": ["align-uniform", "model", "--data-dir", str(data)],
        "mine": ["mine", str(pairs), str(tmp_path / "out.csv"), "--model", "model"],
    }[command]
    with pytest.raises(Stop):
        main([*argv, *(["--device", device] if device else [])])
    assert seen == [device or "auto"]


@pytest.mark.parametrize("device", [None, "cpu"])
def test_export_checks_parity_on_the_device(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, device: str | None
) -> None:
    from simcse_kit.cli import main
    from simcse_kit.export import exporter

    folder = saved_simcse_model(tiny_model_dir, tmp_path / "model")
    fake_gpu(monkeypatch, (8, 0))  # `auto` must pick the GPU; `cpu` must stay on the CPU
    RecordingEncoder.devices = []

    class StopAfterRecording(RecordingEncoder):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            raise Stop

    monkeypatch.setattr(exporter, "Encoder", StopAfterRecording)
    with pytest.raises(Stop):
        main(["export", str(folder), str(tmp_path / "st"), *(["--device", device] if device else [])])
    assert RecordingEncoder.devices == [torch.device(device or "cuda")]


def test_a_device_this_machine_lacks_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from simcse_kit.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["evaluate", "all-MiniLM-L6-v2", "--tasks", "STSBenchmark", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip().endswith("--device cuda: CUDA is not available here (use cpu or auto)")
