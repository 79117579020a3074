"""Files in and out, with one policy each way.

In: :func:`read_lines` is the one reader of line-based text (training corpora, STS and
SentEval files, CSV/JSONL before parsing): UTF-8, a leading byte-order mark dropped (as
Excel and Notepad write it), ``\\r\\n`` or ``\\n`` line ends, and a bad byte reported
with the file and line. A training set's files are :func:`shard_paths` (a file, a folder, a
glob pattern or a list, in one sorted order), each opened by :func:`open_binary`, which
decompresses gzip and zstd.

Out: nothing is ever half-written. A file goes to a temp name beside its target and
is renamed into place (:func:`write_text_atomic`); a folder is built in a temp folder
and renamed into place (:func:`atomic_dir`). Both get the permissions an ordinary
``open``/``mkdir`` would (the process umask), not ``tempfile``'s private 0600/0700,
so colleagues on a shared machine can read a run folder.
"""

from __future__ import annotations

import codecs
import errno
import glob
import io
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from simcse_kit.errors import DataError, StorageError, where

BOM = "\ufeff"
#: The UTF-16 byte-order marks (UTF-32 LE's begins with UTF-16 LE's): Excel's "Unicode Text" and
#: Windows PowerShell 5's ``>`` write one. Read as UTF-8, such a file's first byte is "bad" and
#: every later line holds NULs, so it is named for what it is instead.
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
# Write failures that are the disk's doing, not a bug: one line, no traceback.
DISK_ERRORS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied (read-only for this user)",
    errno.EPERM: "operation not permitted (read-only for this user)",
}
# torch's zip writer reports a full disk as "RuntimeError: [enforce fail at
# inline_container.cc] unexpected pos N vs M": with less free space than this at the
# path, such an error is read as the full disk it is.
LOW_SPACE_BYTES = 16 * 2**20


def read_lines(path: str | Path, what: str = "file", latin1_fallback: bool = False) -> list[tuple[int, str]]:
    """``(line_number, text)`` for every line of a text file, line ends removed.

    ``str.splitlines`` is not used: it also splits on form feeds, ``\\x1c`` and U+2028,
    which occur inside sentences of scraped text.

    Args:
        path: the file.
        what: how an error names the file's role ("training file", "STS file").
        latin1_fallback: decode the whole file as Latin-1 when it is not UTF-8
            (SentEval's MR/CR/SUBJ/MPQA files predate UTF-8); otherwise a bad byte
            is an error naming its line.

    Raises:
        DataError: missing file, a folder or a pipe where a file was expected, or invalid UTF-8.
    """
    path = check_readable(path, what)
    data = path.read_bytes()
    check_not_utf16(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not latin1_fallback:
            line = data[: exc.start].count(b"\n") + 1
            raise not_utf8(path, line, data[exc.start]) from None
        text = data.decode("latin-1")
    if text.startswith(BOM):
        text = text[1:]
    if "\0" in text:  # valid UTF-8, but no text file holds NULs: UTF-16 without its byte-order mark, or binary
        raise nul_error(path, text[: text.index("\0")].count("\n") + 1)
    if "\n" not in text and "\r" in text.rstrip("\r"):  # old Mac line ends: the whole file would be one line
        raise DataError(
            f"{where(path)}: its lines end in a bare carriage return (classic Mac line ends) and none in a newline; "
            "convert them to newlines (tr '\\r' '\\n')"
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start one
    return [(number, line[:-1] if line.endswith("\r") else line) for number, line in enumerate(lines, start=1)]


def check_readable(path: str | Path, what: str = "file") -> Path:
    """``path`` as a Path, after checking it is a regular file.

    Raises:
        DataError: missing, a folder, or a pipe or device where a file was expected.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{where(path)}: is a folder; expected a {what}")
    if path.exists() and not path.is_file():  # a FIFO, <(...) or a device: it exists, it is not "not found"
        raise DataError(f"{where(path)}: not a regular file (a pipe, <(...) or a device); save it to a file and pass that")
    if not path.is_file():
        raise DataError(f"{where(path)}: {what} not found")
    return path


def check_not_utf16(path: str | Path, head: bytes) -> None:
    """Refuse a file whose first bytes ``head`` are a UTF-16 byte-order mark (:data:`UTF16_BOMS`).

    Raises:
        DataError: naming the file, its encoding and how to save it as UTF-8.
    """
    if head.startswith(UTF16_BOMS):
        raise DataError(
            f"{where(path, 1)}: UTF-16 text (the file opens with UTF-16's byte-order mark), not UTF-8; save it as "
            'UTF-8 (Excel: "CSV UTF-8"; or iconv -f UTF-16 -t UTF-8)'
        )


def not_utf8(path: str | Path, line: int, byte: int) -> DataError:
    """The error of a ``line`` of ``path`` that is not UTF-8 at ``byte``; for a CSV or TSV, with
    what saved it so most often (Excel's plain "CSV" is in the Windows code page)."""
    hint = '; Excel\'s plain "CSV" is not UTF-8: save it as "CSV UTF-8"' if data_suffix(path) in (".csv", ".tsv") else ""
    return DataError(f"{where(path, line)}: not valid UTF-8 (byte 0x{byte:02x}){hint}")


def nul_error(path: str | Path, line: int) -> DataError:
    """The error of a file whose text holds NUL characters at ``line``: valid UTF-8, but no
    text file holds them (UTF-16 without its byte-order mark, or binary data)."""
    return DataError(
        f"{where(path, line)}: holds NUL characters: not a UTF-8 text file (UTF-16 without a byte-order mark, "
        "or binary data); save it as UTF-8"
    )


#: Compressed training files, by suffix: ``train.jsonl.gz`` is JSONL in a gzip stream. pyarrow
#: (already the Arrow cache's library) decompresses both, so neither needs another package.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
#: Names a folder of shards leaves out, as ``pyarrow.dataset`` does: hidden files and the
#: markers Spark and Hadoop write beside their shards (``_SUCCESS``, ``_committed_*``).
IGNORED_PREFIXES = (".", "_")
GLOB_CHARS = "*?["
#: What ``datasets``' ``save_to_disk`` writes beside a dataset's ``data-*.arrow`` files (not
#: shards), and what it writes for a ``DatasetDict`` (one subfolder a split).
DATASETS_METADATA = ("dataset_info.json", "state.json")
DATASET_DICT = "dataset_dict.json"


def compression_of(path: str | Path) -> str | None:
    """The codec of a compressed file by its suffix (:data:`COMPRESSIONS`), else None."""
    return COMPRESSIONS.get(Path(path).suffix.lower())


def data_suffix(path: str | Path) -> str:
    """The suffix that says a file's format, lower-cased, its compression suffix left off:
    ``.jsonl`` for ``train.JSONL.gz``, ``.txt`` for ``wiki.txt``."""
    path = Path(path)
    if compression_of(path) is not None:
        path = path.with_suffix("")
    return path.suffix.lower()


class _Decompressed(io.RawIOBase):
    """A compressed file's bytes, read through pyarrow's decompressing stream; a stream that
    is not what its suffix says (a ``.gz`` that is not gzip, a truncated ``.zst``) is a
    DataError naming the file."""

    def __init__(self, path: Path, codec: str) -> None:
        import pyarrow as pa

        self.path, self.codec = path, codec
        self._stream = pa.input_stream(str(path), compression=codec)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._stream.read(len(buffer))
        except OSError as exc:  # pyarrow reports a bad stream as an OSError ("zlib inflate failed: ...")
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{where(self.path)}: not a valid {self.codec} file ({reason})") from None
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


def open_binary(path: str | Path, what: str = "file") -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed where its suffix says so
    (:data:`COMPRESSIONS`): every reader of training files opens them here, so each
    format reads the same compressed or not.

    Raises:
        DataError: as :func:`check_readable`.
    """
    path = check_readable(path, what)
    codec = compression_of(path)
    if codec is None:
        return path.open("rb")
    return io.BufferedReader(_Decompressed(path, codec), buffer_size=1 << 20)


def is_glob(source: str | Path) -> bool:
    """``source`` is a glob pattern (``data/train-*.parquet``), not a file's name."""
    return any(c in str(source) for c in GLOB_CHARS) and not Path(source).exists()


def shard_paths(source: str | Path | Sequence[str | Path], what: str = "file") -> list[Path]:
    """The files a dataset is read from, in the order they are read: its shards.

    One path through the readers: a file is a list of one shard. A folder is its files
    (not its subfolders, nor the names of :data:`IGNORED_PREFIXES`), a glob pattern the files
    it matches, both sorted by path, so the order never depends on the file system's; a
    list is each entry so resolved, in the list's order. Every shard must have the same
    format (:func:`data_suffix`): a README in a folder of Parquet shards is an error, not a shard.

    Raises:
        DataError: a missing file, a folder or pattern without files, shards of two formats.
    """
    if not isinstance(source, str | Path):
        paths = [path for entry in source for path in shard_paths(entry, what)]
        if not paths:
            raise DataError("an empty list of files; give at least one file, folder or pattern")
    elif Path(source).is_dir():
        folder = Path(source)
        if (folder / DATASET_DICT).is_file():
            splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
            raise DataError(
                f"{where(folder)}: a DatasetDict saved by datasets' save_to_disk (splits {splits}); give the folder "
                f"of one split, e.g. {folder / ('train' if 'train' in splits or not splits else splits[0])}"
            )
        paths = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(IGNORED_PREFIXES))
        if any(data_suffix(p) == ".arrow" for p in paths):  # a Dataset saved by save_to_disk: its data files
            paths = [p for p in paths if p.name not in DATASETS_METADATA]
        if not paths:
            raise DataError(f"{where(folder)}: is a folder without files; a folder is read as a dataset's files (its shards)")
    elif is_glob(source):
        matched = sorted(Path(p) for p in glob.glob(str(source), recursive=True))
        paths = [p for p in matched if p.is_file()]
        if not paths:
            raise DataError(f"{where(source)}: no file matches this pattern; expected a dataset's files (its shards)")
    else:
        return [check_readable(source, what)]
    formats = {data_suffix(p) for p in paths}
    if len(formats) > 1:
        first = next(p for p in paths if data_suffix(p) == data_suffix(paths[0]))
        other = next(p for p in paths if data_suffix(p) != data_suffix(paths[0]))
        raise DataError(
            f"{where(source if isinstance(source, str | Path) else other)}: shards of two formats ({first.name} and "
            f"{other.name}); every shard of a dataset must have the same format"
        )
    return [check_readable(p, what) for p in paths]


class LineStream:
    """The lines of a text file as :func:`read_lines` reads them, streamed: one line in
    memory at a time, so a corpus of any size is read in constant memory.

    Iterating gives ``(line_number, text)``. A line that is not valid UTF-8 raises a
    DataError naming it; with ``keep_bad`` it is given decoded with replacement characters
    instead and :attr:`bad` holds that error, for a caller that skips bad rows (it resets
    ``bad`` once it has dealt with it; a CSV record over several lines may hold the line).

    Attributes:
        number: the number of the last line given (0 before the first).
        bad: the error of an undecodable line given since the caller last reset it.
    """

    def __init__(self, path: str | Path, what: str = "file", keep_bad: bool = False) -> None:
        self.path = check_readable(path, what)
        self.keep_bad = keep_bad
        self.number = 0
        self.bad: DataError | None = None  #: with ``keep_bad``: the error of a bad line given, until reset

    def __iter__(self) -> Iterator[tuple[int, str]]:
        # Binary iteration splits on b"\n" only (not on form feeds or U+2028, which occur
        # inside scraped sentences), exactly as read_lines splits the decoded text.
        with open_binary(self.path) as fh:
            for number, raw in enumerate(fh, start=1):
                if number == 1:
                    check_not_utf16(self.path, raw)
                if number == 1 and raw.startswith(BOM.encode("utf-8")):
                    raw = raw[3:]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    error = not_utf8(self.path, number, raw[exc.start])
                    if not self.keep_bad:
                        raise error from None
                    self.bad = self.bad or error
                    text = raw.decode("utf-8", errors="replace")
                if "\0" in text:  # UTF-16 without its byte-order mark, or binary: a whole-file problem
                    raise nul_error(self.path, number)
                if text.endswith("\n"):
                    text = text[:-1]
                if text.endswith("\r"):
                    text = text[:-1]
                self.number = number
                yield number, text


def read_json_objects(path: str | Path, what: str = "file", keys: str = "") -> list[tuple[int, dict[str, Any]]]:
    """``(line_number, object)`` for every non-blank line of a JSONL file.

    Raises:
        DataError: a line that is not valid JSON, or not a JSON object (``keys`` says
            which keys one should have, for the message).
    """
    path = Path(path)
    return [(number, json_object(text, path, number, keys)) for number, text in read_lines(path, what) if text.strip()]


def json_object(text: str, path: str | Path, number: int, keys: str = "") -> dict[str, Any]:
    """One JSONL line as the object it must be; a DataError naming the file and line otherwise."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where(path, number)}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where(path, number)}: expected a JSON object{keys}, got {type(obj).__name__}")
    return obj


def nearest_existing(path: str | Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def storage_error(exc: BaseException, path: str | Path) -> StorageError | None:
    """A one-line :class:`~simcse_kit.errors.StorageError` naming ``path`` when ``exc`` is a
    write that failed for the disk's reasons (full, quota, read-only, permission), else None."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
        return StorageError(f"{path}: {DISK_ERRORS[exc.errno]}; nothing half-written was left there")
    # safetensors (Rust) reports the OS error only in its text: 0.8 writes "Error while
    # serializing: I/O error: No space left on device (os error 28)" (Rust's Display),
    # older releases "IoError(Os { code: 28, kind: StorageFull, ... })" (its Debug).
    found = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(exc))
    code = int(found.group(1) or found.group(2)) if found else None
    if code is not None and code in DISK_ERRORS:
        return StorageError(f"{path}: {DISK_ERRORS[code]}; nothing half-written was left there")
    if isinstance(exc, RuntimeError):
        try:
            free = shutil.disk_usage(nearest_existing(path)).free
        except OSError:
            return None
        if free < LOW_SPACE_BYTES:
            return StorageError(f"{path}: no space left on device ({free} bytes free); nothing half-written was left there")
    return None


def check_writable(path: str | Path, what: str, folder: bool = False) -> None:
    """Check that ``path`` (a file, or with ``folder`` a folder whose files are written
    inside it) can be written, by creating and deleting a hidden file where it would go;
    called before long work, so a read-only or full location fails first, not last.

    Raises:
        StorageError: read-only, no permission, or a full disk, naming ``what`` and ``path``.
    """
    path = Path(path)
    probe_dir = nearest_existing(path if folder else path.parent)
    if not probe_dir.is_dir():
        raise StorageError(f"{what} {path}: {probe_dir} is not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".simcse-kit-write-check-", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        reason = DISK_ERRORS.get(exc.errno or 0, exc.strerror or str(exc))
        raise StorageError(f"{what} {path}: cannot write there: {reason}") from None


def _umask() -> int:
    # os.umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _ordinary_mode(path: str | Path, directory: bool) -> None:
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, then rename it into place."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise storage_error(exc, path) or exc from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        _ordinary_mode(tmp, directory=False)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        error = storage_error(exc, path)
        if error is not None:
            raise error from None
        raise


NON_FINITE_NOTE = "non_finite"  # the key that lists the values written as null, and why


def finite_json(obj: Any, where: str = "") -> tuple[Any, list[str]]:
    """``obj`` with every NaN or infinite float replaced by None, and the dotted paths of
    the replaced values (``evals[3].stsb_dev``): Python's ``NaN``/``Infinity`` tokens are
    not JSON, and most readers (browsers, jq, pandas with the C parser) refuse them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None, [f"{where or '<value>'} = {obj}"]
    if isinstance(obj, dict):
        out, bad = {}, []
        for key, value in obj.items():
            out[key], more = finite_json(value, f"{where}.{key}" if where else str(key))
            bad += more
        return out, bad
    if isinstance(obj, (list, tuple)):
        pairs = [finite_json(value, f"{where}[{i}]") for i, value in enumerate(obj)]
        return [p[0] for p in pairs], [b for p in pairs for b in p[1]]
    return obj, []


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """JSON (indented) through :func:`write_text_atomic`; always valid JSON: a NaN or
    infinity is written as null, and a mapping gets a ``non_finite`` entry saying which
    values those were (:func:`finite_json`)."""
    clean, bad = finite_json(obj)
    if bad and isinstance(clean, dict):
        clean[NON_FINITE_NOTE] = {"written_as_null": bad, "why": "NaN and infinity are not valid JSON"}
    write_text_atomic(path, json.dumps(clean, indent=2, allow_nan=False))


def replace_dir(src: str | Path, dst: str | Path) -> None:
    """Put folder ``src`` at ``dst`` by renames (same filesystem), dropping an old ``dst``.

    A kill at any moment leaves the old ``dst``, the new one, or (between the two
    renames) the old one under a hidden ``.NAME.old-PID`` name beside it.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a folder in a hidden temp folder beside ``path``; on success it replaces
    ``path`` whole, on any error (or kill) nothing at ``path`` changes.

    Example::

        with atomic_dir(out) as tmp:
            model.save_pretrained(tmp)
            (tmp / "meta.json").write_text(...)
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path}: exists and is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as exc:
        raise storage_error(exc, path) or exc from None
    try:
        yield tmp
        for folder, _subdirs, files in os.walk(tmp):
            _ordinary_mode(folder, directory=True)
            for name in files:
                full = os.path.join(folder, name)
                if not os.path.islink(full):
                    os.chmod(full, os.stat(full).st_mode | (0o666 & ~_umask()))
        replace_dir(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = storage_error(exc, path)
        if error is not None:
            # A write inside the temp folder names its own file there: name the one the user
            # asked for instead (the temp folder is gone, and was never theirs).
            raise StorageError(str(error).replace(str(tmp), str(path))) from None
        raise


def folder_contents(path: str | Path, limit: int = 5, ignore: tuple[str, ...] = ()) -> list[str]:
    """Up to ``limit`` names in folder ``path`` (folders end in ``/``), sorted, ``ignore``
    left out, then ``"... (N more)"``: what an error shows of a folder it refuses to replace."""
    entries = sorted(p for p in Path(path).iterdir() if p.name not in ignore)
    names = [f"{p.name}/" if p.is_dir() else p.name for p in entries[:limit]]
    if len(entries) > limit:
        names.append(f"... ({len(entries) - limit} more)")
    return names


def remove_dir(path: str | Path) -> None:
    """Delete a folder so that a kill midway never leaves it half-deleted under its
    name: it is first renamed to a hidden ``.NAME.deleting``."""
    path = Path(path)
    doomed = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure atomically (format from the suffix, PNG by default)
    and close it, so figures never pile up in pyplot's registry.

    Raises:
        StorageError: a full, read-only or forbidden disk, one line naming ``path``
            (Pillow reports it as a bare ``OSError`` from inside its PNG encoder).
    """
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
        os.replace(tmp, path)
    except Exception as exc:
        error = storage_error(exc, path)
        if error is None:
            raise
        raise error from None
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
