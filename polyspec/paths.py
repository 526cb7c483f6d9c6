"""Where things live: the configs folder, files the profiles name relative to the repository, and
the user cache.

- ``POLYSPEC_CONFIGS`` overrides the configs folder. Default: the repository's ``configs/`` (a
  checkout or an editable install), else the copy an installed wheel ships as ``polyspec/_configs/``
  (pyproject.toml's package-data maps ``configs/`` there), so ``pip install .`` finds the same
  registry and profiles.
- ``POLYSPEC_CACHE`` overrides the cache folder (default: ``$XDG_CACHE_HOME/polyspec`` or
  ``~/.cache/polyspec``). Prepared targets go to ``<cache>/targets/``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # in an installed wheel: site-packages
PACKAGED_CONFIGS = Path(__file__).resolve().parent / "_configs"


def configs_dir() -> Path:
    if "POLYSPEC_CONFIGS" in os.environ:
        return Path(os.environ["POLYSPEC_CONFIGS"])
    repo = REPO_ROOT / "configs"
    return repo if repo.is_dir() else PACKAGED_CONFIGS


def repo_file(rel: str | Path) -> Path:
    """A file named relative to the repository (``configs/train/eagle-cpu.yaml``,
    ``synth/data/heldout.jsonl``, ``train/drafter.py``): ``configs/…`` lies in :func:`configs_dir`,
    the rest beside the packages (a wheel installs the stages' data files and scripts in the same
    places as the repository holds them)."""
    rel = Path(rel)
    if rel.parts[:1] == ("configs",):
        return configs_dir().joinpath(*rel.parts[1:])
    return REPO_ROOT / rel


def cache_dir() -> Path:
    if "POLYSPEC_CACHE" in os.environ:
        return Path(os.environ["POLYSPEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    return Path(base) / "polyspec"
