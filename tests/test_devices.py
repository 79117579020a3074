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

from simcse_kit.config import ModelConfig
from simcse_kit.modeling import SimCSEModel

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
