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
      },                          # none (n-gram rows only, no drafter forward)
      "languages": {              # optional (ADASPEC per request): a request of language l drafts
        "vi": "../vi",            # with l's drafter folder (its layer, head and ranked vocabulary;
        "de": "../de"             # paths relative to this folder); any other request with this
      }                           # folder's drafter (polyspec_vllm.languages)
    }

Nothing here imports vLLM or torch (the pipeline's tests read it in polyspec's own environment)."""

from __future__ import annotations

import json
import re
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


# a language tag as fastText's language ID and polyspec's configs/languages name one (ISO 639-1/-3)
LANG_CODE = re.compile(r"^[a-z]{2,3}$")


@dataclass(frozen=True)
class Settings:
    hybrid: Hybrid | None = None
    # language code -> its drafter folder (resolved against the settings file's folder); None: one
    # drafter for every request
    languages: dict[str, Path] | None = None


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
    return parse(raw, str(path), base=path.parent)


def parse(raw: object, where: str = FILE, base: Path | None = None) -> Settings:
    """Validate a settings mapping; unknown keys are errors, as in every polyspec config."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{where}: expected a JSON object")
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise SettingsError(
            f"{where}: format {raw.get('format')!r} version {raw.get('version')!r}; this plugin "
            f"reads format {FORMAT!r} version {VERSION}"
        )
    unknown = sorted(set(raw) - {"format", "version", "hybrid", "languages"})
    if unknown:
        raise SettingsError(f"{where}: unknown keys {unknown}")
    languages = _languages(raw.get("languages"), where, base)
    hybrid = raw.get("hybrid")
    if hybrid is None:
        return Settings(languages=languages)
    fields, optional = {"ngram_min", "ngram_max", "drafter_tokens"}, {"drafter_max_batch"}
    if not isinstance(hybrid, dict) or not fields <= set(hybrid) <= fields | optional:
        raise SettingsError(
            f"{where}: hybrid must have the keys {sorted(fields)} (and may have {sorted(optional)})"
        )
    values = [v for k, v in hybrid.items() if not (k in optional and v is None)]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SettingsError(f"{where}: hybrid's values must be integers")
    return Settings(hybrid=Hybrid(**hybrid), languages=languages)


def _languages(raw: object, where: str, base: Path | None) -> dict[str, Path] | None:
    """``languages``: language code -> drafter folder, relative to the settings file's folder."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise SettingsError(f"{where}: languages must map language codes to drafter folders")
    out = {}
    for code, folder in raw.items():
        if not isinstance(code, str) or not LANG_CODE.match(code):
            raise SettingsError(
                f"{where}: language {code!r} is no ISO 639 code (2-3 lowercase letters, as "
                "fastText's language ID names them)"
            )
        if not isinstance(folder, str) or not folder:
            raise SettingsError(f"{where}: languages.{code} must be a folder path")
        out[code] = (Path(base) / folder) if base is not None else Path(folder)
    return out


def write(
    folder: str | Path, hybrid: Hybrid | None, languages: dict[str, str] | None = None
) -> Path:
    """Write (atomically) a drafter folder's settings file (``languages``: code -> folder, as the
    file keeps it: relative to ``folder`` or absolute)."""
    import os
    import tempfile

    body = {"format": FORMAT, "version": VERSION, "hybrid": None}
    if languages:
        body["languages"] = {code: str(path) for code, path in languages.items()}
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
