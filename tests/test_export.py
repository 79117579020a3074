"""Export to sentence-transformers: every pooler reloads with equal vectors, no warnings.

References are computed two ways: simcse-kit's own Encoder, and a naive per-sentence
loop over the HF model's hidden states (no padding, pooler written out by hand), so a
bug shared by simcse-kit's Pooler and the export mapping cannot pass unnoticed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_bert, toy_sentences
from transformers import AutoModel, AutoTokenizer

from simcse_kit import export as export_mod
from simcse_kit.cli import main
from simcse_kit.config import LossConfig, ModelConfig, RunConfig, save_config
from simcse_kit.data import ContrastiveCollator
from simcse_kit.errors import ConfigError
from simcse_kit.export import EXPORT_INFO, ExportError, export_model
from simcse_kit.modeling import SIMCSE_CONFIG, Encoder, SentenceTransformerEncoder, SimCSEModel, load_encoder, resolve_model_path
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.sts import format_table

MAX_LEN = 24
CASES = [
    ("cls", "train"),
    ("cls", "always"),
    ("cls_before_pooler", "none"),
    ("avg", "none"),
    ("avg_first_last", "none"),
    ("avg_top2", "none"),
]
# Unseen by the export's own check; the last one runs past MAX_LEN (truncation must match).
CHECK_SENTENCES = toy_sentences(24) + ["a man plays the guitar in the park with two children " * 6]


@pytest.fixture(scope="module")
def bert3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random 3-layer BERT + a tokenizer that knows the toy words.

    Not ``tiny_model_dir``: with 2 layers avg_first_last and avg_top2 read the same
    layers (the test could not tell them apart), and under transformers 5
    ``BertTokenizerFast(vocab_file=...)`` ignores the file, so every word is [UNK].
    """
    return save_tiny_bert(tmp_path_factory.mktemp("bert3"), layers=3)


def train_and_save(base: Path, pooler: str, mlp: str, out: Path, steps: int = 2) -> Path:
    """A couple of real optimiser steps (unsup SimCSE), then ``SimCSEModel.save``."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler=pooler, mlp=mlp, eval_max_seq_len=MAX_LEN))
    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    collator = ContrastiveCollator(tokenizer, "unsup", 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sentences = toy_sentences(16)
    model.train()
    for step in range(steps):
        batch = collator([{"sent0": s} for s in sentences[step * 8 : (step + 1) * 8]])
        loss = objective.step(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save(out, tokenizer, {"base_model": str(base), "mode": "unsup", "train_file": "toy.txt"})
    return out


def naive_embeddings(model_dir: Path, sentences: list[str]) -> torch.Tensor:
    """One sentence at a time (no padding), pooler and MLP written out from the HF outputs."""
    meta = json.loads((model_dir / SIMCSE_CONFIG).read_text())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoder = AutoModel.from_pretrained(model_dir).eval()
    head = None
    if meta["mlp"] == "always":
        from safetensors.torch import load_file

        head = load_file(str(model_dir / "simcse_head.safetensors"))
    rows = []
    with torch.no_grad():
        for sentence in sentences:
            ids = tokenizer(sentence, truncation=True, max_length=meta["max_seq_len"], return_tensors="pt")
            hs = encoder(**ids, output_hidden_states=True).hidden_states  # embeddings + 3 layers
            tokens = {
                "cls": hs[3][0, :1],
                "cls_before_pooler": hs[3][0, :1],
                "avg": hs[3][0],
                "avg_first_last": (hs[1][0] + hs[3][0]) / 2,
                "avg_top2": (hs[2][0] + hs[3][0]) / 2,
            }[meta["pooler"]]
            vec = tokens.mean(dim=0)
            if head is not None:
                vec = torch.tanh(vec @ head["dense.weight"].T + head["dense.bias"])
            rows.append(vec)
    return torch.stack(rows)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def load_quietly(path: Path) -> tuple[object, list[str]]:
    """``SentenceTransformer(path)`` plus every warning and WARNING+ log it produced."""
    from sentence_transformers import SentenceTransformer

    handler = Records()
    root = logging.getLogger()
    root.addHandler(handler)
    # simcse_kit.cli.main (run by other tests in this process) sets this logger to WARNING,
    # which makes transformers log a tensor-parallel notice on every load; a user's fresh
    # process has it unset (test_fresh_process_load_is_silent checks that for real).
    mu_logger = logging.getLogger("transformers.modeling_utils")
    mu_level = mu_logger.level
    mu_logger.setLevel(logging.NOTSET)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = SentenceTransformer(str(path), device="cpu")
    finally:
        root.removeHandler(handler)
        mu_logger.setLevel(mu_level)
    return model, [str(w.message) for w in caught] + [f"{r.name}: {r.getMessage()}" for r in handler.records]


@pytest.mark.parametrize(("pooler", "mlp"), CASES)
def test_every_pooler_reloads_equal_without_warnings(tmp_path: Path, bert3_dir: Path, pooler: str, mlp: str) -> None:
    model_dir = train_and_save(bert3_dir, pooler, mlp, tmp_path / "model")
    result = export_model(model_dir, tmp_path / "st")
    assert result.min_cosine >= 0.9999

    st, noise = load_quietly(tmp_path / "st")
    assert noise == []
    assert st.similarity_fn_name == "cosine"
    assert st.max_seq_length == MAX_LEN
    kinds = [type(m).__name__ for m in st]
    want_kinds = {
        "cls": ["Transformer", "Pooling"],
        "cls_before_pooler": ["Transformer", "Pooling"],
        "avg": ["Transformer", "Pooling"],
        "avg_first_last": ["Transformer", "WeightedLayerPooling", "Pooling"],
        "avg_top2": ["Transformer", "WeightedLayerPooling", "Pooling"],
    }[pooler] + (["Dense"] if mlp == "always" else [])
    assert kinds == want_kinds
    # A plain sentence-transformers folder: loaders never take it for a simcse-kit model.
    assert not (tmp_path / "st" / SIMCSE_CONFIG).exists()

    got = st.encode(CHECK_SENTENCES, convert_to_tensor=True, show_progress_bar=False).float()
    model = SimCSEModel.load(model_dir)
    ours = Encoder(model, AutoTokenizer.from_pretrained(model_dir), model.max_seq_len).encode(CHECK_SENTENCES)
    naive = naive_embeddings(model_dir, CHECK_SENTENCES)
    assert torch.allclose(got, ours, atol=1e-5, rtol=0)
    assert torch.allclose(got, naive, atol=1e-5, rtol=0)
    # The long sentence really was truncated (else the check above proves less).
    assert len(AutoTokenizer.from_pretrained(model_dir)(CHECK_SENTENCES[-1])["input_ids"]) > MAX_LEN


def test_fresh_process_load_is_silent(tmp_path: Path, bert3_dir: Path) -> None:
    """What a user sees: a new Python process, all warnings on, nothing on stderr."""
    folders = []
    # One export per module kind (Pooling, WeightedLayerPooling, Dense); the in-process
    # test above covers every pooler.
    for pooler, mlp in [("cls", "always"), ("avg", "none"), ("avg_first_last", "none")]:
        model_dir = train_and_save(bert3_dir, pooler, mlp, tmp_path / f"model-{pooler}-{mlp}")
        folders.append(str(export_model(model_dir, tmp_path / f"st-{pooler}-{mlp}").out_dir))
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from sentence_transformers import SentenceTransformer\n"
        "for path in sys.argv[1:]:\n"
        "    SentenceTransformer(path, device='cpu').encode(['a man plays guitar'])\n"
        "print('ok')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", script, *folders], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    noise = [line for line in proc.stderr.splitlines() if line.strip() and "Loading weights" not in line]
    assert noise == []


def test_mlp_train_is_dropped_and_always_is_kept(tmp_path: Path, bert3_dir: Path) -> None:
    """SimCSE unsup drops the MLP at inference; supervised keeps it. The two must differ."""
    model_dir = train_and_save(bert3_dir, "cls", "always", tmp_path / "model")
    export_model(model_dir, tmp_path / "st")
    st, _ = load_quietly(tmp_path / "st")
    with_mlp = st.encode(CHECK_SENTENCES, convert_to_tensor=True)
    model = SimCSEModel.load(model_dir)
    # Two steps at lr 1e-2 moved the head off its zero-bias init: it is a trained head.
    assert model.mlp is not None and model.mlp.dense.bias.abs().max() > 1e-3
    model.mlp_mode = "train"  # same weights, MLP off at inference
    without = Encoder(model, AutoTokenizer.from_pretrained(model_dir), MAX_LEN).encode(CHECK_SENTENCES)
    assert (with_mlp - without).abs().max() > 0.1
    with torch.no_grad():
        assert torch.allclose(with_mlp, torch.tanh(without @ model.mlp.dense.weight.T + model.mlp.dense.bias), atol=1e-5)


def test_parity_failure_leaves_nothing(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong mapping (mean pooling for a cls model: the classic silent bug) is caught."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    model_dir = train_and_save(bert3_dir, "cls", "none", tmp_path / "model")
    monkeypatch.setattr(export_mod, "pooling_modules", lambda pooler, h, n: [Pooling(h, pooling_mode="mean")])
    out = tmp_path / "exports" / "st"
    with pytest.raises(ExportError, match="disagrees"):
        export_model(model_dir, out)
    assert not out.exists()
    assert list((tmp_path / "exports").iterdir()) == []  # no temp folder left behind either

    assert main(["export", str(model_dir), str(out)]) == 1
    assert not out.exists()


def test_failed_overwrite_keeps_the_old_export(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling

    model_dir = train_and_save(bert3_dir, "cls", "none", tmp_path / "model")
    out = tmp_path / "st"
    export_model(model_dir, out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match="already exists"):
        export_model(model_dir, out)
    monkeypatch.setattr(export_mod, "pooling_modules", lambda pooler, h, n: [Pooling(h, pooling_mode="mean")])
    with pytest.raises(ExportError):
        export_model(model_dir, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "st"]
    monkeypatch.undo()
    assert export_model(model_dir, out, overwrite=True).min_cosine >= 0.9999


def test_refusals(tmp_path: Path, bert3_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not a simcse-kit run or model"):
        export_model(bert3_dir, tmp_path / "st")  # plain HF folder: no recorded pooler
    model_dir = train_and_save(bert3_dir, "avg", "none", tmp_path / "model")
    with pytest.raises(ConfigError, match="must not replace"):
        export_model(model_dir, model_dir)
    with pytest.raises(ConfigError, match="must not replace"):
        export_model(model_dir, model_dir / "st")
    with pytest.raises(ExportError, match="no exact sentence-transformers equivalent"):
        export_mod.pooling_modules("max", 32, 3)
    assert main(["export", str(bert3_dir), str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def make_run(tmp_path: Path, base: Path) -> Path:
    """A run folder as ``training.train`` leaves it (config.yaml, metrics.json, best_model/)."""
    run = tmp_path / "run"
    train_and_save(base, "avg_first_last", "train", run / "best_model")
    cfg = RunConfig()
    cfg.model.name_or_path = str(base)
    cfg.model.pooler, cfg.model.mlp, cfg.model.eval_max_seq_len = "avg_first_last", "train", MAX_LEN
    cfg.data.train_file, cfg.data.max_train_samples = "toy.txt", 16
    cfg.train.max_steps = 2
    save_config(cfg, run / "config.yaml")
    sts = {
        "STS12": 41.5,
        "STS13": 42.25,
        "STS14": 43.0,
        "STS15": 44.0,
        "STS16": 45.0,
        "STSBenchmark": 46.0,
        "SICKRelatedness": 47.0,
    }
    sts["avg"] = sum(sts.values()) / 7
    metrics = {"best_step": 2, "best_stsb_dev": 48.123, "steps": 2, "sts": sts}
    (run / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    return run


def test_run_export_card_and_cli(tmp_path: Path, bert3_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path, bert3_dir)
    out = tmp_path / "st"
    assert main(["export", str(run), str(out)]) == 0
    assert "parity: min cosine 1.0000000" in capsys.readouterr().out

    card = (out / "README.md").read_text(encoding="utf-8")
    sts = json.loads((run / "metrics.json").read_text())["sts"]
    assert format_table(sts) in card  # the run's STS table, verbatim
    assert f"`{bert3_dir}`" in card  # base model
    assert "`toy.txt` (first 16 examples)" in card  # training data
    assert "unsup SimCSE" in card and "max_steps: 2" in card  # recipe
    assert "48.12" in card  # best STS-B dev
    assert "`avg_first_last`" in card and "WeightedLayerPooling" in card
    assert "used in training only" in card
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["pooler"] == "avg_first_last" and info["parity_min_cosine"] >= 0.9999
    assert info["source"] == str(run)


def test_evaluate_gives_the_same_numbers(tmp_path: Path, bert3_dir: Path, data_dir: Path) -> None:
    """``load_encoder`` sends the export through SentenceTransformer; STS-B scores match."""
    from simcse_kit.evaluation import evaluate_model

    run = make_run(tmp_path, bert3_dir)
    export_model(run, tmp_path / "st")
    encoder = load_encoder(tmp_path / "st")
    assert isinstance(encoder, SentenceTransformerEncoder)
    assert torch.allclose(encoder.encode(CHECK_SENTENCES), load_encoder(run).encode(CHECK_SENTENCES), atol=1e-5)

    kwargs = {"data_dir": data_dir / "senteval", "tasks": ["STSBenchmark"], "batch_size": 128}
    before = evaluate_model(run, **kwargs)
    after = evaluate_model(tmp_path / "st", **kwargs)
    assert before.keys() == after.keys()
    for key in before:
        assert after[key] == pytest.approx(before[key], abs=1e-3), key


@pytest.mark.slow
def test_default_model_export_scores_the_same(tmp_path: Path, data_dir: Path) -> None:
    """all-MiniLM-L6-v2 wrapped as a simcse-kit model: ST encode + scipy == simcse-kit evaluate."""
    import numpy as np
    from scipy.stats import spearmanr

    from simcse_kit.evaluation import evaluate_model
    from simcse_kit.sts import read_stsb

    model = SimCSEModel.from_config(ModelConfig(pooler="avg", mlp="none"))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    model.save(tmp_path / "model", tokenizer, {"base_model": "all-MiniLM-L6-v2", "mode": "unsup"})
    export_model(tmp_path / "model", tmp_path / "st")

    ours = evaluate_model(tmp_path / "model", data_dir=data_dir / "senteval", tasks=["STSBenchmark"])["STSBenchmark"]
    st, noise = load_quietly(tmp_path / "st")
    assert noise == []
    pairs = read_stsb(data_dir / "senteval" / "STS" / "STSBenchmark" / "sts-test.csv")
    a = st.encode(pairs.sentences1, convert_to_tensor=True)
    b = st.encode(pairs.sentences2, convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(a, b).numpy()
    theirs = 100 * spearmanr(cos, np.asarray(pairs.scores)).statistic
    assert theirs == pytest.approx(ours, abs=0.05)
