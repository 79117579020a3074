"""Shared fixtures: tiny random BERTs built from a config, a tokenizer from a temp vocab."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# Tiny models gain nothing from threads, and on a 2-core machine with anything else
# running, OpenMP threads spinning against each other make a 64x64 matmul 1000x slower.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"

WORDS = (
    "a man woman dog cat is are the playing guitar piano eating food running park on in with "
    "sits stands walks child children two people ball red blue car drives street water swims "
    "plays reads book sleeping bed outside inside big small old young happy sad"
).split()


def write_vocab(folder: Path) -> Path:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path = folder / "vocab.txt"
    path.write_text("\n".join(specials + WORDS + [".", ","]) + "\n", encoding="utf-8")
    return path


def save_tiny_bert(folder: Path, layers: int = 2) -> Path:
    """Write a tiny random BERT (hidden 32, ``layers`` layers) and a tokenizer that
    knows the toy words into ``folder``; loadable with ``from_pretrained``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab=str(write_vocab(folder)), do_lower_case=True)  # transformers 5 ignores vocab_file=
    assert len(tokenizer) > 40 and tokenizer.unk_token_id not in tokenizer("a man plays guitar")["input_ids"]
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random 2-layer BERT + tokenizer folder."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.fail(f"shared data not found at {DATA}; the repo expects ../shared/data beside it")
    return DATA


def toy_sentences(n: int = 48) -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
