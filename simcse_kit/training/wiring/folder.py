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
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list

from simcse_kit.config.run import AUTO, RunConfig, TrainConfig, files_label, is_hub, load_config, save_config
from simcse_kit.errors import ConfigError, DataError, StorageError
from simcse_kit.files import folder_contents, remove_dir, shard_paths, write_json_atomic
from simcse_kit.model.precision import PrecisionChoice, resolve_precision
from simcse_kit.training.engine.checkpoints import latest_checkpoint
from simcse_kit.training.engine.guards import LOCK_FILE, RunLock

logger = logging.getLogger(__name__)

#: Settings that may change between a run and its --resume: they do not change what is
#: computed (where files go, progress display, loader workers, checkpoint frequency,
#: trackers, the allocator's mmap threshold).
RESUME_MAY_DIFFER = (
    "train.output_dir",
    "train.progress_bar",
    "train.collective_timeout_s",
    "data.cache_dir",  # a node's own cache folder: each node of a launch may name another
    "data.num_workers",
    "train.save_steps",
    "train.report_to",
    "train.mmap_threshold_mib",
    "loss.teacher_cache_dir",
)
CHECKPOINTS = "checkpoints"
#: The training data's fingerprints, written beside config.yaml: config.yaml records the
#: paths, and a file edited in place between a kill and --resume would continue the
#: checkpoint's data position in other data.
DATA_FINGERPRINTS = "data_fingerprints.json"
LOGS = "logs"  # the experiment trackers' folder in the run folder
BEST_MODEL = "best_model"


def lacks_final_table(out: Path, metrics: Mapping[str, Any]) -> bool:
    """Whether the finished run in ``out`` (its ``metrics``) stopped before its final STS table: a run writes
    metrics.json before that table, so a stop there leaves a best model and no ``sts``."""
    return "sts" not in metrics and (out / BEST_MODEL).is_dir()


def with_concrete_precision(
    cfg: TrainConfig, cpu: bool | None = None, *, agree: bool = True
) -> tuple[TrainConfig, PrecisionChoice | None]:
    """``cfg`` with its ``auto`` precision settings decided for this machine (and the choice,
    with its one-line reason); a config without ``auto`` comes back unchanged with None.

    Args:
        cfg: the run's ``train:`` section.
        cpu: decide for the CPU; default: the CPU when CUDA is unavailable.
        agree: with several processes, take rank 0's choice (:func:`agreed_with_rank0`:
            a collective, so every process must call it); False: this process's own.
    """
    if AUTO not in (cfg.mixed_precision, cfg.bf16_weights, cfg.fast_dropout):
        return cfg, None
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    choice = resolve_precision(
        cfg.mixed_precision, "cpu" if cpu else "cuda", bf16_weights=cfg.bf16_weights, fast_dropout=cfg.fast_dropout
    )
    if agree:
        choice = agreed_with_rank0(choice, cpu)
    decided = replace(cfg, mixed_precision=choice.mixed_precision, bf16_weights=choice.bf16_weights)
    return replace(decided, fast_dropout=choice.fast_dropout), choice


def agreed_with_rank0(choice: PrecisionChoice, cpu: bool) -> PrecisionChoice:
    """Rank 0's precision choice, on every process of a launch (``WORLD_SIZE`` > 1).

    Each process checks its own hardware, but one launch must not train bf16 weights on
    one rank and fp32 on another (DDP would all-reduce gradients of different dtypes, and
    the ranks' models would drift apart): rank 0 decides, the others follow, before any
    model is cast. A process whose own check differs says so (a launch across unlike
    machines). The process group is Accelerate's, started here as the run's Accelerator
    would start it (``cpu``), so the later Accelerator reuses it.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return choice
    state = PartialState(cpu=cpu)
    if state.num_processes <= 1:
        return choice
    [main] = broadcast_object_list([choice], from_process=0)
    if main.reason != choice.reason:
        logger.warning(
            "precision: this process (rank %d) would decide %s; following rank 0: %s",
            state.process_index,
            choice.reason,
            main.reason,
        )
    agreed = replace(main, decided_by=f"rank 0 of {state.num_processes}: {main.decided_by}")
    logger.info("precision for all %d processes (rank 0 decides): %s", state.num_processes, agreed.reason)
    return agreed


#: On CUDA the collator's tokenisation in the training process is the bottleneck: 4 and then
#: 8 worker processes each raised the sentences/s (BENCHMARKS.md, GPU).
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
    saved, requested = (replace(c, train=with_concrete_precision(c.train, agree=False)[0]) for c in (saved, requested))
    out = []
    old, new = saved.to_dict(), requested.to_dict()
    for section, values in new.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted not in RESUME_MAY_DIFFER and old[section][key] != value:
                out.append(f"{dotted}: {old[section][key]!r} -> {value!r}")
    return out


def training_files(cfg: RunConfig) -> list[str | list[str]]:
    """The local files the run reads its examples from, whether or not they exist now: each
    dataset's file (:meth:`~simcse_kit.config.sections.DataConfig.training_sets`), ``data.mix_file``
    and ``data.dev_file`` when it is a file (a ``hub:`` dataset has none; a BEIR folder is not
    one). The teacher's and the guide's texts are these files' sentences. A dataset of shards
    is its ``file`` as given (a folder, a pattern or a list: :func:`simcse_kit.files.shard_paths`)."""
    files: list[str | list[str]] = [spec.file for spec in cfg.data.training_sets()]
    files += [cfg.data.mix_file] if cfg.data.mix_file is not None else []
    if cfg.data.dev_file is not None and not Path(cfg.data.dev_file).is_dir():
        files.append(cfg.data.dev_file)
    once: dict[str, str | list[str]] = {}  # each once, at its first place
    for f in files:
        if not is_hub(f):
            once.setdefault(files_label(f), f)
    return list(once.values())


def data_fingerprints(cfg: RunConfig) -> dict[str, dict[str, object]]:
    """``{path: {"bytes": size, "sha256": digest}}`` of the files the run reads
    (:func:`training_files`) that exist. The whole content is hashed, every time: an edit
    keeping the size, the ends and the modification time (``touch -r``) still differs.

    A dataset of shards (a glob pattern or a folder: :func:`simcse_kit.files.shard_paths`)
    is recorded as ``{"shards": [{"file": shard, "bytes": ..., "sha256": ...}, ...]}`` in the
    order they are read: a shard added, removed, reordered or edited changes the record (a
    list of files under its paths joined by commas: :func:`simcse_kit.config.run.files_label`)."""
    out: dict[str, dict[str, object]] = {}
    for value in training_files(cfg):
        try:
            shards = shard_paths(value)
        except DataError:  # gone (or never there): nothing to record
            continue
        if isinstance(value, str) and shards == [Path(value)]:
            out[value] = _fingerprint(shards[0])
        else:
            out[files_label(value)] = {"shards": [{"file": str(shard)} | _fingerprint(shard) for shard in shards]}
    return out


def _fingerprint(path: Path) -> dict[str, object]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s content, read in 1 MiB blocks. Not remembered by path, size
    and modification time: those survive an edit with the time put back. 1M Wikipedia lines
    (107 MB) take 0.1 s to hash and 0.25-0.37 s from the page cache on the project's shared
    2-core EPYC (hashlib's SHA-256 runs on the CPU's SHA instructions: BLAKE2b took 0.2-0.25 s),
    paid at the start and on --resume."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_data_unchanged(out: Path, cfg: RunConfig) -> None:
    """On --resume: the files the run reads are those it started on (:data:`DATA_FINGERPRINTS`).

    A file the run reads that the record lacks (a record written before every dataset was
    fingerprinted) is named in a warning, not checked; a recorded file the run no longer
    reads (such a record's unused ``data.train_file``) is left alone.

    Raises:
        ConfigError: naming the file that changed (its size, or its content) or is gone.
    """
    record = out / DATA_FINGERPRINTS
    if not record.is_file():  # a run folder from before fingerprints were recorded
        logger.warning("--resume: %s records no data fingerprints; the training files are not checked", out)
        return
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{record}: cannot be read ({exc}); the run's data cannot be checked") from None
    if not isinstance(saved, dict):
        kind = type(saved).__name__
        raise ConfigError(f"{record}: expected a JSON object of files, got {kind}; the run's data cannot be checked")
    now = data_fingerprints(cfg)
    for path in map(files_label, training_files(cfg)):
        was, new = saved.get(path), now.get(path)
        if not isinstance(was, dict):
            logger.warning("--resume: %s does not record %s; that file is not checked", record, path)
            continue
        if new == was:
            continue
        if new is None:
            change = "is gone"
        elif "shards" in new or "shards" in was:
            change = shard_change(was, new)
        elif new["bytes"] != was.get("bytes"):
            change = f"changed since the run started ({was.get('bytes')} -> {new['bytes']} bytes)"
        else:
            digests = f"sha256 {str(was.get('sha256'))[:12]}... -> {str(new['sha256'])[:12]}..."
            change = f"changed since the run started (same size, other content: {digests})"
        raise ConfigError(
            f"--resume: {path} {change}; the checkpoint's data position would continue in other data: "
            "restore the file, or start a new run in another --output-dir"
        )


def shard_change(was: dict[str, object], new: dict[str, object]) -> str:
    """How a dataset's recorded shards (:func:`data_fingerprints`) differ from its shards now,
    naming the first shard that does."""
    before, after = was.get("shards"), new.get("shards")
    if not isinstance(before, list) or not isinstance(after, list):
        then, now = ("one file", "shards") if isinstance(after, list) else ("shards", "one file")
        return f"changed since the run started (it was {then}, it is {now})"
    count = f"{len(before)} -> {len(after)} shards"
    old = {str(s.get("file")): s for s in before if isinstance(s, dict)}
    names = [str(s["file"]) for s in after]
    if added := [name for name in names if name not in old]:
        return f"changed since the run started: shard {added[0]} is new ({count})"
    if gone := [name for name in old if name not in names]:
        return f"changed since the run started: shard {gone[0]} is gone ({count})"
    if names != list(old):
        return "changed since the run started: its shards are read in another order"
    for shard in after:
        name, was_shard = str(shard["file"]), old[str(shard["file"])]
        if shard == was_shard:
            continue
        if shard["bytes"] != was_shard.get("bytes"):
            return f"changed since the run started: shard {name} ({was_shard.get('bytes')} -> {shard['bytes']} bytes)"
        digests = f"sha256 {str(was_shard.get('sha256'))[:12]}... -> {str(shard['sha256'])[:12]}..."
        return f"changed since the run started: shard {name} (same size, other content: {digests})"
    return "changed since the run started"


def prepare_run_dir(cfg: RunConfig, overwrite: bool = False, resume: bool = False, held: ExitStack | None = None) -> Path:
    """Create the run folder; refuse to clobber a finished or unfinished run unless asked.

    With ``resume`` the folder's saved ``config.yaml`` must match ``cfg`` in everything
    but :data:`RESUME_MAY_DIFFER`; a folder with nothing in it yet starts afresh (so a
    restart script may always pass ``--resume``). With ``held`` the folder is locked
    first (:class:`~simcse_kit.training.engine.guards.RunLock`, released when ``held`` closes): a second
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
