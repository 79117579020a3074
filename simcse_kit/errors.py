"""Errors that reach the user as one clear line instead of a library traceback."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data; the message names the file, the line (1-based) and the problem."""


class ConfigError(ValueError):
    """Bad configuration; the message names the file or key and the problem."""


def where(path: object, line: int | None = None) -> str:
    """``'file.txt, line 3'`` — the prefix every DataError message starts with."""
    return f"{path}, line {line}" if line is not None else str(path)
