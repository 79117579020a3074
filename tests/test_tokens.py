"""Token tables (simcse_kit.data.tokens): batches collated from the table's ids are the
batches the tokenizer makes per batch, in every mode, and a file's table is built once,
beside its text cache, and rebuilt when anything its ids depend on changes."""

from __future__ import annotations

import hashlib
import multiprocessing
import random
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pytest
import torch
from conftest import save_tiny_bert, toy_sentences
from tiny_encoders import FAIRSEQ_SPECIALS, decoder_tokenizer, word_level_tokenizer
from transformers import AutoTokenizer

from simcse_kit.core.batch import batch_texts, text_ids, view_prompts, view_rows, views_per_example
from simcse_kit.data import tokens
from simcse_kit.data.collate import ContrastiveCollator, repeat_tokens
from simcse_kit.data.corpus import SUBFOLDER
from simcse_kit.data.readers import load_train_dataset
from simcse_kit.data.tokens import Tokenization, with_tokens
from simcse_kit.model.packing import plan_batch


def reference_batch(
    tokenizer: Any,
    mode: str,
    max_len: int,
    examples: list[dict[str, Any]],
    negatives: int = 1,
    prompts: tuple[str, ...] = (),
    word_repetition: float = 0.0,
    seed: int = 0,
    teacher_index: Mapping[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """The batch as the collator made it by calling the tokenizer on every row's text
    (commit 44fd089's ``ContrastiveCollator``: unsup's ``[a, a, b, b]`` as four texts)."""
    texts = raw = batch_texts(examples, mode, negatives)
    if prompts:
        texts = [prompts[i % len(prompts)] + text for i, text in enumerate(raw)]
    if word_repetition:
        features = tokenizer(texts, truncation=True, max_length=max_len)
        digest = hashlib.blake2b(f"{seed}\0".encode() + "\0".join(texts).encode("utf-8"), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        second = set(range(len(texts))[view_rows(len(texts), views_per_example(mode, negatives), 1)])
        rows = []
        for i, ids in enumerate(features["input_ids"]):
            if i in second:
                special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
                ids = repeat_tokens(ids, special, word_repetition, max_len, rng)
            row = {"input_ids": ids, "attention_mask": [1] * len(ids)}
            if "token_type_ids" in features:
                row["token_type_ids"] = [0] * len(ids)
            rows.append(row)
        out = dict(tokenizer.pad(rows, return_tensors="pt"))
    else:
        out = dict(tokenizer(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt"))
    out["text_ids"] = text_ids(raw)
    if mode == "scored":
        out["scores"] = torch.tensor([float(ex["score"]) for ex in examples], dtype=torch.float32)
    if teacher_index is not None:
        out["teacher_rows"] = torch.tensor([teacher_index[t] for t in raw], dtype=torch.long)
    out.update(plan_batch(out["attention_mask"]))
    return out


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """BERT WordPiece with token types; the same truncating and padding to 20 in its
    tokenizer.json (as all-MiniLM-L6-v2's does at 128); a RoBERTa-style word-level one without
    token types; a decoder's, padding on the left."""
    root = tmp_path_factory.mktemp("tokenizers")
    for name in ("bert", "fixed", "qwen3"):
        (root / name).mkdir()
    return {
        "bert": AutoTokenizer.from_pretrained(save_tiny_bert(root / "bert")),
        "bert-fixed": AutoTokenizer.from_pretrained(save_tiny_bert(root / "fixed", fixed_length=20)),
        "roberta": word_level_tokenizer(root, FAIRSEQ_SPECIALS, token_type_ids=False),
        "qwen3-left": decoder_tokenizer("qwen3", root / "qwen3"),
    }


def toy_examples(mode: str, n: int = 12, negatives: int = 1) -> list[dict[str, Any]]:
    """Toy rows of ``mode``; every third one long enough to be truncated at 12 tokens, and
    one sentence repeated (text ids equal)."""
    sents = toy_sentences(n * (2 + negatives))
    sents = [s + " " + sents[-1 - i] if i % 3 == 0 else s for i, s in enumerate(sents)]
    sents[5] = sents[0]
    rows: list[dict[str, Any]] = []
    for i in range(n):
        views = sents[i * (2 + negatives) : (i + 1) * (2 + negatives)]
        if mode == "unsup":
            rows.append({"sent0": views[0]})
        elif mode in ("sup", "scored"):
            rows.append({"sent0": views[0], "sent1": views[1]} | ({"score": i / n} if mode == "scored" else {}))
        else:
            names = ["hard_neg"] if negatives == 1 else [f"hard_neg_{j + 1}" for j in range(negatives)]
            rows.append({"sent0": views[0], "sent1": views[1]} | dict(zip(names, views[2:], strict=True)))
    return rows


PROMPTS = {"query": "query: ", "document": "passage: "}
CASES = {
    "unsup": ("unsup", 1, None, 0.0),
    "unsup-prompts": ("unsup", 1, PROMPTS, 0.0),
    "unsup-one-prompt": ("unsup", 1, {"query": "q: ", "document": "q: "}, 0.0),
    "unsup-repetition": ("unsup", 1, None, 0.4),
    "unsup-repetition-prompts": ("unsup", 1, PROMPTS, 0.4),
    "sup": ("sup", 1, None, 0.0),
    "sup-prompts": ("sup", 1, PROMPTS, 0.0),
    "hardneg": ("hardneg", 1, None, 0.0),
    "hardneg-3": ("hardneg", 3, PROMPTS, 0.0),
    "scored": ("scored", 1, None, 0.0),
}


@pytest.mark.parametrize("kind", ["bert", "bert-fixed", "roberta", "qwen3-left"])
@pytest.mark.parametrize("case", list(CASES))
def test_batches_from_token_ids_equal_the_tokenizer_per_batch(tokenizers: dict[str, Any], kind: str, case: str) -> None:
    tokenizer = tokenizers[kind]
    mode, k, prompt_map, repetition = CASES[case]
    examples = toy_examples(mode, negatives=k)
    prompts = view_prompts(prompt_map, mode, k)
    teacher = {t: i for i, t in enumerate(sorted({t for t in batch_texts(examples, mode, k)}))}
    want = reference_batch(tokenizer, mode, 12, examples, k, prompts, repetition, seed=7, teacher_index=teacher)
    collator = ContrastiveCollator(
        tokenizer,
        mode,
        12,
        with_text_ids=True,
        word_repetition=repetition,
        seed=7,
        prompts=prompts,
        teacher_index=teacher,
        packing_plan=True,
        negatives=k,
    )
    table = with_tokens(datasets.Dataset.from_list(examples), Tokenization(tokenizer, 12, prompt_map), mode)
    assert len(set(table.column_names) - set(examples[0])) > 0  # the token columns are there
    from_table = collator([table[i] for i in range(len(table))])
    from_texts = collator(examples)  # no table: each distinct text tokenised once
    for got in (from_table, from_texts):
        assert set(got) == set(want)
        for key, value in want.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    if repetition:  # the repetitions did change some rows (the parity is not of two plain batches)
        plain = reference_batch(tokenizer, mode, 12, examples, k, prompts)
        assert not torch.equal(plain["input_ids"], want["input_ids"])


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every token table built from now on (its folder), in order."""
    built: list[Path] = []
    real = tokens._build

    def counted(dataset: datasets.Dataset, folder: Path, *args: Any) -> None:
        built.append(folder)
        real(dataset, folder, *args)

    monkeypatch.setattr(tokens, "_build", counted)
    return built


def test_a_file_s_table_is_built_once_beside_its_cache_and_rebuilt_when_its_key_changes(
    tmp_path: Path, tokenizers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pairs.csv"
    rows = toy_examples("sup", 40)
    path.write_text("sent0,sent1\n" + "".join(f"{r['sent0']},{r['sent1']}\n" for r in rows), encoding="utf-8")
    cache = tmp_path / "cache"
    built = count_builds(monkeypatch)
    bert = Tokenization(tokenizers["bert"], 12)

    def load(tokenization: Tokenization = bert, max_samples: int | None = None) -> datasets.Dataset:
        return load_train_dataset(str(path), "sup", max_samples, cache_dir=cache, tokens=tokenization)

    first = load()
    assert len(built) == 1 and built[0].parent == cache / SUBFOLDER and (built[0] / "table.json").is_file()
    text_cache = next((cache / SUBFOLDER).glob("*.arrow"))
    assert built[0].name.startswith(f"{text_cache.stem}.tokens-")  # beside the text cache it was made from
    assert all(Path(f["filename"]).parent in (built[0], text_cache.parent) for f in first.cache_files)  # memory-mapped
    assert first[3]["input_ids.sent0"] == tokenizers["bert"](rows[3]["sent0"], truncation=True, max_length=12)["input_ids"]
    assert load(max_samples=10)["input_ids.sent1"] == first["input_ids.sent1"][:10]
    assert len(built) == 1  # a second run maps the table
    load(Tokenization(tokenizers["bert"], 10))  # another length
    load(Tokenization(tokenizers["bert"], 12, PROMPTS))  # prompts
    load(Tokenization(tokenizers["bert-fixed"], 12))  # another tokenizer (its tokenizer.json)
    assert len(built) == 4 and len(set(built)) == 4
    load()
    assert len(built) == 4
    path.write_text(path.read_text(encoding="utf-8") + "two people,a dog\n", encoding="utf-8")  # an edit: a new text cache
    assert len(load()) == 41 and len(built) == 5
    assert not [p for p in (cache / SUBFOLDER).glob(".*.tokens-*") if p.is_dir()]  # no half-built table left behind


@pytest.mark.parametrize("damage", ["truncated shard", "broken sidecar", "sidecar without shards"])
def test_a_damaged_token_table_is_named_once_and_rebuilt(
    tmp_path: Path, tokenizers: dict[str, Any], damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48: a truncated shard (ArrowInvalid) or a broken table.json was a traceback on every
    later run of the file. Now one warning names the table and it is rebuilt."""
    import logging

    path = tmp_path / "corpus.txt"
    sentences = [f"{s} {i}" for i, s in enumerate(toy_sentences(100) * 5)]
    path.write_text("".join(f"{s}\n" for s in sentences), encoding="utf-8")
    bert = Tokenization(tokenizers["bert"], 16)
    load_train_dataset(str(path), "unsup", cache_dir=tmp_path / "cache", tokens=bert)
    (folder,) = [p for p in (tmp_path / "cache" / SUBFOLDER).glob("*.tokens-*") if p.is_dir()]
    shard = next(folder.glob("*.arrow"))
    if damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "broken sidecar":
        (folder / "table.json").write_text('{"rows": 5')
    else:
        (folder / "table.json").write_text('{"rows": 500}')
    with caplog.at_level(logging.WARNING, logger="simcse_kit.data.tokens"):
        ds = load_train_dataset(str(path), "unsup", cache_dir=tmp_path / "cache", tokens=bert)
    damaged = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(damaged) == 1 and f"the token table {folder} is damaged" in damaged[0], caplog.text
    for i in (0, 250, 499):
        assert ds[i]["input_ids.sent0"] == tokenizers["bert"](sentences[i], truncation=True, max_length=16)["input_ids"]
    caplog.clear()
    load_train_dataset(str(path), "unsup", cache_dir=tmp_path / "cache", tokens=bert)
    assert not caplog.records  # whole again


def test_a_table_is_written_in_record_batches_of_map_batch_rows(
    tmp_path: Path, tokenizers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a memory-mapped table touches every record batch's header (and the kernel maps
    # the pages around each): small batches made a 10M-row table resident on open. The table
    # keeps the map batch as its record batch (datasets' writer would cut 1,000-row ones).
    monkeypatch.setattr(tokens, "MAP_BATCH", 1500)
    monkeypatch.setattr(tokens, "TOKENIZER_BATCH", 400)  # several tokenizer calls per map batch
    path = tmp_path / "corpus.txt"
    sentences = [f"{s} {i}" for i, s in enumerate(toy_sentences(100) * 40)]
    path.write_text("".join(f"{s}\n" for s in sentences), encoding="utf-8")
    bert = Tokenization(tokenizers["bert"], 16)
    ds = load_train_dataset(str(path), "unsup", None, cache_dir=tmp_path / "cache", tokens=bert)
    column = ds.data.table.column("input_ids.sent0")
    assert [len(chunk) for chunk in column.chunks] == [1500, 1500, 1000]
    assert column.type == pa.list_(pa.int32())
    for i in (0, 399, 400, 1499, 1500, 3999):  # either side of each tokenizer call and map batch
        assert ds[i]["input_ids.sent0"] == tokenizers["bert"](sentences[i], truncation=True, max_length=16)["input_ids"]


def test_processes_reading_at_once_build_one_table(tmp_path: Path, tokenizers: dict[str, Any]) -> None:
    # The processes of a run start together: one tokenises, the others wait for it and map
    # its table (a second build would find the folder taken and fail).
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(toy_sentences(100) * 100)), encoding="utf-8")
    tokenization = Tokenization(tokenizers["bert"], 16)
    args = (str(path), "unsup", None, None, "error", tmp_path / "cache", None)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(load_train_dataset, *args, tokens=tokenization) for _ in range(2)]
        results = [future.result() for future in futures]
    tables = [p for p in (tmp_path / "cache" / SUBFOLDER).glob("*.tokens-*") if p.is_dir()]
    assert len(tables) == 1 and all(len(r) == 10_000 for r in results)
    assert results[0]["input_ids.sent0"][-5:] == results[1]["input_ids.sent0"][-5:]
