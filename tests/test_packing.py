"""Sequence packing: same sentence vectors and gradients as the padded batch, fewer rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import toy_sentences
from tiny_encoders import DECODERS
from torch import nn
from transformers import AutoConfig, AutoTokenizer, RobertaConfig, RobertaModel

from simcse_kit.config.run import ModelConfig
from simcse_kit.model.checks import load_checked_tokenizer
from simcse_kit.model.families import sliding_window
from simcse_kit.model.fastpath import enable_fast_dropout
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.model.packing import first_fit_decreasing, pack, packing_matches


def test_first_fit_decreasing_known_answer() -> None:
    # Sorted: 7(i=1) 5(i=3) 4(i=0) 3(i=4) 2(i=2) 1(i=5), rows of 8:
    # 7 -> row 0 (1 left); 5 -> row 1 (3 left); 4 -> row 2 (4 left); 3 -> row 1 (0 left);
    # 2 -> row 2 (2 left); 1 -> row 0 (0 left).
    assert first_fit_decreasing([4, 7, 2, 5, 3, 1], 8) == [[1, 5], [3, 4], [0, 2]]
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_decreasing([9], 8)


def batch_of(tokenizer: object, sentences: list[str], max_len: int = 16) -> dict[str, torch.Tensor]:
    return dict(tokenizer(sentences, padding=True, truncation=True, max_length=max_len, return_tensors="pt"))


def mixed_sentences(n: int) -> list[str]:
    """Toy sentences (5-11 tokens) with every fourth one long enough to be truncated at 16,
    as in a real training batch: the short ones pair up in rows of 16."""
    short = toy_sentences(n)
    return [s + " " + short[(i + 1) % n] if i % 4 == 0 else s for i, s in enumerate(short)]


def test_pack_layout(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = batch_of(tokenizer, ["a man plays the red guitar in the park", "a dog", "two cats", "a child reads"])
    lengths = batch["attention_mask"].sum(1).tolist()
    t = batch["input_ids"].shape[1]
    packed = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert packed is not None and packed.rows < len(lengths)
    # Every token is placed once, with its own id and its position within its sentence.
    placed = packed.index[batch["attention_mask"].bool()]
    assert placed.unique().numel() == sum(lengths)
    flat_ids = packed.input_ids.reshape(-1)
    flat_pos = packed.position_ids.reshape(-1)
    for i, n in enumerate(lengths):
        where = packed.index[i, :n]
        assert torch.equal(flat_ids[where], batch["input_ids"][i, :n])
        assert torch.equal(flat_pos[where], torch.arange(n))
        assert torch.all(packed.index[i, n:] == packed.rows * t)
    # Block-diagonal attention: token -> token of the same sentence only.
    segment = torch.full((packed.rows * t,), -1)
    for i, n in enumerate(lengths):
        segment[packed.index[i, :n]] = i
    seg = segment.view(packed.rows, t)
    mask = packed.attention_mask[:, 0]
    real = seg >= 0
    want = (seg[:, :, None] == seg[:, None, :]) & real[:, :, None] & real[:, None, :]
    assert torch.equal(mask & real[:, :, None], want)
    assert torch.all(mask.diagonal(dim1=1, dim2=2))  # a pad position attends to itself: no NaN row


def test_pack_declines_when_it_saves_little_or_cannot() -> None:
    ids = torch.arange(1, 13).view(3, 4)
    full = torch.ones(3, 4, dtype=torch.long)
    assert pack(ids, full) is None  # no padding: nothing to save
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    assert pack(ids, left, min_saving=0.0) is None  # left padding: positions would be wrong
    short = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    assert pack(ids, short).rows == 2  # 3 rows -> 2: saves a third


@pytest.mark.parametrize("pooler", ["avg", "cls", "avg_first_last", "avg_top2"])
def test_packed_model_equals_padded_model(tiny_model_dir: Path, pooler: str) -> None:
    """Vectors and every parameter's gradient agree with the padded forward (fp32, no dropout)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = batch_of(tokenizer, mixed_sentences(24))
    packed_rows = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert packed_rows is not None and packed_rows.rows < 24  # the comparison below really packs

    def run(packing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp="train", dropout=0.0, packing=packing)
        model = SimCSEModel.from_config(cfg).train()
        assert model.packing == packing
        out = model(**batch)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}

    want, want_grads = run(False)
    got, got_grads = run(True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert got_grads.keys() == want_grads.keys()
    for name, g in want_grads.items():
        # Summed over every token (token-type row 0: ~200 terms of size ~1), so relative.
        scale = max(1.0, g.abs().max().item())
        torch.testing.assert_close(got_grads[name], g, atol=1e-5 * scale, rtol=0, msg=name)


def test_packing_with_fast_dropout_attention(tiny_model_dir: Path) -> None:
    """The fast-dropout attention takes the packed (boolean, block-diagonal) mask too."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = batch_of(tokenizer, mixed_sentences(16))
    assert pack(batch["input_ids"], batch["attention_mask"]) is not None
    torch.manual_seed(0)
    padded = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), dropout=1e-9, packing=False))
    torch.manual_seed(0)
    packed = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), dropout=1e-9, packing=True))
    for m in (padded, packed):
        dropouts = sum(type(d) is nn.Dropout for d in m.modules())
        # A rate that rounds to 0: the explicit attention path, nothing dropped. A fallback
        # (0 swapped) would compare padded with padded and prove nothing.
        assert dropouts > 0 and enable_fast_dropout(m) == dropouts
        assert not any(type(d) is nn.Dropout for d in m.modules())
        m.train()
    torch.testing.assert_close(packed(**batch), padded(**batch), atol=1e-5, rtol=0)


def test_roberta_packs_with_offset_positions(tmp_path: Path) -> None:
    """RoBERTa numbers positions from padding_idx + 1: without that offset the probe sees
    the difference; SimCSEModel adds it (simcse_kit.model.families), so RoBERTa packs, with
    the same vectors as without packing."""
    config = RobertaConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    encoder = RobertaModel(config, add_pooling_layer=False).eval()
    assert not packing_matches(encoder)
    assert packing_matches(encoder, position_offset=2)
    model = SimCSEModel(encoder, "avg", packing=True)
    assert model.packing
    ids = torch.randint(3, 60, (3, 6))
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    ids = torch.where(mask.bool(), ids, 1)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), SimCSEModel(encoder, "avg", packing=False)(ids, mask))


def test_training_batch_packs_into_fewer_rows(tiny_model_dir: Path) -> None:
    """A batch with some truncated sentences loses most of its padding."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = batch_of(tokenizer, mixed_sentences(64))
    packed = pack(batch["input_ids"], batch["attention_mask"])
    tokens = int(batch["attention_mask"].sum())
    assert packed is not None
    assert packed.rows * batch["input_ids"].shape[1] < 1.15 * tokens  # near-perfect fill
    assert packed.rows < 0.8 * batch["input_ids"].shape[0]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packing_in_a_bf16_model_with_fp32_tables(tiny_model_dir: Path, attn: str) -> None:
    """The recipes' bf16 model keeps its embedding tables fp32; the additive mask of eager
    attention must come in the scores' dtype (bf16), not the first parameter's (fp32)."""
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = batch_of(tokenizer, mixed_sentences(16))
    torch.manual_seed(0)
    cfg = ModelConfig(name_or_path=str(tiny_model_dir), dropout=0.0, attn_implementation=attn)
    model = SimCSEModel.from_config(cfg)
    with torch.no_grad():
        want = model(**batch)
    bf16_training(model, param_groups(model, 0.0), lr=1e-3)
    assert model.packing
    got = model(**batch)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)
    got.float().sum().backward()  # and the backward pass runs in mixed dtypes


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pooler", ["last", "avg"])
@pytest.mark.parametrize("arch", DECODERS)
def test_packed_decoder_equals_padded_decoder(arch: str, pooler: str, attn: str, decoder_dirs: dict[str, Path]) -> None:
    """A decoder packs with a causal mask per sentence (position ids that restart, no mask:
    transformers' mask builder splits the rows): vectors and every gradient equal the padded
    forward's, from left- and right-padded batches, fp32. Mistral's and Gemma3's sliding-window layers
    (window 8) see packed sentences longer than the window, beside another sentence."""
    path = decoder_dirs[arch]
    tokenizer = load_checked_tokenizer(path)
    window = sliding_window(AutoConfig.from_pretrained(path))

    def run(packing: bool, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = ModelConfig(name_or_path=str(path), pooler=pooler, dropout=0.0, packing=packing, attn_implementation=attn)
        model = SimCSEModel.from_config(cfg).train()
        assert model.packing == packing
        out = model(**batch)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}

    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = batch_of(tokenizer, mixed_sentences(24))
        packed = pack(batch["input_ids"], batch["attention_mask"], left_padding=True)
        assert packed is not None and packed.rows < 24  # the comparison below really packs
        if window is not None:  # a row holds a sentence longer than the window and another one
            rows = [[int((seg == i).sum()) for i in seg.unique() if i >= 0] for seg in packed.segment]
            assert any(len(row) > 1 and max(row) > window for row in rows), rows
        want, want_grads = run(False, batch)
        got, got_grads = run(True, batch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=side)
        assert got_grads.keys() == want_grads.keys()
        for name, g in want_grads.items():
            scale = max(1.0, g.abs().max().item())
            torch.testing.assert_close(got_grads[name], g, atol=1e-5 * scale, rtol=0, msg=f"{side} {name}")


def decoder_config(kind: str) -> object:
    """A tiny random decoder config per row of docs/architectures.md's decoder packing table
    (windows of 4: shorter than the probe's sentences)."""
    from transformers import Gemma3TextConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = {
        "vocab_size": 60, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "pad_token_id": 0,
    }  # fmt: skip
    return {
        "qwen2-sliding": lambda: Qwen2Config(
            use_sliding_window=True, sliding_window=4, layer_types=["full_attention", "sliding_attention"], **common
        ),
        "mistral-window": lambda: MistralConfig(sliding_window=4, **common),
        "gemma3-bidirectional": lambda: Gemma3TextConfig(
            head_dim=8, sliding_window=4, use_bidirectional_attention=True, **common
        ),
        "qwen3-not-causal": lambda: Qwen3Config(head_dim=8, is_causal=False, **common),
    }[kind]()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["qwen2-sliding", "mistral-window", "gemma3-bidirectional", "qwen3-not-causal"])
def test_decoder_packing_probe_per_family(kind: str, attn: str) -> None:
    """The probe's verdict per family: the mask per sentence from restarting position ids
    holds with sliding windows (Qwen2, Mistral) and Gemma3's bidirectional option, and the
    encoders' block mask does not; an ``is_causal: false`` config's mask ignores position
    ids, and takes the encoders' block mask instead, which SimCSEModel gives it."""
    from transformers import AutoModel

    torch.manual_seed(0)
    encoder = AutoModel.from_config(decoder_config(kind), attn_implementation=attn)
    causal = kind != "qwen3-not-causal"
    assert packing_matches(encoder, causal=True, attn_implementation=attn) is causal
    assert packing_matches(encoder, causal=False, attn_implementation=attn) is not causal
    assert SimCSEModel(encoder, "last", packing=True, attn_implementation=attn).packing
