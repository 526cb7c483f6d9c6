"""The prompt pool for on-policy distillation, and the disjoint held-out prompts.

Per language the target answers (``python -m synth distill``) a broad pool of prompts, in this
stable, interleaved order of kinds (round robin, so that ``limit`` keeps every kind that has
prompts):

- ``instruction``: the self-synthesized instructions of ADASPEC Alg. 1, the human turn of
  ``conversations`` in ``{run}/synth/{lang}/data.jsonl`` (or ``synth_file``), when that file exists;
- ``seed``: the language seeds' instructions (``configs/languages/<lang>.yaml``);
- the benchmark's kinds, filled from ``synth/data/tasks/<lang>.yaml`` (written in the language):
  ``qa``, ``rag`` and ``summarization`` (every template × every passage), ``translation`` (an
  English passage into the language, and the language's passage into English; English itself
  translates the other built-in languages' passages), ``math``, ``code`` and ``multiturn``.

A prompt is a list of **user** messages, one per turn. Single-turn prompts have one; a ``multiturn``
prompt has two (a question, then a follow-up such as "explain that more simply"). The caller answers
the turns in order, putting the target's own answer to each turn into the history before the next
one — the way the decoder's benchmark runs multi-turn questions — so every assistant turn the
drafter trains on is on-policy (no fixed, off-policy answer is ever inserted).

``synth/data/heldout.jsonl`` holds 24 prompts per language (3–5 each of qa, rag, summarization,
translation, code, math) (``{id, lang, category, turns}``) for scoring drafters during training;
:func:`load_heldout` reads them. ``synth/data/heldout-chat.jsonl`` holds a second held-out set, 32
English two-turn chat prompts in MT-bench's eight categories (:func:`load_heldout_chat`).
:func:`build_pool` drops every prompt with a turn equal (whitespace-normalized) to a turn of either
held-out set or of the built-in benchmark (``decoder/data/mini_multispecbench.jsonl``), so none of
them is ever trained on.
"""

from __future__ import annotations

import functools
import importlib.resources
import random
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from polyspec.config import StrictModel, read_yaml, validate
from polyspec.errors import PolyspecError
from polyspec.heldout import (  # noqa: F401  (re-exported)
    HELDOUT,
    HELDOUT_CATEGORIES,
    HELDOUT_CHAT,
    HeldoutPrompt,
    heldout_all,
    heldout_chat_all,
    load_heldout,
    load_heldout_chat,
)
from polyspec.io import read_jsonl
from polyspec.languages import builtin_codes, get_language

DATA_DIR = Path(__file__).resolve().parent / "data"
TASKS_DIR = DATA_DIR / "tasks"
KINDS = (
    "instruction",
    "seed",
    "qa",
    "rag",
    "summarization",
    "translation",
    "math",
    "code",
    "multiturn",
)


def _needs(template: str, *fields: str) -> str:
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(
            f"template {template[:40]!r} lacks {', '.join('{' + f + '}' for f in missing)}"
        )
    return template


class Passage(StrictModel):
    text: str = Field(min_length=1, description="2–4 factual sentences in the language")
    question: str = Field(min_length=1, description="a question the passage answers (rag)")


class Templates(StrictModel):
    rag: list[str] = Field(min_length=1, description="each with {passage} and {question}")
    summarization: list[str] = Field(min_length=1, description="each with {passage}")
    translation_into: str = Field(
        description="into this language, with {passage} from translation_sources"
    )
    translation_out_of: str | None = Field(
        None, description="this language's {passage} into English"
    )

    @field_validator("rag")
    @classmethod
    def _rag(cls, v: list[str]) -> list[str]:
        return [_needs(t, "passage", "question") for t in v]

    @field_validator("summarization")
    @classmethod
    def _summ(cls, v: list[str]) -> list[str]:
        return [_needs(t, "passage") for t in v]

    @field_validator("translation_into", "translation_out_of")
    @classmethod
    def _trans(cls, v: str | None) -> str | None:
        return v if v is None else _needs(v, "passage")


class TaskFile(StrictModel):
    """``synth/data/tasks/<lang>.yaml``."""

    lang: str
    translation_sources: list[str] = Field(
        ["en"],
        min_length=1,
        description="languages whose passages "
        "translation_into translates (passage i from source i mod n)",
    )
    templates: Templates
    passages: list[Passage] = Field(min_length=24)
    qa: list[str] = Field(min_length=30)
    math: list[str] = Field(min_length=20)
    code: list[str] = Field(min_length=15)
    multiturn: list[list[str]] = Field(min_length=10, description="[question, follow-up] pairs")

    @field_validator("multiturn")
    @classmethod
    def _pairs(cls, v: list[list[str]]) -> list[list[str]]:
        if any(len(p) < 2 or not all(t.strip() for t in p) for p in v):
            raise ValueError("each multiturn item is a list of at least two non-empty turns")
        return v


@dataclass(frozen=True)
class PoolPrompt:
    kind: str  # one of KINDS
    turns: tuple[str, ...]  # user turns, answered in order

    @property
    def messages(self) -> list[dict]:
        return [{"role": "user", "content": t} for t in self.turns]


def _norm(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=16)
def load_tasks(lang: str) -> TaskFile | None:
    """The validated task file of ``lang`` (None when the language has none, e.g. a translated
    language)."""
    path = TASKS_DIR / f"{lang}.yaml"
    if not path.is_file():
        return None
    tasks = validate(TaskFile, read_yaml(path), source=str(path))
    if tasks.lang != lang:
        raise PolyspecError(f"{path}: lang {tasks.lang!r} does not match the file name")
    return tasks


def task_prompts(lang: str) -> dict[str, list[PoolPrompt]]:
    """The filled task templates of ``lang`` per kind, in file order (not yet guarded)."""
    tasks = load_tasks(lang)
    if tasks is None:
        return {}
    t = tasks.templates

    def one(kind: str, text: str) -> PoolPrompt:
        return PoolPrompt(kind, (text,))

    out = {
        "qa": [one("qa", q) for q in tasks.qa],
        "rag": [
            one("rag", tpl.replace("{passage}", p.text).replace("{question}", p.question))
            for tpl in t.rag
            for p in tasks.passages
        ],
        "summarization": [
            one("summarization", tpl.replace("{passage}", p.text))
            for tpl in t.summarization
            for p in tasks.passages
        ],
        "math": [one("math", q) for q in tasks.math],
        "code": [one("code", q) for q in tasks.code],
        "multiturn": [PoolPrompt("multiturn", tuple(p)) for p in tasks.multiturn],
    }
    sources = []
    for code in tasks.translation_sources:
        src = load_tasks(code)
        if src is None or code == lang:
            raise PolyspecError(
                f"{TASKS_DIR / f'{lang}.yaml'}: translation source {code!r} has no other task file"
            )
        sources.append(src.passages)
    trans = [
        one(
            "translation",
            t.translation_into.replace("{passage}", sources[i % len(sources)][i].text),
        )
        for i in range(min(len(tasks.passages), *(len(s) for s in sources)))
    ]
    if t.translation_out_of:
        trans += [
            one("translation", t.translation_out_of.replace("{passage}", p.text))
            for p in tasks.passages
        ]
    out["translation"] = trans
    return out


def benchmark_turns() -> set[str]:
    """Every turn of the built-in benchmark, whitespace-normalized."""
    path = importlib.resources.files("decoder").joinpath("data/mini_multispecbench.jsonl")
    return {
        _norm(t) for rec in read_jsonl(Path(str(path)), strict=True) for t in rec.get("turns", [])
    }


def forbidden_turns() -> set[str]:
    """Texts the pool never contains, whitespace-normalized: the held-out turns (all languages),
    the chat held-out turns (``synth/data/heldout-chat.jsonl``) and the benchmark's turns."""
    held = (*heldout_all(), *heldout_chat_all())
    return benchmark_turns() | {_norm(t) for r in held for t in r["turns"]}


def _synth_instructions(path: Path) -> list[str]:
    out = []
    for rec in read_jsonl(path):
        human = next(
            (
                c.get("value")
                for c in rec.get("conversations") or []
                if c.get("from") in ("human", "user")
            ),
            None,
        )
        if isinstance(human, str) and human.strip():
            out.append(human.strip())
    return out


def corpus_prompts(lang: str, path: Path, n: int, seed: int = 0) -> list[PoolPrompt]:
    """Up to ``n`` prompts about real text: the paragraphs (blank-line separated, 200–1,200
    characters) of a corpus stage's documents (``<run>/corpus/<lang>/data.jsonl``, schema in
    corpus/build.py), in a seeded order, each in one of the language's summarization templates in
    turn — so on-policy answers cover as many topics as the corpus does, not only the task file's
    few passages (kind ``passage``)."""
    tasks = load_tasks(lang)
    if tasks is None:
        raise PolyspecError(
            f"corpus prompts: language {lang!r} has no task file (synth/data/tasks/{lang}.yaml)"
        )
    if not path.is_file():
        raise PolyspecError(
            f"corpus prompts: {path} not found (build the corpus first: python -m corpus --langs "
            f"{lang})"
        )
    paras = [
        p.strip()
        for rec in read_jsonl(path)
        if isinstance(rec.get("text"), str)
        for p in rec["text"].split("\n\n")
        if 200 <= len(p.strip()) <= 1200
    ]
    random.Random(seed).shuffle(paras)
    tpl = tasks.templates.summarization
    return [
        PoolPrompt("passage", (tpl[i % len(tpl)].replace("{passage}", p),))
        for i, p in enumerate(paras[:n])
    ]


def _admit(prompt: PoolPrompt, seen: set[tuple[str, ...]], forbidden: set[str]) -> bool:
    """Whether a prompt passes the pool's guard (no held-out turn, not a repeat); marks it seen."""
    key = tuple(_norm(t) for t in prompt.turns)
    if key in seen or forbidden.intersection(key):
        return False
    seen.add(key)
    return True


def pool_items(
    lang: str,
    run: str | None,
    synth_file: str | None = None,
    limit: int | None = None,
    target: str | None = None,
    corpus: int = 0,
) -> list[PoolPrompt]:
    """The pool of ``lang`` as :class:`PoolPrompt` items (kind + turns); see :func:`build_pool`."""
    if synth_file is not None and not Path(synth_file).is_file():
        raise PolyspecError(f"synth file {synth_file} not found")
    path = (
        Path(synth_file)
        if synth_file
        else (Path(run) / "synth" / lang / "data.jsonl" if run else None)
    )
    by_kind: dict[str, list[PoolPrompt]] = {k: [] for k in KINDS}
    if path is not None and path.is_file():
        by_kind["instruction"] = [
            PoolPrompt("instruction", (p,)) for p in _synth_instructions(path)
        ]
    if lang in builtin_codes() or target:
        by_kind["seed"] = [
            PoolPrompt("seed", (s.instruction,)) for s in get_language(lang, target).seeds
        ]
    by_kind.update(task_prompts(lang))
    forbidden, seen = forbidden_turns(), set()
    # guard: drop held-out (both sets) / benchmark prompts and repeats (first occurrence kept)
    for kind in KINDS:
        by_kind[kind] = [p for p in by_kind[kind] if _admit(p, seen, forbidden)]
    out: list[PoolPrompt] = []
    for i in range(max(len(v) for v in by_kind.values())):  # round robin over the kinds
        out += [by_kind[k][i] for k in KINDS if i < len(by_kind[k])]
    if corpus:  # after the pool's own prompts, guarded the same way
        corpus_file = Path(run or ".") / "corpus" / lang / "data.jsonl"
        out += [p for p in corpus_prompts(lang, corpus_file, corpus) if _admit(p, seen, forbidden)]
    if not out:
        raise PolyspecError(f"no prompts for language {lang!r}: no task file, seeds or synth data")
    return out[:limit] if limit else out


def build_pool(
    lang: str,
    run: str | None,
    synth_file: str | None = None,
    limit: int | None = None,
    target: str | None = None,
    corpus: int = 0,
) -> list[list[dict]]:
    """The distillation prompts of ``lang`` as message lists (user turns only, answered in order).

    ``run``: the run folder whose ``synth/<lang>/data.jsonl`` adds the self-synthesized instructions
    (``synth_file`` names another file instead). ``limit`` keeps the first prompts of the
    interleaved order, so every kind stays represented. ``target`` resolves a language translated by
    synth (its seeds). ``corpus``: up to that many prompts about the run's corpus paragraphs follow
    (:func:`corpus_prompts`).
    """
    return [p.messages for p in pool_items(lang, run, synth_file, limit, target, corpus)]
