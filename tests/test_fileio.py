"""simcse_kit.files: the one line reader and the atomic writers (with ordinary permissions)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from simcse_kit.errors import DataError
from simcse_kit.files import atomic_dir, read_lines, write_json_atomic, write_text_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_read_lines_bom_crlf_and_no_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffsent0,sent1\r\na b,c d\r\nlast".encode())
    assert read_lines(path) == [(1, "sent0,sent1"), (2, "a b,c d"), (3, "last")]


def test_read_lines_keeps_in_sentence_separators(tmp_path: Path) -> None:
    """U+2028 and form feeds occur inside scraped sentences: only \\n ends a line."""
    path = tmp_path / "t.txt"
    path.write_text("a\u2028b\x0cc\nd\n", encoding="utf-8")
    assert read_lines(path) == [(1, "a\u2028b\x0cc"), (2, "d")]


def test_read_lines_names_the_line_of_a_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"ok\nalso ok\nbad \xff here\n")
    with pytest.raises(DataError, match=r"t\.txt, line 3: not valid UTF-8 \(byte 0xff\)"):
        read_lines(path)
    assert read_lines(path, latin1_fallback=True)[2] == (3, "bad \xff here")


def test_read_lines_folder_and_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a folder; expected a training file"):
        read_lines(tmp_path, what="training file")
    with pytest.raises(DataError, match="STS file not found"):
        read_lines(tmp_path / "nope.txt", what="STS file")


def test_atomic_writes_respect_the_umask(tmp_path: Path, umask_022: None) -> None:
    """tempfile makes 0600 files and 0700 folders; a run folder must be readable by
    colleagues on a shared machine, as files written with open() would be."""
    write_text_atomic(tmp_path / "config.yaml", "a: 1\n")
    write_json_atomic(tmp_path / "metrics.json", {"a": 1})
    with atomic_dir(tmp_path / "best_model") as tmp:
        (tmp / "model.safetensors").write_bytes(b"x")
        (tmp / "sub").mkdir()
    assert mode(tmp_path / "config.yaml") == 0o644
    assert mode(tmp_path / "metrics.json") == 0o644
    assert mode(tmp_path / "best_model") == 0o755
    assert mode(tmp_path / "best_model" / "model.safetensors") == 0o644
    assert mode(tmp_path / "best_model" / "sub") == 0o755


def test_atomic_dir_leaves_nothing_on_error_and_keeps_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "v").write_text("2")
        raise RuntimeError("killed midway")
    assert (target / "v").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_atomic_dir_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file")
    with pytest.raises(FileExistsError, match="not a folder"), atomic_dir(tmp_path / "out"):
        pass
