"""The sections of a run's configuration: one dataclass per concern, each field with its
default and its meaning (``field(metadata={"help": ...})``, printed by
``simcse-kit train --help``), and its own check (``check()``: the values it allows, beside
their help; what those are is imported from the module that owns the concept where that
sits at or below the config, :mod:`simcse_kit.core.modes` (the modes, the teacher's terms),
and is defined here where its owner sits above).

:mod:`simcse_kit.config.run` puts them together (:class:`~simcse_kit.config.run.RunConfig`), checks
what spans sections and reads them from YAML; import them from there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from simcse_kit.core import modes
from simcse_kit.errors import ConfigError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
AUTO = "auto"  # decided at start-up from the hardware (simcse_kit.model.precision)
OPTIONAL_DATA_PATHS = ("mix_file", "dev_file")  # data keys that are paths when set, resolved as train_file
HUB_PREFIX = "hub:"  # data.train_file naming a hub dataset, not a path


def is_hub(files: str | list[str] | None) -> bool:
    """``files`` (a dataset's ``file``) name a hub dataset, not local files."""
    return isinstance(files, str) and files.startswith(HUB_PREFIX)


def files_label(files: str | list[str]) -> str:
    """How logs, records and errors name a dataset's ``file``: the path, or a list's paths joined by commas."""
    return files if isinstance(files, str) else ", ".join(files)


# The values a key allows, each beside its section below. Read by the modules that act on
# them (simcse_kit.model.modeling, simcse_kit.model.precision, simcse_kit.evaluation.sts_readers,
# simcse_kit.training.objective.objectives), which sit above the config and so import them from here.
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "last")
MLP_MODES = ("none", "train", "always")
MODES = tuple(modes.TABLE)  #: simcse_kit.core.modes: one row per mode
PAIR_FORMATS = ("stsb", "sick")  #: scored-pair files a run reads; evaluation.sts_readers.PAIR_READERS maps each to its reader
# data.datasets: the modes a dataset of a mixture may have (scored needs its own score_range:
# one file's concern), and how batches are drawn among the datasets (simcse_kit.data.mixture).
MIXTURE_MODES = ("unsup", "sup", "hardneg")
SAMPLINGS = ("proportional", "round_robin", "weighted")  #: data.sampling: how batches are drawn among the datasets
DEV_FORMATS = (*PAIR_FORMATS, "pairs", "beir")
TEACHER_LOSSES = modes.TEACHER_LOSSES  #: simcse_kit.training.objective.objectives.TeacherTargets.kind
SCORE_LOSSES = ("cosent", "angle")  # simcse_kit.core.score_losses.SCORE_LOSSES' names (config imports no torch)
# loss.distill: a teacher's scores of each anchor's candidates (simcse_kit.core.score_losses'
# kl_distillation_loss and margin_mse_loss; simcse_kit.training.objective.objectives.SimCSEObjective.distill_loss)
DISTILL_LOSSES = ("kl", "margin_mse")
TEACHER_PROJECTIONS = ("pca", "aligned", "none")  # simcse_kit.training.objective.teacher
GUIDE_MARGIN_STRATEGIES = ("absolute", "relative")  # simcse_kit.core.masks.MARGIN_STRATEGIES (config imports no torch)
QUANTIZATION_TARGETS = ("int8", "binary")  # simcse_kit.core.quantization.TARGETS (config imports no torch)
# simcse_kit.evaluation.quantization.PRECISIONS (sentence-transformers' names; the config sits below evaluation)
VECTOR_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
GUIDE_IS_TEACHER = "teacher"  # loss.guide: reuse loss.teacher's cached vectors
PRECISIONS = (AUTO, "no", "fp16", "bf16")  # simcse_kit.model.precision
#: The temperature's range. Logits are cos / tau in fp32, so any tau > 3e-39 keeps them finite;
#: the real floor is where learning stops: below 1e-3 a cosine gap of 0.1 between the positive
#: and a negative is a logit gap over 100, past where fp32's exp underflows (exp(-104) = 0), so
#: the softmax is one-hot, the loss exactly 0 and no gradient flows (tau 1e-6: loss 0.0 from
#: step 1). Above 10 every logit lies within 0.2 of the others and the loss is log(N), flat.
TEMPERATURE_RANGE = (1e-3, 10.0)
TEMPERATURE_WHY = "lower, fp32's exp underflows: loss 0 and no gradient; higher, all logits are alike: a flat loss"

Rule = tuple[str, bool, str]
"""``(key, holds, what the value must be)``: one check of a section's key."""


def option(default: Any, help: str) -> Any:
    """A config field with its meaning, printed by ``simcse-kit train --help`` (:func:`simcse_kit.config.run.key_help`)."""
    return field(default=default, metadata={"help": help})


def one_of(values: Iterable[str]) -> str:
    """``'a', 'b' or 'c'``: the allowed values, for a key's help."""
    quoted = [repr(v) for v in values]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else "".join(quoted)


def raise_first(section: str, values: object, rules: Iterable[Rule]) -> None:
    """Raise for the first rule that does not hold.

    Raises:
        ConfigError: ``config key 'section.key' = value: must be ...``.
    """
    for name, ok, expected in rules:
        if not ok:
            raise ConfigError(f"config key {f'{section}.{name}'!r} = {getattr(values, name)!r}: must be {expected}")


def check_pooling(pooler: str, mlp: str = "none") -> None:
    """The one check of a pooler and an MLP mode: a recipe's (:meth:`ModelConfig.check`) and
    a model's built in code (:class:`simcse_kit.model.modeling.SimCSEModel`, ``Pooler``).

    Raises:
        ConfigError: naming the key, its value and what it must be.
    """
    rules = (
        ("model.pooler", pooler, pooler in POOLERS, f"one of {POOLERS}"),
        ("model.mlp", mlp, mlp in MLP_MODES, f"one of {MLP_MODES}"),
        # SimCSE's MLP replaces BERT's own pooler layer, which cls_before_pooler reads past.
        ("model.mlp", mlp, pooler != "cls_before_pooler" or mlp == "none", "'none' with pooler cls_before_pooler"),
    )
    for key, value, ok, expected in rules:
        if not ok:
            raise ConfigError(f"config key {key!r} = {value!r}: must be {expected}")


def usable_temperature(tau: float) -> bool:
    """Whether ``tau`` is in :data:`TEMPERATURE_RANGE` (a SimCSE or a teacher softmax's)."""
    low, high = TEMPERATURE_RANGE
    return low <= tau <= high


def temperature_range() -> str:
    """``in [low, high]``: :data:`TEMPERATURE_RANGE` as an error message says it."""
    low, high = TEMPERATURE_RANGE
    return f"in [{low:g}, {high:g}]"


@dataclass
class ModelConfig:
    """The encoder and how a sentence vector is read off it."""

    name_or_path: str = option(DEFAULT_MODEL, "the bundled default, a local folder or a hub id")
    pooler: str = option("avg", one_of(POOLERS))
    mlp: str = option("none", '"none": no MLP; "train": SimCSE\'s MLP only while training; "always": kept at inference')
    max_seq_len: int = option(32, "training truncation (SimCSE: 32)")
    eval_max_seq_len: int = option(256, "inference/evaluation truncation, saved with the model")
    dropout: float | None = option(
        None,
        "Sets every dropout of the encoder, whatever its family calls the keys (the unsup augmentation; "
        "simcse_kit.model.families); None keeps the model's own rates.",
    )
    attn_implementation: str = option(
        "auto",
        '"auto": SDPA where the architecture has it, else eager (MPNet, DeBERTa-v2); any other value ("sdpa", '
        '"eager", "flash_attention_2") is required, and recorded.',
    )
    trust_remote_code: bool = option(
        False,
        "Run a model folder's own Python code (config.json's auto_map for a model_type transformers does not know). "
        "False: such a folder is refused with one line, never a y/N question in the middle of a run.",
    )
    packing: bool | None = option(
        None,
        "Run the encoder on packed rows instead of padded ones where the model is verified to give the same token states "
        "(simcse_kit.model.packing): same loss, about a third less work at max_seq_len 32 on Wikipedia sentences. null (auto): "
        "on the CPU, off on CUDA (padding is faster there: BENCHMARKS.md, GPU); true/false: as set, on any device.",
    )
    append_eos: bool | None = option(
        None,
        "Append the EOS token to every text (written into the saved tokenizer). null (auto): on for a decoder-only "
        "backbone (Qwen3, Llama, Gemma3, ...), whose last-token vector then reads a fixed end, as Qwen3-Embedding and "
        "RepLLaMA do; off for encoders.",
    )
    lora_r: int = option(0, "LoRA rank (peft): 0 trains every weight; > 0 trains only the adapter (and the MLP head)")
    lora_alpha: int = option(16, "LoRA scaling numerator: the update is scaled by lora_alpha / lora_r")
    lora_dropout: float = option(
        0.1,
        "Dropout on the adapter's input. With the base frozen, unsup's two views of a sentence differ by the base's "
        "own dropout (still active while training) and by this one.",
    )
    lora_target_modules: list[str] | None = option(
        None,
        'Module names the adapter wraps (e.g. ["q_proj", "v_proj"], or ["all-linear"]); null: the family\'s '
        "default (simcse_kit.model.families.lora_targets).",
    )

    def check(self) -> None:
        """Raise :class:`~simcse_kit.errors.ConfigError` naming the first key whose value is not allowed."""
        check_pooling(self.pooler, self.mlp)
        rules: list[Rule] = [
            ("max_seq_len", self.max_seq_len > 0, "> 0"),
            ("name_or_path", self.name_or_path.strip() != "", "a model folder, hub id or the default's name"),
        ]
        if self.dropout is not None:
            rules.append(("dropout", 0 <= self.dropout < 1, "in [0, 1)"))
        # A negative rank would silently train every weight; its upper bound, the model's width,
        # is checked with the model's config (simcse_kit.training.wiring.inputs.load_checked_tokenizer).
        rules += [
            ("lora_r", self.lora_r >= 0, ">= 0 (0: train every weight; > 0: the adapter's rank)"),
            ("lora_alpha", 0 < self.lora_alpha < math.inf, "> 0 (the update is scaled by lora_alpha / lora_r)"),
            ("lora_dropout", 0 <= self.lora_dropout < 1, "in [0, 1)"),
        ]
        raise_first("model", self, rules)


@dataclass
class DatasetSpec:
    """One dataset of a mixture (``data.datasets``): its file and how its examples are read and trained.

    A recipe gives each as a mapping with these keys (``file`` required), in a list or
    under its name in a mapping of name -> spec (:func:`simcse_kit.config.values.dataset_specs`).
    """

    name: str = option("", "the dataset's name in logs and metrics.json (default: the mapping's key, else the file's stem)")
    file: str | list[str] = option(
        "",
        'file path ("{data_root}/..." or relative to the recipe), its shards (a folder, a glob pattern: '
        '"data/train-*.parquet", or a list of these; docs/data.md), or "hub:<dataset id>"',
    )
    format: str = option("auto", '"auto" (by mode and suffix), or "stsb" / "sick": a scored pair file read as its sentences')
    mode: str = option("unsup", one_of(MIXTURE_MODES))
    prompts: dict[str, str] | None = option(None, "this dataset's training prompts (default: data.prompts)")
    weight: float | None = option(None, "its share of the batches with data.sampling weighted (default 1)")
    max_train_samples: int | None = option(None, "use only its first N examples (None: all)")

    def problems(self) -> list[str]:
        """What is wrong with the spec's values, each as ``key ...: must be ...``; empty when none."""
        out = []
        if not files_label(self.file).strip():
            out.append("file: missing; give the dataset's file (or hub:<id>)")
        if self.mode not in MIXTURE_MODES:
            out.append(f"mode {self.mode!r}: must be one of {MIXTURE_MODES}")
        if self.format not in (AUTO, *PAIR_FORMATS):
            out.append(f"format {self.format!r}: must be 'auto' or one of {PAIR_FORMATS}")
        elif self.format != AUTO and self.mode != "unsup":
            out.append(f"format {self.format!r}: only with mode 'unsup' (the pair file's sentences)")
        elif self.format != AUTO and not isinstance(self.file, str):
            out.append(f"format {self.format!r}: reads one pair file; give file as one path")
        if self.weight is not None and not (math.isfinite(self.weight) and self.weight > 0):
            out.append(f"weight {self.weight!r}: must be > 0")
        if self.max_train_samples is not None and self.max_train_samples < 2:
            out.append(f"max_train_samples {self.max_train_samples!r}: must be >= 2 (or null for all)")
        if self.prompts is not None and not set(self.prompts) <= set(modes.PROMPT_NAMES):
            out.append(f"prompts {self.prompts!r}: must be a mapping with keys among {modes.PROMPT_NAMES}")
        return out


@dataclass
class DataConfig:
    """Training data and the STS data used for dev selection."""

    mode: str = option("unsup", one_of(MODES))
    # Data paths: "{data_root}" stands for the data root; other relative paths are read from
    # the recipe's folder (on the command line, from the current one). Saved absolute.
    train_file: str | list[str] = option(
        "{data_root}/train/wiki1m_head.txt",
        'file path, its shards (a folder, a glob pattern: "data/train-*.parquet", or a list of these; docs/data.md), '
        'or "hub:<dataset id>"',
    )
    eval_data_dir: str = option("{data_root}/senteval", "SentEval-layout STS folder: STS-B dev selection and the final table")
    data_root: str | None = option(
        None,
        'The folder "{data_root}" stands for. --data-root and SIMCSE_KIT_DATA win over a recipe\'s; default: '
        "../shared/data beside a source checkout (simcse_kit.config.recipes).",
    )
    max_train_samples: int | None = option(None, "use only the first N training examples (None: all)")
    num_workers: int | None = option(
        None,
        "DataLoader worker processes for tokenisation (0: in the training process). null (auto): 0 on the CPU (workers "
        "take the step's cores), 8 on CUDA (BENCHMARKS.md, GPU).",
    )
    train_format: str = option(
        "auto",
        '"auto": by mode and file suffix (simcse_kit.data.readers); "stsb" / "sick": train_file is a scored pair file of '
        "that format (sts-train.csv, SICK_train.txt): with mode unsup its distinct sentences become the corpus (scores "
        "unused), with mode scored its pairs and scores are the training set.",
    )
    score_range: list[float] | None = option(
        None,
        "mode scored: the scores' declared [low, high], e.g. [0, 5] for STS-B; a score outside it is an error naming the "
        "file and line, and the scores are mapped onto [0, 1]. null: as read (the ranking losses only use their order).",
    )
    word_repetition: float = option(
        0.0,
        "ESimCSE word repetition (unsup): one view of each sentence gets a few tokens doubled in place, so the two views "
        "differ in length (0: off; ESimCSE: 0.32).",
    )
    bad_rows: str = option(
        "error",
        '"error": a bad row of train_file (or mix_file) stops the run before anything is written, naming the file, the '
        'line and the problem; "skip": bad rows are left out, counted (metrics.json skipped_rows) and the first few logged.',
    )
    cache_dir: str | None = option(
        None,
        "where local training files are cached as memory-mapped Arrow (read once, reused while the file is unchanged; "
        "docs/data.md). None: the datasets cache ($HF_DATASETS_CACHE).",
    )
    decontaminate: str = option(
        "warn",
        '"warn": count the evaluation sentences (STS suite, dev split) that the training texts also hold, per task, in '
        'metrics.json, the final table and the model card; "drop": also leave out each training row that shares a '
        'sentence with a test set; "error": refuse the run, naming the file, its line and the task (docs/contamination.md).',
    )
    decontaminate_dev: bool = option(False, "with decontaminate drop or error, the dev split's sentences count as a test set's")
    mix_file: str | list[str] | None = option(
        None, "a second (general) corpus mixed into train_file, in data.mode's format (a file or its shards, as train_file)"
    )
    mix_ratio: float = option(0.0, "share of the mixed training set drawn from mix_file, in [0, 1)")
    dev_file: str | None = option(None, "dev split for checkpoint selection (None: STS-B dev of eval_data_dir)")
    dev_format: str = option(
        "stsb",
        'dev_file\'s format: "stsb" (sts-dev.csv), "sick" (SICK_trial.txt), "pairs" (a table of sent0, sent1, score: '
        'CSV, TSV, JSONL, Parquet..., on any scale) or "beir" (a BEIR-format retrieval folder: selects on its '
        "qrels/dev.tsv nDCG@10, docs/retrieval.md)",
    )
    prompts: dict[str, str] | None = option(
        None,
        'Prompts put before the texts, e5/bge-style: {query: "query: ", document: "passage: "}. In training view 0 '
        "(the anchor) is the query and the other views are documents; they are saved with the model, used by evaluation "
        "and written into the export (docs/retrieval.md).",
    )

    datasets: list[DatasetSpec] | None = option(
        None,
        "Several datasets in one run, each batch from one of them (docs/data.md): a list of specs, or a mapping of "
        "name -> spec, each with file, format, mode (unsup, sup, hardneg), prompts, weight, max_train_samples. Replaces "
        "train_file, train_format, mode and max_train_samples, which are then unused.",
    )
    sampling: str = option(
        "proportional",
        f"with data.datasets, which dataset each batch is drawn from ({one_of(SAMPLINGS)}): proportional, every full "
        "batch of every dataset once an epoch in a shuffled order; round_robin, the datasets in turn, as many batches "
        "from each as the smallest has; weighted, as many batches as proportional shared by the datasets' weights.",
    )

    def training_sets(self) -> list[DatasetSpec]:
        """What the run trains on, always a list of datasets: ``datasets``, or else ``train_file``
        as a list of one (named by its file's stem, read in ``train_format``, ``mode`` and
        ``max_train_samples``). Each spec's ``prompts`` are its training prompts: its own, else
        ``prompts``. The one place that tells the two ways of writing it apart: everything after
        it reads a list (copies: the config keeps what was written)."""
        if self.datasets is not None:
            return [replace(spec, prompts=spec.prompts or self.prompts) for spec in self.datasets]
        files = [self.train_file] if isinstance(self.train_file, str) else self.train_file
        name = Path(files[0]).stem if files else "train"
        # Built, not checked as a data.datasets entry would be: mode scored and the stsb/sick
        # formats in scored mode are one file's settings (score_range), allowed here.
        return [
            DatasetSpec(
                name=name,
                file=self.train_file,
                format=self.train_format,
                mode=self.mode,
                prompts=self.prompts,
                max_train_samples=self.max_train_samples,
            )
        ]

    def path_keys(self) -> list[str]:
        """The keys holding a data path, where set (a ``hub:`` dataset is not a path)."""
        keys = ("train_file", "eval_data_dir", *OPTIONAL_DATA_PATHS)
        return [key for key in keys if getattr(self, key) is not None and not is_hub(getattr(self, key))]

    def check(self) -> None:
        """Raise :class:`~simcse_kit.errors.ConfigError` naming the first key whose value is not allowed."""
        rules: list[Rule] = [
            ("mode", self.mode in MODES, f"one of {MODES}"),
            ("train_format", self.train_format in (AUTO, *PAIR_FORMATS), f"'auto' or one of {PAIR_FORMATS}"),
            ("dev_format", self.dev_format in DEV_FORMATS, f"one of {DEV_FORMATS}"),
        ]
        if self.dev_format == "beir":
            rules.append(("dev_file", self.dev_file is not None, "a BEIR-format folder with data.dev_format beir"))
        if self.dev_format == "pairs":
            rules.append(("dev_file", self.dev_file is not None, "a table of sent0, sent1, score with data.dev_format pairs"))
        rules.append(("bad_rows", self.bad_rows in ("error", "skip"), "'error' or 'skip'"))
        rules.append(("decontaminate", self.decontaminate in ("warn", "drop", "error"), "'warn', 'drop' or 'error'"))
        if self.num_workers is not None:
            rules.append(("num_workers", self.num_workers >= 0, ">= 0 (0: in the training process), or null for auto"))
        rules.append(("word_repetition", 0 <= self.word_repetition <= 1, "in [0, 1]"))
        if self.word_repetition:
            rules.append(("mode", self.mode == "unsup", "'unsup' with data.word_repetition"))
        if self.train_format != AUTO:
            ok = self.mode in ("unsup", "scored")
            rules.append(("mode", ok, "'unsup' (the file's sentences) or 'scored' (its pairs) with data.train_format"))
            one_file = isinstance(self.train_file, str)
            rules.append(("train_file", one_file, "one path (a pair file) with data.train_format, not a list"))
        if self.score_range is not None:
            low_high = self.score_range
            ok = len(low_high) == 2 and all(math.isfinite(v) for v in low_high) and low_high[0] < low_high[1]
            rules.append(("score_range", ok, "[low, high] with low < high, e.g. [0, 5] (or null)"))
            rules.append(("score_range", self.mode == "scored", "null unless data.mode is 'scored'"))
        rules.append(("mix_ratio", 0 <= self.mix_ratio < 1, "in [0, 1)"))
        if self.mix_ratio > 0:
            rules.append(("mix_file", self.mix_file is not None, "set with data.mix_ratio > 0"))
        if self.max_train_samples is not None:
            # One example would make batches without a single negative: a zero loss.
            rules.append(("max_train_samples", self.max_train_samples >= 2, ">= 2 (or null for all)"))
        if self.prompts is not None:
            names = modes.PROMPT_NAMES
            ok = set(self.prompts) <= set(names)
            rules.append(("prompts", ok, f"a mapping with keys among {names}, e.g. {{query: 'query: '}}"))
        rules.append(("sampling", self.sampling in SAMPLINGS, one_of(SAMPLINGS)))
        if self.datasets is not None:
            rules += [
                ("mix_ratio", self.mix_ratio == 0, "0 with data.datasets (list the general corpus as one more dataset)"),
                ("word_repetition", self.word_repetition == 0, "0 with data.datasets"),
            ]
        raise_first("data", self, rules)
        if self.datasets is not None:
            check_datasets(self.datasets, self.sampling)


@dataclass
class LossConfig:
    """The contrastive objective."""

    temperature: float = option(0.05, "tau: logits are cos / tau (SimCSE: 0.05)")
    hard_negative_weight: float = option(1.0, "the paper's alpha on each anchor's own hard negative")
    unsup_loss: str = option("views", '"views": 2N-view InfoNCE; "paper": z1 . z2^T as in SimCSE\'s code')
    gather: bool = option(True, "use other processes' embeddings as negatives (multi-process runs)")
    mask_false_negatives: bool = option(False, "drop in-batch candidates whose text equals the anchor's positive")
    false_negative_threshold: float | None = option(None, "drop candidates whose cosine with the anchor exceeds this (None: off)")
    queue_size: int = option(0, "MoCo-style queue of past embeddings as extra negatives (0: off)")
    momentum: float = option(0.999, "momentum encoder update rate when queue_size > 0")
    teacher: str | None = option(None, "distil from this model (a sentence-transformers/simcse-kit folder or hub id; None: off)")
    teacher_loss: str = option(
        "similarity",
        '"similarity": match the teacher\'s in-batch softmax; "embedding": MSE to its vectors',
    )
    teacher_weight: float = option(1.0, "loss = (1 - w) * SimCSE + w * teacher term")
    teacher_temperature: float = option(0.05, "the teacher's own tau for similarity distillation")
    teacher_student_temperature: float | None = option(
        None, "the student's tau in the similarity teacher term (None: loss.temperature, the SimCSE term's)"
    )
    teacher_projection: str = option(
        "pca",
        "embedding distillation: \"pca\" (a wider teacher to the student's width, sentence-transformers' recipe), "
        '"aligned" (PCA, then rotated and scaled onto the student\'s own vectors of the training sentences: '
        'docs/distillation.md) or "none" (equal widths only)',
    )
    teacher_cache_dir: str | None = option(
        None,
        "where teacher and guide vectors are cached (None: $SIMCSE_KIT_CACHE or ~/.cache/simcse-kit)",
    )
    guide: str | None = option(
        None,
        "a frozen model that vets every negative (GISTEmbed): a candidate it rates above the anchor's positive (less "
        'loss.guide_margin) is not a negative; a model folder or hub id, or "teacher" for loss.teacher\'s vectors '
        "(None: off; docs/losses.md)",
    )
    guide_margin: float = option(0.0, "loss.guide: how far below the positive's guide score a candidate is still dropped")
    guide_margin_strategy: str = option(
        "absolute",
        'loss.guide: "absolute" drops score > s_pos - margin; "relative" drops score > s_pos - |s_pos| * margin',
    )
    matryoshka_dims: list[int] | None = option(
        None,
        "Matryoshka: the loss summed over these prefix sizes of the embedding, e.g. [384, 256, 128, 64] (None: the full "
        "embedding only); each prefix is re-normalised, so it works truncated.",
    )
    matryoshka_weights: list[float] | None = option(None, "one weight per matryoshka_dims entry (None: all 1)")
    score_loss: str = option(
        "cosent",
        'mode scored: the loss ranking the pairs\' similarities by their scores, "cosent" (cosine) or "angle" (AnglE\'s '
        "angle difference); simcse_kit.core.score_losses, docs/losses.md",
    )
    score_scale: float = option(20.0, "mode scored: the score loss's inverse temperature (sentence-transformers' 20)")
    score_weight: float = option(
        1.0,
        "mode scored: loss = (1 - w) * InfoNCE over the pairs (sent1 the positive of sent0) + w * score loss; 1: the "
        "score loss alone (the default: a low-scored pair is no positive)",
    )
    distill: str | None = option(
        None,
        f"mode hardneg with a teacher's scores of each row's positive and negatives (data column scores, or CSV score_pos, "
        f"score_neg_1 ..; written by simcse-kit score): {one_of(DISTILL_LOSSES)}: the student's cosines with the "
        "anchor's own candidates learn the teacher's softmax over them (KL) or its margins positive - negative "
        "(MarginMSE); docs/losses.md. null: off (scores in the file are ignored).",
    )
    distill_weight: float = option(
        1.0, "loss = (1 - w) * InfoNCE + w * distill term; 1: the distill term alone (no in-batch contrast)"
    )
    distill_teacher_temperature: float = option(
        0.05,
        "distill kl: the teacher's scores are divided by this before their softmax (0.05 for a bi-encoder's cosines, "
        "about 1 for a cross-encoder's logits)",
    )
    distill_student_temperature: float | None = option(
        None, "distill kl: the student's cosines are divided by this (None: loss.temperature)"
    )
    quantization: str | None = option(
        None,
        f"quantization-aware training for {one_of(QUANTIZATION_TARGETS)} vectors: the contrastive loss again on the "
        "straight-through codes (binary: signs, int8: per-dimension codes on the batch's ranges), every Matryoshka "
        "prefix; docs/quantization.md. null: off.",
    )
    quantization_weight: float = option(1.0, "loss = contrastive + w * the same loss on the quantized codes")

    def check(self) -> None:
        """Raise :class:`~simcse_kit.errors.ConfigError` naming the first key whose value is not allowed."""
        in_range = f"{temperature_range()} ({TEMPERATURE_WHY})"
        unsup_losses = modes.UNSUP_LOSSES
        rules: list[Rule] = [
            ("temperature", usable_temperature(self.temperature), in_range),
            ("hard_negative_weight", self.hard_negative_weight > 0, "> 0"),
            ("unsup_loss", self.unsup_loss in unsup_losses, one_of(unsup_losses)),
            ("queue_size", self.queue_size >= 0, ">= 0 (0: off)"),
        ]
        if self.false_negative_threshold is not None:
            rules.append(("false_negative_threshold", -1 < self.false_negative_threshold <= 1, "in (-1, 1] or null"))
        if self.matryoshka_dims is not None:
            dims = self.matryoshka_dims
            ok = bool(dims) and all(d > 0 for d in dims) and len(set(dims)) == len(dims)
            rules.append(("matryoshka_dims", ok, "distinct sizes > 0, e.g. [384, 256, 128, 64] (or null)"))
        if self.matryoshka_weights is not None:
            n = len(self.matryoshka_dims or [])
            ok = len(self.matryoshka_weights) == n and all(w > 0 for w in self.matryoshka_weights)
            rules.append(("matryoshka_weights", ok, f"{n} weights > 0, one per loss.matryoshka_dims entry"))
        if self.queue_size > 0:
            rules.append(("momentum", 0 <= self.momentum < 1, "in [0, 1) with loss.queue_size > 0"))
        rules += [
            ("score_loss", self.score_loss in SCORE_LOSSES, f"one of {SCORE_LOSSES}"),
            ("score_scale", 0 < self.score_scale < math.inf, "> 0 and finite"),
            ("score_weight", 0 <= self.score_weight <= 1, "in [0, 1]"),
        ]
        if self.distill is not None:
            student_tau = self.distill_student_temperature
            rules += [
                ("distill", self.distill in DISTILL_LOSSES, f"{one_of(DISTILL_LOSSES)} (or null)"),
                ("distill_weight", 0 <= self.distill_weight <= 1, "in [0, 1]"),
                ("distill_teacher_temperature", usable_temperature(self.distill_teacher_temperature), in_range),
                ("distill_student_temperature", student_tau is None or usable_temperature(student_tau), f"null or {in_range}"),
            ]
        if self.teacher is not None:
            rules += [
                ("teacher_loss", self.teacher_loss in TEACHER_LOSSES, one_of(TEACHER_LOSSES)),
                ("teacher_weight", 0 <= self.teacher_weight <= 1, "in [0, 1]"),
                ("teacher_temperature", usable_temperature(self.teacher_temperature), in_range),
            ]
            student_tau = self.teacher_student_temperature
            student_tau_ok = student_tau is None or usable_temperature(student_tau)
            rules.append(("teacher_student_temperature", student_tau_ok, f"null or {temperature_range()}"))
            projection_ok = self.teacher_projection in TEACHER_PROJECTIONS
            rules.append(("teacher_projection", projection_ok, one_of(TEACHER_PROJECTIONS)))
        if self.quantization is not None:
            rules += [
                ("quantization", self.quantization in QUANTIZATION_TARGETS, f"{one_of(QUANTIZATION_TARGETS)} (or null)"),
                ("quantization_weight", 0 < self.quantization_weight < math.inf, "> 0 and finite"),
            ]
        if self.guide is not None:
            teacher_ok = self.guide != GUIDE_IS_TEACHER or self.teacher is not None
            rules += [
                ("guide", teacher_ok, "a model folder or hub id, or 'teacher' with a loss.teacher"),
                ("guide_margin", math.isfinite(self.guide_margin), "a finite number"),
                ("guide_margin_strategy", self.guide_margin_strategy in GUIDE_MARGIN_STRATEGIES, one_of(GUIDE_MARGIN_STRATEGIES)),
            ]
        raise_first("loss", self, rules)


@dataclass
class LoopConfig:
    """The optimisation loop (:func:`simcse_kit.training.engine.loop.fit`): what any model trained by
    it needs, text or image."""

    learning_rate: float = option(3e-5, "AdamW peak learning rate (linear decay to 0)")
    weight_decay: float = option(0.0, "AdamW weight decay (never on biases and norms)")
    warmup_ratio: float = option(0.0, "share of the steps with a linear warm-up")
    num_epochs: int = option(1, "passes over the training data")
    max_steps: int | None = option(None, "stop after N optimiser steps (None or 0: all epochs)")
    grad_accum: int = option(1, "micro-batches per optimiser step (negatives stay per micro-batch)")
    max_grad_norm: float | None = option(None, "clip the gradient norm to this (> 0; None: no clipping)")
    mixed_precision: str = option("no", f'{one_of(PRECISIONS)} (the text run defaults to "auto")')
    # With mixed_precision bf16: bf16 weights, activations and gradients with fp32 master
    # weights in AdamW, instead of autocast (simcse_kit.model.fastpath.bf16). Ignored at other
    # precisions, so `--mixed-precision no` on a bf16 recipe simply trains in fp32.
    bf16_weights: bool | str = option(False, 'True, False or "auto" (on where bf16 is native on CPU)')
    sparse_embedding_grad: bool | str = option(
        AUTO,
        "With bf16 weights: embedding tables get their gradient as the looked-up rows, added into a dense buffer kept "
        "across steps, instead of a freshly allocated table-sized gradient every backward (simcse_kit.model.fastpath.bf16). "
        '"auto": in a single process (DistributedDataParallel expects a sparse module\'s gradient to be sparse).',
    )
    seed: int = option(42, "model head init, shuffling and dropout")
    eval_steps: int = option(125, "evaluate every N optimiser steps (0: only at the end)")
    eval_at_start: bool = option(
        True,
        "Evaluate the untouched model too (step 0), so best-checkpoint selection can keep it: training must never hand "
        "back a model worse on dev than the one it started from.",
    )
    log_steps: int = option(10, "record the loss every N steps")
    save_steps: int = option(0, "full training state every N steps for --resume (0: off)")
    progress_bar: bool = option(True, "tqdm bar on the main process")
    # A dead peer (its process killed, its node down) closes its sockets, and gloo and NCCL
    # fail the survivors' next collective at once, whatever this says; it bounds a peer that
    # is alive but silent (hung, or cut off without a reset), where torch waits 30 min (gloo)
    # or 10 min (NCCL) on every node. 5 min is still far over the longest wait the kit puts
    # a process through inside a collective: the main process's dev evaluation and saves
    # (seconds); a node still building its data caches while the others wait to start the
    # group (the text cache of a 1M-line file: ~3 s, docs/contamination.md; its token table
    # longer). The teacher's vectors are encoded on rank 0 first while the others wait:
    # raise it for a big teacher's first run (later runs read the cache).
    collective_timeout_s: float = option(
        300.0,
        "Several processes: a collective that hears nothing from a peer for this many seconds fails the run, naming "
        "the peer, with the --resume command (a peer that dies fails it at once)",
    )
    report_to: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Experiment trackers (Accelerate's names: tensorboard, wandb, mlflow, ...; a list, or comma-separated on the "
            "command line) that get loss, learning rate, gradient norm, throughput and every evaluation against the step ([] "
            "or none: no tracking)."
        },
    )

    @property
    def bf16_model(self) -> bool:
        """Whether the model itself runs in bf16 (``bf16_weights`` at bf16 precision)."""
        return self.bf16_weights is True and self.mixed_precision == "bf16"

    def check(self) -> None:
        """Raise :class:`~simcse_kit.errors.ConfigError` naming the first key whose value is not allowed."""
        rules: list[Rule] = [
            ("learning_rate", 0 < self.learning_rate < math.inf, "> 0 and finite"),
            ("grad_accum", self.grad_accum >= 1, ">= 1"),
            ("num_epochs", self.num_epochs >= 1, ">= 1"),
            ("mixed_precision", self.mixed_precision in PRECISIONS, f"one of {PRECISIONS}"),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1, "in [0, 1)"),
            ("eval_steps", self.eval_steps >= 0, ">= 0 (0: evaluate only at the end)"),
            ("save_steps", self.save_steps >= 0, ">= 0 (0: no periodic checkpoints)"),
            ("log_steps", self.log_steps >= 1, ">= 1"),
            ("collective_timeout_s", 0 < self.collective_timeout_s < math.inf, "> 0 and finite"),
            # numpy's seed (accelerate's set_seed seeds it too) is a uint32.
            ("seed", 0 <= self.seed < 2**32, "in [0, 2**32 - 1] (numpy's seed range)"),
            # Negative decay pushes weights away from zero: never a regulariser, always a typo.
            ("weight_decay", 0 <= self.weight_decay < math.inf, ">= 0 and finite (0: no decay)"),
        ]
        if self.max_steps is not None:
            rules.append(("max_steps", self.max_steps >= 0, ">= 0 or null (0 or null: all epochs)"))
        if self.max_grad_norm is not None:
            # 0 would clip every update to nothing: the model would silently never change.
            ok = math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0
            rules.append(("max_grad_norm", ok, "> 0, or null for no clipping"))
        raise_first("train", self, rules)


@dataclass
class TrainConfig(LoopConfig):
    """The YAML ``train:`` section: the loop's settings plus the text run's own (where
    it writes, how big a batch is, how the model is made faster)."""

    output_dir: str = option("runs/unsup", "the run folder (config.yaml, metrics.json, best_model/)")
    mixed_precision: str = option(
        AUTO,
        f"{one_of(PRECISIONS)}. A text run picks its precision from the hardware unless told: bf16 (with bf16 weights and "
        "fast dropout) on a CPU that computes bf16 natively, bf16/fp16 on CUDA, else fp32.",
    )
    bf16_weights: bool | str = option(AUTO, 'True, False or "auto": bf16 weights with fp32 masters (native-bf16 CPU)')
    batch_size: int = option(64, "examples per optimiser micro-step, over all processes")
    gradient_checkpointing: bool = option(
        False,
        "Recompute the encoder's activations in the backward pass instead of keeping them: less memory for a longer "
        "step; the same gradients (dropout's random draws are replayed). transformers' own where the model has it, "
        "else per transformer block (MPNet; simcse_kit.model.checkpointing).",
    )
    fast_dropout: bool | str = option(
        AUTO,
        'cheaper dropout RNG, same distribution (simcse_kit.model.fastpath); "auto": CPU with native bf16',
    )
    grad_cache_chunk: int = option(0, "GradCache: encode the batch in chunks of this many rows (0: off)")
    mmap_threshold_mib: int | None = option(
        None,
        "glibc only: blocks of this many MiB or more get their own mapping, given back to the OS when freed "
        "(simcse_kit.model.heap). Less resident memory for a slower step (BENCHMARKS.md, Memory). None: malloc as it comes.",
    )
    final_eval: bool = option(True, "score the best model on the 7 STS tasks at the end (false: dev-only sweeps)")
    selection_precision: str = option(
        "float32",
        f"select the best checkpoint on dev vectors at this precision ({one_of(VECTOR_PRECISIONS)}), the one the model "
        "will be deployed at; int8/uint8 ranges from the first 1,000 training sentences at each evaluation",
    )
    compile: bool = option(
        False,
        "torch.compile the encoder (dynamic shapes: padded and packed batches change shape every step); recorded in "
        "metrics.json. Not with fast_dropout. Off by default: unmeasured on GPU.",
    )

    def check(self) -> None:
        """Raise :class:`~simcse_kit.errors.ConfigError` naming the first key whose value is not allowed."""
        raise_first("train", self, [("batch_size", self.batch_size >= 2, ">= 2 (in-batch negatives need a second example)")])
        super().check()
        rules: list[Rule] = [
            ("output_dir", self.output_dir.strip() != "", "a folder ('' would write into the current one)"),
            ("grad_cache_chunk", self.grad_cache_chunk >= 0, ">= 0 (0: off)"),
            ("selection_precision", self.selection_precision in VECTOR_PRECISIONS, one_of(VECTOR_PRECISIONS)),
        ]
        if self.mmap_threshold_mib is not None:
            # glibc's mallopt takes 0..32 MiB on 64-bit; below 1 MiB every activation would be a mapping.
            rules.append(("mmap_threshold_mib", 1 <= self.mmap_threshold_mib <= 32, "in [1, 32] or null"))
        raise_first("train", self, rules)


def check_datasets(specs: list[DatasetSpec], sampling: str) -> None:
    """The checks of ``data.datasets`` as a whole: at least one, distinct names, each spec's
    values (:meth:`DatasetSpec.problems`), weights only where they are used.

    Raises:
        ConfigError: ``config key 'data.datasets' entry 'name': ...``.
    """
    if not specs:
        raise ConfigError("config key 'data.datasets' = []: list at least one dataset (or leave it null)")
    seen: set[str] = set()
    for spec in specs:
        where = f"config key 'data.datasets' entry {spec.name!r}"
        if spec.name in seen:
            raise ConfigError(f"{where}: the name is given twice; each dataset needs its own name")
        seen.add(spec.name)
        problems = spec.problems()
        if spec.weight is not None and sampling != "weighted":
            problems.append(f"weight {spec.weight!r}: only used with data.sampling weighted (data.sampling is {sampling!r})")
        if problems:
            raise ConfigError(f"{where}: {problems[0]}")


DATASET_KEYS = tuple(f.name for f in fields(DatasetSpec))
