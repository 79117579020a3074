"""Guards around a training run: one writer per run folder, no silent divergence or
collapse, and a clean stop on preemption.

- :class:`RunLock`: an OS file lock (``fcntl.flock``) on ``RUN_FOLDER/.lock``, held for
  the whole run and released by the kernel on any exit (even SIGKILL). A second run into
  the same folder fails at once, naming the holder (pid, host, start time: written in the
  lock file).
- :class:`StopSignals`: SIGTERM and SIGUSR1 (what a cluster scheduler sends before it
  kills a job; SLURM's ``--signal=USR1@120``) and SIGINT (Ctrl-C) ask the loop to stop
  after the current optimiser step; a second Ctrl-C stops at once.
- :class:`StepGuard`: once per optimiser step, whether to stop (a signal on any process)
  and whether the loss or gradient norm went non-finite (on any process), in one small
  all-reduce so that all processes agree on the step; a non-finite value raises
  :class:`Diverged` before the optimiser applies it.
- :func:`collapse_reason`: an evaluation that says every sentence maps to (nearly) one
  point, which must never be selected as the best model.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

import torch

from simcse_kit.errors import STOPPED_STATUS, ConfigError, Stopped, StoppedAfterTraining
from simcse_kit.files import storage_error

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
__all__ = ["STOPPED_STATUS", "Diverged", "RunLock", "StepGuard", "StopSignals", "Stopped", "collapse_reason"]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# Uniformity of normalised embeddings lies in [-4, 0]; 0 is every sentence at one point.
# Trained sentence encoders sit near -2..-3, the tests' tiny random BERT at -4e-5 (its
# vectors are close, but still rank sentences); a collapsed model (loss log(N), every
# cosine 1) gives 0 up to fp32 rounding. Above this threshold: collapsed.
COLLAPSED_UNIFORMITY = -1e-6


class Diverged(ConfigError):
    """The loss or gradient norm became NaN or infinite (a setting is the likely cause)."""


# --------------------------------------------------------------------------- the run folder lock


def is_main_launch_process() -> bool:
    """Rank 0 of a ``torchrun`` / ``accelerate launch`` job, or a single process (the lock
    is taken before Accelerate starts, so the launcher's RANK is what there is)."""
    return os.environ.get("RANK", "0") == "0"


def lock_holder(folder: str | Path) -> str | None:
    """Who holds ``folder``'s run lock (:class:`RunLock`) now, as its lock file says
    (``pid 4242 on host-1, started ...``); None when no live process holds it. Creates
    nothing: a folder without a lock file is not locked."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails only while a RunLock holds it
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unknown process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """An exclusive lock on a run folder, as a context manager.

    Args:
        folder: the run folder (created if missing).

    Raises:
        ConfigError: another process holds it (the message names it).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        made = [] if self.folder.is_dir() else [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only or full place: one line naming it
            raise storage_error(exc, self.folder) or exc from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unknown process"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ConfigError(
                f"{self.folder}: another run is writing into this folder ({holder}); "
                "wait for it to finish or choose another --output-dir"
            ) from None
        # Who holds it, for the message a second run prints (the lock itself is the flock).
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
        except OSError as exc:
            # A full disk still creates the file (an inode, no data block): remove it, and the
            # folders made for it, while the flock is held, so no empty .lock is left behind.
            self.path.unlink(missing_ok=True)
            os.close(fd)
            for folder in made:  # innermost first
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise storage_error(exc, self.folder) or exc from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire() if is_main_launch_process() else self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- signals


class SignalHandlers:
    """Install ``_handle`` for :attr:`signals` while active and put the previous
    handlers back after. Main thread only (Python delivers signals there); elsewhere it
    does nothing."""

    signals: tuple[int, ...] = ()

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError

    def __enter__(self: _Handlers) -> _Handlers:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


_Handlers = TypeVar("_Handlers", bound=SignalHandlers)


class StopSignals(SignalHandlers):
    """While active, SIGTERM / SIGUSR1 / SIGINT set :attr:`requested` instead of killing;
    a second SIGINT raises KeyboardInterrupt at once. Installed only in the main thread
    (Python delivers signals there); elsewhere it does nothing."""

    signals = STOP_SIGNALS

    def __init__(self) -> None:
        super().__init__()
        self.requested: str | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, no checkpoint
        if self.requested is None:
            self.requested = name
            hint = " (Ctrl-C again to stop at once, without a checkpoint)" if signum == signal.SIGINT else ""
            logger.warning("%s received: finishing the current step, then writing a checkpoint%s", name, hint)


class AfterTrainingSignals(SignalHandlers):
    """While active (the final STS table, after training and ``metrics.json``), SIGTERM and
    SIGUSR1 raise :class:`~simcse_kit.errors.StoppedAfterTraining` naming ``what`` was
    interrupted, instead of killing the process without a word (exit 143). Main thread only.
    """

    signals = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise StoppedAfterTraining(signal.Signals(signum).name, signum, self.what)


# --------------------------------------------------------------------------- the per-step check


def _finite(value: torch.Tensor | float | None) -> bool:
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).all())
    return math.isfinite(value)


class StepGuard:
    """One check per optimiser step: stop requested anywhere? non-finite anywhere?

    On the CPU (and across processes) each step is checked before its update. On one CUDA
    device, reading a flag back every step would stall the host on the device each step,
    so the flags are gathered on the device and read only on the steps ``due(step)``
    names: the loop passes its log, evaluation and checkpoint steps (which read the device
    anyway), so no non-finite weights are ever evaluated or saved; the error names the
    first non-finite step.

    Args:
        accelerator: the run's Accelerator (its device and process count).
        signals: the run's :class:`StopSignals`.
        check_grad_norm: also treat a non-finite gradient norm as divergence (off under
            fp16, where the loss scaler skips steps with overflowing gradients by design).
        hint: the settings worth checking, for the message (learning rate, temperature, ...).
        due: on one CUDA device, the steps whose flags are read back (default: every step).
    """

    def __init__(
        self,
        accelerator: Any,
        signals: StopSignals,
        check_grad_norm: bool = True,
        hint: str = "",
        due: Callable[[int], bool] | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.signals = signals
        self.check_grad_norm = check_grad_norm
        self.hint = hint
        device = torch.device(getattr(accelerator, "device", "cpu"))
        self.deferred = due is not None and device.type == "cuda" and accelerator.num_processes == 1
        self.due = due
        self._first_bad: torch.Tensor | None = None  # on the device: the first non-finite step, 0 if none

    def __call__(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | float | None) -> bool:
        """Raise :class:`Diverged` on a non-finite loss (or gradient norm); return whether
        to stop after this step. ``step`` is the optimiser step being taken (1-based)."""
        if self.deferred and isinstance(loss, torch.Tensor):
            return self._deferred(step, loss, grad_norm)
        bad = not _finite(loss) or (self.check_grad_norm and not _finite(grad_norm))
        flags = [float(self.signals.requested is not None), float(bad)]
        if self.accelerator.num_processes > 1:
            # One tiny all-reduce a step so that every process stops (or raises) at the same step.
            tensor = torch.tensor(flags, device=self.accelerator.device)
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
            flags = tensor.tolist()
        if flags[1]:
            self._raise(step, step, loss, grad_norm)
        return bool(flags[0])

    def _deferred(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | float | None) -> bool:
        ok = torch.isfinite(loss.detach()).all()
        if self.check_grad_norm and isinstance(grad_norm, torch.Tensor):
            ok = ok & torch.isfinite(grad_norm.detach()).all()
        elif self.check_grad_norm and grad_norm is not None and not math.isfinite(grad_norm):
            ok = torch.zeros((), dtype=torch.bool, device=loss.device)
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.long, device=loss.device)
        # The first bad step stays; a good step leaves the flag as it was (all on the device).
        self._first_bad = torch.where((self._first_bad == 0) & ~ok, step, self._first_bad)
        assert self.due is not None
        if self.due(step):
            first = int(self._first_bad)  # the one read-back, on a step that reads the device anyway
            if first:
                self._raise(first, step, loss, grad_norm)
        return self.signals.requested is not None

    def _raise(self, first: int, step: int, loss: torch.Tensor | float, grad_norm: torch.Tensor | float | None) -> None:
        value = float(loss.detach().float().mean()) if isinstance(loss, torch.Tensor) else loss
        norm = "" if grad_norm is None else f", gradient norm {float(grad_norm)}"
        where = f"step {step}" if first == step else f"step {first} (found at step {step}, before any evaluation or checkpoint)"
        raise Diverged(
            f"training diverged at {where}: loss {value}{norm} (not finite). Likely causes: a learning rate "
            f"too high, a temperature too low, or fp16 overflow{self.hint}. Stopped before this step's update: "
            "the last checkpoint and the best model so far are kept"
        )


def collapse_reason(metrics: dict[str, float], primary: str) -> str | None:
    """Why an evaluation looks collapsed (every sentence at one point), or None.

    Collapse: uniformity near 0 (all embeddings within a tiny ball), or a primary score
    that is not a number (a constant embedding has no rank correlation).
    """
    score = metrics.get(primary)
    if score is not None and not math.isfinite(score):
        return f"{primary} is {score} (a constant embedding has no correlation)"
    uniformity = next((v for k, v in metrics.items() if k.endswith("uniformity")), None)
    if uniformity is not None and uniformity > COLLAPSED_UNIFORMITY:
        return f"uniformity {uniformity:.3g} (> {COLLAPSED_UNIFORMITY:g}: every sentence maps to the same vector)"
    return None
