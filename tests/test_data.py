"""The batch layout (one home: simcse_kit.core.batch), the collator that follows it, and the
training-file readers (UTF-8 with or without a byte-order mark, through files)."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from simcse_kit.core.batch import (
    MODEL_INPUTS,
    VIEW_COLUMNS,
    batch_texts,
    model_inputs,
    split_views,
    text_ids,
    view_rows,
    views_per_example,
)
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import COLUMNS, load_train_dataset, read_rows, read_sentences
from simcse_kit.errors import DataError
from simcse_kit.files import read_lines

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
    assert COLUMNS == {
        "unsup": ("sent0",),
        "sup": ("sent0", "sent1"),
        "hardneg": ("sent0", "sent1", "hard_neg"),
        "scored": ("sent0", "sent1"),  # the score is a number, not a text column: read_rows(score_column=)
    }
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


def test_excel_semicolon_csv_reads_as_the_comma_file(tmp_path: Path) -> None:
    """Excel saves "CSV" with semicolons, and numbers with a decimal comma, where the locale's
    decimal separator is a comma: the header decides the separator, and the scores read as numbers."""
    rows = [["a café", "b; quoted", "x"], ["c", "d", "y"]]
    comma = tmp_path / "comma.csv"
    comma.write_text("sent0,sent1,hard_neg\n" + "".join(",".join(f'"{f}"' for f in r) + "\n" for r in rows), "utf-8")
    semi = tmp_path / "semi.csv"
    body = "".join(";".join(f'"{f}"' if ";" in f else f for f in r) + "\r\n" for r in rows)
    semi.write_bytes(("sent0;sent1;hard_neg\r\n" + body).encode("utf-8-sig"))
    assert read_rows(semi, ("sent0", "sent1"), hard_negatives=True) == read_rows(comma, ("sent0", "sent1"), hard_negatives=True)
    assert load_train_dataset(str(semi), "hardneg")["sent1"] == ["b; quoted", "d"]
    tabs = tmp_path / "tabs.csv"  # a TSV named .csv
    tabs.write_text("sent0\tsent1\thard_neg\n" + "".join("\t".join(r) + "\n" for r in rows), "utf-8")
    assert read_rows(tabs, ("sent0", "sent1"), hard_negatives=True) == read_rows(comma, ("sent0", "sent1"), hard_negatives=True)
    scored = tmp_path / "scored.csv"
    scored.write_text("sent0;sent1;score\na;b;4,5\nc;d;3\ne;f;1.25\n", "utf-8")
    got = read_rows(scored, ("sent0", "sent1"), score_column="score", score_range=(0, 5))
    assert [r["score"] for r in got] == [0.9, 0.6, 0.25]
    scored.write_text("sent0;sent1;score\na;b;4,5,1\n", "utf-8")
    with pytest.raises(DataError, match=r"scored.csv, line 2: score '4,5,1' \(column 'score'\) is not a number"):
        read_rows(scored, ("sent0", "sent1"), score_column="score")


def test_excel_empty_columns_are_not_read(tmp_path: Path) -> None:
    """Excel saves a formatted sheet's empty columns (a header ``sent0,sent1,,``) and empty rows
    (``,,,``): the unnamed columns are not read, where they were refused as a repeated name ''."""
    path = tmp_path / "p.csv"
    path.write_text("sent0,sent1,,\r\na man,a person,,\r\na dog,an animal,,note\r\n,,,\r\n", "utf-8")
    assert read_rows(path, ("sent0", "sent1")) == [
        {"sent0": "a man", "sent1": "a person"},
        {"sent0": "a dog", "sent1": "an animal"},
    ]
    path.write_text("sent0,sent1,sent1\na,b,c\nd,e,f\n", "utf-8")  # a name given twice is still refused
    with pytest.raises(DataError, match=r"repeats column\(s\) \['sent1'\]"):
        read_rows(path, ("sent0", "sent1"))


def test_a_comma_csv_is_not_taken_for_a_semicolon_one(tmp_path: Path) -> None:
    """Only a header that semicolons split into the wanted columns switches the separator;
    in a comma file a semicolon is text, and a decimal comma is not read as a point."""
    path = tmp_path / "p.csv"
    path.write_text("sent0;x\na;b\n", "utf-8")  # no sent1 either way: the comma header is reported
    with pytest.raises(DataError, match=r"p.csv, line 1: header \['sent0;x'\] lacks column\(s\) \['sent0', 'sent1'\]"):
        read_rows(path, ("sent0", "sent1"))
    path.write_text('sent0,sent1,score\na;b,c,"4,5"\nd,e,1\n', "utf-8")
    with pytest.raises(DataError, match=r"score '4,5' \(column 'score'\) is not a number"):
        read_rows(path, ("sent0", "sent1"), score_column="score")
    path.write_text("sent0,sent1\na;b,c\nd,e\n", "utf-8")
    assert read_rows(path, ("sent0", "sent1")) == [{"sent0": "a;b", "sent1": "c"}, {"sent0": "d", "sent1": "e"}]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name", ["corpus.txt", "pairs.csv", "pairs.jsonl"])
def test_a_utf16_file_is_named_so(tmp_path: Path, name: str, encoding: str) -> None:
    """Excel's "Unicode Text" and PowerShell 5's ``>`` write UTF-16 with a byte-order mark:
    the error says UTF-16 and how to save it, not "byte 0xff" (with the mark) and not a bare NUL."""
    text = {"corpus.txt": "a dog\nthe cat\n", "pairs.csv": "sent0,sent1\na,b\n", "pairs.jsonl": '{"sent0": "a", "sent1": "b"}\n'}
    path = tmp_path / name
    marked = encoding == "utf-16"  # Python's "utf-16" writes the mark; the -le/-be codecs do not
    path.write_bytes(text[name].encode(encoding))
    mode = "unsup" if name.endswith(".txt") else "sup"
    expected = r"line 1: UTF-16 text .*save it as UTF-8" if marked else r"line 1: holds NUL characters"
    with pytest.raises(DataError, match=expected):
        load_train_dataset(str(path), mode)
    if marked:
        with pytest.raises(DataError, match=expected):
            read_lines(path)
    if not marked:  # with the mark written by hand: the BE codec's output after a BE mark
        path.write_bytes(codecs.BOM_UTF16_BE + text[name].encode("utf-16-be") if encoding.endswith("be") else
                         codecs.BOM_UTF16_LE + text[name].encode("utf-16-le"))  # fmt: skip
        with pytest.raises(DataError, match=r"line 1: UTF-16 text"):
            load_train_dataset(str(path), mode)


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


def test_a_windows_code_page_csv_says_how_to_save_it(tmp_path: Path) -> None:
    """Excel's plain "CSV" is written in the Windows code page (é is byte 0xe9): a CSV's error says
    to save it as "CSV UTF-8"; a text corpus's bad byte has no such hint."""
    path = tmp_path / "p.csv"
    path.write_bytes("sent0,sent1\r\na café,b\r\nc,d\r\n".encode("cp1252"))
    with pytest.raises(DataError, match=r'p.csv, line 2: not valid UTF-8 \(byte 0xe9\); .*save it as "CSV UTF-8"'):
        read_rows(path, ("sent0", "sent1"))
    with pytest.raises(DataError, match=r'line 2: .*"CSV UTF-8"'):
        read_lines(path)
    corpus = tmp_path / "c.txt"
    corpus.write_bytes("a dog\na café\n".encode("cp1252"))
    with pytest.raises(DataError, match=r"c.txt, line 2: not valid UTF-8 \(byte 0xe9\)$"):
        load_train_dataset(str(corpus), "unsup")


def test_a_hub_datasets_rows_are_checked_as_a_files(tmp_path: Path) -> None:
    """A hub dataset (here `datasets.load_dataset` of a local folder, as ``hub:`` reads one) gets a
    file's row checks: a missing or blank text names its row (a None reached the tokenizer, a blank
    text was trained on), ``bad_rows: skip`` leaves such rows out, and texts are stripped as a file's are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "hub"
    folder.mkdir()
    rows = [
        {"sent0": " a man ", "sent1": "a person"},
        {"sent0": "a dog", "sent1": None},
        {"sent0": "a cat", "sent1": "a pet"},
        {"sent0": "\t", "sent1": "x"},
        {"sent0": "a bird", "sent1": "it flies"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    source = f"hub:{folder}"
    with pytest.raises(DataError, match=rf"^{source}, row 2: missing value for column 'sent1'$"):
        load_train_dataset(source, "sup")
    ds = load_train_dataset(source, "sup", bad_rows="skip")
    assert ds[:] == {"sent0": ["a man", "a cat", "a bird"], "sent1": ["a person", "a pet", "it flies"]}
    pq.write_table(pa.Table.from_pylist(rows[1:3]), folder / "train.parquet")
    with pytest.raises(DataError, match=rf"^{source}: 1 usable row\(s\)"):
        load_train_dataset(source, "sup", bad_rows="skip")


# --------------------------------------------------------------------------- word repetition (ESimCSE)


def _content(tokenizer: object, row: torch.Tensor) -> list[int]:
    """A row's ids without padding and special tokens."""
    ids = [int(t) for t in row if int(t) != tokenizer.pad_token_id]  # type: ignore[attr-defined]
    mask = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)  # type: ignore[attr-defined]
    return [t for t, s in zip(ids, mask, strict=True) if not s]


def _is_repetition(original: list[int], repeated: list[int], prefix: bool = False) -> int:
    """How many tokens of ``original`` ``repeated`` doubles in place (or, with ``prefix``,
    a prefix of such a sequence); -1 if it is not that."""
    out, doubled = 0, 0
    for token in original:
        if prefix and out == len(repeated):
            break
        if repeated[out : out + 2] == [token, token]:
            out, doubled = out + 2, doubled + 1
        elif repeated[out : out + 1] == [token]:
            out += 1
        else:
            return -1
    return doubled if out == len(repeated) else -1


WORD_REP_EXAMPLES = [
    {"sent0": "a man plays the red guitar in the park"},
    {"sent0": "two children swims water"},
    {"sent0": "dog cat ball car street book bed food piano guitar park water"},
]


def test_word_repetition_doubles_tokens_of_view_one_in_order_within_bounds(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = ContrastiveCollator(tok, "unsup", max_seq_len=12)(WORD_REP_EXAMPLES)
    rate, seen = 0.32, set()
    for seed in range(8):
        batch = ContrastiveCollator(tok, "unsup", max_seq_len=12, word_repetition=rate, seed=seed)(WORD_REP_EXAMPLES)
        assert batch["input_ids"].shape[1] <= 12 and set(batch) == set(plain)
        for i in range(len(WORD_REP_EXAMPLES)):
            original = _content(tok, plain["input_ids"][2 * i])
            assert _content(tok, batch["input_ids"][2 * i]) == original  # view 0 untouched
            repeated = _content(tok, batch["input_ids"][2 * i + 1])
            n, room = len(original), 12 - 2  # [CLS] ... [SEP]
            if len(repeated) < room:  # not truncated: every token kept, some doubled
                doubled = _is_repetition(original, repeated)
                assert 0 <= doubled <= max(2, int(rate * n))
                seen.add(doubled)
            else:  # truncated at max_seq_len: a prefix of such a sequence
                assert len(repeated) == room and _is_repetition(original, repeated, prefix=True) >= 0
            row = batch["input_ids"][2 * i + 1]
            assert int(row[0]) == tok.cls_token_id and tok.sep_token_id in row.tolist()
            assert int(batch["attention_mask"][2 * i + 1].sum()) == len(repeated) + 2
    assert len(seen) > 1  # the number of repeats varies


def test_word_repetition_is_deterministic_per_batch_and_off_is_unchanged(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    make = lambda **kw: ContrastiveCollator(tok, "unsup", max_seq_len=16, **kw)  # noqa: E731
    first = make(word_repetition=0.5, seed=3)(WORD_REP_EXAMPLES)
    again = make(word_repetition=0.5, seed=3)(WORD_REP_EXAMPLES)
    assert all(torch.equal(first[k], again[k]) for k in first)
    # What --resume needs: a batch's repetitions depend on the batch alone, not on how many
    # batches this collator (or a worker's copy of it) made before.
    used = make(word_repetition=0.5, seed=3)
    used(WORD_REP_EXAMPLES[::-1])
    assert all(torch.equal(used(WORD_REP_EXAMPLES)[k], first[k]) for k in first)
    plain = make()(WORD_REP_EXAMPLES)
    reference = tok(
        [e["sent0"] for e in WORD_REP_EXAMPLES for _ in range(2)],
        padding=True,
        truncation=True,
        max_length=16,
        return_tensors="pt",
    )
    assert all(torch.equal(plain[k], reference[k]) for k in reference)  # off: the plain tokenizer call
    with pytest.raises(ValueError, match="unsup"):
        ContrastiveCollator(tok, "sup", word_repetition=0.3)
