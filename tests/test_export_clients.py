"""ONNX exports load in other clients, with those clients' documented setup, and give
simcse-kit's vectors (issue 35): fastembed's custom models and Transformers.js'
``feature-extraction`` pipeline, fp32 and int8, including texts past 128 tokens.

Before issue 35 the export's tokenizer_config.json said ``"max_length": 128`` (inherited
from all-MiniLM-L6-v2's tokenizer.json) beside ``"model_max_length": 256`` and fastembed
truncated at the smaller; output 0 was the pooled ``sentence_embedding``, which fastembed's
``PoolingType.MEAN`` cannot pool; and the int8 graph's name was one Transformers.js does not
look for. The base model here is built like all-MiniLM-L6-v2 (a tokenizer.json truncating
and padding at 128) with room for 256 tokens.

Transformers.js runs in node from ``$SIMCSE_JS_ENV``, else ``~/.cache/simcse-kit-js``,
installed by ``.ci/js_env.sh`` (npm; .ci/run does it first). In CI (``CI`` or
``SIMCSE_JS_ENV`` set) a missing install FAILS the test; locally it is installed on first
use. Only a machine without node skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, save_tiny_bert, toy_sentences
from transformers import AutoTokenizer

from simcse_kit.config.run import ModelConfig
from simcse_kit.export import export_model
from simcse_kit.export.onnx_encoder import OnnxEncoder
from simcse_kit.model.checks import load_checked_tokenizer
from simcse_kit.model.inference import load_encoder
from simcse_kit.model.modeling import SimCSEModel

# Every test reads the ONNX export of a fixture (a torch.export trace, ~6 s CPU) and most run a
# client's pipeline (fastembed, node and Transformers.js).
pytestmark = pytest.mark.slow

MAX_LEN = 256
BASE_LENGTH = 128  # what the base model's tokenizer.json truncates at (all-MiniLM-L6-v2's)
LONG = "a man plays the guitar in the park with two children "  # 11 tokens
SENTENCES = toy_sentences(10) + ["hello", LONG * 16, LONG * 30]  # ~178 and ~330 (cut at 256) tokens
FP32, INT8 = "onnx/model.onnx", "onnx/model_quantized.onnx"  # the names docs/export.md gives
# 96 texts of 3 to 256 tokens in a fixed mixed order: fastembed and Transformers.js encode
# batches of 32 in input order, OnnxEncoder sorts by length first, so the same text meets
# other texts and other padding. Dynamic int8 takes one activation scale per batch tensor:
# on the tiny model here the two agree to 1e-7; on all-MiniLM-L6-v2 docs/export.md gives the bound.
MIXED = [SENTENCES[i % len(SENTENCES)] if i % 3 else LONG * (1 + (7 * i) % 30) for i in range(96)]


class PairsSTS:
    """The int8 gate's scorer: gold = simcse-kit's own cosines (fp32 scores 100)."""

    primary_metric = "avg"

    def __init__(self, model_dir: Path) -> None:
        self.a, self.b = SENTENCES[:5], SENTENCES[5:10]
        self.gold = self.cos(load_encoder(model_dir).encode)

    def cos(self, encode: object) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(encode(self.a), encode(self.b))  # type: ignore[operator]

    def __call__(self, encode: object) -> dict[str, float]:
        from scipy.stats import spearmanr

        return {"avg": 100 * float(spearmanr(self.cos(encode), self.gold).statistic)}


def export_for(root: Path, pooler: str) -> tuple[Path, torch.Tensor]:
    """An ``--onnx --quantize int8`` export of a tiny model with ``pooler`` (no MLP at
    inference, normalised) and simcse-kit's own vectors for :data:`SENTENCES`."""
    (root / "base").mkdir()
    base = save_tiny_bert(root / "base", layers=2, max_positions=MAX_LEN + 2, fixed_length=BASE_LENGTH)
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler=pooler, mlp="train", eval_max_seq_len=MAX_LEN))
    model_dir = root / "model"
    model.save(model_dir, AutoTokenizer.from_pretrained(base), {"base_model": str(base), "mode": "unsup"})
    out = root / "export"
    result = export_model(model_dir, out, quantize="int8", sts_evaluator=PairsSTS(model_dir))
    assert result.normalize and set(result.onnx_files) == {"onnx", "onnx-int8"}
    kit = torch.nn.functional.normalize(load_encoder(model_dir).encode(SENTENCES), dim=-1)
    return out, kit


@pytest.fixture(scope="module")
def avg_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    return export_for(tmp_path_factory.mktemp("clients-avg"), "avg")


def token_count(folder: Path, text: str) -> int:
    return len(AutoTokenizer.from_pretrained(folder)(text)["input_ids"])


def assert_same(got: np.ndarray | torch.Tensor, want: torch.Tensor, min_cos: float, what: str) -> None:
    got_t = torch.as_tensor(np.asarray(got)).double()
    cos = torch.nn.functional.cosine_similarity(got_t, want.double())
    assert cos.min() >= min_cos, (what, cos.tolist())
    torch.testing.assert_close(got_t.norm(dim=-1), want.double().norm(dim=-1), rtol=1e-4, atol=0)


def test_one_truncation_length_in_the_folder(avg_export: tuple[Path, torch.Tensor]) -> None:
    """Every file that may tell a loader where to truncate says the model's max_seq_len
    (the files read here directly, not through the kit)."""
    out, _ = avg_export
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_json = json.loads((out / "tokenizer.json").read_text())
    lengths = {
        "max_seq_length": json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"],
        "model_max_length": tok_config["model_max_length"],
        "max_length": tok_config["max_length"],  # transformers 5 writes it from tokenizer.json's truncation
        "tokenizer.json truncation": tok_json["truncation"]["max_length"],
    }
    assert set(lengths.values()) == {MAX_LEN}, lengths
    assert token_count(out, SENTENCES[-2]) > BASE_LENGTH and token_count(out, SENTENCES[-1]) > MAX_LEN


@pytest.mark.parametrize("file_name", [FP32, INT8])
def test_fastembed_custom_model(avg_export: tuple[Path, torch.Tensor], file_name: str) -> None:
    """fastembed's documented custom-model setup (mean pooling, normalisation, output 0)
    from the local folder gives simcse-kit's vectors, past 128 tokens too; int8 gives
    what the kit's own OnnxEncoder gives with the same graph."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    out, kit = avg_export
    name = f"simcse-kit-test/{out.parent.name}-{Path(file_name).stem}"
    TextEmbedding.add_custom_model(
        name, pooling=PoolingType.MEAN, normalization=True, sources=ModelSource(hf=name), dim=kit.shape[1], model_file=file_name
    )
    got = np.stack(list(TextEmbedding(name, specific_model_path=str(out), threads=1).embed(SENTENCES, batch_size=4)))
    if file_name == FP32:
        assert_same(got, kit, 0.9999, "fastembed fp32 vs simcse-kit")
    else:
        assert_same(got, torch.from_numpy(OnnxEncoder(out, file_name).encode(SENTENCES)), 0.9999, "fastembed int8 vs OnnxEncoder")
        assert_same(got, kit, 0.99, "fastembed int8 vs simcse-kit")
        # Batches of different lengths, as each client forms them: input order vs length-sorted.
        mixed = np.stack(list(TextEmbedding(name, specific_model_path=str(out), threads=1).embed(MIXED, batch_size=32)))
        sorted_batches = torch.from_numpy(OnnxEncoder(out, file_name).encode(MIXED, batch_size=32))
        assert_same(mixed, sorted_batches, 0.9999, "fastembed int8 (input-order batches of 32) vs OnnxEncoder (sorted)")


def test_fastembed_cls_pooler(tmp_path: Path) -> None:
    """A CLS-pooled export: output 0 is last_hidden_state, so PoolingType.CLS (what
    simcse_onnx.json's token_pooling names) gives simcse-kit's vectors."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    out, kit = export_for(tmp_path, "cls")
    info = json.loads((out / "onnx" / "simcse_onnx.json").read_text())
    assert info["token_pooling"] == "cls" and info["outputs"][0] == "last_hidden_state"
    name = f"simcse-kit-test/{tmp_path.name}-cls"
    TextEmbedding.add_custom_model(
        name, pooling=PoolingType.CLS, normalization=True, sources=ModelSource(hf=name), dim=kit.shape[1]
    )
    got = np.stack(list(TextEmbedding(name, specific_model_path=str(out), threads=1).embed(SENTENCES)))
    assert_same(got, kit, 0.9999, "fastembed cls vs simcse-kit")


# ---- Transformers.js -------------------------------------------------------------------

JS_SCRIPT = """
const { pipeline, env } = require("@huggingface/transformers");
const [root, name, dtype, texts, pooling] = process.argv.slice(1);
env.allowRemoteModels = false;
env.localModelPath = root;
(async () => {
  const extractor = await pipeline("feature-extraction", name, { dtype, device: "cpu" });
  const out = await extractor(JSON.parse(texts), { pooling, normalize: true });
  process.stdout.write(JSON.stringify(out.tolist()));
})().catch((err) => { console.error(String(err && err.stack || err)); process.exit(1); });
"""


def js_dir() -> Path:
    default = Path.home() / ".cache" / "simcse-kit-js"
    return Path(os.environ.get("SIMCSE_JS_ENV", default)).expanduser().resolve()


@pytest.fixture(scope="module")
def js_env() -> Path:
    """The installed Transformers.js (installed now if missing, outside CI)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed: Transformers.js cannot run here")
    env_dir = js_dir()
    in_ci = bool(os.environ.get("CI")) or "SIMCSE_JS_ENV" in os.environ
    if not (env_dir / "COMPLETE").is_file() and in_ci:
        pytest.fail(f"Transformers.js missing at {env_dir}: run `.ci/js_env.sh {env_dir}` first")
    proc = subprocess.run(
        ["bash", str(REPO / ".ci" / "js_env.sh"), str(env_dir)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir


def js_feature_extraction(js_env: Path, out: Path, dtype: str, texts: list[str], pooling: str) -> np.ndarray:
    """:data:`JS_SCRIPT`'s normalised vectors of ``texts`` from the export ``out``."""
    proc = subprocess.run(
        ["node", "-e", JS_SCRIPT, str(out.parent), out.name, dtype, json.dumps(texts), pooling],
        env={**os.environ, "NODE_PATH": str(js_env / "node_modules")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.asarray(json.loads(proc.stdout), dtype=np.float64)


@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_transformers_js_feature_extraction(js_env: Path, avg_export: tuple[Path, torch.Tensor], dtype: str) -> None:
    """Transformers.js' documented local setup (env.localModelPath, no remote models) and
    feature-extraction with mean pooling + normalisation: simcse-kit's vectors; dtype q8
    finds the int8 graph (onnx/model_quantized.onnx) and matches the kit's OnnxEncoder on it."""
    out, kit = avg_export
    got = js_feature_extraction(js_env, out, dtype, SENTENCES, "mean")
    if dtype == "fp32":
        assert_same(got, kit, 0.9999, "Transformers.js fp32 vs simcse-kit")
    else:
        assert_same(got, torch.from_numpy(OnnxEncoder(out, INT8).encode(SENTENCES)), 0.9999, "Transformers.js q8 vs OnnxEncoder")
        assert_same(got, kit, 0.99, "Transformers.js q8 vs simcse-kit")
        # Batches of different lengths: Transformers.js encodes the array it is given as one
        # batch, in input order; OnnxEncoder sorts by length into batches of 32.
        mixed = js_feature_extraction(js_env, out, dtype, MIXED, "mean")
        sorted_batches = torch.from_numpy(OnnxEncoder(out, INT8).encode(MIXED, batch_size=32))
        assert_same(mixed, sorted_batches, 0.9999, "Transformers.js q8 (one input-order batch) vs OnnxEncoder (sorted)")


# ---- a decoder with last-token pooling ---------------------------------------------------


@pytest.fixture(scope="module")
def decoder_export(tmp_path_factory: pytest.TempPathFactory, decoder_dirs: dict[str, Path]) -> tuple[Path, torch.Tensor]:
    """``--onnx`` export of a tiny Qwen3 with last-token pooling, normalised, with a query
    prompt, and simcse-kit's own vectors (its texts fit the tiny model's 64 positions). The
    folder with its ``onnx/`` is still the sentence-transformers folder: lasttoken Pooling,
    Normalize, the prompt in config_sentence_transformers.json, the kit's vectors."""
    from sentence_transformers import SentenceTransformer

    root = tmp_path_factory.mktemp("clients-decoder")
    base = decoder_dirs["qwen3"]
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler="last", eval_max_seq_len=32))
    tokenizer = load_checked_tokenizer(base)
    tokenizer.padding_side = "right"  # the export's tokenizer pads left whatever the model's did
    prompts = {"query": "the dog , "}
    model.save(root / "model", tokenizer, {"base_model": str(base), "mode": "unsup", "prompts": prompts})
    out = root / "export"
    result = export_model(root / "model", out, onnx=True, normalize=True)
    assert result.onnx is not None and result.onnx.token_pooling == "last_token"
    assert result.parity["onnx"].min_cosine >= 0.9999
    assert json.loads((out / "tokenizer_config.json").read_text())["padding_side"] == "left"
    assert json.loads((out / "config_sentence_transformers.json").read_text())["prompts"] == prompts
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((out / modules[1]["path"] / "config.json").read_text())["pooling_mode_lasttoken"]
    encoder = load_encoder(root / "model")
    kit = torch.nn.functional.normalize(encoder.encode(DECODER_TEXTS), dim=-1)
    st = SentenceTransformer(str(out), device="cpu")
    assert_same(st.encode(DECODER_TEXTS, convert_to_tensor=True), kit, 0.9999, "sentence-transformers vs simcse-kit")
    want = torch.nn.functional.normalize(encoder.encode([prompts["query"] + t for t in DECODER_TEXTS]), dim=-1)
    assert_same(st.encode(DECODER_TEXTS, prompt_name="query", convert_to_tensor=True), want, 0.9999, "with the query prompt")
    assert (want - kit).abs().max() > 1e-3  # the prompt changes the vectors
    return out, kit


DECODER_TEXTS = toy_sentences(10) + ["hello", LONG * 4]  # the last cut at 32 tokens


def test_fastembed_last_token_pooling(decoder_export: tuple[Path, torch.Tensor]) -> None:
    """fastembed's PoolingType.LAST_TOKEN (the mask's last real token) on output 0
    (last_hidden_state) gives simcse-kit's vectors, in batches of mixed lengths."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    out, kit = decoder_export
    name = f"simcse-kit-test/{out.parent.name}-last"
    TextEmbedding.add_custom_model(
        name, pooling=PoolingType.LAST_TOKEN, normalization=True, sources=ModelSource(hf=name), dim=kit.shape[1]
    )
    got = np.stack(list(TextEmbedding(name, specific_model_path=str(out), threads=1).embed(DECODER_TEXTS, batch_size=4)))
    assert_same(got, kit, 0.9999, "fastembed last_token vs simcse-kit")


def test_transformers_js_last_token_pooling(js_env: Path, decoder_export: tuple[Path, torch.Tensor]) -> None:
    """Transformers.js' last_token pooling reads the last column: the export's tokenizer pads
    on the left, so that column is every row's last real token and the vectors are the kit's,
    for texts within the max length. A longer text loses its appended EOS (Transformers.js
    4.3.1 truncates after adding special tokens; tokenizers, hence the kit, sentence-transformers
    and fastembed, before), so its vector differs: the limit docs/export.md states."""
    out, kit = decoder_export
    got = js_feature_extraction(js_env, out, "fp32", DECODER_TEXTS, "last_token")
    assert_same(got[:-1], kit[:-1], 0.9999, "Transformers.js last_token vs simcse-kit")
    assert torch.nn.functional.cosine_similarity(torch.from_numpy(got[-1]), kit[-1].double(), dim=0) < 0.99
