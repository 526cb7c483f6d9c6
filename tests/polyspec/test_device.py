"""dtype auto: bf16 where the device computes it natively, fp32 elsewhere; POLYSPEC_DTYPE overrides
auto."""

import ctypes
import os
import subprocess
import sys

import pytest
import torch

import polyspec.device as device
from polyspec.errors import PolyspecError


def test_auto_follows_native_bf16_and_the_override(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("POLYSPEC_DTYPE", raising=False)
    monkeypatch.setattr(device, "cpu_native_bf16", lambda: True)
    assert device.resolve_dtype("auto", cpu) == torch.bfloat16
    assert device.resolve_dtype(None, cpu) == torch.bfloat16
    monkeypatch.setattr(device, "cpu_native_bf16", lambda: False)
    assert device.resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(device, "cpu_native_bf16", lambda: True)
    monkeypatch.setenv("POLYSPEC_DTYPE", "float32")
    assert device.resolve_dtype("auto", cpu) == torch.float32  # the override replaces auto …
    assert device.resolve_dtype("bfloat16", cpu) == torch.bfloat16  # … never an explicit dtype
    monkeypatch.setenv("POLYSPEC_DTYPE", "fp64")
    with pytest.raises(PolyspecError, match="unknown dtype"):
        device.resolve_dtype("auto", cpu)


def test_native_bf16_probe_reads_cpu_flags_when_torch_cannot_tell(monkeypatch, tmp_path):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    info = tmp_path / "cpuinfo"
    real = device.Path
    monkeypatch.setattr(device, "Path", lambda p: info if p == "/proc/cpuinfo" else real(p))
    info.write_text("flags : fpu avx2 avx512f avx512bw\n")
    assert device.cpu_native_bf16() is False  # AVX512 without BF16 only emulates it
    info.write_text("flags : fpu avx2 avx512f avx512bw avx512_bf16\n")
    assert device.cpu_native_bf16() is True


_MMAP_PROBE = """
import ctypes, sys, torch
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
def mmapped_by(n):  # how many more mmap()ed chunks malloc holds while an n-byte tensor lives
    before = libc.mallinfo2().hblks
    x = torch.empty(n, dtype=torch.uint8)
    return libc.mallinfo2().hblks - before
first = mmapped_by(40 << 20)
from polyspec.device import resolve_device
resolve_device(sys.argv[1])
print(first, mmapped_by(40 << 20), mmapped_by(80 << 20))
"""  # noqa: E501


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("malloc", ["", "default"])
def test_a_cpu_process_keeps_large_tensors_on_the_heap(malloc):
    """resolve_device("cpu") stops glibc from mmap()ing (and page-faulting anew) every large
    temporary; POLYSPEC_MALLOC=default leaves malloc as it is."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("no glibc mallinfo2 (glibc < 2.33 or another libc)")
    env = {**os.environ, "POLYSPEC_MALLOC": malloc}
    out = subprocess.run(
        [sys.executable, "-c", _MMAP_PROBE, "cpu"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    first, after, larger = map(int, out)
    assert first == 1  # glibc's default: a 40 MB tensor is its own mmap()
    assert (after, larger) == ((1, 1) if malloc == "default" else (0, 0))


def test_cudnn_attention_switch_follows_the_environment(monkeypatch):
    """POLYSPEC_CUDNN_SDPA turns PyTorch's cuDNN attention off (0, and unset: the default) or on (1)
    on a CUDA device, a typo is refused in one line, and a CPU device is left alone (the flag is
    global: restored after)."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    cuda = torch.device("cuda")
    try:
        monkeypatch.setenv("POLYSPEC_CUDNN_SDPA", "0")
        assert (
            device.set_cuda_attention(torch.device("cpu")) is None
            and torch.backends.cuda.cudnn_sdp_enabled() == before
        )
        assert (
            device.set_cuda_attention(cuda) is False and not torch.backends.cuda.cudnn_sdp_enabled()
        )
        monkeypatch.setenv("POLYSPEC_CUDNN_SDPA", "1")
        assert device.set_cuda_attention(cuda) is True
        monkeypatch.delenv("POLYSPEC_CUDNN_SDPA")
        # unset: off (H200, bf16: `ar` 30.5 → 44.5 tok/s)
        assert device.set_cuda_attention(cuda) is False
        monkeypatch.setenv("POLYSPEC_CUDNN_SDPA", "of")
        with pytest.raises(PolyspecError, match="POLYSPEC_CUDNN_SDPA"):
            device.set_cuda_attention(cuda)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
