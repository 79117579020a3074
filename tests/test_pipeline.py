"""The input pipeline: pinned memory and asynchronous copies on CUDA only, the packing
plan in the loader's batches."""

from __future__ import annotations

import torch
from conftest import TinyRun
from transformers import AutoTokenizer

from simcse_kit.batch import PLAN_INPUTS
from simcse_kit.config import LoopConfig
from simcse_kit.pipeline import loader_options
from simcse_kit.trainer import make_accelerator
from simcse_kit.training import load_training_data, make_loader


def test_loader_options_pin_only_for_cuda() -> None:
    assert loader_options(torch.device("cuda:1")) == loader_options("cuda")
    assert loader_options("cuda").pin_memory and loader_options("cuda").non_blocking
    for device in ("cpu", "mps", torch.device("cpu")):
        options = loader_options(device)
        assert not options.pin_memory and not options.non_blocking


def test_make_loader_pins_on_a_faked_cuda_device(tiny_run: TinyRun) -> None:
    cfg = tiny_run.config()
    dataset = load_training_data(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    assert make_loader(cfg, dataset, tokenizer, 1, torch.device("cuda:0")).pin_memory
    loader = make_loader(cfg, dataset, tokenizer, 1, "cpu")
    assert not loader.pin_memory
    batch = next(iter(loader))  # the default config packs: the plan comes with the batch
    assert cfg.model.packing and set(PLAN_INPUTS) <= set(batch)
    off = make_loader(tiny_run.config("off", **{"model.packing": "false"}), dataset, tokenizer, 1)
    assert not set(PLAN_INPUTS) & set(next(iter(off)))


def test_accelerator_copies_asynchronously_only_off_the_cpu() -> None:
    assert not make_accelerator(LoopConfig(), cpu=True).dataloader_config.non_blocking
    # cpu=False on a machine without CUDA still builds (on the CPU): the decision is what is checked.
    assert make_accelerator(LoopConfig(), cpu=False).dataloader_config.non_blocking
