"""``device=auto`` and dtype resolution, shared by every stage that runs a model."""

from __future__ import annotations

import torch

from polyspec.errors import PolyspecError

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``mps`` when available, else ``cpu``."""
    if isinstance(device, torch.device):
        return device
    if device in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise PolyspecError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PolyspecError(f"device {device!r} requested but CUDA is not available; use device=auto or cpu")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA devices that support it, float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in _DTYPES:
        raise PolyspecError(f"unknown dtype {dtype!r}; choose auto, {', '.join(sorted(set(_DTYPES)))}")
    return _DTYPES[dtype]
