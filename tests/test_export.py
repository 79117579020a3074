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
import yaml
from conftest import save_tiny_bert, toy_sentences, write_tiny_senteval
from transformers import AutoModel, AutoTokenizer

from simcse_kit import export as export_mod
from simcse_kit.cli import main
from simcse_kit.config.run import LossConfig, ModelConfig, RunConfig, save_config
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import format_table
from simcse_kit.export import EXPORT_INFO, ExportError, export_model, exporter, folder, sts_gate
from simcse_kit.export.card import training_rows
from simcse_kit.model.inference import Encoder, SentenceTransformerEncoder, load_encoder
from simcse_kit.model.modeling import SIMCSE_CONFIG, SimCSEModel, resolve_model_path
from simcse_kit.training.objective.objectives import SimCSEObjective

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
        optimizer.zero_grad()
        objective.step(model, batch)  # backward=None: loss.backward()
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


def normalized(x: torch.Tensor, on: bool) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1) if on else x


@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "raw"])
@pytest.mark.parametrize(("pooler", "mlp"), CASES)
def test_every_pooler_reloads_equal_without_warnings(
    tmp_path: Path, bert3_dir: Path, pooler: str, mlp: str, normalize: bool
) -> None:
    model_dir = train_and_save(bert3_dir, pooler, mlp, tmp_path / "model")
    result = export_model(model_dir, tmp_path / "st", normalize=normalize)
    assert result.min_cosine >= 0.9999 and result.normalize is normalize

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
    assert kinds == want_kinds + (["Normalize"] if normalize else [])
    # A plain sentence-transformers folder: loaders never take it for a simcse-kit model.
    assert not (tmp_path / "st" / SIMCSE_CONFIG).exists()

    got = st.encode(CHECK_SENTENCES, convert_to_tensor=True, show_progress_bar=False).float()
    model = SimCSEModel.load(model_dir)
    ours = Encoder(model, AutoTokenizer.from_pretrained(model_dir), model.max_seq_len).encode(CHECK_SENTENCES)
    naive = naive_embeddings(model_dir, CHECK_SENTENCES)
    assert torch.allclose(got, normalized(ours, normalize), atol=1e-5, rtol=0)
    assert torch.allclose(got, normalized(naive, normalize), atol=1e-5, rtol=0)
    if normalize:
        assert torch.allclose(got.norm(dim=-1), torch.ones(len(CHECK_SENTENCES)), atol=1e-6)
    # The long sentence really was truncated (else the check above proves less).
    assert len(AutoTokenizer.from_pretrained(model_dir)(CHECK_SENTENCES[-1])["input_ids"]) > MAX_LEN


OLD_POOLING_KEYS = {
    "word_embedding_dimension",
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
}


def test_files_use_the_format_every_version_reads(tmp_path: Path, bert3_dir: Path) -> None:
    """Known answer: the files all-MiniLM-L6-v2 ships (read by sentence-transformers 2.x-6.x),
    not what sentence-transformers 6 saves (6-only class paths, ``embedding_dimension`` ...)."""
    model_dir = train_and_save(bert3_dir, "cls", "always", tmp_path / "model")
    out = tmp_path / "st"
    export_model(model_dir, out)
    modules = json.loads((out / "modules.json").read_text())
    assert modules == [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    assert json.loads((out / "sentence_bert_config.json").read_text()) == {"max_seq_length": MAX_LEN, "do_lower_case": False}
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert set(pooling) == OLD_POOLING_KEYS and pooling["pooling_mode_cls_token"] is True
    assert pooling["word_embedding_dimension"] == 32
    dense = json.loads((out / "2_Dense" / "config.json").read_text())
    assert dense == {
        "in_features": 32,
        "out_features": 32,
        "bias": True,
        "activation_function": "torch.nn.modules.activation.Tanh",
    }
    from safetensors.torch import load_file

    head = load_file(str(model_dir / "simcse_head.safetensors"))
    weights = load_file(str(out / "2_Dense" / "model.safetensors"))
    assert set(weights) == {"linear.weight", "linear.bias"}
    assert torch.equal(weights["linear.weight"], head["dense.weight"]) and torch.equal(weights["linear.bias"], head["dense.bias"])
    assert list((out / "3_Normalize").iterdir()) == []
    st_cfg = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st_cfg["similarity_fn_name"] == "cosine" and st_cfg["__version__"]["sentence_transformers"] == "3.0.0"
    assert "model_type" not in st_cfg
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["normalize"] is True and info["normalize_reason"] == "trained with cosine similarity"
    assert info["sentence_transformers_compat_tested"] == list(export_mod.COMPAT_TESTED)

    model_dir = train_and_save(bert3_dir, "avg_first_last", "none", tmp_path / "model-afl")
    export_model(model_dir, tmp_path / "afl", normalize=False)
    layers = json.loads((tmp_path / "afl" / "1_WeightedLayerPooling" / "config.json").read_text())
    assert layers == {"word_embedding_dimension": 32, "layer_start": 1, "num_hidden_layers": 3}
    assert load_file(str(tmp_path / "afl" / "1_WeightedLayerPooling" / "model.safetensors"))["layer_weights"].tolist() == [
        1,
        0,
        1,
    ]
    assert json.loads((tmp_path / "afl" / "config.json").read_text())["output_hidden_states"] is True
    assert [m["path"] for m in json.loads((tmp_path / "afl" / "modules.json").read_text())] == [
        "",
        "1_WeightedLayerPooling",
        "2_Pooling",
    ]


def test_normalize_follows_the_base_model(tmp_path: Path, bert3_dir: Path) -> None:
    """Kept when the base was a sentence-transformers folder ending in Normalize; added for
    cosine training; --no-normalize wins; a non-cosine model without such a base gets none."""
    import shutil

    st_base = tmp_path / "st-base"
    shutil.copytree(bert3_dir, st_base)
    (st_base / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    model_dir = train_and_save(st_base, "avg", "none", tmp_path / "model")
    meta = json.loads((model_dir / SIMCSE_CONFIG).read_text())
    assert meta["base_model"] == str(st_base)
    source = export_mod.find_source(model_dir)
    assert export_mod.decide_normalize(source, None) == (True, f"kept from the base model {st_base}")
    assert export_mod.decide_normalize(source, False) == (False, "turned off (--no-normalize)")
    source.meta["similarity"] = "dot"
    assert export_mod.decide_normalize(source, None)[0] is True  # the base still had it
    source.meta["base_model"] = str(bert3_dir)  # plain HF base: no modules.json
    assert export_mod.decide_normalize(source, None) == (False, "trained with dot similarity")
    source.meta["similarity"] = "cosine"
    assert export_mod.decide_normalize(source, None) == (True, "trained with cosine similarity")

    result = export_model(model_dir, tmp_path / "st")
    assert result.normalize and result.normalize_reason.startswith("kept from the base model")
    card = (tmp_path / "st" / "README.md").read_text()
    assert "| normalize | yes (kept from the base model" in card


def test_missing_normalize_is_caught(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cosine cannot see a dropped Normalize; the norm check does."""
    model_dir = train_and_save(bert3_dir, "avg", "none", tmp_path / "model")
    real = export_mod.export_modules
    monkeypatch.setattr(exporter, "export_modules", lambda model, normalize: real(model, False))
    with pytest.raises(ExportError, match="norms differ"):
        export_model(model_dir, tmp_path / "st", normalize=True)
    assert not (tmp_path / "st").exists()


@pytest.mark.slow  # a fresh interpreter importing sentence-transformers (~9 s CPU)
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
    export_model(model_dir, tmp_path / "st", normalize=False)
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
    model_dir = train_and_save(bert3_dir, "cls", "none", tmp_path / "model")
    monkeypatch.setattr(folder, "pooling_modules", lambda pooler, h, n: [folder.pooling(h, "mean")])
    out = tmp_path / "exports" / "st"
    with pytest.raises(ExportError, match="disagrees"):
        export_model(model_dir, out)
    assert not out.exists()
    assert list((tmp_path / "exports").iterdir()) == []  # no temp folder left behind either

    assert main(["export", str(model_dir), str(out)]) == 1
    assert not out.exists()


def test_failed_overwrite_keeps_the_old_export(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = train_and_save(bert3_dir, "cls", "none", tmp_path / "model")
    out = tmp_path / "st"
    export_model(model_dir, out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match="already exists"):
        export_model(model_dir, out)
    monkeypatch.setattr(folder, "pooling_modules", lambda pooler, h, n: [folder.pooling(h, "mean")])
    with pytest.raises(ExportError):
        export_model(model_dir, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "st"]
    monkeypatch.undo()
    assert export_model(model_dir, out, overwrite=True).min_cosine >= 0.9999


def test_card_template_sections_and_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Known answers for the template mechanics: ``%% name`` sections, a placeholder alone on
    its line is a block (None drops the line), and a missing or misplaced value is an error."""
    from simcse_kit.export import card

    assert card.read_sections("%% a\nx $v\n\n%% b\n$blk\ny\n") == {"a": "x $v\n", "b": "$blk\ny"}
    monkeypatch.setattr(card, "SECTIONS", {"t": "head\n$blk\nx $v"})
    assert card.fill("t", blk=None, v=1) == "head\nx 1"
    assert card.fill("t", blk="l1\nl2", v=1) == "head\nl1\nl2\nx 1"
    with pytest.raises(ValueError, match="alone on its line"):
        card.fill("t", blk="", v=None)
    with pytest.raises(KeyError):
        card.fill("t", blk=None)
    # The shipped template: every section the card code fills is there.
    monkeypatch.undo()
    assert set(card.SECTIONS) == {"card", "row", "parity_row", "recipe", "sts_table", "no_sts_table"} | {
        "onnx_usage", "int8_encoder", "st_onnx_backend", "int8_cost", "clients_pooled", "clients_sentence_embedding"
    }  # fmt: skip


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


class PairsSTS:
    """A tiny STS task whose gold scores are the model's own cosines: simcse-kit scores
    exactly 100, and any distortion of the vectors scores less."""

    primary_metric = "avg"

    def __init__(self, model_dir: Path) -> None:
        from scipy.stats import spearmanr

        self.spearmanr = spearmanr
        sentences = toy_sentences(40)
        self.a, self.b = sentences[:20], sentences[20:]
        self.gold = self.cosines(load_encoder(model_dir).encode)

    def cosines(self, encode: object) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(encode(self.a), encode(self.b))

    def __call__(self, encode: object) -> dict[str, float]:
        return {"avg": 100 * float(self.spearmanr(self.cosines(encode), self.gold).statistic)}


@pytest.mark.slow  # ONNX export, int8 quantisation, four encoders (~13 s CPU)
def test_onnx_int8_export_and_gate(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real thing on this stack (torch.onnx + onnxruntime, no optimum): the fp32 graph
    matches a naive reference through onnxruntime + tokenizers, int8 within 0.5 STS of fp32
    is kept with its figures on the card; a gate it fails (threshold forced) leaves nothing."""
    from simcse_kit.export.onnx_encoder import OnnxEncoder

    model_dir = train_and_save(bert3_dir, "avg", "none", tmp_path / "model")
    evaluator = PairsSTS(model_dir)
    result = export_model(model_dir, tmp_path / "ok", quantize="int8", sts_evaluator=evaluator)
    assert result.onnx_files == {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_quantized.onnx"}
    assert set(result.parity) == set(result.speed) == {"torch", "onnx", "onnx-int8"}
    assert result.parity["onnx"].min_cosine >= 0.9999 and result.parity["onnx"].max_norm_rel_diff <= 1e-3
    assert result.sts["simcse-kit fp32"] == pytest.approx(100.0)
    assert result.sts["simcse-kit fp32"] - result.sts["onnx-int8"] <= 0.5
    reference = normalized(naive_embeddings(model_dir, CHECK_SENTENCES), True)
    for file_name in result.onnx_files.values():
        got = torch.from_numpy(OnnxEncoder(tmp_path / "ok", file_name).encode(CHECK_SENTENCES))
        cos = torch.nn.functional.cosine_similarity(reference.double(), got.double())
        assert cos.min() >= (0.9999 if file_name == "onnx/model.onnx" else 0.99), (file_name, float(cos.min()))
    card = (tmp_path / "ok" / "README.md").read_text()
    assert "int8 cost: STS" in card and "(the export fails past -0.5)" in card
    assert 'OnnxEncoder("path/to/this/folder", "onnx/model_quantized.onnx")  # int8' in card
    assert "| onnx-int8 | `onnx/model_quantized.onnx` |" in card
    # The avg pooler's graph gives output 0 = last_hidden_state: the card's fastembed setup pools it.
    assert "pooling=PoolingType.MEAN, normalization=True" in card and '{pooling: "mean", normalize: true}' in card
    info = json.loads((tmp_path / "ok" / EXPORT_INFO).read_text())
    assert info["backends"] == {"torch": "model.safetensors", **result.onnx_files}
    assert info["quantization"]["tool"] == "onnxruntime.quantization.quantize_dynamic"
    assert info["onnx"]["exporter"] == "dynamo" and min(info["onnx"]["shape_parity"].values()) >= 0.9999
    assert set(info["onnx"]["shape_parity"]) == {f"{b}x{n}" for b in (1, 7, 64) for n in (3, MAX_LEN)}  # 32 > max: capped
    # Still a sentence-transformers folder: the torch load gives the same vectors as before.
    st_vectors = load_quietly(tmp_path / "ok")[0].encode(CHECK_SENTENCES, convert_to_tensor=True)
    assert torch.nn.functional.cosine_similarity(reference.double(), st_vectors.double()).min() >= 0.9999

    monkeypatch.setattr(sts_gate, "MAX_INT8_STS_DROP", -1.0)  # int8 must now beat fp32 (= 100): impossible
    with pytest.raises(ExportError, match="int8 ONNX loses"):
        export_model(model_dir, tmp_path / "bad", quantize="int8", sts_evaluator=evaluator)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "ok"]


@pytest.mark.slow  # ONNX export and int8 quantisation, STS-B dev on both (~6 s CPU)
def test_int8_gate_reads_the_data_root(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no evaluator and no --data-dir, the int8 gate reads STS-B dev in senteval/ under
    the data root (data_root=, else SIMCSE_KIT_DATA: the resolution every command uses),
    checked before any model work; a model folder (no run, no recorded score) has its fp32
    STS-B dev computed: the same figure evaluate's dev scorer gives."""
    from conftest import write_tiny_senteval

    from simcse_kit.config.recipes import DATA_ENV
    from simcse_kit.errors import DataError
    from simcse_kit.evaluation import DevEvaluator

    model_dir = train_and_save(bert3_dir, "avg", "none", tmp_path / "model")
    empty = tmp_path / "empty-root"
    empty.mkdir()
    monkeypatch.setenv(DATA_ENV, str(empty))
    with pytest.raises(DataError, match="sts-dev.csv"):
        export_model(model_dir, tmp_path / "st", quantize="int8")
    explicit = tmp_path / "explicit-root"
    with pytest.raises(DataError, match=str(explicit / "senteval")):
        export_model(model_dir, tmp_path / "st", quantize="int8", data_root=explicit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-root", "model"]

    write_tiny_senteval(empty / "senteval")
    result = export_model(model_dir, tmp_path / "st", quantize="int8")
    fp32 = DevEvaluator(empty / "senteval")(load_encoder(model_dir).encode)["stsb_dev"]
    assert result.sts["simcse-kit fp32"] == pytest.approx(fp32, abs=1e-9)


@pytest.mark.slow  # ONNX export and int8 quantisation, STS-B dev on both (~10 s CPU)
def test_int8_gate_takes_fp32_from_the_run(tiny_run: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run folder: the fp32 side of the int8 gate is the kept model's recorded STS-B dev
    score (the same file, no prompt), so the gate encodes STS-B dev once (int8 only), not
    twice; the record is the figure a fresh fp32 scoring gives. A run that selected on
    another dev file gets its fp32 computed."""
    from simcse_kit.evaluation import DevEvaluator

    tiny_run.train("run")  # type: ignore[attr-defined]
    run = tiny_run.folder / "run"  # type: ignore[attr-defined]
    senteval = tiny_run.folder / "senteval"  # type: ignore[attr-defined]
    meta = json.loads((run / "best_model" / SIMCSE_CONFIG).read_text())
    assert meta["dev_metric"] == "stsb_dev"  # the run selected on STS-B dev, under that name
    recorded = meta["dev_score"]
    assert DevEvaluator(senteval)(load_encoder(run / "best_model").encode)["stsb_dev"] == pytest.approx(recorded, abs=1e-6)

    calls: list[int] = []

    class CountingDev(DevEvaluator):
        def __call__(self, encode: object) -> dict[str, float]:
            calls.append(1)
            return super().__call__(encode)  # type: ignore[arg-type]

    result = export_model(run, tmp_path / "x", quantize="int8", sts_evaluator=CountingDev(senteval))
    # The gate scores once (int8); the card's compact-vector table scores float32, int8 and
    # binary vectors (3 more). A gate that re-scored fp32 would make it 5.
    assert len(calls) == 1 + 3 and result.sts["simcse-kit fp32"] == recorded and result.sts_fp32_from == "run record"
    assert json.loads((tmp_path / "x" / EXPORT_INFO).read_text())["sts_fp32_from"] == "run record"
    card = (tmp_path / "x" / "README.md").read_text()
    float_row = next(line for line in card.splitlines() if line.startswith("| float32 |"))
    assert float_row.endswith(f"| {recorded:.2f} |")  # the card's float32 is the run's own figure

    # Another STS-B dev file (other pairs) is not the measurement the run recorded.
    other = tmp_path / "other"
    write_tiny_senteval(other, pairs=20)
    calls.clear()
    result = export_model(run, tmp_path / "y", quantize="int8", sts_evaluator=CountingDev(other))
    assert len(calls) == 2 + 3 and result.sts["simcse-kit fp32"] != recorded and result.sts_fp32_from == "computed"


def test_onnx_cli_and_refusals(
    tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--onnx --opset on a layer-averaging pooler (the graph pools, so it exports; it has
    no last_hidden_state, which sentence-transformers' ONNX backend could not pool right);
    a missing ONNX package and a bad --quantize are refused before anything is written."""
    from simcse_kit.export.onnx_encoder import OnnxEncoder

    afl = train_and_save(bert3_dir, "avg_first_last", "none", tmp_path / "afl")
    assert main(["export", str(afl), str(tmp_path / "st"), "--onnx", "--opset", "17", "--no-normalize"]) == 0
    info = json.loads((tmp_path / "st" / EXPORT_INFO).read_text())
    assert info["onnx"]["opset"] == 17 and info["onnx"]["outputs"] == ["sentence_embedding"]
    got = torch.from_numpy(OnnxEncoder(tmp_path / "st").encode(CHECK_SENTENCES))
    reference = naive_embeddings(afl, CHECK_SENTENCES)
    assert torch.nn.functional.cosine_similarity(reference.double(), got.double()).min() >= 0.9999
    torch.testing.assert_close(got.norm(dim=-1), reference.norm(dim=-1), rtol=1e-4, atol=0)
    assert "parity (onnx): min cosine" in capsys.readouterr().out

    monkeypatch.setitem(sys.modules, "onnxscript", None)
    assert main(["export", str(afl), str(tmp_path / "st2"), "--onnx"]) == 1
    assert "needs onnx, onnxruntime and onnxscript" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="only 'int8'"):
        export_model(afl, tmp_path / "st2", quantize="int4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afl", "st"]


def test_push_to_hub(tmp_path: Path, bert3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finished folder is uploaded (and only a finished one); the upload is faked."""
    calls: list[tuple[Path, str, list[str]]] = []

    def upload(folder: Path, repo_id: str) -> str:
        calls.append((folder, repo_id, sorted(p.name for p in folder.iterdir())))
        return f"https://example.invalid/{repo_id}"

    monkeypatch.setattr(exporter, "hub_upload", upload)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the faked hub is online (offline is refused first)
    model_dir = train_and_save(bert3_dir, "avg", "none", tmp_path / "model")
    out = tmp_path / "st"
    assert main(["export", str(model_dir), str(out), "--push-to-hub", "me/simcse-tiny", "--no-normalize"]) == 0
    assert calls == [(out, "me/simcse-tiny", sorted(p.name for p in out.iterdir()))]
    assert "README.md" in calls[0][2] and EXPORT_INFO in calls[0][2]
    assert json.loads((out / EXPORT_INFO).read_text())["normalize"] is False

    monkeypatch.setattr(folder, "pooling_modules", lambda pooler, h, n: [folder.pooling(h, "cls")])
    assert main(["export", str(model_dir), str(tmp_path / "bad"), "--push-to-hub", "me/x"]) == 1
    assert len(calls) == 1  # a failed export uploads nothing


def make_run(tmp_path: Path, base: Path) -> Path:
    """A run folder as ``run.train`` leaves it (config.yaml, metrics.json, best_model/)."""
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
    assert "parity (torch): min cosine 1.0000000" in capsys.readouterr().out

    card = (out / "README.md").read_text(encoding="utf-8")
    sts = json.loads((run / "metrics.json").read_text())["sts"]
    assert format_table(sts) in card  # the run's STS table, verbatim
    assert f"`{bert3_dir}`" in card  # base model
    assert "`toy.txt` (first 16 examples)" in card  # training data
    assert "unsup SimCSE" in card and "max_steps: 2" in card  # recipe
    # metrics.json as written before the dev metric was named: "best_stsb_dev" reads as STS-B dev
    # (the run's config names no other dev data) ...
    assert "| best STS-B dev Spearman x 100 | 48.12 |" in card
    # ... and as SICK trial where the config selected on a SICK file.
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"] |= {"dev_file": "SICK_trial.txt", "dev_format": "sick"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert "| best SICK trial Spearman x 100 | 48.12 |" in training_rows(export_mod.find_source(run))
    assert "`avg_first_last`" in card and "WeightedLayerPooling" in card
    assert "used in training only" in card
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["pooler"] == "avg_first_last" and info["parity_min_cosine"] >= 0.9999
    assert info["source"] == str(run)


def test_evaluate_gives_the_same_numbers(tmp_path: Path, bert3_dir: Path, data_dir: Path) -> None:
    """``load_encoder`` sends the export through SentenceTransformer; STS-B scores match."""
    from simcse_kit.evaluation import evaluate_model

    run = make_run(tmp_path, bert3_dir)
    # Unnormalised, so the cosines match bit for bit: the random tiny model gives many
    # near-tied cosines, and normalising first reorders ties (Spearman moves ~0.01).
    export_model(run, tmp_path / "st", normalize=False)
    encoder = load_encoder(tmp_path / "st")
    assert isinstance(encoder, SentenceTransformerEncoder)
    ours = load_encoder(run).encode(CHECK_SENTENCES)
    assert torch.allclose(encoder.encode(CHECK_SENTENCES), ours, atol=1e-5)

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

    from simcse_kit.evaluation import evaluate_model, read_stsb

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
