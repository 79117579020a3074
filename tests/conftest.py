"""Shared fixtures: tiny random BERTs built from a config, a tokenizer from a temp vocab."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread for the BLAS and OpenMP pools too (numpy's OpenBLAS under scikit-learn's
# transfer probes, faiss), set before torch loads numpy; the run's subprocesses inherit it.
# Left to size themselves, their idle threads spin against the test's: the transfer tests
# took 10-20x the CPU time on a busy 2-core machine.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The training files' Arrow caches (simcse_kit.data.corpus) go to a folder of the test
# session's own, removed at exit, not into the user's datasets cache; the run's processes
# (2-process tests) inherit it.
_DATASETS_CACHE = tempfile.mkdtemp(prefix="simcse-kit-test-datasets-")
os.environ["HF_DATASETS_CACHE"] = _DATASETS_CACHE
atexit.register(shutil.rmtree, _DATASETS_CACHE, True)

import torch  # noqa: E402

# Tiny models gain nothing from threads, and on a 2-core machine with anything else
# running, OpenMP threads spinning against each other make a 64x64 matmul 1000x slower.
torch.set_num_threads(1)

if TYPE_CHECKING:
    from simcse_kit.config.run import RunConfig

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


def save_tiny_bert(folder: Path, layers: int = 2, max_positions: int = 64, fixed_length: int | None = None) -> Path:
    """Write a tiny random BERT (hidden 32, ``layers`` layers, ``max_positions`` positions)
    and a tokenizer that knows the toy words into ``folder``; loadable with ``from_pretrained``.

    ``fixed_length``: the tokenizer.json truncates at and pads to it, as all-MiniLM-L6-v2's
    does at 128 (transformers 5 then saves it as tokenizer_config.json's ``max_length``)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab=str(write_vocab(folder)), do_lower_case=True)  # transformers 5 ignores vocab_file=
    assert len(tokenizer) > 40 and tokenizer.unk_token_id not in tokenizer("a man plays guitar")["input_ids"]
    if fixed_length is not None:
        tokenizer.backend_tokenizer.enable_truncation(fixed_length)
        tokenizer.backend_tokenizer.enable_padding(length=fixed_length, pad_id=tokenizer.pad_token_id, pad_token="[PAD]")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=max_positions,
    )
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random 2-layer BERT + tokenizer folder."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def decoder_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Saved tiny random decoders (Qwen3, Llama, Gemma3 text) with their tokenizers, by
    ``model_type`` (:func:`tiny_encoders.build_tiny_decoder`)."""
    from tiny_encoders import DECODERS, build_tiny_decoder

    root = tmp_path_factory.mktemp("decoders")
    return {arch: build_tiny_decoder(arch, root / arch) for arch in DECODERS}


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.fail(f"shared data not found at {DATA}; the repo expects ../shared/data beside it")
    return DATA


def fake_encoder(dim: int = 16):
    """Deterministic bag-of-words hashing encoder: cheap, and similar sentences score similar."""

    def encode(sentences: list[str]) -> torch.Tensor:
        out = torch.zeros(len(sentences), dim)
        for i, s in enumerate(sentences):
            for w in s.lower().split():
                g = torch.Generator().manual_seed(sum(ord(c) * 31**k for k, c in enumerate(w)) % (2**31))
                out[i] += torch.randn(dim, generator=g)
        return out

    return encode


def toy_sentences(n: int = 48) -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def write_tiny_senteval(folder: Path, pairs: int = 12) -> Path:
    """A SentEval-layout folder with every file of the default STS suite, ``pairs`` toy
    pairs each: the real one takes minutes to encode on one core."""
    import random

    from simcse_kit.evaluation import default_suite

    rng = random.Random(0)
    sents = toy_sentences(4 * pairs)

    def pair_rows() -> list[tuple[str, str, float]]:
        return [
            (sents[rng.randrange(len(sents))], sents[rng.randrange(len(sents))], round(rng.uniform(1, 5), 2))
            for _ in range(pairs)
        ]

    for spec in default_suite().values():
        base = folder / spec.path
        if spec.format == "sts":
            base.mkdir(parents=True, exist_ok=True)
            for subset in spec.subsets:
                rows = pair_rows()
                (base / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows), encoding="utf-8")
                (base / f"STS.gs.{subset}.txt").write_text("".join(f"{s}\n" for _, _, s in rows), encoding="utf-8")
        elif spec.format == "stsb":
            base.mkdir(parents=True, exist_ok=True)
            for split in ("dev", "test"):
                lines = [f"main-news\tfile\t2012\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(pair_rows())]
                (base / f"sts-{split}.csv").write_text("".join(lines), encoding="utf-8")
        else:
            base.parent.mkdir(parents=True, exist_ok=True)
            lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"]
            lines += [f"{i}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(pair_rows())]
            base.write_text("".join(lines), encoding="utf-8")
    return folder


# --------------------------------------------------------------------------- tiny runs


def write_train_data(folder: Path, mode: str, n: int = 32) -> Path:
    """``n`` toy examples: sentences (unsup), ``sent0,sent1,hard_neg`` rows, or for
    ``scored`` ``sent0,sent1,score`` rows with graded scores in [1, 5]."""
    sents = toy_sentences(3 * n)
    if mode == "unsup":
        path = folder / "train.txt"
        path.write_text("\n".join(sents[:n]) + "\n", encoding="utf-8")
    elif mode == "scored":
        path = folder / "train.csv"
        # sent1 is sent0 with its first k words swapped for others', scored 5 - k (k = 0..4, ties
        # included): a graded overlap the ranking losses can learn.
        rows = ["sent0,sent1,score"]
        for i in range(n):
            words, other, k = sents[i].split(), sents[i + n].split(), i % 5
            swapped = [other[j % len(other)] if j < k else w for j, w in enumerate(words)]
            rows.append(f"{sents[i]},{' '.join(swapped)},{5 - k}")
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    else:
        path = folder / "train.csv"
        rows = ["sent0,sent1,hard_neg"] + [f"{sents[i]},{sents[i]} .,{sents[i + n]}" for i in range(n)]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def write_recipe(folder: Path, model_dir: Path, out: Path, **train: object) -> Path:
    """A tiny unsup recipe: 64 sentences, batch 8, 3 epochs = 24 steps, eval every 3,
    a checkpoint every 2; ``train`` overrides keys of the ``train:`` section."""
    import yaml

    data = folder / "train.txt"
    if not data.exists():
        data.write_text("\n".join(toy_sentences(64)) + "\n", encoding="utf-8")
    senteval = folder / "senteval"
    if not senteval.exists():
        write_tiny_senteval(senteval)
    recipe = {
        "model": {"name_or_path": str(model_dir), "pooler": "cls", "mlp": "train", "max_seq_len": 16, "eval_max_seq_len": 32},
        "data": {"mode": "unsup", "train_file": str(data), "eval_data_dir": str(senteval)},
        "loss": {"temperature": 0.05},
        "train": {
            "output_dir": str(out),
            "batch_size": 8,
            "learning_rate": 1e-3,
            "num_epochs": 3,
            "eval_steps": 3,
            "save_steps": 2,
            "log_steps": 1,
            "seed": 7,
            "progress_bar": False,
            # Explicit, not "auto": the same numbers on every CPU (auto picks bf16 where it is
            # native, and CI machines differ); tests of auto give it themselves.
            "mixed_precision": "no",
        }
        | train,
    }
    path = folder / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


class TinyRun:
    """Tiny training runs in one temp folder: the tiny BERT, toy data, a tiny SentEval.

    ``recipe(name, **train)`` writes :func:`write_recipe`'s recipe with its run folder
    ``folder/name``; ``config(name, **overrides)`` loads it with CLI-style overrides (any
    section's key); ``train(name, **overrides)`` runs ``simcse_kit.training.wiring.run.train`` on it.
    """

    def __init__(self, folder: Path, model_dir: Path) -> None:
        self.folder = folder
        self.model_dir = model_dir

    def recipe(self, name: str = "run", **train: object) -> Path:
        return write_recipe(self.folder, self.model_dir, self.folder / name, **train)

    def config(self, name: str = "run", **overrides: object) -> RunConfig:
        from simcse_kit.config.run import load_config

        return load_config(self.recipe(name), {k: str(v) for k, v in overrides.items()})

    def train(self, name: str = "run", **overrides: object) -> dict:
        from simcse_kit.training.wiring.run import train

        return train(self.config(name, **overrides))


@pytest.fixture
def tiny_run(tmp_path: Path, tiny_model_dir: Path) -> TinyRun:
    """See :class:`TinyRun`."""
    return TinyRun(tmp_path, tiny_model_dir)
