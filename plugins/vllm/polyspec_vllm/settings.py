"""``polyspec_vllm.json``: what the plugin does for one drafter, kept in the drafter's folder beside
its ``config.json`` (the proposal settings apart from the drafter's architecture, as speculators
keeps its ``proposal_methods``). polyspec's export and ``make check-vllm`` write it; a user may edit
it. A drafter folder without it is served by vLLM alone.

    {
      "format": "polyspec_vllm",
      "version": 1,
      "hybrid": {                 # null or absent: the drafter alone
        "ngram_min": 3,           # the shortest suffix match whose continuation is drafted
        "ngram_max": 5,           # the longest suffix matched
        "drafter_tokens": 2,      # the drafter's draft length (≤ num_speculative_tokens);
                                  # an n-gram row drafts num_speculative_tokens
        "drafter_max_batch": 1    # optional: with more requests in a step the drafter drafts
      }                           # none (n-gram rows only; its forward still runs at length 0)
    }

Nothing here imports vLLM or torch (the pipeline's tests read it in polyspec's own environment)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FILE = "polyspec_vllm.json"
FORMAT, VERSION = "polyspec_vllm", 1


class SettingsError(ValueError):
    """A settings file the plugin cannot honour (the message is one line)."""


@dataclass(frozen=True)
class Hybrid:
    """n-gram drafts where the context's suffix recurs (ngram_min … ngram_max tokens matched), the
    drafter's elsewhere: the rule of polyspec's own ``hybrid`` and of ArcticInference."""

    ngram_min: int
    ngram_max: int
    drafter_tokens: int
    drafter_max_batch: int | None = None  # None: the drafter drafts at every batch size

    def check(self, num_speculative_tokens: int) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise SettingsError(
                f"hybrid needs 1 ≤ ngram_min ≤ ngram_max, got {self.ngram_min} and {self.ngram_max}"
            )
        if not 1 <= self.drafter_tokens <= num_speculative_tokens:
            raise SettingsError(
                f"hybrid drafter_tokens {self.drafter_tokens} must lie in 1 … "
                f"num_speculative_tokens ({num_speculative_tokens}): raise num_speculative_tokens "
                "in the speculative config, or lower drafter_tokens"
            )
        if self.drafter_max_batch is not None and self.drafter_max_batch < 1:
            raise SettingsError(
                f"hybrid drafter_max_batch must be ≥ 1 or absent, got {self.drafter_max_batch}"
            )


@dataclass(frozen=True)
class Settings:
    hybrid: Hybrid | None = None


def read(folder: str | Path | None) -> Settings | None:
    """The settings of a drafter folder; None where it has none (or is no local folder)."""
    if folder is None:
        return None
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SettingsError(f"{path} is not valid JSON ({e})") from e
    return parse(raw, str(path))


def parse(raw: object, where: str = FILE) -> Settings:
    """Validate a settings mapping; unknown keys are errors, as in every polyspec config."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{where}: expected a JSON object")
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise SettingsError(
            f"{where}: format {raw.get('format')!r} version {raw.get('version')!r}; this plugin "
            f"reads format {FORMAT!r} version {VERSION}"
        )
    unknown = sorted(set(raw) - {"format", "version", "hybrid"})
    if unknown:
        raise SettingsError(f"{where}: unknown keys {unknown}")
    hybrid = raw.get("hybrid")
    if hybrid is None:
        return Settings()
    fields, optional = {"ngram_min", "ngram_max", "drafter_tokens"}, {"drafter_max_batch"}
    if not isinstance(hybrid, dict) or not fields <= set(hybrid) <= fields | optional:
        raise SettingsError(
            f"{where}: hybrid must have the keys {sorted(fields)} (and may have {sorted(optional)})"
        )
    values = [v for k, v in hybrid.items() if not (k in optional and v is None)]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SettingsError(f"{where}: hybrid's values must be integers")
    return Settings(hybrid=Hybrid(**hybrid))


def write(folder: str | Path, hybrid: Hybrid | None) -> Path:
    """Write (atomically) a drafter folder's settings file."""
    import os
    import tempfile

    body = {"format": FORMAT, "version": VERSION, "hybrid": None}
    if hybrid is not None:
        body["hybrid"] = {
            "ngram_min": hybrid.ngram_min,
            "ngram_max": hybrid.ngram_max,
            "drafter_tokens": hybrid.drafter_tokens,
        }
        if hybrid.drafter_max_batch is not None:
            body["hybrid"]["drafter_max_batch"] = hybrid.drafter_max_batch
    path = Path(folder) / FILE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2)
    os.replace(tmp, path)
    return path
