"""One export, end to end: check the source and target, write the folder, verify every
backend, write the card and the provenance, then (on request) upload.

The folder is built inside :func:`~simcse_kit.files.atomic_dir`, reloaded from disk with
``SentenceTransformer`` and compared with simcse-kit on probe sentences (cosine and vector
norm, so a missing ``Normalize`` is caught too). With ``onnx=True`` the encoder with its
pooling and normalisation is written as one ONNX graph by :mod:`simcse_kit.export.onnx`
(PyTorch's exporter, no optimum; checked against torch at several shapes) and checked the
same way through :class:`~simcse_kit.export.onnx_encoder.OnnxEncoder` (onnxruntime + tokenizers);
with ``quantize="int8"`` a dynamic-int8 graph is added and must keep STS-B dev within
:data:`~simcse_kit.export.sts_gate.MAX_INT8_STS_DROP` of simcse-kit's fp32 model (the run's
recorded score where it is the same measurement). Any failed check leaves nothing at ``out_dir``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentence_transformers
import torch
import transformers
from transformers import AutoTokenizer

from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.quantization import QUANTIZATION_FILE, write_quantization
from simcse_kit.export.calibration import calibrate, vector_scores, vectors_card
from simcse_kit.export.card import model_card
from simcse_kit.export.folder import (
    COMPAT_TESTED,
    decide_normalize,
    describe_modules,
    export_modules,
    truncation_lengths,
    write_folder,
    write_json,
)
from simcse_kit.export.hub import hub_upload
from simcse_kit.export.onnx import DEFAULT_OPSET, add_onnx, onnx_info, quant_info, require_onnx
from simcse_kit.export.source import EXPORT_INFO, ExportError, ExportSource, check_target, export_files, find_source
from simcse_kit.export.sts_gate import STSScorer, default_scorer, int8_gate, kept_fp32_score
from simcse_kit.export.verify import (
    MIN_COSINE,
    MIN_COSINE_ONNX,
    PROBE_SENTENCES,
    ExportResult,
    check_parity,
    encode_speed,
    load_backend,
    onnx_encode,
    parity,
    st_encode,
)
from simcse_kit.files import atomic_dir
from simcse_kit.model.checks import load_checked_tokenizer, tokenization_problem
from simcse_kit.model.devices import resolve_device
from simcse_kit.model.inference import Encoder
from simcse_kit.model.modeling import SimCSEModel

logger = logging.getLogger(__name__)


def export_model(
    source_path: str | Path,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    normalize: bool | None = None,
    onnx: bool = False,
    quantize: str | None = None,
    sts_evaluator: STSScorer | None = None,
    data_dir: str | Path | None = None,
    data_root: str | Path | None = None,
    push_to_hub: str | None = None,
    probes: Sequence[str] = PROBE_SENTENCES,
    min_cosine: float = MIN_COSINE,
    device: str = "auto",
    opset: int = DEFAULT_OPSET,
    truncate_dim: int | None = None,
    calibration: str | Path | None = None,
    trust_remote_code: bool = False,
) -> ExportResult:
    """Write a sentence-transformers folder for a simcse-kit run or model, verified.

    Args:
        source_path: A run folder or a simcse-kit model folder.
        out_dir: Where the export goes. Appears only complete and verified.
        overwrite: Replace an existing non-empty ``out_dir`` (atomically, after the checks)
            if it is an earlier export (holds ``simcse_export.json``); any other folder is refused.
        normalize: End with ``Normalize``; None decides
            (:func:`~simcse_kit.export.folder.decide_normalize`).
        onnx: Also write ``onnx/model.onnx`` (encoder + pooling + normalisation, one graph)
            and check it (cosine >= :data:`~simcse_kit.export.verify.MIN_COSINE_ONNX`, with
            onnxruntime + tokenizers).
        quantize: ``"int8"``: also write a dynamic-int8 ONNX model (implies ``onnx``) and
            require its STS within :data:`~simcse_kit.export.sts_gate.MAX_INT8_STS_DROP` of
            simcse-kit fp32.
        sts_evaluator: What the int8 gate scores with (``encode -> scores``); default STS-B
            dev (:class:`~simcse_kit.evaluation.DevEvaluator`) of ``data_dir``.
        data_dir: SentEval-layout folder for the default evaluator; default ``senteval/``
            under the data root.
        data_root: The data root (default: ``SIMCSE_KIT_DATA``, else ``../shared/data``
            beside a source checkout; :func:`simcse_kit.config.recipes.data_root`).
        push_to_hub: Upload the finished folder to this hub repo id.
        probes: Sentences encoded by both sides for the parity checks.
        min_cosine: Every probe's cosine (torch backend) must be at least this.
        device: Where the torch parity check encodes, both sides (``auto``: CUDA, else
            MPS, else CPU; :func:`simcse_kit.model.devices.resolve_device`); ONNX runs on the CPU.
        opset: ONNX opset of the graphs.
        truncate_dim: sentence-transformers loads the export with this many dimensions
            (a Matryoshka model); parity is checked on that prefix.
        calibration: Sentences (one a line, or CSV/JSONL ``sent0``) whose per-dimension
            ranges are shipped as ``quantization.json`` for int8 vectors; default the run's
            training file (none shipped where it is not found; :mod:`~simcse_kit.export.calibration`).
        trust_remote_code: Run the model folder's own code (``auto_map``) to load it, and
            the export's to check it; otherwise such a model is refused with one line.

    Raises:
        ConfigError: Bad source, target or option (nothing is written).
        ExportError: No exact mapping for the pooler, no working ONNX stack, or a failed
            check (the temporary folder is removed; an existing ``out_dir`` is untouched).
    """
    if quantize not in (None, "int8"):
        raise ConfigError(f"--quantize {quantize!r}: only 'int8' is supported")
    onnx = onnx or quantize is not None
    source = find_source(source_path)
    out = Path(out_dir)
    check_target(source, out, overwrite)
    if not probes:
        raise ConfigError("no probe sentences to check the export with")
    if onnx:
        require_onnx()
    evaluator = sts_evaluator
    if quantize and evaluator is None:
        evaluator = default_scorer(data_dir, data_root)  # read (and checked) before any model work

    use_norm, why = decide_normalize(source, normalize)
    where = resolve_device(device)
    trust = trust_remote_code
    model = SimCSEModel.load(source.model_dir, trust_remote_code=trust).float().eval()
    tokenizer = load_checked_tokenizer(source.model_dir, model.encoder.config.vocab_size, trust)
    ours = Encoder(model, tokenizer, model.max_seq_len, where)
    reference = ours.encode(list(probes))
    if use_norm:
        reference = torch.nn.functional.normalize(reference, dim=-1)
    if truncate_dim is not None:  # sentence-transformers truncates after its Normalize
        if not 1 <= truncate_dim <= reference.shape[1]:
            raise ConfigError(f"--truncate-dim {truncate_dim}: must lie in 1..{reference.shape[1]} (the embedding size)")
        reference = reference[:, :truncate_dim]
    modules = export_modules(model, use_norm)
    summary = describe_modules(modules)
    result = ExportResult(out, summary, use_norm, why, len(probes), sentence_transformers.__version__)

    with atomic_dir(out) as tmp:
        prompts = source.meta.get("prompts")
        source_tokenizer = AutoTokenizer.from_pretrained(source.model_dir, trust_remote_code=trust)
        write_folder(model, source_tokenizer, modules, tmp, prompts, truncate_dim)
        # Reload from disk: this checks the files users get, not an object we built.
        reloaded = load_backend(tmp, device=str(where), trust_remote_code=trust)
        # Parity below encodes both sides with copies of one tokenizer: compare the ids of an
        # independent load of the exported one with the source's, and their [UNK] share.
        exported_tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=trust)
        problem = tokenization_problem(tokenizer, exported_tokenizer, list(probes), model.max_seq_len)
        if problem:
            raise ExportError(f"{problem}; nothing written to {out}")
        if reloaded.max_seq_length != model.max_seq_len:
            raise ExportError(f"exported max_seq_length {reloaded.max_seq_length} != model's {model.max_seq_len}")
        # Loaders differ in which length they read (fastembed: the smaller tokenizer_config one).
        lengths = truncation_lengths(tmp)
        if set(lengths.values()) != {model.max_seq_len}:
            raise ExportError(f"exported truncation lengths {lengths} != the model's {model.max_seq_len}; nothing written")
        encode = st_encode(reloaded)
        exported = encode(probes)
        result.parity["torch"] = parity(reference, exported)
        check_parity("torch", result.parity["torch"], min_cosine, probes, out)
        result.speed["torch"] = encode_speed(encode, probes)

        if onnx:
            result.onnx = add_onnx(model, tokenizer, tmp, use_norm, quantize, opset)
            result.onnx_files = dict(result.onnx.files)
            fp32_encode = onnx_encode(tmp, result.onnx_files["onnx"])
            result.parity["onnx"] = parity(reference, fp32_encode(probes))
            check_parity("onnx", result.parity["onnx"], MIN_COSINE_ONNX, probes, out)
            result.speed["onnx"] = encode_speed(fp32_encode, probes)
        if quantize:
            assert evaluator is not None
            q_encode = onnx_encode(tmp, result.onnx_files["onnx-int8"])
            result.parity["onnx-int8"] = parity(reference, q_encode(probes))
            result.speed["onnx-int8"] = encode_speed(q_encode, probes)
            kept = kept_fp32_score(source, evaluator)
            result.sts = int8_gate(evaluator, ours.encode, q_encode, out, kept)
            result.sts_fp32_from = "computed" if kept is None else "run record"

        card = model_card(source, result, int(exported.shape[1]))
        calibrated = calibrate(source, ours.encode, use_norm, truncate_dim, calibration)
        if calibrated is not None:
            write_quantization(tmp / QUANTIZATION_FILE, calibrated.ranges, calibrated.count, calibrated.source, use_norm)
            scores = vector_scores(evaluator, data_dir, data_root, ours.encode, calibrated.ranges, use_norm, truncate_dim)
            card += vectors_card(calibrated, int(exported.shape[1]), scores)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        # Its own files listed: a later --overwrite deletes only a folder holding nothing else.
        info = export_info(source, model, result, truncate_dim, quantize) | {"files": [*export_files(tmp), EXPORT_INFO]}
        write_json(tmp / EXPORT_INFO, info)
        # Encoders keep the files open on some platforms; let go before the rename.
        del reloaded
    logger.info("exported %s -> %s (%s)", source_path, out, summary)
    if push_to_hub:
        logger.info("uploaded to %s", hub_upload(out, push_to_hub))
    return result


def export_info(
    source: ExportSource, model: SimCSEModel, result: ExportResult, truncate_dim: int | None, quantize: str | None
) -> dict[str, Any]:
    """The provenance written as ``simcse_export.json``: source, mapping, checks, versions."""
    return {
        "source": str(source.run_dir or source.model_dir),
        "base_model": source.base_model,
        "pooler": model.pooler.mode,
        "mlp": model.mlp_mode,
        "max_seq_len": model.max_seq_len,
        "modules": result.modules,
        "normalize": result.normalize,
        "normalize_reason": result.normalize_reason,
        "truncate_dim": truncate_dim,
        "backends": {"torch": "model.safetensors", **result.onnx_files},
        "onnx": onnx_info(result.onnx),
        "quantization": quant_info() if quantize else None,
        "parity": {k: vars(v) for k, v in result.parity.items()},
        "parity_min_cosine": result.min_cosine,
        "parity_max_abs_diff": result.max_abs_diff,
        "parity_probes": result.n_probes,
        "encode_speed_sentences_per_s": result.speed,
        "sts": result.sts,
        "sts_fp32_from": result.sts_fp32_from,
        "sentence_transformers_checked": result.st_version,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "sentence_transformers_compat_tested": list(COMPAT_TESTED),
        "simcse_meta": source.meta,
    }
