"""Sentence-transformers peers of a simcse-kit recipe: same data, budget and dev selection.

What it measures: the 7-task STS table (and the dev score that selected the checkpoint)
of the default model trained by ``SentenceTransformerTrainer`` with one of three
sentence-transformers losses, on exactly what a simcse-kit recipe trains on, so a kit
row and a peer row differ only in the method.

Method: the recipe (a ``RunConfig``) gives everything. The training set is the kit's own
(``simcse_kit.run.load_training_data``: column ``sent0`` for unsup; ``sent0, sent1,
hard_neg`` for hardneg); batch size, epochs / ``max_steps``, learning rate (linear decay,
the recipe's warm-up, no gradient clipping, as simcse-kit), training length
``model.max_seq_len``; the dev split of the recipe (``data.dev_file``, default STS-B dev)
scored at step 0 when ``train.eval_at_start`` (the untouched model may win, as with the
kit's trainer), every ``train.eval_steps`` and at the end, best weights kept; the final
table by ``simcse_kit.evaluation.STSEvaluator`` at ``model.eval_max_seq_len``. The
model's pooling and normalisation stay as they ship. Losses (``--losses``):

* ``mnrl``: ``MultipleNegativesRankingLoss(scale=1/temperature)`` on ``(anchor,
  positive)`` = the same sentence twice (dropout makes the views: sentence-transformers'
  documented unsupervised SimCSE), or ``(anchor, positive, negative)`` for hardneg;
* ``tsdae``: ``DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True)`` on
  ``(noisy, original)`` with TSDAE's deletion noise (each word deleted with p = 0.6, at
  least one kept). Deviation from TSDAE: nltk is not installed (and its tokenizer data
  cannot be fetched offline), so words are split on whitespace and joined with spaces
  instead of ``word_tokenize`` / ``TreebankWordDetokenizer`` (the SentEval files are
  Moses-tokenised already, so the words are nearly the same). The noise is drawn once,
  before training, from ``random.Random(seed)``: a seed's run is reproducible. The
  decoder is built from the encoder's own local folder (offline);
* ``ct``: ``ContrastiveTensionLossInBatchNegatives(model, scale=1/temperature)``: the
  loss encodes each sentence once with the model and once with a copy of it, so its
  input is one text column (sentence-transformers' documented input; a second copy
  of the column would be tokenised and ignored).

Training time excludes the dev evaluations, as simcse-kit's loop does. Each seed runs
into ``OUTPUT/seed-N/metrics.json`` with the settings it ran with; a finished seed whose
settings match is reused, so a table can be built over several sessions.
``benchmarks/results.py`` and ``benchmarks/domain.py`` use :func:`run_st`; run alone,
this script trains the peers of one recipe and prints their table.

Usage::

    # the three peers of the SICK domain recipe, 3 seeds (an estimate: 3-6 min per run on 2 quiet cores)
    .venv/bin/python -m benchmarks.st_peers train/domain/sick.yaml --output-dir runs/benchmarks/st_peers
    # a smoke run
    .venv/bin/python -m benchmarks.st_peers train/domain/sick.yaml --losses tsdae --seeds 1 --steps 2 --eval-steps 1
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import random
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn
from transformers import TrainerCallback

from benchmarks._common import REPO, setup_run

LOSSES = ("mnrl", "tsdae", "ct", "mse")  # mse: MSELoss distillation from the recipe's loss.teacher
TSDAE_DELETION = 0.6  # TSDAE's best deletion ratio (Wang et al. 2021, Table 6)
EVAL_BATCH_SIZE = 128  # as simcse_kit.run, so dev and test scores batch alike

logger = logging.getLogger("st_peers")


def delete_words(sentence: str, rng: random.Random, ratio: float = TSDAE_DELETION) -> str:
    """TSDAE's noise: delete each word with probability ``ratio``, keeping at least one.

    Words are whitespace-separated (no nltk here); the kept ones are joined with spaces.
    """
    words = sentence.split()
    if not words:
        return sentence
    kept = [word for word in words if rng.random() > ratio]
    return " ".join(kept) if kept else rng.choice(words)


def peer_dataset(data: datasets.Dataset, loss: str, mode: str, seed: int) -> datasets.Dataset:
    """The kit's training set in the columns (and column order) the loss reads."""
    if mode == "hardneg":
        if loss != "mnrl":
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


def distillation_dataset(cfg: Any, data: datasets.Dataset, width: int) -> datasets.Dataset:
    """sentence-transformers' model-distillation data: each sentence with the teacher's
    vector as its label, reduced by PCA to the student's ``width`` when the teacher is wider
    (its documented recipe for a smaller student), L2-normalised like the student's output.
    The teacher's vectors come from the kit's cache (:mod:`simcse_kit.teacher`): the same
    vectors the kit's distillation rows learn from."""
    from simcse_kit.teacher import load_teacher_table, pca_projection, teacher_texts

    if cfg.loss.teacher is None or cfg.data.mode != "unsup":
        raise ValueError("the mse peer needs an unsup recipe with loss.teacher")
    texts = teacher_texts({"sent0": data["sent0"]}, "unsup")
    table = load_teacher_table(cfg.loss.teacher, texts, cache_dir=cfg.loss.teacher_cache_dir, show_progress=False)
    vectors = table.vectors
    if table.width != width:
        mean, components = pca_projection(vectors, width)
        vectors = (vectors - mean) @ components
    vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return datasets.Dataset.from_dict({"sentence": texts, "label": vectors.tolist()})


def peer_loss(loss: str, model: Any, temperature: float) -> nn.Module:
    """The sentence-transformers loss; call after seeding (TSDAE's cross-attention and CT's
    learnt scale are initialised here)."""
    from sentence_transformers.sentence_transformer.losses import (
        ContrastiveTensionLossInBatchNegatives,
        DenoisingAutoEncoderLoss,
        MultipleNegativesRankingLoss,
    )

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
    raise ValueError(f"unknown loss {loss!r}; choose from {LOSSES}")


class DevSelection(TrainerCallback):
    """Dev score at step 0 (optional), every ``eval_steps`` and at the end; the best
    weights kept in memory (as simcse-kit's trainer keeps its best model)."""

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

    def on_train_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.at_start:
            self.evaluate(0)  # the untouched model is a candidate, as with eval_at_start

    def on_step_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.eval_steps and state.global_step % self.eval_steps == 0 and state.global_step < state.max_steps:
            self.evaluate(state.global_step)

    def on_train_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
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
    """``auto``: ``bf16`` on a GPU that computes it, else ``fp32`` (sentence-transformers'
    default, and on a CPU its bf16 autocast is not what a user would pick everywhere)."""
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def st_train(
    cfg: Any, seed: int, loss: str, precision: str, retrieval: Sequence[str] = (), dev_only: bool = False
) -> dict[str, Any]:
    """One sentence-transformers run of ``loss`` on ``cfg``'s data, budget and dev selection.

    Args:
        cfg: the simcse-kit recipe (``simcse_kit.config.RunConfig``).
        seed: model-side randomness (dropout, TSDAE's fresh decoder weights), data order,
            TSDAE's noise and, as in the kit's runs, corpus mixing.
        loss: one of :data:`LOSSES`.
        precision: ``fp32`` or ``bf16`` (sentence-transformers' own ``bf16=True``: autocast).
        retrieval: BEIR-format task folders scored on the selected model (nDCG@10 etc.).
        dev_only: training and dev evaluations only (a learning-rate sweep): no final table.

    Returns:
        best step and dev score, every evaluation, training seconds, the STS table and
        the retrieval results (empty with ``dev_only``).
    """
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from simcse_kit.evaluation import DevEvaluator, STSEvaluator
    from simcse_kit.modeling import resolve_model_path
    from simcse_kit.run import load_training_data

    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))  # the kit's runs mix with their seed
    path = resolve_model_path(cfg.model.name_or_path)
    if loss == "mse":
        from transformers import AutoConfig

        data = distillation_dataset(cfg, load_training_data(cfg), AutoConfig.from_pretrained(path).hidden_size)
    else:
        data = peer_dataset(load_training_data(cfg), loss, cfg.data.mode, seed)
    dev = DevEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=cfg.data.dev_file, fmt=cfg.data.dev_format)
    final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    torch.manual_seed(seed)
    device = peer_device()
    model = SentenceTransformer(path, device=device)
    train_len, eval_len = cfg.model.max_seq_len, cfg.model.eval_max_seq_len
    model.max_seq_length = train_len
    criterion = peer_loss(loss, model, cfg.loss.temperature)

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
    else:
        best = SentenceTransformer(path, device=device)
        best.load_state_dict(selection.state)
        sts = final_sts(encoder(best, eval_len, eval_len))
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
    }


@functools.lru_cache(maxsize=4)
def base_table(path: str, eval_data_dir: str, eval_len: int, device: str = "cpu") -> dict[str, float]:
    """The untouched model's STS table, scored once per process: every run that keeps
    step 0 reports it (1-2 minutes of encoding saved per such run)."""
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


@functools.lru_cache(maxsize=4)
def base_retrieval(path: str, tasks: tuple[str, ...], eval_len: int, device: str) -> dict[str, float]:
    """:func:`score_tasks` of the untouched model, once per process (as :func:`base_table`)."""
    from sentence_transformers import SentenceTransformer

    return score_tasks(SentenceTransformer(path, device=device), tasks, eval_len, device) if tasks else {}


def run_settings(cfg: Any, loss: str, precision: str, retrieval: Sequence[str] = (), dev_only: bool = False) -> dict[str, Any]:
    """What a peer run depends on: a finished seed is reused only when all of it matches
    (``auto`` precision as this machine decides it; the retrieval tasks by name)."""
    data, train = cfg.data, cfg.train
    extra = {"retrieval": [Path(t).name for t in retrieval]} if retrieval else {}
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
        **{k: getattr(data, k) for k in ("mode", "train_file", "train_format", "max_train_samples", "mix_file", "mix_ratio")},
        **{k: getattr(data, k) for k in ("eval_data_dir", "dev_file", "dev_format")},
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
) -> dict[int, dict[str, float]]:
    """:func:`st_train` per seed into ``out/seed-N/metrics.json`` (reused when its
    ``settings`` match; default :func:`run_settings`); per seed, the STS table plus
    ``best_stsb_dev``, ``best_step``, the dev curve and, with ``retrieval`` folders, their
    nDCG@10 under ``retrieval:<task>`` and mean under ``retrieval:avg``. ``precision``
    ``auto``: :func:`resolve_precision`."""
    from simcse_kit.fileio import write_json_atomic

    settings = run_settings(cfg, loss, precision, retrieval, dev_only) if settings is None else settings
    precision = resolve_precision(precision)
    per_seed = {}
    for seed in seeds:
        done = out / f"seed-{seed}" / "metrics.json"
        metrics = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {}
        if metrics.get("settings") == settings:
            logger.info("reusing the finished run in %s", done.parent)
        else:
            metrics = st_train(cfg, seed, loss, precision, retrieval, dev_only) | {"settings": settings}
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
    from simcse_kit.selection import dev_selection

    key = dev_selection(metrics).metric  # the run's dev metric (STS-B dev where unnamed)
    trained = [e for e in metrics["evals"] if e["step"] > 0]
    if not trained:
        return {}
    return {"dev_trained": max(e[key] for e in trained), "dev_end": trained[-1][key]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path, help="a simcse-kit training recipe (YAML)")
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="max optimiser steps per run (default: the recipe's epochs)")
    parser.add_argument("--eval-steps", type=int, default=None, help="dev every N steps (default: the recipe's)")
    parser.add_argument("--eval-data-dir", type=Path, default=None, help="STS folder for the final table (default: the recipe's)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "auto"),
        default="fp32",
        help="fp32: sentence-transformers' default; auto: bf16 on a GPU",
    )
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "st_peers")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_run(args.threads)

    from simcse_kit.config import load_config
    from simcse_kit.experiments import TABLE_HEADERS, TABLE_KEYS, aggregate, parse_seeds

    overrides = {"max_steps": args.steps, "eval_steps": args.eval_steps, "eval_data_dir": args.eval_data_dir}
    cfg = load_config(args.recipe, {k: str(v) for k, v in overrides.items() if v is not None})
    seeds = parse_seeds(args.seeds)
    keys, headers = (*TABLE_KEYS, "best_stsb_dev", "best_step"), (*TABLE_HEADERS, "dev (selection)", "best step per seed")
    lines = ["| peer | seeds | " + " | ".join(headers) + " |", "|---|---:|" + "---:|" * len(headers)]
    for loss in args.losses:
        per_seed = run_st(cfg, seeds, loss, args.precision, args.output_dir / f"st-{loss}")
        mean, std = aggregate(list(per_seed.values()))
        cells = [f"{mean[k]:.2f} ± {std[k]:.2f}" if len(seeds) > 1 else f"{mean[k]:.2f}" for k in keys[:-1]]
        cells.append(", ".join(str(int(t["best_step"])) for t in per_seed.values()))  # 0: the untouched model kept
        lines.append(f"| st-{loss} | {len(seeds)} | " + " | ".join(cells) + " |")
    print(f"{args.recipe} ({cfg.data.dev_file or 'STS-B dev'} selection), sentence-transformers in {args.precision}\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
