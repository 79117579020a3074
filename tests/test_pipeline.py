"""The input pipeline: pinned memory and asynchronous copies on CUDA only, the packing
plan in the loader's batches."""

from __future__ import annotations

import os

import torch
from conftest import TinyRun
from transformers import AutoTokenizer

from simcse_kit.config.run import LoopConfig
from simcse_kit.core.batch import PLAN_INPUTS
from simcse_kit.data.pipeline import loader_options
from simcse_kit.training.engine.loop import make_accelerator
from simcse_kit.training.wiring.folder import CUDA_WORKERS, with_device_defaults
from simcse_kit.training.wiring.inputs import load_training_sets
from simcse_kit.training.wiring.loaders import make_loader


def test_loader_options_pin_only_for_cuda() -> None:
    assert loader_options(torch.device("cuda:1")) == loader_options("cuda")
    assert loader_options("cuda").pin_memory and loader_options("cuda").non_blocking
    for device in ("cpu", "mps", torch.device("cpu")):
        options = loader_options(device)
        assert not options.pin_memory and not options.non_blocking


def test_make_loader_pins_on_a_faked_cuda_device(tiny_run: TinyRun) -> None:
    cfg = tiny_run.config()
    dataset = load_training_sets(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    assert make_loader(cfg, dataset, tokenizer, 1, torch.device("cuda:0")).pin_memory
    loader = make_loader(cfg, dataset, tokenizer, 1, "cpu")
    assert not loader.pin_memory
    batch = next(iter(loader))  # the default (auto) packs on the CPU: the plan comes with the batch
    assert cfg.model.packing is None and set(PLAN_INPUTS) <= set(batch)
    off = make_loader(tiny_run.config("off", **{"model.packing": "false"}), dataset, tokenizer, 1)
    assert not set(PLAN_INPUTS) & set(next(iter(off)))


def test_accelerator_copies_asynchronously_only_off_the_cpu() -> None:
    assert not make_accelerator(LoopConfig(), cpu=True).dataloader_config.non_blocking
    # cpu=False on a machine without CUDA still builds (on the CPU): the decision is what is checked.
    assert make_accelerator(LoopConfig(), cpu=False).dataloader_config.non_blocking


def test_device_defaults_are_concrete_per_device_and_explicit_values_win(tiny_run: TinyRun) -> None:
    """null (auto) num_workers/packing: the CPU keeps today's 0 workers and packing; CUDA
    gets workers and padding (measured by benchmarks/gpu.py); a value set by the user stays."""
    cfg = tiny_run.config()
    assert cfg.data.num_workers is None and cfg.model.packing is None
    cpu = with_device_defaults(cfg, "cpu")
    assert (cpu.data.num_workers, cpu.model.packing) == (0, True)
    cuda = with_device_defaults(cfg, torch.device("cuda:0"))
    expected_workers = min(CUDA_WORKERS, max(0, (os.cpu_count() or 1) - 1))
    four_gpus = with_device_defaults(cfg, "cuda", num_processes=4).data.num_workers
    assert four_gpus == min(CUDA_WORKERS, max(0, (os.cpu_count() or 1) // 4 - 1))
    assert (cuda.data.num_workers, cuda.model.packing) == (expected_workers, False)
    forced = with_device_defaults(tiny_run.config("forced", **{"model.packing": "true", "data.num_workers": "1"}), "cuda")
    assert (forced.data.num_workers, forced.model.packing) == (1, True)
