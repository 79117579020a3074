"""Decoder-only backbones (Qwen3, Llama, Gemma3 text) and LoRA adapters, on tiny random
models built from configs: last-token vectors that do not depend on the padding side, an
EOS the tokenizer appends, every mode trained with and without LoRA through the run, a
resume that ends exactly as the uninterrupted run, reload, evaluation and export to
sentence-transformers with parity; gradient checkpointing with the same gradients."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences, write_tiny_senteval, write_train_data
from safetensors.torch import load_file
from tiny_encoders import DECODERS, build_tiny_decoder
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.config.run import DataConfig, LossConfig, ModelConfig, RunConfig, TrainConfig
from simcse_kit.core.modes import TABLE as MODES
from simcse_kit.data.readers import ContrastiveCollator, load_train_dataset
from simcse_kit.model.checks import load_checked_tokenizer
from simcse_kit.model.families import is_decoder, prepare_tokenizer
from simcse_kit.model.modeling import ADAPTER_CONFIG, SimCSEModel, base_encoder
from simcse_kit.training.objectives import SimCSEObjective

TEXTS = ["the cat sat on the mat .", "a dog", "the bird sings a song today , and the cat sleeps"]


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {arch: build_tiny_decoder(arch, root / arch) for arch in DECODERS}


@pytest.fixture(scope="module")
def senteval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_senteval(tmp_path_factory.mktemp("senteval") / "senteval")


def test_decoders_are_told_from_encoders(decoder_dirs: dict[str, Path], tiny_model_dir: Path) -> None:
    assert all(is_decoder(AutoConfig.from_pretrained(path)) for path in decoder_dirs.values())
    assert not is_decoder(AutoConfig.from_pretrained(tiny_model_dir))  # BERT has a causal head too, and a masked one


def test_the_tokenizer_appends_eos_keeps_bos_and_pads(decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Known ids: Qwen3 (no BOS) gets ``the cat <|im_end|>``; Llama keeps ``<s>`` first and,
    having no pad token, pads with ``</s>``; the change is saved with the tokenizer."""
    expected = {"qwen3": ([10, 7, 2], "<|endoftext|>"), "llama": ([1, 10, 7, 2], "</s>"), "gemma3_text": ([2, 11, 8, 3], "<pad>")}
    for arch, path in decoder_dirs.items():
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path), AutoConfig.from_pretrained(path))
        ids, pad = expected[arch]
        assert tokenizer("the cat")["input_ids"] == ids and tokenizer.pad_token == pad, arch
        assert tokenizer("the cat", truncation=True, max_length=2)["input_ids"][-1] == ids[-1]  # EOS survives truncation
        tokenizer.save_pretrained(tmp_path / arch)
        assert AutoTokenizer.from_pretrained(tmp_path / arch)("the cat")["input_ids"] == ids, arch
        assert prepare_tokenizer(tokenizer, AutoConfig.from_pretrained(path))("the cat")["input_ids"] == ids  # once only


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("arch", DECODERS)
def test_last_token_vector_ignores_the_padding_side(arch: str, lora: int, decoder_dirs: dict[str, Path]) -> None:
    """Left-padded, right-padded and unpadded (one sentence at a time) give one vector."""
    cfg = ModelConfig(name_or_path=str(decoder_dirs[arch]), pooler="last", dropout=0.0, lora_r=lora)
    model = SimCSEModel.from_config(cfg).eval()
    assert model.is_decoder and not model.packing  # a causal model is never packed with a bidirectional block mask
    tokenizer = load_checked_tokenizer(decoder_dirs[arch])
    vectors = {}
    with torch.no_grad():
        for side in ("left", "right"):
            tokenizer.padding_side = side
            vectors[side] = model(**tokenizer(TEXTS, padding=True, return_tensors="pt"))
        alone = torch.cat([model(**tokenizer([t], return_tensors="pt")) for t in TEXTS])
    assert torch.allclose(vectors["left"], alone, atol=1e-5) and torch.allclose(vectors["right"], alone, atol=1e-5)
    # The pooler reads the last real token, not the last column: a right-padded batch's last
    # column is a pad for the shorter sentences.
    assert not torch.allclose(
        alone[1],
        vectors["right"][1].new_zeros(())
        + model.encoder(**tokenizer(TEXTS, padding=True, return_tensors="pt")).last_hidden_state[1, -1],
        atol=1e-3,
    )


def test_last_pooler_on_known_states() -> None:
    from simcse_kit.model.modeling import Pooler

    states = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert Pooler("last")(right, states).flatten().tolist() == [1.0, 7.0]
    assert Pooler("last")(left, states).flatten().tolist() == [3.0, 7.0]


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("arch", DECODERS)
def test_every_mode_trains_a_step(arch: str, lora: int, decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    """One optimiser step per mode: a finite loss, and the gradient reaches what trains —
    every weight, or with LoRA the adapter alone (the base stays frozen)."""
    tokenizer = load_checked_tokenizer(decoder_dirs[arch])
    for mode in MODES:
        dataset = load_train_dataset(str(write_train_data(tmp_path, mode)), mode)
        batch = ContrastiveCollator(tokenizer, mode, 16)([dataset[i] for i in range(6)])
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(decoder_dirs[arch]), pooler="last", lora_r=lora)).train()
        loss = SimCSEObjective(mode, LossConfig(temperature=0.05)).step(model, batch)
        assert math.isfinite(loss.item()) and loss.item() > 0
        with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        assert with_grad, mode
        if lora:
            assert all("lora_" in n for n in with_grad), sorted(with_grad)[:3]
            assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
        else:
            assert any("embed_tokens" in n for n in with_grad)


def run_config(
    path: Path, out: Path, senteval: Path, mode: str, lora: int, data: Path | None = None, **train: object
) -> RunConfig:
    pooler = "last" if is_decoder(AutoConfig.from_pretrained(path)) else "avg"
    return RunConfig(
        model=ModelConfig(name_or_path=str(path), pooler=pooler, max_seq_len=16, eval_max_seq_len=32, dropout=0.1, lora_r=lora),
        data=DataConfig(mode=mode, train_file=str(write_train_data(data or out.parent, mode)), eval_data_dir=str(senteval)),
        loss=LossConfig(temperature=0.05),
        train=TrainConfig(
            **{
                "output_dir": str(out),
                "batch_size": 8,
                "learning_rate": 5e-3,
                "num_epochs": 2,
                "eval_steps": 4,
                "save_steps": 2,
                "mixed_precision": "no",  # the same numbers on every CPU
                "seed": 7,
                "progress_bar": False,
            }
            | train  # type: ignore[arg-type]
        ),
    ).validate()


# (backbone, mode, LoRA rank): each decoder and an encoder, every mode, LoRA on and off.
RUNS = [("qwen3", "unsup", 4), ("llama", "hardneg", 0), ("gemma3_text", "sup", 4), ("bert", "sup", 4), ("qwen3", "hardneg", 0)]


@pytest.mark.parametrize(("arch", "mode", "lora"), RUNS)
def test_train_reload_evaluate_export(
    arch: str, mode: str, lora: int, decoder_dirs: dict[str, Path], tiny_model_dir: Path, senteval: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from simcse_kit.export import export_model
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.training.run import train

    path = tiny_model_dir if arch == "bert" else decoder_dirs[arch]
    metrics = train(run_config(path, tmp_path / "run", senteval, mode, lora))
    assert metrics["steps"] == 8 and all(math.isfinite(v) for v in metrics["sts"].values())
    best = tmp_path / "run" / "best_model"
    meta = json.loads((best / "simcse_config.json").read_text())
    assert meta["adapter"] is bool(lora) and meta["decoder"] is (arch != "bert")
    # A LoRA run's best model is the adapter alone (plus tokenizer and metadata), not a copy of the base.
    assert (best / ADAPTER_CONFIG).is_file() is bool(lora)
    assert (best / "model.safetensors").is_file() is not bool(lora)

    result = export_model(tmp_path / "run", tmp_path / "export")  # merged: a plain model anywhere
    assert result.min_cosine >= 0.9999
    assert not (tmp_path / "export" / ADAPTER_CONFIG).exists()
    sents = [*toy_sentences(10), "a " * 40]
    ours = load_encoder(tmp_path / "run").encode(sents)
    theirs = SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(sents, convert_to_tensor=True).float()
    cos = torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=-1)
    assert cos.min().item() >= 0.9999, cos
    if arch != "bert":
        modules = json.loads((tmp_path / "export" / "modules.json").read_text())
        pooling = next(m for m in modules if m["type"].endswith("Pooling"))
        assert json.loads((tmp_path / "export" / pooling["path"] / "config.json").read_text())["pooling_mode_lasttoken"]


def test_lora_trains_the_adapter_and_leaves_the_base(decoder_dirs: dict[str, Path], senteval: Path, tmp_path: Path) -> None:
    """After a LoRA run the base weights are untouched and the merged model differs from
    the base only through the adapter: merging by hand (W + B A * alpha / r) gives it."""
    from simcse_kit.training.run import train

    path = decoder_dirs["qwen3"]
    train(run_config(path, tmp_path / "run", senteval, "unsup", 4, eval_steps=0, eval_at_start=False))
    base = load_file(str(path / "model.safetensors"))
    adapter = load_file(str(tmp_path / "run" / "best_model" / "adapter_model.safetensors"))
    merged = base_encoder(SimCSEModel.load(tmp_path / "run" / "best_model").encoder).state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), sorted(changed)
    for key in changed:
        stem = key.removesuffix(".weight")
        a = next(v for k, v in adapter.items() if stem in k and "lora_A" in k)
        b = next(v for k, v in adapter.items() if stem in k and "lora_B" in k)
        assert torch.allclose(merged[key], base[key] + (b @ a) * (16 / 4), atol=1e-6), key


@pytest.mark.parametrize("lora", [0, 4])
def test_resume_mid_run_ends_as_the_uninterrupted_run(
    lora: int, decoder_dirs: dict[str, Path], senteval: Path, tmp_path: Path
) -> None:
    """Cut a finished run back to its step-4 checkpoint and resume: the last checkpoint's
    weights and the metrics equal the uninterrupted run's, bit for bit."""
    from simcse_kit.training.run import train

    cfg = run_config(decoder_dirs["qwen3"], tmp_path / "full" / "run", senteval, "unsup", lora, data=tmp_path)
    full = train(cfg)
    cut = tmp_path / "cut" / "run"
    shutil.copytree(tmp_path / "full" / "run", cut)
    for later in (cut / "checkpoints").glob("step-*"):
        if int(later.name.split("-")[1]) > 4:
            shutil.rmtree(later)
    (cut / "metrics.json").unlink()
    cfg_cut = run_config(decoder_dirs["qwen3"], cut, senteval, "unsup", lora, data=tmp_path)
    resumed = train(cfg_cut, resume=True)
    timing = ("train_seconds", "examples_per_second", "sentences_per_second")
    assert {k: v for k, v in resumed.items() if k not in timing} == {k: v for k, v in full.items() if k not in timing}
    last = sorted((tmp_path / "full" / "run" / "checkpoints").glob("step-*"))[-1].name
    a = load_file(str(tmp_path / "full" / "run" / "checkpoints" / last / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / last / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("packing", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(packing: bool, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Dropout on (the unsup views), checkpointing on or off: the same loss and gradients,
    bit for bit (the recomputation replays dropout's random draws)."""
    from simcse_kit.training.run import build_model

    folder = tiny_model_dir
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dataset = load_train_dataset(str(write_train_data(tmp_path, "unsup")), "unsup")
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([dataset[i] for i in range(8)])
    grads = []
    for checkpointing in (False, True):
        cfg = RunConfig(
            model=ModelConfig(name_or_path=str(folder), pooler="cls", dropout=0.1, packing=packing),
            data=DataConfig(train_file=str(tmp_path / "train.txt")),
            train=TrainConfig(gradient_checkpointing=checkpointing, fast_dropout=False, seed=3),
        )
        model = build_model(cfg).train()
        assert model.encoder.is_gradient_checkpointing is checkpointing
        torch.manual_seed(11)
        loss = SimCSEObjective("unsup", LossConfig(temperature=0.05)).step(model, batch)
        grads.append((loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, a), (loss_b, b) = grads
    assert torch.equal(loss_a, loss_b)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_gradient_checkpointing_refused_where_the_model_has_none(tmp_path: Path) -> None:
    """MPNet has no gradient checkpointing in transformers 5: one line naming the key, not
    transformers' ValueError from inside the run."""
    from tiny_encoders import build_tiny

    from simcse_kit.errors import ConfigError
    from simcse_kit.training.run import build_model

    folder = build_tiny("mpnet", tmp_path / "mpnet")
    cfg = RunConfig(
        model=ModelConfig(name_or_path=str(folder), pooler="avg"),
        data=DataConfig(train_file=str(tmp_path / "train.txt")),
        train=TrainConfig(gradient_checkpointing=True),
    )
    with pytest.raises(ConfigError, match=r"'train.gradient_checkpointing' = True: MPNetModel does not support it"):
        build_model(cfg)


@pytest.mark.parametrize("arch", ["bert", "mpnet"])  # mpnet: targets from the kit's table (peft has none of its own)
def test_the_sentence_transformers_peer_trains_the_same_adapter(arch: str, tmp_path: Path) -> None:
    """benchmarks/st_peers.py's ``add_adapter`` gets the kit's own ``LoraConfig``: the same modules train,
    as many parameters: query and value of 2 layers, each r x 32 + 32 x r = 256 at r 4, 1,024 in all."""
    from sentence_transformers import SentenceTransformer
    from tiny_encoders import build_tiny

    from benchmarks.st_peers import add_lora

    path = build_tiny(arch, tmp_path / arch)
    cfg = ModelConfig(name_or_path=str(path), pooler="avg", lora_r=4, lora_alpha=8, lora_dropout=0.2)
    kit = SimCSEModel.from_config(cfg)
    peer = SentenceTransformer(str(path), device="cpu")
    add_lora(peer, cfg)

    def trainable(model: torch.nn.Module) -> dict[str, int]:  # from "layer.<i>." on: the prefixes differ
        return {n[n.index("layer.") :]: p.numel() for n, p in model.named_parameters() if p.requires_grad}

    assert trainable(kit) == trainable(peer)
    assert sum(trainable(peer).values()) == 1024 and len(trainable(peer)) == 8
    # dropout and alpha / r reach the peer's adapter too
    adapted = [m for m in peer.modules() if hasattr(m, "lora_A")]
    assert {(m.lora_dropout["default"].p, m.scaling["default"]) for m in adapted} == {(0.2, 2.0)} and len(adapted) == 4
    # st_peers keeps the best dev checkpoint as a state dict and scores it on a fresh model given the
    # same adapter: it loads strictly and encodes as the trained one (not as the base)
    with torch.no_grad():
        for m in adapted:
            m.lora_B["default"].weight.normal_()
    best = SentenceTransformer(str(path), device="cpu")
    add_lora(best, cfg)
    best.load_state_dict(peer.state_dict())
    trained, restored = (model.encode(TEXTS, convert_to_tensor=True) for model in (peer, best))
    base = SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert torch.equal(trained, restored) and not torch.allclose(trained, base, atol=1e-3)
