"""Atomic file and directory writes: write to a temporary sibling, then ``os.replace`` it into place,
so a crash never leaves a half-written file or directory behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False) + "\n")


def read_json_or_none(path: str | Path) -> Any:
    """A JSON file's content, or None when it is missing or unreadable (optional records: reports, cards)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


@contextlib.contextmanager
def atomic_directory(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success rename it to ``path``.

    On any exception the temporary directory is removed and ``path`` is untouched. With
    ``overwrite=True`` an existing ``path`` is replaced (moved aside first, then deleted).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            if not overwrite:
                raise FileExistsError(f"{path} already exists")
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its ``__metadata__`` keys sorted: safetensors writes metadata from
    a hash map, so the key order (and the file's bytes and checksum) otherwise changes from process to
    process. Offsets are relative to the data section and the header keeps its length, so only bytes
    inside the header move."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta is not None else {}) | header
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # cannot happen (same characters), but never write a broken file
        return data
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]
