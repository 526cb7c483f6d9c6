"""Where the corpus's files come from: Debian packages (``apt-get download`` + ``dpkg -x``: nothing
is installed, no root needed once the package lists are there) kept in a cache shared by runs, or
local folders.

    root = unpacked("libreoffice-help-vi", cache)  # <cache>/x/libreoffice-help-vi_<version>/
    licence("libreoffice-help-vi", root)  # "MPL-2.0" (the copyright file's first License: field)

A package that cannot be had raises :class:`SourceMissing` with one line saying why (no apt-get on
this host, no such package in its lists): the stage records it and goes on without that source.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from polyspec.io import atomic_directory

_UPDATED: set[str] = set()  # apt-get update runs at most once per process


class SourceMissing(Exception):
    """A source that cannot be had here; ``str(e)`` is one line."""


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


def _why(proc: subprocess.CompletedProcess) -> str:
    lines = [
        x.strip()
        for x in (proc.stderr or proc.stdout).splitlines()
        if x.strip() and not x.startswith("W:")
    ]
    return lines[-1] if lines else f"exit {proc.returncode}"


def download(package: str, cache: Path) -> Path:
    """The package's .deb in ``<cache>/debs/`` (downloaded once)."""
    debs = cache / "debs"
    have = sorted(debs.glob(f"{package}_*.deb"))
    if have:
        return have[-1]
    if shutil.which("apt-get") is None:
        raise SourceMissing(f"{package}: apt-get not found (not a Debian-family host)")
    debs.mkdir(parents=True, exist_ok=True)
    proc = _run(["apt-get", "download", package], cwd=debs)
    if (
        proc.returncode != 0
        and "update" not in _UPDATED
        and hasattr(os, "geteuid")
        and os.geteuid() == 0
    ):
        # a fresh machine has no package lists yet: read them once, then try again
        _UPDATED.add("update")
        _run(["apt-get", "update"])
        proc = _run(["apt-get", "download", package], cwd=debs)
    have = sorted(debs.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not have:
        raise SourceMissing(f"{package}: apt-get download failed: {_why(proc)}")
    return have[-1]


def unpack(deb: Path, cache: Path) -> Path:
    """``dpkg -x`` of a .deb into ``<cache>/x/<deb name>/`` (once; atomic, so an interrupted unpack
    is redone)."""
    dest = cache / "x" / deb.stem
    if dest.is_dir():
        return dest
    if shutil.which("dpkg-deb") is None:
        raise SourceMissing(f"{deb.name}: dpkg-deb not found (not a Debian-family host)")
    with atomic_directory(dest) as tmp:
        proc = _run(["dpkg-deb", "-x", str(deb), str(tmp)])
        if proc.returncode != 0:
            raise SourceMissing(f"{deb.name}: dpkg-deb -x failed: {_why(proc)}")
    return dest


def unpacked(package: str, cache: Path) -> Path:
    return unpack(download(package, cache), cache)


def version(package: str, root: Path) -> str:
    """The package version from the unpacked folder's name (``<package>_<version>_<arch>``)."""
    parts = root.name.split("_")
    return parts[1] if len(parts) >= 3 and parts[0] == package else "unknown"


def licence(package: str, root: Path) -> str | None:
    """The first ``License:`` of the package's machine-readable copyright file (None where it states
    none)."""
    doc = root / "usr" / "share" / "doc" / package / "copyright"
    # some packages keep it in a sibling package's folder (a symlink dpkg -x leaves dangling)
    if not doc.is_file():
        return None
    m = re.search(
        r"^License:\s*(\S.*)$", doc.read_text(encoding="utf-8", errors="replace"), re.MULTILINE
    )
    return m.group(1).strip() if m else None
