"""ONNX through PyTorch's exporter (issue 28): every tested architecture as one graph with its
pooling, parity with torch at several shapes, served by onnxruntime + tokenizers alone, and
an ``onnx`` extra that cannot move the user's transformers.

Before issue 28 the export went through optimum-onnx, which needs transformers < 4.58: none
of this ran on the project's own stack (``--onnx`` refused; installing the extra downgraded
transformers to 4.57).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, toy_sentences
from tiny_encoders import ARCHITECTURES, DECODERS, build_tiny
from transformers import AutoTokenizer

from simcse_kit.config.run import ModelConfig
from simcse_kit.export import onnx as onnx_export
from simcse_kit.export.onnx import OnnxExportError, write_onnx
from simcse_kit.export.onnx_encoder import FP32_FILE, ONNX_INFO, OnnxEncoder
from simcse_kit.model.inference import Encoder
from simcse_kit.model.modeling import SimCSEModel

MAX_LEN = 64  # the tiny models' maximum (RoBERTa-style: 66 positions - padding_idx - 1)
SENTENCES = toy_sentences(20) + ["hello", "a man plays the guitar in the park with two children " * 8]
# (pooler, mlp, normalize) per architecture: every pooler, the kept MLP and both
# normalise settings each run somewhere.
CASES = {
    "bert": ("cls", "always", True),
    "roberta": ("avg", "none", True),
    "xlm-roberta": ("avg_first_last", "none", False),
    "mpnet": ("avg", "none", True),
    "distilbert": ("avg_top2", "none", True),
    "deberta-v2": ("cls_before_pooler", "none", False),
    "electra": ("avg", "none", True),
    "modernbert": ("cls", "train", True),
}
# Graph inputs are the tokenizer's outputs the model takes: token_type_ids where forward()
# takes them AND the tokenizer makes them (the tiny RoBERTa-style tokenizers make none, as
# RoBERTa's own do not; DistilBERT's BERT tokenizer makes them, but DistilBERT takes none).
SEGMENT_IDS = {"bert", "electra", "deberta-v2"}
assert set(CASES) == set(ARCHITECTURES)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx-architectures")
    return {arch: build_tiny(arch, root / arch) for arch in ARCHITECTURES}


def load_model(base: Path, pooler: str, mlp: str) -> SimCSEModel:
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler=pooler, mlp=mlp, eval_max_seq_len=MAX_LEN))
    if model.mlp is not None:
        torch.nn.init.normal_(model.mlp.dense.bias)  # not the zero-bias init: the head must show
    model.packing = False  # what SimCSEModel.load gives the export
    return model.eval()


def kit_vectors(model: SimCSEModel, tokenizer: object, normalize: bool) -> torch.Tensor:
    vectors = Encoder(model, tokenizer, MAX_LEN).encode(SENTENCES)
    return torch.nn.functional.normalize(vectors, dim=-1) if normalize else vectors


# BERT in the default run; the other architectures (a torch.export trace each, ~5 s CPU) with the slow ones.
@pytest.mark.parametrize("arch", [a if a == "bert" else pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES])
def test_every_architecture_exports_with_parity(arch: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    pooler, mlp, normalize = CASES[arch]
    model = load_model(tiny_dirs[arch], pooler, mlp)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    tokenizer.save_pretrained(tmp_path)
    done = write_onnx(model, tokenizer, tmp_path, normalize=normalize, quantize="int8")

    assert done.exporter == "dynamo" and done.tried == {"dynamo": "ok"}
    assert set(done.shape_parity) == {f"{b}x{n}" for b in (1, 7, 64) for n in (3, 32, MAX_LEN)}
    assert min(done.shape_parity.values()) >= 0.9999, done.shape_parity
    assert done.inputs == ["input_ids", "attention_mask"] + (["token_type_ids"] if arch in SEGMENT_IDS else [])
    # Output 0 is last_hidden_state exactly where a client's own mean/CLS pooling of it is
    # the kit's vector (fastembed pools output 0); else the finished sentence_embedding.
    token_pooling = {"avg": "mean", "cls": "cls", "cls_before_pooler": "cls"}.get(pooler) if mlp != "always" else None
    layer_average = pooler in ("avg_first_last", "avg_top2")
    if token_pooling:
        assert done.outputs == ["last_hidden_state", "sentence_embedding"]
    else:
        assert done.outputs == ["sentence_embedding"] + ([] if layer_average else ["last_hidden_state"])
    info = json.loads((tmp_path / ONNX_INFO).read_text())
    assert info["model_type"] == arch and info["max_seq_len"] == MAX_LEN and info["dim"] == 32
    assert info["token_pooling"] == token_pooling and info["outputs"] == done.outputs

    # Sentences end to end: tokenizers (not transformers) + onnxruntime vs the kit's encoder.
    reference = kit_vectors(model, tokenizer, normalize)
    got = torch.from_numpy(OnnxEncoder(tmp_path, FP32_FILE).encode(SENTENCES))
    cos = torch.nn.functional.cosine_similarity(reference.double(), got.double())
    assert cos.min() >= 0.9999, (arch, float(cos.min()))
    torch.testing.assert_close(got.norm(dim=-1), reference.norm(dim=-1), rtol=1e-4, atol=1e-6)
    int8 = torch.from_numpy(OnnxEncoder(tmp_path, "onnx/model_quantized.onnx").encode(SENTENCES))
    assert int8.shape == reference.shape and not torch.equal(int8, got)  # quantised, still the same kind of vectors
    assert torch.nn.functional.cosine_similarity(reference.double(), int8.double()).min() >= 0.9
    if token_pooling:  # what fastembed/Transformers.js do with output 0: pool it themselves
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / FP32_FILE), providers=["CPUExecutionProvider"])
        feeds = dict(tokenizer(SENTENCES, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="np"))
        first = torch.from_numpy(session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0])
        mask = torch.from_numpy(feeds["attention_mask"]).unsqueeze(-1).double()
        pooled = (first.double() * mask).sum(1) / mask.sum(1) if token_pooling == "mean" else first[:, 0].double()
        pooled = torch.nn.functional.normalize(pooled, dim=-1) if normalize else pooled
        assert torch.nn.functional.cosine_similarity(reference.double(), pooled).min() >= 0.9999, arch
        torch.testing.assert_close(pooled.norm(dim=-1), reference.double().norm(dim=-1), rtol=1e-4, atol=1e-6)


def test_a_graph_that_disagrees_is_refused(tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both exporters 'produce' a graph of other weights: the export names the architecture
    and each exporter's result, and leaves no graph behind."""
    model = load_model(tiny_dirs["bert"], "avg", "none")
    other = load_model(tiny_dirs["bert"], "avg", "none")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    real_export = onnx_export._export

    def wrong_export(graph: object, names: list[str], path: Path, opset: int, exporter: str) -> None:
        real_export(onnx_export.SentenceEmbeddingGraph(other, True).eval(), names, path, opset, exporter)

    monkeypatch.setattr(onnx_export, "_export", wrong_export)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["bert"])
    with pytest.raises(OnnxExportError, match=r"cannot export bert to ONNX: dynamo: cosine .* torchscript: cosine"):
        write_onnx(model, tokenizer, tmp_path, normalize=True)
    assert not (tmp_path / FP32_FILE).exists() and not (tmp_path / ONNX_INFO).exists()


BLOCKED_SCRIPT = """
import importlib.abc, json, sys
BLOCKED = ("torch", "transformers", "sentence_transformers", "safetensors")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from simcse_kit.export.onnx_encoder import OnnxEncoder
vectors = OnnxEncoder(sys.argv[1], threads=1).encode(json.loads(sys.argv[2]))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"vectors": vectors.tolist(), "loaded": loaded}))
"""


def test_onnx_encoder_needs_no_torch_nor_transformers(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    model = load_model(tiny_dirs["roberta"], "avg", "none")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["roberta"])
    tokenizer.save_pretrained(tmp_path)
    write_onnx(model, tokenizer, tmp_path, normalize=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_SCRIPT, str(tmp_path), json.dumps(SENTENCES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["loaded"] == []
    cos = torch.nn.functional.cosine_similarity(
        kit_vectors(model, tokenizer, True).double(), torch.tensor(got["vectors"]).double()
    )
    assert cos.min() >= 0.9999


def test_onnx_encoder_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="onnx/model.onnx: missing"):
        OnnxEncoder(tmp_path)


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def requirement_name(req: str) -> str:
    return req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("~")[0].strip().lower()


def test_onnx_extra_is_onnx_onnxruntime_onnxscript_only() -> None:
    """Never optimum: optimum-onnx pins transformers < 4.58, and installing it moved users'
    whole stack back to transformers 4.57 + sentence-transformers 5.x."""
    onnx = {requirement_name(r) for r in extras()["onnx"]}
    assert onnx == {"onnx", "onnxruntime", "onnxscript"}
    assert not any(requirement_name(r).startswith("optimum") for reqs in extras().values() for r in reqs)
    assert onnx <= {requirement_name(r) for r in extras()["test"]}, "the tests run the ONNX path: the test extra needs it"


def test_installing_the_onnx_extra_changes_nothing_here() -> None:
    """``pip install -e ".[onnx]"`` over this environment (transformers >= 5): offline
    (``--no-index``), pip must find every requirement already satisfied, so it would install
    only simcse-kit itself; a requirement pulling transformers 4.x could not resolve."""
    import transformers

    assert int(transformers.__version__.split(".")[0]) >= 5
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet"]
        + ["--disable-pip-version-check", "--report", "-", "-e", f"{REPO}[onnx]"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [item["metadata"]["name"] for item in report["install"]] == ["simcse-kit"]


DECODER_MAX_LEN = 32


@pytest.mark.parametrize("arch", DECODERS)
def test_decoders_export_with_last_token_pooling(arch: str, decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A decoder with last-token pooling exports as one graph (position ids counted over
    real tokens inside it): its vectors equal simcse-kit's from right- and left-padded
    batches alike, and output 0 is last_hidden_state, whose last real token (found from the
    mask, as fastembed's LAST_TOKEN does) gives them too."""
    import onnxruntime as ort

    from simcse_kit.model.checks import load_checked_tokenizer

    torch.manual_seed(0)
    cfg = ModelConfig(name_or_path=str(decoder_dirs[arch]), pooler="last", eval_max_seq_len=DECODER_MAX_LEN, packing=False)
    model = SimCSEModel.from_config(cfg).eval()
    tokenizer = load_checked_tokenizer(decoder_dirs[arch])
    tokenizer.save_pretrained(tmp_path)
    done = write_onnx(model, tokenizer, tmp_path, normalize=True)

    assert done.tried == {"dynamo": "ok"} and done.token_pooling == "last_token"
    assert done.outputs == ["last_hidden_state", "sentence_embedding"] and done.inputs == ["input_ids", "attention_mask"]
    shapes = {f"{b}x{n}" for b in (1, 7, 64) for n in (3, DECODER_MAX_LEN)}
    assert set(done.shape_parity) == shapes | {f"{s} left" for s in shapes}
    assert min(done.shape_parity.values()) >= 0.9999, done.shape_parity

    reference = torch.nn.functional.normalize(Encoder(model, tokenizer, DECODER_MAX_LEN).encode(SENTENCES), dim=-1)
    served = torch.from_numpy(OnnxEncoder(tmp_path, FP32_FILE).encode(SENTENCES))  # tokenizers, right padding
    torch.testing.assert_close(served, reference, atol=1e-5, rtol=0)
    session = ort.InferenceSession(str(tmp_path / FP32_FILE), providers=["CPUExecutionProvider"])
    for side in ("left", "right"):
        tokenizer.padding_side = side
        feeds = dict(tokenizer(SENTENCES, padding=True, truncation=True, max_length=DECODER_MAX_LEN, return_tensors="np"))
        states, vectors = (torch.from_numpy(a) for a in session.run(None, feeds))
        torch.testing.assert_close(vectors, reference, atol=1e-5, rtol=0, msg=side)
        mask = feeds["attention_mask"]
        last = mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)  # fastembed's last_token_pooling
        pooled = torch.nn.functional.normalize(states[torch.arange(len(SENTENCES)), torch.from_numpy(last)], dim=-1)
        torch.testing.assert_close(pooled, reference, atol=1e-5, rtol=0, msg=side)
