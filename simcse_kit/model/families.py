"""What differs between the encoders users bring, in one place, from public API only.

SimCSE works on any bidirectional ``AutoModel`` encoder, but the architectures differ
in facts the toolkit must not guess:

* **attention**: MPNet and DeBERTa-v2 have no SDPA attention (transformers raises a
  ``ValueError`` when asked for it). :func:`load_pretrained_encoder` asks for SDPA and,
  under ``"auto"``, falls back to eager with one log line; an explicit choice is
  honoured or refused, never silently changed.
* **dropout keys**: the config keys that set the dropout (the unsupervised
  augmentation) are named differently per family (:data:`DROPOUT_KEYS`);
  :func:`dropout_overrides` refuses an architecture whose keys are unknown and
  :func:`check_dropout` verifies, on the built model, that every dropout site got the
  requested rate.
* **token_type_ids**: DistilBERT, MPNet and ModernBERT take none
  (:func:`takes_token_type_ids` reads ``forward``'s signature).
* **position ids**: RoBERTa-style embeddings (RoBERTa, XLM-R, MPNet) count positions
  from ``padding_idx + 1`` (:func:`position_offset`); code that passes its own
  ``position_ids`` (sequence packing) must add it.
* **pooler layer**: BERT, RoBERTa, XLM-R and MPNet have one (dense + tanh on the first
  token), DistilBERT, DeBERTa-v2, ELECTRA and ModernBERT do not
  (:func:`has_pooler_layer`). simcse-kit's ``cls`` pooler never uses it, so ``cls``
  and ``cls_before_pooler`` read the same vector on every architecture.
* **local attention**: ModernBERT attends within a sliding window in some layers;
  :func:`probe_batch` makes verification probes longer than the window, so a trick
  that ignores the window (a prepared 4-D packing mask) is caught, not trusted.
* **decoders**: a causal language model's body (Qwen3, Qwen2, Llama, Mistral, Gemma3
  text, ...: :func:`is_decoder`) attends causally, as it was trained; its sentence vector
  is the last real token's state (pooler ``last``) after an EOS that the tokenizer appends
  (:func:`prepare_tokenizer`), and its position ids count real tokens only
  (:func:`decoder_position_ids`), so left and right padding give the same vector.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING, AutoModel, PretrainedConfig, PreTrainedModel

from simcse_kit.errors import ConfigError

logger = logging.getLogger(__name__)

AUTO = "auto"
"""``attn_implementation`` value: SDPA where the architecture has it, else eager."""

# Tried in order under "auto". Flash attention is not tried: it needs half-precision
# weights (simcse-kit trains fp32 master weights) and cannot take packing's block mask;
# ask for it explicitly ("flash_attention_2") where it fits.
AUTO_ORDER = ("sdpa", "eager")

# Implementations that take only fp16/bf16 inputs: an fp32 forward through them fails.
HALF_PRECISION_ONLY = frozenset({"flash_attention_2", "flash_attention_3"})

_BERT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
DROPOUT_KEYS: Mapping[str, tuple[str, ...]] = {
    "bert": _BERT_KEYS,
    "roberta": _BERT_KEYS,
    "xlm-roberta": _BERT_KEYS,
    "camembert": _BERT_KEYS,
    "electra": _BERT_KEYS,
    "mpnet": _BERT_KEYS,
    "deberta": _BERT_KEYS,
    "deberta-v2": _BERT_KEYS,
    "distilbert": ("dropout", "attention_dropout"),
    "modernbert": ("embedding_dropout", "mlp_dropout", "attention_dropout"),
    # Decoders drop only attention probabilities (there is no hidden-state dropout to set).
    **dict.fromkeys(("qwen3", "qwen2", "llama", "mistral", "gemma", "gemma2", "gemma3_text"), ("attention_dropout",)),
}
"""``config.model_type`` -> the config keys that set every dropout of the base encoder
(task heads' keys, such as DistilBERT's ``seq_classif_dropout``, are left alone)."""

# Embeddings that build position ids as padding_idx + 1 + i (fairseq's convention).
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet"})


# LoRA's default targets where peft has none of its own (peft knows BERT, RoBERTa, XLM-R,
# ELECTRA, DeBERTa-v2 and the decoders: the query and value projections).
LORA_TARGETS: Mapping[str, tuple[str, ...]] = {
    "mpnet": ("q", "v"),
    "distilbert": ("q_lin", "v_lin"),
    "modernbert": ("Wqkv",),
}


def lora_targets(model_type: str, configured: list[str] | None) -> list[str] | str | None:
    """The modules a LoRA adapter wraps: the configured names (``["all-linear"]`` is peft's
    every-linear-layer shorthand), else this family's query and value projections (None:
    peft's own table)."""
    if configured:
        return "all-linear" if configured == ["all-linear"] else list(configured)
    known = LORA_TARGETS.get(model_type)
    return list(known) if known else None


def is_decoder(config: PretrainedConfig) -> bool:
    """Whether ``config`` describes a decoder-only language model: one transformers builds
    a causal LM for and no masked LM (BERT has both, Qwen3 and Llama only the first)."""
    kind = type(config)
    return kind in MODEL_FOR_CAUSAL_LM_MAPPING and kind not in MODEL_FOR_MASKED_LM_MAPPING


def decoder_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` position ids that count real tokens only: 0, 1, 2, ... from each
    sentence's first real token, whichever side the padding is on. A decoder given its
    default ``arange(T)`` would start a left-padded sentence at the number of pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prepare_tokenizer(
    tokenizer: Any, config: PretrainedConfig, append_eos: bool | None = None, pooler: str = "last", folder: object = None
) -> Any:
    """Make a decoder's tokenizer ready for embedding (encoders' tokenizers pass unchanged).

    * No pad token (Llama's): the EOS token pads (the attention mask hides it).
    * ``append_eos`` (None: on for a decoder): the tokenizer's post-processor appends the
      EOS token to every text, as Qwen3-Embedding's and RepLLaMA's do, so the last-token
      vector reads a state that has seen the whole sentence and a fixed end. It is written
      into the tokenizer itself, which is saved with the model, so every client of an
      export (sentence-transformers, Transformers.js, fastembed) appends it too. A
      tokenizer without an EOS token (a BERT vocabulary on a GPT-2 body) is refused only
      where the EOS is needed: ``append_eos`` True, or the ``last`` pooler, whose vector
      would otherwise end on whatever token the text ends with; under another pooler it
      is left as it is.

    Args:
        tokenizer: the model's tokenizer (changed in place).
        config: the model's config (decoder or encoder).
        append_eos: ``model.append_eos``.
        pooler: ``model.pooler``.
        folder: the model folder, for the error message.

    Raises:
        ConfigError: EOS needed, and the tokenizer has no EOS token or is not a fast
            (``tokenizers``) one; naming the folder and ``model.append_eos``.
    """
    if not is_decoder(config):
        return tokenizer
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if append_eos is False:
        return tokenizer
    eos, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
    if eos is None or eos_id is None:
        if append_eos is True:
            raise ConfigError(f"config key 'model.append_eos' = True: the tokenizer at {folder} has no EOS token to append")
        if pooler != "last":
            return tokenizer  # nothing reads a fixed end: the texts are left as they are
        raise ConfigError(
            f"config key 'model.append_eos' = null (auto): the decoder at {folder} with pooler 'last' reads the vector after an "
            "appended EOS token, and its tokenizer has none; set model.append_eos false (the vector then ends on the "
            "text's own last token) or choose another model.pooler"
        )
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    if full and full[-1] == eos_id:
        return tokenizer  # already appends it (Qwen3-Embedding's own tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"config key 'model.append_eos': appending EOS needs a fast tokenizer; the one at {folder} "
            f"({type(tokenizer).__name__}) is not; set model.append_eos false"
        )
    from tokenizers import processors

    # Keep what the tokenizer already puts first (Llama's and Gemma's BOS), then append EOS.
    prefix = full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []
    specials = {tokenizer.convert_ids_to_tokens(i): i for i in [*prefix, eos_id]}
    head = " ".join(tokenizer.convert_ids_to_tokens(i) for i in prefix)
    single = f"{head} $A {eos}".strip()
    pair = f"{head} $A {eos} $B:1 {eos}:1".strip()
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(specials.items()))
    return tokenizer


def dropout_overrides(model_type: str, rate: float) -> dict[str, float]:
    """Config overrides that set every dropout of a ``model_type`` encoder to ``rate``.

    Raises:
        ConfigError: the architecture's dropout keys are not known; ignoring the
            setting would silently train with the model's own rate.
    """
    keys = DROPOUT_KEYS.get(model_type)
    if keys is None:
        raise ConfigError(
            f"config key 'model.dropout' = {rate!r}: simcse-kit does not know which config keys set the dropout "
            f"of a {model_type!r} model (known: {', '.join(sorted(DROPOUT_KEYS))}); leave model.dropout unset "
            "to train with the model's own dropout"
        )
    return dict.fromkeys(keys, rate)


def dropout_rates(model: nn.Module) -> dict[str, float]:
    """Every dropout site of ``model``: its qualified name -> drop probability.

    Counts dropout modules (``nn.Dropout`` and drop-ins with a float ``p``) and float
    attributes whose name contains ``dropout`` (ModernBERT keeps its attention
    dropout as a float that it hands to the attention function).
    """
    rates: dict[str, float] = {}
    for name, module in model.named_modules():
        p = getattr(module, "p", None)
        if "Dropout" in type(module).__name__ and isinstance(p, float):
            rates[name] = p
        for attr, value in vars(module).items():
            if "dropout" in attr and not attr.startswith("_") and isinstance(value, float):
                rates[f"{name}.{attr}" if name else attr] = value
    return rates


def check_dropout(model: nn.Module, rate: float) -> None:
    """Raise ConfigError unless every dropout site of ``model`` drops with ``rate``."""
    rates = dropout_rates(model)
    wrong = {k: v for k, v in rates.items() if abs(v - rate) > 1e-12}
    if not rates and rate > 0:
        raise ConfigError(f"config key 'model.dropout' = {rate!r}: the model has no dropout to set")
    if wrong:
        shown = ", ".join(f"{k}={v:g}" for k, v in list(wrong.items())[:4])
        raise ConfigError(
            f"config key 'model.dropout' = {rate!r}: {len(wrong)} dropout site(s) of this "
            f"{type(model).__name__} kept another rate ({shown}); its config keys for dropout are not the ones simcse-kit sets"
        )


def warn_if_no_dropout(model: nn.Module) -> None:
    """Log a warning when ``model`` has no active dropout (ModernBERT's defaults):
    unsupervised SimCSE's two views of a sentence would then be identical."""
    if not any(v > 0 for v in dropout_rates(model).values()):
        logger.warning(
            "%s has no dropout (all rates 0): unsupervised SimCSE uses dropout as its augmentation, "
            "so set model.dropout (SimCSE: 0.1) for unsup training",
            type(model).__name__,
        )


def takes_token_type_ids(model: nn.Module) -> bool:
    """Whether ``model.forward`` names a ``token_type_ids`` parameter (a ``**kwargs``
    catch-all does not count: DistilBERT, MPNet and ModernBERT have no segment ids)."""
    return "token_type_ids" in inspect.signature(model.forward).parameters


def position_offset(model: nn.Module) -> int:
    """The first position id of a sentence: ``padding_idx + 1`` for RoBERTa-style
    embeddings (RoBERTa, XLM-R, MPNet), else 0."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in OFFSET_POSITIONS:
        return 0
    embeddings = getattr(model, "embeddings", None)
    padding_idx = getattr(embeddings, "padding_idx", None)
    if not isinstance(padding_idx, int):
        padding_idx = getattr(config, "pad_token_id", None)
    if not isinstance(padding_idx, int):
        raise ConfigError(f"{type(model).__name__}: RoBERTa-style positions need a padding index; the config has none")
    return padding_idx + 1


def max_tokens(config: PretrainedConfig) -> int | None:
    """The longest input the position table takes: ``max_position_embeddings`` less
    RoBERTa-style offset positions (514 -> 512 for RoBERTa), or None when unbounded."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    if getattr(config, "model_type", None) in OFFSET_POSITIONS:
        pad = getattr(config, "pad_token_id", None)
        limit -= (pad if isinstance(pad, int) else 1) + 1
    return limit


def has_pooler_layer(model: nn.Module) -> bool:
    """Whether the encoder has its own pooler layer (BERT's dense + tanh on [CLS]).
    simcse-kit never uses it (it is frozen in training)."""
    return isinstance(getattr(model, "pooler", None), nn.Module)


def sliding_window(config: PretrainedConfig) -> int | None:
    """The half-width of the model's local attention window, or None (global only)."""
    window = getattr(config, "sliding_window", None)
    return window if isinstance(window, int) and window > 0 else None


def probe_lengths(config: PretrainedConfig) -> tuple[int, int, int]:
    """Sentence lengths ``(n, a, b)`` with ``a + b == n`` (so the three pack into two
    rows): ``(5, 3, 2)``, or longer than a local-attention window when there is one."""
    window = sliding_window(config)
    n = 5 if window is None else window + 2
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):
        n = max(2, min(n, limit - 2))  # room for RoBERTa's offset positions
    a = n - (2 * n) // 5
    return n, a, n - a


def probe_batch(model: nn.Module, seed: int = 0, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded batch of three random sentences for verification checks.

    Args:
        model: a Hugging Face encoder (its config gives vocabulary, pad id, window).
        seed: the generator seed of the token ids.
        vocab_size: the token id range (default: the config's).

    Returns:
        ``input_ids`` ``[3, n]`` (no pad id inside a sentence) and ``attention_mask``
        ``[3, n]``, on the model's device; lengths from :func:`probe_lengths`.
    """
    config = cast(PretrainedConfig, model.config)  # a Hugging Face encoder's
    vocab = vocab_size or int(getattr(config, "vocab_size", 100))
    pad = getattr(config, "pad_token_id", None) or 0
    lengths = probe_lengths(config)
    n = lengths[0]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, max(2, vocab), (3, n), generator=generator)
    ids = torch.where(ids == pad, (pad + 1) % max(2, vocab), ids)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.where(mask.bool(), ids, pad)
    device = next(model.parameters()).device
    return ids.to(device), mask.to(device)


def inference_attention(recorded: str | None, precision: str) -> str | None:
    """The attention a saved model should be reloaded with for inference at ``precision``.

    A model trained with flash attention records it; flash attention runs only in fp16
    or bf16, so an fp32 reload (``precision="no"``: evaluation tables, export, the final
    STS of a run) takes SDPA instead (None: the usual order), which computes the same
    attention. Under ``"fp16"``/``"bf16"`` autocast the recorded one is kept.
    """
    if recorded in HALF_PRECISION_ONLY and precision not in ("fp16", "bf16"):
        logger.info("the model records %s attention, which runs only in fp16/bf16: SDPA for %s inference", recorded, precision)
        return None
    return recorded


def load_pretrained_encoder(
    path: str | Path, attn_implementation: str = AUTO, prefer: str | None = None, **kwargs: Any
) -> tuple[PreTrainedModel, str]:
    """``AutoModel.from_pretrained`` with the attention implementation chosen per model.

    Args:
        path: a model folder or hub id.
        attn_implementation: ``"auto"`` (SDPA where the architecture supports it, else
            eager, logged), or an implementation name that is then required.
        prefer: under ``"auto"``, an implementation to try first (the one a saved model
            records it was trained with); one that cannot load here (flash attention
            recorded on a GPU, loaded on a CPU) falls back to the usual order.
        **kwargs: passed to ``from_pretrained`` (e.g. ``config=``). ``dtype`` defaults to
            fp32: transformers 5 loads in the dtype a checkpoint was stored in, and a
            model stored in fp16 or bf16 must still train fp32 master weights (AdamW's
            small updates round away in 16 bits) and be saved in fp32.

    Returns:
        The model and the implementation it was loaded with.

    Raises:
        ConfigError: an explicitly requested implementation is not supported by the
            architecture (or its package is missing).
        ConfigError: nothing loadable at ``path`` (no model, a pickle torch refuses,
            weights that do not fit the config, NaN weights, custom code not trusted).
        OSError: no model files at all there.
    """
    kwargs.setdefault("dtype", torch.float32)
    # Explicit: None would let transformers ask y/N on the terminal for a folder's own code.
    kwargs.setdefault("trust_remote_code", False)
    if attn_implementation != AUTO:
        try:
            model = _from_pretrained(path, attn_implementation, kwargs)
        except ConfigError:
            raise  # about the folder, not the attention implementation
        except (ValueError, ImportError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"config key 'model.attn_implementation' = {attn_implementation!r}: not available for {path} ({reason}); "
                "use 'auto' (SDPA where supported, else eager) or 'eager'"
            ) from None
        check_finite(model, path)
        return model, attn_implementation
    order = [c for c in (prefer, *AUTO_ORDER) if c not in (None, AUTO)]
    order = list(dict.fromkeys(order))  # eager recorded: tried once, as the last resort it is
    failed: list[str] = []
    for choice in order:
        try:
            model = _from_pretrained(path, choice, kwargs)
        except ConfigError:
            raise  # about the folder: another attention implementation would not help
        except (ValueError, ImportError) as exc:
            if choice == order[-1]:  # eager failing is not about attention: the folder itself is bad
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ConfigError(f"{path}: cannot load a model there ({reason})") from None
            failed.append(choice)
            continue
        if failed:
            logger.info("%s: %s attention (%s not available for it)", type(model).__name__, choice, " or ".join(failed))
        check_finite(model, path)
        return model, choice
    raise AssertionError("unreachable: the last choice returns or raises")


def _from_pretrained(path: str | Path, attn_implementation: str, kwargs: dict[str, Any]) -> PreTrainedModel:
    """``AutoModel.from_pretrained``, its failures that are about the folder's files (a
    pickle torch refuses to unpickle, weights of other shapes than ``config.json`` says)
    turned into a ConfigError naming the folder; ValueError and ImportError (an attention
    implementation the architecture lacks) pass through for the caller's fallback."""
    import pickle

    try:
        return AutoModel.from_pretrained(str(path), attn_implementation=attn_implementation, **kwargs)
    except pickle.UnpicklingError:
        pickles = sorted(p.name for p in Path(path).glob("*.bin")) if Path(path).is_dir() else []
        where = f"{path}/{pickles[0]}" if pickles else str(path)
        raise ConfigError(
            f"{where}: a pickle that torch refuses to load with weights_only (it holds more than tensors, and "
            "unpickling it could run code); use a safetensors copy of the model (model.safetensors)"
        ) from None
    except RuntimeError as exc:
        if "mismatched" not in str(exc) and "size mismatch" not in str(exc):
            raise
        raise ConfigError(
            f"{path}: the weights do not fit its config.json (tensors of other shapes than the config describes: "
            "the weights or the config belong to another model); copy the model again"
        ) from None


def check_finite(model: nn.Module, path: str | Path) -> None:
    """Every weight of a freshly loaded ``model`` is finite: a NaN base model would only
    surface as "training diverged at step 1" (or as an STS table of noise).

    Raises:
        ConfigError: naming the folder, the first tensor with NaN or infinity and how many.
    """
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise ConfigError(
                    f"{path}: the weights hold NaN or infinite values ({name}: {bad} of {tensor.numel()}); "
                    "the model is damaged: copy it again or use another"
                )
