"""The held-out prompts: ``synth/data/heldout.jsonl``, 24 prompts per language
(``{id, lang, category, turns}``) that no stage ever trains on. Synthesis excludes them from its
pool; training scores drafters on them; the decoder's benchmark and the llama.cpp check evaluate on
them. One reader here, so every stage reads them alike."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field

from polyspec.config import StrictModel, validate
from polyspec.errors import PolyspecError
from polyspec.io import read_jsonl

# Shipped as synth's package data (repo checkout and wheel alike:
# site-packages/synth/data/heldout.jsonl).
HELDOUT = Path(__file__).resolve().parent.parent / "synth" / "data" / "heldout.jsonl"
HELDOUT_CATEGORIES = ("qa", "rag", "translation", "summarization", "code", "math", "multiturn")


class HeldoutPrompt(StrictModel):
    id: str = Field(pattern=r"^[a-z]{2}-heldout-\d{2}$")
    lang: str
    category: Literal[HELDOUT_CATEGORIES]  # type: ignore[valid-type]
    turns: list[str] = Field(min_length=1)


def load_heldout(lang: str) -> list[dict]:
    """The held-out records of ``lang`` (``{id, lang, category, turns}``), in file order; [] for a
    language without any (a language translated by synth)."""
    return [r for r in heldout_all() if r["lang"] == lang]


@functools.lru_cache(maxsize=1)
def heldout_all() -> tuple[dict, ...]:
    """Every held-out record, validated (ids unique and prefixed by their language)."""
    out, ids = [], set()
    for n, rec in enumerate(read_jsonl(HELDOUT, strict=True), 1):
        h = validate(HeldoutPrompt, rec, source=f"{HELDOUT}:{n}")
        if h.id in ids or not h.id.startswith(h.lang + "-"):
            raise PolyspecError(
                f"{HELDOUT}:{n}: id {h.id!r} is repeated or does not start with its lang"
            )
        ids.add(h.id)
        out.append(h.model_dump())
    return tuple(out)
