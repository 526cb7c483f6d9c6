"""Atomic file and directory writes: write to a temporary sibling, then ``os.replace`` it into
place, so a crash never leaves a half-written file or directory behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from polyspec.errors import PolyspecError, first_line


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


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(
        path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False) + "\n"
    )


def read_json_or_none(path: str | Path) -> Any:
    """A JSON file's content, or None when it is missing or unreadable (optional records: reports,
    cards)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: JSONDecodeError and UnicodeDecodeError
        return None


def _note(msg: str) -> None:
    print(msg, file=sys.stderr)


class JsonlRecords:
    """The JSON objects of a JSONL file, one per line, in file order (blank lines are ignored).

    Every stage reads JSONL through this one reader. Stage files are appended to, and a killed
    writer can leave a torn last line: by default a line that is not a JSON object (torn, malformed,
    not UTF-8, or another JSON value) is skipped and counted (``skipped``, ``bad_lines``), and one
    note is logged once the file has been read (or the reading stopped). ``strict=True`` is for
    files a user wrote (prompt lists): such a line is a one-line PolyspecError naming the file and
    line instead. Iterating again re-reads.
    """

    def __init__(
        self, path: str | Path, strict: bool = False, log: Callable[[str], Any] | None = _note
    ):
        self.path = Path(path)
        self.strict = strict
        self.log = log
        self.skipped = 0
        self.bad_lines: list[int] = []  # 1-based line numbers of the skipped lines

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.skipped, self.bad_lines = 0, []
        try:
            # bytes: a line cut inside a UTF-8 character is one bad line
            with open(self.path, "rb") as f:
                for n, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    try:
                        rec = json.loads(raw)
                    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                        rec, why = None, first_line(e)
                    if isinstance(rec, dict):
                        yield rec
                        continue
                    if self.strict:
                        what = why if rec is None else f"a JSON {type(rec).__name__}, not an object"
                        raise PolyspecError(f"{self.path}:{n}: not a JSON object per line ({what})")
                    self.skipped += 1
                    self.bad_lines.append(n)
        finally:
            if self.skipped and self.log is not None:
                shown = ", ".join(map(str, self.bad_lines[:5])) + (" …" if self.skipped > 5 else "")
                self.log(
                    f"note: {self.path}: skipped {self.skipped} torn or malformed line(s) (line "
                    f"{shown})"
                )


def read_jsonl(
    path: str | Path, strict: bool = False, log: Callable[[str], Any] | None = _note
) -> JsonlRecords:
    """``for rec in read_jsonl(path)``: see :class:`JsonlRecords` (``.skipped`` after reading)."""
    return JsonlRecords(path, strict=strict, log=log)


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
    """The same safetensors file with its ``__metadata__`` keys sorted: safetensors writes metadata
    from a hash map, so the key order (and the file's bytes and checksum) otherwise changes from
    process to process. Offsets are relative to the data section and the header keeps its length, so
    only bytes inside the header move."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta is not None else {}) | header
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # cannot happen (same characters), but never write a broken file
        return data
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]
