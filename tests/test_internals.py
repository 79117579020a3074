"""Every private or semi-private name that ``simcse_kit/model/fastpath/internals.py`` uses still
exists with the signature relied on. When a library moves one, the failure names the
library and its installed version, so an upgrade breaks here rather than deep in a run."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import version

import pytest
import torch

from simcse_kit.model.fastpath import ATTENTION_NAME, enable_fast_dropout, fast_dropout_attention, internals


def resolve(library: str, dotted: str) -> object:
    """``module:Qual.name`` -> the object, or a failure naming ``library`` and its version."""
    module_name, _, qualname = dotted.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{dotted} is gone in {library} {version(library)} ({exc}); update simcse_kit/model/fastpath/internals.py")
    return obj


def parameters(fn: Callable[..., object]) -> list[str]:
    return list(inspect.signature(fn).parameters)


# (library, "module:qualified.name", the leading parameters internals.py passes positionally or by name)
PRIVATE_API = [
    ("accelerate", "accelerate.state:AcceleratorState._reset_state", ["reset_partial_state"]),
    (
        "transformers",
        "transformers.integrations.sdpa_attention:sdpa_attention_forward",
        ["module", "query", "key", "value", "attention_mask", "dropout", "scaling"],
    ),
    ("transformers", "transformers.masking_utils:sdpa_mask", ["batch_size", "q_length", "kv_length"]),
    ("transformers", "transformers.masking_utils:AttentionMaskInterface.register", ["key", "value"]),
    ("transformers", "transformers:AttentionInterface.register", ["key", "value"]),
    ("transformers", "transformers:PreTrainedModel.set_attn_implementation", ["self", "attn_implementation"]),
    ("transformers", "transformers:PreTrainedModel._can_set_attn_implementation", []),
]


@pytest.mark.parametrize(("library", "dotted", "expected"), PRIVATE_API, ids=[d for _, d, _ in PRIVATE_API])
def test_private_name_exists_with_the_signature_used(library: str, dotted: str, expected: list[str]) -> None:
    got = parameters(resolve(library, dotted))
    assert got[: len(expected)] == expected, (
        f"{dotted} in {library} {version(library)} takes {got}; simcse_kit/model/fastpath/internals.py relies on {expected}"
    )


def test_reset_accelerate_state_allows_a_second_precision() -> None:
    """What the reset is for: a second Accelerator with another precision in one process."""
    from accelerate import Accelerator

    internals.reset_accelerate_state()  # whatever an earlier test left
    Accelerator(mixed_precision="no", cpu=True)
    with pytest.raises(ValueError):  # Accelerate's refusal, the reason the reset exists
        Accelerator(mixed_precision="bf16", cpu=True)
    internals.reset_accelerate_state()
    assert str(Accelerator(mixed_precision="bf16", cpu=True).mixed_precision) == "bf16"
    internals.reset_accelerate_state()


def test_registration_happens_on_enable_only_and_once() -> None:
    """Importing the fast path registers nothing with transformers (checked in a fresh
    interpreter); enabling it registers the attention and its mask builder, idempotently."""
    import os
    import subprocess
    import sys

    code = (
        "import simcse_kit.model.fastpath, simcse_kit.model.modeling, simcse_kit.model.packing\n"
        "from transformers import AttentionInterface\n"
        "from transformers.masking_utils import AttentionMaskInterface\n"
        f"assert {ATTENTION_NAME!r} not in AttentionInterface(), 'attention registered at import'\n"
        f"assert {ATTENTION_NAME!r} not in AttentionMaskInterface(), 'mask builder registered at import'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr

    from transformers import AttentionInterface, BertConfig, BertModel
    from transformers.masking_utils import AttentionMaskInterface

    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20)
    for _ in range(2):
        enable_fast_dropout(BertModel(config))
        assert AttentionInterface()[ATTENTION_NAME] is fast_dropout_attention
        assert AttentionMaskInterface()[ATTENTION_NAME] is internals.sdpa_mask
    with pytest.raises(ValueError, match="already registered"):
        internals.register_attention(ATTENTION_NAME, lambda *a, **k: (torch.zeros(()), None))


def test_momentum_update_is_the_loop_bit_for_bit() -> None:
    """The foreach update (torch._foreach_mul_ / _foreach_add_) gives exactly the
    per-parameter ``mul_(m).add_(q, alpha=1 - m)`` loop it replaces, mixed dtypes too."""
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 2, 4)]
    keys = [torch.randn(s) for s in shapes] + [torch.randn(6, dtype=torch.bfloat16)]
    queries = [torch.randn(s) for s in shapes] + [torch.randn(6)]
    want = [k.clone() for k in keys]
    for key, query in zip(want, queries, strict=True):
        key.mul_(0.999).add_(query.to(key.dtype), alpha=1.0 - 0.999)
    for name in ("_foreach_mul_", "_foreach_add_"):
        assert callable(getattr(torch, name, None)), f"torch.{name} is gone in torch {torch.__version__}"
    internals.momentum_update(keys, queries, 0.999)
    for got, expected in zip(keys, want, strict=True):
        assert torch.equal(got, expected)


def test_onednn_bf16_kernels_follows_onednn_isa_cap() -> None:
    """``torch.ops.mkldnn._is_mkldnn_bf16_supported`` still exists and reads oneDNN's
    effective ISA: False with ``ONEDNN_MAX_CPU_ISA=AVX2`` whatever the CPU declares, True
    uncapped on a CPU with AVX-512 (each in a fresh process: oneDNN reads the cap once)."""
    import os
    import subprocess
    import sys

    resolve("torch", "torch:ops.mkldnn._is_mkldnn_bf16_supported")
    code = "from simcse_kit.model.fastpath import internals; print(internals.onednn_bf16_kernels())"
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}

    def answer(cap: str | None) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env | ({"ONEDNN_MAX_CPU_ISA": cap} if cap else {})
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert answer("AVX2") == "False"
    if torch.cpu.get_capabilities().get("avx512_bw") is True and torch.backends.mkldnn.is_available():
        assert answer(None) == "True"
