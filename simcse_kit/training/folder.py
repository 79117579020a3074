"""The run folder: created, locked and checked before a text run writes into it.

A run folder holds ``config.yaml``, the resolved config as it ran, with ``auto``
precision decided for the machine (:func:`with_concrete_precision`): it says what ran,
and ``--resume`` compares it with the requested config (:func:`config_differences`) and
refuses a run that would compute something else. The device's ``null`` (auto) settings
(:func:`with_device_defaults`: loader workers, packing) are decided where the run starts
and stay ``null`` in it: a resume on another device decides them there.
:func:`prepare_run_dir` refuses to clobber a finished or unfinished run unless asked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from simcse_kit.config.run import AUTO, HUB_PREFIX, RunConfig, TrainConfig, load_config, save_config
from simcse_kit.data.corpus import default_cache_dir
from simcse_kit.errors import ConfigError, StorageError
from simcse_kit.files import folder_contents, remove_dir, write_json_atomic, write_text_atomic
from simcse_kit.model.precision import PrecisionChoice, resolve_precision
from simcse_kit.training.checkpoints import latest_checkpoint
from simcse_kit.training.guards import LOCK_FILE, RunLock

logger = logging.getLogger(__name__)

# Settings that may change between a run and its --resume: they do not change what is
# computed (where files go, progress display, loader workers, checkpoint frequency,
# trackers, the allocator's mmap threshold).
RESUME_MAY_DIFFER = (
    "train.output_dir",
    "train.progress_bar",
    "data.num_workers",
    "train.save_steps",
    "train.report_to",
    "train.mmap_threshold_mib",
    "loss.teacher_cache_dir",
)
CHECKPOINTS = "checkpoints"
# The training data's fingerprints, written beside config.yaml: config.yaml records the
# paths, and a file edited in place between a kill and --resume would continue the
# checkpoint's data position in other data.
DATA_FINGERPRINTS = "data_fingerprints.json"
SHA256_MEMO = "simcse_kit_sha256"  # under data.cache_dir: the training files' digests by path, size and mtime
LOGS = "logs"  # the experiment trackers' folder in the run folder
BEST_MODEL = "best_model"


def with_concrete_precision(cfg: TrainConfig, cpu: bool | None = None) -> tuple[TrainConfig, PrecisionChoice | None]:
    """``cfg`` with its ``auto`` precision settings decided for this machine (and the choice,
    with its one-line reason); a config without ``auto`` comes back unchanged with None.

    Args:
        cfg: the run's ``train:`` section.
        cpu: decide for the CPU; default: the CPU when CUDA is unavailable.
    """
    if AUTO not in (cfg.mixed_precision, cfg.bf16_weights, cfg.fast_dropout):
        return cfg, None
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    choice = resolve_precision(
        cfg.mixed_precision, "cpu" if cpu else "cuda", bf16_weights=cfg.bf16_weights, fast_dropout=cfg.fast_dropout
    )
    decided = replace(cfg, mixed_precision=choice.mixed_precision, bf16_weights=choice.bf16_weights)
    return replace(decided, fast_dropout=choice.fast_dropout), choice


# On CUDA the collator's tokenisation in the training process is the bottleneck: 4 and then
# 8 worker processes each raised the sentences/s (BENCHMARKS.md, GPU).
CUDA_WORKERS = 8


def with_device_defaults(cfg: RunConfig, device: torch.device | str, num_processes: int = 1) -> RunConfig:
    """``cfg`` with its device-dependent ``null`` (auto) settings made concrete, each
    choice logged: ``data.num_workers`` (0 on the CPU, :data:`CUDA_WORKERS` on CUDA, at
    most this process's share of the cores less one) and ``model.packing`` (on for the CPU; off on CUDA, where
    ``benchmarks/gpu.py`` measured padded batches faster at every shape it ran)."""
    cuda = torch.device(device).type == "cuda"
    workers = cfg.data.num_workers
    if workers is None:
        share = (os.cpu_count() or 1) // max(1, num_processes)
        workers = min(CUDA_WORKERS, max(0, share - 1)) if cuda else 0
        logger.info("data.num_workers auto -> %d on %s", workers, torch.device(device).type)
    packing = cfg.model.packing
    if packing is None:
        packing = not cuda
        logger.info(
            "model.packing auto -> %s on %s%s",
            packing,
            torch.device(device).type,
            " (padding measured faster there: BENCHMARKS.md, GPU section)" if cuda else "",
        )
    return replace(cfg, data=replace(cfg.data, num_workers=workers), model=replace(cfg.model, packing=packing))


def config_differences(saved: RunConfig, requested: RunConfig) -> list[str]:
    """``'section.key: saved -> requested'`` for each setting that would change the run.

    A saved config records what ran, so ``auto`` precision settings in ``requested`` are
    decided for this machine before comparing (a recipe's ``auto`` matches a run that
    chose bf16 here, and not one that chose it on another machine's hardware)."""
    saved, requested = (replace(c, train=with_concrete_precision(c.train)[0]) for c in (saved, requested))
    out = []
    old, new = saved.to_dict(), requested.to_dict()
    for section, values in new.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted not in RESUME_MAY_DIFFER and old[section][key] != value:
                out.append(f"{dotted}: {old[section][key]!r} -> {value!r}")
    return out


def data_fingerprints(cfg: RunConfig) -> dict[str, dict[str, object]]:
    """``{path: {"bytes": size, "sha256": digest}}`` of the files the run trains on
    (``data.train_file``, ``data.mix_file``; a ``hub:`` dataset has no file). The whole
    file is hashed: an edit keeping the size and the ends (a fixed typo) still differs."""
    out: dict[str, dict[str, object]] = {}
    memo = Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()
    for value in (cfg.data.train_file, cfg.data.mix_file):
        if value is None or value.startswith(HUB_PREFIX) or not Path(value).is_file():
            continue
        out[value] = {"bytes": Path(value).stat().st_size, "sha256": file_sha256(Path(value), memo / SHA256_MEMO)}
    return out


def file_sha256(path: Path, memo: Path) -> str:
    """The SHA-256 of ``path``, remembered in ``memo`` under its absolute path, size and
    modification time: hashing a 2 GB corpus takes ~10 s, on every start of every process,
    while the corpus cache (:mod:`simcse_kit.data.corpus`) already trusts the same stat to
    tell an unchanged file. An unwritable ``memo`` only costs the hash again."""
    stat = path.stat()
    key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    remembered = memo / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.txt"
    try:
        return remembered.read_text(encoding="utf-8").strip()
    except OSError:
        pass
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    try:
        write_text_atomic(remembered, digest.hexdigest() + "\n")
    except OSError as exc:
        logger.debug("the SHA-256 of %s is not remembered: %s", path, exc)
    return digest.hexdigest()


def check_data_unchanged(out: Path, cfg: RunConfig) -> None:
    """On --resume: the training files are those the run started on (:data:`DATA_FINGERPRINTS`).

    Raises:
        ConfigError: naming the file that changed (its size, or its content).
    """
    record = out / DATA_FINGERPRINTS
    if not record.is_file():  # a run folder from before fingerprints were recorded
        logger.warning("--resume: %s records no data fingerprints; the training files are not checked", out)
        return
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{record}: cannot be read ({exc}); the run's data cannot be checked") from None
    now = data_fingerprints(cfg)
    for path, was in saved.items() if isinstance(saved, dict) else ():
        new = now.get(path)
        if new == was:
            continue
        if new is None:
            change = "is gone"
        elif new["bytes"] != was.get("bytes"):
            change = f"changed since the run started ({was.get('bytes')} -> {new['bytes']} bytes)"
        else:
            digests = f"sha256 {str(was.get('sha256'))[:12]}... -> {str(new['sha256'])[:12]}..."
            change = f"changed since the run started (same size, other content: {digests})"
        raise ConfigError(
            f"--resume: {path} {change}; the checkpoint's data position would continue in other data: "
            "restore the file, or start a new run in another --output-dir"
        )


def prepare_run_dir(cfg: RunConfig, overwrite: bool = False, resume: bool = False, held: ExitStack | None = None) -> Path:
    """Create the run folder; refuse to clobber a finished or unfinished run unless asked.

    With ``resume`` the folder's saved ``config.yaml`` must match ``cfg`` in everything
    but :data:`RESUME_MAY_DIFFER`; a folder with nothing in it yet starts afresh (so a
    restart script may always pass ``--resume``). With ``held`` the folder is locked
    first (:class:`~simcse_kit.training.guards.RunLock`, released when ``held`` closes): a second
    run into it fails here, before it changes anything.
    """
    out = Path(cfg.train.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config key 'train.output_dir' = {str(out)!r}: exists and is not a folder")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    if held is not None:
        held.enter_context(RunLock(out))
    finished = (out / "metrics.json").exists()
    if resume:
        if finished:
            raise ConfigError(f"{out} holds a finished run (metrics.json); nothing to resume")
        saved_path = out / "config.yaml"
        if saved_path.is_file():
            diffs = config_differences(load_config(saved_path), cfg)
            if diffs:
                raise ConfigError(
                    f"--resume: the requested config differs from {saved_path} in {'; '.join(diffs)}; "
                    "resume with the same settings, or start a new run in another --output-dir"
                )
            check_data_unchanged(out, cfg)
            return out
        logger.warning("--resume: %s holds no run yet; starting from the beginning", out)
    elif finished and not overwrite:
        raise ConfigError(f"{out} already holds a finished run; choose another --output-dir or pass --overwrite")
    elif not overwrite and latest_checkpoint(out / CHECKPOINTS) is not None:
        raise ConfigError(
            f"{out} holds an unfinished run ({latest_checkpoint(out / CHECKPOINTS)}); "
            "pass --resume to continue it or --overwrite to start over"
        )
    # The other processes of a run hold no lock, so the folder may not exist yet when they get here.
    if overwrite and out.is_dir() and not (out / "config.yaml").is_file() and folder_contents(out, ignore=(LOCK_FILE,)):
        # --overwrite starts over in a run folder; a folder that is not one (no config.yaml) is left alone.
        raise ConfigError(
            f"{out}: --overwrite replaces only a simcse-kit run folder (with config.yaml) or an empty one; "
            f"this one holds {', '.join(folder_contents(out, ignore=(LOCK_FILE,)))}: choose another --output-dir"
        )
    if overwrite:
        # A fresh run must never resume into the old one's state, log its steps among the old
        # one's events, or (killed before it finishes) look finished with the old one's results.
        for old in (CHECKPOINTS, BEST_MODEL, LOGS):
            if (out / old).exists():
                remove_dir(out / old)
        (out / "metrics.json").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    write_json_atomic(out / DATA_FINGERPRINTS, data_fingerprints(cfg))
    return out


def prepare_run_dir_once(
    accelerator: Accelerator, cfg: RunConfig, overwrite: bool = False, resume: bool = False, held: ExitStack | None = None
) -> Path:
    """:func:`prepare_run_dir` on the main process only, for a run on several processes or
    machines: one writer checks, locks, clears (``--overwrite`` removes the old checkpoints
    once) and records the folder while the others wait for the outcome, then every process
    returns the folder or raises the main process's one-line error. Every rank preparing it
    raced: a second rank's removal of the checkpoints found them gone, or half-renamed.

    Raises:
        ConfigError, StorageError: as :func:`prepare_run_dir` raised it on the main process.
    """
    if accelerator.num_processes == 1:
        return prepare_run_dir(cfg, overwrite, resume, held)
    outcome: list[Exception | None] = [None]
    if accelerator.is_main_process:
        try:
            prepare_run_dir(cfg, overwrite, resume, held)
        except (ConfigError, StorageError) as exc:
            outcome = [exc]
        except Exception as exc:  # a bug: the others must not wait for a broadcast that never comes
            broadcast_object_list([ConfigError(f"the main process failed preparing the run folder: {exc!r}")])
            raise
    broadcast_object_list(outcome)
    if outcome[0] is not None:
        raise outcome[0]
    return Path(cfg.train.output_dir)
