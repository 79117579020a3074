"""Tiny random BERT trains in all three modes, through the real loop; loss falls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from simcse_kit.config import LossConfig, ModelConfig, TrainConfig
from simcse_kit.data import ContrastiveCollator, load_train_dataset
from simcse_kit.modeling import Encoder, SimCSEModel, load_encoder
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.trainer import fit


def write_data(folder: Path, mode: str) -> Path:
    sents = toy_sentences(96)
    if mode == "unsup":
        path = folder / "train.txt"
        path.write_text("\n".join(sents[:32]) + "\n", encoding="utf-8")
    else:
        path = folder / "train.csv"
        rows = ["sent0,sent1,hard_neg"] + [f"{sents[i]},{sents[i]} .,{sents[i + 32]}" for i in range(32)]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("mode", "pooler", "mlp"), [("unsup", "cls", "train"), ("sup", "avg", "none"), ("hardneg", "cls", "always")]
)
def test_three_modes_loss_falls(tmp_path: Path, tiny_model_dir: Path, mode: str, pooler: str, mlp: str) -> None:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp=mlp))
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05))
    collator = ContrastiveCollator(tokenizer, mode, 16)
    dataset = load_train_dataset(str(write_data(tmp_path, mode)), mode)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collator, generator=torch.Generator().manual_seed(0))
    fixed = collator([dataset[i] for i in range(8)])
    assert fixed["input_ids"].shape[0] == 8 * objective.views_per_example()

    def fixed_loss() -> float:
        # Averaged over dropout draws: one draw's loss moves by ~10% with the masks alone
        # (and the masks depend on the batch layout, e.g. packed or padded).
        model.train()
        torch.manual_seed(123)
        with torch.no_grad():
            return sum(objective.step(model, fixed).item() for _ in range(16)) / 16

    before = fixed_loss()
    cfg = TrainConfig(output_dir=str(tmp_path), batch_size=8, learning_rate=1e-3, num_epochs=4, progress_bar=False, eval_steps=0)
    state = fit(
        model, objective.step, loader, cfg, examples_in=lambda b: b["input_ids"].shape[0] // objective.views_per_example()
    )
    after = fixed_loss()
    assert state.global_step == 16
    assert state.examples_seen == 128
    assert after < 0.9 * before, (before, after)


def test_unsup_batch_is_each_sentence_twice(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": "a dog"}, {"sent0": "the red car drives"}])
    ids = batch["input_ids"]
    assert ids.shape[0] == 4
    assert torch.equal(ids[0], ids[1]) and torch.equal(ids[2], ids[3]) and not torch.equal(ids[0], ids[2])
    # Padded to the longest in the batch, not to max_seq_len.
    assert ids.shape[1] == 6


def test_save_load_roundtrip_every_pooler(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sents = toy_sentences(10)
    for pooler, mlp in [
        ("cls", "train"),
        ("cls", "always"),
        ("cls_before_pooler", "none"),
        ("avg", "none"),
        ("avg_first_last", "none"),
        ("avg_top2", "train"),
    ]:
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp=mlp))
        model.save(tmp_path / pooler, tokenizer)
        meta = json.loads((tmp_path / pooler / "simcse_config.json").read_text())
        assert meta["pooler"] == pooler and meta["mlp"] == mlp
        want = Encoder(model, tokenizer, 64).encode(sents)
        got = load_encoder(tmp_path / pooler).encode(sents)
        assert torch.allclose(want, got, atol=1e-6)
        if mlp == "train":  # MLP off at inference: equals the bare pooled vector
            bare = SimCSEModel(model.encoder, pooler, "none")
            assert torch.allclose(Encoder(bare, tokenizer, 64).encode(sents), got, atol=1e-6)
    assert not list(tmp_path.glob(".*tmp*")), "temp folders left behind"


def test_pooler_values_by_hand(tiny_model_dir: Path) -> None:
    from simcse_kit.modeling import Pooler

    mask = torch.tensor([[1, 1, 0]])
    h = [torch.full((1, 3, 2), float(i)) for i in range(4)]  # embeddings, layer1, layer2, layer3
    h[-1] = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert Pooler("cls")(mask, h[-1], h).tolist() == [[1.0, 2.0]]
    assert Pooler("avg")(mask, h[-1], h).tolist() == [[2.0, 3.0]]
    assert Pooler("avg_first_last")(mask, h[-1], h).tolist() == [[1.5, 2.0]]  # (layer1=1 + last)/2
    assert Pooler("avg_top2")(mask, h[-1], h).tolist() == [[2.0, 2.5]]  # (layer2=2 + last)/2


def test_runs_with_different_precisions_in_one_process() -> None:
    """Seeds, sweeps and benchmarks build several Accelerators in one process (an autocast
    run, then an fp32 or bf16-weights run); Accelerate's process-wide state would refuse the
    second precision (ValueError) unless make_accelerator resets it."""
    from simcse_kit.trainer import make_accelerator

    first = make_accelerator(TrainConfig(mixed_precision="bf16", bf16_weights=False), cpu=True)
    assert str(first.mixed_precision) == "bf16"
    second = make_accelerator(TrainConfig(mixed_precision="no"), cpu=True)
    assert str(second.mixed_precision) == "no"
    with second.autocast():
        assert not torch.is_autocast_enabled("cpu")
