"""Checks on a model folder when it is loaded, so that a broken folder is one clear error.

transformers is forgiving in ways that hide damage: a folder without its tokenizer files
still loads, with a 5-token vocabulary that maps every word to ``[UNK]`` (an STS average
of ~15 instead of ~76, and exit status 0), and a truncated ``model.safetensors`` fails
with safetensors' ``incomplete metadata`` without naming the file. Here:

- :func:`check_weights`: every ``*.safetensors`` file's header and size agree (cheap: the
  header is read and the tensors' extents compared with the file size, nothing loaded),
  every JSON file parses (``config.json`` to an object), and a model that would run its
  folder's own code is refused unless trusted (:func:`check_remote_code`);
- :func:`check_tokenizer_files`: a local folder holds a tokenizer (``tokenizer.json`` or
  a vocabulary file);
- :func:`check_tokenizer`: the loaded tokenizer fits the model: no token id beyond the
  embedding table, not a vocabulary far smaller than it, and its special tokens known;
- :func:`load_checked_tokenizer`: all of the above around ``AutoTokenizer.from_pretrained``.

Each raises :class:`~simcse_kit.errors.ConfigError` naming the folder or the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simcse_kit.errors import ConfigError

# A tokenizer is one of these: the fast tokenizer's own file, or a vocabulary the slow one reads.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "simcse_config.json")
# A tokenizer knowing under half the embedding table's rows is another model's (or the
# placeholder transformers builds when the files are missing); smaller by a few rows is
# normal (tables padded to a multiple of 8 or 64).
MIN_VOCAB_SHARE = 0.5


REMOTE_CODE_HINT = (
    "to run it: set model.trust_remote_code: true in a training recipe, or pass --trust-remote-code to "
    "evaluate, transfer, align-uniform, mine, score or export"
)


def check_remote_code(folder: Path, config: dict[str, Any], trust_remote_code: bool) -> None:
    """A ``config.json`` whose ``model_type`` transformers does not know and whose
    ``auto_map`` points at Python files of the folder needs that code run to load: refused
    unless ``trust_remote_code`` (transformers would otherwise ask y/N on the terminal in
    the middle of a run, or fail on a closed stdin)."""
    from transformers import CONFIG_MAPPING

    auto_map = config.get("auto_map")
    if trust_remote_code or not auto_map or config.get("model_type") in CONFIG_MAPPING:
        return
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    code = sorted({str(v[0] if isinstance(v, list) else v) for v in values})
    raise ConfigError(
        f"{folder / 'config.json'}: model_type {config.get('model_type')!r} is not a transformers model; loading it "
        f"would run the folder's own code ({code}): refused ({REMOTE_CODE_HINT})"
    )


def check_weights(folder: str | Path, trust_remote_code: bool = False) -> None:
    """Every ``*.safetensors`` and JSON file of a local ``folder`` reads, ``config.json``
    is a JSON object, and the model needs no code of its own unless ``trust_remote_code``
    (:func:`check_remote_code`); no-op for a hub id.

    Raises:
        ConfigError: naming the file: truncated or corrupt weights, invalid JSON, a
            config that is not an object, or custom code not trusted.
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return
    for name in JSON_FILES:
        path = folder / name
        if path.is_file():
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: corrupt model file: not valid JSON ({exc})") from None
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: corrupt model file: expected a JSON object, got {type(value).__name__}")
            if name == "config.json":
                check_remote_code(folder, value, trust_remote_code)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            # safe_open checks that the header parses and that the tensors it lists end
            # exactly at the end of the file: a truncated copy fails here, nothing is loaded.
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"{path}: corrupt or truncated weights file ({exc}); copy the model again") from None


def check_tokenizer_files(folder: str | Path) -> None:
    """A local model ``folder`` holds a tokenizer; no-op for a hub id.

    Raises:
        ConfigError: no tokenizer file there (transformers would silently build a
            5-token vocabulary instead).
    """
    folder = Path(folder)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{folder}: no tokenizer files (expected tokenizer.json or a vocabulary such as vocab.txt); "
            "without them every word would be [UNK]: copy the tokenizer files in from the base model"
        )


def check_tokenizer(tokenizer: Any, vocab_size: int | None, where: str | Path) -> None:
    """The tokenizer fits a model whose embedding table has ``vocab_size`` rows.

    Args:
        tokenizer: a transformers tokenizer.
        vocab_size: the model's embedding rows (``config.vocab_size``); None skips the
            size checks.
        where: the folder, for the message.

    Raises:
        ConfigError: ids beyond the table, a vocabulary far smaller than the table, or a
            special token the vocabulary does not know.
    """
    size = len(tokenizer)
    if vocab_size is not None:
        if size > vocab_size:
            raise ConfigError(
                f"{where}: the tokenizer has {size} tokens but the model's embedding table only {vocab_size} rows: "
                "the tokenizer belongs to another model"
            )
        if size < MIN_VOCAB_SHARE * vocab_size:
            raise ConfigError(
                f"{where}: the tokenizer knows only {size} tokens for a model with {vocab_size}: its tokenizer "
                "files are missing, damaged or from another model"
            )
    unk = tokenizer.unk_token_id
    for name, token in tokenizer.special_tokens_map.items():
        if name == "unk_token" or name == "additional_special_tokens" or not isinstance(token, str):
            continue
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (unk is not None and token_id == unk):
            raise ConfigError(f"{where}: the tokenizer's {name} {token!r} is not in its vocabulary")


def load_checked_tokenizer(
    path: str | Path, vocab_size: int | None = None, trust_remote_code: bool = False, pooler: str = "last"
) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` after :func:`check_tokenizer_files`, then
    :func:`check_tokenizer` against ``vocab_size`` (default: the folder's ``config.json``),
    made ready for the model's ``pooler`` (:func:`simcse_kit.model.families.prepare_tokenizer`)."""
    from transformers import AutoConfig, AutoTokenizer

    from simcse_kit.model.families import prepare_tokenizer  # torch and transformers only when a tokenizer loads

    check_tokenizer_files(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{path}: cannot load its tokenizer ({reason})") from None
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        config = None  # an adapter folder has no config.json: its saved tokenizer is ready as is
    if vocab_size is None:
        vocab_size = getattr(config, "vocab_size", None)
    check_tokenizer(tokenizer, vocab_size, path)
    return prepare_tokenizer(tokenizer, config, pooler=pooler, folder=path) if config is not None else tokenizer


def tokenization_problem(reference: Any, other: Any, sentences: list[str], max_length: int) -> str | None:
    """Why two tokenizers (the source's and an independent load of an exported copy) would
    not feed a model the same ids, or why ``reference`` looks like a placeholder (every token ``[UNK]``); None if fine.

    A parity check that encodes both sides with the same broken tokenizer passes; this one
    compares the ids themselves, and whether any token is not ``[UNK]``.
    """
    ids_a = reference(sentences, truncation=True, max_length=max_length)["input_ids"]
    ids_b = other(sentences, truncation=True, max_length=max_length)["input_ids"]
    for sentence, a, b in zip(sentences, ids_a, ids_b, strict=True):
        if a != b:
            return f"the exported tokenizer gives other ids than the source's for {sentence!r}: {b} vs {a}"
    unk = reference.unk_token_id
    if unk is not None:
        special = set(reference.all_special_ids) - {unk}
        tokens = [t for row in ids_a for t in row if t not in special]
        share = sum(t == unk for t in tokens) / max(1, len(tokens))
        # Every word unknown is the placeholder vocabulary; a real one (even a small test
        # vocabulary, or a domain's) knows some of the English probe sentences' tokens.
        if tokens and share == 1.0:
            return f"every token of the probe sentences is {reference.unk_token!r}: the tokenizer lost its vocabulary"
    return None
