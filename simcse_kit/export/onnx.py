"""The encoder with its pooling and normalisation as one ONNX graph, through PyTorch's own
exporter (no optimum), checked against torch at several shapes; dynamic int8 on request.

The graph takes the tokenizer's outputs (``input_ids``, ``attention_mask`` and, where the
model takes segment ids, ``token_type_ids``; int64, dynamic ``batch`` and ``sequence`` axes)
and returns ``sentence_embedding`` ``[batch, D]``: pooled, through the MLP when the model
keeps it at inference, normalised when the export is. It also returns ``last_hidden_state``
``[batch, sequence, H]`` where sentence-transformers' optimum-based ONNX backend can rebuild
the vector from it (every pooler but the layer-averaging ones, which need every layer): that
backend reads that output by name and applies the folder's own Pooling/Dense/Normalize.

**Output order.** Clients that pool for themselves read ``last_hidden_state`` either by name
(Transformers.js' ``feature-extraction`` pipeline) or as output 0 (fastembed's custom models,
``TextEmbedding.add_custom_model``). So ``last_hidden_state`` comes first exactly when mean
or CLS pooling of it (then L2 normalisation, when the export normalises) IS simcse-kit's
vector: the ``avg``, ``cls`` and ``cls_before_pooler`` poolers without an MLP at inference;
:data:`TOKEN_POOLING` names that pooling in ``onnx/simcse_onnx.json``. Otherwise (an MLP
kept at inference, or a layer-averaging pooler) ``sentence_embedding`` comes first, and a
client must read that output as the finished vector (fastembed: ``PoolingType.DISABLED``),
never pool ``last_hidden_state`` itself. simcse-kit's :class:`~simcse_kit.export.onnx_encoder.OnnxEncoder`
and sentence-transformers read by name, so the order does not matter to them.

Exporters: ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` + onnxscript) first,
then the TorchScript exporter (``dynamo=False``) if the first fails or disagrees with torch;
which one wrote the graph is recorded in ``onnx/simcse_onnx.json``. With torch 2.13 the
dynamo exporter handles every architecture in ``docs/architectures.md``; the TorchScript one
drops DeBERTa-v2's unused ``token_type_ids`` input (so it is only the fallback).

int8 is onnxruntime's ``quantize_dynamic``: MatMul weights to signed int8 (per channel),
activations quantised on the fly. Its quality gate (STS) is
:mod:`simcse_kit.export.sts_gate`'s.

onnx, onnxruntime and onnxscript are the optional ``[onnx]`` extra: they are imported inside
the functions that use them, so the rest of the export (and this module) imports without them.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from simcse_kit.export.onnx_encoder import FP32_FILE, INT8_FILE, ONNX_INFO, OUTPUT
from simcse_kit.export.source import ExportError
from simcse_kit.files import storage_error
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.model.packing import padded_decoder_inputs

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18
"""The dynamo exporter's native opset in torch 2.x; onnxruntime >= 1.14 runs it."""
MIN_OPSET = 17
"""LayerNormalization, in every transformer encoder, is an opset-17 operator: asked for less,
the dynamo exporter cannot convert its graph down and writes opset 18 instead."""
MIN_COSINE = 0.9999
"""fp32 graph vs torch: every row at every checked shape must reach this."""
EXPORTERS = ("dynamo", "torchscript")
TOKEN_STATES = "last_hidden_state"
TOKEN_POOLING = {"avg": "mean", "cls": "cls", "cls_before_pooler": "cls", "last": "last_token"}
"""simcse-kit pooler -> the pooling of ``last_hidden_state`` that gives its vector when no MLP
runs at inference (what fastembed's ``PoolingType`` and Transformers.js' ``pooling`` name:
fastembed's ``LAST_TOKEN`` finds the last real token from the mask; Transformers.js'
``last_token`` reads the last column, so the export's tokenizer pads on the left)."""
CHECK_BATCHES = (1, 7, 64)
CHECK_LENGTHS = (3, 32)  # and the model's maximum
INT8_OPS = ("MatMul",)
"""What dynamic int8 quantises: the weight matmuls, which hold nearly all the time and bytes
(embeddings and LayerNorm stay fp32; quantising the embedding Gather costs STS for little)."""


# Loggers that narrate every pass (onnxscript's rewriter, onnx_ir, a "torchvision is not
# installed" line per op) or, for onnxruntime's quantiser, log on the root logger itself.
CHATTY = ("", "onnxscript", "onnx_ir", "torch.onnx")


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """Only errors from the exporter's and quantiser's loggers while they run (a failure
    still raises); their levels are restored after."""
    loggers = [logging.getLogger(name) for name in CHATTY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class OnnxExportError(RuntimeError):
    """No exporter produced a graph that matches torch (the message names the architecture)."""


class SentenceEmbeddingGraph(nn.Module):
    """What the graph computes: encoder -> pooler -> MLP (if kept at inference) -> normalise.

    Args:
        model: An fp32 :class:`~simcse_kit.model.modeling.SimCSEModel` in ``eval()`` mode,
            packing off (the exporter traces the plain padded path).
        normalize: L2-normalise the vectors (as the export's ``Normalize`` module does).
    """

    def __init__(self, model: SimCSEModel, normalize: bool) -> None:
        super().__init__()
        self.encoder, self.pooler = model.encoder, model.pooler
        self.mlp = model.mlp if model.mlp is not None and model.mlp_mode == "always" else None
        self.normalize = normalize
        self.takes_token_type_ids = model.takes_token_type_ids
        self.is_decoder = model.is_decoder
        self.token_states = not model.pooler.needs_hidden_states
        # The pooling a client applies to last_hidden_state for our vector; None: none can.
        self.token_pooling = TOKEN_POOLING.get(model.pooler.mode) if self.mlp is None else None
        #: The graph's outputs, in order (ONNX output names).
        self.output_names = (
            [TOKEN_STATES, OUTPUT] if self.token_pooling else [OUTPUT, TOKEN_STATES] if self.token_states else [OUTPUT]
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Args: ``[B, L]`` int64 each. Returns the ``[B, D]`` vectors and, unless the pooler
        averages layers, the ``[B, L, H]`` token states, in :attr:`output_names` order."""
        kwargs: dict[str, Any] = {"attention_mask": attention_mask}
        if self.takes_token_type_ids and token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if self.is_decoder:  # position ids over real tokens, so left padding reads as right padding
            kwargs |= padded_decoder_inputs(attention_mask)
        out = self.encoder(input_ids=input_ids, output_hidden_states=self.pooler.needs_hidden_states, return_dict=True, **kwargs)
        pooled = self.pooler(attention_mask, out.last_hidden_state, out.hidden_states)
        if self.mlp is not None:
            pooled = self.mlp(pooled)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, dim=-1)
        by_name = {OUTPUT: pooled, TOKEN_STATES: out.last_hidden_state}
        return tuple(by_name[name] for name in self.output_names)

    def embed(self, **feeds: torch.Tensor) -> torch.Tensor:
        """The ``[B, D]`` vectors alone (``feeds``: the graph's inputs by name)."""
        return self(**feeds)[self.output_names.index(OUTPUT)]


def graph_inputs(model: SimCSEModel, tokenizer: Any) -> list[str]:
    """The graph's input names: the tokenizer's own, less segment ids the model does not take."""
    names = ["input_ids", "attention_mask"]
    if model.takes_token_type_ids and "token_type_ids" in getattr(tokenizer, "model_input_names", ["token_type_ids"]):
        names.append("token_type_ids")
    return names


def random_batch(
    names: Sequence[str], vocab: int, batch: int, length: int, pad_id: int, seed: int, left: bool = False
) -> dict[str, torch.Tensor]:
    """A right-padded (``left``: left-padded) ``[batch, length]`` batch of random ids (any
    but ``pad_id``): row 0 fills ``length``, the others random lengths (1..length), so
    padding and its mask are exercised."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 1, (batch, length), generator=gen)
    ids += (ids >= pad_id).long()  # never the pad id: its embedding may be zero (a zero vector has no cosine)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    if left:
        mask = mask.flip(1)
    feeds = {"input_ids": ids.masked_fill(mask == 0, pad_id), "attention_mask": mask}
    if "token_type_ids" in names:
        feeds["token_type_ids"] = torch.zeros_like(ids)
    return feeds


def _export(graph: SentenceEmbeddingGraph, names: list[str], path: Path, opset: int, exporter: str) -> None:
    outputs = graph.output_names
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, TOKEN_STATES]} | {OUTPUT: {0: "batch"}}
    example = random_batch(names, 8, 2, 8, 0, 0)  # 2 x 8: no axis of size 1 to specialise on
    kwargs: dict[str, Any] = {"dynamo": exporter == "dynamo"}
    if exporter == "dynamo":
        kwargs |= {"external_data": False, "verbose": False}
    with warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter; the parity check decides
        torch.onnx.export(
            graph,
            tuple(example[n] for n in names),
            str(path),
            input_names=names,
            output_names=outputs,
            dynamic_axes={k: v for k, v in axes.items() if k in (*names, *outputs)},
            opset_version=opset,
            **kwargs,
        )


def shape_parity(
    graph: SentenceEmbeddingGraph, path: Path, names: list[str], vocab: int, pad_id: int, max_len: int
) -> dict[str, float]:
    """Lowest cosine, graph vs torch, per ``BxL`` shape (batches 1, 7, 64 x lengths 3, 32, max);
    a decoder's also left-padded (``BxL left``: its tokenizer may pad either side)."""
    import onnxruntime as ort  # the optional [onnx] extra: imported only when a graph is checked

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    taken = {i.name for i in session.get_inputs()}
    result: dict[str, float] = {}
    lengths = sorted({min(n, max_len) for n in (*CHECK_LENGTHS, max_len)})
    sides = (False, True) if graph.is_decoder else (False,)
    for batch in CHECK_BATCHES:
        for length in lengths:
            for left in sides:
                feeds = random_batch(names, vocab, batch, length, pad_id, seed=batch * 1000 + length, left=left)
                with torch.inference_mode():
                    ref = graph.embed(**feeds)
                got = session.run([OUTPUT], {k: v.numpy() for k, v in feeds.items() if k in taken})[0]
                cos = nn.functional.cosine_similarity(ref.double(), torch.from_numpy(got).double(), dim=-1)
                result[f"{batch}x{length}" + (" left" if left else "")] = float(cos.min())
    return result


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 (onnxruntime): :data:`INT8_OPS` weights signed int8, one scale per output
    channel: per-tensor scales cost all-MiniLM-L6-v2 several times more cosine to fp32
    (BENCHMARKS.md, "Export: ONNX")."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # the optional [onnx] extra

    with _quiet_logs():
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=list(INT8_OPS), per_channel=True)


@dataclass
class OnnxExport:
    """What :func:`write_onnx` wrote (paths relative to the folder) and measured."""

    files: dict[str, str]
    exporter: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    shape_parity: dict[str, float]
    tried: dict[str, str] = field(default_factory=dict)
    token_pooling: str | None = None
    """For clients that pool output 0 themselves (fastembed, Transformers.js): ``mean`` or
    ``cls`` when that pooling of ``last_hidden_state`` (output 0) gives these vectors; None:
    output 0 is ``sentence_embedding``, to be read as it is."""


def write_onnx(
    model: SimCSEModel,
    tokenizer: Any,
    folder: Path,
    *,
    normalize: bool,
    opset: int = DEFAULT_OPSET,
    quantize: str | None = None,
    exporters: Sequence[str] = EXPORTERS,
    min_cosine: float = MIN_COSINE,
) -> OnnxExport:
    """Write :data:`FP32_FILE` (and :data:`INT8_FILE`) plus :data:`ONNX_INFO` into ``folder``.

    Args:
        model: fp32, ``eval()``, CPU.
        tokenizer: Its transformers tokenizer (input names, pad id).
        folder: The export folder (its ``onnx/`` is created).
        normalize: Whether the vectors are L2-normalised.
        opset: ONNX opset to export with.
        quantize: ``"int8"`` to add the dynamic-int8 graph.
        exporters: Tried in order; the first whose graph passes :func:`shape_parity` wins.
        min_cosine: Every row at every shape must reach this.

    Raises:
        OnnxExportError: Every exporter failed or disagreed with torch.
    """
    import onnx  # the optional [onnx] extra (require_onnx says so before any work)

    model = model.float().eval().cpu()
    if model.packing:
        raise OnnxExportError("export a model loaded without packing (SimCSEModel.load gives one)")
    graph = SentenceEmbeddingGraph(model, normalize).eval()
    names = graph_inputs(model, tokenizer)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    vocab = int(model.encoder.config.vocab_size)
    (folder / "onnx").mkdir(exist_ok=True)
    path = folder / FP32_FILE
    tried: dict[str, str] = {}
    used: str | None = None
    parity: dict[str, float] = {}
    for exporter in exporters:
        try:
            _export(graph, names, path, opset, exporter)
            parity = shape_parity(graph, path, names, vocab, pad_id, model.max_seq_len)
        except Exception as exc:  # any exporter failure: try the next, report all
            if storage_error(exc, path) is not None:  # a full disk is no exporter's fault: the next would only refill it
                path.unlink(missing_ok=True)
                raise
            tried[exporter] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
            logger.info("ONNX exporter %s failed: %s", exporter, tried[exporter])
            continue
        worst = min(parity, key=lambda k: parity[k])
        if parity[worst] >= min_cosine:
            tried[exporter] = "ok"
            used = exporter
            break
        tried[exporter] = f"cosine {parity[worst]:.6f} < {min_cosine} at batch x length {worst}"
        logger.info("ONNX exporter %s disagrees with torch: %s", exporter, tried[exporter])
    if used is None:
        path.unlink(missing_ok=True)
        arch = model.encoder.config.model_type
        raise OnnxExportError(
            f"cannot export {arch} to ONNX: " + "; ".join(f"{k}: {v}" for k, v in tried.items()) + " (docs/export.md)"
        )
    proto = onnx.load(str(path), load_external_data=False)
    done = OnnxExport(
        files={"onnx": FP32_FILE},
        exporter=used,
        opset=next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset),
        inputs=[i.name for i in proto.graph.input],
        outputs=[o.name for o in proto.graph.output],
        shape_parity=parity,
        tried=tried,
        token_pooling=graph.token_pooling,
    )
    del proto
    if done.opset != opset:  # the dynamo exporter writes 18 where it cannot convert down to the opset asked
        path.unlink(missing_ok=True)
        raise OnnxExportError(f"--opset {opset}: the {used} exporter wrote opset {done.opset} instead; ask for {done.opset}")
    logger.info("ONNX graph by the %s exporter, opset %d; lowest cosine vs torch %.7f", used, done.opset, min(parity.values()))
    if quantize == "int8":
        quantize_int8(path, folder / INT8_FILE)
        done.files["onnx-int8"] = INT8_FILE
    info = {
        "max_seq_len": model.max_seq_len,
        "pad_token_id": pad_id,
        "dim": int(model.encoder.config.hidden_size),  # the MLP keeps H
        "normalize": normalize,
        "pooler": model.pooler.mode,
        "mlp_at_inference": graph.mlp is not None,
        "model_type": model.encoder.config.model_type,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
    } | {k: v for k, v in asdict(done).items()}
    (folder / ONNX_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return done


def require_onnx() -> None:
    """Raise :class:`~simcse_kit.export.source.ExportError` (before anything is written) when
    the ONNX exporter or onnxruntime cannot run here."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter)
        import tokenizers  # noqa: F401  (the OnnxEncoder the export is checked with)
    except ImportError as exc:
        raise ExportError(f"--onnx needs onnx, onnxruntime and onnxscript ({exc}); `pip install 'simcse-kit[onnx]'`") from None


def add_onnx(model: SimCSEModel, tokenizer: Any, folder: Path, normalize: bool, quantize: str | None, opset: int) -> OnnxExport:
    """Write ``onnx/model.onnx`` (and ``onnx/model_quantized.onnx``) with :func:`write_onnx`; its
    failure is the export's (:class:`~simcse_kit.export.source.ExportError`)."""
    try:
        return write_onnx(model, tokenizer, folder, normalize=normalize, opset=opset, quantize=quantize)
    except OnnxExportError as exc:
        raise ExportError(str(exc)) from None


def onnx_info(done: OnnxExport | None) -> dict[str, Any] | None:
    """The ONNX part of ``simcse_export.json`` (None without a graph)."""
    if done is None:
        return None
    keys = ("exporter", "opset", "inputs", "outputs", "token_pooling", "shape_parity", "tried")
    return {k: getattr(done, k) for k in keys}


def quant_info() -> dict[str, Any]:
    """The quantisation part of ``simcse_export.json``."""
    return {
        "type": "dynamic int8",
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "weights": "QInt8, per channel",
        "ops": list(INT8_OPS),
    }


__all__ = [
    "DEFAULT_OPSET",
    "EXPORTERS",
    "INT8_OPS",
    "MIN_COSINE",
    "TOKEN_POOLING",
    "OnnxExport",
    "OnnxExportError",
    "SentenceEmbeddingGraph",
    "add_onnx",
    "graph_inputs",
    "onnx_info",
    "quant_info",
    "quantize_int8",
    "random_batch",
    "require_onnx",
    "shape_parity",
    "write_onnx",
]
