"""Tiny random encoders of every tested architecture, each saved with a tokenizer built
offline: a BERT WordPiece vocab for the BERT family, a word-level ``tokenizers``
tokenizer with the architecture's own special tokens (and their ids) for the others."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import WORDS, write_vocab

# hidden 32, 2 layers, 4 heads: each model has a few thousand parameters.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
MAX_POSITIONS = 64

ARCHITECTURES = ("bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "deberta-v2", "electra", "modernbert")

# Special tokens in each family's own order (their ids are the config's pad/bos/eos ids).
FAIRSEQ_SPECIALS = {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}  # ids 0..4
BERT_SPECIALS = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}  # ids 0..4


def word_level_tokenizer(folder: Path, specials: dict[str, str], token_type_ids: bool) -> object:
    """A lower-casing word-level tokenizer: the special tokens first (in ``specials``'
    order, so ids 0..4), then the toy words; ``cls ... sep`` around each sentence."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*specials.values(), *WORDS, ".", ","])}
    core = Tokenizer(WordLevel(vocab, unk_token=specials["unk"]))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    cls, sep = specials["cls"], specials["sep"]
    core.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    names = ["input_ids", "token_type_ids", "attention_mask"] if token_type_ids else ["input_ids", "attention_mask"]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_input_names=names,
        **{f"{role}_token": tok for role, tok in specials.items()},
    )
    if "<s>" in vocab:
        tokenizer.bos_token, tokenizer.eos_token = "<s>", "</s>"
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_tiny(arch: str, folder: Path) -> Path:
    """Save a tiny random ``arch`` encoder and its tokenizer into ``folder``."""
    from transformers import (
        AutoModel,
        BertConfig,
        BertTokenizerFast,
        DebertaV2Config,
        DistilBertConfig,
        ElectraConfig,
        ModernBertConfig,
        MPNetConfig,
        RobertaConfig,
        XLMRobertaConfig,
    )

    folder.mkdir(parents=True, exist_ok=True)
    if arch in ("bert", "electra", "distilbert"):
        # DistilBERT with a BERT tokenizer gets token_type_ids it must not be given.
        tokenizer = BertTokenizerFast(vocab=str(write_vocab(folder)), do_lower_case=True)
        tokenizer.save_pretrained(folder)
    elif arch in ("roberta", "xlm-roberta", "mpnet"):
        tokenizer = word_level_tokenizer(folder, FAIRSEQ_SPECIALS, token_type_ids=False)
    else:  # deberta-v2 (its tokenizer gives segment ids), modernbert (none)
        tokenizer = word_level_tokenizer(folder, BERT_SPECIALS, token_type_ids=arch == "deberta-v2")
    vocab = len(tokenizer)
    fairseq = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    config = {
        "bert": lambda: BertConfig(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS, **TINY),
        "electra": lambda: ElectraConfig(vocab_size=vocab, embedding_size=16, max_position_embeddings=MAX_POSITIONS, **TINY),
        "distilbert": lambda: DistilBertConfig(
            vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=MAX_POSITIONS
        ),
        "roberta": lambda: RobertaConfig(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS + 2, **fairseq, **TINY),
        "xlm-roberta": lambda: XLMRobertaConfig(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS + 2, **fairseq, **TINY),
        "mpnet": lambda: MPNetConfig(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS + 2, **fairseq, **TINY),
        # DeBERTa-v3's layout: relative attention only, no absolute positions.
        "deberta-v2": lambda: DebertaV2Config(
            vocab_size=vocab,
            max_position_embeddings=MAX_POSITIONS,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            pad_token_id=0,
            **TINY,
        ),
        # ModernBERT's own defaults have no dropout at all; a window of 8 tokens keeps
        # its local attention visible in 16-token sentences.
        "modernbert": lambda: ModernBertConfig(
            vocab_size=vocab,
            max_position_embeddings=MAX_POSITIONS,
            local_attention=8,
            pad_token_id=0,
            cls_token_id=1,
            bos_token_id=1,
            sep_token_id=2,
            eos_token_id=2,
            **TINY,
        ),
    }[arch]()
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------- decoders

DECODERS = ("qwen3", "llama", "mistral", "gemma3_text")
# Each family's special tokens as its real tokenizer has them: Qwen3 pads with <|endoftext|>
# and adds nothing; Llama and Mistral put <s> first and have no pad token; Gemma3 puts <bos> first.
DECODER_SPECIALS = {
    "qwen3": {"unk": "<unk>", "pad": "<|endoftext|>", "eos": "<|im_end|>"},
    "llama": {"unk": "<unk>", "bos": "<s>", "eos": "</s>"},
    "mistral": {"unk": "<unk>", "bos": "<s>", "eos": "</s>"},
    "gemma3_text": {"unk": "<unk>", "pad": "<pad>", "bos": "<bos>", "eos": "<eos>"},
}


def decoder_tokenizer(arch: str, folder: Path) -> object:
    """A lower-casing word-level tokenizer with ``arch``'s special tokens: BOS first where
    the family has one, no EOS appended (simcse-kit appends it), left padding as
    decoder embedders (Qwen3-Embedding) use."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    specials = DECODER_SPECIALS[arch]
    vocab = {tok: i for i, tok in enumerate([*specials.values(), *WORDS, ".", ","])}
    core = Tokenizer(WordLevel(vocab, unk_token=specials["unk"]))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if "bos" in specials:
        bos = specials["bos"]
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, vocab[bos])]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        **{f"{role}_token": tok for role, tok in specials.items()},
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_tiny_decoder(arch: str, folder: Path) -> Path:
    """Save a tiny random decoder-only ``arch`` model (its body, as ``AutoModel`` builds
    it from a causal-LM config) and its tokenizer into ``folder``.

    Shaped like the real configs, only smaller: grouped-query attention everywhere
    (Qwen3-8B and Llama 3 share a key/value head among 4 query heads, Gemma3-1B among 4;
    here Qwen3 4:2, Llama 8:1, Mistral and Gemma3 4:1), Qwen3's q/k norms, explicit
    ``head_dim`` and tied embeddings, Mistral's sliding window on every layer, Gemma3's
    sliding window on some layers (``layer_types``) with a ``query_pre_attn_scalar`` that is
    not ``head_dim``. Windows of 8 tokens keep the local attention visible in 16-token sentences.
    """
    from transformers import AutoModel, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = decoder_tokenizer(arch, folder)
    ids = {
        f"{role}_token_id": tokenizer.convert_tokens_to_ids(tok) for role, tok in DECODER_SPECIALS[arch].items() if role != "unk"
    }
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 37,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": MAX_POSITIONS,
        **ids,
    }
    config = {
        "qwen3": lambda: Qwen3Config(head_dim=8, num_key_value_heads=2, tie_word_embeddings=True, **common),
        "llama": lambda: LlamaConfig(**(common | {"num_attention_heads": 8}), num_key_value_heads=1),
        "mistral": lambda: MistralConfig(num_key_value_heads=1, sliding_window=8, **common),
        "gemma3_text": lambda: Gemma3TextConfig(
            head_dim=8,
            num_key_value_heads=1,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
            **common,
        ),
    }[arch]()
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    return folder
