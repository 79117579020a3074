"""Any encoder a user brings (issue 17): every tested architecture, built tiny and random
with a tokenizer of its own kind, trains, reloads its best model, evaluates and exports
with parity; its attention, packing, segment ids and dropout are handled per model.

Old code failed here for MPNet and DeBERTa-v2 (SDPA was forced at load: ValueError),
passed ``token_type_ids`` to DistilBERT, and set no dropout on DistilBERT/ModernBERT.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences, write_tiny_senteval, write_train_data
from tiny_encoders import ARCHITECTURES, build_tiny
from transformers import AutoTokenizer

from simcse_kit.config.run import MODES, POOLERS, DataConfig, LossConfig, ModelConfig, RunConfig, TrainConfig
from simcse_kit.core.batch import model_inputs
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import load_train_dataset
from simcse_kit.errors import ConfigError
from simcse_kit.model import families
from simcse_kit.model.modeling import SIMCSE_CONFIG, SimCSEModel
from simcse_kit.training.objective.objectives import SimCSEObjective

# What each architecture supports, measured on the tiny models (docs/families.md
# holds the same table): attention under "auto", packing (the probe passes), whether
# forward() takes token_type_ids, whether the model has its own pooler layer.
EXPECTED = {
    "bert": ("sdpa", True, True, True),
    "roberta": ("sdpa", True, True, True),  # packs with offset position ids (padding_idx + 1)
    "xlm-roberta": ("sdpa", True, True, True),
    "mpnet": ("eager", True, False, True),  # relative bias is shift-invariant: packs with offset ids
    "distilbert": ("sdpa", True, False, False),
    "deberta-v2": ("eager", False, True, False),  # builds its own mask from a 2-D one: rejects a 4-D mask
    "electra": ("sdpa", True, True, False),
    "modernbert": ("sdpa", False, False, False),  # a 4-D mask would override its sliding window
}
assert set(EXPECTED) == set(ARCHITECTURES)

# One full run per architecture, rotating modes and (pooler, mlp) so every combination
# of each runs somewhere; every pooler and mode also runs on every architecture below.
RUNS = {
    "bert": ("unsup", "cls", "train"),
    "roberta": ("sup", "avg", "none"),
    "xlm-roberta": ("hardneg", "cls", "always"),
    "mpnet": ("unsup", "avg", "none"),
    "distilbert": ("sup", "avg_first_last", "none"),
    "deberta-v2": ("hardneg", "avg_top2", "none"),
    "electra": ("unsup", "cls_before_pooler", "none"),
    "modernbert": ("unsup", "cls", "train"),
}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {arch: build_tiny(arch, root / arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="module")
def senteval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_senteval(tmp_path_factory.mktemp("senteval"))


def fixed_loss(model: SimCSEModel, objective: SimCSEObjective, batch: dict[str, torch.Tensor]) -> float:
    """The loss on one batch averaged over 16 dropout draws: one draw moves by ~10%."""
    model.train()
    torch.manual_seed(123)
    with torch.no_grad():
        return sum(objective.loss(objective.embed(model, batch), batch).item() for _ in range(16)) / 16


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_facts_are_measured_not_guessed(arch: str, tiny_dirs: dict[str, Path]) -> None:
    attn, packs, segment_ids, pooler_layer = EXPECTED[arch]
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler="cls"))
    assert model.attn_implementation == attn
    assert model.packing is packs
    assert families.takes_token_type_ids(model.encoder) is segment_ids
    assert families.has_pooler_layer(model.encoder) is pooler_layer
    # RoBERTa-style embeddings count positions from padding_idx + 1 (= 2 with <pad> = 1).
    assert families.position_offset(model.encoder) == (2 if arch in ("roberta", "xlm-roberta", "mpnet") else 0)
    # An explicit choice is honoured, or refused with the key named (never silently swapped).
    if attn == "eager":
        with pytest.raises(ConfigError, match="model.attn_implementation"):
            SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), attn_implementation="sdpa"))
    explicit = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), attn_implementation="eager"))
    assert explicit.attn_implementation == "eager"
    assert explicit.packing is packs  # the additive mask packs as well as SDPA's boolean one


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_dropout_setting_reaches_every_site(arch: str, tiny_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    batch = dict(tokenizer(toy_sentences(6), padding=True, return_tensors="pt"))

    def two_passes(dropout: float | None) -> tuple[torch.Tensor, torch.Tensor, SimCSEModel]:
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler="avg", dropout=dropout))
        model.train()
        with torch.no_grad():
            return model(**batch), model(**batch), model

    a, b, model = two_passes(0.0)
    assert torch.equal(a, b), "model.dropout 0.0 must switch every dropout off"
    assert set(families.dropout_rates(model.encoder).values()) <= {0.0}
    a, b, model = two_passes(0.25)
    assert not torch.allclose(a, b)
    rates = families.dropout_rates(model.encoder)
    assert rates and set(rates.values()) == {0.25}, rates
    with caplog.at_level(logging.WARNING, logger="simcse_kit"):
        a, b, model = two_passes(None)
    if arch == "modernbert":  # its own config has no dropout: the default keeps that, and says so
        assert torch.equal(a, b)
        assert "has no dropout" in caplog.text
    else:
        assert not torch.allclose(a, b), "the model's own dropout (the default) makes two passes differ"
        assert "has no dropout" not in caplog.text


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fast_path_where_verified(arch: str, tiny_dirs: dict[str, Path]) -> None:
    """Fast dropout everywhere; its attention only on models built on AttentionInterface
    (MPNet and DeBERTa-v2 keep their own); eval outputs unchanged, training still random."""
    from simcse_kit.model.fastpath import ATTENTION_NAME, FastDropout, enable_fast_dropout, internals

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler="avg", dropout=0.1)).eval()
    batch = dict(AutoTokenizer.from_pretrained(tiny_dirs[arch])(toy_sentences(6), padding=True, return_tensors="pt"))
    with torch.no_grad():
        reference = model(**batch)
    attention = internals.attention_implementation(model.encoder)
    assert enable_fast_dropout(model) > 0
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert any(isinstance(m, FastDropout) for m in model.modules())
    own_attention = arch in ("mpnet", "deberta-v2")
    assert internals.attention_implementation(model.encoder) == (attention if own_attention else ATTENTION_NAME)
    assert set(families.dropout_rates(model.encoder).values()) == {0.1}
    assert not model.training, "the swap keeps the model's eval mode"
    with torch.no_grad():
        torch.testing.assert_close(model(**batch), reference, atol=1e-5, rtol=0)
        model.train()
        assert not torch.allclose(model(**batch), model(**batch))


def test_fast_path_failing_its_check_is_undone(
    tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from simcse_kit.model.fastpath import dropout, enable_fast_dropout, internals

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs["bert"]), dropout=0.1))
    dropouts = [m for m in model.modules() if type(m) is torch.nn.Dropout]
    calls = iter([[torch.zeros(2)], [torch.ones(2)]])  # "after" differs from "before"
    monkeypatch.setattr(dropout, "_probe_outputs", lambda *_: next(calls))
    with caplog.at_level(logging.WARNING, logger="simcse_kit"):
        assert enable_fast_dropout(model) == 0
    assert "fast dropout off" in caplog.text
    assert [m for m in model.modules() if type(m) is torch.nn.Dropout] == dropouts
    assert internals.attention_implementation(model.encoder) == "sdpa"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_mode_and_pooler_trains_a_step(arch: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """One optimiser step per (mode, pooler): finite loss, gradients reach the encoder's
    first layer, and the packed model gives the padded model's vectors."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    for mode in MODES:
        dataset = load_train_dataset(str(write_train_data(tmp_path, mode)), mode)
        batch = ContrastiveCollator(tokenizer, mode, 16)([dataset[i] for i in range(6)])
        objective = SimCSEObjective(mode, LossConfig(temperature=0.05))
        for pooler in POOLERS:
            torch.manual_seed(0)
            cfg = ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler=pooler, dropout=0.0)
            model = SimCSEModel.from_config(cfg).train()
            loss = objective.step(model, batch)  # backward=None: loss.backward()
            assert math.isfinite(loss.item()) and loss.item() > 0
            grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
            assert grads and all(torch.isfinite(g).all() for g in grads)
            if model.packing:  # same vectors without packing (dropout 0: deterministic)
                padded = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler=pooler, packing=False))
                padded.load_state_dict(model.state_dict())
                with torch.no_grad():
                    kwargs = model_inputs(batch)  # not text_ids, nor a scored batch's scores
                    assert torch.allclose(model.eval()(**kwargs), padded.eval()(**kwargs), atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_train_reload_evaluate_export(arch: str, tiny_dirs: dict[str, Path], senteval: Path, tmp_path: Path) -> None:
    """The issue's path end to end: `simcse-kit train` -> best model reloaded -> STS
    table -> export to sentence-transformers with parity >= 0.9999."""
    from sentence_transformers import SentenceTransformer

    from simcse_kit.export import export_model
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.training.wiring.run import train

    mode, pooler, mlp = RUNS[arch]
    cfg = RunConfig(
        model=ModelConfig(
            name_or_path=str(tiny_dirs[arch]), pooler=pooler, mlp=mlp, max_seq_len=16, eval_max_seq_len=32, dropout=0.1
        ),
        data=DataConfig(mode=mode, train_file=str(write_train_data(tmp_path, mode)), eval_data_dir=str(senteval)),
        loss=LossConfig(temperature=0.05),
        train=TrainConfig(
            output_dir=str(tmp_path / "run"),
            batch_size=8,
            learning_rate=1e-3,
            num_epochs=4,
            eval_steps=0,  # evaluated once, at the end: the best model is the final one
            eval_at_start=False,
            mixed_precision="no",  # the same numbers on every CPU (auto would pick bf16 on some)
            seed=7,
            progress_bar=False,
        ),
    ).validate()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    objective = SimCSEObjective(mode, cfg.loss)
    dataset = load_train_dataset(cfg.data.train_file, mode)
    fixed = ContrastiveCollator(tokenizer, mode, cfg.model.max_seq_len)([dataset[i] for i in range(8)])
    torch.manual_seed(cfg.train.seed)
    before = fixed_loss(SimCSEModel.from_config(cfg.model), objective, fixed)

    metrics = train(cfg)

    best_dir = tmp_path / "run" / "best_model"
    meta = json.loads((best_dir / SIMCSE_CONFIG).read_text())
    assert meta["attn_implementation"] == EXPECTED[arch][0]
    best = SimCSEModel.load(best_dir)
    assert best.attn_implementation == EXPECTED[arch][0]
    after = fixed_loss(best, objective, fixed)
    assert after < 0.9 * before, (before, after)
    assert metrics["steps"] == 16
    sts = metrics["sts"]
    assert {"STS12", "STSBenchmark", "SICKRelatedness", "avg"} <= set(sts) and all(math.isfinite(v) for v in sts.values())

    result = export_model(tmp_path / "run", tmp_path / "export")
    assert result.min_cosine >= 0.9999
    sents = toy_sentences(12) + ["an unknown word or two", "a " * 60]
    ours = load_encoder(tmp_path / "run").encode(sents)
    theirs = SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(sents, convert_to_tensor=True).float()
    cos = torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=-1)
    assert cos.min().item() >= 0.9999, cos


@pytest.mark.parametrize("pooler", POOLERS)
def test_every_pooler_exports_on_every_architecture(pooler: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from simcse_kit.export import export_model

    mlp = "always" if pooler == "cls" else "none"  # the MLP kept at inference exports too
    for arch in ARCHITECTURES:
        cfg = ModelConfig(name_or_path=str(tiny_dirs[arch]), pooler=pooler, mlp=mlp, eval_max_seq_len=32)
        model = SimCSEModel.from_config(cfg)
        model.save(tmp_path / arch, AutoTokenizer.from_pretrained(tiny_dirs[arch]))
        assert export_model(tmp_path / arch, tmp_path / f"{arch}-st").min_cosine >= 0.9999, arch


def test_unknown_dropout_keys_fail_loudly() -> None:
    with pytest.raises(ConfigError, match="model.dropout"):
        families.dropout_overrides("albert", 0.1)
    # A model whose dropout sites are not all set is refused, naming a site.
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))
    model.encoder.layer[0].output.dropout.p = 0.3
    with pytest.raises(ConfigError, match=r"encoder\.layer\.0\.output\.dropout=0\.3"):
        families.check_dropout(model, 0.1)


def test_probe_outlasts_a_sliding_window() -> None:
    from transformers import BertConfig, ModernBertConfig

    assert families.probe_lengths(BertConfig()) == (5, 3, 2)
    n, a, b = families.probe_lengths(ModernBertConfig(local_attention=8))
    assert n > ModernBertConfig(local_attention=8).sliding_window + 1 and a + b == n
    assert families.max_tokens(ModernBertConfig(max_position_embeddings=64)) == 64
    from transformers import RobertaConfig

    assert families.max_tokens(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
