"""``device=auto`` and dtype resolution, shared by every stage that runs a model, and the CPU
allocator setting that a process running a model on the CPU gets (:func:`retain_freed_memory`)."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path

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
    """``auto`` -> ``cuda`` when available, else ``mps`` when available, else ``cpu``. A process
    that runs a model on the CPU keeps the memory it frees (:func:`retain_freed_memory`)."""
    dev = _resolve_device(device)
    if dev.type == "cpu":
        retain_freed_memory()
    return dev


# glibc's mallopt(3) parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


@functools.cache
def retain_freed_memory() -> bool:
    """Make glibc's malloc serve large CPU tensors from its heap and keep freed memory for reuse;
    True when applied.

    By default glibc gives every allocation above its mmap threshold (at most 32 MB) fresh pages
    from ``mmap`` and unmaps them when freed, and returns the heap's free top above the trim
    threshold to the kernel. A forward then page-faults its large temporaries in anew at every step:
    a 32-row step's logits over Gemma-3's 262K vocabulary are 33.5 MB. Keeping freed memory halves
    such steps' element-wise work and speeds distillation up (evidence:
    docs/experiments.md#make-demo-from-a-fresh-clone-on-the-amd-epyc-host-itself-81-minutes-with-the-engine-track-2026-11-27-code-82a6c85).
    ``POLYSPEC_MALLOC=default`` leaves malloc as it is; nothing happens off Linux or without glibc's
    ``mallopt``."""
    if os.environ.get("POLYSPEC_MALLOC", "") == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # no mmap()ed chunks at all (a raised mmap threshold caps at 32 MB); free memory is trimmed only
    # past 1 GB
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def _resolve_device(device: str | torch.device | None) -> torch.device:
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
        raise PolyspecError(
            f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PolyspecError(
            f"device {device!r} requested but CUDA is not available; use device=auto or cpu"
        )
    return dev


def set_cuda_attention(device: torch.device) -> bool | None:
    """Allow or forbid PyTorch's cuDNN backend for scaled-dot-product attention in this process when
    ``device`` is a CUDA device, and return whether it is now allowed (None, and nothing set, on
    other devices). Off by default; ``POLYSPEC_CUDNN_SDPA=1`` allows it (PyTorch's own default),
    ``0`` says off.

    In bf16 on Hopper, PyTorch picks the cuDNN backend, which builds an attention graph for every
    new pair of query and key lengths (sgl-project/sglang#4650; "recreated whenever sequence length
    increases", ml-explore/mlx#2743): every step of a decoding loop is a new key length and every
    speculative step a new pair; fp32 never takes it. Turning it off made bf16 decoding on a GPU
    even and faster (evidence:
    docs/experiments.md#bf16-on-an-h200-with-cudnn-attention-off-the-unevenness-was-cudnns-and-polyspec-now-turns-it-off-2026-11-27-code-71ab564--d5fe6f7)."""
    if device.type != "cuda":
        return None
    setting = os.environ.get("POLYSPEC_CUDNN_SDPA", "").strip().lower()
    if setting in ("", "0", "off", "false", "no"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    elif setting in ("1", "on", "true", "yes"):
        torch.backends.cuda.enable_cudnn_sdp(True)
    else:
        raise PolyspecError(f"POLYSPEC_CUDNN_SDPA={setting!r}: use 0 (off, the default) or 1 (on)")
    return torch.backends.cuda.cudnn_sdp_enabled()


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (x86 AVX512-BF16 or AMX; Arm BF16): then bf16 matmuls
    are fast. torch's own probes first (``torch.cpu._is_avx512_bf16_supported`` /
    ``_is_amx_tile_supported``; oneDNN's ``_is_mkldnn_bf16_supported`` is not enough: it is also
    true on AVX512 CPUs that only emulate bf16), then the kernel's CPU flags."""
    probes = [
        getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    try:
        if any(p() for p in probes if p is not None):
            return True
    except Exception:  # noqa: BLE001 - a probe that cannot run answers "no", the flags still decide
        pass
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore").split()
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(flags))


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA devices that support it and on CPUs with native bf16, float32
    elsewhere. The environment variable ``POLYSPEC_DTYPE`` (e.g. ``float32``) replaces what ``auto``
    resolves to (the unit tests set it: fp32 is the exact mode their identity checks need)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto") and os.environ.get("POLYSPEC_DTYPE", "auto") != "auto":
        dtype = os.environ["POLYSPEC_DTYPE"]
    if dtype in (None, "auto"):
        # T4/V100 only emulate it
        if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.bfloat16
        if device.type == "cpu" and cpu_native_bf16():
            return torch.bfloat16
        return torch.float32
    if dtype not in _DTYPES:
        raise PolyspecError(
            f"unknown dtype {dtype!r}; choose auto, {', '.join(sorted(set(_DTYPES)))}"
        )
    return _DTYPES[dtype]


def host_kind() -> str:
    """This CPU in one line, as the reports name the host kinds: model name and the ISA that decides
    its speed (AMX, AVX512-BF16, or AVX2 only) and its core count."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return "unknown CPU"
    name = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
        "CPU",
    )
    flags = set(
        next(
            (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
        )
    )
    isa = (
        "AMX + avx512_bf16"
        if "amx_bf16" in flags
        else "avx512_bf16"
        if "avx512_bf16" in flags
        else "AVX2"
        if "avx2" in flags
        else "no AVX2"
    )
    return f"{name} ({isa}, {len(os.sched_getaffinity(0))} cores)"
