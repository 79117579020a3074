"""Sentences -> vectors: the inference side of a trained (or any) encoder.

:class:`Encoder` wraps a :class:`~simcse_kit.model.modeling.SimCSEModel` (or any module taking a
tokenised batch) and a tokenizer; :class:`SentenceTransformerEncoder` wraps a
sentence-transformers folder; :func:`load_encoder` opens whatever a user names as MODEL.
Training code never needs this module except to evaluate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hub_constants
from torch import nn
from transformers import PreTrainedTokenizerBase

from simcse_kit.config.run import POOLERS
from simcse_kit.errors import ConfigError
from simcse_kit.model.checks import check_weights, load_checked_tokenizer
from simcse_kit.model.devices import AUTO_DEVICE, resolve_device
from simcse_kit.model.families import load_pretrained_encoder
from simcse_kit.model.modeling import SIMCSE_CONFIG, SimCSEModel, resolve_model_path
from simcse_kit.model.precision import resolve_eval_precision

logger = logging.getLogger(__name__)

__all__ = ["Encoder", "SentenceTransformerEncoder", "autocast_context", "load_encoder"]


def autocast_context(device: torch.device, precision: str) -> AbstractContextManager[Any]:
    """bf16/fp16 autocast for inference, or a no-op for ``"no"``/fp32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return nullcontext()


class Encoder:
    """Inference wrapper: sentences -> ``[N, H]`` fp32 embeddings (not normalised).

    Sentences are tokenised a block at a time and sorted by *token* count before
    batching, then returned in input order. Sorting by characters, the usual shortcut,
    leaves far more of the positions as padding.
    """

    # Sentences tokenised (and sorted) together: bounds the memory held in token lists.
    BLOCK_BATCHES = 64

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_seq_len: int,
        device: str | torch.device | None = None,
        precision: str = "no",
        prompts: Mapping[str, str] | None = None,
    ) -> None:
        # None: where the model already is (a model on the GPU stays there).
        device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(device).eval()
        # The model's prompts by name (``query``, ``document``), for the evaluators to put
        # before their texts; encode() itself never adds one.
        self.prompts = dict(prompts or {})
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.device = device
        self.precision = precision

    @torch.inference_mode()
    def encode(self, sentences: Sequence[str], batch_size: int = 128) -> torch.Tensor:
        """Args: ``N`` sentences. Returns ``[N, H]`` fp32 (``[0, 0]`` for none)."""
        out: list[torch.Tensor] = []
        order: list[int] = []
        block = batch_size * self.BLOCK_BATCHES
        for first in range(0, len(sentences), block):
            texts = list(sentences[first : first + block])
            features = self.tokenizer(texts, truncation=True, max_length=self.max_seq_len)
            rows = [dict(zip(features.keys(), values, strict=True)) for values in zip(*features.values(), strict=True)]
            by_length = sorted(range(len(texts)), key=lambda i: -len(rows[i]["input_ids"]))
            order.extend(first + i for i in by_length)
            for start in range(0, len(by_length), batch_size):
                batch = self.tokenizer.pad([rows[i] for i in by_length[start : start + batch_size]], return_tensors="pt")
                inputs = {k: v.to(self.device) for k, v in batch.items()}
                with autocast_context(self.device, self.precision):
                    out.append(self.model(**inputs).float().cpu())
        if not out:
            return torch.empty(0, 0)
        embeddings = torch.cat(out)
        result = torch.empty_like(embeddings)
        result[torch.tensor(order)] = embeddings
        return result

    __call__ = encode


class SentenceTransformerEncoder:
    """A sentence-transformers folder (its own modules decide pooling and normalisation)."""

    def __init__(
        self,
        path: str,
        device: str | torch.device = "cpu",
        max_seq_len: int | None = None,
        precision: str = "no",
        trust_remote_code: bool = False,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device=str(device), trust_remote_code=trust_remote_code)
        if max_seq_len is not None:
            self.model.max_seq_length = max_seq_len
        self.device = torch.device(device)
        self.precision = precision  # applied as autocast around its encode, as for our own models
        self.prompts = {name: text for name, text in self.model.prompts.items() if text}

    def encode(self, sentences: Sequence[str], batch_size: int = 128) -> torch.Tensor:
        """Args: ``N`` sentences. Returns ``[N, H]`` fp32 on the CPU."""
        with autocast_context(self.device, self.precision):
            out = self.model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return out.float().cpu()

    __call__ = encode


def load_encoder(
    path: str | Path,
    pooler: str | None = None,
    max_seq_len: int | None = None,
    device: str | torch.device = AUTO_DEVICE,
    precision: str = "no",
    trust_remote_code: bool = False,
) -> Encoder | SentenceTransformerEncoder:
    """Load whatever MODEL names: a simcse-kit run folder (its ``best_model``), a
    simcse-kit model folder, a sentence-transformers folder, or a plain HF model
    folder / hub id (then ``pooler`` is required: nothing is guessed).

    ``precision`` is ``no`` (fp32), ``bf16``, ``fp16`` or ``auto`` (bf16 where this device
    computes it natively, else fp32: :func:`simcse_kit.model.precision.resolve_eval_precision`),
    applied to every kind of model, sentence-transformers folders included.

    ``device`` is ``auto`` (CUDA, else MPS, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``
    (:func:`simcse_kit.model.devices.resolve_device`). A model recorded with flash attention
    reloads with SDPA unless ``precision`` is fp16 or bf16 (flash runs only in those).
    A folder that would run its own code (``auto_map``) is refused unless ``trust_remote_code``.
    """
    device = resolve_device(device)
    logger.info("encoding on %s", device)
    if precision == "auto":
        precision = resolve_eval_precision("auto", device).mixed_precision
    resolved = Path(resolve_model_path(str(path)))
    if (resolved / "best_model" / SIMCSE_CONFIG).is_file():
        resolved = resolved / "best_model"
    if (resolved / SIMCSE_CONFIG).is_file():
        if pooler is not None:
            logger.warning("--pooler %s ignored: %s records its own pooler", pooler, resolved)
        model = SimCSEModel.load(resolved, precision=precision, trust_remote_code=trust_remote_code)
        tokenizer = load_checked_tokenizer(resolved, model.encoder.config.vocab_size, trust_remote_code, model.pooler.mode)
        prompts = json.loads((resolved / SIMCSE_CONFIG).read_text(encoding="utf-8")).get("prompts")
        return Encoder(model, tokenizer, max_seq_len or model.max_seq_len, device, precision, prompts)
    if (resolved / "modules.json").is_file():
        if pooler is not None:
            logger.warning("--pooler %s ignored: %s is a sentence-transformers folder", pooler, resolved)
        check_weights(resolved, trust_remote_code)
        return SentenceTransformerEncoder(str(resolved), device, max_seq_len, precision, trust_remote_code)
    looks_local = str(path).startswith(("/", ".", "~")) or str(path).count("/") > 1  # a hub id is "org/name"
    if looks_local and not resolved.is_dir():
        raise ConfigError(f"{path}: no such model folder")
    if not resolved.is_dir() and hub_constants.HF_HUB_OFFLINE:  # the real problem comes first, not "pass --pooler"
        raise ConfigError(f"{path}: no such local folder, and the hub is offline (HF_HUB_OFFLINE=1): cannot look it up there")
    if resolved.is_dir() and not (resolved / "config.json").is_file():  # the real problem, not "pass --pooler"
        raise ConfigError(
            f"{path}: not a model folder (no config.json, and no {SIMCSE_CONFIG} or modules.json of a simcse-kit "
            "or sentence-transformers model)"
        )
    if pooler is None:
        raise ConfigError(f"{path}: a plain transformers model records no pooler; pass --pooler (one of {POOLERS})")
    check_weights(resolved, trust_remote_code)
    try:
        # SDPA where the architecture has it
        encoder, attn = load_pretrained_encoder(str(resolved), trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot load a model there ({exc})") from None
    tokenizer = load_checked_tokenizer(resolved, encoder.config.vocab_size, trust_remote_code, pooler)
    model = SimCSEModel(encoder, pooler, "none", max_seq_len or 256, attn_implementation=attn)
    return Encoder(model, tokenizer, model.max_seq_len, device, precision)
