"""Exports load in OLDER sentence-transformers stacks with the vectors 6.x gives (issue 14).

A fresh export of tiny models, written here with sentence-transformers 6 + transformers 5,
is loaded in a second, separate environment built by ``.ci/compat_env.sh``: sentence-
transformers 5.1.2 (the version of the user report), 4.1.0 and 3.4.1, each on transformers
4.57 from PyPI, in a subprocess (``python -S`` with ``PYTHONPATH=st*:common:base``, torch
from the main environment). The same environment also runs ``export_model(onnx=True,
quantize="int8")`` for real: sentence-transformers' ONNX exporters need optimum-onnx, whose
latest release (0.1.0) supports only transformers < 4.58, so they cannot run beside
transformers 5 in the main environment.

Where the environment lives: ``$SIMCSE_COMPAT_ENV``, else ``~/.cache/simcse-kit/compat-env``.
In CI (``CI`` or ``SIMCSE_COMPAT_ENV`` set) a missing environment FAILS the test; locally it
is built on first use (~60 MB from PyPI, ~15 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, save_tiny_bert, toy_sentences
from transformers import AutoTokenizer

from simcse_kit.config import ModelConfig
from simcse_kit.export import COMPAT_TESTED, EXPORT_INFO, export_model
from simcse_kit.modeling import SimCSEModel

MAX_LEN = 24
SENTENCES = toy_sentences(12) + ["a man plays the guitar in the park with two children " * 6]
# (pooler, mlp, normalize): every module kind (Pooling cls/mean, WeightedLayerPooling both
# ways, Dense, Normalize) and both normalise settings.
EXPORTS = [
    ("cls", "always", True),
    ("cls_before_pooler", "none", False),
    ("avg", "none", True),
    ("avg_first_last", "none", False),
    ("avg_top2", "none", True),
]
STACKS = {"st5": COMPAT_TESTED[2], "st4": COMPAT_TESTED[1], "st3": COMPAT_TESTED[0]}


def compat_dir() -> Path:
    default = Path.home() / ".cache" / "simcse-kit" / "compat-env"
    return Path(os.environ.get("SIMCSE_COMPAT_ENV", default)).expanduser().resolve()


@pytest.fixture(scope="module")
def compat_env() -> Path:
    """The built environment; its ``base`` layer is relinked to this venv on every run
    (no download: the script only downloads when its pins changed)."""
    env_dir = compat_dir()
    in_ci = bool(os.environ.get("CI")) or "SIMCSE_COMPAT_ENV" in os.environ
    if not (env_dir / "COMPLETE").is_file() and in_ci:
        pytest.fail(f"compat environment missing at {env_dir}: run `PYTHON={sys.executable} .ci/compat_env.sh {env_dir}` first")
    proc = subprocess.run(
        ["bash", str(REPO / ".ci" / "compat_env.sh"), str(env_dir)],
        env={**os.environ, "PYTHON": sys.executable},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if in_ci:  # the environment must have been built beforehand, not just now
        assert "up to date" in proc.stdout, proc.stdout
    return env_dir


def run_in(env_dir: Path, layers: list[str], script: str, *args: str, with_repo: bool = False) -> subprocess.CompletedProcess:
    """Run ``script`` with the main venv's python on ``layers`` of the compat environment only
    (``-S``: none of the main site-packages); fails the test on an error."""
    path = ([str(REPO)] if with_repo else []) + [str(env_dir / layer) for layer in layers]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


def save_model(base: Path, pooler: str, mlp: str, out: Path) -> Path:
    """A tiny simcse-kit model with a non-trivial MLP head (random, not the zero-bias init)."""
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(base), pooler=pooler, mlp=mlp, eval_max_seq_len=MAX_LEN))
    if model.mlp is not None:
        torch.nn.init.normal_(model.mlp.dense.bias)
    model.save(out, AutoTokenizer.from_pretrained(base), {"base_model": str(base), "mode": "unsup"})
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor]]:
    """Fresh exports (written by this environment's sentence-transformers 6) and the
    vectors sentence-transformers 6 loads them to."""
    from sentence_transformers import SentenceTransformer

    root = tmp_path_factory.mktemp("compat")
    (root / "bert3").mkdir()
    base = save_tiny_bert(root / "bert3", layers=3)
    out = {}
    for pooler, mlp, normalize in EXPORTS:
        name = f"{pooler}-{mlp}-{'norm' if normalize else 'raw'}"
        model_dir = save_model(base, pooler, mlp, root / f"model-{name}")
        export_model(model_dir, root / f"st-{name}", normalize=normalize)
        st = SentenceTransformer(str(root / f"st-{name}"), device="cpu")
        out[name] = (root / f"st-{name}", st.encode(SENTENCES, convert_to_tensor=True).float())
    return out


LOAD_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("default")
import sentence_transformers, transformers
from sentence_transformers import SentenceTransformer
out = {"st": sentence_transformers.__version__, "transformers": transformers.__version__, "emb": {}}
sentences = json.loads(sys.argv[1])
for name, path in json.loads(sys.argv[2]).items():
    model = SentenceTransformer(path, device="cpu")
    out["emb"][name] = {
        "modules": [type(m).__name__ for m in model],
        "max_seq_length": model.max_seq_length,
        "vectors": model.encode(sentences).tolist(),
    }
print(json.dumps(out))
"""


@pytest.mark.parametrize("stack", list(STACKS))
def test_old_sentence_transformers_load_the_same_vectors(
    compat_env: Path, exports: dict[str, tuple[Path, torch.Tensor]], stack: str
) -> None:
    folders = {name: str(path) for name, (path, _) in exports.items()}
    got = json.loads(
        run_in(compat_env, [stack, "common", "base"], LOAD_SCRIPT, json.dumps(SENTENCES), json.dumps(folders)).stdout
    )
    assert got["st"] == STACKS[stack] and got["transformers"].startswith("4.")
    for name, (_, new) in exports.items():
        old = torch.tensor(got["emb"][name]["vectors"])
        assert got["emb"][name]["max_seq_length"] == MAX_LEN, name
        assert (got["emb"][name]["modules"][-1] == "Normalize") == name.endswith("norm"), name
        cos = torch.nn.functional.cosine_similarity(old.double(), new.double())
        assert cos.min() >= 0.9999, (name, float(cos.min()))
        assert torch.allclose(old.norm(dim=-1), new.norm(dim=-1), rtol=1e-4), name


def test_old_loaders_do_not_warn_about_versions(compat_env: Path, exports: dict[str, tuple[Path, torch.Tensor]]) -> None:
    """The folder says the format version it uses (3.0.0), so 3.x-5.x do not ask users to
    "update to the latest version" to load it."""
    path = str(next(iter(exports.values()))[0])
    script = "import sys; from sentence_transformers import SentenceTransformer; SentenceTransformer(sys.argv[1], device='cpu')"
    for stack in STACKS:
        stderr = run_in(compat_env, [stack, "common", "base"], script, path).stderr
        assert "created with" not in stderr, (stack, stderr)


ONNX_SCRIPT = """
import json, sys
from pathlib import Path
import torch
from scipy.stats import spearmanr
from simcse_kit import export as export_mod
from simcse_kit.export import ExportError, export_model
from simcse_kit.inference import load_encoder

model_dir, out, bad, sentences = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])

class PairsSTS:
    # gold = simcse-kit's own cosines, so fp32 scores exactly 100
    primary_metric = "avg"
    def __init__(self):
        self.a, self.b = sentences[:6], sentences[6:12]
        self.gold = self.cos(load_encoder(model_dir).encode)
    def cos(self, encode):
        return torch.nn.functional.cosine_similarity(encode(self.a), encode(self.b))
    def __call__(self, encode):
        return {"avg": 100 * float(spearmanr(self.cos(encode), self.gold).statistic)}

result = export_model(model_dir, out, quantize="int8", sts_evaluator=PairsSTS())
# The gate for real: demand that int8 beat fp32 (= 100) by a point, which it cannot.
export_mod.MAX_INT8_STS_DROP = -1.0
try:
    export_model(model_dir, bad, quantize="int8", sts_evaluator=PairsSTS())
    failed = None
except ExportError as exc:
    failed = str(exc)

from sentence_transformers import SentenceTransformer
vectors = {}
for backend, file_name in result.onnx_files.items():
    st = SentenceTransformer(str(out), device="cpu", backend="onnx", model_kwargs={"file_name": file_name})
    vectors[backend] = st.encode(sentences).tolist()
print(json.dumps({
    "files": result.onnx_files, "sts": result.sts,
    "parity": {k: v.min_cosine for k, v in result.parity.items()},
    "failed": failed, "bad_exists": bad.exists(), "vectors": vectors,
}))
"""


def test_onnx_and_int8_exports_for_real(compat_env: Path, tmp_path: Path) -> None:
    """``export_model(quantize="int8")`` with sentence-transformers' own exporters (5.1.2 +
    optimum-onnx): both files load with ``backend="onnx"`` and pass the parity check; a
    failing int8 gate leaves nothing; the torch side still loads in 6.x unchanged."""
    from sentence_transformers import SentenceTransformer

    (tmp_path / "bert3").mkdir()
    base = save_tiny_bert(tmp_path / "bert3", layers=3)
    model_dir = save_model(base, "avg", "none", tmp_path / "model")
    out, bad = tmp_path / "onnx-export", tmp_path / "bad-export"
    got = json.loads(
        run_in(
            compat_env,
            ["st5", "onnx", "common", "base"],
            ONNX_SCRIPT,
            str(model_dir),
            str(out),
            str(bad),
            json.dumps(SENTENCES),
            with_repo=True,
        ).stdout
    )
    assert got["files"] == {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_qint8_avx512_vnni.onnx"}
    assert all((out / f).is_file() for f in got["files"].values())
    assert got["parity"]["torch"] >= 0.9999 and got["parity"]["onnx"] >= 0.999
    assert got["sts"]["simcse-kit fp32"] == pytest.approx(100.0)
    assert got["sts"]["simcse-kit fp32"] - got["sts"]["onnx-int8"] <= 0.5
    assert got["failed"] is not None and "int8 ONNX loses" in got["failed"] and not got["bad_exists"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert3", "model", "onnx-export"]

    # The ONNX step left the version-neutral files alone: 6.x loads the same folder (torch).
    assert json.loads((out / "modules.json").read_text())[0]["type"] == "sentence_transformers.models.Transformer"
    new = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_tensor=True).float()
    fp32 = torch.tensor(got["vectors"]["onnx"])
    assert torch.nn.functional.cosine_similarity(fp32.double(), new.double()).min() >= 0.999
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["backends"]["onnx-int8"] == "onnx/model_qint8_avx512_vnni.onnx"
    assert "int8 cost: STS" in (out / "README.md").read_text()
