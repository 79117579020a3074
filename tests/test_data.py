"""The batch layout (one home: simcse_kit.batch), the collator that follows it, and the
training-file readers (UTF-8 with or without a byte-order mark, through fileio)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import REPO
from transformers import AutoTokenizer

from simcse_kit.batch import (
    MODEL_INPUTS,
    VIEW_COLUMNS,
    batch_texts,
    model_inputs,
    split_views,
    text_ids,
    view_rows,
    views_per_example,
)
from simcse_kit.data import COLUMNS, ContrastiveCollator, load_train_dataset, read_rows, read_sentences
from simcse_kit.errors import DataError

EXAMPLES = [
    {"sent0": "a dog", "sent1": "a cat", "hard_neg": "a car"},
    {"sent0": "a man", "sent1": "two people", "hard_neg": "the ball"},
]

# --------------------------------------------------------------------------- the layout


def test_rows_are_example_major() -> None:
    assert [views_per_example(m) for m in ("unsup", "sup", "hardneg")] == [2, 2, 3]
    assert batch_texts(EXAMPLES, "unsup") == ["a dog", "a dog", "a man", "a man"]
    assert batch_texts(EXAMPLES, "sup") == ["a dog", "a cat", "a man", "two people"]
    assert batch_texts(EXAMPLES, "hardneg") == ["a dog", "a cat", "a car", "a man", "two people", "the ball"]
    assert COLUMNS == {"unsup": ("sent0",), "sup": ("sent0", "sent1"), "hardneg": ("sent0", "sent1", "hard_neg")}
    assert set(VIEW_COLUMNS) == set(COLUMNS)
    with pytest.raises(ValueError, match="unknown mode"):
        views_per_example("triplet")


def test_split_views_and_view_rows() -> None:
    rows = torch.arange(12).view(6, 2)  # 2 examples of 3 views: rows 0..5
    p, e, c = split_views(rows, 3)
    assert p[:, 0].tolist() == [0, 6] and e[:, 0].tolist() == [2, 8] and c[:, 0].tolist() == [4, 10]
    assert p.data_ptr() == rows.data_ptr()  # a view, no copy: gradients reach the rows
    assert view_rows(6, 3, 1) == slice(1, 6, 3)
    assert [t.tolist() for t in split_views(torch.arange(4), 2)] == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="whole examples"):
        split_views(torch.zeros(5, 2), 2)


def test_model_inputs_leave_other_keys_out() -> None:
    batch = {"input_ids": torch.arange(6).view(3, 2), "attention_mask": torch.ones(3, 2), "text_ids": torch.arange(3)}
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask"} <= set(MODEL_INPUTS)
    assert model_inputs(batch, slice(1, 3))["input_ids"].tolist() == [[2, 3], [4, 5]]


def test_text_ids_are_stable_hashes() -> None:
    ids = text_ids(["a dog", "a dog", "a Dog"])
    assert ids.dtype == torch.int64 and ids[0] == ids[1] != ids[2]
    assert text_ids(["a dog"]).item() == -4081912340589182210  # the same on every process and run


# --------------------------------------------------------------------------- the collator


@pytest.mark.parametrize("mode", ["unsup", "sup", "hardneg"])
def test_collator_rows_follow_the_layout(tiny_model_dir: Path, mode: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, mode, 16, with_text_ids=True)(EXAMPLES)
    texts = batch_texts(EXAMPLES, mode)
    want = tokenizer(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    assert torch.equal(batch["input_ids"], want["input_ids"])
    assert torch.equal(batch["text_ids"], text_ids(texts))
    assert batch["input_ids"].shape[0] == len(EXAMPLES) * views_per_example(mode)
    assert "text_ids" not in ContrastiveCollator(tokenizer, mode, 16)(EXAMPLES)


def test_collator_rejects_an_unknown_mode(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        ContrastiveCollator(AutoTokenizer.from_pretrained(tiny_model_dir), "pairs")


# --------------------------------------------------------------------------- readers


def test_excel_utf8_bom_csv_is_accepted(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a byte-order mark; the header is still ``sent0``."""
    path = tmp_path / "pairs.csv"
    path.write_bytes("sent0,sent1\r\na café,b\r\nc,d\r\n".encode("utf-8-sig"))
    assert read_rows(path, ("sent0", "sent1")) == [{"sent0": "a café", "sent1": "b"}, {"sent0": "c", "sent1": "d"}]
    assert load_train_dataset(str(path), "sup")["sent0"] == ["a café", "c"]


def test_bom_text_and_jsonl_are_accepted(tmp_path: Path) -> None:
    txt = tmp_path / "s.txt"
    txt.write_bytes("a dog\nthe cat\n".encode("utf-8-sig"))
    assert read_sentences(txt) == ["a dog", "the cat"]  # no U+FEFF glued to the first sentence
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes('{"sent0": "a", "sent1": "b"}\n{"sent0": "c", "sent1": "d"}\n'.encode("utf-8-sig"))
    assert read_rows(jsonl, ("sent0", "sent1"))[0] == {"sent0": "a", "sent1": "b"}


@pytest.mark.parametrize(("name", "mode"), [("corpus.txt", "unsup"), ("pairs.csv", "sup"), ("pairs.jsonl", "sup")])
def test_a_folder_given_as_the_train_file_says_so(tmp_path: Path, name: str, mode: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    with pytest.raises(DataError, match=rf"{name}: is a folder"):
        load_train_dataset(str(folder), mode)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="absent.txt: file not found"):
        read_sentences(tmp_path / "absent.txt")


def test_a_bad_byte_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_bytes(b"sent0,sent1\na,b\nc\xff,d\n")
    with pytest.raises(DataError, match=r"p.csv, line 3: not valid UTF-8"):
        read_rows(path, ("sent0", "sent1"))


def test_data_imports_neither_negatives_nor_optimisers() -> None:
    tree = ast.parse((REPO / "simcse_kit" / "data.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"simcse_kit.negatives", "simcse_kit.objectives", "simcse_kit.optim"}
