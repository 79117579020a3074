"""Exports load in OLDER sentence-transformers stacks with the vectors 6.x gives (issue 14).

A fresh export of tiny models, written here with sentence-transformers 6 + transformers 5,
is loaded in a second, separate environment built by ``.ci/compat_env.sh``: sentence-
transformers 5.1.2 (the version of the user report), 4.1.0 and 3.4.1, each on transformers
4.57 from PyPI, in a subprocess (``python -S`` with ``PYTHONPATH=st*:common:base``, torch
from the main environment). The same environment (plus optimum-onnx 0.1.0, which supports
only transformers < 4.58) loads an ``--onnx --quantize int8`` export written here with
sentence-transformers' optimum-based ``backend="onnx"``.

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

from simcse_kit.config.run import ModelConfig
from simcse_kit.export import COMPAT_TESTED, export_model
from simcse_kit.model.modeling import SimCSEModel

pytestmark = pytest.mark.slow  # each test loads exports in the older stacks' fresh interpreters

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
from sentence_transformers import SentenceTransformer
sentences, exports = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for name, (path, file_name) in exports.items():
    try:
        st = SentenceTransformer(path, device="cpu", backend="onnx", model_kwargs={"file_name": file_name})
        out[name] = st.encode(sentences).tolist()
    except Exception as exc:  # what a user of that stack would see
        out[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


class PairsSTS:
    """gold = simcse-kit's own cosines, so fp32 scores exactly 100."""

    primary_metric = "avg"

    def __init__(self, model_dir: Path) -> None:
        from simcse_kit.model.inference import load_encoder

        self.a, self.b = SENTENCES[:6], SENTENCES[6:12]
        self.gold = self.cos(load_encoder(model_dir).encode)

    def cos(self, encode: object) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(encode(self.a), encode(self.b))

    def __call__(self, encode: object) -> dict[str, float]:
        from scipy.stats import spearmanr

        return {"avg": 100 * float(spearmanr(self.cos(encode), self.gold).statistic)}


def test_onnx_exports_load_with_the_optimum_backend(compat_env: Path, tmp_path: Path) -> None:
    """An ``--onnx --quantize int8`` export written HERE (torch.onnx, transformers 5, no
    optimum) loads with ``backend="onnx"`` in sentence-transformers 5.1.2 + optimum-onnx, the
    stack whose ONNX backend users have: it reads the graph's ``last_hidden_state`` and
    applies the folder's own modules, and gives simcse-kit's vectors. A layer-averaging
    pooler's graph has no ``last_hidden_state``: that backend fails loudly, never wrongly."""
    from simcse_kit.export.onnx_encoder import OnnxEncoder

    (tmp_path / "bert3").mkdir()
    base = save_tiny_bert(tmp_path / "bert3", layers=3)
    model_dir = save_model(base, "avg", "none", tmp_path / "model")
    out = tmp_path / "onnx-export"
    result = export_model(model_dir, out, quantize="int8", sts_evaluator=PairsSTS(model_dir))
    assert result.onnx_files == {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_quantized.onnx"}
    mlp, top2 = tmp_path / "mlp-export", tmp_path / "top2-export"  # Pooling(cls) -> Dense -> Normalize; layer averaging
    export_model(save_model(base, "cls", "always", tmp_path / "model-mlp"), mlp, onnx=True)
    export_model(save_model(base, "avg_top2", "none", tmp_path / "model-top2"), top2, onnx=True)
    exports = {
        "fp32": (str(out), "onnx/model.onnx"),
        "int8": (str(out), "onnx/model_quantized.onnx"),
        "mlp": (str(mlp), "onnx/model.onnx"),
        "top2": (str(top2), "onnx/model.onnx"),
    }
    got = json.loads(
        run_in(compat_env, ["st5", "onnx", "common", "base"], ONNX_SCRIPT, json.dumps(SENTENCES), json.dumps(exports)).stdout
    )

    from sentence_transformers import SentenceTransformer

    for name, (path, file_name) in exports.items():
        if name == "top2":
            continue
        assert isinstance(got[name], list), got[name]
        old = torch.tensor(got[name]).double()
        # The same graph run by the same onnxruntime: the two pipelines agree, fp32 and int8 alike.
        ours = torch.from_numpy(OnnxEncoder(path, file_name).encode(SENTENCES)).double()
        assert torch.nn.functional.cosine_similarity(old, ours).min() >= 0.9999, name
        torch.testing.assert_close(old.norm(dim=-1), ours.norm(dim=-1), rtol=1e-4, atol=0)
        if name != "int8":  # and fp32 gives simcse-kit's vectors (its torch load was checked against them)
            kit = SentenceTransformer(path, device="cpu").encode(SENTENCES, convert_to_tensor=True).double()
            assert torch.nn.functional.cosine_similarity(old, kit).min() >= 0.9999, name
    assert isinstance(got["top2"], str) and "last_hidden_state" in got["top2"], got["top2"]
