"""Where things live: the repository's ``configs/`` folder and the user cache directory.

- ``POLYSPEC_CONFIGS`` overrides the configs folder (default: ``configs/`` next to this package).
- ``POLYSPEC_CACHE`` overrides the cache folder (default: ``$XDG_CACHE_HOME/polyspec`` or
  ``~/.cache/polyspec``). Prepared targets go to ``<cache>/targets/``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def configs_dir() -> Path:
    return Path(os.environ.get("POLYSPEC_CONFIGS", REPO_ROOT / "configs"))


def cache_dir() -> Path:
    if "POLYSPEC_CACHE" in os.environ:
        return Path(os.environ["POLYSPEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    return Path(base) / "polyspec"
