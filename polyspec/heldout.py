"""The held-out prompts: ``synth/data/heldout.jsonl``, 24 prompts per language
(``{id, lang, category, turns}``) that no stage ever trains on. Synthesis excludes them from its
pool; training scores drafters on them; the decoder's benchmark and the llama.cpp check evaluate on
them. ``synth/data/heldout-chat.jsonl`` is a second held-out set, also excluded from the pool: 32
English two-turn chat prompts in MT-bench's eight categories, unlike the pool's task prompts, for
scoring drafters off the pool's distribution (``python -m synth distill --prompts heldout-chat``).
One reader here, so every stage reads them alike."""

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
HELDOUT_CHAT = HELDOUT.with_name("heldout-chat.jsonl")
CHAT_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)


class HeldoutPrompt(StrictModel):
    id: str = Field(pattern=r"^[a-z]{2}-heldout-\d{2}$")
    lang: str
    category: Literal[HELDOUT_CATEGORIES]  # type: ignore[valid-type]
    turns: list[str] = Field(min_length=1)


class HeldoutChatPrompt(StrictModel):
    id: str = Field(pattern=r"^[a-z]{2}-chat-\d{2}$")
    lang: str
    category: Literal[CHAT_CATEGORIES]  # type: ignore[valid-type]
    turns: list[str] = Field(min_length=1, description="user turns, answered in order")


def _read(path: Path, model: type[StrictModel]) -> tuple[dict, ...]:
    """Every record of ``path``, validated by ``model`` (ids unique and prefixed by their
    language)."""
    out, ids = [], set()
    for n, rec in enumerate(read_jsonl(path, strict=True), 1):
        h = validate(model, rec, source=f"{path}:{n}")
        if h.id in ids or not h.id.startswith(h.lang + "-"):
            raise PolyspecError(
                f"{path}:{n}: id {h.id!r} is repeated or does not start with its lang"
            )
        ids.add(h.id)
        out.append(h.model_dump())
    return tuple(out)


def load_heldout(lang: str) -> list[dict]:
    """The held-out records of ``lang`` (``{id, lang, category, turns}``), in file order; [] for a
    language without any (a language translated by synth)."""
    return [r for r in heldout_all() if r["lang"] == lang]


@functools.lru_cache(maxsize=1)
def heldout_all() -> tuple[dict, ...]:
    """Every held-out record, validated (ids unique and prefixed by their language)."""
    return _read(HELDOUT, HeldoutPrompt)


def load_heldout_chat(lang: str) -> list[dict]:
    """The chat held-out records of ``lang`` (``{id, lang, category, turns}``, two user turns
    each), in file order; [] for a language without any (so far only English has them)."""
    return [r for r in heldout_chat_all() if r["lang"] == lang]


@functools.lru_cache(maxsize=1)
def heldout_chat_all() -> tuple[dict, ...]:
    """Every chat held-out record, validated (ids unique and prefixed by their language)."""
    return _read(HELDOUT_CHAT, HeldoutChatPrompt)
