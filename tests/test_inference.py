"""Sentences -> vectors: input order kept across sorting and blocks, each vector equal to
encoding its sentence alone, and load_encoder opening each kind of folder it names."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences
from transformers import AutoModel, AutoTokenizer

from simcse_kit.config.run import ModelConfig
from simcse_kit.errors import ConfigError
from simcse_kit.model.inference import Encoder, SentenceTransformerEncoder, autocast_context, load_encoder
from simcse_kit.model.modeling import SimCSEModel


def one_at_a_time(model: SimCSEModel, tokenizer: object, sentences: list[str], max_len: int) -> torch.Tensor:
    """The naive reference: each sentence alone, no padding, no sorting."""
    with torch.no_grad():
        rows = [model(**tokenizer([s], truncation=True, max_length=max_len, return_tensors="pt")) for s in sentences]
    return torch.cat(rows)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir: Path) -> tuple[SimCSEModel, object]:
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="always")).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_encode_equals_one_sentence_at_a_time_in_input_order(
    model_and_tokenizer: tuple[SimCSEModel, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = model_and_tokenizer
    sentences = toy_sentences(23) + ["a man plays the guitar " * 20]  # one truncated at 16
    want = one_at_a_time(model, tokenizer, sentences, 16)
    encoder = Encoder(model, tokenizer, max_seq_len=16)
    got = encoder.encode(sentences, batch_size=4)
    assert got.shape == (24, 32) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    monkeypatch.setattr(Encoder, "BLOCK_BATCHES", 1)  # blocks of 4 sentences: order across blocks
    torch.testing.assert_close(encoder(sentences, batch_size=4), want, atol=1e-5, rtol=0)
    assert encoder.encode([]).shape == (0, 0)


def test_autocast_context() -> None:
    cpu = torch.device("cpu")
    assert isinstance(autocast_context(cpu, "no"), nullcontext)
    with autocast_context(cpu, "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_load_encoder_opens_each_kind_of_folder(
    model_and_tokenizer: tuple[SimCSEModel, object], tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = model_and_tokenizer
    sentences = toy_sentences(10)
    want = one_at_a_time(model, tokenizer, sentences, 64)
    model.save(tmp_path / "run" / "best_model", tokenizer)
    for folder in (tmp_path / "run", tmp_path / "run" / "best_model"):  # a run folder or its model
        encoder = load_encoder(folder, pooler="cls")
        assert isinstance(encoder, Encoder) and encoder.model.pooler.mode == "avg"  # its own pooler wins
        torch.testing.assert_close(encoder.encode(sentences), want, atol=1e-5, rtol=0)
    assert "ignored" in caplog.text

    # A plain transformers folder: the pooler must be named, and is the mean of its states.
    with pytest.raises(ConfigError, match="pass --pooler"):
        load_encoder(tiny_model_dir)
    plain = load_encoder(tiny_model_dir, pooler="avg", max_seq_len=64)
    bare = AutoModel.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        means = []
        for s in sentences:
            states = bare(**tokenizer([s], return_tensors="pt")).last_hidden_state
            means.append(states.mean(dim=1))
    torch.testing.assert_close(plain.encode(sentences), torch.cat(means), atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="no such model folder"):
        load_encoder(tmp_path / "missing", pooler="avg")


def test_load_encoder_opens_a_sentence_transformers_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The folder's own modules decide: mean pooling + normalisation, as sentence-transformers does."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    st = SentenceTransformer(modules=[Transformer(str(tiny_model_dir)), Pooling(32, "mean"), Normalize()])
    st.save(str(tmp_path / "st"))
    encoder = load_encoder(tmp_path / "st")
    assert isinstance(encoder, SentenceTransformerEncoder)
    sentences = toy_sentences(6)
    want = torch.nn.functional.normalize(load_encoder(tiny_model_dir, pooler="avg").encode(sentences), dim=-1)
    torch.testing.assert_close(encoder.encode(sentences), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["bf16", "auto"])
def test_precision_applies_to_sentence_transformers_folders(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``evaluate --precision bf16`` used to be ignored for sentence-transformers folders
    (all-MiniLM-L6-v2 and every export): the vectors came out bit-equal to fp32."""
    from simcse_kit.model import precision as precision_module

    # "auto" decides from the CPU's declared flags; make this CPU look native-bf16 whatever it is
    # (and its warning-only probe agree).
    monkeypatch.setattr(precision_module, "cpu_bf16_support", lambda: precision_module.CpuSupport(True, "test: native bf16"))
    monkeypatch.setattr(precision_module, "cpu_matmul_speeds", lambda dtype, *a, **k: precision_module.MatmulSpeeds(50.0, 150.0))
    sentences = ["a man is playing a guitar.", "two dogs run in the park.", "the cat sleeps on the bed."]
    fp32 = load_encoder("all-MiniLM-L6-v2").encode(sentences)
    low = load_encoder("all-MiniLM-L6-v2", precision=precision)
    assert isinstance(low, SentenceTransformerEncoder) and low.precision == "bf16"
    out = low.encode(sentences)
    assert not torch.equal(out, fp32)  # bf16 really ran
    assert torch.nn.functional.cosine_similarity(out, fp32).min() > 0.99  # and is the same model
