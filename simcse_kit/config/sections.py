"""The sections of a run's configuration: one dataclass per concern, each field with its
default and its meaning (``field(metadata={"help": ...})``, printed by
``simcse-kit train --help``).

:mod:`simcse_kit.config.run` puts them together (:class:`~simcse_kit.config.run.RunConfig`), checks
them and reads them from YAML; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "all-MiniLM-L6-v2"
AUTO = "auto"  # decided at start-up from the hardware (simcse_kit.model.precision)
OPTIONAL_DATA_PATHS = ("mix_file", "dev_file")  # data keys that are paths when set, resolved as train_file
HUB_PREFIX = "hub:"  # data.train_file naming a hub dataset, not a path


def option(default: Any, help: str) -> Any:
    """A config field with its meaning, printed by ``simcse-kit train --help`` (:func:`simcse_kit.config.run.key_help`)."""
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    """The encoder and how a sentence vector is read off it."""

    name_or_path: str = option(DEFAULT_MODEL, "the bundled default, a local folder or a hub id")
    pooler: str = option("avg", "one of POOLERS")
    mlp: str = option("none", '"train": SimCSE\'s MLP only while training; "always": kept at inference')
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
    lora_alpha: float = option(16.0, "LoRA scaling numerator: the update is scaled by lora_alpha / lora_r")
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


@dataclass
class DataConfig:
    """Training data and the STS data used for dev selection."""

    mode: str = option("unsup", "one of MODES")
    # Data paths: "{data_root}" stands for the data root; other relative paths are read from
    # the recipe's folder (on the command line, from the current one). Saved absolute.
    train_file: str = option("{data_root}/train/wiki1m_head.txt", 'file path, or "hub:<dataset id>"')
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
        "that format whose distinct sentences become the unsup corpus (scores unused).",
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
    mix_file: str | None = option(None, "a second (general) corpus mixed into train_file, in data.mode's format")
    mix_ratio: float = option(0.0, "share of the mixed training set drawn from mix_file, in [0, 1)")
    dev_file: str | None = option(None, "dev split for checkpoint selection (None: STS-B dev of eval_data_dir)")
    dev_format: str = option(
        "stsb",
        'dev_file\'s format: "stsb" (sts-dev.csv), "sick" (SICK_trial.txt) or "beir" (a BEIR-format retrieval '
        "folder: selects on its qrels/dev.tsv nDCG@10, docs/retrieval.md)",
    )
    prompts: dict[str, str] | None = option(
        None,
        'Prompts put before the texts, e5/bge-style: {query: "query: ", document: "passage: "}. In training view 0 '
        "(the anchor) is the query and the other views are documents; they are saved with the model, used by evaluation "
        "and written into the export (docs/retrieval.md).",
    )

    def path_keys(self) -> list[str]:
        """The keys holding a data path, where set (a ``hub:`` dataset is not a path)."""
        keys = ("train_file", "eval_data_dir", *OPTIONAL_DATA_PATHS)
        return [key for key in keys if getattr(self, key) is not None and not getattr(self, key).startswith(HUB_PREFIX)]


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
        "where teacher vectors are cached (None: $SIMCSE_KIT_CACHE or ~/.cache/simcse-kit)",
    )
    matryoshka_dims: list[int] | None = option(
        None,
        "Matryoshka: the loss summed over these prefix sizes of the embedding, e.g. [384, 256, 128, 64] (None: the full "
        "embedding only); each prefix is re-normalised, so it works truncated.",
    )
    matryoshka_weights: list[float] | None = option(None, "one weight per matryoshka_dims entry (None: all 1)")


@dataclass
class LoopConfig:
    """The optimisation loop (:func:`simcse_kit.training.loop.fit`): what any model trained by
    it needs, text or image."""

    learning_rate: float = option(3e-5, "AdamW peak learning rate (linear decay to 0)")
    weight_decay: float = option(0.0, "AdamW weight decay (never on biases and norms)")
    warmup_ratio: float = option(0.0, "share of the steps with a linear warm-up")
    num_epochs: int = option(1, "passes over the training data")
    max_steps: int | None = option(None, "stop after N optimiser steps (None or 0: all epochs)")
    grad_accum: int = option(1, "micro-batches per optimiser step (negatives stay per micro-batch)")
    max_grad_norm: float | None = option(None, "clip the gradient norm to this (> 0; None: no clipping)")
    mixed_precision: str = option("no", 'one of PRECISIONS (the text run defaults to "auto")')
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


@dataclass
class TrainConfig(LoopConfig):
    """The YAML ``train:`` section: the loop's settings plus the text run's own (where
    it writes, how big a batch is, how the model is made faster)."""

    output_dir: str = option("runs/unsup", "the run folder (config.yaml, metrics.json, best_model/)")
    mixed_precision: str = option(
        AUTO,
        "A text run picks its precision from the hardware unless told: bf16 (with bf16 weights and fast dropout) on a CPU"
        " that computes bf16 natively, bf16/fp16 on CUDA, else fp32.",
    )
    bf16_weights: bool | str = option(AUTO, 'True, False or "auto": bf16 weights with fp32 masters (native-bf16 CPU)')
    batch_size: int = option(64, "examples per optimiser micro-step, over all processes")
    gradient_checkpointing: bool = option(
        False,
        "Recompute the encoder's activations in the backward pass instead of keeping them: less memory for a longer "
        "step; the same gradients (dropout's random draws are replayed).",
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
    compile: bool = option(
        False,
        "torch.compile the encoder (dynamic shapes: padded and packed batches change shape every step); recorded in "
        "metrics.json. Not with fast_dropout. Off by default: unmeasured on GPU.",
    )
