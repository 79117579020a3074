"""Grouped-query and sliding-window attention through every attention path ``auto`` can pick.

The tiny decoders (:func:`tiny_encoders.build_tiny_decoder`) are shaped like the real
ones: Qwen3 4:2 query to key/value heads, Llama 8:1, Mistral 4:1 with a sliding window on
every layer, Gemma3 text 4:1 with a window on one layer of two. Each path is forced, so any
CPU runs them all: fast dropout (what ``auto`` turns on on a CPU with native bf16), packing
(on by default), SDPA and eager attention.

The reference is always the model's own eager attention (transformers' ``repeat_kv``, its
mask builder's windows) in fp32. With dropout on, the eager attention's
``torch.nn.functional.dropout`` is replaced by :func:`fast_dropout` for the reference, so
both draw the same mask from the same seed and must give the same numbers (1e-5).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences, write_tiny_senteval, write_train_data
from safetensors.torch import load_file
from tiny_encoders import DECODERS
from torch import nn
from transformers import AutoConfig
from transformers.masking_utils import and_masks, causal_mask_function, padding_mask_function, sdpa_mask
from transformers.masking_utils import sliding_window_causal_mask_function as window_mask_function
from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward as gemma3_eager
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager

from simcse_kit.config.run import DataConfig, LossConfig, ModelConfig, RunConfig, TrainConfig
from simcse_kit.model.checks import load_checked_tokenizer
from simcse_kit.model.families import sliding_window
from simcse_kit.model.fastpath import ATTENTION_NAME, enable_fast_dropout, fast_dropout, fast_dropout_attention, internals
from simcse_kit.model.modeling import SimCSEModel, base_encoder
from simcse_kit.model.packing import pack

TOL = 1e-5


@contextlib.contextmanager
def eager_draws_fast_dropout() -> Iterator[None]:
    """Within the block, ``torch.nn.functional.dropout`` (what transformers' eager attention
    calls on the probabilities) is :func:`fast_dropout`: the same draws from the same seed."""

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        return fast_dropout(x, p) if training and p > 0 else x

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "dropout", dropout)
        yield


# --------------------------------------------------------------------------- the attention function


class Attention(nn.Module):
    """What transformers' attention functions read off the module."""

    def __init__(self, heads: int, kv_heads: int, causal: bool) -> None:
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = causal


def boolean_mask(kind: str, lengths: list[int], t: int) -> torch.Tensor | None:
    """``[B, 1, t, t]`` as transformers' SDPA mask builder makes it (True = attend), or None."""
    if kind.startswith("none"):
        return None
    padding = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    pattern = window_mask_function(3) if kind == "window" else causal_mask_function
    mask = sdpa_mask(
        batch_size=len(lengths),
        q_length=t,
        kv_length=t,
        mask_function=and_masks(pattern, padding_mask_function(padding)),
        allow_is_causal_skip=False,
    )
    assert mask is not None and mask.dtype == torch.bool
    return mask


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("mask_kind", ["causal", "window", "additive", "none-causal", "none-bidirectional"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (8, 1), (4, 4)])
def test_fast_dropout_attention_is_eager_attention(heads: int, kv_heads: int, mask_kind: str, softcap: float | None) -> None:
    """Against transformers' eager attention (``repeat_kv``; Gemma's softcap), dropout 0.2 on
    the same draws: output and the gradients of query, key and value, fp32. Grouped heads
    4:2 and 8:1 (and none, 4:4); a causal mask with padding, a sliding window of 3 (keys
    more than 2 back are not seen), the same as an additive mask, and no mask at all, which
    the causal module must still read as causal (transformers' SDPA mask builder leaves the
    mask out of a batch without padding and relies on ``is_causal``)."""
    torch.manual_seed(0)
    b, t, dim = 3, 7, 8
    lengths = [7, 5, 2] if not mask_kind.startswith("none") else [7, 7, 7]
    query = torch.randn(b, heads, t, dim, requires_grad=True)
    key = torch.randn(b, kv_heads, t, dim, requires_grad=True)
    value = torch.randn(b, kv_heads, t, dim, requires_grad=True)
    module = Attention(heads, kv_heads, causal=mask_kind != "none-bidirectional").train()
    mask = boolean_mask("causal" if mask_kind == "additive" else mask_kind, lengths, t)
    if mask_kind == "none-causal":
        eager_mask = boolean_mask("causal", lengths, t)
    else:
        eager_mask = mask
    additive = (
        None if eager_mask is None else torch.zeros(eager_mask.shape).masked_fill(~eager_mask, torch.finfo(torch.float32).min)
    )
    ours = additive if mask_kind == "additive" else mask
    # Pad queries' outputs are unused (and a window can hide every key from one: eager's
    # additive mask then passes a gradient that masked_fill does not).
    real = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()
    grad = torch.randn(b, t, heads, dim) * real[:, :, None, None]
    scaling = 0.3
    extra = {"softcap": softcap} if softcap is not None else {}

    torch.manual_seed(5)
    got, _ = fast_dropout_attention(module, query, key, value, ours, dropout=0.2, scaling=scaling, **extra)
    got_grads = torch.autograd.grad(got, (query, key, value), grad)
    eager = gemma3_eager if softcap is not None else llama_eager
    with eager_draws_fast_dropout():
        torch.manual_seed(5)
        want, _ = eager(module, query, key, value, additive, dropout=0.2, scaling=scaling, **extra)
    want_grads = torch.autograd.grad(want, (query, key, value), grad)

    assert got.shape == (b, t, heads, dim)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=0, msg=name)
    # Dropout really dropped (else the draws would not be compared).
    torch.manual_seed(5)
    plain, _ = fast_dropout_attention(module, query, key, value, ours, dropout=1e-9, scaling=scaling, **extra)
    assert (plain - got).abs().max() > 1e-2


def test_a_window_hides_what_it_should() -> None:
    """Known answer: with a window of 3 the last query sees keys 4, 5 and 6 only; changing
    key 3 changes nothing there, changing key 4 does."""
    torch.manual_seed(1)
    module = Attention(4, 2, causal=True).train()
    q, k, v = torch.randn(1, 4, 7, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    mask = boolean_mask("window", [7], 7)
    base, _ = fast_dropout_attention(module, q, k, v, mask, dropout=1e-9)
    for position, seen in ((3, False), (4, True)):
        moved = v.clone()
        moved[:, :, position] += 10.0
        out, _ = fast_dropout_attention(module, q, k, moved, mask, dropout=1e-9)
        assert bool((out[0, -1] - base[0, -1]).abs().max() > 1e-3) is seen, position


def test_attention_sinks_are_refused() -> None:
    module = Attention(4, 2, causal=True).train()
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="sinks"):
        fast_dropout_attention(module, q, k, k, None, dropout=0.1, s_aux=torch.zeros(4))


# --------------------------------------------------------------------------- whole decoders


TEXTS = [
    "a man plays the guitar in the park with a dog and a cat",
    "two children",
    "a woman reads a book",
    "the dog swims",
    "a young man drives a red car on the street outside",
    "people",
]
SAME_LENGTH = ["a man plays guitar", "a dog eats food", "the cat is sad"]  # no padding: the builder leaves the mask out


def decoder(path: Path, *, attn: str, packing: bool, fast: bool, dropout: float = 0.1) -> SimCSEModel:
    model = SimCSEModel.from_config(
        ModelConfig(name_or_path=str(path), pooler="last", dropout=dropout, packing=packing, attn_implementation=attn)
    )
    assert model.packing is packing
    if fast:
        enable_fast_dropout(model)
        assert internals.attention_implementation(base_encoder(model.encoder)) == ATTENTION_NAME  # the check passed
    return model.train()


def vectors_and_grads(
    model: SimCSEModel, batch: dict[str, torch.Tensor], seed: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(**batch)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(
    got: tuple[torch.Tensor, dict[str, torch.Tensor]], want: tuple[torch.Tensor, dict[str, torch.Tensor]], msg: str
) -> None:
    torch.testing.assert_close(got[0], want[0], atol=TOL, rtol=0, msg=msg)
    assert got[1].keys() == want[1].keys() and got[1], msg
    for name, g in want[1].items():
        scale = max(1.0, g.abs().max().item())  # a gradient summed over many tokens
        torch.testing.assert_close(got[1][name], g, atol=TOL * scale, rtol=0, msg=f"{msg}: {name}")


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("arch", DECODERS)
def test_fast_dropout_trains_each_decoder_as_eager_attention(arch: str, packing: bool, decoder_dirs: dict[str, Path]) -> None:
    """Each decoder in train mode with dropout 0.1, padded and packed: the fast-dropout
    attention gives the vectors and gradients of the model's own eager attention drawing the
    same mask; from a batch with padding (left, sentences longer than the window beside short
    ones) and one without (no mask: causal all the same)."""
    path = decoder_dirs[arch]
    tokenizer = load_checked_tokenizer(path)
    fast = decoder(path, attn="sdpa", packing=packing, fast=True)
    eager = decoder(path, attn="eager", packing=packing, fast=False)
    window = sliding_window(AutoConfig.from_pretrained(path))
    for texts in (TEXTS, SAME_LENGTH):
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        if window is not None and texts is TEXTS:
            assert int(batch["attention_mask"].sum(1).max()) > window  # the window is visible
        if packing and texts is TEXTS:
            packed = pack(batch["input_ids"], batch["attention_mask"], left_padding=True)
            assert packed is not None and packed.rows < len(texts)
        got = vectors_and_grads(fast, batch, seed=3)
        with eager_draws_fast_dropout():
            want = vectors_and_grads(eager, batch, seed=3)
        assert_same(got, want, f"{arch} packing={packing} {texts[0]!r}")
        undropped = vectors_and_grads(fast.eval(), batch, seed=3)[0]
        fast.train()
        assert (undropped - got[0]).abs().max() > 1e-3  # dropout was on: the draws were compared


@pytest.mark.parametrize("arch", DECODERS)
def test_every_attention_path_gives_the_eager_vectors_without_dropout(arch: str, decoder_dirs: dict[str, Path]) -> None:
    """Dropout 0 (and a rate that rounds to 0, which runs fast dropout's explicit attention):
    SDPA, eager and fast dropout, padded and packed, all give eager padded's vectors and
    gradients."""
    path = decoder_dirs[arch]
    tokenizer = load_checked_tokenizer(path)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    want = vectors_and_grads(decoder(path, attn="eager", packing=False, fast=False, dropout=0.0), batch, seed=0)
    for attn, fast, dropout in (("sdpa", False, 0.0), ("eager", False, 0.0), ("sdpa", True, 1e-9), ("eager", True, 1e-9)):
        for packing in (False, True):
            model = decoder(path, attn=attn, packing=packing, fast=fast, dropout=dropout)
            assert_same(vectors_and_grads(model, batch, seed=0), want, f"{arch} {attn} fast={fast} packing={packing}")


# --------------------------------------------------------------------------- whole runs


def run_config(path: Path, out: Path, *, fast: bool, packing: bool, attn: str, dropout: float = 0.1) -> RunConfig:
    return RunConfig(
        model=ModelConfig(
            name_or_path=str(path),
            pooler="last",
            max_seq_len=16,
            eval_max_seq_len=32,
            dropout=dropout,
            packing=packing,
            attn_implementation=attn,
        ),
        data=DataConfig(
            mode="unsup",
            train_file=str(write_train_data(out.parent, "unsup", n=24)),
            eval_data_dir=str(write_tiny_senteval(out.parent / "senteval")),
        ),
        loss=LossConfig(temperature=0.05),
        train=TrainConfig(
            output_dir=str(out),
            batch_size=8,
            learning_rate=1e-3,  # Adam turns rounding in near-zero gradients into steps of lr: as tests/test_multiprocess.py
            num_epochs=1,
            eval_steps=0,
            eval_at_start=False,
            save_steps=0,
            final_eval=False,
            mixed_precision="no",  # fp32: the comparison's tolerance
            bf16_weights=False,
            fast_dropout=fast,
            seed=7,
            progress_bar=False,
        ),
    ).validate()


def final_vectors(out: Path) -> torch.Tensor:
    from simcse_kit.model.inference import load_encoder

    return load_encoder(out).encode([*toy_sentences(12), "a " * 20])


@pytest.mark.slow  # 16 short runs
@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("arch", DECODERS)
def test_a_fast_dropout_run_ends_as_the_eager_run(
    arch: str, packing: bool, decoder_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Three optimiser steps of unsup training at dropout 0.1, fp32, packed or padded: fast
    dropout (as ``auto`` turns it on on a native-bf16 CPU) ends with the vectors and
    weights of the eager-attention run drawing the same masks."""
    from simcse_kit.training.wiring.run import train

    path = decoder_dirs[arch]
    metrics = train(run_config(path, tmp_path / "fast", fast=True, packing=packing, attn="sdpa"))
    with eager_draws_fast_dropout():
        reference = train(run_config(path, tmp_path / "eager", fast=False, packing=packing, attn="eager"))
    assert metrics["steps"] == reference["steps"] == 3
    for (step, loss), (_, want) in zip(metrics["losses"], reference["losses"], strict=True):
        assert loss == pytest.approx(want, abs=TOL), step
    got, want = (load_file(str(tmp_path / name / "best_model" / "model.safetensors")) for name in ("fast", "eager"))
    base = load_file(str(path / "model.safetensors"))
    assert any(not torch.equal(base[k], want[k]) for k in base)  # it trained
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=TOL, rtol=0, msg=key)
    torch.testing.assert_close(final_vectors(tmp_path / "fast"), final_vectors(tmp_path / "eager"), atol=TOL, rtol=0)


# A launcher for the reference runs: the CLI with transformers' eager attention drawing its
# dropout mask as fast dropout does (what eager_draws_fast_dropout does in this process).
EAGER_WITH_FAST_DRAWS = """
import sys

import torch

from simcse_kit.cli import main
from simcse_kit.model.fastpath import fast_dropout


def dropout(x, p=0.5, training=True, inplace=False):
    return fast_dropout(x, p) if training and p > 0 else x


torch.nn.functional.dropout = dropout
sys.exit(main(sys.argv[1:]))
"""


def launch_two(tmp_path: Path, recipe: Path, options: dict[str, object], eager_draws: bool = False) -> Path:
    """``simcse-kit train`` on 2 gloo processes (torchrun); the run folder."""
    import subprocess

    from test_multiprocess import ENV_EXTRA, torchrun

    (command,) = torchrun(1, 2, recipe, options)
    if eager_draws:
        script = tmp_path / "eager_with_fast_draws.py"
        script.write_text(EAGER_WITH_FAST_DRAWS, encoding="utf-8")
        at = command.index("simcse_kit.cli")
        command = [*command[: at - 1], str(script), *command[at + 1 :]]
    done = subprocess.run(command, env=os.environ | ENV_EXTRA, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "optimiser steps on 2 process(es)" in log and "fast dropout off" not in log, log[-4000:]
    return Path(str(options["output_dir"]))


def assert_same_weights(got_dir: Path, want: dict[str, torch.Tensor], msg: str) -> None:
    got = load_file(str(got_dir / "best_model" / "model.safetensors"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=TOL, rtol=0, msg=f"{msg} {key}")


@pytest.mark.slow  # torchrun: 2 fresh interpreters per launch, 3 launches
@pytest.mark.parametrize("arch", DECODERS)
def test_two_processes_with_fast_dropout_train_as_eager_attention(
    arch: str, decoder_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """2 gloo processes, packed, fp32. Fast dropout forced on at a rate that rounds to 0 (its
    explicit attention, nothing dropped) ends with the weights of one eager process. At
    dropout 0.1 it ends with the weights of 2 eager processes drawing the same masks."""
    import yaml

    from simcse_kit.training.wiring.run import train

    path = decoder_dirs[arch]
    reference = run_config(path, tmp_path / "eager", fast=False, packing=False, attn="eager", dropout=1e-9)
    train(reference)
    want = load_file(str(tmp_path / "eager" / "best_model" / "model.safetensors"))
    recipe = tmp_path / "recipe.yaml"
    keys = ("batch_size", "learning_rate", "num_epochs", "eval_steps", "save_steps", "seed")
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(path), "pooler": "last", "max_seq_len": 16, "eval_max_seq_len": 32},
                "data": {"mode": "unsup", "train_file": reference.data.train_file, "eval_data_dir": reference.data.eval_data_dir},
                "loss": {"temperature": 0.05},
                "train": {k: getattr(reference.train, k) for k in keys}
                | {"eval_at_start": False, "final_eval": False, "progress_bar": False, "mixed_precision": "no"},
            }
        ),
        encoding="utf-8",
    )
    fast = {"fast_dropout": "true", "bf16_weights": "false", "packing": "true", "attn_implementation": "sdpa"}
    out = launch_two(tmp_path, recipe, {"output_dir": tmp_path / "fast-0", "dropout": 1e-9, **fast})
    assert_same_weights(out, want, "2 processes, nothing dropped:")

    dropped = launch_two(tmp_path, recipe, {"output_dir": tmp_path / "fast-0.1", "dropout": 0.1, **fast})
    eager = {"fast_dropout": "false", "bf16_weights": "false", "packing": "true", "attn_implementation": "eager"}
    drawn = launch_two(tmp_path, recipe, {"output_dir": tmp_path / "eager-0.1", "dropout": 0.1, **eager}, eager_draws=True)
    want = load_file(str(drawn / "best_model" / "model.safetensors"))
    assert any(not torch.equal(want[k], v) for k, v in load_file(str(out / "best_model" / "model.safetensors")).items())
    assert_same_weights(dropped, want, "2 processes, dropout 0.1:")


@pytest.mark.slow  # a run with its STS table, an export and sentence-transformers
def test_the_issue_48_command_trains_exports_and_loads(
    decoder_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``simcse-kit train train/unsup.yaml --name-or-path <Qwen3> --pooler last --dropout 0.1
    --lora-r 8`` with what ``auto`` picks on a CPU with native bf16 (forced: bf16, bf16
    weights, fast dropout; packing on), then ``simcse-kit export``: it trains through the
    fast-dropout attention (not a fallback), and sentence-transformers (last-token pooling)
    gives the kit's vectors."""
    from sentence_transformers import SentenceTransformer

    from simcse_kit.cli import main
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.training.wiring import run

    routed = []

    def spy(model: nn.Module) -> int:
        swapped = enable_fast_dropout(model)
        routed.append(internals.attention_implementation(base_encoder(model.encoder)))  # type: ignore[arg-type]
        return swapped

    monkeypatch.setattr(run, "enable_fast_dropout", spy)
    data = tmp_path / "data"
    data.mkdir()
    options = {
        "name-or-path": decoder_dirs["qwen3"],
        "pooler": "last",
        "dropout": 0.1,
        "lora-r": 8,
        "train-file": write_train_data(data, "unsup", n=32),
        "eval-data-dir": write_tiny_senteval(data / "senteval"),
        "output-dir": tmp_path / "run",
        "max-steps": 4,
        "eval-steps": 2,
        "batch-size": 8,
        "eval-max-seq-len": 32,
        "mixed-precision": "bf16",
        "bf16-weights": "true",
        "fast-dropout": "true",
        "report-to": "[]",
    }
    recipe = Path(__file__).resolve().parents[1] / "train" / "unsup.yaml"
    assert main(["train", str(recipe), *(t for k, v in options.items() for t in (f"--{k}", str(v)))]) == 0
    assert routed == [ATTENTION_NAME]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["speed"]["packing"] is True
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "export")]) == 0
    sents = [*toy_sentences(16), "a " * 40]
    ours = load_encoder(tmp_path / "run").encode(sents).double()
    theirs = SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(sents, convert_to_tensor=True).double()
    cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cos.min().item() >= 0.9999, cos
