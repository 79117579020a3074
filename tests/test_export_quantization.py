"""Calibration that travels with the export: ``quantization.json``'s ranges reproduce the run's
int8 vectors through sentence-transformers' ``quantize_embeddings`` and through the kit's
``OnnxEncoder`` (whose numpy twin equals sentence-transformers' function)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import toy_sentences, write_tiny_senteval
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from test_export import MAX_LEN, train_and_save
from transformers import AutoTokenizer

from simcse_kit.evaluation.quantization import PRECISIONS, calibration_ranges, read_ranges
from simcse_kit.export import export_model
from simcse_kit.export.calibration import calibration_sentences
from simcse_kit.export.onnx_encoder import OnnxEncoder, quantize
from simcse_kit.model.inference import Encoder
from simcse_kit.model.modeling import SimCSEModel

PROBES = toy_sentences(40)[20:]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_onnx_encoder_twin_equals_sentence_transformers(precision: str) -> None:
    rng = np.random.default_rng(0)
    calib, x = rng.standard_normal((100, 21)).astype(np.float32), 1.2 * rng.standard_normal((30, 21)).astype(np.float32)
    ranges = calibration_ranges(calib)
    got = quantize(x, precision, ranges)
    want = quantize_embeddings(x, precision, ranges=ranges)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_export_ships_ranges_that_reproduce_the_runs_int8_vectors(tmp_path: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("onnxruntime")
    model_dir = train_and_save(tiny_model_dir, "cls", "train", tmp_path / "model")
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(toy_sentences(60)[:40]) + "\n")
    senteval = write_tiny_senteval(tmp_path / "senteval")
    out = tmp_path / "export"
    export_model(model_dir, out, onnx=True, calibration=calib, data_dir=senteval, normalize=True)

    # The run's own vectors (simcse-kit's encoder, normalised as the export), the ranges of the calibration set.
    ours = Encoder(SimCSEModel.load(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir), MAX_LEN)
    run_vectors = torch.nn.functional.normalize(ours.encode(PROBES), dim=-1).numpy()
    ranges = read_ranges(out / "quantization.json")
    want_ranges = calibration_ranges(torch.nn.functional.normalize(ours.encode(calibration_sentences(calib)), dim=-1).numpy())
    assert np.array_equal(ranges, want_ranges)
    shipped = json.loads((out / "quantization.json").read_text())
    assert shipped["calibration"] == {"sentences": 40, "source": "calibration file calib.txt"} and shipped["normalized"]
    run_int8 = quantize_embeddings(run_vectors, "int8", ranges=ranges)

    # sentence-transformers: the documented call, with ranges= or with calibration_embeddings=ranges.
    st_vectors = SentenceTransformer(str(out), device="cpu").encode(PROBES)
    st_int8 = quantize_embeddings(st_vectors, "int8", ranges=ranges)
    assert np.array_equal(quantize_embeddings(st_vectors, "int8", calibration_embeddings=ranges), st_int8)
    # ONNX through the kit's serving class (no sentence-transformers there).
    encoder = OnnxEncoder(out)
    onnx_int8, onnx_vectors = encoder.encode(PROBES, precision="int8"), encoder.encode(PROBES)
    assert np.array_equal(onnx_int8, quantize_embeddings(onnx_vectors, "int8", ranges=ranges))
    assert np.array_equal(encoder.encode(PROBES, precision="ubinary"), quantize_embeddings(run_vectors, "ubinary"))
    # A value's distance to the nearest bucket edge (sentence-transformers' int8 buckets: 255 steps over the range).
    step = (ranges[1] - ranges[0]) / 255
    at = (run_vectors - ranges[0]) / step
    to_edge = np.abs(at - np.round(at)) * step
    for name, codes, floats in (("sentence-transformers", st_int8, st_vectors), ("onnx", onnx_int8, onnx_vectors)):
        # The float vectors agree to ~1e-7, so a code can differ only by one step, and only where the run's value
        # lies within that gap of an edge. (How often that is depends on the steps: a trained tiny model can have
        # dimensions with a range of 0.003, steps of 1e-5; on one CI machine 7 of 640 ONNX codes differed so.)
        gap = float(np.abs(floats - run_vectors).max())
        diff = np.abs(codes.astype(int) - run_int8.astype(int))
        assert gap < 1e-6 and diff.max() <= 1, (name, gap, diff.max())
        assert (to_edge[diff > 0] <= 2 * gap).all(), (name, gap, to_edge[diff > 0].max())
    assert np.array_equal(st_int8, run_int8)  # the same torch computation: every code

    card = (out / "README.md").read_text()
    assert "## Compact vectors" in card and "| int8 | 32 |" in card and "| binary | 4 |" in card
    assert 'quantize_embeddings(emb, "int8", ranges=ranges)' in card
    assert "quantization.json" in json.loads((out / "simcse_export.json").read_text())["files"]


def test_export_without_a_calibration_set_ships_no_ranges(tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir = train_and_save(tiny_model_dir, "cls", "train", tmp_path / "model")  # its train file is not here
    export_model(model_dir, tmp_path / "export")
    assert not (tmp_path / "export" / "quantization.json").exists()
    assert "Compact vectors" not in (tmp_path / "export" / "README.md").read_text()


def test_a_run_export_calibrates_on_the_runs_training_sentences(tiny_run) -> None:  # noqa: ANN001 - conftest's TinyRun
    tiny_run.train("run", max_steps=2, eval_steps=2, final_eval=False)
    out = tiny_run.folder / "export"
    export_model(tiny_run.folder / "run", out)
    shipped = json.loads((out / "quantization.json").read_text())
    assert shipped["calibration"] == {"sentences": 64, "source": "training sentences train.txt"}  # the recipe's 64 lines
    model_dir = tiny_run.folder / "run" / "best_model"
    ours = Encoder(SimCSEModel.load(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir), 32)
    vectors = ours.encode(calibration_sentences(tiny_run.folder / "train.txt"))
    if shipped["normalized"]:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    assert np.array_equal(read_ranges(out / "quantization.json"), calibration_ranges(vectors.numpy()))
