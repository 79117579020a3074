"""Which device a command encodes on: ``--device auto|cpu|cuda|cuda:N|mps``.

``auto`` is the GPU where there is one (CUDA, else Apple's MPS), else the CPU, so no
command falls back to the CPU on a GPU machine without being asked. A named device
that this machine lacks is refused with one line rather than failing deep in torch.
Training takes its device from Accelerate (``accelerate launch`` / ``torchrun``), and
the final STS of a run encodes on the device it trained on.
"""

from __future__ import annotations

import re

import torch

from simcse_kit.errors import ConfigError

__all__ = ["AUTO_DEVICE", "DEVICE_HELP", "resolve_device"]

AUTO_DEVICE = "auto"
DEVICE_HELP = "where to encode: auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps"
_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str | torch.device = AUTO_DEVICE) -> torch.device:
    """The ``torch.device`` for ``name``, checked against this machine.

    Args:
        name: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``.

    Raises:
        ConfigError: an unknown name, or a device this machine does not have.
    """
    if isinstance(name, torch.device):
        return name
    text = str(name).strip().lower()
    if not _PATTERN.match(text):
        raise ConfigError(f"--device {name!r}: not one of auto, cpu, cuda, cuda:N, mps")
    if text == AUTO_DEVICE:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available here (use cpu or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not _mps_available():
        raise ConfigError(f"--device {name}: MPS is not available here (use cpu or auto)")
    return device
