"""train.mmap_threshold_mib: glibc's mmap threshold, fixed on request."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simcse_kit.config.run import load_config
from simcse_kit.errors import ConfigError
from simcse_kit.model import heap
from simcse_kit.model.heap import ENV_VAR, apply_mmap_threshold

needs_glibc = pytest.mark.skipif(heap._glibc() is None, reason="glibc's malloc only (Linux)")

# In a fresh interpreter: free an 8 MiB block (glibc then raises its mmap threshold to 8
# MiB unless it is fixed), then ask for 2 MiB and report whether that came from a mapping
# of its own (mallinfo2's hblkhd, bytes in mmapped blocks, grows) or from the heap.
PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    from simcse_kit.model.heap import set_mmap_threshold

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    fixed = set_mmap_threshold(1 << 20) if sys.argv[1] == "fix" else None
    libc.free(libc.malloc(8 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(2 << 20)
    print(json.dumps({"fixed": fixed, "mmapped": libc.mallinfo2().hblkhd - before}))
    libc.free(block)
    """
)


def run_probe(mode: str) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* variables from the caller
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


@needs_glibc
def test_a_fixed_threshold_gives_large_blocks_their_own_mapping() -> None:
    default, fixed = run_probe("leave"), run_probe("fix")
    # glibc as it comes: after the 8 MiB free, a 2 MiB block is carved from the heap.
    assert default["mmapped"] == 0
    # fixed at 1 MiB: the 2 MiB block is a mapping of its own, unmapped when freed.
    assert fixed["fixed"] is True
    assert fixed["mmapped"] >= 2 << 20


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record set_mmap_threshold calls instead of changing the test process's malloc."""
    seen: list[int] = []

    def fake(nbytes: int) -> bool:
        seen.append(nbytes)
        return True

    monkeypatch.setattr(heap, "set_mmap_threshold", fake)
    monkeypatch.delenv(ENV_VAR, raising=False)
    return seen


@needs_glibc
def test_a_threshold_in_mib_is_applied_in_bytes(calls: list[int]) -> None:
    choice = apply_mmap_threshold(2)
    assert choice.mmap_threshold_mib == 2 and calls == [2 << 20]
    assert "2 MiB" in choice.reason


def test_unset_leaves_malloc_alone_and_names_the_environment(calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    assert apply_mmap_threshold(None).mmap_threshold_mib is None
    monkeypatch.setenv(ENV_VAR, "65536")
    choice = apply_mmap_threshold(None)
    assert choice.mmap_threshold_mib is None and f"{ENV_VAR}=65536" in choice.reason
    assert calls == []


def test_without_glibc_nothing_is_touched(calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    choice = apply_mmap_threshold(1)
    assert choice.mmap_threshold_mib is None and "no glibc" in choice.reason
    assert calls == []


@pytest.mark.parametrize("value", ["0", "33", "-1"])
def test_the_config_checks_the_range(value: str, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train_file: x.txt\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mmap_threshold_mib"):
        load_config(recipe, {"mmap_threshold_mib": value})
