"""dtype auto: bf16 where the device computes it natively, fp32 elsewhere; POLYSPEC_DTYPE overrides auto."""

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
