"""Errors that reach the user as one clear line instead of a library traceback."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """Bad input data; the message names the file, the line (1-based) and the problem."""


class ConfigError(ValueError):
    """Bad configuration; the message names the file or key and the problem."""


class StorageError(OSError):
    """A write failed for lack of space or permission; the message names the path and
    says "no space left on device" or "read-only" (not a bug: no traceback)."""


#: The exit status of a run stopped by a signal after writing its checkpoint: EX_TEMPFAIL
#: from sysexits.h ("a temporary failure; the user is invited to retry"), distinct from
#: 0 (done), 1 (a bug), 2 (bad input) and 128 + N (killed by signal N).
STOPPED_STATUS = 75


class Stopped(Exception):
    """A stop signal ended the run after a complete checkpoint at ``step``."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        where = f"checkpoint at {checkpoint}" if checkpoint is not None else "no checkpoint (nowhere to save one)"
        super().__init__(f"stopped by {signal_name} after step {step}; {where}")


class StoppedAfterTraining(Exception):
    """A stop signal (SIGTERM, SIGUSR1) during the work after training (the final STS
    table): nothing to checkpoint, and ``metrics.json`` already holds the training's
    results. The CLI prints the message and exits 128 + the signal's number."""

    def __init__(self, signal_name: str, signum: int, what: str) -> None:
        self.signal_name, self.signum = signal_name, signum
        super().__init__(f"stopped by {signal_name} during {what}")


def where(path: object, line: int | None = None) -> str:
    """``'file.txt, line 3'`` — the prefix every DataError message starts with; a Parquet or
    Arrow file, or a hub dataset (``hub:<id>``), has rows, not lines
    (``'train-00016-of-00020.parquet, row 3'``, counted from 1)."""
    if line is None:
        return str(path)
    rows = str(path).lower().endswith((".parquet", ".arrow")) or str(path).startswith("hub:")
    return f"{path}, {'row' if rows else 'line'} {line}"


class PeerLost(RuntimeError):
    """Another process of a run on several processes or nodes is gone (killed, crashed, its
    node down) or silent past ``train.collective_timeout_s``; the message names it as far
    as torch's error tells (:mod:`simcse_kit.training.engine.peers`). Not a bug: the CLI prints
    one line with the command that resumes the run, and exits 1."""
