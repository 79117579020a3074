"""The training model: pooler and MLP by hand, mlp modes, self-describing atomic save/load,
the compute dtype, and the attention implementation the model records for packing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences
from torch import nn
from transformers import AutoTokenizer

from simcse_kit.config.run import ModelConfig
from simcse_kit.errors import ConfigError
from simcse_kit.model.modeling import HEAD_WEIGHTS, SIMCSE_CONFIG, MLPHead, Pooler, SimCSEModel, compute_dtype, resolve_model_path


def test_pooler_values_by_hand() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    layers = [torch.full((2, 3, 2), float(i)) for i in range(4)]  # embeddings, layers 1-3
    layers[-1] = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 6.0], [7.0, 8.0], [9.0, 9.0]]])
    last = layers[-1]
    assert Pooler("cls")(mask, last, layers).tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert Pooler("cls_before_pooler")(mask, last).tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert Pooler("avg")(mask, last).tolist() == [[2.0, 3.0], [5.0, 6.0]]  # the pad row never counts
    assert Pooler("avg_first_last")(mask, last, layers).tolist() == [[1.5, 2.0], [3.0, 3.5]]  # (layer1 = 1 + last) / 2
    assert Pooler("avg_top2")(mask, last, layers).tolist() == [[2.0, 2.5], [3.5, 4.0]]  # (layer2 = 2 + last) / 2
    assert Pooler("avg_top2").needs_hidden_states and not Pooler("avg").needs_hidden_states
    with pytest.raises(ValueError, match="output_hidden_states"):
        Pooler("avg_top2")(mask, last, None)
    with pytest.raises(ConfigError, match=r"'model.pooler' = 'max': must be one of"):
        Pooler("max")


def test_mlp_head_is_tanh_of_linear() -> None:
    torch.manual_seed(0)
    head = MLPHead(4, init_std=0.5)
    assert torch.all(head.dense.bias == 0)
    x = torch.randn(3, 4)
    want = torch.tanh(
        torch.stack([torch.stack([sum(head.dense.weight[o, i] * x[n, i] for i in range(4)) for o in range(4)]) for n in range(3)])
    )
    torch.testing.assert_close(head(x), want, atol=1e-6, rtol=0)


def batch(tiny_model_dir: Path, n: int = 6) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return dict(tokenizer(toy_sentences(n), padding=True, return_tensors="pt"))


@pytest.mark.parametrize("mlp", ["none", "train", "always"])
def test_mlp_modes(tiny_model_dir: Path, mlp: str) -> None:
    """``train``: the MLP only in train mode (SimCSE unsup); ``always``: also at inference."""
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp=mlp, dropout=0.0))
    inputs = batch(tiny_model_dir)
    with torch.no_grad():
        states = model.encoder(**inputs).last_hidden_state[:, 0]
        for training in (True, False):
            model.train(training)
            use = mlp == "always" or (mlp == "train" and training)
            torch.testing.assert_close(model(**inputs), model.mlp(states) if use else states, atol=1e-6, rtol=0)


def test_bad_model_settings(tiny_model_dir: Path) -> None:
    encoder = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir))).encoder
    with pytest.raises(ConfigError, match=r"'model.mlp' = 'sometimes': must be one of"):
        SimCSEModel(encoder, "cls", "sometimes")
    with pytest.raises(ConfigError, match=r"'model.mlp' = 'train': must be 'none' with pooler cls_before_pooler"):
        SimCSEModel(encoder, "cls_before_pooler", "train")
    with pytest.raises(ConfigError, match="cannot load a model"):
        SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir / "nowhere")))


def test_compute_dtype_is_the_majority_of_parameter_tensors() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))  # 1 table + 4 tensors
    assert compute_dtype(model) == torch.float32
    for p in model[1:].parameters():
        p.data = p.data.to(torch.bfloat16)
    assert model[0].weight.dtype == torch.float32  # the first parameter: the wrong test
    assert compute_dtype(model) == torch.bfloat16
    assert compute_dtype(nn.ReLU()) == torch.float32  # nothing to count


def test_save_load_describes_itself_and_replaces_atomically(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="always")).eval()
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale.txt").write_text("from an older save")
    model.save(out, tokenizer, extra={"note": "x"})
    assert not (out / "stale.txt").exists()  # replaced whole, not merged
    assert (out / HEAD_WEIGHTS).is_file()
    meta = json.loads((out / SIMCSE_CONFIG).read_text(encoding="utf-8"))
    assert meta == model.describe() | {"note": "x"}
    assert (meta["pooler"], meta["mlp"], meta["mlp_at_inference"], meta["hidden_size"]) == ("avg", "always", True, 32)
    loaded = SimCSEModel.load(out)
    assert not loaded.training and loaded.describe() == model.describe()
    inputs = batch(tiny_model_dir)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs), model(**inputs), atol=1e-6, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder left

    class Broken:
        def save_pretrained(self, folder: Path) -> None:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        model.save(out, Broken())
    assert json.loads((out / SIMCSE_CONFIG).read_text(encoding="utf-8")) == meta  # the old model, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with pytest.raises(ConfigError, match="not a simcse-kit model"):
        SimCSEModel.load(tiny_model_dir)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_model_records_its_attention_and_packs_with_it(tiny_model_dir: Path, attn: str) -> None:
    """The packed mask's form comes from the implementation the model was loaded with:
    additive for eager, boolean for SDPA. Both pack and give the padded answer."""
    inputs = batch(tiny_model_dir, 12)
    outputs = {}
    for packing in (True, False):
        torch.manual_seed(0)
        cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", dropout=0.0, attn_implementation=attn, packing=packing)
        model = SimCSEModel.from_config(cfg).eval()
        assert model.attn_implementation == attn and model.packing == packing
        with torch.no_grad():
            outputs[packing] = model(**inputs)
    torch.testing.assert_close(outputs[True], outputs[False], atol=1e-5, rtol=0)


def test_a_model_that_misstates_its_attention_runs_padded(tiny_model_dir: Path) -> None:
    """An eager encoder described as SDPA would get a boolean mask it would add to its
    scores: the packing probe catches it and the model runs padded, still correct."""
    eager = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), attn_implementation="eager"))
    model = SimCSEModel(eager.encoder, "avg", packing=True, attn_implementation="sdpa")
    assert not model.packing


def test_resolve_model_path_passes_other_names_through(tmp_path: Path) -> None:
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("org/name") == "org/name"
    assert Path(resolve_model_path("default"), "config.json").is_file()  # the bundled default


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_4d_padding_mask_gives_the_2d_masks_token_states(tiny_model_dir: Path, attn: str) -> None:
    """On CUDA the padded path hands the encoder a 4-D mask (no read-back in transformers'
    all-real check): the same token states as transformers' own 2-D handling, padding or not."""
    from simcse_kit.model.modeling import padded_attention_mask

    cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", dropout=0.0, attn_implementation=attn, packing=False)
    model = SimCSEModel.from_config(cfg).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for sentences in (toy_sentences()[:5], ["same length here", "same length here"]):
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        with torch.no_grad():
            two_d = model.encoder(**batch).last_hidden_state
            mask = padded_attention_mask(batch["attention_mask"], model.attn_implementation, torch.float32)
            assert mask.shape == (len(sentences), 1, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
            four_d = model.encoder(**(batch | {"attention_mask": mask})).last_hidden_state
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(four_d[real], two_d[real], atol=1e-6, rtol=0)
