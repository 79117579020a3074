"""A text run's inputs, loaded and checked before anything is written.

The training data (:func:`load_training_sets`), the tokenizer checked against the model
folder and the configured lengths (:func:`load_checked_tokenizer`) and the teacher's and
the guide's vectors of the training sentences (:func:`training_texts`, :func:`load_teacher`,
:func:`load_guide`; every dataset's sentences in one table):
each fails with a ConfigError naming the config key, before the run folder exists.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import PartialState
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.config.run import GUIDE_IS_TEACHER, RunConfig, files_label, is_hub
from simcse_kit.core import modes
from simcse_kit.core.batch import view_columns
from simcse_kit.data.mixture import mix_datasets
from simcse_kit.data.overlap import dataset_keys, text_columns
from simcse_kit.data.readers import load_train_dataset, negatives_of, scored_dataset
from simcse_kit.data.tokens import Tokenization, with_tokens
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation.contamination import Guard, dev_set, suite_sets
from simcse_kit.evaluation.sts_readers import PAIR_READERS
from simcse_kit.evaluation.suite import default_suite, stsb_split_path
from simcse_kit.model.checks import check_tokenizer, check_tokenizer_files, check_weights
from simcse_kit.model.families import max_tokens, prepare_tokenizer
from simcse_kit.model.inference import load_encoder
from simcse_kit.model.modeling import resolve_model_path
from simcse_kit.training.objective.objectives import GuideFilter, TeacherTargets
from simcse_kit.training.objective.teacher import (
    TeacherTable,
    aligned_projection,
    load_teacher_table,
    pca_projection,
    teacher_texts,
)

logger = logging.getLogger(__name__)


def load_training_data(cfg: RunConfig, tokenizer: Any = None, guard: Guard | None = None) -> datasets.Dataset:
    """The training set of a run of one dataset (``data.train_file``): :func:`load_training_sets`'
    only one.

    Raises:
        ValueError: the config lists several datasets.
    """
    sets = load_training_sets(cfg, tokenizer, guard)
    if len(sets) != 1:
        raise ValueError(f"load_training_data: the config lists {len(sets)} datasets ({list(sets)}): use load_training_sets")
    return next(iter(sets.values()))


def check_graded_scores(dataset: datasets.Dataset, source: str, weight: float) -> None:
    """A scored training set whose scores are all equal gives the ranking losses (CoSENT,
    AnglE) no ordered pair: their term is exactly 0 from the first step. Refused where it is
    the whole loss (``loss.score_weight`` 1), warned about beside InfoNCE.

    Raises:
        DataError: every score is the same and ``weight`` is 1, naming the file.
    """
    column = modes.mode("scored").score_column
    assert column is not None
    scores = dataset.select_columns([column]).with_format("numpy")[:][column]  # 8 bytes a pair, read once
    low, high = float(scores.min()), float(scores.max())
    if low != high:
        return
    what = f"{source}: every score is {low:g}: the score loss ranks pairs by their scores and has no ordered pair"
    if weight == 1:
        fix = "give graded scores, or loss.score_weight < 1 to train InfoNCE on the pairs"
        raise DataError(f"{what} (loss 0 from step 1); {fix}")
    logger.warning("%s: its term (loss.score_weight %g) is 0 at every step; only InfoNCE trains", what, weight)


def contamination_guard(cfg: RunConfig) -> Guard:
    """The run's contamination guard (``data.decontaminate``): the STS suite's test splits
    (with ``train.final_eval``) and the dev split, as sentence keys."""
    data = cfg.data
    sets = suite_sets(data.eval_data_dir, default_suite()) if cfg.train.final_eval else []
    dev = data.dev_file if data.dev_file is not None else stsb_split_path(data.eval_data_dir, "dev")
    sets.append(dev_set(dev, data.dev_format))
    return Guard(sets, data.decontaminate, data.decontaminate_dev)


def load_training_sets(cfg: RunConfig, tokenizer: Any = None, guard: Guard | None = None) -> dict[str, datasets.Dataset]:
    """The run's datasets by name (:meth:`~simcse_kit.config.sections.DataConfig.training_sets`:
    ``data.datasets``, or ``train_file`` as a list of one), each read by :func:`read_training_file`
    with its file, format, mode, sample limit and prompts.

    A pair file (format stsb/sick) gives in ``unsup`` its distinct sentences, scores unused (a
    domain's unlabelled text), and in ``scored`` its pairs and scores, checked against
    ``data.score_range`` by line. ``mix_ratio`` of a dataset is drawn from ``mix_file`` (the
    general corpus; the config allows it with ``train_file`` only). Local files are
    memory-mapped from their Arrow cache (:func:`~simcse_kit.data.readers.read_train_file`).
    With ``loss.distill`` the rows' teacher scores are read too (and required); with
    ``tokenizer``, each file's token table beside it (:mod:`simcse_kit.data.tokens`); with
    ``guard``, each file checked against the evaluation sets (:func:`guarded`)."""
    data = cfg.data
    sets = {}
    for spec in data.training_sets():
        tokens = None if tokenizer is None else Tokenization(tokenizer, cfg.model.max_seq_len, spec.prompts)
        dataset = read_training_file(cfg, spec.file, spec.format, spec.mode, spec.max_train_samples, tokens, guard)
        if data.mix_file is not None and data.mix_ratio > 0:
            general = read_training_file(cfg, data.mix_file, "auto", spec.mode, None, tokens, guard)
            dataset = mix_datasets(dataset, general, data.mix_ratio, cfg.train.seed)
        if spec.mode == "scored" and cfg.loss.score_weight > 0:
            check_graded_scores(dataset, files_label(spec.file), cfg.loss.score_weight)
        logger.info("dataset %r: %d examples (%s) from %s", spec.name, len(dataset), spec.mode, files_label(spec.file))
        sets[spec.name] = dataset
    return sets


def read_training_file(
    cfg: RunConfig,
    path: str | list[str],
    fmt: str,
    mode: str,
    max_samples: int | None,
    tokens: Tokenization | None = None,
    guard: Guard | None = None,
) -> datasets.Dataset:
    """One training file in ``mode``: with ``fmt`` stsb/sick a scored pair file (its pairs
    and scores in ``scored``, else its distinct sentences), otherwise by suffix
    (:func:`~simcse_kit.data.readers.load_train_dataset`); with ``tokens``, its token table;
    with ``guard``, checked against the evaluation sets (:func:`guarded`)."""
    return guarded(_read_training_file(cfg, path, fmt, mode, max_samples, tokens), guard, path)


def guarded(dataset: datasets.Dataset, guard: Guard | None, path: str | list[str]) -> datasets.Dataset:
    """``dataset`` (the file ``path``'s rows) through the contamination guard: its texts' keys
    recorded (read from beside its cache), and under ``data.decontaminate: drop`` the rows
    that share a sentence with a test set left out; a clean file's dataset is returned as it is."""
    if guard is None:
        return dataset
    columns = text_columns(dataset)
    # One file's rows are named by their line; shards' by the dataset's row.
    local = Path(path) if isinstance(path, str) and not is_hub(path) and Path(path).is_file() else None
    keep = guard.check(files_label(path), dataset_keys(dataset), lambda row: [dataset[row][c] for c in columns], local)
    return dataset if keep is None else dataset.select(keep)


def _read_training_file(
    cfg: RunConfig, path: str | list[str], fmt: str, mode: str, max_samples: int | None, tokens: Tokenization | None
) -> datasets.Dataset:
    data = cfg.data
    sentences = None
    if fmt != "auto" and not isinstance(path, str):  # the config refuses it: a pair format reads one file
        raise ValueError(f"format {fmt!r} reads one pair file, not a list of files {path}")
    if fmt != "auto" and mode == "scored":
        pairs = PAIR_READERS[fmt](path, bounds=data.score_range)
        dataset = scored_dataset(pairs.sentences1, pairs.sentences2, pairs.scores.tolist(), data.score_range)
        if tokens is not None:
            dataset = with_tokens(dataset, tokens, mode)
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        logger.info("loaded %d scored pairs (%s) from %s", len(dataset), fmt, path)
        return dataset
    if fmt != "auto":
        pairs = PAIR_READERS[fmt](path)
        sentences = list(dict.fromkeys(s for pair in zip(pairs.sentences1, pairs.sentences2, strict=True) for s in pair))
    return load_train_dataset(
        path,
        mode,
        max_samples,
        sentences=sentences,
        bad_rows=data.bad_rows,
        cache_dir=data.cache_dir,
        score_range=data.score_range,
        teacher_scores=cfg.loss.distill is not None,  # the rows' teacher scores are read (and required) only for it
        tokens=tokens,
    )


def training_texts(cfg: RunConfig, sets: dict[str, datasets.Dataset]) -> list[str]:
    """The distinct sentences a teacher or guide scores, in first-seen order: those of the view
    columns of every dataset of ``sets``, each in its own mode."""
    modes = {spec.name: spec.mode for spec in cfg.data.training_sets()}
    texts: dict[str, None] = {}
    for name, part in sets.items():
        negatives = negatives_of(part.column_names)
        columns = set(view_columns(modes[name], negatives))
        texts |= dict.fromkeys(teacher_texts({column: part[column] for column in columns}, modes[name], negatives))
    return list(texts)


def load_teacher(cfg: RunConfig, texts: list[str]) -> tuple[TeacherTargets, TeacherTable] | None:
    """With ``loss.teacher``: its vectors of every distinct training sentence ``texts``
    (:func:`training_texts`; cached) and the objective's teacher term; None without a teacher.

    The vectors come from :func:`sentence_table`. A wider teacher for ``embedding`` distillation is projected to
    the student's width by PCA (``loss.teacher_projection: pca``) or refused; ``aligned``
    maps it (at any width) into the student's own coordinates, from the untrained student's
    vectors of the same sentences.
    """
    loss = cfg.loss
    if loss.teacher is None:
        return None
    table, device = sentence_table(cfg, texts, loss.teacher, "loss.teacher")
    projection = embedding_projection(cfg, table, texts, device) if loss.teacher_loss == "embedding" else None
    what = (loss.teacher_loss, loss.teacher, len(texts), table.width, loss.teacher_weight)
    logger.info("teacher: %s distillation from %s (%d sentences, %d wide), weight %g", *what)
    targets = TeacherTargets(
        table.vectors,
        loss.teacher_loss,
        loss.teacher_temperature,
        loss.teacher_weight,
        projection,
        student_temperature=loss.teacher_student_temperature,
    )
    return targets, table


def sentence_table(cfg: RunConfig, texts: list[str], model: str, key: str) -> tuple[TeacherTable, str]:
    """``model``'s vectors of the distinct training sentences ``texts`` (cached; the teacher's and
    the guide's alike), with the device it ran on. Several processes: the main process (global
    rank 0) encodes (or reads the cache) first; then each node's local main process, which
    reads that cache where ``loss.teacher_cache_dir`` is on storage all nodes share, or encodes
    into its node's own; then the others, who read their node's cache. Each node encodes at
    most once, and with a shared cache only rank 0 does."""

    def load(device: str) -> TeacherTable:
        return load_teacher_table(
            model,
            texts,
            cache_dir=cfg.loss.teacher_cache_dir,
            device=device,
            show_progress=cfg.train.progress_bar,
            config_key=key,
        )

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return load(device), device
    state = PartialState()
    # Accelerate names a CPU process's device "cpu:0", which the encoders' --device refuses.
    device = "cpu" if state.device.type == "cpu" else str(state.device)
    table = None
    with state.main_process_first():
        if state.is_main_process:
            table = load(device)
    with state.local_main_process_first():
        if table is None:
            table = load(device)
    return table, device


def load_guide(cfg: RunConfig, texts: list[str], teacher: TeacherTable | None) -> tuple[GuideFilter, TeacherTable] | None:
    """With ``loss.guide``: its vectors of every distinct training sentence ``texts`` (cached as
    the teacher's; ``teacher``: the teacher's own table, not encoded again) and the objective's
    filter of negatives; None without a guide."""
    loss = cfg.loss
    if loss.guide is None:
        return None
    if loss.guide == GUIDE_IS_TEACHER:
        if teacher is None:  # LossConfig.check refuses it; a config built in code may not have run it
            raise ConfigError("config key 'loss.guide' = 'teacher': needs loss.teacher")
        table = teacher
    else:
        table = sentence_table(cfg, texts, loss.guide, "loss.guide")[0]
    logger.info(
        "guide: %s vets the negatives (%d sentences, %d wide), margin %g (%s)",
        loss.guide, table.vectors.shape[0], table.width, loss.guide_margin, loss.guide_margin_strategy,
    )  # fmt: skip
    return GuideFilter(table.vectors, loss.guide_margin, loss.guide_margin_strategy), table


def embedding_projection(cfg: RunConfig, table: TeacherTable, texts: list[str], device: str) -> tuple[torch.Tensor, ...] | None:
    """How ``embedding`` distillation maps the teacher's vectors onto the student's
    (``loss.teacher_projection``); None where the widths agree and no alignment is asked."""
    loss = cfg.loss
    if loss.teacher_projection == "aligned":
        # Into the student's own coordinates, at any width: the untrained student's vectors of
        # the same sentences (its exported pooling, in fp32; deterministic, so a resume agrees).
        student = load_encoder(
            cfg.model.name_or_path,
            pooler=cfg.model.pooler,
            max_seq_len=cfg.model.max_seq_len,
            device=device,
            trust_remote_code=cfg.model.trust_remote_code,
        )
        return aligned_projection(table.vectors, student.encode(texts))
    width = AutoConfig.from_pretrained(
        resolve_model_path(cfg.model.name_or_path), trust_remote_code=cfg.model.trust_remote_code
    ).hidden_size
    if table.width == width:
        return None
    if loss.teacher_projection == "none":
        raise ConfigError(
            f"config key 'loss.teacher' = {loss.teacher!r}: its vectors are {table.width} wide and the student's {width}; "
            "embedding distillation needs a projection (loss.teacher_projection: pca or aligned) "
            "or use loss.teacher_loss: similarity"
        )
    return pca_projection(table.vectors, width)


def load_checked_tokenizer(cfg: RunConfig) -> Any:
    """The model's tokenizer, after checking that the model folder loads and takes the
    configured lengths; raises ConfigError naming the key instead of a library trace."""
    path = resolve_model_path(cfg.model.name_or_path)
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1  # a hub id is "org/name"
    if looks_local and not Path(path).expanduser().is_dir():
        raise ConfigError(f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}: no such folder")
    trust = cfg.model.trust_remote_code
    # Truncated weights, a corrupt JSON file, custom code not trusted: named before the run folder exists.
    check_weights(path, trust)
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ConfigError(f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}: not a model folder (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    except (OSError, ValueError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        key = f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}"
        raise ConfigError(f"{key}: cannot load a model there ({reason})") from None
    check_tokenizer_files(path)  # without them transformers builds a 5-token placeholder vocabulary
    check_tokenizer(tokenizer, getattr(hf_config, "vocab_size", None), path)
    tokenizer = prepare_tokenizer(tokenizer, hf_config, cfg.model.append_eos, cfg.model.pooler, path)  # a decoder's pad and EOS
    limit = max_tokens(hf_config)  # RoBERTa-style offset positions take two fewer tokens
    # A max_length below the special tokens' count is not applied at all: the tokenizer
    # logs an error and returns the whole sentence (--max-seq-len 1 trained on full
    # sentences); exactly that count leaves no word. So: at least one word's room.
    least = tokenizer.num_special_tokens_to_add() + 1
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if value < least:
            raise ConfigError(
                f"config key 'model.{key}' = {value}: must be at least {least} "
                f"(the tokenizer adds {least - 1} special tokens; below that it would not truncate at all)"
            )
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if isinstance(limit, int) and value > limit:
            raise ConfigError(f"config key 'model.{key}' = {value}: the model takes at most {limit} positions")
    hidden, dims = getattr(hf_config, "hidden_size", None), cfg.loss.matryoshka_dims or []
    if isinstance(hidden, int) and any(d > hidden for d in dims):
        raise ConfigError(f"config key 'loss.matryoshka_dims' = {dims}: the model's embeddings have {hidden} dimensions")
    if isinstance(hidden, int) and cfg.model.lora_r > hidden:
        # A rank above the layers' width adds nothing but memory: 1e9 asked the allocator for 128 GB.
        raise ConfigError(
            f"config key 'model.lora_r' = {cfg.model.lora_r}: must be at most {hidden}, the width of the model at "
            f"{cfg.model.name_or_path} (a higher rank adds no capacity, only memory)"
        )
    return tokenizer
