"""``calibration.json`` in a bundle: per device and dtype, what ``python -m decoder.calibrate``
measured (g*, the flat-verify tree budget, the cost curve). The decoder reads it for its defaults;
calibrate writes it. Not part of the bundle's checksums (it is per machine)."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from polyspec.io import atomic_write_json, read_json_or_none

CALIBRATION = "calibration.json"


def device_key(device, dtype=None) -> str:
    """``cpu:<arch>:<threads>t[:<dtype>]`` / ``cuda:<name>[:<dtype>]`` (a bf16 and an fp32
    calibration differ)."""
    tail = f":{str(dtype).replace('torch.', '')}" if dtype is not None else ""
    if getattr(device, "type", str(device)) == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}{tail}"
    return f"cpu:{platform.machine()}:{torch.get_num_threads()}t{tail}"


def save(bundle_root: Path, key: str, result: dict) -> Path:
    """Store ``result`` under ``key`` in the bundle's calibration.json (other devices' entries are
    kept)."""
    path = Path(bundle_root) / CALIBRATION
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data[key] = result
    atomic_write_json(path, data)
    return path


def load_entry(bundle_root: Path, device, dtype=None) -> dict | None:
    """This device's calibration (g*, tree budget, cost curve) for ``dtype``, or None."""
    return (read_json_or_none(Path(bundle_root) / CALIBRATION) or {}).get(device_key(device, dtype))


def load_g_star(bundle_root: Path, device, dtype=None) -> int | None:
    """g* stored for this device and dtype, or None."""
    entry = load_entry(bundle_root, device, dtype)
    return int(entry["g_star"]) if entry and "g_star" in entry else None
