"""A run's DataLoader: shuffled batches of its datasets, each batch from one dataset
(:func:`make_loader`), collated from the token table (:func:`make_collator`); the checks on
what a batch can hold."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader

from simcse_kit.config.run import RunConfig, files_label
from simcse_kit.core.batch import view_prompts, views_per_example
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.mixture import Mixture, MixtureBatches, MixtureCollator
from simcse_kit.data.pipeline import loader_options
from simcse_kit.data.readers import negatives_of
from simcse_kit.data.tokens import Tokenization, id_columns, with_tokens
from simcse_kit.errors import ConfigError

logger = logging.getLogger(__name__)


def make_loader(
    cfg: RunConfig,
    sets: Mapping[str, datasets.Dataset],
    tokenizer: Any,
    num_processes: int,
    device: torch.device | str = "cpu",
    decoder: bool = False,
    teacher_index: Mapping[str, int] | None = None,
    guide_index: Mapping[str, int] | None = None,
) -> DataLoader:
    """The run's batches of its datasets (``sets``, by name, in the order and with the specs of
    :meth:`~simcse_kit.config.sections.DataConfig.training_sets`): each global batch of
    ``train.batch_size`` examples from one dataset, drawn by ``data.sampling``
    (:class:`~simcse_kit.data.mixture.MixtureBatches`, from a seeded generator of the loader's
    own, which the loop checkpoints so a resume redraws the order), collated in that dataset's
    mode with its training prompts. One dataset's batches are a
    plain shuffled loader's.

    Pinned memory on CUDA (:func:`simcse_kit.data.pipeline.loader_options`); batches collated
    from the token table's ids (:mod:`simcse_kit.data.tokens`; a dataset given in memory is
    tokenised here) and the packing plan made in the collator, so in the workers with
    ``data.num_workers > 0``. ``teacher_index``/``guide_index``: with a teacher or a guide,
    its table's rows of every dataset's sentences
    (:func:`~simcse_kit.training.wiring.inputs.training_texts`), which each batch carries.
    ``decoder``: the model is a decoder, whose left-padded batches pack too."""
    specs = {spec.name: spec for spec in cfg.data.training_sets()}
    options = loader_options(device)
    collators, parts, from_table = {}, {}, []
    for name, part in sets.items():
        spec, negatives = specs[name], negatives_of(part.column_names)
        tokenization = Tokenization(tokenizer, cfg.model.max_seq_len, spec.prompts)
        if not part.cache_files:  # a training set given in memory (in code, a scored pair file): tokenised here
            part = with_tokens(part, tokenization, spec.mode)
        parts[name] = part
        from_table.append(all(c in part.column_names for c in id_columns(tokenization.sources(spec.mode, negatives))))
        collators[name] = make_collator(cfg, tokenizer, spec.mode, spec.prompts, negatives, teacher_index, guide_index, decoder)
    logger.info(
        "input pipeline: %s; %s worker process(es); pinned memory and asynchronous copies %s",
        "token ids from the token table" if all(from_table) else "texts tokenised in the collator",
        cfg.data.num_workers,
        "on" if options.pin_memory else "off (not CUDA)",
    )
    mixture = Mixture(parts)
    generator = torch.Generator().manual_seed(cfg.train.seed)
    weights = [specs[name].weight or 1.0 for name in parts] if cfg.data.sampling == "weighted" else None
    batches = MixtureBatches(mixture.sizes, cfg.train.batch_size, num_processes, cfg.data.sampling, generator, weights)
    counts = ", ".join(f"{name} {n}" for name, n in zip(parts, batches.counts, strict=True))
    logger.info("datasets, %s: batches an epoch: %s", cfg.data.sampling, counts)
    check_every_dataset_trains(list(parts), batches.counts, weights)
    return DataLoader(
        mixture,
        batch_sampler=batches,
        collate_fn=MixtureCollator(collators),
        generator=generator,
        num_workers=cfg.data.num_workers or 0,  # auto (None) not made concrete: the CPU's 0
        pin_memory=options.pin_memory,
    )


def make_collator(
    cfg: RunConfig,
    tokenizer: Any,
    mode: str,
    prompts: Mapping[str, str] | None,
    negatives: int,
    teacher_index: Mapping[str, int] | None = None,
    guide_index: Mapping[str, int] | None = None,
    decoder: bool = False,
) -> ContrastiveCollator:
    """The collator of a dataset in ``mode`` with ``negatives`` hard negatives per example and
    these ``prompts``; the rest (lengths, text ids, the packing plan) from ``cfg``."""
    return ContrastiveCollator(
        tokenizer,
        mode,
        cfg.model.max_seq_len,
        with_text_ids=cfg.loss.mask_false_negatives,
        prompts=view_prompts(prompts, mode, negatives),
        negatives=negatives,
        word_repetition=cfg.data.word_repetition,
        seed=cfg.train.seed,
        teacher_index=teacher_index,
        guide_index=guide_index,
        teacher_scores=cfg.loss.distill is not None,
        packing_plan=cfg.model.packing is not False,  # auto (None) means on, as in SimCSEModel.from_config
        pack_left_padded=decoder,  # a decoder's left-padded rows pack too
    )


# Bytes autograd keeps for the backward pass per token, hidden unit and layer of the encoder,
# in fp32 with SDPA attention: 86 measured on all-MiniLM-L6-v2 (64 and 128 rows of 32 tokens,
# the saved tensors' storage less the weights it also keeps).
ACTIVATION_BYTES = 86


def warn_if_a_batch_is_a_whole_set(cfg: RunConfig, encoder_config: Any, parts: Mapping[str, datasets.Dataset]) -> None:
    """Warn, with an estimate of the memory, where one batch holds a whole training set (of
    ``parts``, by name): every step is then one batch of all of it, legal and surely a typo
    (more than the set is refused above; a 12k-sentence set was one such batch)."""
    specs = {spec.name: spec for spec in cfg.data.training_sets()}
    hidden, layers = getattr(encoder_config, "hidden_size", None), getattr(encoder_config, "num_hidden_layers", None)
    for name, part in parts.items():
        if cfg.train.batch_size != len(part):
            continue
        rows = len(part) * views_per_example(specs[name].mode, negatives_of(part.column_names))
        size = ""
        if isinstance(hidden, int) and isinstance(layers, int):
            gb = rows * cfg.model.max_seq_len * hidden * layers * ACTIVATION_BYTES / 1e9
            size = f"; up to about {gb:.3g} GB of activations for its {rows} rows of {cfg.model.max_seq_len} tokens in fp32"
        logger.warning(
            "train.batch_size %d is the whole of %s (%d examples in %s): every step is one batch of all of it%s; "
            "a smaller batch gives more steps for the same data",
            cfg.train.batch_size,
            name,
            len(part),
            files_label(specs[name].file),
            size,
        )


def check_every_dataset_trains(names: list[str], counts: list[int], weights: list[float] | None) -> None:
    """Refuse a listed dataset that gets no batch an epoch (a tiny ``weight`` under weighted
    sampling: 1e-9 was said only at INFO), naming the weight that would give it one.

    Raises:
        ConfigError: naming the ``data.datasets`` entry, its weight and its 0 batches.
    """
    total = sum(counts)
    for d, (name, count) in enumerate(zip(names, counts, strict=True)):
        if count:
            continue
        weight = weights[d] if weights is not None else 1.0
        others = sum(weights or []) - weight
        # Its quota total * w / (others + w) reaches one batch at w = others / (total - 1) (a largest
        # remainder may give it one below that).
        sure = weights is not None and total > 1
        enough = f"a weight of {others / max(1, total - 1):.3g} is sure to give it one; or " if sure else ""
        raise ConfigError(
            f"config key 'data.datasets' entry {name!r}: weight {weight:g} gives it 0 of the epoch's {total} batches, "
            f"so it would never be trained on: {enough}leave it out"
        )
