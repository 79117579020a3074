"""The default model (all-MiniLM-L6-v2, shipped by a PyPI package) against known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from simcse_kit.cli import main
from simcse_kit.config.run import ModelConfig
from simcse_kit.evaluation import evaluate_model, read_stsb
from simcse_kit.model.inference import load_encoder
from simcse_kit.model.modeling import SimCSEModel, resolve_model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stsb_test(data_dir: Path):
    return read_stsb(data_dir / "senteval" / "STS" / "STSBenchmark" / "sts-test.csv")


@pytest.fixture(scope="module")
def st_reference(stsb_test) -> float:
    """sentence-transformers encode + scipy, written out independently of simcse_kit."""
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(2)
    model = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    a = model.encode(stsb_test.sentences1, batch_size=128, convert_to_numpy=True)
    b = model.encode(stsb_test.sentences2, batch_size=128, convert_to_numpy=True)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return 100 * spearmanr(cos, stsb_test.scores).statistic


def test_reference_is_public_mteb_figure(st_reference: float) -> None:
    assert st_reference == pytest.approx(82.03, abs=0.05)


def test_evaluate_cli_path_matches_sentence_transformers(st_reference: float, data_dir: Path, tmp_path: Path) -> None:
    argv = ["evaluate", "all-MiniLM-L6-v2", "--data-dir", str(data_dir / "senteval"), "--tasks", "STSBenchmark"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["STSBenchmark"] == pytest.approx(st_reference, abs=0.05)


def test_own_encoder_plain_hf_and_saved_model_match(st_reference: float, data_dir: Path, tmp_path: Path) -> None:
    # Our pooler + Encoder on the raw transformer, and a simcse-kit save/load of it.
    plain = evaluate_model(
        resolve_model_path("all-MiniLM-L6-v2"), pooler="avg", data_dir=data_dir / "senteval", tasks=["STSBenchmark"]
    )
    assert plain["STSBenchmark"] == pytest.approx(st_reference, abs=0.05)

    from transformers import AutoTokenizer

    model = SimCSEModel.from_config(ModelConfig(pooler="avg"))
    model.save(tmp_path / "saved", AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2")))
    saved = evaluate_model(tmp_path / "saved", data_dir=data_dir / "senteval", tasks=["STSBenchmark"])
    assert saved["STSBenchmark"] == pytest.approx(st_reference, abs=0.05)
    assert isinstance(load_encoder(tmp_path / "saved").model, SimCSEModel)
