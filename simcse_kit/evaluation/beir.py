"""Retrieval tasks in BEIR's folder format: read one, write one.

A task folder, as BEIR (and MTEB's retrieval loaders) lay it out::

    corpus.jsonl      {"_id": "d1", "title": "...", "text": "..."}   one document a line
    queries.jsonl     {"_id": "q1", "text": "..."}                   one query a line
    qrels/test.tsv    query-id <TAB> corpus-id <TAB> score           a header line, then judgements
    qrels/dev.tsv     (optional) the same for the dev split

Reading follows BEIR's ``GenericDataLoader``: a document is encoded as
``title + " " + text`` (stripped; just ``text`` without a title), a split's queries are
the queries that have a judgement in that split's qrels (a query with none is not
evaluated), and a score is an integer relevance grade (0 = judged not relevant). Every
bad row is a :class:`~simcse_kit.errors.DataError` naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from simcse_kit.errors import DataError, where
from simcse_kit.files import read_json_objects, read_lines, write_text_atomic

__all__ = ["RetrievalTask", "read_beir", "write_beir"]

QRELS_HEADER = "query-id\tcorpus-id\tscore"


@dataclass(frozen=True)
class RetrievalTask:
    """One split of a retrieval task.

    Attributes:
        name: The task's name (its folder's name by default).
        corpus: Document id -> the text encoded for it, in file order.
        queries: Query id -> text, only the queries judged in this split, in file order.
        qrels: Query id -> {document id -> relevance grade}.
        path: The folder it was read from.
    """

    name: str
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    path: Path | None = None


def _jsonl(path: Path, what: str, fields: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """id -> row of a JSONL file whose rows carry ``_id`` and the string ``fields``; the
    ``required`` ones must hold more than blanks."""
    rows: dict[str, dict[str, str]] = {}
    for line, row in read_json_objects(path, what):
        doc_id = row.get("_id")
        if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or str(doc_id) == "":
            raise DataError(f"{where(path, line)}: missing or empty '_id'")
        doc_id = str(doc_id)
        if doc_id in rows:
            raise DataError(f"{where(path, line)}: duplicate _id {doc_id!r}")
        for key in fields:
            if not isinstance(row.get(key, ""), str):
                raise DataError(f"{where(path, line)}: {key!r} must be a string")
            if key in required and not (row.get(key) or "").strip():
                # An empty query still ranks the corpus (by the prompt and special tokens alone): a score of noise.
                raise DataError(f"{where(path, line)}: empty {key!r} for _id {doc_id!r}; every query needs its text")
        rows[doc_id] = {key: row.get(key, "") or "" for key in fields}
    if not rows:
        raise DataError(f"{path}: no rows; expected one JSON object a line")
    return rows


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    lines = read_lines(path, "qrels file")
    if not lines or lines[0][1].split("\t")[0].strip() != "query-id":
        raise DataError(f"{where(path, 1)}: expected the header {QRELS_HEADER!r}")
    for line, text in lines[1:]:
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != 3:
            got = len(fields)
            raise DataError(f"{where(path, line)}: expected 3 tab-separated fields (query-id, corpus-id, score), got {got}")
        query, doc, score = (f.strip() for f in fields)
        try:
            grade = int(score)
        except ValueError:
            raise DataError(f"{where(path, line)}: score {score!r} is not an integer") from None
        if not query or not doc:
            raise DataError(f"{where(path, line)}: empty query-id or corpus-id")
        qrels.setdefault(query, {})[doc] = grade
    if not qrels:
        raise DataError(f"{path}: no judgements")
    return qrels


def read_beir(folder: str | Path, split: str = "test", name: str | None = None) -> RetrievalTask:
    """Reads one split of a BEIR-format task folder.

    Args:
        folder: The task folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).
        split: The qrels file to read: ``test`` or ``dev`` (any ``qrels/<split>.tsv``).
        name: The task's name (default: the folder's name).

    Raises:
        DataError: A missing file, a bad row (named by file and line), or a judgement
            naming a query or document the files do not have.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such retrieval task folder (expected corpus.jsonl, queries.jsonl, qrels/)")
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        found = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise DataError(f"{qrels_path}: qrels file not found (this folder has splits {found})")
    docs = _jsonl(folder / "corpus.jsonl", "corpus file", ("title", "text"))
    all_queries = _jsonl(folder / "queries.jsonl", "queries file", ("text",), required=("text",))
    qrels = _qrels(qrels_path)
    missing_q = [q for q in qrels if q not in all_queries]
    if missing_q:
        raise DataError(f"{qrels_path}: query-id {missing_q[0]!r} is not in queries.jsonl ({len(missing_q)} such)")
    missing_d = sorted({d for judged in qrels.values() for d in judged if d not in docs})
    if missing_d:
        raise DataError(f"{qrels_path}: corpus-id {missing_d[0]!r} is not in corpus.jsonl ({len(missing_d)} such)")
    corpus = {doc_id: (row["title"] + " " + row["text"]).strip() for doc_id, row in docs.items()}
    queries = {q: row["text"] for q, row in all_queries.items() if q in qrels}
    return RetrievalTask(name or folder.name, corpus, queries, qrels, folder)


def write_beir(
    folder: str | Path,
    corpus: Mapping[str, str],
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> Path:
    """Writes a BEIR-format task folder (each file atomically; the folder is created).

    Args:
        folder: Where to write.
        corpus: Document id -> text (written with an empty title).
        queries: Query id -> text.
        qrels: Split name (``test``, ``dev``) -> query id -> {document id -> grade}.

    Returns:
        The folder.
    """
    folder = Path(folder)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)

    def jsonl(rows: list[dict[str, str]]) -> str:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    write_text_atomic(folder / "corpus.jsonl", jsonl([{"_id": i, "title": "", "text": t} for i, t in corpus.items()]))
    write_text_atomic(folder / "queries.jsonl", jsonl([{"_id": i, "text": t} for i, t in queries.items()]))
    for split, judged in qrels.items():
        lines = [QRELS_HEADER] + [f"{q}\t{d}\t{g}" for q, docs in judged.items() for d, g in docs.items()]
        write_text_atomic(folder / "qrels" / f"{split}.tsv", "\n".join(lines) + "\n")
    return folder
