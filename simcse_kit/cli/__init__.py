"""The ``simcse-kit`` console script: one entry point, one subcommand per job, one module
per command (or small group) in this package, the options they share in
:mod:`~simcse_kit.cli.options`.

Errors the user can fix (bad data, bad config, missing model) print one line and
exit with status 2; a full disk or a read-only place prints one line and exits 1; a run
stopped by SIGTERM, SIGUSR1 or Ctrl-C writes a checkpoint, prints the ``--resume``
command and exits 75 (:data:`simcse_kit.errors.STOPPED_STATUS`); a second Ctrl-C exits
130 at once. A run on several processes that loses one (:class:`~simcse_kit.errors.PeerLost`)
prints one line naming it with the launcher's command that resumes the run, and exits 1.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from simcse_kit.cli import align_uniform, demos, evaluate, export, mine, overlap, recipes, retrieval_tasks, score, train, transfer
from simcse_kit.cli.options import check_counts, parse_overrides
from simcse_kit.errors import STOPPED_STATUS, ConfigError, DataError, PeerLost, Stopped, StoppedAfterTraining, StorageError

__all__ = ["build_parser", "main", "parse_overrides", "resume_command"]

logger = logging.getLogger("simcse_kit")

# In the order `simcse-kit --help` lists them.
COMMANDS = (train, transfer, evaluate, export, demos, align_uniform, mine, score, retrieval_tasks, overlap, recipes)


def resume_command(argv: Sequence[str], launch: Sequence[str] | None = None) -> str:
    """The command line that continues a stopped run: the same arguments, ``--resume``
    in place of ``--overwrite`` (a stopped run must not be started over). ``launch``: the
    launcher's whole command line (:func:`launch_command`), in place of ``simcse-kit`` and
    ``argv``."""
    words = [w for w in (argv if launch is None else launch) if w != "--overwrite"]
    if "--resume" not in words:
        words.append("--resume")
    return shlex.join(words if launch is not None else ["simcse-kit", *words])


def launch_command() -> list[str] | None:
    """The command line of the launcher that started this process (torchrun, ``accelerate
    launch``: its elastic agent is this process's parent), read from Linux's
    ``/proc/PPID/cmdline``; None without a launcher or where it cannot be read."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        words = [w.decode() for w in Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0") if w]
    except (OSError, UnicodeDecodeError):
        return None
    return words or None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simcse-kit", description="SimCSE sentence-embedding training and evaluation")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub.add_parser)
    return parser


def configure_logging(verbose: bool) -> None:
    """The CLI's log: INFO (DEBUG with ``-v``) with times, less the libraries that chatter at INFO."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # faiss.loader: on import, every SIMD build it tries first, each "Could not load library ...
    # ModuleNotFoundError" where the wheel ships one dispatching library, which reads as a failure.
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # transformers 5 lists every unsharded layer at WARNING on a plain single-device load.
    logging.getLogger("transformers.distributed.tensor_parallel").setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not args.extra_ok:  # only train/sweep take config overrides
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.verbose)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        check_counts(args)
        return args.func(args, extra)
    except (ConfigError, DataError) as exc:
        print(f"simcse-kit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:  # a full disk or a read-only place: the environment, not a bug
        print(f"simcse-kit {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except PeerLost as exc:  # another process of the launch is gone: this one cannot go on alone
        argv_now = sys.argv[1:] if argv is None else argv
        launch = launch_command()
        again = "resume with" if launch is not None else "resume with (the same launcher, on every node)"
        logger.debug("lost a peer", exc_info=exc.__cause__)
        print(f"simcse-kit {args.command}: error: {exc}; {again}: {resume_command(argv_now, launch)}", file=sys.stderr)
        return 1
    except Stopped as exc:  # SIGTERM / SIGUSR1 / Ctrl-C: a checkpoint is written
        print(f"simcse-kit {args.command}: {exc}", file=sys.stderr)
        if exc.checkpoint is not None:
            print(
                f"simcse-kit {args.command}: resume with: {resume_command(sys.argv[1:] if argv is None else argv)}",
                file=sys.stderr,
            )
        return STOPPED_STATUS
    except StoppedAfterTraining as exc:  # training finished; metrics.json holds its results
        print(f"simcse-kit {args.command}: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # a second Ctrl-C (or one outside training): no traceback, no checkpoint
        print(f"simcse-kit {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        # A command that never imported torch holds no process group; do not import it just to look.
        if "torch.distributed" in sys.modules:
            from simcse_kit.core.distributed import close_process_group

            close_process_group()
