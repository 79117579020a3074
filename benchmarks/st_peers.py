"""Sentence-transformers peers of a recipe (``quality.py``'s ``st-*`` rows): its data, budget, dev selection
(step 0 included) and final evaluator, with ``MultipleNegativesRankingLoss``, ``DenoisingAutoEncoderLoss``
(TSDAE; words split on whitespace), ``ContrastiveTensionLossInBatchNegatives``, ``MSELoss`` from a teacher or
``GISTEmbedLoss`` with the recipe's ``loss.guide`` (its defaults otherwise: anchor-anchor and positive-positive terms on),
``CoSENTLoss`` or ``AnglELoss`` on a scored recipe's pairs at its ``loss.score_scale``;
with ``model.lora_r`` > 0 the LoRA adapter the kit trains (:func:`add_lora`, the kit's own ``LoraConfig``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainerCallback

LOSSES = ("mnrl", "tsdae", "ct", "mse", "gist", "cosent", "angle")  # mse: from loss.teacher; gist: with loss.guide
SCORE_PEERS = ("cosent", "angle")  # data.mode scored: the kit's scores (already mapped onto [0, 1]) as the labels
TSDAE_DELETION = 0.6  # TSDAE's best deletion ratio (Wang et al. 2021, Table 6)
EVAL_BATCH_SIZE = 128  # as simcse_kit.training.wiring.run, so dev and test scores batch alike

logger = logging.getLogger("st_peers")


def delete_words(sentence: str, rng: random.Random, ratio: float = TSDAE_DELETION) -> str:
    """TSDAE's noise: delete each word with probability ``ratio``, keeping at least one."""
    words = sentence.split()
    if not words:
        return sentence
    kept = [word for word in words if rng.random() > ratio]
    return " ".join(kept) if kept else rng.choice(words)


def peer_dataset(data: datasets.Dataset, loss: str, mode: str, seed: int) -> datasets.Dataset:
    """The kit's training set in the columns (and column order) the loss reads."""
    if mode == "scored" or loss in SCORE_PEERS:
        if mode != "scored" or loss not in SCORE_PEERS:
            raise ValueError(f"loss {loss!r} with mode {mode!r}: the score losses {SCORE_PEERS} train on mode scored only")
        pairs = data.rename_columns({"sent0": "sentence1", "sent1": "sentence2"})
        return pairs.select_columns(["sentence1", "sentence2", "score"])
    if mode == "hardneg":
        if loss not in ("mnrl", "gist"):
            raise ValueError(f"loss {loss!r} trains on unlabelled sentences; the recipe's mode is hardneg")
        return data.rename_columns({"sent0": "anchor", "sent1": "positive", "hard_neg": "negative"})
    if mode != "unsup":
        raise ValueError(f"no sentence-transformers peer for mode {mode!r}")
    sentences = data["sent0"]
    if loss == "mnrl":
        return datasets.Dataset.from_dict({"anchor": sentences, "positive": sentences})
    if loss == "tsdae":
        # Drawn once, in order, from a seeded generator: the same noise for the same seed.
        rng = random.Random(seed)
        return datasets.Dataset.from_dict({"noisy": [delete_words(s, rng) for s in sentences], "original": sentences})
    if loss == "ct":
        return datasets.Dataset.from_dict({"sentence": sentences})
    raise ValueError(f"unknown loss {loss!r}; choose from {LOSSES}")


def distillation_dataset(cfg: Any, sets: Mapping[str, datasets.Dataset], width: int) -> datasets.Dataset:
    """sentence-transformers' model-distillation data: the teacher's vectors of the distinct
    sentences of every dataset (each read in its own mode, as the kit's teacher reads them), reduced
    to the student's width by PCA where they differ."""
    from simcse_kit.training.objective.teacher import load_teacher_table, pca_projection
    from simcse_kit.training.wiring.inputs import training_texts

    if cfg.loss.teacher is None:
        raise ValueError("the mse peer needs a recipe with loss.teacher")
    texts = training_texts(cfg, dict(sets))
    table = load_teacher_table(cfg.loss.teacher, texts, cache_dir=cfg.loss.teacher_cache_dir, show_progress=False)
    vectors = table.vectors
    if table.width != width:
        mean, components = pca_projection(vectors, width)
        vectors = (vectors - mean) @ components
    vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return datasets.Dataset.from_dict({"sentence": texts, "label": vectors.tolist()})


def peer_data(cfg: Any, loss: str, seed: int, width: int) -> datasets.Dataset | datasets.DatasetDict:
    """The run's training data for the peer: one dataset, or a ``DatasetDict`` of a mixture's
    datasets (each in its own mode's columns) that the trainer samples as the recipe's
    ``data.sampling`` says (``ST_SAMPLINGS``: the kit's and the trainer's share those names).
    Distillation reads one set of every dataset's sentences."""
    from simcse_kit.training.wiring.inputs import load_training_sets

    sets = load_training_sets(cfg)
    if loss == "mse":
        return distillation_dataset(cfg, sets, width)
    modes = {spec.name: spec.mode for spec in cfg.data.training_sets()}
    peers = {name: peer_dataset(data, loss, modes[name], seed) for name, data in sets.items()}
    if len(peers) == 1:
        return next(iter(peers.values()))
    if cfg.data.sampling not in ST_SAMPLINGS:
        raise ValueError(f"the peer samples a mixture by {ST_SAMPLINGS}; the recipe asks {cfg.data.sampling!r}")
    return datasets.DatasetDict(peers)


def peer_loss(loss: str, model: Any, loss_cfg: Any) -> nn.Module:
    """The sentence-transformers loss, at the recipe's temperature (and guide: ``loss_cfg``, its loss section)."""
    from sentence_transformers.sentence_transformer.losses import (
        ContrastiveTensionLossInBatchNegatives,
        DenoisingAutoEncoderLoss,
        MultipleNegativesRankingLoss,
    )

    temperature = loss_cfg.temperature
    if loss == "mnrl":
        return MultipleNegativesRankingLoss(model, scale=1.0 / temperature)
    if loss == "tsdae":
        # The decoder is loaded from the encoder's folder (its config's name_or_path), which
        # for the bundled model is a local folder: no download.
        logger.info("TSDAE decoder from %s", model.transformers_model.config.name_or_path)
        return DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True)
    if loss == "ct":
        return ContrastiveTensionLossInBatchNegatives(model, scale=1.0 / temperature)
    if loss == "mse":
        from sentence_transformers.sentence_transformer.losses import MSELoss

        return MSELoss(model)
    if loss == "cosent":
        from sentence_transformers.sentence_transformer.losses import CoSENTLoss

        return CoSENTLoss(model, scale=loss_cfg.score_scale)
    if loss == "angle":
        from sentence_transformers.sentence_transformer.losses import AnglELoss

        return AnglELoss(model, scale=loss_cfg.score_scale)
    if loss == "gist":
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss

        if loss_cfg.guide is None:
            raise ValueError("the gist peer needs a recipe with loss.guide")
        guide = SentenceTransformer(loss_cfg.guide, device=str(model.device))
        margin = {"margin": loss_cfg.guide_margin, "margin_strategy": loss_cfg.guide_margin_strategy}
        return GISTEmbedLoss(model, guide, temperature=temperature, **margin)
    raise ValueError(f"unknown loss {loss!r}; choose from {LOSSES}")


def add_lora(model: Any, cfg: Any) -> None:
    """``model.add_adapter`` (sentence-transformers) with the ``LoraConfig`` the kit builds from
    ``cfg`` (a ``ModelConfig``) for this family: the same rank, alpha, dropout and target modules.

    transformers 5.24's ``add_adapter`` refuses a peft older than 0.22, and 0.21.2 is peft's latest
    release: there the adapter is injected by peft's ``inject_adapter_in_model``, the call
    ``add_adapter`` makes (the same layers, the base frozen; tests/test_decoders.py)."""
    from peft import inject_adapter_in_model

    from simcse_kit.model.modeling import lora_config

    config = lora_config(model.transformers_model, cfg)
    try:
        model.add_adapter(config)
    except ValueError as exc:
        if "version of PEFT" not in str(exc):
            raise
        logger.warning("add_adapter: %s; injecting the adapter with peft's inject_adapter_in_model", exc)
        inject_adapter_in_model(config, model.transformers_model)


class DevSelection(TrainerCallback):
    """Dev score at step 0 (optional), every ``eval_steps`` and at the end."""

    def __init__(self, score: Callable[[], float], model: nn.Module, eval_steps: int, at_start: bool, label: str) -> None:
        self.score, self.model, self.eval_steps, self.at_start, self.label = score, model, eval_steps, at_start, label
        self.best, self.best_step = -1e9, -1
        self.state: dict[str, torch.Tensor] | None = None
        self.evals: list[tuple[int, float]] = []
        self.eval_seconds = 0.0  # excluded from the training time, as simcse-kit's loop does

    def evaluate(self, step: int) -> None:
        tick = time.perf_counter()
        score = self.score()
        self.eval_seconds += time.perf_counter() - tick
        self.evals.append((step, score))
        logger.info("%s step %d: dev %.2f", self.label, step, score)
        if score > self.best:  # ties keep the earlier step, as simcse-kit's loop does
            self.best, self.best_step = score, step
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.at_start:
            self.evaluate(0)  # the untouched model is a candidate, as with eval_at_start

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.eval_steps and state.global_step % self.eval_steps == 0 and state.global_step < state.max_steps:
            self.evaluate(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.evaluate(state.global_step)


def encoder(model: Any, eval_len: int, train_len: int) -> Callable[[list[str]], torch.Tensor]:
    """``encode(sentences)`` at the evaluation length, the model left at ``train_len`` after."""

    def encode(sentences: list[str]) -> torch.Tensor:
        model.max_seq_length = eval_len
        try:
            vectors = model.encode(sentences, batch_size=EVAL_BATCH_SIZE, convert_to_tensor=True, show_progress_bar=False)
            return vectors.float().cpu()
        finally:
            model.max_seq_length = train_len

    return encode


def peer_device() -> str:
    """Where the peers train and encode: the GPU when there is one (as the kit's runs)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_precision(precision: str) -> str:
    """``auto``: bf16 on a GPU that computes it, else fp32 (sentence-transformers' default)."""
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def st_train(
    cfg: Any, seed: int, loss: str, precision: str, retrieval: Sequence[str] = (), dev_only: bool = False
) -> dict[str, Any]:
    """One sentence-transformers run of ``loss`` on ``cfg``'s data, budget and dev selection; a trained best model's
    weights are kept (:data:`BEST_STATE` in ``kept_dir``) so that scoring it later (:func:`rescore_transfer`) needs no
    retraining."""
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import AutoConfig

    from simcse_kit.evaluation import DevEvaluator, STSEvaluator
    from simcse_kit.model.modeling import resolve_model_path

    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))  # the kit's runs mix with their seed
    path = resolve_model_path(cfg.model.name_or_path)
    data = peer_data(cfg, loss, seed, AutoConfig.from_pretrained(path).hidden_size)
    dev = DevEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=cfg.data.dev_file, fmt=cfg.data.dev_format)
    final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    torch.manual_seed(seed)
    device = peer_device()
    model = SentenceTransformer(path, device=device)
    train_len, eval_len = cfg.model.max_seq_len, cfg.model.eval_max_seq_len
    model.max_seq_length = train_len
    if cfg.model.lora_r > 0:
        add_lora(model, cfg.model)
    criterion = peer_loss(loss, model, cfg.loss)

    encode = encoder(model, eval_len, train_len)
    label = f"st-{loss} seed {seed}"
    selection = DevSelection(lambda: dev(encode)[dev.primary_metric], model, cfg.train.eval_steps, cfg.train.eval_at_start, label)
    train_args = SentenceTransformerTrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="st-peer-"),
        per_device_train_batch_size=cfg.train.batch_size,
        num_train_epochs=cfg.train.num_epochs,
        max_steps=cfg.train.max_steps if cfg.train.max_steps is not None else -1,
        learning_rate=cfg.train.learning_rate,
        bf16=precision == "bf16",
        weight_decay=cfg.train.weight_decay,
        # A float below 1 is a share of the steps (transformers v5's replacement for warmup_ratio).
        warmup_steps=float(cfg.train.warmup_ratio),
        max_grad_norm=cfg.train.max_grad_norm or 0.0,  # 0: no clipping, as the kit (HF's default would clip at 1.0)
        use_cpu=device == "cpu",
        save_strategy="no",
        report_to="none",
        logging_steps=10**9,
        disable_tqdm=True,
        dataloader_drop_last=True,  # as the kit's loader: a short last batch has too few negatives
        seed=seed,
        **({"multi_dataset_batch_sampler": cfg.data.sampling} if isinstance(data, datasets.DatasetDict) else {}),
    )
    trainer = SentenceTransformerTrainer(model=model, args=train_args, train_dataset=data, loss=criterion, callbacks=[selection])
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start - selection.eval_seconds
    if selection.state is None:
        raise RuntimeError(f"{label}: no dev evaluation ran")
    # With bf16=True the trainer leaves its autocast wrapped around the model's forward, so
    # the table is scored on a fresh fp32 copy holding the best weights, as simcse-kit
    # scores its best_model/ (fp32, loaded afresh).
    sts: dict[str, float] = {}
    scored: dict[str, float] = {}
    if dev_only:
        pass
    elif selection.best_step == 0:
        logger.warning("%s: no checkpoint beat the untouched model on dev: the best model IS the base model", label)
        # The same weights: the same tables.
        sts = base_table(str(path), str(cfg.data.eval_data_dir), eval_len, device)
        scored = base_retrieval(str(path), tuple(retrieval), eval_len, device)
        # Its transfer scores are the untouched model's, which the table scores once beside its rows
        # (benchmarks.quality fills them in): rescoring them here costs ~15 min a seed on one thread.
    else:
        kept = Path(tempfile.mkdtemp())  # run_st moves both files beside metrics.json
        save_file({k: v.contiguous() for k, v in selection.state.items()}, kept / BEST_STATE)
        best = peer_best(cfg, kept / BEST_STATE, device)
        sts = final_sts(encoder(best, eval_len, eval_len))
        save_sts_pairs(kept / PREDICTIONS, final_sts)
        scored = score_tasks(best, retrieval, eval_len, device)
    return {
        "loss": loss,
        "best_step": selection.best_step,
        "best_stsb_dev": selection.best,
        "dev_file": str(dev.path),
        "evals": selection.evals,
        "train_seconds": train_seconds,
        "device": device,
        "sts": sts,
        "retrieval": scored,
    } | ({"kept_dir": str(kept)} if not dev_only and selection.best_step != 0 else {})


def peer_best(cfg: Any, state_file: Path, device: str) -> Any:
    """A fresh fp32 copy of ``cfg``'s model (with its LoRA adapter, if any) holding a peer run's kept best weights."""
    from sentence_transformers import SentenceTransformer

    from simcse_kit.model.modeling import resolve_model_path

    best = SentenceTransformer(resolve_model_path(cfg.model.name_or_path), device=device)
    if cfg.model.lora_r > 0:
        add_lora(best, cfg.model)
    best.load_state_dict(load_file(state_file, device=device))
    return best


def rescore_transfer(cfg: Any, folder: Path, kfold: int) -> dict[str, float]:
    """The SentEval transfer row of the best model a finished peer run kept in ``folder`` (no retraining)."""
    eval_len = cfg.model.eval_max_seq_len
    best = peer_best(cfg, folder / BEST_STATE, peer_device())
    return transfer_row(encoder(best, eval_len, eval_len), str(cfg.data.eval_data_dir), kfold)


def transfer_folds(metrics: Mapping[str, Any]) -> int:
    """The folds a finished peer run's transfer scores were made with (0: none); runs made before the scores were
    kept apart from the training settings name them in their settings. Scores made before the probe normalised every
    vector would stand (a peer model ends with the base's ``Normalize``), but not those batched alphabetically
    (:data:`TRANSFER_BATCHES`): those count as none."""
    if not metrics.get("transfer") or metrics.get("transfer_batches") != TRANSFER_BATCHES:
        return 0
    return int(metrics.get("transfer_kfold", metrics.get("settings", {}).get("transfer_kfold", 0)))


def transfer_owed(metrics: Mapping[str, Any], transfer: int, dev_only: bool) -> int:
    """The transfer folds a finished peer run still has to be scored at (0: none): asked for, not a dev-only run, not
    a seed that kept the untouched model (it takes the base's scores), and not scored at them yet."""
    if not transfer or dev_only or metrics.get("best_step") == 0 or transfer_folds(metrics) == transfer:
        return 0
    return transfer


def training_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """A peer run's settings without the transfer folds, which older runs kept among them: the folds change what
    is scored, not what is trained."""
    return {k: v for k, v in (settings or {}).items() if k != "transfer_kfold"}


ST_SAMPLINGS = ("proportional", "round_robin")  # the samplings the trainer has under the kit's names
PREDICTIONS = "predictions.npz"  # a run's per-pair cosines of the STS tasks, beside its metrics.json
BEST_STATE = "best_state.safetensors"  # a trained peer's best weights, beside its metrics.json
MADE_AT = "made_at.json"  # the commit, dirty flag and CPU a run was made at, beside its metrics.json (a reused run keeps its own)


def pending_stamp(folder: Path) -> Path:
    """Where a run's stamp waits while the run is made: beside its folder (the kit refuses to train into a folder
    that exists), from the run's start, so a worker killed between training and its stamp loses nothing."""
    return folder.with_name(f"{folder.name}.{MADE_AT}")


def stamp_start(folder: Path) -> None:
    """Record the commit (and dirty flag) the run about to be made in ``folder`` starts at, and the CPU it runs on, so
    a record reusing it later, or finishing its table on another machine, can say so (:func:`settle_stamp` files it)."""
    from benchmarks._common import cpu_flags, provenance
    from simcse_kit.files import write_json_atomic

    stamp = provenance(None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(pending_stamp(folder), {"commit": stamp["commit"], "dirty": stamp["dirty"], "cpu": cpu_flags()[0]})


def settle_stamp(folder: Path) -> None:
    """Move the stamp :func:`stamp_start` wrote into ``folder`` once the run's metrics.json exists, also on the
    resume of a run whose worker was killed before it got there. Only a metrics.json written after the stamp (not an
    older run's) takes it, and never over a stamp already there: a run is never stamped with a later commit."""
    pending, done = pending_stamp(folder), folder / "metrics.json"
    if pending.is_file() and done.is_file() and not (folder / MADE_AT).is_file():
        if done.stat().st_mtime_ns >= pending.stat().st_mtime_ns:
            os.replace(pending, folder / MADE_AT)


def make_once(folder: Path, train: Callable[[], object], check: Callable[[], object] | None = None) -> None:
    """Make the run in ``folder`` with ``train``, stamped as it starts (:func:`stamp_start`), unless it finished
    there before (its metrics.json exists): then ``check``, if given, vets it for reuse and it keeps its own stamp.
    A run stopped part-way is removed first, since the kit refuses to train into a folder that exists."""
    if (folder / "metrics.json").is_file():
        if check is not None:
            check()
    else:
        if folder.is_dir():
            logger.warning("removing the unfinished run in %s", folder)
            shutil.rmtree(folder)
        stamp_start(folder)
        train()
    settle_stamp(folder)  # also a run resumed after its worker was killed before its final table


def save_sts_pairs(path: Path, evaluator: Any) -> None:
    """The per-pair cosines (float16) and gold scores behind each task's figure of the last call of an
    ``STSEvaluator`` (``main_split``: STS12-16 all subsets concatenated), for ``benchmarks.stats``'s intervals."""
    import numpy as np

    from simcse_kit.evaluation.sts import main_split

    arrays: dict[str, Any] = {}
    for task, spec in evaluator.specs.items():
        cosines, gold = main_split(spec, evaluator.scored[task])
        arrays |= {f"cos/{task}": np.asarray(cosines, dtype=np.float16), f"gold/{task}": np.asarray(gold, dtype=np.float32)}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


@functools.lru_cache(maxsize=4)
def base_table(path: str, eval_data_dir: str, eval_len: int, device: str = "cpu") -> dict[str, float]:
    """The untouched model's STS table, scored once per process."""
    from sentence_transformers import SentenceTransformer

    from simcse_kit.evaluation import STSEvaluator

    model = SentenceTransformer(path, device=device)
    return STSEvaluator(eval_data_dir, batch_size=EVAL_BATCH_SIZE)(encoder(model, eval_len, eval_len))


def score_tasks(model: Any, tasks: Sequence[str], eval_len: int, device: str) -> dict[str, float]:
    """The retrieval metrics x 100 of a sentence-transformers model on BEIR folders
    (``<task>`` = nDCG@10, ``<task>/<metric>``, ``avg``); empty without tasks."""
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator

    if not tasks:
        return {}
    return RetrievalEvaluator(tasks, batch_size=EVAL_BATCH_SIZE, device=device)(encoder(model, eval_len, eval_len))


# Every row's probe on unit vectors (TransferEvaluator's normalize): the caches and records say which.
TRANSFER_NORMALIZE = True
# The probe's sentences batched longest first, as every evaluator's (simcse_kit.evaluation.encoding); before 2026-12
# alphabetically, which changes each vector in its last bits and can flip a prediction. A cache without this value
# holds such scores and is scored again; records say which.
TRANSFER_BATCHES = "longest_first"


def transfer_row(encode: Callable[[list[str]], Any], data_dir: str, kfold: int) -> dict[str, float]:
    """The SentEval transfer tasks of ``encode`` (``simcse-kit transfer``'s probe, ``kfold`` folds, on unit vectors:
    :data:`TRANSFER_NORMALIZE`) under ``transfer:<task>``; the tables read ``transfer:avg``, the mean accuracy of
    the seven."""
    from simcse_kit.evaluation import TransferEvaluator

    evaluator = TransferEvaluator(data_dir, kfold=kfold, normalize=TRANSFER_NORMALIZE)
    return {f"transfer:{k}": float(v) for k, v in evaluator(encode).items()}


@functools.lru_cache(maxsize=4)
def base_retrieval(path: str, tasks: tuple[str, ...], eval_len: int, device: str) -> dict[str, float]:
    """:func:`score_tasks` of the untouched model, once per process (as :func:`base_table`)."""
    from sentence_transformers import SentenceTransformer

    return score_tasks(SentenceTransformer(path, device=device), tasks, eval_len, device) if tasks else {}


def run_settings(cfg: Any, loss: str, precision: str, retrieval: Sequence[str] = (), dev_only: bool = False) -> dict[str, Any]:
    """What a peer run's training and its tables depend on (the transfer folds are not: :func:`run_st`)."""
    data, train = cfg.data, cfg.train
    extra: dict[str, Any] = {"retrieval": [Path(t).name for t in retrieval]} if retrieval else {}
    if cfg.model.lora_r > 0:  # only then: the settings of the full fine-tuning runs kept before stay equal
        extra |= {k: getattr(cfg.model, k) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")}
    return {
        **extra,
        **({"dev_only": True} if dev_only else {}),
        "loss": loss,
        "precision": resolve_precision(precision),
        "model": cfg.model.name_or_path,
        "max_seq_len": cfg.model.max_seq_len,
        "eval_max_seq_len": cfg.model.eval_max_seq_len,
        "temperature": cfg.loss.temperature,
        **({"teacher": cfg.loss.teacher} if loss == "mse" else {}),
        **({k: getattr(cfg.loss, k) for k in ("guide", "guide_margin", "guide_margin_strategy")} if loss == "gist" else {}),
        **({"score_scale": cfg.loss.score_scale, "score_range": data.score_range} if loss in SCORE_PEERS else {}),
        **{k: getattr(data, k) for k in ("mode", "train_file", "train_format", "max_train_samples", "mix_file", "mix_ratio")},
        **{k: getattr(data, k) for k in ("eval_data_dir", "dev_file", "dev_format")},
        # Only for a mixture: the settings of the one-file runs kept before stay equal.
        **({"datasets": {s.name: str(s.file) for s in data.datasets}, "sampling": data.sampling} if data.datasets else {}),
        **{k: getattr(train, k) for k in ("batch_size", "num_epochs", "max_steps", "learning_rate", "weight_decay")},
        **{k: getattr(train, k) for k in ("warmup_ratio", "max_grad_norm", "eval_steps", "eval_at_start")},
    }


def run_st(
    cfg: Any,
    seeds: list[int],
    loss: str,
    precision: str,
    out: Path,
    settings: dict[str, Any] | None = None,
    retrieval: Sequence[str] = (),
    dev_only: bool = False,
    transfer: int = 0,
) -> dict[int, dict[str, float]]:
    """:func:`st_train` per seed into ``out/seed-N/metrics.json`` (reused when its ``settings`` match); per seed its
    table. ``transfer``: the SentEval transfer tasks' folds (0: not scored), scored on the run's kept best model, so a
    finished run asked for them later is scored, not retrained; a seed that kept the untouched model is not scored
    (``quality.fill_kept_base_transfer`` gives it the base's scores)."""
    from simcse_kit.files import write_json_atomic

    settings = run_settings(cfg, loss, precision, retrieval, dev_only) if settings is None else settings
    precision = resolve_precision(precision)
    per_seed = {}
    for seed in seeds:
        folder = out / f"seed-{seed}"
        done = folder / "metrics.json"
        metrics = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {}
        # A run made before the best weights were kept cannot be scored anew: it is trained again.
        scorable = not transfer_owed(metrics, transfer, dev_only) or (folder / BEST_STATE).is_file()
        if training_settings(metrics.get("settings")) == settings and scorable:
            logger.info("reusing the finished run in %s", folder)
        else:
            stamp_start(folder)
            metrics = st_train(cfg, seed, loss, precision, retrieval, dev_only) | {"settings": settings}
            for name in (PREDICTIONS, BEST_STATE, MADE_AT):  # an older run's, if any
                (folder / name).unlink(missing_ok=True)
            if kept := metrics.pop("kept_dir", None):
                folder.mkdir(parents=True, exist_ok=True)
                for name in (PREDICTIONS, BEST_STATE):  # a move: the temporary folder may be on another device
                    shutil.move(Path(kept) / name, folder / name)
            write_json_atomic(done, metrics)
        settle_stamp(folder)
        if owed := transfer_owed(metrics, transfer, dev_only):
            metrics |= {
                "transfer": rescore_transfer(cfg, folder, owed),
                "transfer_kfold": owed,
                "transfer_batches": TRANSFER_BATCHES,
            }
            write_json_atomic(done, metrics)
        curve = {"evals": [{"step": step, "stsb_dev": score} for step, score in metrics["evals"]]}
        scored = metrics.get("retrieval") or {}
        row = retrieval_row(scored, retrieval) if retrieval and scored else {}
        per_seed[seed] = {
            **metrics["sts"],
            "best_stsb_dev": metrics["best_stsb_dev"],
            "best_step": metrics["best_step"],
            "train_seconds": metrics["train_seconds"],
            **dev_curve(curve),
            **row,
            **(metrics["transfer"] if transfer and transfer_folds(metrics) == transfer else {}),
        }
    return per_seed


def retrieval_row(results: Mapping[str, float], tasks: Sequence[str]) -> dict[str, float]:
    """nDCG@10 x 100 of each task under ``retrieval:<task>`` and their mean under
    ``retrieval:avg`` (the keys the tables read), every metric under ``retrieval:<task>/<metric>``."""
    names = [Path(t).name for t in tasks]
    row = {f"retrieval:{k}": float(v) for k, v in results.items() if k.split("/")[0] in names}
    row["retrieval:avg"] = sum(row[f"retrieval:{n}"] for n in names) / len(names)
    return row


def dev_curve(metrics: dict[str, Any]) -> dict[str, float]:
    """From a run's dev evaluations (``metrics["evals"]``, simcse-kit's form): the best
    score of a trained checkpoint (step > 0: what training did, whether or not selection
    kept the base model) and the score at the end of training."""
    from simcse_kit.training.engine.selection import dev_selection

    key = dev_selection(metrics).metric  # the run's dev metric (STS-B dev where unnamed)
    trained = [e for e in metrics["evals"] if e["step"] > 0]
    if not trained:
        return {}
    return {"dev_trained": max(e[key] for e in trained), "dev_end": trained[-1][key]}
