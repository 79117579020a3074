"""What the commands share: the options several of them take (declared here once), the
``--key value`` config overrides of ``train`` and ``sweep``, and printing and saving results."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from simcse_kit.errors import ConfigError
from simcse_kit.files import check_writable, write_json_atomic

POOLER_HELP = "pooler for a plain HF model"
MODEL_HELP = "anything 'simcse-kit evaluate' accepts"


def parse_overrides(tokens: Sequence[str]) -> dict[str, str]:
    """``['--seed', '3', '--model.pooler=cls']`` -> ``{'seed': '3', 'model.pooler': 'cls'}``."""
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}; options are --key value")
        key = tok[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            i += 1
            value = tokens[i]
        else:
            raise ConfigError(f"option --{key} needs a value")
        out[key] = value
        i += 1
    return out


def add_model(p: argparse.ArgumentParser, model_help: str = MODEL_HELP, pooler_help: str = POOLER_HELP) -> None:
    """The model an evaluation command reads, and ``--pooler`` for a plain HF one."""
    p.add_argument("model", help=model_help)
    p.add_argument("--pooler", default=None, help=pooler_help)


def add_data_options(p: argparse.ArgumentParser, data_dir_help: str) -> None:
    """``--data-dir`` and ``--data-root`` of the commands that read STS or SentEval data."""
    p.add_argument("--data-dir", default=None, help=f"{data_dir_help} (default: DATA_ROOT/senteval)")
    p.add_argument(
        "--data-root",
        default=None,
        help="the data root (default: $SIMCSE_KIT_DATA, else ../shared/data beside a source checkout)",
    )


def add_trust(p: argparse.ArgumentParser) -> None:
    """``--trust-remote-code`` of every command that loads a model: off by default, so a
    folder that would run its own Python code is refused with one line (never a y/N
    question), as ``model.trust_remote_code`` does for ``train``."""
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model folder's own Python code (config.json's auto_map for a model_type transformers does not know)",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``: where a command writes its results."""
    p.add_argument("--json", type=Path, default=None, help="write results here")


def add_batch_size(p: argparse.ArgumentParser) -> None:
    """``--batch-size`` of every command that encodes."""
    p.add_argument("--batch-size", type=int, default=128)


def check_counts(args: argparse.Namespace) -> None:
    """The counts a command takes (``--batch-size``, ``--top-k``) are >= 1, checked before
    any model is loaded (0 was a library traceback after the load)."""
    for name in ("batch_size", "top_k"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be >= 1")


def add_device(p: argparse.ArgumentParser) -> None:
    """``--device`` of every command that encodes (:mod:`simcse_kit.model.devices`)."""
    from simcse_kit.model.devices import AUTO_DEVICE, DEVICE_HELP

    p.add_argument("--device", default=AUTO_DEVICE, help=f"{DEVICE_HELP} (default: auto)")


def check_output(path: Path | None, flag: str = "--json", folder: bool = False) -> None:
    """Fail before the work, not after it, when ``path`` cannot be written."""
    if path is not None:
        if not folder and Path(path).is_dir():  # found only at the rename, after the work, otherwise
            raise ConfigError(f"{flag} {path}: is a folder; give the path of a file to write")
        check_writable(path, flag, folder=folder)


def show(table: str, results: Mapping[str, float], json_out: Path | None) -> None:
    """Print a command's table and write its results as JSON where ``--json`` says."""
    print(table)
    if json_out is not None:
        write_json_atomic(Path(json_out), results)
